"""Dropping a graphed function's keys: all of them (``reset()``), or those of a graphed method's instances that are
gone.

A bound call's key holds its instance by id (``("self", id, training)``, :mod:`graphjit.keys`), and the replay lane
checks it by address.  When the instance goes, its keys go with it (graphs released, counters and records dropped):
nothing of it stays alive (its parameters, which the graph's guards hold), its graphs count no more against
``max_graphs``, and an object born later at the same address is never taken for it (it would replay the dead
instance's graph, with the dead instance's weights).  The instance's weak reference only records that it went and
retires the lane's plan (a callback may run in the middle of any code: this function's own, a loop over its stats, a
capture), so the lane serves no call before the keys are dropped; they are dropped by the next call the lane does not
serve, by ``stats()``, ``report()`` or ``reset()``, each time only where no thread holds the function's lock or the
capture lock (a graph released during a capture invalidates the capture), else by the next of those.  An instance
that takes no weak reference is held by the function (its address stays its own) until ``reset()``.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

from .backends.base import CAPTURE_LOCK
from .families import Families

if TYPE_CHECKING:
    import threading

    from .buffers import KeyEntry
    from .history import KeyHistory
    from .stats import FunctionStats


def _owned_by(key: Any, ids: set[int]) -> bool:
    """Whether ``key`` (a call's key, or a key of other read values built on it) is a bound call's of one of ``ids``."""
    return any(type(p) is tuple and len(p) == 3 and isinstance(p[0], str) and p[0] == "self" and p[1] in ids
               for p in key)


class KeyDrops:
    """Mixin of ``api._State``: :meth:`reset`, and the keys of instances that are gone (:meth:`watch_owner`)."""

    lock: threading.RLock
    lane: Any
    entries: dict[tuple[Any, ...], KeyEntry]
    families: Families
    warming: dict[tuple[Any, ...], Any]
    failed: dict[tuple[Any, ...], str]
    tracer_checked: set[tuple[Any, ...]]
    variants: dict[tuple[Any, ...], list[tuple[Any, ...]]]
    drift: dict[tuple[Any, ...], Any]
    step_feeds: dict[tuple[Any, ...], Any]
    fed: dict[tuple[Any, ...], Any]
    stats: FunctionStats
    history: KeyHistory
    last_key: tuple[Any, ...] | None
    previous_key: tuple[Any, ...] | None
    last_new_key: tuple[Any, ...] | None

    blocked_fn: Any
    said: set[Any]
    handed_out: list[Any]
    scoped_keys: int

    def drop_lane(self) -> None: ...  # LaneHolder's

    def init_drops(self) -> None:
        self.owners: dict[int, Any] = {}  # id -> a weak reference to the instance (or the instance: see watch_owner)
        self.gone: list[int] = []  # ids of instances gone whose keys are still here (appended by their callbacks)

    def reset(self) -> None:
        """Every graph dropped, and every key's record: the next call of each key warms up again."""
        with self.lock:
            self.drop_lane()
            for e in {id(e): e for e in self.entries.values()}.values():
                e.release()
            self.entries.clear()
            self.families = Families()
            self.warming.clear()
            self.blocked_fn = None
            self.failed.clear()
            self.stats.keys.clear()
            self.said.clear()
            self.handed_out = []
            self.last_new_key = None
            self.scoped_keys = 0
            self.last_key = None
            self.history.clear()
            self.variants.clear()
            self.drift.clear()
            self.step_feeds.clear()
            self.fed.clear()
            self.owners.clear()  # (the instances held for want of a weak reference go too: no key names them now)
            self.gone.clear()

    def watch_owner(self, instance: Any) -> None:
        """Drop ``instance``'s keys once it goes (called for each new key of a bound call; see the module docstring).
        An instance that takes no weak reference is held by the function instead, so that its id stays its own, until
        :meth:`reset`."""
        oid = id(instance)
        if oid in self.owners:
            return
        state = weakref.ref(self)

        def went(_ref: Any) -> None:
            s = state()
            if s is not None:
                s.gone.append(oid)
                plan = s.lane
                if plan is not None:  # it knows a bound call's instance by address: it serves nothing until the drop
                    plan.retire()

        with self.lock:
            try:
                self.owners.setdefault(oid, weakref.ref(instance, went))
            except TypeError:
                self.owners.setdefault(oid, instance)

    def drop_now(self) -> None:
        """:meth:`drop_gone` here, where instances went and no thread (this one included) holds the function's lock or
        the capture lock; else nothing (the next call, ``stats()``, ``report()`` or ``reset()`` tries again)."""
        if not self.gone:
            return
        lock = self.lock
        if lock._is_owned() or CAPTURE_LOCK._is_owned() or not lock.acquire(blocking=False):  # type: ignore[attr-defined]
            return
        try:
            if CAPTURE_LOCK.acquire(blocking=False):
                try:
                    self.drop_gone()
                finally:
                    CAPTURE_LOCK.release()
        finally:
            lock.release()

    def drop_gone(self) -> None:
        """Drop the keys of the instances gone since the last call (see the module docstring)."""
        with self.lock:
            ids = set()
            while self.gone:
                oid = self.gone.pop()
                ref = self.owners.get(oid)
                if type(ref) is weakref.ref and ref() is None:
                    del self.owners[oid]
                    ids.add(oid)
            plan = self.lane
            self.drop_lane()  # the callback retired it: its entry makes another plan (if it stays)
            for e in self.entries.values():
                if e.lane is plan:
                    e.lane = None
            if not ids:
                return
            for key, entry in [(k, e) for k, e in self.entries.items() if _owned_by(k, ids)]:
                if self.entries.get(key) is entry:
                    self.families.forget(entry, self.entries)
                    entry.release()
            keyed: list[Any] = [self.warming, self.failed, self.variants, self.drift, self.step_feeds, self.fed,
                                self.stats.keys, self.history.records]
            for d in keyed:
                for key in [k for k in d if _owned_by(k, ids)]:
                    del d[key]
            self.tracer_checked -= {k for k in self.tracer_checked if _owned_by(k, ids)}
            for name in ("last_key", "previous_key", "last_new_key"):
                key = getattr(self, name)
                if key is not None and _owned_by(key, ids):
                    setattr(self, name, None)
