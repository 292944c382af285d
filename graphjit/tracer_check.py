"""Checking a translating tracer against the Python function, on the first call of each key.

A tracer that translates the function (Paddle's ``sot`` and ``ast``) runs a program of its own making, and
that program can be wrong where the Python function is right: paddlepaddle 2.6's SOT, for one, drops the
in-place ``paddle.assign(value, state)`` into a tensor the function reaches through a global, so from the
second call on the state and the outputs are not eager's (silently, and with or without graphjit).  A CUDA
graph captured from such a program replays the wrong results faithfully, and verify, which compares the
replay with the traced function, cannot see it.

So the first call of a key, when the backend asks for it (:attr:`Backend.checked_tracers`), runs the traced
function once on a copy of the state it can reach, puts that state back, and then runs the Python function
itself as the call (:func:`traced_run`, then :meth:`TracedRun.differs` on the call's result).  Where they
differ, the function is traced with ``eager`` from then on (still captured), and the reason is logged and
shown by ``report()``.  The call's result and effects are the Python function's: one eager call (but see the
limits on large models' parameters).

Limits: the traced run's Python side effects are put back where :class:`~graphjit.pystate.PyState` reaches them
(containers and attributes reachable from the call, not globals or C state).  Every tensor it can reach is put back,
parameters included where all of it fits in half of ``GRAPHJIT_VERIFY_MAX_BYTES`` (then each is copied twice and
compared, on the host for Paddle: up to that half of the budget, once per key).  Where the parameters do not fit (a
large model's), they are not put back: a parameter the traced program wrote is written again by the call's own run.
Where that run writes a parameter (its version counter moves; Paddle's ``set_value`` and ``copy_`` do not move it) the
tracer is replaced by ``eager`` with a warning naming it.  State without parameters larger than that, or not fully
reachable, is not checked (:attr:`TracedRun.skipped` says why; logged once per function).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .backends.base import Backend
from .pystate import PyState
from .reach import describe, walk
from .tree import collect_tensors, structure
from .writes import Snapshot, compare_outputs, tolerance


@dataclass
class TracedRun:
    """What the traced function did on the first call of a key, the state put back since."""

    outputs: list[Any]
    shape: Any
    state: list[tuple[Any, Any, str]]  # (tensor, its value after the traced run, its path)
    skipped: str | None = None
    # the parameters not put back (too large), each with its version counter once the state was put back
    not_put_back: list[tuple[Any, str, int | None]] = field(default_factory=list)

    def differs(self, backend: Backend, result: Any) -> str | None:
        """Why the Python function's run (its ``result``, the state it left) is not the traced run's, or None."""
        if self.skipped is not None:
            return None
        types = backend.tensor_types()

        def is_tensor(x: Any) -> bool:
            return isinstance(x, types)

        problem = compare_outputs(backend, result, self.outputs, self.shape, is_tensor)
        if problem is not None:
            return problem.replace("the eager call and the capture", "the Python function and the traced one")
        for t, after, path in self.state:
            if backend.equal(t, after):
                continue  # most of the state (parameters the function does not write): no float64 pass
            err = backend.rel_error(t, after)
            if not err <= tolerance(after):
                return f"the write to {path} differs by {err:.3g} (relative)"
        return None

    def parameters_written(self, backend: Backend) -> str | None:
        """After the Python function's run: the path of a parameter it wrote (its version counter moved) that was not
        put back after the traced run, or None (a write the counter does not see is not found)."""
        return next((p for t, p, v in self.not_put_back if v is not None and backend.version(t) != v), None)


def traced_run(backend: Backend, device: str, roots: list[tuple[str, Any]], run: Callable[[], Any],
               budget: int) -> TracedRun:
    """Run ``run`` (the traced function) once and put back every tensor it can reach, the Python state it can reach
    (:class:`~graphjit.pystate.PyState`) and the random generator; exceptions of ``run`` propagate after the state is
    put back.  Parameters are put back with the rest where all of it fits in half of ``budget``; else they are not
    (a large model's), and the run lists them in ``not_put_back`` for :meth:`TracedRun.parameters_written`.  Skipped
    without running anything where the state without the parameters does not fit either."""
    b = backend
    types = b.tensor_types()

    def is_tensor(x: Any) -> bool:
        return isinstance(x, types)

    reach = walk(roots, is_tensor, b.tensor_state)
    if reach.truncated:
        return TracedRun([], None, [], skipped="the walk of reachable objects stopped at its size limit")
    tensors = [(t, describe(p)) for t, p in reach.tensors.values() if not b.is_parameter(t)]
    params = [(t, describe(p)) for t, p in reach.tensors.values() if b.is_parameter(t)]
    nbytes = sum(b.nbytes(t) for t, _p in tensors)
    if 2 * nbytes > budget:
        return TracedRun([], None, [], skipped=f"its reachable state ({nbytes} bytes) is larger than half of "
                                               f"GRAPHJIT_VERIFY_MAX_BYTES={budget}")
    # parameters too where they fit: a function may write them (an in-place decay, an average), and a write of the
    # traced run left in place would be made again by the Python function's run
    fits = 2 * (nbytes + sum(b.nbytes(t) for t, _p in params)) <= budget
    if fits:
        tensors += params
    snap = Snapshot(b, [t for t, _p in tensors], device)
    py = PyState(b, roots, device)  # the Python state too: a counter the call advances moves once, in the call
    try:
        out = run()
        b.synchronize(device)
        outputs = [b.clone(o) for o in collect_tensors(out, is_tensor)]
        shape = structure(out, is_tensor)
        state = [(t, b.clone(t), p) for t, p in tensors]
        del out
    finally:
        snap.restore()
        py.restore()
    return TracedRun(outputs, shape, state, not_put_back=[] if fits else [(t, p, b.version(t)) for t, p in params])


def verdict(traced: TracedRun, backend: Backend, tracer: str, result: Any) -> tuple[str | None, str | None]:
    """After the Python function's run (its ``result``) on a key's first call: why the tracer named ``tracer`` is to be
    replaced by ``eager`` (its program differed, or it could not be checked: a parameter the function writes was not
    put back), or None; and what to log once where the check was skipped, or None."""
    written = traced.parameters_written(backend)
    if written is not None:  # a parameter it writes was not put back: the runs cannot be compared, nor trusted
        return (f'{backend.name} tracer="{tracer}" replaced by "eager": the function writes {written}, a parameter '
                "the check could not put back after running the program on a key's first call (the parameters are "
                "larger than half of GRAPHJIT_VERIFY_MAX_BYTES), so the program was not checked, and that call may "
                "have written the parameter twice; raise GRAPHJIT_VERIFY_MAX_BYTES above twice the state the call "
                'reaches, parameters included, or graph the function with tracer="eager"'), None
    if traced.skipped is not None:
        return None, (f'{backend.name} tracer="{tracer}" not checked against the Python function on the first call '
                      f"of a key: {traced.skipped}")
    problem = traced.differs(backend, result)
    if problem is None:
        return None, None
    return (f'{backend.name} tracer="{tracer}" replaced by "eager": on the first call of a key its program computed '
            f"other results than the Python function ({problem}), a bug of {backend.name}'s {tracer}; the function "
            'is traced with "eager" (and still captured) from now on'), None
