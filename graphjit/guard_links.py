"""Where a graph's guards find the lists, dicts and tuples they read (:class:`Links`): each one's parent and key, up to
an object, a closure cell, a module's globals or a class, so that a container rebound since the capture
(``m.cfg = {"scale": 2.0}``, a global list reloaded) is read where the function finds it now, never the old one nobody
changes any more (:class:`graphjit.guard_set.GuardSet`).

A link's parent is either another link (by its index: a dict in a dict) or a root object that no link holds; every
read goes from the roots down by index, so two chains never stand for each other (a parent that is ``None`` now, or
the same object at two places).  A container found at a second place too (``self.a = self.b = {...}``) has that place
checked as well: where the two places hold different objects now, which one the function reads cannot be told, and
:attr:`Links.diverged` names the place that moved (the guards fail; the call is the key of values that say so)."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

from .reach import Path, describe

__all__ = ["DELETED", "Links", "Place", "columns", "read_at"]

Place = tuple[Any, str, Any, Any, Path]
"""``(parent, kind, key, child, path)``: ``child`` read as ``parent[key]`` (kind ``"item"``, ``"globals"``) or
``getattr(parent, key)`` (``"attr"``, ``"cell"``), at ``path`` (:meth:`graphjit.guards.Scan.link`)."""

_ATTR = ("attr", "cell")


class _Deleted:
    """A guarded entry or container that is gone (a deleted entry, a list that shrank, a parent that is not
    subscriptable any more)."""

    def __repr__(self) -> str:
        return "(deleted)"


DELETED = _Deleted()


def read_at(parent: Any, kind: str, key: Any) -> Any:
    """``parent``'s entry as the walk read it: a dict's by ``dict.get`` (never a ``__missing__`` that would insert
    the key into a ``defaultdict``), :data:`DELETED` where it is not there."""
    try:
        if kind in _ATTR:
            return getattr(parent, key)
        return dict.get(parent, key, DELETED) if isinstance(parent, dict) else parent[key]
    except Exception:
        return DELETED


def columns(entries: Sequence[tuple[Any, Any, Any]]) -> tuple[tuple[Any, ...], ...]:
    """``(parents, keys, children)`` of ``(parent, key, child)`` entries, for one mapped identity pass (``map`` of a
    getter, then of ``operator.is_``: no Python frame per entry); ``()`` for none."""
    if not entries:
        return ()
    return tuple(e[0] for e in entries), tuple(e[1] for e in entries), tuple(e[2] for e in entries)


class Links:
    """The links on the way to ``used`` (containers a guard set reads), parents first.

    :meth:`same` is the replay's check: every linked container, and every second place of one, still holds what
    was found last (identity, one C-level mapped pass per kind).  :meth:`read` reads them all again from the roots and
    returns the containers now found, by index (:meth:`index`), or None where none moved."""

    __slots__ = ("attrs", "dicts", "diverged", "fixed", "items", "links", "now", "others", "paths")

    def __init__(self, places: dict[int, Place], second: dict[int, list[Place]], used: Sequence[Any]) -> None:
        needed: set[int] = set()
        todo = [id(c) for c in used]
        while todo:
            i = todo.pop()
            if i in needed or i not in places:
                continue
            needed.add(i)
            todo.append(id(places[i][0]))
            todo.extend(id(p[0]) for p in second.get(i, ()))
        order = [i for i in places if i in needed]  # the scan's order: a parent before its children
        at = {i: n for n, i in enumerate(order)}

        def parent(p: Place, n: int) -> int:  # a parent linked only after (a walk root linked later): a fixed root
            pi = at.get(id(p[0]), -1)
            return pi if pi < n else -1

        # (index of the parent link or -1, the parent object, kind, key, path)
        self.links = [(parent(places[i], n), places[i][0], places[i][1], places[i][2], places[i][4])
                      for n, i in enumerate(order)]
        self.now: list[Any] = [places[i][3] for i in order]
        self.paths = [{places[i][4], *(p[4] for p in second.get(i, ()))} for i in order]  # every place's path
        # second places of a linked container: (its link, the parent link or -1, the parent, kind, key, path)
        self.others = [(at[i], parent(p, at[i]), p[0], p[1], p[2], p[4]) for i in order for p in second.get(i, ())]
        self.fixed: set[int] = set()  # links whose container the guards read in place (fix): a move diverges
        self.diverged: str | None = None
        self.dicts: tuple[tuple[Any, ...], ...] = ()
        self.items: tuple[tuple[Any, ...], ...] = ()
        self.attrs: tuple[tuple[Any, ...], ...] = ()
        self._columns()

    def __len__(self) -> int:
        return len(self.links) + len(self.others)

    def index(self, container: Any, path: Path | None = None) -> int:
        """The link of ``container`` (as found when the links were made) at ``path`` (any path: None), -1 for one no
        link holds there."""
        return next((n for n, c in enumerate(self.now) if c is container and (path is None or path in self.paths[n])),
                    -1)

    def fix(self, container: Any) -> None:
        """``container`` is read in place (an object's ``__dict__`` also held as a dict value, ``self.opts =
        vars(ns)``): its guards never follow a link; where one of its links moves, the places differ (diverged)."""
        self.fixed.update(n for n, c in enumerate(self.now) if c is container)

    def _parent(self, pi: int, root: Any) -> Any:
        return root if pi < 0 else self.now[pi]

    def _columns(self) -> None:
        entries = [(self._parent(pi, root), kind, key, self.now[n]) for n, (pi, root, kind, key, _p) in
                   enumerate(self.links)]
        entries += [(self._parent(pi, root), kind, key, self.now[li]) for li, pi, root, kind, key, _p in self.others]
        self.dicts = columns([(p, k, c) for p, kind, k, c in entries if kind not in _ATTR and isinstance(p, dict)])
        self.items = columns([(p, k, c) for p, kind, k, c in entries if kind not in _ATTR and not isinstance(p, dict)])
        self.attrs = columns([(p, k, c) for p, kind, k, c in entries if kind in _ATTR])

    def same(self) -> bool:
        """Every link and second place holds what it held when last read (and no two places differ)."""
        dicts, items, attrs = self.dicts, self.items, self.attrs  # (inline maps, not a helper: the replay's path)
        try:  # (a dict's entry by dict.get, as read_at: a missing one is None, another object)
            if dicts and not all(map(operator.is_, map(dict.get, dicts[0], dicts[1]), dicts[2])):
                return False
            if items and not all(map(operator.is_, map(operator.getitem, items[0], items[1]), items[2])):
                return False
            return not attrs or all(map(operator.is_, map(getattr, attrs[0], attrs[1]), attrs[2]))
        except Exception:  # an entry deleted, a parent no longer subscriptable
            return False

    def read(self) -> list[Any] | None:
        """Read every linked container again from the roots down: the containers now found (:data:`DELETED` where
        one is not), or None where none moved.  Sets :attr:`diverged` to the path of a second place that holds another
        object than its container's first place (else None)."""
        now: list[Any] = []
        for pi, root, kind, key, _path in self.links:
            parent = root if pi < 0 else now[pi]
            now.append(DELETED if parent is DELETED else read_at(parent, kind, key))
        was = self.now
        self.diverged = next((describe(self.links[n][4]) for n in self.fixed if now[n] is not was[n]), None)
        for li, pi, root, kind, key, path in self.others:
            if self.diverged is not None:
                break
            parent = root if pi < 0 else now[pi]
            if (DELETED if parent is DELETED else read_at(parent, kind, key)) is not now[li]:  # name the one that moved
                self.diverged = describe(self.links[li][4] if now[li] is not was[li] else path)
        for n in self.fixed:  # read in place: stays what the guards read
            now[n] = was[n]
        moved = any(a is not b for a, b in zip(now, was))
        self.now = now
        self._columns()
        return now if moved else None

