"""Paddle half of ``python -m graphjit bench decode``: the step and the runner that builds, checks and times it.

:class:`PaddleDecodeRunner` implements the hooks of the framework-neutral
:class:`graphjit.bench.decode.DecodeRunner` with paddle: the step (at module level, see below), relative errors
against eager in numpy, host timing around a device synchronise, and a ``paddle.device.cuda.graphs.CUDAGraph``
captured by hand.  Paddle is imported when the runner is created (and by the step), not with this module.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from typing import Any, cast

from ..decode_runner import EPS, HOST_SHAPE, DecodeRunner, errors_entry, tolerance

# The Paddle step lives at module level and reads its weights from a module-level dict: Paddle's AST
# tracer re-executes the function's source and cannot see closure variables.  PaddleDecodeRunner.build sets them.
_PADDLE_STEP: dict[str, Any] = {}


def _paddle_step(x: Any) -> Any:
    import paddle

    state = _PADDLE_STEP
    for w, g in state["params"]:
        x = x + paddle.nn.functional.silu(paddle.matmul(x, w))
        xf = x.astype("float32") if state["cast"] else x
        xf = xf * paddle.rsqrt((xf * xf).mean(axis=-1, keepdim=True) + EPS)
        x = (xf.astype(state["dtype"]) if state["cast"] else xf) * g
    return x


class PaddleDecodeRunner(DecodeRunner):
    """The paddle runner: on the GPU (or the CPU), under ``paddle.no_grad()`` until :meth:`teardown`; timed
    with host clocks (around a device synchronise on the GPU).  Keeps every graph alive until the process ends."""

    name = "paddle"

    def __init__(self, args: argparse.Namespace, on_gpu: bool) -> None:
        super().__init__(args, on_gpu)
        import paddle

        self.paddle = paddle
        paddle.set_device("gpu" if on_gpu else "cpu")
        self.dtype = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}[args.dtype]
        self.timer = "host_sync" if on_gpu else "host"
        # Paddle 2.6 crashes when a tensor of a graph's pool is freed after the graph was reset or
        # destroyed (also at interpreter exit): every graph, its inputs and outputs and every
        # graphed function stay referenced here until the process ends (use --hard-exit).
        self.alive: list[Any] = []
        self.no_grad = paddle.no_grad()
        self.no_grad.__enter__()

    def unusable(self) -> str | None:
        try:
            from graphjit import backends

            poisoned = backends.get("paddle").poisoned
            if poisoned:
                return poisoned
            capturing = getattr(self.paddle.base.core, "is_cuda_graph_capturing", None)
            if self.on_gpu and capturing is not None and capturing():
                return "paddle is still in capture mode after a failed capture; no GPU call can run in this process"
        except Exception:
            return None
        return None

    def teardown(self) -> None:
        self.no_grad.__exit__(None, None, None)

    def sync(self) -> None:
        if self.on_gpu:
            self.paddle.device.cuda.synchronize()

    def _tensor(self, array: Any) -> Any:
        # to_tensor from numpy: paddle's randn (and casts) compute garbage on some GPUs.
        t = self.paddle.to_tensor(array.astype("float32"))
        t.stop_gradient = True
        return t if self.dtype == "float32" else t.astype(cast(Any, self.dtype))  # a paddle dtype name

    def build(self, layers: int, hidden: int, batch: int) -> None:
        import numpy as np

        self.step = None
        self._free()
        rng = np.random.default_rng(self.args.seed)
        params = [(self._tensor(rng.standard_normal((hidden, hidden)) / math.sqrt(hidden)),
                   self._tensor(1.0 + 0.1 * rng.standard_normal((hidden,)))) for _ in range(layers)]
        self.x = self._tensor(rng.standard_normal((batch, hidden)))
        self.x2 = self._tensor(rng.standard_normal((batch, hidden)))
        _PADDLE_STEP.update(params=params, cast=self.dtype != "float32", dtype=self.dtype)
        step = _paddle_step
        self.step = step
        self.ref = [self._np(step(self.x)), self._np(step(self.x2))]
        self.sync()

    def _free(self) -> None:
        import gc

        gc.collect()
        if self.on_gpu:
            self.sync()

    def _np(self, t: Any) -> Any:
        import numpy as np

        arr = np.asarray(t.numpy())
        if arr.dtype == np.uint16 and "bfloat16" in str(t.dtype):
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        return arr.astype(np.float64)

    def _check(self, call: Callable[[Any], Any], name: str) -> dict[str, Any]:
        import numpy as np

        errs = []
        for inp, ref in ((self.x2, self.ref[1]), (self.x, self.ref[0])):
            got = self._np(call(inp))
            if got.shape != ref.shape or not np.array_equal(np.isnan(got), np.isnan(ref)):
                errs.append((math.inf, math.inf))
                continue
            got, want = np.nan_to_num(got), np.nan_to_num(ref)
            diff = got - want
            nb, mb = float(np.linalg.norm(want)), float(np.abs(want).max()) if want.size else 0.0
            rel = float(np.linalg.norm(diff)) / nb if nb else (0.0 if not diff.any() else math.inf)
            mx = float(np.abs(diff).max()) / mb if mb else (0.0 if not diff.any() else math.inf)
            errs.append((rel, mx))
        return errors_entry(errs, tolerance(self.args.dtype, name))

    def _measure(self, call: Callable[[], Any], iters: int) -> tuple[float, float]:
        """Host clocks around the calls and a device synchronise (step time), and the host time to issue them."""
        perf = time.perf_counter_ns
        t0 = perf()
        for _ in range(iters):
            call()
        t1 = perf()
        self.sync()
        t2 = perf()
        return (t2 - t0) / 1e3 / iters, (t1 - t0) / 1e3 / iters

    def _raw_capture(self, fn: Callable[..., Any], *static: Any) -> tuple[Any, Any]:
        paddle = self.paddle
        from paddle.device.cuda.graphs import CUDAGraph

        for _ in range(2):
            fn(*static)
        self.sync()
        graph = CUDAGraph(place=paddle.CUDAPlace(paddle.device.cuda.current_device()
                                                 if hasattr(paddle.device.cuda, "current_device") else 0),
                          mode="thread_local")
        self.alive.append((graph, static))
        graph.capture_begin()
        try:
            out = fn(*static)
        finally:
            graph.capture_end()  # never leave the stream capturing
        self.alive.append(out)
        self.sync()
        return graph, out

    copy_into_text = "static_x.copy_(x, False)"

    def graphed_options(self, name: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
        tracer = {"graphed": "eager", "graphed_ast": "ast", "graphed_sot": "sot"}.get(name)
        if tracer is None:
            return None
        return {"backend": "paddle", "tracer": tracer}, {"tracer": tracer}

    def copy_into(self, static: Any, inp: Any) -> None:
        static.copy_(inp, False)

    def release(self, keep: list[Any]) -> None:
        self.alive.extend(keep)  # never reset: see __init__

    def host_inputs(self) -> list[Any]:
        import numpy as np

        rng = np.random.default_rng(self.args.seed + 1)
        return [self._tensor(rng.standard_normal(HOST_SHAPE)) for _ in range(4)]

    def host_function(self) -> tuple[Callable[..., Any], str]:
        """On a GPU, matrix products (the kernels Paddle 2.6.2 computes right on Hopper, where its elementwise ones
        return garbage and graphjit's check after capture would then, rightly, refuse the graph); on a CPU the sum."""
        if not self.on_gpu:
            return super().host_function()
        paddle = self.paddle

        def tiny(a: Any, b: Any, c: Any, d: Any) -> Any:
            return paddle.matmul(paddle.matmul(paddle.matmul(a, b, transpose_y=True), c), d, transpose_y=True)

        return tiny, "((a @ b.T) @ c) @ d.T"

    def host_graphed_calls(self, tiny: Callable[..., Any], inputs: list[Any], calls: dict[str, Callable[..., Any]],
                           keep: list[Any], out: dict[str, Any]) -> None:
        paddle = self.paddle
        self.add_graphed_and_signing(tiny, inputs, calls, keep, out, backend="paddle", tracer="eager")
        # Parts of the graphed call, for the breakdown (the key: part_sign above): the input copies, the output copy.
        targets = [t.clone() for t in inputs]
        self.alive.append(targets)
        calls["part_copy_inputs"] = lambda: [t.copy_(x, False) for t, x in zip(targets, inputs)]
        calls["part_clone_output"] = lambda: paddle.assign(inputs[0])
