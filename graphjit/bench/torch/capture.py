"""torch half of ``python -m graphjit bench capture``: the step, its inputs, and the two ways of capturing every
size (by hand into one pool; ``graphjit.capture_scope``).  Options, summary, JSON and plot are in
:mod:`graphjit.bench.capture`; torch is imported when :class:`CaptureBench` is created."""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import pstats
import time
from pathlib import Path
from typing import Any, cast

from ..common import GcClock


def make_step(torch: Any, weights: list[tuple[Any, Any, Any]]) -> Any:
    """The decode-like step over ``weights``: per layer RMSNorm, a SiLU-gated MLP and a residual add."""

    def step(x: Any) -> Any:
        for norm, up, down in weights:
            y = x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype) * norm
            gate, val = (y @ up.t()).chunk(2, dim=-1)
            x = x + (torch.nn.functional.silu(gate) * val) @ down.t()
        return x

    return step


class CaptureBench:
    """One run's step (random weights, ``args.seed``), its inputs per size, and :meth:`measure` of a variant."""

    def __init__(self, args: argparse.Namespace, on_gpu: bool) -> None:
        import torch

        self.torch = torch
        self.on_gpu = on_gpu
        self.sizes = sorted(set(args.sizes), reverse=True)  # largest first: smaller graphs reuse its pool memory
        self.warmup = args.warmup
        self.device = "cuda" if on_gpu else "cpu"
        dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
        gen = torch.Generator().manual_seed(args.seed)
        h = args.hidden
        self.weights = [(torch.randn(h, generator=gen).to(self.device, dtype) * 0.1 + 1,
                         (torch.randn(2 * h, h, generator=gen) * h ** -0.5).to(self.device, dtype),
                         (torch.randn(h, h, generator=gen) * h ** -0.5).to(self.device, dtype))
                        for _ in range(args.layers)]
        self.inputs = {b: torch.randn(b, h, generator=gen).to(self.device, dtype) for b in self.sizes}
        # a function of its input that reaches its weights (as a model's step reaches its parameters), not this
        # object: what graphjit walks and guards per key is the step's own state, not the benchmark's inputs
        self.step = make_step(torch, self.weights)
        with torch.no_grad():
            for b in self.sizes:  # cuBLAS picks and caches its kernels here, outside both variants' time
                self.step(self.inputs[b])
        self.sync()

    def sync(self) -> None:
        if self.on_gpu:
            self.torch.cuda.synchronize()

    def measure(self, variant: str) -> dict[str, Any]:
        """Capture every size one way; seconds, memory growth, graphs, and three sizes checked against eager."""
        torch = self.torch
        gc.collect()
        if self.on_gpu:
            torch.cuda.empty_cache()
        self.sync()
        reserved0 = torch.cuda.memory_reserved() if self.on_gpu else 0
        allocated0 = torch.cuda.memory_allocated() if self.on_gpu else 0
        t0 = time.perf_counter()
        with torch.no_grad(), GcClock() as collector:
            run, graphs = self._by_hand() if variant == "by_hand" else self._graphjit()
            self.sync()
        seconds = time.perf_counter() - t0
        # gc: the collector's automatic collections inside ``seconds`` (the run's own garbage: collected before it)
        res: dict[str, Any] = {"status": "ok", "seconds": seconds, "graphs": graphs, "gc": collector.record()}
        if self.on_gpu:
            res["reserved_bytes"] = torch.cuda.memory_reserved() - reserved0
            res["allocated_bytes"] = torch.cuda.memory_allocated() - allocated0
        worst, equal = 0.0, True
        checked = [self.sizes[-1], self.sizes[len(self.sizes) // 2], self.sizes[0]]
        with torch.no_grad():
            for b in checked:
                x = torch.randn_like(self.inputs[b])
                got, want = run(b, x).float(), self.step(x).float()
                worst = max(worst, float((got - want).abs().max()))
                equal = equal and bool(torch.equal(got, want))
        res.update(checked_sizes=checked, max_abs_diff=worst, equal_eager=equal, close_to_eager=worst <= 5e-2)
        del run
        return res

    def profile(self, variant: str, dump: Path | None = None) -> dict[str, Any]:
        """:meth:`measure` of ``variant`` under cProfile: its 40 costliest functions by own time, and graphjit's own 40
        by time including what they call (the step and the benchmark left out), as text; the whole profile written to
        ``dump`` (``pstats.Stats(dump)`` reads it) where given, its name in ``dump``."""
        prof = cProfile.Profile()
        prof.enable()
        try:
            res = self.measure(variant)
        finally:
            prof.disable()
        text, own = io.StringIO(), io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(40)
        pstats.Stats(prof, stream=own).sort_stats("cumtime").print_stats(r"graphjit/(?!bench/)", 40)
        out = {"status": "ok", "seconds_profiled": res.get("seconds"), "top_by_own_time": text.getvalue(),
               "graphjit_by_cumulative_time": own.getvalue()}
        if dump is not None:
            prof.dump_stats(dump)
            out["dump"] = dump.name
        return out

    def _by_hand(self) -> tuple[Any, int]:
        torch = self.torch
        if not self.on_gpu:  # the smoke run: no graphs, the step eagerly
            return (lambda b, x: self.step(x)), 0
        pool = torch.cuda.graph_pool_handle()
        made: dict[int, tuple[Any, Any, Any]] = {}
        side = torch.cuda.Stream()
        for b in self.sizes:
            static_x = self.inputs[b].clone()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(self.warmup):
                    self.step(static_x)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                static_y = self.step(static_x)
            made[b] = (graph, static_x, static_y)

        def run(b: int, x: Any) -> Any:
            graph, static_x, static_y = made[b]
            static_x.copy_(x)
            graph.replay()
            return static_y.clone()

        return run, len(made)

    def _graphjit(self) -> tuple[Any, int]:
        import graphjit

        fn = graphjit.graphed(self.step, warmup=self.warmup)
        with graphjit.capture_scope(progress=False, total=len(self.sizes)):
            for b in self.sizes:
                fn(self.inputs[b])
        return (lambda b, x: fn(x)), int(cast(Any, fn).stats().get("graphs") or 0)
