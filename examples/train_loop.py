"""A training loop with graphjit.graphed_layer: each block of a small model runs as CUDA graphs.

Runs anywhere: on a CPU build (or without a GPU) every graphed block runs eagerly and graphjit says
why in one log line per block; on a GPU each block warms up for 3 steps, then records a forward and
a backward graph and replays them.  The loop accumulates gradients over 2 micro-batches per step,
as eager would, and the model's first block receives its input from plain eager code, the second
from the first graphed block (gradients flow through both).

    python examples/train_loop.py [--framework torch|paddle] [--steps 60]
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import time

import graphjit

D, SEQ, BATCH, MICRO = 64, 16, 8, 2


def torch_loop(steps: int) -> None:
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    nn = torch.nn

    class Block(nn.Module):  # pre-LayerNorm residual MLP block
        def __init__(self) -> None:
            super().__init__()
            self.norm = nn.LayerNorm(D)
            self.fc1 = nn.Linear(D, 4 * D)
            self.fc2 = nn.Linear(4 * D, D)

        def forward(self, x):
            return x + self.fc2(nn.functional.gelu(self.fc1(self.norm(x))))

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(D, D), graphjit.graphed_layer(Block()), graphjit.graphed_layer(Block()),
                          nn.Linear(D, D)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    target = torch.randn(D, D, device=device) / D**0.5
    t0 = time.perf_counter()
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        for _ in range(MICRO):  # gradient accumulation: .grad sums over micro-batches, as in eager mode
            x = torch.randn(BATCH, SEQ, D, device=device)
            loss = nn.functional.mse_loss(model(x), torch.tanh(x @ target)) / MICRO
            loss.backward()
        opt.step()
        if step % 20 == 0 or step == steps - 1:
            print(f"step {step:3d}  loss {loss.item() * MICRO:.4f}")
    print(f"{steps} steps on {device} in {time.perf_counter() - t0:.2f} s")
    for i in (1, 2):
        print(model[i].report())


def paddle_loop(steps: int) -> None:
    import paddle

    if not (paddle.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0):
        paddle.set_device("cpu")
    nn = paddle.nn

    class Block(nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.norm = nn.LayerNorm(D)
            self.fc1 = nn.Linear(D, 4 * D)
            self.fc2 = nn.Linear(4 * D, D)

        def forward(self, x):
            return x + self.fc2(nn.functional.gelu(self.fc1(self.norm(x))))

    paddle.seed(0)
    model = nn.Sequential(nn.Linear(D, D), graphjit.graphed_layer(Block()), graphjit.graphed_layer(Block()),
                          nn.Linear(D, D))
    opt = paddle.optimizer.SGD(learning_rate=0.05, parameters=model.parameters())
    target = paddle.randn([D, D]) / D**0.5
    t0 = time.perf_counter()
    for step in range(steps):
        opt.clear_grad()
        for _ in range(MICRO):
            x = paddle.randn([BATCH, SEQ, D])
            loss = nn.functional.mse_loss(model(x), paddle.tanh(paddle.matmul(x, target))) / MICRO
            loss.backward()
        opt.step()
        if step % 20 == 0 or step == steps - 1:
            print(f"step {step:3d}  loss {float(loss) * MICRO:.4f}")
    print(f"{steps} steps on {paddle.get_device()} in {time.perf_counter() - t0:.2f} s")
    for i in (1, 2):
        print(model[i].report())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    have = [f for f in ("torch", "paddle") if importlib.util.find_spec(f) is not None]
    parser.add_argument("--framework", choices=("torch", "paddle"), default=have[0] if have else "torch")
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    # graphjit logs at INFO why a block runs without graphs (e.g. no CUDA); show it.
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")  # graphjit names itself
    logging.getLogger("graphjit").setLevel(logging.INFO)
    (torch_loop if args.framework == "torch" else paddle_loop)(args.steps)


if __name__ == "__main__":
    main()
