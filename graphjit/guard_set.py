"""The check before every replay of a captured graph: the Python values its capture read (found by
:func:`graphjit.guards.scan`) still what they were, in one pass (:class:`GuardSet`; :mod:`graphjit.guards` says what
is guarded and why).  A tensor graphjit feeds the graph at a place the caller rebinds (:mod:`graphjit.renewals`) is
checked there by kind, last, once everything else holds (:class:`graphjit.renewals.Feed` copies it in)."""

from __future__ import annotations

import marshal
import operator
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from . import backends, lane
from .absences import as_set
from .guard_links import DELETED, Links, columns
from .guardable import hashable, same_value, snapshot, typed
from .reach import Path, describe

if TYPE_CHECKING:
    from .guards import Scan
    from .module_hooks import HookWatch
    from .renewals import Fed

__all__ = ["DELETED", "GuardSet", "HasKey", "note_load", "note_rebind", "same", "show"]

_REBINDS = [0]
"""How many times a framework said one of its modules rebound a parameter or buffer (:func:`note_rebind`)."""


_LOADS = [0]
"""How many times a framework said an object's state was loaded (:func:`note_load`)."""


def note_load(*_args: Any) -> None:
    """An optimizer's state was loaded (``load_state_dict``, which rebinds its ``param_groups`` and ``state``: the
    guards read the old ones): every graph whose scan reached such an object is another graph's from now on."""
    _LOADS[0] += 1


def note_rebind(*_args: Any) -> None:
    """A module of a framework rebound a parameter or buffer (a registration hook: returns None, changing nothing):
    every graph's held tensors are compared again before its next replay."""
    _REBINDS[0] += 1


class HasKey:
    """``HasKey(name)(d)``: ``name in d`` (a whole-container getter of :class:`Scan`, shown as ``has:NAME``)."""

    __slots__ = ("name",)

    def __init__(self, name: Any) -> None:
        self.name = name  # a str, or os.environ's stored key (bytes: absences.environment_entry)

    def __call__(self, d: dict[Any, Any]) -> bool:
        return self.name in d


def same(a: Any, b: Any) -> bool:
    """What a guard says of ``b`` at capture and ``a`` now (:func:`~graphjit.guardable.same_value`: ``1``, ``1.0`` and
    ``True`` differ, so do ``0.0`` and ``-0.0``); False where the comparison raises or gives no truth value (arrays,
    tensors)."""
    try:
        return same_value(a, b)
    except Exception:
        return False


class GuardSet:
    """The guarded values of one captured graph (see the module docstring).

    ``holds()`` is the replay's check: True while every value is what it was at capture.  ``change()``
    names the first value that is not, with both values (for reasons and logs); ``values()`` is a hashable
    tuple of the current values (the key of a graph captured for them), or None if a container lost a
    guarded entry.  ``extra``: a check of the tracer's own guards (``torch.compile``), returning None when
    they hold, else what failed.
    """

    __slots__ = (
        "containers",
        "expected",
        "extra",
        "fed",
        "fed_which",
        "flag_of",
        "flag_tensors",
        "flags",
        "gated",
        "getters",
        "held",
        "hooks",
        "keys",
        "kinds",
        "links",
        "loads",
        "paths",
        "pin_attrs",
        "pin_items",
        "pinned",
        "seen",
        "taken",
        "typed",
        "untyped",
        "where",
    )

    def __init__(self, scan_: Scan, extra: Callable[[], str | None] | None = None, gated: bool = False,
                 hooks: HookWatch | None = None, fed: Fed | None = None, written: Iterable[int] = (),
                 grad_flag: tuple[Callable[[Any], Any], Callable[[Any], bool]] | None = None) -> None:
        """``gated``: the framework counts its modules' rebinding of parameters and buffers (:func:`note_rebind`),
        so the held tensors are compared only after the count moved; else before every replay.  ``hooks``: the
        module hooks of the capture (:mod:`graphjit.module_hooks`), one more part of the read values.  ``fed``: the
        places whose tensors graphjit feeds (:mod:`graphjit.renewals`): a held or pinned entry that holds graphjit's
        tensor there is checked by kind instead of compared by identity; ``written``: the ids of the
        tensors the key's calls write, which such a place must not hold."""
        self.hooks = hooks
        chosen = scan_.values()
        by_box: dict[int, list[Any]] = {}
        for cid, key in chosen:
            by_box.setdefault(cid, []).append(key)
        self.containers: list[Any] = []
        self.getters: list[Callable[[Any], Any]] = []
        self.keys: list[list[Any]] = []
        self.paths: list[list[Path]] = []
        self.expected: list[Any] = []
        # each container's path and whether the code reads it as a value (a list, dict or tuple read by subscript,
        # which follows its link: Links) or in place (an object's __dict__, a module's globals, a cell, a class)
        places: list[tuple[Path, bool]] = []
        # (typed, container, getter, keys, paths, expected, place): a container's typed values (guardable.typed: plain
        # numbers, strings, None, tuples of these) apart from its others, the typed ones last (holds compares them in
        # one C call, marshal's bytes: their types and bits too, 1 != 1.0 != True, 0.0 != -0.0)
        rows: list[tuple[bool, Any, Callable[[Any], Any], list[Any], list[Path], Any, tuple[Path, bool]]] = []
        for cid, all_keys in by_box.items():
            box = scan_.boxes[cid]
            for group in (True, False):
                keys = [k for k in all_keys if typed(chosen[(cid, k)][0]) is group]
                if not keys:
                    continue
                getter: Callable[[Any], Any] = (operator.attrgetter(*keys) if box.kind in ("attr", "cell")
                                                else operator.itemgetter(*keys))
                try:
                    expected = _each(snapshot, getter(box.container), len(keys))
                except Exception:  # an entry gone since the scan (the function deleted it): not a value it reads
                    continue
                paths = [chosen[(cid, k)][1] for k in keys]
                first = paths[0]
                place = (first[:-1], len(first) > 1 and first[-1][0] == "[]" and box.owner is None)
                rows.append((group and typed(expected if len(keys) > 1 else (expected,)), box.container, getter,
                             keys, paths, expected, place))
        for what, container, whole, value, path in scan_.named_wholes():  # len(list), the keys of a dict
            # keys kept absent from a dict (a probe's, graphjit/absences.py) are read where the dict is now, as its
            # entries are; names kept absent from an object's __dict__ stay with that object
            rows.append((typed(value), container, whole, [whole], [(f"{what}({describe(path)})",)], value,
                         (path, what not in ("own", "absent"))))
        rows.sort(key=lambda r: r[0])  # (stable)
        for _typed, container, getter, keys, paths, expected, place in rows:
            self.containers.append(container)
            self.getters.append(getter)
            self.keys.append(keys)
            self.paths.append(paths)
            self.expected.append(expected)
            places.append(place)
        self.kinds = bytes(_kind(g, k) for g, k in zip(self.getters, self.keys))
        self.untyped = sum(not r[0] for r in rows)  # the first ones, compared by identity, then ==
        self.typed = marshal.dumps(self.expected[self.untyped:], 2)
        self.extra = extra
        # held tensors: (container, key, path, the tensor or None at capture: kept, so its address stays its own)
        held = scan_.values(held=True)
        self.held = [(scan_.held[cid].container, key, path, value) for (cid, key), (value, path) in held.items()]
        self.fed, self.fed_which = fed, []
        self.gated = gated
        self.seen = _REBINDS[0]
        # pinned tensors (in closure cells, globals, attributes, list and dict entries): flat, by how they are read,
        # each compared by identity before every replay in one C-level pass per kind; kept, so their addresses stay
        # theirs.  ``pinned``: (container, key, tensor at capture, path), the subscripted ones first
        self.pinned: list[tuple[Any, Any, Any, Path]] = []
        by_attr: list[tuple[Any, Any, Any, Path]] = []
        for (cid, key), (value, path) in scan_.values(pinned=True).items():
            box = scan_.pinned[cid]
            (by_attr if box.kind in ("attr", "cell") else self.pinned).append((box.container, key, value, path))
        if fed is not None:  # graphjit's tensors at their places: checked by kind (Fed.valid)
            self.fed_which = self._take_fed(fed, by_attr)
        self.taken = frozenset(id(v) for v in self.tensors()) | frozenset(written)
        self.pin_items = columns([e[:3] for e in self.pinned])
        self.pin_attrs = columns([e[:3] for e in by_attr])
        self.pinned += by_attr
        # a frozen graph's only (no held tensor requires grad): a graph that holds trainable ones is a training
        # step's, whose freezing its gradients' layout already refuses; one read per held tensor per replay
        flag_of, trains = grad_flag if grad_flag is not None else (None, None)
        flagged = [t for t in self.tensors() if backends.is_tensor(t)] if trains is not None else []
        frozen = bool(flagged) and not any(map(trains, flagged))  # type: ignore[arg-type]
        self.flag_of = flag_of
        self.flag_tensors = flagged if frozen else []
        self.flags = list(map(flag_of, self.flag_tensors)) if frozen else []  # type: ignore[arg-type]
        self.loads = _LOADS[0] if scan_.loads else None  # the count of state loads at capture, where it is watched
        # where each list, dict or tuple read is found (its parent, up to an object, a cell, a module's globals or a
        # class), parents first: compared by identity before every replay, and read there again where one was rebound
        used = [*self.containers, *(p[0] for p in self.pinned)]
        places += [(path[:-1], len(path) > 1 and path[-1][0] == "[]") for _c, _k, _v, path in self.pinned]
        links = Links(scan_.links, scan_.second, used)
        self.links = links if len(links) else None
        # the link of each container, then of each pinned entry's container (-1: none): what follow() rebinds; a
        # container read in place never follows one, and a link that holds it diverges where it moves
        places = [(path, free and id(c) not in scan_.in_place) for c, (path, free) in zip(used, places)]
        self.where = [links.index(c, path) if free else -1 for c, (path, free) in zip(used, places)]
        for c, (_path, free) in zip(used, places):
            if not free:
                links.fix(c)

    def _take_fed(self, fed: Fed, by_attr: list[tuple[Any, Any, Any, Path]]) -> list[int]:
        """Take the held and pinned entries at ``fed``'s places out of :attr:`held`, :attr:`pinned` and ``by_attr``
        (in place); the indices of those places in ``fed``."""
        which: list[int] = []
        for entries, swap in ((self.held, True), (self.pinned, False), (by_attr, False)):
            as_pinned = [(c, k, v, p) for c, k, p, v in entries] if swap else entries
            found = dict(fed.entries(as_pinned))
            which += found.values()
            entries[:] = [e for j, e in enumerate(entries) if j not in found]
        return sorted(which)

    def tensors(self) -> list[Any]:
        """The held and pinned tensors (and other values pinned by identity) the graph reads, not those fed."""
        return [v for _c, _k, _p, v in self.held] + [v for _c, _k, v, _p in self.pinned]

    def __len__(self) -> int:
        return (sum(len(k) for k in self.keys) + len(self.held) + len(self.pinned) + len(self.fed_which)
                + len(self.flag_tensors))

    def _held_same(self) -> bool:
        """Every held tensor is the one the graph was captured with, and every name held absent still is."""
        return all(c.get(k, DELETED) is v for c, k, _p, v in self.held)

    def _pinned_same(self) -> bool:
        """Every pinned value is the one the graph was captured with (``getitem`` / ``getattr`` and ``is`` mapped in C
        over flat columns: no Python frame per value)."""
        items, attrs = self.pin_items, self.pin_attrs
        try:
            if items and not all(map(operator.is_, map(operator.getitem, items[0], items[1]), items[2])):
                return False
            return not attrs or all(map(operator.is_, map(getattr, attrs[0], attrs[1]), attrs[2]))
        except Exception:  # an entry deleted
            return False

    def follow(self) -> None:
        """Read every guarded container where its parent holds it now (``m.cfg = {"scale": 2.0}``, a global list
        rebound): the guards compare what the function would read, never a container it no longer reaches.  A
        container gone (or no longer subscriptable) is :data:`DELETED`, which fails the guards that read it; two
        places of one container that now differ fail them all (``links.diverged``)."""
        links = self.links
        if links is None or links.same():
            return
        now = links.read()
        if now is None:
            return
        where, n = self.where, len(self.containers)
        self.containers = [c if where[i] < 0 else now[where[i]] for i, c in enumerate(self.containers)]
        items = len(self.pin_items[0]) if self.pin_items else 0
        self.pinned = [(c, k, v, p) if where[n + i] < 0 else (now[where[n + i]], k, v, p)
                       for i, (c, k, v, p) in enumerate(self.pinned)]
        self.pin_items = columns([e[:3] for e in self.pinned[:items]])

    def _pinned_now(self) -> list[Any]:
        """What each pinned entry holds now (in :attr:`pinned`'s order), :data:`DELETED` where it is gone."""
        items = len(self.pin_items[0]) if self.pin_items else 0
        return [_entry(c, k) if i < items else _attr(c, k) for i, (c, k, _v, _p) in enumerate(self.pinned)]

    def rebound_tensors(self) -> list[tuple[Any, Any, bool, bool, Any, Any, Path]]:
        """``(container, key, by_attr, linked, value at capture, value now, path)`` of each held or pinned entry that
        holds another value now (:data:`DELETED` where it is gone); ``by_attr``: read as an attribute (an object's, a
        cell's); ``linked``: its container is a list or dict read again where its parent holds it (:meth:`follow`),
        not one read in place (a Module's parameter and buffer dicts are read in place)."""
        self.follow()
        items = len(self.pin_items[0]) if self.pin_items else 0
        n = len(self.containers)
        held = [(c, k, False, False, was, now, path) for c, k, path, was in self.held
                if (now := c.get(k, DELETED)) is not was]
        return held + [(c, k, i >= items, self.where[n + i] >= 0, was, now, path)
                       for i, (now, (c, k, was, path)) in enumerate(zip(self._pinned_now(), self.pinned))
                       if now is not was]

    @property
    def size(self) -> tuple[int, int]:
        """``(containers, values)`` checked per replay."""
        return len(self.containers), len(self)

    def _get(self, i: int) -> Any:
        return self.getters[i](self.containers[i])

    def holds(self) -> bool:
        """True while every guarded value is what it was at capture (the replay path: one pass; the held tensors
        only where a module rebound one since they were last found the same, or where that is not counted)."""
        links = self.links
        if links is not None and not links.same():
            self.follow()
            if links.diverged is not None:
                return False
        try:
            scan = lane.module()
            if scan is not None:  # the same comparison in one C call (csrc/lane_guards.c)
                if not scan.guards_hold(self.kinds, self.getters, self.containers, self.keys, self.expected):
                    return False
            else:
                now = list(map(operator.call, self.getters, self.containers))
                n = self.untyped
                if now[:n] != self.expected[:n] or marshal.dumps(now[n:], 2) != self.typed:
                    return False
        except Exception:  # a guarded entry was deleted (KeyError, IndexError, AttributeError)
            return False
        if self.pinned and not self._pinned_same():
            return False
        if self.loads is not None and _LOADS[0] != self.loads:
            return False
        if self.held and (not self.gated or _REBINDS[0] != self.seen):
            count = _REBINDS[0]
            if not self._held_same():
                return False
            self.seen = count
        if self.hooks is not None and not self.hooks.holds():
            return False
        if self.flag_tensors and list(map(self.flag_of, self.flag_tensors)) != self.flags:  # type: ignore[arg-type]
            return False
        if self.extra is not None and self.extra() is not None:
            return False
        return not self.fed_which or self.fed.valid(self.fed_which, self.taken)  # type: ignore[union-attr]

    def differences(self) -> Iterator[tuple[str, str, str]]:
        """``(path, value at capture, value now or "(deleted)")`` of each guarded value that differs, in order."""
        self.follow()
        if self.links is not None and self.links.diverged is not None:
            yield self.links.diverged, "the container found at its other place too", "another one"
        for i, keys in enumerate(self.keys):
            want = self.expected[i] if len(keys) > 1 else (self.expected[i],)
            c = self.containers[i]
            for j, key in enumerate(keys):
                try:
                    now = self._one(i, key)
                except Exception:
                    yield describe(self.paths[i][j]), show(as_set(c, want[j])), "(deleted)"
                    continue
                if not same(now, want[j]):  # (an environment variable's value shown as os.environ gives it)
                    yield describe(self.paths[i][j]), show(as_set(c, want[j])), show(as_set(c, now))
        for c, k, path, was in self.held:
            now = c.get(k, DELETED)
            if now is not was:
                yield describe(path), _tensor(was), _tensor(now)
        if self.flag_tensors:
            paths = {id(v): p for _c, _k, p, v in self.held} | {id(v): p for _c, _k, v, p in self.pinned}
            for t, was in zip(self.flag_tensors, self.flags):
                now = self.flag_of(t)  # type: ignore[misc]
                if now != was:
                    yield f"the requires-grad flag of {describe(paths[id(t)])}", show(was), show(now)
        for now, (_c, _k, was, path) in zip(self._pinned_now(), self.pinned):
            if now is DELETED:
                yield describe(path), _tensor(was), "(deleted)"
            elif now is not was:
                yield describe(path), _tensor(was), _tensor(now)
        if self.loads is not None and _LOADS[0] != self.loads:
            yield "an optimizer's state", f"as at capture ({self.loads} loads)", f"loaded since ({_LOADS[0]} loads)"
        if self.hooks is not None:
            yield from self.hooks.differences()
        if self.fed_which:
            fed = self.fed
            assert fed is not None
            for i, kind in zip(self.fed_which, fed.state(self.fed_which, self.taken)):
                if kind != fed.kinds[i]:
                    shown = "(deleted)" if kind == "(deleted)" else _tensor(fed.places[i].read())
                    yield describe(fed.places[i].path), "a tensor of the kind fed there", shown

    def change(self) -> tuple[str, str, str] | None:
        """``(path, old, new)`` of the first guarded value that differs, else of the tracer's failed guard."""
        first = next(self.differences(), None)
        if first is not None:
            return first
        if self.extra is not None:
            failed = self.extra()
            if failed is not None:
                return "torch.compile's guards", "held", f"failed: {failed}"
        return None

    def _one(self, i: int, key: Any) -> Any:
        c = self.containers[i]
        if key is self.getters[i]:  # a whole container's (Scan.wholes: len, tuple, HasKey, an absence's isdisjoint)
            return key(c)
        return getattr(c, key) if isinstance(self.getters[i], operator.attrgetter) else c[key]

    def values(self) -> tuple[Any, ...] | None:
        """The current guarded values, hashable (None where one is not): an unhashable object compared as an object
        (a dataclass config) stands for itself by its identity (:func:`~graphjit.guardable.hashable`), an entry gone
        (a list that shrank) by :data:`DELETED`; where two places of one container differ now, the place that moved
        too (a graph captured now finds them apart)."""
        self.follow()
        try:
            now = tuple(_each(hashable, self._get_or_deleted(i), len(keys)) for i, keys in enumerate(self.keys))
            if self.held:  # by identity: the graph of the new tensors holds them, so no other object takes their ids
                now = (*now, tuple((type(v), id(v)) for v in (c.get(k, DELETED) for c, k, _p, _v in self.held)))
            if self.pinned:  # the same
                now = (*now, tuple((type(v), id(v)) for v in self._pinned_now()))
            if self.loads is not None:  # a loaded state is another graph's (its guards read the new containers)
                now = (*now, ("loads", _LOADS[0]))
            if self.hooks is not None:
                now = (*now, self.hooks.state())
            if self.flag_tensors:
                now = (*now, ("requires grad", tuple(map(self.flag_of, self.flag_tensors))))  # type: ignore[arg-type]
            if self.fed_which:  # by kind (a tensor the graph holds otherwise by identity)
                now = (*now, self.fed.state(self.fed_which, self.taken))  # type: ignore[union-attr]
            if self.links is not None and self.links.diverged is not None:
                now = (*now, ("apart", self.links.diverged))
            hash(now)
        except Exception:
            return None
        return now

    def _get_or_deleted(self, i: int) -> Any:
        """What getter ``i`` returns, with :data:`DELETED` for each of its entries that is gone."""
        try:
            return self._get(i)
        except Exception:
            keys = self.keys[i]
            got = []
            for key in keys:
                try:
                    got.append(self._one(i, key))
                except Exception:
                    got.append(DELETED)
            return got[0] if len(keys) == 1 else tuple(got)

    def shown(self) -> dict[str, tuple[str, str]]:
        """``path -> (value at capture, value now)`` of the values that differ, ``"(deleted)"`` now where one is gone
        (for labels: a key of other values says which, a deleted entry too)."""
        return {path: (old, new) for path, old, new in self.differences()}


def _kind(getter: Callable[[Any], Any], keys: list[Any]) -> int:
    """How the lane's guard scan reads a container's values (``csrc/lane_guards.c``): 0 ``c[key]`` for each key of an
    ``itemgetter``, 1 ``getattr(c, key)`` for each plain name of an ``attrgetter``, 2 the getter called (a whole
    container's, a dotted name's), 3 ``name in c`` for a :class:`HasKey` (a name found absent)."""
    if keys[0] is getter:
        return 3 if type(getter) is HasKey else 2
    if isinstance(getter, operator.itemgetter):
        return 0
    plain = isinstance(getter, operator.attrgetter) and all(type(k) is str and "." not in k for k in keys)
    return 1 if plain else 2


def _each(f: Callable[[Any], Any], got: Any, n: int) -> Any:
    """``f`` of each value a getter returned: its one value, or each of the tuple of ``n`` > 1 it returns."""
    return f(got) if n == 1 else tuple(map(f, got))


def _attr(obj: Any, name: str) -> Any:
    """``getattr(obj, name)``, or :data:`DELETED` where it is gone (an attribute deleted, a closure cell emptied)."""
    try:
        return getattr(obj, name)
    except Exception:
        return DELETED


def _entry(container: Any, key: Any) -> Any:
    """``container[key]``, or :data:`DELETED` where it is gone (a list that shrank, a dict entry deleted)."""
    try:
        return container[key]
    except Exception:  # (LookupError; TypeError where the container is gone: a parent rebound to None)
        return DELETED


def _tensor(v: Any) -> str:
    """A held or pinned tensor for a reason: its type, shape and identity (never its values: that could read the
    GPU)."""
    if v is None or v is DELETED:
        return "None" if v is None else "(absent)"
    return f"<{type(v).__name__} {list(getattr(v, 'shape', ()))} at {id(v):#x}>"


def show(v: Any) -> str:
    """A value as a reason shows it: its repr, cut to 60 characters (a tensor in a tuple by its type, shape and
    identity: its repr would read its values, the GPU's)."""
    if isinstance(v, tuple) and any(map(backends.is_tensor, v)):
        text = "(" + ", ".join(_tensor(e) if backends.is_tensor(e) else repr(e) for e in v) + ")"
    else:
        text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."
