"""Quickstart: an MLP step under ``@graphjit.graphed``, called a few times, then its stats.

On a GPU the first call warms up, captures one CUDA graph and checks it against eager; later calls
replay it.  Without a GPU (a CPU build, say) the traced function runs instead and one log line says
why ("no CUDA graph ...").  Either way the results equal eager's.

    python examples/quickstart.py [--framework paddle|torch] [--steps 5]
"""

from __future__ import annotations

import argparse
import importlib.util
import logging

import numpy as np

import graphjit

BATCH, HIDDEN, FFN = 8, 256, 1024


def torch_setup():
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(HIDDEN, FFN), torch.nn.GELU(), torch.nn.Linear(FFN, HIDDEN))
    model = model.to(device).eval()

    @graphjit.graphed
    def step(x):
        return model(x)

    def make_input():
        return torch.randn(BATCH, HIDDEN, device=device)

    return device, model, step, make_input, torch.no_grad, lambda t: t.cpu().numpy()


def paddle_setup():
    import paddle

    device = "gpu" if paddle.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0 else "cpu"
    paddle.set_device(device)
    paddle.seed(0)
    model = paddle.nn.Sequential(paddle.nn.Linear(HIDDEN, FFN), paddle.nn.GELU(), paddle.nn.Linear(FFN, HIDDEN))
    model.eval()

    @graphjit.graphed  # Paddle: traced with SOT (to_static, full_graph=False) at the first call
    def step(x):
        return model(x)

    def make_input():
        return paddle.randn([BATCH, HIDDEN])

    return device, model, step, make_input, paddle.no_grad, lambda t: t.numpy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = "paddle" if importlib.util.find_spec("paddle") else "torch"
    parser.add_argument("--framework", choices=["paddle", "torch"], default=default)
    parser.add_argument("--steps", type=int, default=5, help="calls of the graphed step")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")  # shows graphjit's decisions

    setup = torch_setup if args.framework == "torch" else paddle_setup
    device, model, step, make_input, no_grad, to_numpy = setup()
    worst = 0.0
    with no_grad():  # graphs capture inference (graphjit.graphed_layer is for training)
        for _ in range(args.steps):
            x = make_input()
            out = to_numpy(step(x))  # first call: warmup + capture; then: replay
            want = to_numpy(model(x))  # eager, for the check
            worst = max(worst, float(np.abs(out - want).max()))
    print(f"{args.framework} on {device}: {args.steps} calls, max |graphed - eager| = {worst:.2e}")
    print(step.report())
    if worst > 1e-3:
        raise SystemExit("graphed result differs from eager")


if __name__ == "__main__":
    main()
