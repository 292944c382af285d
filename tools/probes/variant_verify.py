"""Probe (GPU): a training step graphed with AdamW(capturable=True) whose weight_decay changes half way (a second
graph for the new value, captured into the function's pool): per-call difference from eager, under variants of
graphjit's capture (default; pool="private"; the capture's Python effects not undone).
Usage: ``python3 tools/probes/variant_verify.py``; prints one block per variant."""

from __future__ import annotations

import sys

import torch

sys.path.insert(0, "tests")
import guard_cases as cases

import graphjit.pystate


def main() -> None:
    for variant in ("default", "private", "no-pystate", "sgd"):
        opts = {"pool": "private"} if variant == "private" else {}
        saved = graphjit.pystate.PyState.restore
        if variant == "no-pystate":
            graphjit.pystate.PyState.restore = lambda self: 0  # type: ignore[method-assign]
        make = cases.weight_decay
        if variant == "sgd":
            make = cases.step_lr_sgd
        try:
            want_out, want_state, _ = cases.run(make, "cuda", graph=False)
            got_out, got_state, g = cases.run(make, "cuda", graph=True, **opts)
        finally:
            graphjit.pystate.PyState.restore = saved  # type: ignore[method-assign]
        per_call = [cases.max_diff([a], [b]) for a, b in zip(got_out, want_out)]
        per_state = [cases.max_diff(a, b) for a, b in zip(got_state, want_state)]
        print(f"== {variant}")
        print("loss diff per call:", " ".join(f"{d:.1e}" for d in per_call))
        print("state diff per call:", " ".join(f"{d:.1e}" for d in per_state))
        print(g.report())
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
