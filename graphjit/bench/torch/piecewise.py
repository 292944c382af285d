"""torch half of ``python -m graphjit bench piecewise``: the decode step with per-call attention metadata,
eager, piecewise (attention an island) and as a whole graph of its fixed-shape variant; and the cost of one
island boundary.  The framework-neutral part is :mod:`graphjit.bench.piecewise`.

How each variant is measured, the same way for all three (:meth:`PiecewiseBench.run_variant`):

1. checked calls: ``--warmup`` calls (the graphed variants warm up and capture here), each compared with an
   eager reference of the same function on the same inputs and state;
2. a warm pass: one untimed pass over the ``--steps`` metadata the timed loop uses.  Every ``max_len`` the
   variant will be timed on has then been seen: torch's cuDNN attention (which ``scaled_dot_product_attention``
   picks for this step on Hopper) builds an execution plan for every new sequence length, about 60 ms each on
   an H200, and without this pass whichever variant ran first at a batch size (eager) paid for every length in
   its timed loop while the others met them cached;
3. timed: ``--repeats`` passes over the same ``--steps`` metadata (:func:`.timing.timed`);
4. checked again: the reference is given the variant's state (its caches) and both run one more call.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from .. import common
from .timing import graphed_stats, timed

HEAD_DIM = 64
EMPTY_GRAPH = "The CUDA Graph is empty"
"""torch's warning (``CUDAGraph.cpp``) for a captured graph with no nodes: a segment that measures nothing."""
FUNCTION_TOLERANCE = 1e-5
"""The largest relative difference in float32 between the fixed-shape step and the varlen step (the same
math: attention over the whole cache with the positions past each sequence masked)."""


class PiecewiseBench:
    """One run's torch side: weights and caches per size, metadata per step, one variant's check and timing."""

    def __init__(self, args: argparse.Namespace, on_gpu: bool) -> None:
        import torch

        self.torch = torch
        self.args = args
        self.on_gpu = on_gpu
        self.device = "cuda" if on_gpu else "cpu"
        self.dtype = torch.bfloat16 if on_gpu else torch.float32

    def attention(self) -> contextlib.AbstractContextManager[Any]:
        """``--attention``: the one ``scaled_dot_product_attention`` kernel every variant runs (on a GPU; the CPU
        smoke run keeps torch's pick).  torch's own pick on Hopper (``auto``) is cuDNN, which builds an
        execution plan for every new sequence length (about 60 ms on an H200)."""
        name = getattr(self.args, "attention", "auto")
        if not self.on_gpu or name == "auto":
            return contextlib.nullcontext()
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel([{"efficient": SDPBackend.EFFICIENT_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                             "math": SDPBackend.MATH}[name]])

    def sync(self) -> None:
        if self.on_gpu:
            self.torch.cuda.synchronize()

    # -- the model ---------------------------------------------------------------------------------
    def model(self, layers: int, batch: int, fixed: bool, dtype: Any = None) -> tuple[Callable[..., Any], list[Any]]:
        """The step and its caches (weights from ``--seed``: every model of one size has the same ones).
        ``fixed`` attends over the whole cache (one shape for every call), else over the first
        ``meta["max_len"]`` entries, a host int, inside an island; both mask the positions past each
        sequence's own, so they compute the same function."""
        import graphjit

        torch, a = self.torch, self.args
        dtype = self.dtype if dtype is None else dtype
        d, heads = a.hidden, max(1, a.hidden // HEAD_DIM)
        gen = torch.Generator().manual_seed(a.seed)

        def w(*shape: int) -> Any:
            return (torch.randn(*shape, generator=gen) / shape[0] ** 0.5).to(self.device, dtype)

        weights = [(w(d, 3 * d), w(d, d), w(d, 2 * d), w(d, d)) for _ in range(layers)]
        caches = [(torch.zeros(batch, heads, a.max_cache, HEAD_DIM, device=self.device, dtype=dtype),
                   torch.zeros(batch, heads, a.max_cache, HEAD_DIM, device=self.device, dtype=dtype))
                  for _ in range(layers)]
        rows = torch.arange(batch, device=self.device)
        sdpa = torch.nn.functional.scaled_dot_product_attention

        def write(k: Any, v: Any, kc: Any, vc: Any, pos: Any) -> None:
            kc[rows, :, pos] = k[:, :, 0]
            vc[rows, :, pos] = v[:, :, 0]

        def attend_fixed(q: Any, kc: Any, vc: Any, meta: Any) -> Any:
            return sdpa(q, kc, vc, attn_mask=meta["mask"])

        @graphjit.eager
        def attend_varlen(q: Any, kc: Any, vc: Any, meta: Any) -> Any:
            n = meta["max_len"]
            return sdpa(q, kc[:, :, :n], vc[:, :, :n], attn_mask=meta["mask"][..., :n])

        attend = attend_fixed if fixed else attend_varlen

        def norm(x: Any) -> Any:
            return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype)

        def step(x: Any, pos: Any, meta: Any) -> Any:
            h = x
            for (wqkv, wo, wup, wdown), (kc, vc) in zip(weights, caches):
                q, k, v = (norm(h) @ wqkv).view(batch, 3, heads, 1, HEAD_DIM).unbind(1)
                write(k, v, kc, vc, pos)  # reads device tensors only: captured (only the attention reads max_len)
                h = h + attend(q, kc, vc, meta).reshape(batch, d) @ wo
                gate, up = (norm(h) @ wup).chunk(2, -1)
                h = h + (torch.nn.functional.silu(gate) * up) @ wdown
            return h

        return step, caches

    def metas(self, batch: int, count: int, salt: int = 0) -> list[dict[str, Any]]:
        """Per-step metadata, made before any timing: positions (a device tensor), the mask over the cache,
        and ``max_len``, a host int (the longest sequence) that changes from step to step."""
        torch, a = self.torch, self.args
        gen = torch.Generator().manual_seed(a.seed + 1000 * salt + batch)
        out = []
        for _ in range(count):
            pos = torch.randint(0, a.max_cache, (batch,), generator=gen)
            mask = torch.arange(a.max_cache)[None, :] <= pos[:, None]
            out.append({"pos": pos.to(self.device), "mask": mask[:, None, None, :].to(self.device),
                        "max_len": int(pos.max()) + 1})
        return out

    def inputs(self, batch: int, count: int, dtype: Any = None) -> list[Any]:
        torch = self.torch
        gen = torch.Generator().manual_seed(self.args.seed + 7)
        return [torch.randn(batch, self.args.hidden, generator=gen).to(self.device, self.dtype if dtype is None
                                                                        else dtype) for _ in range(count)]

    @staticmethod
    def call_args(meta: dict[str, Any], fixed: bool) -> tuple[Any, dict[str, Any]]:
        """A step's arguments after ``x`` for one step's metadata: the positions (a plain tensor argument: the
        cache write reads them inside the graph) and the attention's metadata: the mask and, for the varlen
        step, the host int (the fixed-shape step does not read it: it would be part of the key of its graph)."""
        rest = {"mask": meta["mask"]} if fixed else {"mask": meta["mask"], "max_len": meta["max_len"]}
        return meta["pos"], rest

    def rel_diff(self, got: Any, want: Any) -> float:
        """``|got - want| / |want|`` in float32 (0.0 for equal tensors, whatever their values)."""
        got, want = got.float(), want.float()
        den = float(want.norm())
        num = float((got - want).norm())
        return num / den if den else num

    def function_check(self, layers: int, batch: int, dtype: Any = None, calls: int = 4) -> float:
        """The largest relative difference between the fixed-shape step and the varlen step (eager, the
        same weights, inputs and metadata, each with its own caches) over ``calls`` calls; in float32
        unless ``dtype``."""
        torch = self.torch
        dtype = torch.float32 if dtype is None else dtype
        varlen, _ = self.model(layers, batch, fixed=False, dtype=dtype)
        fixed, _ = self.model(layers, batch, fixed=True, dtype=dtype)
        worst = 0.0
        with torch.no_grad():
            for x, meta in zip(self.inputs(batch, calls, dtype), self.metas(batch, calls, salt=2)):
                worst = max(worst, self.rel_diff(fixed(x, *self.call_args(meta, True)),
                                                 varlen(x, *self.call_args(meta, False))))
        return worst

    # -- one variant -------------------------------------------------------------------------------
    def run_variant(self, variant: str, layers: int, batch: int) -> dict[str, Any]:
        """Check, warm, time and check again one variant (module docstring); ``equal_eager``: every checked
        call equals the eager reference of the same function exactly."""
        with self.attention():
            return self._run_variant(variant, layers, batch)

    def _run_variant(self, variant: str, layers: int, batch: int) -> dict[str, Any]:
        import graphjit

        torch, a = self.torch, self.args
        fixed = variant == "whole_fixed"
        # The reference: the same function, eager (the fixed-shape step for whole_fixed: the same math as the
        # varlen one, checked separately in float32 below, but other kernels, so other bf16 rounding).
        ref_step, ref_caches = self.model(layers, batch, fixed=fixed)
        step, caches = self.model(layers, batch, fixed=fixed)
        if variant == "eager":
            fn: Callable[..., Any] = step
        elif variant == "piecewise":
            fn = graphjit.graphed(step, dynamic=("meta",))
        else:  # the fixed-shape step reads no host int: its metadata is two tensors, static inputs of one graph
            fn = graphjit.graphed(step)
        checked = [self.call_args(m, fixed) for m in self.metas(batch, a.warmup + 1, salt=1)]
        timed_metas = [self.call_args(m, fixed) for m in self.metas(batch, a.steps)]
        xs = self.inputs(batch, a.warmup + 1)
        diffs: list[float] = []
        with torch.no_grad(), _graph_warnings() as empty:
            for x, meta in zip(xs[:-1], checked[:-1]):
                want = ref_step(x, *meta)
                diffs.append(self.rel_diff(fn(x, *meta), want))
            x = xs[0]
            t0 = time.perf_counter()
            for meta in timed_metas:  # the warm pass: every length of the timed loop seen once, untimed
                fn(x, *meta)
            self.sync()
            first_pass = (time.perf_counter() - t0) * 1e6 / len(timed_metas)
            metas = itertools.cycle(timed_metas)
            res = timed(self.on_gpu, a.repeats, a.steps, lambda: fn(x, *next(metas)))
            for (rk, rv), (k, v) in zip(ref_caches, caches):  # the reference takes the variant's state
                rk.copy_(k)
                rv.copy_(v)
            diffs.append(self.rel_diff(fn(xs[-1], *checked[-1]), ref_step(xs[-1], *checked[-1])))
        worst = max(diffs)
        res.update({"reference": "eager, fixed-shape step" if fixed else "eager, varlen step",
                    "checked_calls": len(diffs), "max_rel_diff": worst, "equal_eager": worst == 0.0,
                    "first_pass_host_us_per_step": first_pass})
        if empty:
            res["empty_graphs"] = len(empty)
        if fixed:  # the fixed-shape step computes the varlen step's function: same math, masked
            same = self.function_check(layers, batch)
            res["function_check"] = {"dtype": "float32", "max_rel_diff": same, "tolerance": FUNCTION_TOLERANCE,
                                     "equal": same <= FUNCTION_TOLERANCE}
            if self.dtype != torch.float32:  # for the record: what other kernels' rounding does over the layers
                res["function_check"]["bf16_max_rel_diff"] = self.function_check(layers, batch, self.dtype)
        graphed_stats(fn, self.on_gpu, res, ("segments", "islands", "replay_us", "island_us"))
        return res

    # -- the boundary ------------------------------------------------------------------------------
    def boundary_cost(self, islands: int) -> dict[str, Any]:
        """The host cost of one island boundary: a graphed chain of ``islands + 1`` small layers with an identity
        island between each two (``islands + 1`` segments, none empty), against the same chain graphed whole.

        Each call is timed alone: synchronised before, the host clock around the call itself (what the host
        spends issuing it, with an empty launch queue, so a launch never waits for the GPU) and CUDA events
        around it (its span on the GPU).  ``host_us_per_boundary = (host piecewise - host whole) / islands``."""
        import graphjit

        torch, a = self.torch, self.args
        w = torch.randn(64, 64, generator=torch.Generator().manual_seed(a.seed)).to(self.device, self.dtype) / 8

        @graphjit.eager
        def nothing(h: Any) -> Any:
            return h  # returns its input: no copy, so the time is the boundary itself

        def layer(h: Any) -> Any:
            return torch.tanh(h @ w)

        def chain(x: Any, cut: bool) -> Any:
            h = layer(x)
            for _ in range(islands):
                if cut:
                    h = nothing(h)
                h = layer(h)  # every segment, the last included, holds a layer
            return h

        x = torch.randn(8, 64, generator=torch.Generator().manual_seed(a.seed + 1)).to(self.device, self.dtype)
        host: dict[bool, float | None] = {}
        span: dict[bool, float | None] = {}
        outs: dict[bool, Any] = {}
        out: dict[str, Any] = {"status": "ok", "islands": islands, "layers": islands + 1}
        with torch.no_grad(), _graph_warnings() as empty:
            want = chain(x, False)
            for cut in (False, True):
                g: Any = graphjit.graphed(lambda x, cut=cut: chain(x, cut))
                for _ in range(a.warmup):
                    g(x)
                host[cut], span[cut] = self._each_call(functools.partial(g, x), a.repeats * a.steps)
                outs[cut] = g(x)
                st = g.stats()
                key = (st.get("keys") or [{}])[0]
                out["stats_piecewise" if cut else "stats_whole"] = {
                    k: st.get(k) for k in ("calls", "graphs", "replays", "fallbacks")} | {
                    k: key.get(k) for k in ("segments", "islands")}
                if self.on_gpu and (not st["graphs"] or st["fallbacks"]):
                    return {**out, "status": "fallback", "stats": st["fallbacks"]}
        if empty:
            return {**out, "status": "error", "error": f"{len(empty)} captured segment(s) empty ({empty[0]})"}
        diff = max(self.rel_diff(outs[cut], want) for cut in (False, True))
        if diff != 0.0:
            return {**out, "status": "error", "error": f"the graphed chains differ from eager ({diff:.3g})"}
        if self.on_gpu and out["stats_piecewise"]["segments"] != islands + 1:
            return {**out, "status": "error",
                    "error": f"expected {islands + 1} segments, got {out['stats_piecewise']['segments']}"}
        whole, piecewise, gpu_whole, gpu_piecewise = host[False], host[True], span[False], span[True]
        assert whole is not None and piecewise is not None
        out.update({"whole_us": whole, "piecewise_us": piecewise, "us_per_boundary": (piecewise - whole) / islands,
                    "gpu_whole_us": gpu_whole, "gpu_piecewise_us": gpu_piecewise,
                    "gpu_us_per_boundary": None if gpu_whole is None or gpu_piecewise is None
                    else (gpu_piecewise - gpu_whole) / islands,
                    "timer": "host clock around each call alone, synchronised before it (median); gpu: CUDA events "
                             "around it"})
        if self.on_gpu:
            out["by_hand"] = common.guarded(lambda: self._boundary_by_hand(chain, layer, x, islands, want))
            hand = out["by_hand"].get("us_per_boundary")
            if hand is not None:
                out["graphjit_us_per_boundary"] = out["us_per_boundary"] - hand
        return out

    def _boundary_by_hand(self, chain: Callable[[Any, bool], Any], layer: Callable[[Any], Any], x: Any, islands: int,
                          want: Any) -> dict[str, Any]:
        """The same chain graphed by hand (``torch.cuda.graph`` into one pool, no graphjit): one graph of the whole
        chain against ``islands + 1`` graphs of one layer each, replayed in order with a Python call of the identity
        function between two (what a boundary is without graphjit's bookkeeping: one more graph launch).  Timed as
        :meth:`boundary_cost` times graphjit's; ``us_per_boundary``: the floor graphjit's boundary is measured
        against."""
        torch = self.torch

        def nothing(h: Any) -> Any:
            return h

        static_x = x.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.no_grad():  # warm up off the default stream, as torch's docs ask
            for _ in range(3):
                chain(static_x, False)
        torch.cuda.current_stream().wait_stream(side)
        pool = torch.cuda.graph_pool_handle()
        whole = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(whole, pool=pool):
            whole_out = chain(static_x, False)
        pieces = []
        h = static_x
        with torch.no_grad():
            for _ in range(islands + 1):
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, pool=pool):
                    h = layer(h)
                pieces.append(g)
        piece_out = h

        def replay_whole() -> None:
            whole.replay()

        def replay_pieces() -> None:
            last = len(pieces) - 1
            for k, g in enumerate(pieces):
                g.replay()
                if k < last:
                    nothing(piece_out)

        host_whole, gpu_whole = self._each_call(replay_whole, self.args.repeats * self.args.steps)
        host_pieces, gpu_pieces = self._each_call(replay_pieces, self.args.repeats * self.args.steps)
        self.sync()
        diff = max(self.rel_diff(whole_out, want), self.rel_diff(piece_out, want))
        if diff != 0.0:
            return {"status": "error", "error": f"the chains graphed by hand differ from eager ({diff:.3g})"}
        assert host_whole is not None and host_pieces is not None
        return {"status": "ok", "whole_us": host_whole, "pieces_us": host_pieces,
                "us_per_boundary": (host_pieces - host_whole) / islands,
                "gpu_us_per_boundary": None if gpu_whole is None or gpu_pieces is None
                else (gpu_pieces - gpu_whole) / islands}

    def _each_call(self, call: Callable[[], Any], count: int) -> tuple[float | None, float | None]:
        """Median host microseconds of ``call`` alone, each after a synchronisation, and on a GPU the median
        span between CUDA events around it."""
        torch = self.torch
        host, gpu = [], []
        for _ in range(count):
            self.sync()
            if self.on_gpu:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
            t0 = time.perf_counter()
            call()
            host.append((time.perf_counter() - t0) * 1e6)
            if self.on_gpu:
                end.record()
                end.synchronize()
                gpu.append(start.elapsed_time(end) * 1e3)
        return common.median(host), common.median(gpu)


@contextlib.contextmanager
def _graph_warnings() -> Iterator[list[str]]:
    """Collect torch's "The CUDA Graph is empty" warnings raised in the block (a captured segment with no
    work: a measurement of nothing); every other warning is passed on as it was."""
    empty: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield empty
    for w in caught:
        if EMPTY_GRAPH in str(w.message):
            empty.append(str(w.message).splitlines()[0])
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
