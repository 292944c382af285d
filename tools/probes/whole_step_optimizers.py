"""Probe (GPU): a whole training step in one @graphed call (forward, backward, optimizer.step), against eager.

For SGD with momentum, Adam and AdamW (capturable or not) and three ways of zeroing gradients, 20 steps of a small
MLP: the largest difference of parameters, gradients and optimizer state from an eager run of the same steps, and
the graphed function's counters.  Usage: ``python3 tools/probes/whole_step_optimizers.py``; prints one line a case.
"""

from __future__ import annotations

import json

import torch

import graphjit


def run(graph: bool, opt_name: str, capturable: bool, zero: str, steps: int = 20):
    torch.manual_seed(0)
    dev = torch.device("cuda", 0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8)).to(dev)
    if opt_name == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
    else:
        cls = torch.optim.Adam if opt_name == "adam" else torch.optim.AdamW
        opt = cls(model.parameters(), lr=1e-3, capturable=capturable)

    def step(x, y):
        if zero == "inside_in_place":
            opt.zero_grad(set_to_none=False)
        elif zero == "inside_none":
            opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    f = graphjit.graphed(step) if graph else step
    g = torch.Generator(device=dev).manual_seed(1)
    losses = []
    for _ in range(steps):
        x = torch.randn(32, 64, device=dev, generator=g)
        y = torch.randn(32, 8, device=dev, generator=g)
        if zero == "outside_none":
            opt.zero_grad(set_to_none=True)
        losses.append(f(x, y).clone())
    torch.cuda.synchronize()
    return model, opt, losses, (f.stats() if graph else None)


def diff(a, b) -> float:
    if a is None or b is None:
        return 0.0 if a is b else float("inf")
    return float((a.double() - b.double()).abs().max())


def main() -> None:
    for opt_name, capturable in [("sgd", False), ("adam", False), ("adam", True), ("adamw", True)]:
        for zero in ["outside_none", "inside_none", "inside_in_place"]:
            m0, o0, l0, _ = run(False, opt_name, capturable, zero)
            try:
                m1, o1, l1, st = run(True, opt_name, capturable, zero)
            except Exception as exc:  # the finding
                print(json.dumps({"opt": opt_name, "capturable": capturable, "zero": zero,
                                  "error": f"{type(exc).__name__}: {exc}"[:500]}), flush=True)
                continue
            pd = max(diff(p.detach(), q.detach()) for p, q in zip(m0.parameters(), m1.parameters()))
            gd = max(diff(p.grad, q.grad) for p, q in zip(m0.parameters(), m1.parameters()))
            sd = 0.0
            for p, q in zip(m0.parameters(), m1.parameters()):
                for k, v in o0.state[p].items():
                    if torch.is_tensor(v):
                        sd = max(sd, diff(v, o1.state[q][k]))
            ld = max(diff(a, b) for a, b in zip(l0, l1))
            print(json.dumps({"opt": opt_name, "capturable": capturable, "zero": zero, "param": pd, "grad": gd,
                              "state": sd, "loss": ld, "graphs": st["graphs"], "replays": st["replays"],
                              "fallbacks": st["fallbacks"], "verify": [k.get("verify") for k in st["keys"]]}),
                  flush=True)


if __name__ == "__main__":
    main()
