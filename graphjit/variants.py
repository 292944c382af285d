"""Calls whose Python values changed since their graph was captured (:mod:`graphjit.guards`): the methods
:class:`graphjit.api._State` inherits from :class:`ValueVariants`.

A key of the arguments may hold several graphs, one per set of values the function reads (``variants``);
the replay path checks the graph of the arguments' key first (:attr:`KeyEntry.check`) and comes here only when
its guards fail.  Here the call replays another graph whose guards hold, or is a call of the key of its current
values (warmed up and captured like any key), or, where the values change on every call (:class:`Drift`), runs
uncaptured with the path and both values in its reason.  Every path keeps the exactly-once promise: the call
runs the function once, as a replay, a warmup call or an uncaptured call.
"""

from __future__ import annotations

import abc
import logging
import threading
from typing import TYPE_CHECKING, Any

from . import absences, env, guards, renewals
from .backends.base import Backend
from .buffers import KeyEntry
from .capture import verify_fits
from .errors import CaptureError
from .guards import READ_VALUES
from .keys import CallSignature, Key
from .stats import State

if TYPE_CHECKING:
    from .families import Families
    from .history import KeyHistory
    from .invoke import Invoker
    from .stats import FunctionStats
    from .warmup import Warmup


ENV_FROZEN = ("a compiled program may keep the environment variables it read when it was compiled (Dynamo on torch "
              "2.11 does not guard os.environ)")

OPTIMIZER_HINT = ("An optimizer's hyperparameter: graphjit feeds the lr, betas, momentum and weight_decay of torch's "
                  "Adam, AdamW and SGD to the graph from tensors (not for a fused SGD a GradScaler steps, nor for an "
                  "Adam with its step counts on the CPU); other optimizers' hyperparameters are read as Python "
                  "numbers: keep them constant while the step is graphed (OneCycleLR(..., cycle_momentum=False)), or "
                  "give your optimizer a tensor it reads on the GPU (lr=torch.tensor(...)) filled in place; a value "
                  "that changes now and then gets a graph per value")


class ValueVariants(abc.ABC):
    """What a call does when a value its graph read has changed (a mixin of ``_State``)."""

    name: str
    invoker: Invoker
    stats: FunctionStats
    entries: dict[tuple[Any, ...], KeyEntry]
    variants: dict[tuple[Any, ...], list[tuple[Any, ...]]]
    drift: dict[tuple[Any, ...], Drift]
    history: KeyHistory
    lock: threading.RLock
    families: Families
    fed: dict[tuple[Any, ...], renewals.Fed]
    dynamic: Any
    copy_outputs: bool

    @abc.abstractmethod
    def verify(self) -> bool: ...

    @abc.abstractmethod
    def strict(self) -> bool: ...

    @abc.abstractmethod
    def say_once(self, level: int, topic: str, msg: str, *args: Any) -> None: ...

    @abc.abstractmethod
    def replay(self, entry: KeyEntry, sig: CallSignature, settings: env.Settings, instance: Any,
               args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any: ...

    @abc.abstractmethod
    def recheck(self, entry: KeyEntry, sig: CallSignature, instance: Any, args: tuple[Any, ...],
                kwargs: dict[str, Any]) -> Any: ...

    @abc.abstractmethod
    def slow(self, sig: CallSignature, settings: env.Settings, instance: Any, args: tuple[Any, ...],
             kwargs: dict[str, Any], previous: tuple[Any, ...] | None = None) -> Any: ...

    @abc.abstractmethod
    def fallback(self, reason: str, backend: Backend, instance: Any, args: tuple[Any, ...],
                 kwargs: dict[str, Any], key: tuple[Any, ...] | None = None) -> Any: ...

    @abc.abstractmethod
    def capture_key(self, backend: Backend, device: str, sig: CallSignature, warm: Warmup, instance: Any,
                    args: tuple[Any, ...], kwargs: dict[str, Any], no_adopt: frozenset[int]) -> Any: ...

    def values_changed(self, entry: KeyEntry, sig: CallSignature, settings: env.Settings, instance: Any,
                       args: tuple[Any, ...], kwargs: dict[str, Any], previous: tuple[Any, ...] | None) -> Any:
        """A call whose arguments have a graph, but a value the function reads (:mod:`graphjit.guards`) is not
        what that graph was captured with: replay the graph captured for the current values, if any; else the
        call is a call of the key of those values (warmed up and captured as any key); or, where the values
        change on every call, it runs uncaptured with the reason."""
        base = sig.key
        for key in self.variants.get(base, ()):
            other = self.entries.get(key)
            if other is not None and other is not entry and (other.check is None or other.check()):
                vsig = sig if key == base else sig.for_values(key, {})
                if other.recheck is not None:
                    return self.recheck(other, vsig, instance, args, kwargs)
                return self.replay(other, vsig, settings, instance, args, kwargs)
        renewed = self.renew(entry, sig, instance, args, kwargs)
        if renewed is not _NOT_RENEWED:
            return renewed
        guard = entry.guards
        assert guard is not None
        change = guard.change() or ("a value", "?", "?")
        values = guard.values()
        backend = entry.inputs.backend
        tracer = self.invoker.tracer_name(backend)
        missing = backend.tracer_misses_values(tracer)
        if missing is not None:  # (never for most tracers: the differences are not listed for them here)
            path = next((p for p in guard.shown() if p.startswith("class ")), None)
            if path is not None:
                self.class_value_read(backend, path, missing)
        if tracer != "eager":  # a translated program keeps the environment it was made under (Dynamo's on torch 2.11)
            path = next((p for p in guard.shown() if absences.ENVIRONMENT in p), None)
            if path is not None:
                self.class_value_read(backend, path, ENV_FROZEN)
        if not backend.tracer_rereads_values(self.invoker.tracer_name(backend)):
            return self.values_uncaptured(backend, sig, change, instance, args, kwargs, frozen=True)
        if values is None:
            return self.values_uncaptured(backend, sig, change, instance, args, kwargs)
        vkey = Key((*base[:-1], (READ_VALUES, values), base[-1]))  # the modes stay last
        for _ in range(4):  # that key's graph failed its own guards above (its run read values this one does not):
            other = self.entries.get(vkey)  # its values, too, tell the graph of these values from it
            if other is None or other.guards is None:
                break
            more = other.guards.values()
            if more is None:
                return self.values_uncaptured(backend, sig, change, instance, args, kwargs)
            vkey = Key((*vkey[:-1], (READ_VALUES, more), vkey[-1]))
        else:
            return self.values_uncaptured(backend, sig, change, instance, args, kwargs)
        with self.lock:  # every level's values: a value only a later graph reads drifts too
            volatile = self.drift.setdefault(base, Drift()).note(tuple(vkey[len(base) - 1:-1]))
        if volatile:
            return self.values_uncaptured(backend, sig, change, instance, args, kwargs)
        shown = guard.shown()
        self.history.note_values(base, {path: old for path, (old, _new) in shown.items()})
        return self.slow(sig.for_values(vkey, {path: new for path, (_old, new) in shown.items()}), settings, instance,
                         args, kwargs, previous)

    def renew(self, entry: KeyEntry, sig: CallSignature, instance: Any, args: tuple[Any, ...],
              kwargs: dict[str, Any]) -> Any:
        """A call of a key whose graph's only changed values are tensors rebound to new ones of the same kind
        (:func:`graphjit.renewals.renewable`): the key is captured again, now reading graphjit's own tensors at those
        places, filled from the caller's before each replay (:class:`graphjit.renewals.Fed`, the key's from now on);
        this call is the capture's.  :data:`_NOT_RENEWED` where they are not such tensors, for a graph found by other
        values than the arguments', one with islands, ``dynamic=`` arguments or ``outputs="alias"``, one a counter's
        family serves, a capture verify would not check, a place already fed (its capture could not bind it), or
        under a tracer that freezes what it read into its program (Paddle's AST translation): a graph per value.  A
        failed capture takes the places back (the key runs as any key whose capture failed)."""
        guard = entry.guards
        if (guard is None or not (guard.pinned or guard.held) or sig.base is not None or entry.advances is not None
                or entry.piecewise or entry.stats.state is not State.REPLAY or self.dynamic is not None
                or not self.copy_outputs or not self.verify()
                or not verify_fits(entry.stats.state_bytes, env.settings().verify_max_bytes)
                or any(f.entry is entry for f in self.families.items)):
            return _NOT_RENEWED
        backend = entry.inputs.backend
        if not backend.tracer_rereads_values(self.invoker.tracer_name(backend)):
            return _NOT_RENEWED  # its program keeps the tensor it read when it was made
        found = renewals.renewable(guard, entry.warm, backend, entry.device)
        before = self.fed.get(sig.key)
        if found is None or (before is not None and any(before.feeds(p.container, p.key) for p, _now in found)):
            return _NOT_RENEWED
        others = [t for t in renewals.occupied(guard, entry.warm) if isinstance(t, backend.tensor_types())]
        fed = renewals.Fed(backend, found, others, before)
        paths = ", ".join(fed.paths[len(before.places) if before is not None else 0:])
        self.say_once(logging.INFO, "renewed:" + paths, "graphjit %s: %s was rebound to a new tensor of the same kind; "
                      "the graph is captured again to read a graphjit-owned copy, copied in from the tensor there "
                      "before each replay and back after (two device copies a call)", self.name, paths)
        with self.lock:
            del self.entries[sig.key]
            entry.release()
            entry.stats.reason = f"{renewals.REASON}: {paths}"
            self.fed[sig.key] = fed
            try:
                return self.capture_key(backend, entry.device, sig, entry.warm, instance, args, kwargs,
                                        entry.no_adopt)
            finally:
                if sig.key not in self.entries:  # the capture failed: its calls run the function on their own
                    if before is None:
                        self.fed.pop(sig.key, None)
                    else:
                        self.fed[sig.key] = before

    def class_value_read(self, backend: Backend, path: str, missing: str) -> None:
        """A value the function reads off a class (``path``) changed since a graph was captured, under a tracer whose
        guards may miss such a value (``missing``, :meth:`Backend.tracer_misses_values`: this Dynamo keeps running
        code compiled for the old one), or an environment variable it reads (:data:`ENV_FROZEN`): the function is
        traced with ``eager`` from now on (logged once, shown in ``report()``), so the key of the new value runs and
        captures the Python function's kernels.  Not seen: a change before the key's first capture (between Dynamo's
        compilation and the capture), which Dynamo itself misses too."""
        tracer = self.invoker.tracer_name(backend)
        why = (f'{backend.name} tracer="{tracer}" replaced by "eager": {path} changed, and {missing}; the function is '
               'traced with "eager" (and still captured) from now on')
        self.invoker.replace_tracer(backend, why)
        self.stats.tracer = why
        self.say_once(logging.WARNING, "tracer-misses", "graphjit %s: %s", self.name, why)

    def values_uncaptured(self, backend: Backend, sig: CallSignature, change: tuple[str, str, str], instance: Any,
                          args: tuple[Any, ...], kwargs: dict[str, Any], frozen: bool = False) -> Any:
        """A call whose read values changed on every recent call (or, ``frozen``, under a tracer whose program froze
        them): uncaptured, under the path's reason; a frozen program is not run, the Python function is."""
        path, old, new = change
        reason = f"{guards.REASON}: {path}"
        tracer = self.invoker.tracer_name(backend)
        why = (f"{backend.name}'s {tracer} tracer froze it into its program, so calls with another value run the "
               'Python function uncaptured; tracer="sot" or "eager" capture a graph per value' if frozen else
               f"it changed on each of the last {Drift.VOLATILE} calls (or took more than {Drift.MAX_VALUES} "
               "values); a CUDA graph freezes the values the function reads, so these calls run uncaptured")
        todo = OPTIMIZER_HINT if "param_groups" in path else (
            "Pass it as an argument (a new value is a new graph) or keep it in a tensor updated in place")
        detail = (f"{path} was {old} when the graph was captured and is {new} now, and {why}. {todo}; a value that "
                  "settles is captured again")
        st = self.stats.keys.get(sig.key)
        if st is not None:
            st.reason, st.detail = reason, detail
        if frozen:
            self.stats.fallback(reason)
            if st is not None:
                st.uncaptured += 1
            result = self.invoker.run_untraced(backend, instance, args, kwargs)
        else:
            result = self.fallback(reason, backend, instance, args, kwargs, sig.key)
        if self.strict():
            raise CaptureError(f"{self.name}: {reason}: {detail} (strict mode)", reason=reason).after_run(result)
        self.say_once(logging.WARNING, "values:" + path, "graphjit %s: %s", self.name, detail)
        return result


_NOT_RENEWED = object()
"""What :meth:`ValueVariants.renew` returns where the key is not captured again."""


class Drift:
    """How the read values of one key of the arguments changed on the calls whose guards failed: values new on
    each of :data:`VOLATILE` such calls in a row change on every call (graphing them would make one graph per
    call); values seen on a recent such call (a flag toggled back, a value that settled) get a graph."""

    VOLATILE = 3
    RECENT = 16
    MAX_VALUES = 8
    """Distinct sets of values one key of the arguments gets graphs for (as Dynamo's recompile limit): a value
    that drifts slowly (an epoch counter) would otherwise fill ``max_graphs`` with graphs used a few times each."""

    __slots__ = ("changes", "distinct", "recent")

    def __init__(self) -> None:
        self.recent: dict[tuple[Any, ...], None] = {}
        self.changes = 0
        self.distinct = 0

    def note(self, values: tuple[Any, ...] | None) -> bool:
        """Record the values of a call whose guards failed; True if they change on every call, or have taken more
        than :data:`MAX_VALUES` values (run it uncaptured)."""
        if values is not None and values in self.recent:
            self.changes = 0
            self.recent.pop(values)
        else:
            self.changes += 1
            self.distinct += 1
        if values is not None:
            self.recent[values] = None
            while len(self.recent) > self.RECENT:
                self.recent.pop(next(iter(self.recent)))
        return self.changes >= self.VOLATILE or self.distinct > self.MAX_VALUES
