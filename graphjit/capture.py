"""The call that captures a key: static buffers, capture, verify, first replay, and the entry that
later calls replay.

:func:`build` runs on the call after a key's warmup calls (:mod:`graphjit.warmup`), or on the first
call of a key inside ``capture_scope()``.  Its phases, each a function below:

1. :func:`static_buffers`: one static buffer per tensor input; an input that the warmup calls wrote
   in place (a KV cache) is *adopted* (the caller's tensor is the buffer), the others are copied
   into graphjit-owned buffers.
2. :func:`capture_graph`: the capture itself, on the backend's capture stream, into the key's pool,
   one capture at a time per process (:data:`CAPTURE_LOCK`).  A CUDA capture records kernels without
   running them, so it changes no tensor; the capture is ended on every path.
3. :func:`after_capture`: the hooks of :data:`graphjit.scope.AFTER_CAPTURE` (the all-reduce
   registration) and a check that the capture's Python code rebound no tensor.
4. :func:`verify_and_replay`: with ``verify``, the state the function writes (found during warmup)
   and the random generator are copied, the eager reference runs, the state and the generator are
   put back, the graph replays, and outputs, written state and generator position are compared with
   the reference.  A mismatch restores what the eager reference left and raises
   :class:`~graphjit.errors.VerifyError` carrying the reference's result: the call has then run the
   function exactly once.  Without verify (or past ``GRAPHJIT_VERIFY_MAX_BYTES``) the graph replays
   once, and that replay is the call's execution.
5. :class:`~graphjit.buffers.KeyEntry`: what later calls replay (:meth:`KeyEntry.replay`).

Inside a capture scope the call has already run the function once, eagerly (its result and its
effects are the call's); the build then leaves the state as that run left it: verify's replay is
undone, and nothing replays for the result.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import guards, host_random, module_hooks, py_writes, scope
from .backends.base import CAPTURE_LOCK, Backend, GraphHandle
from .buffers import (
    OVERLAP,
    OVERLAP_WHY,
    InputsOverlap,
    KeyEntry,
    StaticInputs,
    StaticOutputs,
    collect_tensors,
    real_view,
)
from .dynamic import DynamicArgs, Index
from .errors import CaptureError, IslandError, SignatureError, UnrecoverableCaptureError, VerifyError
from .guard_set import GuardSet
from .islands import recording
from .keys import CallSignature, rebuild_call
from .pieces import PiecewiseGraph
from .pystate import PyState, copy_or_none, dynamic_roots, second_run
from .reach import Reach, addresses, describe, moved, rebinds, walk
from .renewals import WRITTEN, Fed
from .sites import in_traceback
from .stats import KeyStats, State
from .tree import structure
from .warmup import ELSEWHERE, Warmup, elsewhere
from .writes import Snapshot, compare_outputs, tolerance

__all__ = ["BuildRequest", "KeyEntry", "Reference", "build", "record_reference", "tolerance", "verify_fits"]

log = logging.getLogger("graphjit")


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
    warm: Warmup
    roots: Callable[[], list[tuple[str, Any]]]
    verify: bool = True
    verify_budget: int = 1 << 30
    replay_result: bool = True  # False inside a capture scope: the call's own eager run is its result
    copy_outputs: bool = True
    pool: Any = None
    dump_dir: Path | None = None
    debug: bool = False
    no_adopt: frozenset[int] = field(default_factory=frozenset)
    dynamic: DynamicArgs | None = None  # the function's dynamic parameters (their values: sig.dynamic)
    method: bool = False  # a method call (args without self): where the dynamic parameters sit
    hooks_outside: bool = False  # a graphed forward: Module.__call__ runs self's hooks around it (module_hooks)
    guard_sources: Callable[[], guards.Sources] | None = None  # where the values the function reads live
    tracer_guard: Callable[[tuple[Any, ...], dict[str, Any]], Any] = lambda _a, _k: None
    """Given the captured call's (static) arguments: the tracer's own guard check (``Backend.tracer_guard``)."""
    fed: Fed | None = None
    """The places of tensors graphjit feeds the key (:mod:`graphjit.renewals`): bound to its tensors while it builds."""
    walked: Reach | None = None
    """The walk of ``roots()`` as they are now, where the call's last warmup run made it and nothing ran since (a
    capture scope's call): the capture starts from it instead of walking them again (not where ``fed``)."""
    pystate: PyState | None = None
    """Likewise their Python state (:class:`~graphjit.pystate.PyState`), taken where it was as it is now."""
    also_written: list[tuple[Any, str]] = field(default_factory=list)
    """Tensors the capture's run wrote in place (their version counters moved) that no warmup found written: state
    reached only through a global of the user's that code the function calls reads (verify copies them too)."""


@dataclass
class Statics:
    """The static input buffers of a key being built (:func:`static_buffers`)."""

    inputs: StaticInputs
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    full_shapes: list[list[int]]
    layout: tuple[tuple[Any, ...], dict[str, Any]]  # args and kwargs holding the buffers, dynamic= ones left out


def build(req: BuildRequest) -> tuple[KeyEntry, Any]:
    """Capture the key of ``req.sig`` and verify it; return the entry and the call's result (``None``
    when ``req.replay_result`` is False).  Where ``req.fed``, its places hold graphjit's tensors throughout.

    Raises :class:`CaptureError` when the key cannot be graphed: with ``executed`` False the call has
    not run the function (its state is untouched; the caller runs it eagerly), with ``executed`` True
    (a failed verify) it has run exactly once and ``result`` is its result.
    """
    if req.fed is None:
        return _build(req)
    with req.fed.bound(req.warm, verify_plan(req) is None, list(req.sig.tensors)):
        entry, result = _build(req)
        written = req.fed.counted()
        if written is not None:  # (verify's eager reference wrote the caller's tensor: the call's own run)
            entry.release()
            raise VerifyError(f"{req.fn_name} {req.stats.label}: {written}", reason=WRITTEN).after_run(result)
        return entry, result


def _build(req: BuildRequest) -> tuple[KeyEntry, Any]:
    b, st = req.backend, req.stats
    if req.warm.elsewhere_first:  # the only watched call wrote off-device tensors (warmup=1): as on every call
        raise CaptureError(f"{req.fn_name} {st.label}: {elsewhere(req.warm.elsewhere_first).message}",
                           reason=ELSEWHERE)
    t_start = time.perf_counter()
    with _taken(CAPTURE_LOCK) as waited, b.device_guard(req.device):
        try:
            statics = static_buffers(req)
        except CaptureError:  # its own reason (an argument that cannot be rebuilt)
            raise
        except Exception as exc:  # out of memory for a bucket's padded buffers: the key runs uncaptured, said so
            raise CaptureError(f"{req.fn_name} {st.label}: allocating the graph's static input buffers failed "
                               f"({type(exc).__name__}: {exc})", reason="static buffers failed") from exc
        roots = req.roots()
        # the last warmup run's walk and Python state, unless taking the lock waited for another thread's capture (its
        # Python code may rebind state this function reads; other threads' eager code races with any walk) or a fed
        # tensor is bound
        settled = not waited and req.fed is None
        before = req.walked if settled and req.walked is not None else walk(roots, _is_tensor_of(b), b.tensor_state)
        where = addresses(before, b.data_ptr)
        rescan = _guard_scan(req)  # the values the capture reads, found the same way before and after it
        values = rescan() if rescan is not None else None
        # the capture's Python effects are undone where they are not the call's
        py = req.pystate if settled and req.pystate is not None else PyState(b, roots, req.device)
        st.state = State.CAPTURE
        # version counters before the capture (not where fed: a fed tensor's writes are renewals.py's, its own reason)
        versions = {i: b.version(t) for i, (t, _p) in before.tensors.items()} if req.fed is None else {}
        host = host_random.Saved(b.host_generators(req.device))  # a capture runs no island: its draws are the segments'
        try:
            graph, static_out, capture_ms = capture_graph(req, statics, before)
        except BaseException:
            py.restore()
            raise
        drew = host.moved()
        if drew is not None:
            graph.reset()
            py.restore()  # (the generators too: the call's eager run draws what it would have)
            raise CaptureError(f"{req.fn_name} {st.label}: the function draws numbers from {drew} on the CPU outside "
                               f"its @graphjit.eager functions (its capture did); {host_random.HINT}",
                               reason=host_random.REASON)
        if versions:
            known = {id(t) for t in req.warm.state(req.sig, b)[0]}
            req.also_written = [(t, describe(p)) for i, (t, p) in before.tensors.items() if i not in known and
                                versions[i] is not None and b.version(t) != versions[i]]
        if isinstance(graph, PiecewiseGraph):
            graph.dynamic = req.sig.dynamic
            st.segments, st.islands = len(graph.segments), len(graph.islands)
        else:
            st.segments, st.islands = 1, 0
        executed = False
        try:
            after_capture(req, before, where, values, rescan)
            guard = None if values is None else GuardSet(
                values, req.tracer_guard(statics.args, statics.kwargs), gated=b.counts_rebinds,
                hooks=module_hooks.watch(values.hooks, b, req.hooks_outside), fed=req.fed, written=req.warm.written,
                grad_flag=(b.grad_flag, b.requires_grad) if b.grad_enabled() else None)
            if guard is not None:
                st.guards = guard.size
            outputs = StaticOutputs(b, static_out, _is_tensor_of(b), {(d, s) for (_l, d, s) in req.sig.bucketed},
                                    statics.inputs, statics.layout, before.tensors if req.fed is None else ())
            executed = True  # from here on the Python state is what verify's eager reference leaves
            result = verify_and_replay(req, statics, graph, outputs, static_out, py)
        except BaseException:
            graph.reset()
            if not executed:
                py.restore()
            raise
        if req.dump_dir is not None:
            _dump(req, graph)
        st.captures += 1
        st.capture_ms += capture_ms
        st.pool_bytes = graph.pool_bytes
        st.copy_backs = statics.inputs.copy_backs
        st.state = State.REPLAY
        if req.debug:
            log.debug("graphjit %s [%s]: captured in %.1f ms (build %.1f ms), verify %s, adopted=%s", req.fn_name,
                      st.label, capture_ms, (time.perf_counter() - t_start) * 1e3, st.verify,
                      [req.sig.paths[i] for i in statics.inputs.adopted_idx])
        return KeyEntry(graph, statics.inputs, outputs, st, req.no_adopt, req.warm, req.device, guard,
                        piecewise=isinstance(graph, PiecewiseGraph)), result


@contextlib.contextmanager
def _taken(lock: Any) -> Iterator[bool]:
    """``lock`` held for the block; yields whether taking it had to wait for another thread."""
    waited = not lock.acquire(blocking=False)
    if waited:
        lock.acquire()
    try:
        yield waited
    finally:
        lock.release()


# -- phase 1 ---------------------------------------------------------------------------------------
def static_buffers(req: BuildRequest) -> Statics:
    """One static buffer per distinct tensor input, loaded with the caller's values.

    Adopted (the caller's tensor is the buffer): inputs the warmup calls wrote in place, unless
    bucketed (a later call of the key may be padded, and padding writes the whole buffer), passed
    twice in one call, or moved before (``no_adopt``).  Owned buffers get the key's padded shape.
    """
    b, sig = req.backend, req.sig
    tensors = sig.tensors
    full_shapes: list[list[int]] = [list(b.shape(t)) for t in tensors]
    for p in sig.pads:
        full_shapes[p.leaf][p.dim] = p.padded
    first_of: dict[tuple[int, tuple[int, ...], tuple[int, ...]], int] = {}
    owner: list[int] = []
    for i, t in enumerate(tensors):  # one tensor passed twice (same memory, shape and strides): one buffer
        owner.append(first_of.setdefault((b.data_ptr(t), tuple(full_shapes[i]), tuple(b.strides(t))), i))
    shared = {i for i in range(len(tensors)) if owner.count(owner[i]) > 1}
    bucketed = {leaf for (leaf, _dim, _size) in sig.bucketed}
    mutated = [i in req.warm.mutated_leaves for i in range(len(tensors))]
    statics: list[Any] = []
    adopted: list[bool] = []
    for i, t in enumerate(tensors):
        adopt = mutated[i] and i not in req.no_adopt and i not in bucketed and i not in shared
        if adopt:
            statics.append(t)
        elif owner[i] != i:
            statics.append(statics[owner[i]])
        else:
            statics.append(b.empty_as(full_shapes[i], t))
        adopted.append(adopt)
    inputs = StaticInputs(b, statics, adopted, mutated, bucketed,
                          grad_free=not any(b.requires_grad(t) for t in tensors))
    try:
        inputs.load(tensors)
    except InputsOverlap as moved:  # views overlapping in part, one of them written (one tensor twice shares a buffer)
        raise CaptureError(f"{req.fn_name} {req.stats.label}: {OVERLAP_WHY % sig.paths[moved.leaf]}",
                           reason=OVERLAP) from None
    is_tensor = _is_tensor_of(b)
    try:
        if req.dynamic is not None and sig.dynamic:
            plain_args, plain_kwargs, values = req.dynamic.split(req.method, req.args, req.kwargs)
            pargs, pkwargs = rebuild_call(plain_args, plain_kwargs, statics, is_tensor)
            sargs, skwargs = req.dynamic.merge(req.method, pargs, pkwargs, values)
        else:
            sargs, skwargs = pargs, pkwargs = rebuild_call(req.args, req.kwargs, statics, is_tensor)
    except SignatureError as exc:  # a container that cannot hold the static buffers: this key runs uncaptured
        raise CaptureError(f"{req.fn_name} {req.stats.label}: {exc}", reason="an argument cannot be rebuilt") from exc
    return Statics(inputs, sargs, skwargs, full_shapes, (pargs, pkwargs))


# -- phase 2 ---------------------------------------------------------------------------------------
def capture_graph(req: BuildRequest, statics: Statics, reach: Reach) -> tuple[GraphHandle, Any, float]:
    """Capture ``req.capture_fn`` on the static inputs; returns the graph, its outputs and the ms it took.
    ``reach``: what the function reaches, with the static inputs the tensors it computes with (the backend may ask
    for them before it captures: :meth:`~graphjit.backends.base.Backend.capture`).

    Where the function calls islands (the warmup saw them), the capture is cut at each: the graph is then a
    :class:`~graphjit.pieces.PiecewiseGraph`.  A failure names the line of the user's code it happened at."""
    b, warm = req.backend, req.warm
    t0 = time.perf_counter()
    index = Index(req.sig.dynamic) if req.sig.dynamic else None
    try:
        with scope.graphed_call("capture"), b.traced_call_guard(), recording(b, warm.islands or [], index) as rec:
            graph, static_out = b.capture(lambda: req.capture_fn(*statics.args, **statics.kwargs), req.device,
                                          req.pool, debug=req.dump_dir is not None, feed=not warm.islands,
                                          operands=lambda: [*statics.inputs.statics, *(t for t, _p in
                                                                                      reach.tensors.values())])
    except CaptureError as exc:
        raise _with_site(exc) from exc.__cause__
    except Exception as exc:  # the function raised only while captured: its eager call runs instead
        first = str(exc).splitlines()[0] if str(exc) else ""
        err = CaptureError(f"{req.fn_name} {req.stats.label}: the function raised {type(exc).__name__}({first!r}) "
                           "while it was captured (its warmup calls did not): it behaves differently under capture",
                           reason=f"the function raised {type(exc).__name__} during capture")
        err.__cause__ = exc
        raise _with_site(err) from exc
    seen = len(warm.islands or [])
    if rec.islands != seen:
        graph.reset()
        rec.release()
        raise CaptureError(f"{req.fn_name} {req.stats.label}: the capture called {rec.islands} island(s) where the "
                           f"warmup called {seen}; a key's calls must run the same islands in the same order",
                           reason="islands differ between calls")
    if rec.steps:
        graph = PiecewiseGraph([*rec.steps, graph], req.stats)
    return graph, static_out, (time.perf_counter() - t0) * 1e3


def _with_site(exc: CaptureError) -> CaptureError:
    """``exc`` with the user's line it happened at (from its cause's traceback) and what to mark as an island."""
    if isinstance(exc, UnrecoverableCaptureError) or exc.__cause__ is None:
        return exc
    where = in_traceback(exc.__cause__)
    if where is None:
        return exc
    new = CaptureError(f"{exc} It happened at {where}: mark that function (or the one around the line) "
                       "@graphjit.eager to run it as an island, eagerly on every call, and graph the rest",
                       reason=exc.reason)
    return new


# -- phase 3 ---------------------------------------------------------------------------------------
def _guard_scan(req: BuildRequest) -> Callable[[], guards.Scan] | None:
    """The scan of the values the function reads (:func:`graphjit.guards.scan`, with what its warmup recorded)."""
    if req.guard_sources is None:
        return None
    b, src, warm = req.backend, req.guard_sources(), req.warm
    is_tensor = _is_tensor_of(b)
    return lambda: guards.scan(src, is_tensor, warm.names, b.tensor_holders, warm.by_object, b.module_holders,
                               b.renewed_attributes, b.hook_holders, b.watch_loads, warm.probes,
                               warm.probed_by_object, list((warm.read_globals or {}).values()), req.hooks_outside,
                               b.global_hooks())


def after_capture(req: BuildRequest, before: Any, where: dict[int, int], values: guards.Scan | None = None,
                  rescan: Callable[[], guards.Scan] | None = None) -> None:
    """Run the after-capture hooks, and refuse a capture whose Python code rebound or added tensors or moved
    their memory (``where``: their addresses before the capture), or changed a Python value the function reads
    (``values``: those values before the capture, ``rescan`` finds them again)."""
    for hook in scope.AFTER_CAPTURE:  # e.g. register captured all-reduce buffers on every rank
        try:
            hook()
        except CaptureError:
            raise
        except Exception as exc:  # a failed hook fails this capture, never the process
            raise CaptureError(f"{req.fn_name} {req.stats.label}: after the capture, {hook!r} failed: {exc}",
                               reason="after-capture hook failed") from exc
    shifted = moved(before, where, req.backend.data_ptr)
    if shifted:
        raise CaptureError(f"{req.fn_name} {req.stats.label}: the capture left tensors over other memory than before "
                           f"({', '.join(describe(p) for p in shifted[:3])}); a replay would use the old memory",
                           reason="moves the memory of a tensor")
    rebound, added = rebinds(before, walk(req.roots(), _is_tensor_of(req.backend), req.backend.tensor_state))
    if rebound or added:
        paths = ", ".join(describe(p) for p in (rebound + added)[:3])
        raise CaptureError(f"{req.fn_name} {req.stats.label}: the capture's Python code replaced or added tensors "
                           f"held by objects ({paths}); a replay would not do that again",
                           reason="rebinds a tensor held by an object")
    if values is not None and rescan is not None:
        changed = py_writes.writes(values, rescan)
        if changed:
            path, old, new = changed[0]
            raise CaptureError(f"{req.fn_name} {req.stats.label}: the function changes {path} ({old} -> {new}) when "
                               "it runs; a replay runs its kernels, not its Python code, and would leave it as it is: "
                               "keep that state in a tensor updated in place, or move the update out of the graphed "
                               "function", reason=guards.WRITES)


# -- phase 4 ---------------------------------------------------------------------------------------
def _compare(b: Backend, got: Any, expected: list[Any], expected_shape: Any, is_tensor: Callable[[Any], bool]
             ) -> str | None:
    """:func:`~graphjit.writes.compare_outputs`, where outputs that cannot be compared (tensors on the meta device,
    a type without arithmetic) are a verify failure: the key runs uncaptured, the call's result the eager one.  Raises
    where the backend is poisoned (the device itself failed)."""
    try:
        return compare_outputs(b, got, expected, expected_shape, is_tensor)
    except Exception as exc:
        if b.poisoned is not None:  # the device failed (a CUDA error): not a verdict on the graph
            raise
        first = str(exc).splitlines()[0] if str(exc) else ""
        return f"its outputs cannot be compared with eager's ({type(exc).__name__}: {first[:120]})"


def verify_plan(req: BuildRequest) -> str | None:
    """None if verify runs; else the key's verify status ("off" or "skipped: why")."""
    if not req.verify:
        return "off"
    if req.warm.untracked is not None:
        return f"skipped: the state the function writes is not fully known ({req.warm.untracked})"
    if not verify_fits(req.stats.state_bytes, req.verify_budget):
        need = 2 * req.stats.state_bytes
        return (f"skipped: its copies of the written state need {need / 2**20:.1f} MiB, more than "
                f"GRAPHJIT_VERIFY_MAX_BYTES={req.verify_budget}")
    return None


def verify_fits(state_bytes: int, budget: int) -> bool:
    """Verify's two copies of the written state (before and after its eager reference) fit ``budget`` bytes."""
    return 2 * state_bytes <= budget


def verify_and_replay(req: BuildRequest, statics: Statics, graph: GraphHandle, outputs: StaticOutputs,
                      static_out: Any, py: PyState | None = None) -> Any:
    """Phase 4 (see the module docstring); returns the call's result (None inside a scope).

    ``py``: the Python state before the capture.  Put back before verify's eager reference (whose Python
    effects are then the call's), and at the end inside a scope (the call's own eager run was its execution);
    without verify, the capture's Python effects are the call's."""
    b, st, sig = req.backend, req.stats, req.sig
    inputs = statics.inputs
    recorded: Reference | None = req.warm.reference if not req.replay_result else None
    req.warm.reference = None
    skip = verify_plan(req)
    if skip is not None:
        st.verify = skip
        if not req.replay_result:
            if py is not None:
                py.restore()
            return None
        graph.replay()
        st.replays += 1
        inputs.store_back(sig.tensors)
        return outputs.result(sig.pads, req.copy_outputs, sig.tensors, (req.args, req.kwargs))
    written, paths, current = _written_state(req, statics)
    is_tensor = _is_tensor_of(b)
    pre = Snapshot(b, written, req.device)
    if py is not None:
        py.restore()
    ref: Any = None
    ref_ran = False  # the eager reference ran here (else a scope's recorded run stands for it)
    if recorded is not None and recorded.written_ids == [id(t) for t in written]:
        # a scope's last undone warmup ran from this very state (the capture ran nothing): it is the reference
        expected, expected_shape, post = recorded.expected, recorded.shape, recorded.post
    else:
        ref_ran = True
        with scope.graphed_call("warmup"), b.traced_call_guard(), \
                req.fed.callers() if req.fed is not None else contextlib.nullcontext():
            ref = req.traced(*req.args, **req.kwargs)
        b.synchronize(req.device)
        ref_tensors = collect_tensors(ref, is_tensor)
        expected = [b.clone(o) for o in ref_tensors]
        expected_shape = structure(ref, is_tensor)
        post = Snapshot(b, written, req.device)
        pre.restore()
    # the reference ran the islands, the call's once; the replay runs them again (py: the state the reference began in)
    islands = ref_ran and isinstance(graph, PiecewiseGraph) and bool(graph.islands)
    try:
        with second_run(py if islands else None, lambda: copy_or_none(
                b, lambda: [*req.roots(), *dynamic_roots(sig.dynamic)], req.device)):
            graph.replay()
            b.synchronize(req.device)
        problem = _compare(b, outputs.result(sig.pads, False, None, None), expected, expected_shape, is_tensor)
    except IslandError as exc:  # an island broke its contract in verify's replay: restored below like a mismatch
        problem = f"the replay failed: {exc}"
    problem = problem or post.differs(current, paths)
    if problem is None and post.rng is not None and post.rng_differs():
        problem = "the random generator is not where the eager call left it (a generator the graph does not replay)"
    if problem is not None:
        st.verify = "failed"
        msg = (f"{req.fn_name} {st.label}: verify failed: {problem}. The function depends on something a CUDA graph "
               "freezes (a Python value, the host clock or RNG, an output not computed on the GPU), so replays would "
               "return stale results")
        if req.replay_result:
            post.restore()  # the state the eager reference left: the call ran exactly once
            b.synchronize(req.device)
            raise VerifyError(msg).after_run(ref)
        pre.restore()
        if py is not None:
            py.restore()
        raise VerifyError(msg)
    st.verify = "passed"
    if not req.replay_result:
        pre.restore()  # undo verify's replay: the call's own eager run stays its execution
        if py is not None:
            py.restore()
        return None
    st.replays += 1
    inputs.store_back(sig.tensors)
    return outputs.result(sig.pads, req.copy_outputs, sig.tensors, (req.args, req.kwargs))


@dataclass
class Reference:
    """An eager run of a key's call from the state verify starts from, recorded as verify's reference: inside a
    capture scope the last extra warmup run (undone right after) is that run, so verify does not run the function
    again (a scope's call then runs it as often as a capture by hand does, plus the replay that verify compares).

    ``written_ids``: ``id`` of each tensor of ``post``, in order; verify uses the record only if its own list of
    written tensors is the same."""

    written_ids: list[int]
    expected: list[Any]
    shape: Any
    post: Snapshot


def record_reference(b: Backend, out: Any, written: list[Any], device: str) -> Reference:
    """:class:`Reference` of a run that returned ``out`` and wrote ``written`` (call it right after the run)."""
    is_tensor = _is_tensor_of(b)
    return Reference([id(t) for t in written], [b.clone(o) for o in collect_tensors(out, is_tensor)],
                     structure(out, is_tensor), Snapshot(b, written, device))


def _written_state(req: BuildRequest, statics: Statics) -> tuple[list[Any], list[str], list[Any]]:
    """The tensors this call's execution writes (:meth:`Warmup.state`), their names, and where the graph's replay
    leaves each one's new value (an owned static buffer for an input that is not adopted)."""
    b, sig = req.backend, req.sig
    written, paths = req.warm.state(sig, b)
    written, paths = written + [t for t, _p in req.also_written], paths + [p for _t, p in req.also_written]
    current = list(written)
    inputs = statics.inputs
    for k, i in enumerate(sorted(req.warm.mutated_leaves), start=len(req.warm.written)):
        if not inputs.adopted[i]:
            current[k] = real_view(b, inputs.statics[i], b.shape(sig.tensors[i]), statics.full_shapes[i])
    return written, paths, current


def _dump(req: BuildRequest, graph: GraphHandle) -> None:
    assert req.dump_dir is not None
    path = req.dump_dir / f"{_safe(req.fn_name)}-{abs(hash(req.sig.key)) % 10**8:08d}.dot"
    try:
        req.dump_dir.mkdir(parents=True, exist_ok=True)
        graph.dump(path)
        if not path.exists() and not path.with_suffix("").is_dir():
            raise RuntimeError("the framework wrote nothing")
        log.info("graphjit %s: wrote %s", req.fn_name, path)
    except Exception as exc:  # a dump is a debugging aid; never fail the call for it
        log.warning("graphjit %s: could not write the graph dump %s: %s", req.fn_name, path, exc)


def _is_tensor_of(b: Backend) -> Callable[[Any], bool]:
    types = b.tensor_types()
    return lambda x: isinstance(x, types)


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
