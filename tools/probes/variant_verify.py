"""Probe (GPU): a training step graphed with AdamW(capturable=True) whose weight_decay changes half way (a second
graph for the new value): per-call difference from eager, and what the second key's warmups saw written.
Usage: ``python3 tools/probes/variant_verify.py``."""

from __future__ import annotations

import logging
import sys

import torch

sys.path.insert(0, "tests")
import guard_cases as cases


def versions() -> None:
    torch.manual_seed(0)
    m = torch.nn.Linear(4, 4).cuda()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2, capturable=True, weight_decay=0.1)
    m(torch.randn(2, 4, device="cuda")).sum().backward()
    opt.step()
    s = opt.state[m.weight]
    before = {k: v._version for k, v in s.items()} | {"weight": m.weight._version}
    m(torch.randn(2, 4, device="cuda")).sum().backward()
    opt.step()
    after = {k: v._version for k, v in s.items()} | {"weight": m.weight._version}
    print("versions before/after an AdamW(capturable) step:", before, after, torch.__version__)


def run(change_at: int, label: str) -> None:
    def make(device: str) -> cases.Case:
        model = cases._mlp(device)
        opt = cases._adamw(model, device, weight_decay=0.01)

        def before(i):
            if i == change_at:
                opt.param_groups[0]["weight_decay"] = 0.2

        return cases._train_case(device, model, opt, before)

    _want_out, want_state, _ = cases.run(make, "cuda", graph=False)
    _got_out, got_state, g = cases.run(make, "cuda", graph=True)
    print(f"== {label}: weight_decay changes before call {change_at}")
    print("state diff per call:", " ".join(f"{cases.max_diff(a, b):.1e}" for a, b in zip(got_state, want_state)))
    print(g.report())


if __name__ == "__main__":
    versions()
    handler = logging.StreamHandler(sys.stdout)
    handler.addFilter(lambda r: "wrote" in r.getMessage() or "verify" in r.getMessage())
    logging.getLogger("graphjit").addHandler(handler)
    logging.getLogger("graphjit").setLevel(logging.DEBUG)
    import os

    os.environ["GRAPHJIT_DEBUG"] = "1"
    import graphjit

    graphjit.refresh_env()
    run(1, "first capture after the change")
    run(12, "second graph")
