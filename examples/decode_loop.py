"""A decode loop with a KV cache and batch-size buckets, graphed with graphjit.

Runs anywhere: on a CPU build it runs the traced function (one log line says why there is no
graph); on a GPU every batch-size bucket is captured once, ahead of time in a capture scope, and
replayed afterwards.  The cache is updated in place, exactly as eager code would update it.

    python examples/decode_loop.py [--framework paddle|torch] [--steps 64]
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import time

import numpy as np

import graphjit

HIDDEN, MAX_BATCH, MAX_LEN, LAYERS = 256, 16, 128, 4
BUCKETS = [1, 2, 4, 8, 16]


def torch_model(device: str):
    import torch

    g = torch.Generator().manual_seed(0)
    ws = [(torch.randn(HIDDEN, HIDDEN, generator=g) / HIDDEN**0.5).to(device) for _ in range(LAYERS)]
    wk = (torch.randn(HIDDEN, HIDDEN, generator=g) / HIDDEN**0.5).to(device)

    def step(x, cache, pos):
        k = x @ wk
        cache.index_copy_(1, pos, k.unsqueeze(1))  # this step's key, written in place
        att = torch.softmax(torch.einsum("bh,bth->bt", x, cache) / HIDDEN**0.5, dim=-1)
        h = torch.einsum("bt,bth->bh", att, cache)
        for w in ws:
            h = h + torch.nn.functional.silu(h @ w)
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return h

    def inputs(bs: int, t: int, cache):
        x = torch.randn(bs, HIDDEN, device=device)
        return x, cache[:bs], torch.tensor([t % MAX_LEN], device=device)

    cache = torch.zeros(MAX_BATCH, MAX_LEN, HIDDEN, device=device)
    return step, inputs, cache, torch.no_grad, lambda t: t.cpu().numpy()


def paddle_model(device: str):
    import paddle

    paddle.seed(0)
    ws = [paddle.randn([HIDDEN, HIDDEN]) / HIDDEN**0.5 for _ in range(LAYERS)]
    wk = paddle.randn([HIDDEN, HIDDEN]) / HIDDEN**0.5

    positions = paddle.arange(MAX_LEN)

    def step(x, cache, pos):  # pos: a 1-element int tensor, so that every position shares a graph
        k = paddle.matmul(x, wk)
        onehot = (positions == pos).astype(x.dtype).reshape([1, MAX_LEN, 1])
        paddle.assign(cache * (1 - onehot) + k.unsqueeze(1) * onehot, output=cache)  # in place
        att = paddle.nn.functional.softmax(paddle.einsum("bh,bth->bt", x, cache) / HIDDEN**0.5, axis=-1)
        h = paddle.einsum("bt,bth->bh", att, cache)
        for w in ws:
            h = h + paddle.nn.functional.silu(paddle.matmul(h, w))
            h = h * paddle.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return h

    def inputs(bs: int, t: int, cache):
        return paddle.randn([bs, HIDDEN]), cache[:bs], paddle.to_tensor([t % MAX_LEN])

    cache = paddle.zeros([MAX_BATCH, MAX_LEN, HIDDEN])
    return step, inputs, cache, paddle.no_grad, lambda t: t.numpy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = "paddle" if importlib.util.find_spec("paddle") else "torch"
    parser.add_argument("--framework", choices=["paddle", "torch"], default=default)
    parser.add_argument("--steps", type=int, default=64)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    if args.framework == "torch":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
        step, inputs, cache, no_grad, to_np = torch_model(device)
    else:
        import paddle

        device = "gpu" if paddle.is_compiled_with_cuda() and paddle.device.cuda.device_count() else "cpu"
        paddle.set_device(device)
        step, inputs, cache, no_grad, to_np = paddle_model(device)

    graphed = graphjit.graphed(step, buckets={"x": {0: BUCKETS}, "cache": {0: BUCKETS}})
    eager_cache = cache.clone()
    with no_grad():
        with graphjit.capture_scope(total=len(BUCKETS)):
            for bs in sorted(BUCKETS, reverse=True):  # largest first, as FastDeploy does
                graphed(*inputs(bs, 0, cache.clone()))
        rng = np.random.default_rng(0)
        worst = 0.0
        t0 = time.perf_counter()
        for t in range(args.steps):
            bs = int(rng.integers(1, MAX_BATCH + 1))
            x, c, pos = inputs(bs, t, cache)
            out = to_np(graphed(x, c, pos))
            want = to_np(step(x, eager_cache[:bs], pos))
            worst = max(worst, float(np.abs(out - want).max() / (np.abs(want).max() + 1e-12)))
        elapsed = time.perf_counter() - t0
    same_cache = float(np.abs(to_np(cache) - to_np(eager_cache)).max())
    print(f"{args.framework} on {device}: {args.steps} decode steps (graphed + eager check) in {elapsed:.2f} s")
    print(f"max relative difference graphed vs eager: {worst:.2e}; cache difference: {same_cache:.2e}")
    print(graphed.report())


if __name__ == "__main__":
    main()
