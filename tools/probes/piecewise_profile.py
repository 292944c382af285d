"""Where the host time of ``bench piecewise``'s piecewise step goes (torch, one GPU).

Builds the bench's decode step (``graphjit.bench.torch.piecewise``), graphs it piecewise (attention an island), and
reports per step: the whole call, the islands' share (``stats()['island_us']``), the island function alone (eager,
outside any graph) in its parts (the slices, the mask, ``scaled_dot_product_attention`` with a bool mask, with an
additive float mask, without a mask), and a ``torch.profiler`` table of a few steps sorted by own CPU time.
Diagnostic only: the speed claims are made by ``python -m graphjit bench piecewise``.

Usage (GPU machine, repo root): ``PYTHONPATH=. python3 tools/probes/piecewise_profile.py --out DIR``
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import graphjit
from graphjit.bench.torch.piecewise import HEAD_DIM, PiecewiseBench

GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"


def sync() -> None:
    if GPU:
        torch.cuda.synchronize()


def host_us(fn: Callable[[], Any], iters: int = 200, repeats: int = 5) -> float:
    """Median host microseconds of ``fn`` alone, synchronised before each call."""
    samples = []
    for _ in range(repeats):
        for _ in range(iters):
            sync()
            t0 = time.perf_counter_ns()
            fn()
            samples.append((time.perf_counter_ns() - t0) / 1e3)
    return round(statistics.median(samples), 3)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--batch", type=int, default=1)
    a = p.parse_args()
    args = argparse.Namespace(hidden=1024, max_cache=512, seed=0, attention="efficient", warmup=6, steps=50,
                              repeats=5)
    bench = PiecewiseBench(args, on_gpu=GPU)
    res: dict[str, Any] = {"device": torch.cuda.get_device_name() if GPU else "cpu", "torch": torch.__version__,
                           "layers": a.layers, "batch": a.batch, "us": {}}
    us = res["us"]
    with bench.attention(), torch.no_grad():
        step, caches = bench.model(a.layers, a.batch, fixed=False)
        fn = graphjit.graphed(step, dynamic=("meta",))
        metas = [bench.call_args(m, False) for m in bench.metas(a.batch, 64)]
        x = bench.inputs(a.batch, 1)[0]
        for m in metas:
            fn(x, *m)
        sync()
        it = iter(metas * 100)
        us["piecewise_step"] = host_us(lambda: fn(x, *next(it)), iters=50)
        key = fn.stats()["keys"][0]
        us["replay_us_per_step"], us["island_us_per_step"] = key.get("replay_us"), key.get("island_us")

        heads = max(1, 1024 // HEAD_DIM)
        q = torch.randn(a.batch, heads, 1, HEAD_DIM, device=DEVICE, dtype=bench.dtype)
        kc, vc = caches[0]
        meta = metas[0][1]
        n = meta["max_len"]
        mask = meta["mask"]
        fmask = torch.zeros(mask.shape, device=DEVICE, dtype=bench.dtype).masked_fill_(~mask, float("-inf"))
        sdpa = torch.nn.functional.scaled_dot_product_attention
        us["slice_kv"] = host_us(lambda: (kc[:, :, :n], vc[:, :, :n]))
        us["sdpa_bool_mask_sliced"] = host_us(lambda: sdpa(q, kc[:, :, :n], vc[:, :, :n], attn_mask=mask[..., :n]))
        us["sdpa_float_mask_sliced"] = host_us(lambda: sdpa(q, kc[:, :, :n], vc[:, :, :n], attn_mask=fmask[..., :n]))
        us["sdpa_no_mask_sliced"] = host_us(lambda: sdpa(q, kc[:, :, :n], vc[:, :, :n]))
        us["sdpa_bool_mask_full"] = host_us(lambda: sdpa(q, kc, vc, attn_mask=mask))
        us["empty_op"] = host_us(lambda: torch.empty(1, device=DEVICE))
        us["add_op"] = host_us(lambda: q + 1)

        prof_it = iter(metas * 4)
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if GPU else [])) as prof:
            for _ in range(10):
                fn(x, *next(prof_it))
            sync()
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30)
        res["profile"] = table
    text = json.dumps(res, indent=1)
    print(json.dumps(us, indent=1))
    print(table)
    if a.out is not None:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "piecewise_profile.json").write_text(text)


if __name__ == "__main__":
    main()
