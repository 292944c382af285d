"""torch half of ``python -m graphjit bench piecewise``: the decode step with per-call attention metadata,
eager, piecewise (attention an island) and as a whole graph of its fixed-shape variant; and the cost of one
island boundary.  The framework-neutral part is :mod:`graphjit.bench.piecewise`.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from .. import common
from .timing import graphed_stats, timed

HEAD_DIM = 64


class PiecewiseBench:
    """One run's torch side: weights and caches per size, metadata per step, one variant's check and timing."""

    def __init__(self, args: argparse.Namespace, on_gpu: bool) -> None:
        import torch

        self.torch = torch
        self.args = args
        self.on_gpu = on_gpu
        self.device = "cuda" if on_gpu else "cpu"
        self.dtype = torch.bfloat16 if on_gpu else torch.float32

    def sync(self) -> None:
        if self.on_gpu:
            self.torch.cuda.synchronize()

    # -- the model ---------------------------------------------------------------------------------
    def model(self, layers: int, batch: int, fixed: bool) -> tuple[Callable[..., Any], list[Any]]:
        """The step and its caches: ``fixed`` attends over the whole cache (one shape for every call), else
        over the first ``meta["max_len"]`` entries, a host int, inside an island."""
        import graphjit

        torch, a = self.torch, self.args
        d, heads = a.hidden, max(1, a.hidden // HEAD_DIM)
        gen = torch.Generator().manual_seed(a.seed)

        def w(*shape: int) -> Any:
            return (torch.randn(*shape, generator=gen) / shape[0] ** 0.5).to(self.device, self.dtype)

        weights = [(w(d, 3 * d), w(d, d), w(d, 2 * d), w(d, d)) for _ in range(layers)]
        caches = [(torch.zeros(batch, heads, a.max_cache, HEAD_DIM, device=self.device, dtype=self.dtype),
                   torch.zeros(batch, heads, a.max_cache, HEAD_DIM, device=self.device, dtype=self.dtype))
                  for _ in range(layers)]
        rows = torch.arange(batch, device=self.device)
        sdpa = torch.nn.functional.scaled_dot_product_attention

        def write(k: Any, v: Any, kc: Any, vc: Any, pos: Any) -> None:
            kc[rows, :, pos] = k[:, :, 0]
            vc[rows, :, pos] = v[:, :, 0]

        def attend_fixed(q: Any, k: Any, v: Any, kc: Any, vc: Any, meta: Any) -> Any:
            write(k, v, kc, vc, meta["pos"])
            return sdpa(q, kc, vc, attn_mask=meta["mask"])

        @graphjit.eager
        def attend_varlen(q: Any, k: Any, v: Any, kc: Any, vc: Any, meta: Any) -> Any:
            write(k, v, kc, vc, meta["pos"])
            n = meta["max_len"]
            return sdpa(q, kc[:, :, :n], vc[:, :, :n], attn_mask=meta["mask"][..., :n])

        attend = attend_fixed if fixed else attend_varlen

        def norm(x: Any) -> Any:
            return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype)

        def step(x: Any, meta: Any) -> Any:
            h = x
            for (wqkv, wo, wup, wdown), (kc, vc) in zip(weights, caches):
                q, k, v = (norm(h) @ wqkv).view(batch, 3, heads, 1, HEAD_DIM).unbind(1)
                h = h + attend(q, k, v, kc, vc, meta).reshape(batch, d) @ wo
                gate, up = (norm(h) @ wup).chunk(2, -1)
                h = h + (torch.nn.functional.silu(gate) * up) @ wdown
            return h

        return step, caches

    def metas(self, batch: int, count: int) -> list[dict[str, Any]]:
        """Per-step metadata, made before timing: positions (a device tensor), the mask over the cache, and
        ``max_len``, a host int that changes every step."""
        torch, a = self.torch, self.args
        gen = torch.Generator().manual_seed(a.seed + batch)
        out = []
        for _ in range(count):
            pos = torch.randint(0, a.max_cache, (batch,), generator=gen)
            mask = torch.arange(a.max_cache)[None, :] <= pos[:, None]
            out.append({"pos": pos.to(self.device), "mask": mask[:, None, None, :].to(self.device),
                        "max_len": int(pos.max()) + 1})
        return out

    # -- one variant -------------------------------------------------------------------------------
    def run_variant(self, variant: str, layers: int, batch: int) -> dict[str, Any]:
        import graphjit

        torch, a = self.torch, self.args
        total = a.warmup + a.repeats * a.steps
        metas = self.metas(batch, total)
        gen = torch.Generator().manual_seed(a.seed + 7)
        xs = [torch.randn(batch, a.hidden, generator=gen).to(self.device, self.dtype) for _ in range(a.warmup)]
        ref_step, _ = self.model(layers, batch, fixed=False)
        step, _caches = self.model(layers, batch, fixed=variant == "whole_fixed")
        if variant == "eager":
            fn: Callable[..., Any] = step
        elif variant == "piecewise":
            fn = graphjit.graphed(step, dynamic=("meta",))
        else:  # the fixed-shape step reads no host int: its metadata is two tensors, static inputs of one graph
            fn = graphjit.graphed(step)
            metas = [{"pos": m["pos"], "mask": m["mask"]} for m in metas]
        worst = 0.0
        with torch.no_grad():
            for i in range(a.warmup):
                want = ref_step(xs[i], {**metas[i], "max_len": int(metas[i]["pos"].max()) + 1}).float()
                got = fn(xs[i], metas[i]).float()
                worst = max(worst, float((got - want).norm() / want.norm()))
            x = xs[-1]
            self.sync()
            it = iter(metas[a.warmup:])
            res = timed(self.on_gpu, a.repeats, a.steps, lambda: fn(x, next(it)))
        tolerance = 2e-2 if self.dtype == torch.bfloat16 else 1e-4
        res.update({"max_rel_diff": worst, "equal_eager": worst <= tolerance})
        graphed_stats(fn, self.on_gpu, res, ("segments", "islands", "replay_us", "island_us"))
        return res

    # -- the boundary ------------------------------------------------------------------------------
    def boundary_cost(self, layers: int) -> dict[str, Any]:
        """A graphed chain of ``layers`` small matmuls, with and without an identity island between layers."""
        import graphjit

        torch, a = self.torch, self.args
        w = torch.randn(64, 64, generator=torch.Generator().manual_seed(a.seed)).to(self.device, self.dtype) / 8

        @graphjit.eager
        def nothing(h: Any) -> Any:
            return h  # returns its input: no copy, so the time is the boundary itself

        def chain(x: Any, islands: bool) -> Any:
            h = x
            for _ in range(layers):
                h = torch.tanh(h @ w)
                if islands:
                    h = nothing(h)
            return h

        timings = {}
        x = torch.randn(8, 64).to(self.device, self.dtype)
        for islands in (False, True):
            g: Any = graphjit.graphed(lambda x, islands=islands: chain(x, islands))
            with torch.no_grad():
                for _ in range(a.warmup):
                    g(x)
                self.sync()
                samples = []
                for _ in range(a.repeats):
                    t0 = time.perf_counter()
                    for _ in range(a.steps):
                        g(x)
                    self.sync()
                    samples.append((time.perf_counter() - t0) * 1e6 / a.steps)
            timings[islands] = common.median(samples)
            if self.on_gpu and not g.stats()["graphs"]:
                return {"status": "fallback", "stats": g.stats()["fallbacks"]}
        whole, piecewise = timings[False], timings[True]
        assert whole is not None and piecewise is not None
        return {"status": "ok", "islands": layers, "whole_us": whole, "piecewise_us": piecewise,
                "us_per_boundary": (piecewise - whole) / layers, "timer": "host, synchronised per repeat"}
