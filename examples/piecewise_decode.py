"""A decode step whose attention reads per-call metadata, graphed piecewise with graphjit.

Every call brings each sequence's own length and the longest one as a Python int, which varlen attention
kernels take: no single CUDA graph can hold that.  Attention is marked ``@graphjit.eager`` (an island: it
runs eagerly on every call), the metadata is ``dynamic`` (not part of the key), and everything else is
captured, one graph per batch-size bucket, in segments between the islands.

Runs anywhere: on a CPU build it runs the traced function (one log line says why there is no graph); on a
GPU it prints each key's segments, islands and the host time spent in islands per call.

    python examples/piecewise_decode.py [--steps 64]
"""

from __future__ import annotations

import argparse
import logging
import time

import torch

import graphjit

HIDDEN, LAYERS, MAX_BATCH, MAX_LEN = 256, 4, 8, 256


def build(device: str):
    g = torch.Generator().manual_seed(0)
    ws = [(torch.randn(HIDDEN, HIDDEN, generator=g) / HIDDEN**0.5).to(device) for _ in range(LAYERS)]
    caches = [torch.zeros(MAX_BATCH, MAX_LEN, HIDDEN, device=device) for _ in range(LAYERS)]

    @graphjit.eager
    def attention(q, cache, meta):
        """Write each sequence's key at its length, attend over the first ``max_len`` positions."""
        b = meta["lens"].shape[0]
        rows = torch.arange(b, device=q.device)
        cache[rows, meta["lens"]] = q[:b]
        k = cache[:b, : meta["max_len"]]  # a shape that changes every call
        mask = torch.arange(meta["max_len"], device=q.device)[None, :] <= meta["lens"][:, None]
        scores = torch.einsum("bh,bth->bt", q[:b], k).masked_fill(~mask, float("-inf")) / HIDDEN**0.5
        out = torch.zeros_like(q)  # padded rows (batch buckets) stay zero
        out[:b] = torch.einsum("bt,bth->bh", torch.softmax(scores, -1), k)
        return out

    def step(x, meta):
        h = x
        for w, cache in zip(ws, caches):
            q = torch.tanh(h @ w)
            h = h + attention(q, cache, meta)
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return h

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=64)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    step = build(device)
    graphed = graphjit.graphed(step, dynamic=("meta",), buckets={"x": {0: [1, 2, 4, 8]}})
    reference = build(device)
    gen = torch.Generator().manual_seed(1)
    worst = 0.0
    t0 = time.perf_counter()
    with torch.no_grad():
        for i in range(args.steps):
            batch = 1 + i % MAX_BATCH
            lens = torch.randint(0, MAX_LEN, (batch,), generator=gen)
            meta = {"lens": lens.to(device), "max_len": int(lens.max()) + 1}
            x = torch.randn(batch, HIDDEN, generator=gen).to(device)
            got, want = graphed(x, meta), reference(x, meta)
            worst = max(worst, float((got - want).norm() / want.norm()))
    elapsed = time.perf_counter() - t0
    print(graphed.report())
    print(f"{args.steps} steps on {device} in {elapsed:.2f} s; largest relative difference from eager: {worst:.2e}")
    if worst > 1e-4:
        raise SystemExit("graphed results differ from eager")


if __name__ == "__main__":
    main()
