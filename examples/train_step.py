"""A whole training step under @graphjit.graphed, written as usual: the model and the optimizer as arguments,
zero_grad() with its default, clipping, AdamW as constructed by default and a LambdaLR schedule stepped after each
call (torch).

On a GPU graphjit makes AdamW capturable (its step counts move to the GPU), keeps the gradient buffers of the step
(so zero_grad() setting them to None costs no new capture), feeds the scheduler's lr to the graph from a tensor,
and after two eager warmup calls replays one graph per step.  On a CPU every call runs eagerly and graphjit says
why in one log line.

    python examples/train_step.py [--steps 200]
"""

from __future__ import annotations

import argparse
import logging
import time

import torch

import graphjit


@graphjit.graphed
def train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss.detach()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 256),
                                torch.nn.GELU(), torch.nn.Linear(256, 8)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: min(1.0, (k + 1) / 20))  # a warmup schedule
    target = torch.randn(64, 8, device=device) / 8
    t0 = time.perf_counter()
    for step in range(args.steps):
        x = torch.randn(128, 64, device=device)
        loss = train_step(model, opt, x, torch.tanh(x @ target))
        sched.step()
        if step % 50 == 0 or step == args.steps - 1:
            print(f"step {step:3d}  loss {loss.item():.4f}  lr {opt.param_groups[0]['lr']:.2e}")
    print(f"{args.steps} steps on {device} in {time.perf_counter() - t0:.2f} s")
    print(train_step.report())


if __name__ == "__main__":
    main()
