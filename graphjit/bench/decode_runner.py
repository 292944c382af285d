"""The template of ``python -m graphjit bench decode``'s framework runners: :class:`DecodeRunner` (the variant
loop, the check against eager and the host-cost measurement, with hooks the torch and Paddle runners fill in:
:mod:`graphjit.bench.torch.decode`, :mod:`graphjit.bench.paddle.decode`) and what its results are made of.
Framework-neutral; the command line, ratios, summary, JSON, table and plot are :mod:`graphjit.bench.decode`.
"""

from __future__ import annotations

import argparse
import time
from abc import abstractmethod
from collections.abc import Callable, Mapping
from typing import Any, cast

from . import common

NEEDS_CUDA = ("raw_graph", "compile_reduce_overhead")
EPS = 1e-6
HOST_SHAPE = (8, 256)


def _graphed_status(stats: dict[str, Any], on_gpu: bool) -> tuple[str, dict[str, Any]]:
    """``("ok" | "fallback", details)`` from ``GraphedFunction.stats()``."""
    captured = bool(stats.get("graphs"))
    fallbacks = stats.get("fallbacks") or {}
    reasons = [k.get("reason") for k in stats.get("keys", []) if k.get("reason")]
    details: dict[str, Any] = {"captured": captured, "stats": stats}
    if fallbacks or reasons:
        details["fallback_reasons"] = sorted(set(fallbacks) | set(reasons))
    if on_gpu and (not captured or fallbacks):
        return "fallback", details
    if not on_gpu:
        details["note"] = "no CUDA: graphjit ran the traced function (its no-CUDA path)"
    return "ok", details


def timing_entry(samples: list[float], host: list[float], timer: str) -> dict[str, Any]:
    med = common.median(samples)
    return {"us_per_step": med, "samples_us": samples, "spread": (max(samples) - min(samples)) / med if med else None,
            "host_us_per_step": common.median(host), "timer": timer}


def errors_entry(errs: list[tuple[float, float]], tol: float) -> dict[str, Any]:
    rel = max(e[0] for e in errs)
    mx = max(e[1] for e in errs)
    return {"rel_error": rel, "max_rel_error": mx, "tolerance": tol, "correct": bool(rel <= tol)}


def tolerance(dtype: str, variant: str) -> float:
    """Norm-wise relative error allowed against eager.  Same kernels (graphs) differ at most by a
    cuBLAS algorithm choice; compiled variants fuse and round differently."""
    compiled = "compile" in variant
    if dtype == "fp32":
        return 1e-3 if compiled else 1e-4
    return 6e-2 if compiled else 2e-2


class DecodeRunner:
    """One backend: builds a configuration's step, runs each variant, measures host cost.  The framework
    runners (subclasses in :mod:`graphjit.backends`) implement the hooks at the end."""

    sync: Callable[[], None]  # each subclass defines sync(): wait for the device
    step: Callable[[Any], Any] | None  # build() sets the step and its two inputs
    x: Any

    name = "base"
    timer = "host"

    def __init__(self, args: argparse.Namespace, on_gpu: bool) -> None:
        self.args = args
        self.on_gpu = on_gpu

    def unusable(self) -> str | None:
        """Why the framework cannot run anything more in this process (a failed capture), or None."""
        return None

    def time_host(self, calls: Mapping[str, Callable[..., Any]], out: dict[str, Any]) -> None:
        """Host time per call of each of ``calls`` (median of repeats of ``host_iters`` back-to-back calls, the
        device synchronised, untimed, between repeats: batches short enough that the launch queue never fills, so
        the time is the host's, not the GPU's), into ``out["us"]``, ``min_us``, ``samples_us``; a call that raises
        is recorded under ``out["errors"]`` and timed no further.  The repeats take turns across the calls (one
        repeat of each, then the next), so a minute in which the host runs slower weighs on every call alike instead
        of on whichever was being timed (a host's speed moved by 1.7x within minutes on some leases)."""
        args = self.args
        perf = time.perf_counter_ns
        live: dict[str, Callable[..., Any]] = {}
        for label, call in calls.items():
            try:
                for _ in range(20):
                    call()
                self.sync()
                live[label] = call
            except Exception as exc:
                out["errors"][label] = common.error_text(exc)
        samples: dict[str, list[float]] = {label: [] for label in live}
        for _ in range(args.host_repeats):
            for label, call in list(live.items()):
                try:
                    t0 = perf()
                    for _ in range(args.host_iters):
                        call()
                    t1 = perf()
                    self.sync()
                except Exception as exc:
                    out["errors"][label] = common.error_text(exc)
                    del live[label], samples[label]
                    continue
                samples[label].append((t1 - t0) / 1e3 / args.host_iters)
        for label, got in samples.items():
            out["us"][label] = common.median(got)
            out.setdefault("min_us", {})[label] = min(got)
            out.setdefault("samples_us", {})[label] = got

    def variant(self, name: str) -> dict[str, Any]:
        """Build variant ``name`` of the current configuration, check it against eager, time it."""
        import graphjit

        step, x = cast(Callable[[Any], Any], self.step), self.x  # build() ran first
        if name in NEEDS_CUDA and not self.on_gpu:
            return {"status": "skipped", "reason": "needs a CUDA GPU"}
        t0 = time.perf_counter()
        extra: dict[str, Any] = {}
        status = "ok"
        keep: list[Any] = []
        graphed_opts = self.graphed_options(name)
        if name == "eager":
            check = self._check(step, name)

            def run() -> Any:
                return step(x)
        elif name == "raw_graph":
            static_x = x.clone()
            graph, static_out = self._raw_capture(step, static_x)
            keep.append(graph)

            def replay(inp: Any) -> Any:
                self.copy_into(static_x, inp)
                graph.replay()
                return static_out

            check = self._check(replay, name)
            extra["loop"] = f"{self.copy_into_text}; graph.replay()"

            def run() -> Any:
                return replay(x)
        elif graphed_opts is not None:
            opts, shown = graphed_opts
            fn = cast(graphjit.GraphedFunction, graphjit.graphed(step, **opts))
            keep.append(fn)
            for _ in range(fn.graphjit_options.warmup):  # a key's first calls are its eager warmup calls,
                fn(x)  # so the check below sees the capturing call and a replay
            check = self._check(fn, name)
            extra = {"options": shown}  # the status is read after the timed calls

            def run() -> Any:
                return fn(x)
        else:
            check, run, extra = self.other_variant(name)
        self.sync()
        setup_s = time.perf_counter() - t0
        result = {"status": status, "setup_s": setup_s, **check, **self._time(run), **extra}
        if graphed_opts is not None:  # the timed calls must have replayed
            status, more = _graphed_status(keep[-1].stats(), self.on_gpu)
            result.update(more, status=status)
            guard = common.guard_cost(keep[-1])
            if guard is not None:
                result["guard"] = guard  # host cost of checking the Python values the graph froze, per replay
        self.release(keep)
        del keep
        self._free()
        return result

    def host_cost(self) -> dict[str, Any]:
        """Host microseconds per call of a 4-input function with tiny GPU work: eager, a raw replay,
        ``@graphed`` (and what the backend adds), each as :meth:`time_host` measures it."""
        args = self.args
        inputs = self.host_inputs()
        tiny, text = self.host_function()
        calls: dict[str, Callable[..., Any]] = {"eager": lambda: tiny(*inputs)}
        keep: list[Any] = []
        out: dict[str, Any] = {"shape": list(HOST_SHAPE), "n_inputs": 4, "function": text,
                               "iters": args.host_iters, "repeats": args.host_repeats, "us": {}, "errors": {}}
        out["lane"] = common.prepare_lane()
        if self.on_gpu:
            out["batch_copy"] = self.prepare_batch_copy(inputs)
            try:
                statics = [t.clone() for t in inputs]
                graph, _ = self._raw_capture(tiny, *statics)
                keep.append(graph)
                calls["raw_replay"] = graph.replay
            except Exception as exc:
                out["errors"]["raw_replay"] = common.error_text(exc)
        self.host_graphed_calls(tiny, inputs, calls, keep, out)
        self.time_host(calls, out)
        for obj in keep:
            if hasattr(obj, "graphjit_options"):
                status, details = _graphed_status(obj.stats(), self.on_gpu)
                stats = obj.stats()  # one entry per graphed function: its name and outputs mode
                label = f"{stats.get('function')} outputs={obj.graphjit_options.outputs}"
                out.setdefault("graphed_status", {})[label] = {
                    "status": status, "captured": details["captured"],
                    "fallback_reasons": details.get("fallback_reasons", []),
                    # which path its replays took: the graph's own copies (handoff.py) or the copies around it
                    "keys": [{k: key.get(k) for k in ("replays", "fed_replays", "feed")}
                             for key in stats.get("keys", [])]}
        self.release(keep)
        self._free()
        return out

    def host_function(self) -> tuple[Callable[..., Any], str]:
        """The function :meth:`host_cost` times (four tensors of ``HOST_SHAPE`` in, tiny GPU work) and its text."""

        def tiny(a: Any, b: Any, c: Any, d: Any) -> Any:
            return a + b + c + d

        return tiny, "a + b + c + d"

    # Subclasses implement these.
    copy_into_text = "static_x.copy_(x)"  # how raw_graph's loop refreshes its input, for the JSON

    def build(self, layers: int, hidden: int, batch: int) -> None: ...
    @abstractmethod
    def graphed_options(self, name: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """For a ``graphed*`` variant: the ``graphed()`` options and what the JSON shows of them."""
    @abstractmethod
    def copy_into(self, static: Any, inp: Any) -> None:
        """Copy ``inp`` into ``static`` (raw_graph's input refresh), as a user would write it."""
    def other_variant(self, name: str) -> tuple[dict[str, Any], Callable[[], Any], dict[str, Any]]:
        """A backend's own variant: (check entry, the timed call, extra JSON fields)."""
        raise ValueError(f"unknown {self.name} variant {name!r}")
    @abstractmethod
    def host_inputs(self) -> list[Any]:
        """Four tensors of ``HOST_SHAPE`` on the device."""
    def host_graphed_calls(self, tiny: Callable[..., Any], inputs: list[Any], calls: dict[str, Callable[..., Any]],
                           keep: list[Any], out: dict[str, Any]) -> None:
        """Add the graphed calls of :meth:`host_cost` (graphed functions go into ``keep``)."""

    def add_graphed_and_signing(self, tiny: Callable[..., Any], inputs: list[Any], calls: dict[str, Callable[..., Any]],
                                keep: list[Any], out: dict[str, Any], **options: Any) -> None:
        """The calls both frameworks time in :meth:`host_graphed_calls`: ``@graphed`` (``options`` added), with alias
        outputs, each also with its own static inputs (on a GPU: the zero-copy path), and signing the call alone
        (``part_sign``; ``part_sign_python``: by the Python comparison, without the lane's C check)."""
        import graphjit
        from graphjit.keys import Signer

        opts: Any  # a dict of graphed() options
        # each also by graphjit's Python path alone ("_python": the replay lane kept off for that function)
        for label, opts, lane in (("graphed", {}, True), ("graphed_alias", {"outputs": "alias"}, True),
                                  ("graphed_python", {}, False), ("graphed_alias_python", {"outputs": "alias"}, False)):
            fn = cast(graphjit.GraphedFunction, graphjit.graphed(tiny, **options, **opts))
            fn._self_state.lane_allowed = lane
            keep.append(fn)
            calls[label] = (lambda fn=fn: fn(*inputs))
            if self.on_gpu:  # the zero-copy path: the caller passes the graph's own input buffers
                try:
                    for _ in range(fn.graphjit_options.warmup + 1):  # the warmup calls, then the capture
                        fn(*inputs)
                    static_args, _ = fn.static_inputs(*inputs)
                    calls[label.replace("graphed", "graphed_static")] = (lambda fn=fn, a=static_args: fn(*a))
                except Exception as exc:
                    out["errors"][label.replace("graphed", "graphed_static")] = common.error_text(exc)
        signer = Signer(tiny, None, options.get("backend", "auto"), "tiny")  # by the lane's C check (loaded first)
        calls["part_sign"] = lambda: signer.sign(None, tuple(inputs), {})
        python_signer = Signer(tiny, None, options.get("backend", "auto"), "tiny")
        python_signer.layout_checks = False  # the Python comparison alone, for the record
        calls["part_sign_python"] = lambda: python_signer.sign(None, tuple(inputs), {})
        if self.on_gpu:  # the four input copies as one launch of graphjit's batch copy (graphed's default path)
            from graphjit.batch_copy import Batch

            ops = self.batch_operands(inputs)
            batch = Batch.plan(ops, [self.clone(t) for t in inputs])
            if batch is not None:
                keep.append(batch.fixed)
                calls["part_batch_copy_inputs"] = lambda: batch.into(range(4), inputs)
                # four outputs returned fresh: one clone each (the framework's way) or one batch copy out
                out4 = Batch.plan(ops, batch.fixed, every=True)
                if out4 is not None:
                    calls["part_clone_4_outputs"] = lambda: [self.clone(t) for t in batch.fixed]
                    calls["part_batch_copy_4_outputs"] = out4.out_of

    def prepare_batch_copy(self, inputs: list[Any]) -> dict[str, Any]:
        """graphjit's batch copy library built and loaded for the inputs' GPU before anything is timed (``auto``
        mode would build it in the background at the first capture), and what :mod:`graphjit.batch_copy` found."""
        from graphjit import batch_copy

        ops = self.batch_operands(inputs)
        where = ops.target(inputs[0]) if ops is not None else None
        if where is not None and not batch_copy.never(where[0]):
            try:
                from graphjit.collectives import csrc_build

                csrc_build.build(where[0])  # built here first (at once where it is cached), then loaded
            except Exception as exc:
                return {"error": common.error_text(exc), **batch_copy.status()}
            batch_copy.library(*where)
        return batch_copy.status()

    def batch_operands(self, inputs: list[Any]) -> Any:
        from graphjit import backends

        backend = backends.for_type(type(inputs[0]))
        return backend.batch_operands() if backend is not None else None

    def clone(self, t: Any) -> Any:
        from graphjit import backends

        backend = backends.for_type(type(t))
        assert backend is not None
        return backend.clone(t)

    @abstractmethod
    def release(self, keep: list[Any]) -> None:
        """Done with a variant's graphs and graphed functions."""
    @abstractmethod
    def _check(self, call: Callable[[Any], Any], name: str) -> dict[str, Any]:
        """Relative errors of ``call`` against eager on the two inputs (:func:`errors_entry`)."""
    def _time(self, call: Callable[[], Any]) -> dict[str, Any]:
        """Time ``call``: ``--warmup`` untimed calls, then ``--repeats`` measurements of ``--iters`` back-to-back
        calls (:meth:`_measure`), as :func:`timing_entry`."""
        args = self.args
        for _ in range(args.warmup):
            call()
        self.sync()
        samples, host = [], []
        for _ in range(args.repeats):
            step_us, host_us = self._measure(call, args.iters)
            samples.append(step_us)
            host.append(host_us)
        return timing_entry(samples, host, self.timer)

    def _measure(self, call: Callable[[], Any], iters: int) -> tuple[float, float]:
        """One measurement of ``iters`` calls: (microseconds per step by this runner's :attr:`timer`, host
        microseconds per call to issue them).  Here both are the host time (the CPU runs)."""
        t0 = time.perf_counter_ns()
        for _ in range(iters):
            call()
        us = (time.perf_counter_ns() - t0) / 1e3 / iters
        return us, us
    @abstractmethod
    def _raw_capture(self, fn: Callable[..., Any], *static: Any) -> tuple[Any, Any]:
        """A graph of ``fn(*static)`` captured by hand, and its output."""
    def _free(self) -> None: ...
    def teardown(self) -> None: ...
