"""torch half of ``python -m graphjit bench decode``: the runner that builds, checks and times the decode step.

:class:`TorchDecodeRunner` implements the hooks of the framework-neutral
:class:`graphjit.bench.decode.DecodeRunner` (which holds the variant loop, the raw-graph and ``@graphed``
variants and the host-cost measurement) with torch: the step and its weights, relative errors against eager,
CUDA-event timing, a CUDA graph captured by hand as the torch docs show, and the ``compile_reduce_overhead``
variant (``torch.compile``).  torch is imported when the runner is created, not with this module.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from typing import Any, cast

from ..decode_runner import EPS, HOST_SHAPE, DecodeRunner, errors_entry, tolerance


class TorchDecodeRunner(DecodeRunner):
    """The torch runner: bf16/fp16/fp32 on the current CUDA device (or the CPU), under ``torch.no_grad()``
    until :meth:`teardown`; timed with CUDA events on a GPU, host clocks on the CPU."""

    name = "torch"

    def __init__(self, args: argparse.Namespace, on_gpu: bool) -> None:
        super().__init__(args, on_gpu)
        import torch

        self.torch = torch
        self.device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
        self.timer = "cuda_events" if on_gpu else "host"
        dynamo = getattr(torch, "_dynamo", None)
        if dynamo is not None:  # one process compiles many configurations of the same code object
            for attr in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit",
                         "accumulated_recompile_limit"):
                if hasattr(dynamo.config, attr):
                    setattr(dynamo.config, attr, max(256, getattr(dynamo.config, attr)))
        self.no_grad = torch.no_grad()
        self.no_grad.__enter__()

    def teardown(self) -> None:
        self.no_grad.__exit__(None, None, None)

    def sync(self) -> None:
        if self.on_gpu:
            self.torch.cuda.synchronize()

    def build(self, layers: int, hidden: int, batch: int) -> None:
        torch = self.torch
        self.step = None
        self._free()
        gen = torch.Generator(device="cpu").manual_seed(self.args.seed)
        dev, dt = self.device, self.dtype
        params = []
        for _ in range(layers):
            w = (torch.randn(hidden, hidden, generator=gen) / math.sqrt(hidden)).to(dev, dt)
            g = (1.0 + 0.1 * torch.randn(hidden, generator=gen)).to(dev, dt)
            params.append((w, g))
        self.static_weights = False
        mark = getattr(getattr(torch, "_dynamo", None), "mark_static_address", None)
        if mark is not None and self.on_gpu:
            # Weights are parameters in a real model: tell torch.compile's CUDA graphs (cudagraph
            # trees) that their addresses are fixed, or reduce-overhead copies every weight each call.
            for w, g in params:
                mark(w)
                mark(g)
            self.static_weights = True
        self.x = torch.randn(batch, hidden, generator=gen).to(dev, dt)
        self.x2 = torch.randn(batch, hidden, generator=gen).to(dev, dt)
        silu = torch.nn.functional.silu
        rsqrt = torch.rsqrt

        def step(x: Any) -> Any:
            for w, g in params:
                x = x + silu(x @ w)  # matmul, activation, residual add
                xf = x.float()  # RMSNorm in fp32, as models do
                x = (xf * rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype) * g
            return x

        self.step = step
        self.ref = [step(self.x).clone(), step(self.x2).clone()]
        self.sync()

    def _free(self) -> None:
        import gc

        gc.collect()
        if self.on_gpu:
            self.torch.cuda.synchronize()
            self.torch.cuda.empty_cache()

    def _err(self, got: Any, want: Any) -> tuple[float, float]:
        torch = self.torch
        a, b = got.detach().double(), want.detach().double()
        if a.shape != b.shape:
            return math.inf, math.inf
        if not torch.equal(torch.isnan(a), torch.isnan(b)):
            return math.inf, math.inf
        a, b = torch.nan_to_num(a), torch.nan_to_num(b)
        diff = a - b
        nb, mb = float(torch.linalg.vector_norm(b)), float(b.abs().max()) if b.numel() else 0.0
        rel = float(torch.linalg.vector_norm(diff)) / nb if nb else (0.0 if not diff.any() else math.inf)
        mx = float(diff.abs().max()) / mb if mb else (0.0 if not diff.any() else math.inf)
        return rel, mx

    def _check(self, call: Callable[[Any], Any], name: str) -> dict[str, Any]:
        """Outputs on the second input, then the first (timing then uses the first)."""
        errs = []
        for inp, ref in ((self.x2, self.ref[1]), (self.x, self.ref[0])):
            out = call(inp).clone()
            self.sync()
            errs.append(self._err(out, ref))
        return errors_entry(errs, tolerance(self.args.dtype, name))

    def _measure(self, call: Callable[[], Any], iters: int) -> tuple[float, float]:
        """On the GPU: CUDA events around the calls (device time per step), and the host time to issue them."""
        if not self.on_gpu:
            return super()._measure(call, iters)
        torch = self.torch
        perf = time.perf_counter_ns
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t0 = perf()
        for _ in range(iters):
            call()
        t1 = perf()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3 / iters, (t1 - t0) / 1e3 / iters

    def _raw_capture(self, fn: Callable[..., Any], *static: Any) -> tuple[Any, Any]:
        """A graph of ``fn(*static)`` captured by hand, as the torch docs show."""
        torch = self.torch
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                fn(*static)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fn(*static)
        torch.cuda.synchronize()
        return graph, out

    def graphed_options(self, name: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
        if name not in ("graphed", "graphed_alias", "graphed_compile", "graphed_compile_alias"):
            return None
        # alias outputs are what reduce-overhead returns too (overwritten by the next call)
        opts: dict[str, Any] = {"outputs": "alias"} if name.endswith("_alias") else {}
        if name.startswith("graphed_compile"):
            self.torch._dynamo.reset()
            opts["tracer"] = "compile"
        return opts, (opts or {"outputs": "copy", "tracer": "eager"})

    def copy_into(self, static: Any, inp: Any) -> None:
        static.copy_(inp)

    def other_variant(self, name: str) -> tuple[dict[str, Any], Callable[[], Any], dict[str, Any]]:
        if name != "compile_reduce_overhead":
            return super().other_variant(name)
        torch, step, x = self.torch, cast(Callable[[Any], Any], self.step), self.x
        torch._dynamo.reset()
        compiled = torch.compile(step, mode="reduce-overhead")
        mark = getattr(getattr(torch, "compiler", None), "cudagraph_mark_step_begin", None)

        def call(inp: Any) -> Any:
            if mark is not None:
                mark()
            return compiled(inp)

        skips_before = _cudagraph_skips(torch)
        for _ in range(3):  # warmup run, record, first replay (cudagraph trees)
            call(x)
        check = self._check(call, name)
        extra: dict[str, Any] = {"weights_marked_static": self.static_weights,
                                 "cudagraph_skips": _cudagraph_skips(torch) - skips_before}
        if extra["cudagraph_skips"]:
            extra["note"] = "Inductor skipped its CUDA graphs (see TORCH_LOGS=perf_hints); this is not graph replay"
        return check, lambda: call(x), extra

    def release(self, keep: list[Any]) -> None:
        for obj in keep:  # graphed functions and raw CUDAGraphs: free their memory now
            if hasattr(obj, "reset"):
                obj.reset()

    def host_inputs(self) -> list[Any]:
        torch = self.torch
        return [torch.randn(*HOST_SHAPE, device=self.device).to(self.dtype) for _ in range(4)]

    def host_graphed_calls(self, tiny: Callable[..., Any], inputs: list[Any], calls: dict[str, Callable[..., Any]],
                           keep: list[Any], out: dict[str, Any]) -> None:
        import graphjit

        self.add_graphed_and_signing(tiny, inputs, calls, keep, out)
        # The same call reading Python values it does not receive (an attribute of an object it closes over, a
        # global), as decode steps do: the difference to "graphed" is what checking them before a replay costs.
        import types

        cfg = types.SimpleNamespace(scale=1.0, shift=0.0, causal=True, mode="decode")

        def tiny_reads(a: Any, b: Any, c: Any, d: Any) -> Any:
            out = tiny(a, b, c, d) * cfg.scale
            return out + cfg.shift if cfg.causal and cfg.mode == "decode" else out

        reads = cast(graphjit.GraphedFunction, graphjit.graphed(tiny_reads))
        keep.append(reads)
        calls["graphed_reads"] = lambda: reads(*inputs)
        # Parts of the graphed call, for the breakdown (the key: part_sign above): the input copies, the output copy.
        targets = [t.clone() for t in inputs]
        calls["part_copy_inputs"] = lambda: self.torch._foreach_copy_(targets, inputs)
        calls["part_clone_output"] = lambda: inputs[0].clone()


def _cudagraph_skips(torch: Any) -> int:
    """How often Inductor has refused to use CUDA graphs so far (0 if torch does not count it)."""
    try:
        return int(torch._dynamo.utils.counters["inductor"]["cudagraph_skips"])
    except Exception:
        return 0
