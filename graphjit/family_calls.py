"""The calls of keys a counter's family decides (:mod:`graphjit.families`): a key its graph serves, and a key whose
class failed before it (the methods :class:`graphjit.api._State` inherits from :class:`FamilyCalls`).

Both keep the exactly-once promise: a served key's first call is the family's proof, whose result is its one eager
run or replay; a key of a failed class runs its function once, uncaptured, counted under the class's reason."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from . import env, reach
from . import families as families_mod
from .buffers import InputMoved
from .errors import CaptureError
from .lifecycle import KeyLifecycle
from .pystate import PyState
from .stats import KeyStats, State
from .warmup import Blocked
from .writes import Snapshot

if TYPE_CHECKING:
    from .backends.base import Backend
    from .keys import CallSignature
    from .warmup import Warmup


class FamilyCalls(KeyLifecycle):
    """What ``_State``'s slow path does for a key a family serves or a class failed (a mixin of ``_State``, over
    :class:`~graphjit.lifecycle.KeyLifecycle`)."""

    def family_call(self, backend: Backend, sig: CallSignature, settings: env.Settings, instance: Any,
                    args: tuple[Any, ...], kwargs: dict[str, Any], previous: tuple[Any, ...] | None) -> Any:
        """A key without a graph that a family's graph may serve (:mod:`graphjit.families`): replayed where the family
        is proven, proven on it where not yet; :data:`~graphjit.families.NOT_MEMBER` where no family serves it."""
        fam = self.families.member(sig, lambda: self.named_leaves(backend, sig, instance, args, kwargs), args, kwargs)
        if fam is None:
            return families_mod.NOT_MEMBER
        entry = fam.entry
        proving = not fam.verified
        if proving:
            try:
                problem, result = families_mod.prove(fam, sig, backend,
                                                     lambda: self.invoker.run(backend, instance, args, kwargs),
                                                     self.lock, args, kwargs)
            except InputMoved:  # nothing replayed, the eager run undone: the key goes its own way
                self.families.drop(fam, self.entries)
                return families_mod.NOT_MEMBER
            if problem is not None:
                self.families.drop(fam, self.entries)
                self.say_once(logging.INFO, "family:" + entry.stats.label, "graphjit %s [%s]: its graph differs from "
                              "eager on another value of %s (%s): one graph per value", self.name, entry.stats.label,
                              ", ".join(entry.stats.advances), problem)
                return result
            fam.verified = True
            entry.stats.verify = "passed (and on another value of its counters)"
        with self.lock:
            self.entries[sig.key] = entry
            fam.members.append(sig.key)
            entry.stats.members += 1
            self.warming.pop(sig.key, None)  # a key warmed before the family was proven: its row goes
            self.stats.keys.pop(sig.key, None)
        if proving:
            return result  # the proof's replay was this call's
        return self.captured(entry, sig, settings, instance, args, kwargs, previous)

    def class_failed(self, reason: str, backend: Backend, sig: CallSignature, st: KeyStats, instance: Any,
                     args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A new key whose previous value of its counter's class failed its warmups or its capture under ``reason``
        (:meth:`graphjit.families.Families.take_over`): it runs uncaptured from now on, without warming up; in strict
        mode that raises, as the failure of its own warmups would."""
        self.failed[sig.key] = reason
        st.state, st.reason = State.FALLBACK, reason
        failed = self.families.failed_class
        where = ", ".join(failed[1].paths) if failed is not None else "its counters"
        st.detail = f"the previous value of its counter's class ({where}) failed: {reason}"
        result = self.fallback(reason, backend, instance, args, kwargs, sig.key)
        if self.strict():
            raise CaptureError(f"{self.name} [{st.label}]: {st.detail} (strict mode)", reason=reason).after_run(result)
        return result

    def own_run_fits(self, backend: Backend, sig: CallSignature, warm: Warmup) -> bool:
        """Whether a run of this call's own value could be undone before its capture (:meth:`own_value_run`): the
        record's state is tracked, and it and the call's tensors fit ``GRAPHJIT_VERIFY_MAX_BYTES``.  Where not, the
        key takes no other value's record over (:meth:`graphjit.families.Families.take_over`): it warms up on its
        own, as before values shared their warmups."""
        return warm.untracked is None and \
            sum(backend.nbytes(t) for t in warm.undoable(sig, backend)) <= env.settings().verify_max_bytes

    def own_value_run(self, backend: Backend, device: str, sig: CallSignature, warm: Warmup, instance: Any,
                      args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[bool, Any]:
        """Before the capture of a key whose warmup record other values of its counter's class made
        (:attr:`Warmup.shared`): one watched run of its own value, for syncs and for what it writes, undone (the
        record's state and every tensor the call passes copied before, with the generator; its Python state), so
        that the capture starts from the call's state.  A run that writes what the other values' runs did not blocks
        the key (:attr:`Warmup.blocked`), and so does a copy that fails (out of memory).  Returns ``(ran, result)``:
        ``ran`` where the run wrote a tensor outside those copies and so stays as the call's one execution, ``result``
        its result.  A key takes a record over only where this fits (:meth:`own_run_fits`)."""
        known, leaves = {id(t) for t, _p in warm.written_tensors()}, set(warm.mutated_leaves)
        try:
            snap = Snapshot(backend, warm.undoable(sig, backend), device)
        except Exception as exc:  # (a failed copy changed nothing)
            warm.blocked = Blocked("cannot undo a warmup run", f"copying what the run of its own value may write "
                                   f"failed ({type(exc).__name__}: {exc})")
            return False, None
        py = PyState(backend, self.roots(instance, args, kwargs), device)
        out = self.watched(backend, device, sig, warm, instance, args, kwargs, sync_watch=True)[0]
        outside = [reach.describe(p) for t, p in warm.written_tensors() if id(t) not in known]
        new = outside + [sig.paths[i] for i in sorted(warm.mutated_leaves - leaves)]
        if new and warm.blocked is None:
            warm.blocked = Blocked("writes different tensors on different calls", f"the run of its own value wrote "
                                   f"{new[0]}, which the runs of other values of its counter's class did not")
        if outside:  # state outside the copies: the run cannot be undone, so it is the call's
            return True, out
        del out
        snap.restore({id(t) for t in warm.state(sig, backend)[0]})  # what its runs wrote (an input read only: kept)
        py.restore()
        return False, None

