"""WARMUP -> CAPTURE -> verify -> REPLAY for one key, and the fallback when any step fails.

:func:`build` runs on the first call of a key.  What it guarantees:

* The caller's tensors are never touched by warmup or capture: warmup runs on graphjit-owned
  working copies, restored before every run, so a function that mutates an input in place (a KV
  cache) does so exactly once per call, as eager would.
* One capture at a time per process (:data:`CAPTURE_LOCK`).  The capture is always ended, also when
  the function raises or synchronises (the backend guarantees it); the error names the cause.
* The last warmup runs under the backend's sync check, so ``.item()``/``.numpy()``-style syncs are
  reported before any capture begins.
* With ``verify``, the new graph is replayed once on the same inputs and its outputs (and mutated
  inputs) are compared with the last warmup's; a mismatch (a Python value the graph froze, an
  output the graph does not write) is a :class:`~graphjit.errors.VerifyError`, and the caller's
  tensors are restored before it is raised.
* On success the first call's result comes from that replay, and later calls use
  :meth:`KeyEntry.replay`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import scope
from .backends.base import CAPTURE_LOCK, Backend, GraphHandle
from .buffers import StaticInputs, StaticOutputs, collect_tensors, real_view
from .errors import CaptureError, VerifyError
from .keys import CallSignature, rebuild, rebuild_call
from .stats import KeyStats, State

log = logging.getLogger("graphjit")


def tolerance(t: Any) -> float:
    """Relative error (norm-wise) a replay may differ from eager by: kernels are the same, so this
    only absorbs a different cuBLAS algorithm choice, never a frozen or stale value."""
    name = str(getattr(t, "dtype", "")).lower()
    if "16" in name or "8" in name:
        return 2e-2
    return 1e-4


@dataclass
class BuildRequest:
    """Everything :func:`build` needs for one key."""

    fn_name: str
    backend: Backend
    device: str
    traced: Callable[..., Any]
    capture_fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    sig: CallSignature
    stats: KeyStats
    warmup: int = 2
    verify: bool = True
    copy_outputs: bool = True
    pool: Any = None
    dump_dir: Path | None = None
    debug: bool = False
    no_adopt: frozenset[int] = field(default_factory=frozenset)


class KeyEntry:
    """A captured graph of one key, with its static inputs and outputs."""

    __slots__ = ("graph", "inputs", "no_adopt", "outputs", "stats")

    def __init__(self, graph: GraphHandle, inputs: StaticInputs, outputs: StaticOutputs, stats: KeyStats,
                 no_adopt: frozenset[int]) -> None:
        self.graph = graph
        self.inputs = inputs
        self.outputs = outputs
        self.stats = stats
        self.no_adopt = no_adopt

    def replay(self, sig: CallSignature, copy: bool) -> Any:
        """Load inputs, replay, copy mutations back, return outputs.  Raises ``InputMoved``."""
        inputs = self.inputs
        before = inputs.copies
        inputs.load(sig.tensors)
        self.graph.replay()
        if inputs.mutated_idx:
            inputs.store_back(sig.tensors)
        st = self.stats
        st.replays += 1
        st.input_copies += inputs.copies - before
        st.copy_backs = inputs.copy_backs
        return self.outputs.result(sig.pads, copy)

    def release(self) -> None:
        with contextlib.suppress(Exception):
            self.graph.reset()


def _fingerprints(b: Backend, tensors: list[Any]) -> str:
    return ",".join(b.fingerprint(t) for t in tensors)


def build(req: BuildRequest) -> tuple[KeyEntry, Any]:
    """Warm up, capture, verify and replay the key of ``req.sig``; return the entry and the result.

    Raises :class:`CaptureError` (the caller's tensors untouched) when the key cannot be graphed.
    """
    b = req.backend
    sig = req.sig
    tensors = sig.tensors
    st = req.stats
    is_tensor = _is_tensor_of(b)
    t_start = time.perf_counter()
    with CAPTURE_LOCK, b.device_guard(req.device):
        st.state = State.WARMUP
        # Working copies, padded to the key's shapes, one per distinct input tensor.
        full_shapes: list[list[int]] = [list(b.shape(t)) for t in tensors]
        padded_leaves = set()
        for p in sig.pads:
            full_shapes[p.leaf][p.dim] = p.padded
            padded_leaves.add(p.leaf)
        work: list[Any] = []
        first_of: dict[tuple[int, tuple[int, ...]], int] = {}
        owner: list[int] = []
        for i, t in enumerate(tensors):
            ptr_shape = (b.data_ptr(t), tuple(full_shapes[i]))
            if ptr_shape in first_of:
                work.append(work[first_of[ptr_shape]])
                owner.append(first_of[ptr_shape])
                continue
            first_of[ptr_shape] = i
            owner.append(i)
            work.append(b.empty(full_shapes[i], t))
        shared = {i for i in range(len(tensors)) if owner.count(owner[i]) > 1}

        def restore(indices: list[int]) -> None:
            for i in indices:
                if owner[i] != i:
                    continue
                if i in padded_leaves:
                    b.zero_(work[i])
                b.copy_(real_view(b, work[i], b.shape(tensors[i]), full_shapes[i]), tensors[i])

        every = list(range(len(tensors)))
        restore(every)
        wargs, wkwargs = rebuild_call(req.args, req.kwargs, work, is_tensor)
        mutated = [False] * len(tensors)
        out: Any = None
        with scope.graphed_call("warmup"), b.warmup_guard(req.device):
            for k in range(req.warmup):
                if k:
                    restore([i for i in every if mutated[i]])
                check = b.sync_check() if k == req.warmup - 1 else contextlib.nullcontext()
                with check, b.traced_call_guard():
                    out = req.traced(*wargs, **wkwargs)
                st.warmups += 1
                if k == 0:
                    mutated = [not b.equal(real_view(b, work[i], b.shape(t), full_shapes[i]), t)
                               for i, t in enumerate(tensors)]
                if req.debug:
                    log.debug("graphjit %s %s: warmup %d/%d outputs=%s mutated=%s", req.fn_name, st.label, k + 1,
                              req.warmup, _fingerprints(b, collect_tensors(out, is_tensor)),
                              [sig.paths[i] for i, m in enumerate(mutated) if m])
        b.synchronize(req.device)
        out_tensors = collect_tensors(out, is_tensor)
        if b.grad_enabled() and any(b.requires_grad(o) for o in out_tensors):
            raise CaptureError(
                f"{req.fn_name}: outputs require grad (autograd is recording through parameters or inputs that "
                "require grad). @graphed captures inference; call it under torch.no_grad()/paddle.no_grad() "
                "(or freeze the parameters), or use graphjit.graphed_layer for training.",
                reason="outputs require grad")
        expected = [b.clone(o) for o in out_tensors]
        expected_shape = rebuild(out, [None] * len(out_tensors), is_tensor)
        expected_mut = {i: b.clone(real_view(b, work[i], b.shape(tensors[i]), full_shapes[i]))
                        for i in every if mutated[i]}

        # Static buffers: adopt in-place mutated inputs (the caller's tensor is the buffer).
        # Bucketed inputs are never adopted: a later call of the same key may be padded, and padding
        # writes the whole static buffer.
        bucketed_leaves = {leaf for (leaf, _dim, _size) in sig.bucketed}
        statics: list[Any] = []
        adopted: list[bool] = []
        for i, t in enumerate(tensors):
            adopt = (mutated[i] and i not in req.no_adopt and i not in bucketed_leaves and i not in shared)
            statics.append(t if adopt else work[i])
            adopted.append(adopt)
        restore([i for i in every if mutated[i]])  # pristine again; for adopted inputs a snapshot

        st.state = State.CAPTURE
        sargs, skwargs = rebuild_call(req.args, req.kwargs, statics, is_tensor)
        t_cap = time.perf_counter()
        with scope.graphed_call("capture"), b.traced_call_guard():
            graph, static_out = b.capture(lambda: req.capture_fn(*sargs, **skwargs), req.device, req.pool,
                                          debug=req.dump_dir is not None)
        capture_ms = (time.perf_counter() - t_cap) * 1e3
        try:
            for hook in scope.AFTER_CAPTURE:  # e.g. register captured all-reduce buffers on every rank
                try:
                    hook()
                except CaptureError:
                    raise
                except Exception as exc:  # a failed hook fails this capture, never the process
                    raise CaptureError(f"{req.fn_name} {st.label}: after the capture, {hook!r} failed: {exc}",
                                       reason="after-capture hook failed") from exc
            bucket_dims = {(dim, size) for (_leaf, dim, size) in sig.bucketed}
            inputs = StaticInputs(b, statics, adopted, mutated, {leaf for (leaf, _d, _s) in sig.bucketed},
                                  grad_free=not any(b.requires_grad(t) for t in tensors))
            outputs = StaticOutputs(b, static_out, is_tensor, bucket_dims)
            graph.replay()
            if req.verify:
                problem = _verify(b, outputs, expected, expected_shape, static_out, inputs, expected_mut,
                                  full_shapes, tensors, sig, is_tensor)
                if problem:
                    for i in every:  # undo what the replay wrote into adopted caller tensors
                        if adopted[i]:
                            b.copy_(tensors[i], work[i])
                    b.synchronize(req.device)
                    raise VerifyError(f"{req.fn_name} {st.label}: verify failed: {problem}. The function depends "
                                      "on something a CUDA graph freezes (a Python value, the host clock or RNG, "
                                      "an output not computed on the GPU), so replays would return stale results.")
            inputs.store_back(tensors)
            result = outputs.result(sig.pads, req.copy_outputs)
        except BaseException:
            graph.reset()
            raise
        if req.dump_dir is not None:
            req.dump_dir.mkdir(parents=True, exist_ok=True)
            path = req.dump_dir / f"{_safe(req.fn_name)}-{abs(hash(sig.key)) % 10**8:08d}.dot"
            try:
                graph.dump(path)
                if not path.exists() and not path.with_suffix("").is_dir():
                    raise RuntimeError("the framework wrote nothing")
                log.info("graphjit %s: wrote %s", req.fn_name, path)
            except Exception as exc:  # a dump is a debugging aid; never fail the call for it
                log.warning("graphjit %s: could not write the graph dump %s: %s", req.fn_name, path, exc)
        st.captures += 1
        st.replays += 1
        st.capture_ms += capture_ms
        st.pool_bytes = graph.pool_bytes
        st.copy_backs = inputs.copy_backs
        st.state = State.REPLAY
        if req.debug:
            log.debug("graphjit %s %s: captured in %.1f ms (build %.1f ms), adopted=%s outputs=%s", req.fn_name,
                      st.label, capture_ms, (time.perf_counter() - t_start) * 1e3,
                      [sig.paths[i] for i, a in enumerate(adopted) if a], _fingerprints(b, outputs.tensors))
        return KeyEntry(graph, inputs, outputs, st, req.no_adopt), result


def _verify(b: Backend, outputs: StaticOutputs, expected: list[Any], expected_shape: Any, static_out: Any,
            inputs: StaticInputs, expected_mut: dict[int, Any], full_shapes: list[list[int]],
            tensors: list[Any], sig: CallSignature, is_tensor: Callable[[Any], bool]) -> str | None:
    got_shape = rebuild(static_out, [None] * len(outputs.tensors), is_tensor)
    if got_shape != expected_shape or len(outputs.tensors) != len(expected):
        return "the non-tensor part of the output differs between warmup and capture"
    for j, (got, want) in enumerate(zip(outputs.tensors, expected)):
        err = b.rel_error(got, want)
        if not err <= tolerance(want):
            return f"output {j} differs from eager by {err:.3g} (relative)"
    for i, want in expected_mut.items():
        got = real_view(b, inputs.statics[i], b.shape(tensors[i]), full_shapes[i])
        err = b.rel_error(got, want)
        if not err <= tolerance(want):
            return f"in-place update of {sig.paths[i]} differs from eager by {err:.3g} (relative)"
    return None


def _is_tensor_of(b: Backend) -> Callable[[Any], bool]:
    types = b.tensor_types()
    return lambda x: isinstance(x, types)


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
