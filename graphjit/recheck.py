"""Verify once more on a later call: the proof that a key's graph does not depend on its dynamic
arguments (:mod:`graphjit.dynamic`).

The capture's verify compares the graph with an eager run of the capturing call, whose dynamic values
the capture saw, so it cannot tell whether a segment read them.  So a key with dynamic arguments is
checked again on the first replayed call whose dynamic values differ from the capturing call's (compared
by contents; at most :data:`CALLS` calls are looked at, each copying its dynamic tensors to the host):
that call's state is copied, the eager reference runs, the state is put back, the graph replays, and
outputs, written state and the generator are compared.  Either way the call runs the function once: on
a mismatch its result is the eager reference's, the state as that run left it, and the key runs
uncaptured from then on (reason :data:`REASON`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .backends.base import Backend
from .errors import GraphjitError
from .pystate import PyState, second_run
from .tree import collect_tensors, structure
from .writes import Snapshot, compare_outputs

CALLS = 16
"""Replayed calls looked at for dynamic values that differ from the capturing call's."""
REASON = "reads dynamic arguments outside islands"


@dataclass
class DynamicCheck:
    """A key still to be checked on a call with other dynamic values."""

    fingerprint: Any
    left: int = CALLS


def fingerprint(b: Backend, values: dict[str, Any]) -> Any:
    """The dynamic values' structure and non-tensor leaves, and a hash of each tensor's contents."""
    is_tensor = _is_tensor_of(b)
    return structure(values, is_tensor), tuple(b.fingerprint(t) for t in collect_tensors(values, is_tensor))


@dataclass
class Outcome:
    """What :func:`against_eager` found: ``problem`` (None: the graph matched) and the eager result."""

    problem: str | None
    reference: Any
    result: Any


def against_eager(b: Backend, device: str, written: list[Any], paths: list[str], eager: Callable[[], Any],
                  replay: Callable[[], Any], python_before: PyState | None = None,
                  python_state: Callable[[], PyState | None] = lambda: None) -> tuple[Outcome, Snapshot]:
    """Copy ``written``, run ``eager()``, put the copies back, run ``replay()`` and compare.  Returns the
    outcome and the snapshot of the state ``eager()`` left (restore it when the graph is rejected).
    Where the replay runs Python (a piecewise graph's islands): ``python_before``, the Python state before ``eager()``,
    and ``python_state``, which copies it after (:func:`~graphjit.pystate.second_run`): the call's Python effects are
    the eager run's alone."""
    is_tensor = _is_tensor_of(b)
    pre = Snapshot(b, written, device)
    ref = eager()
    b.synchronize(device)
    want = [b.clone(t) for t in collect_tensors(ref, is_tensor)]
    want_shape = structure(ref, is_tensor)
    post = Snapshot(b, written, device)
    pre.restore()
    try:
        with second_run(python_before, python_state):
            result = replay()
            b.synchronize(device)
    except GraphjitError as exc:  # an island broke its contract on these dynamic values (IslandError)
        return Outcome(f"the replay failed: {exc}", ref, None), post
    problem = compare_outputs(b, result, want, want_shape, is_tensor) or post.differs(written, paths)
    if problem is None and post.rng_differs():
        problem = "the random generator is not where the eager call left it"
    return Outcome(problem, ref, result), post


def _is_tensor_of(b: Backend) -> Callable[[Any], bool]:
    types = b.tensor_types()
    return lambda x: isinstance(x, types)
