"""Verify once more on a later call: the proof that a key's graph does not depend on its dynamic
arguments (:mod:`graphjit.dynamic`), nor on how much of a bucketed dim is padding.

The capture's verify compares the graph with an eager run of the capturing call, whose dynamic values
the capture saw, so it cannot tell whether a segment read them.  So a key with dynamic arguments is
checked again on the first replayed call whose dynamic values differ from the capturing call's (compared
by contents; at most :data:`CALLS` calls are looked at, each copying its dynamic tensors to the host).
Likewise a key with bucketed dims is checked again on the first replayed call padded otherwise than the
capturing call (a capture at the bucket's own size saw no padding: a mean over the padded dim passed its
verify; compared by the real sizes, on every call until then): that call's state is copied, the eager
reference runs, the state is put back, the graph replays, and outputs, written state and the generator
are compared.  Either way the call runs the function once: on a mismatch its result is the eager
reference's, the state as that run left it, and the key runs uncaptured from then on (reason
:data:`REASON`, or :data:`PADDING` where only the padding changed).  One such call is checked: a result
that mixes in the padding only for some values is not found.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .backends.base import Backend
from .bucket_spec import Pad
from .errors import GraphjitError
from .pystate import PyState, second_run
from .tree import collect_tensors, structure
from .writes import Snapshot, compare_outputs

if TYPE_CHECKING:
    from .keys import CallSignature

CALLS = 16
"""Replayed calls looked at for dynamic values that differ from the capturing call's."""
REASON = "reads dynamic arguments outside islands"
PADDING = "depends on the padding of a bucketed dim"


@dataclass(frozen=True)
class Change:
    """What a call changed of what its key still checks: its padding (``padded``), its dynamic values
    (``dynamic``)."""

    padded: bool
    dynamic: bool


@dataclass
class DynamicCheck:
    """A key still to be checked on a call with other dynamic values (``fingerprint``: the capturing call's, None
    once :data:`CALLS` calls had the same, or for a key without them) or padded otherwise (``pads``: the capturing
    call's padded dims, None for a key without buckets or once checked).  :meth:`changed` says what a call changed;
    the call's own :class:`Change` is what the rest of its check reads (another thread's call may be compared
    meanwhile)."""

    fingerprint: Any
    pads: tuple[Pad, ...] | None = None
    left: int = CALLS

    def changed(self, b: Backend, sig: CallSignature) -> Change | None:
        """What ``sig``'s call changed of what is still to be checked; None where nothing (the call is counted)."""
        padded = self.pads is not None and sig.pads != self.pads
        dynamic = self.fingerprint is not None and fingerprint(b, sig.dynamic) != self.fingerprint
        if padded or dynamic:
            return Change(padded, dynamic)
        if self.fingerprint is not None:
            self.left -= 1
            if self.left <= 0:
                self.fingerprint = None
        return None

    def settled(self) -> bool:
        """Nothing left to check (the dynamic values did not change in :data:`CALLS` calls, and no buckets)."""
        return self.fingerprint is None and self.pads is None

    def rest(self, change: Change) -> DynamicCheck | None:
        """What is left to check once the call that made ``change`` is checked."""
        if change.padded:
            self.pads = None
        if change.dynamic:
            self.fingerprint = None
        return None if self.settled() else self

    @staticmethod
    def passed(change: Change) -> str:
        """The key's verify status once the check of the call that made ``change`` passed."""
        return f"passed (and on a call {'padded otherwise' if change.padded else 'with other dynamic values'})"

    @staticmethod
    def rejected(change: Change, sig: CallSignature, problem: str) -> tuple[str, str]:
        """The reason and the message of a key whose graph differed from eager on ``sig``'s call (``change``)."""
        if not change.padded:
            return REASON, (f"on a call with other dynamic arguments ({', '.join(sig.dynamic)}) the graph's result "
                            f"differs from eager: {problem}. A graphed segment reads them (or a value computed from "
                            "them outside an island): move that code into an @graphjit.eager island, or pass the value "
                            "as a plain argument")
        pads = ", ".join(f"{sig.paths[p.leaf]} dim {p.dim}: {p.real} of {p.padded}" for p in sig.pads) or "none"
        also = f" and with other dynamic arguments ({', '.join(sig.dynamic)})" if change.dynamic else ""
        return PADDING, (f"on a call padded otherwise than the capturing one (padded: {pads}){also} the graph's "
                         f"result differs from eager: {problem}. The function mixes the padding into what it returns "
                         "or writes (a mean or a softmax over the bucketed dim, a row read from its end): leave that "
                         "dim unbucketed, or keep the padded rows out of it")


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
