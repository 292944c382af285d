"""The Python values one call changed, of those a function reads without receiving them (:mod:`graphjit.guards`):
a watched warmup call and a capture compare a scan made before the call with the values now.  A function that
writes such a value on every call cannot be replayed (a replay runs its kernels, not its Python code): the caller
refuses it with :data:`graphjit.guards.WRITES`.  Never on the replay path."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .guard_links import read_at
from .guard_set import same, show
from .guardable import MAX_ITEMS, snapshot
from .guards import Scan
from .reach import Path, describe


def written(before: Scan, after: Scan) -> list[tuple[str, str, str]]:
    """``(path, old, new)`` of the guardable values one call changed (or deleted) in containers both scans
    reached, or at the same path of a container the call rebound (``self.state = {"n": n + 1}``), names filter of
    ``after`` applied."""
    old = before.values()
    now = after.values()
    out = []
    # by path first: a container the call rebound (``self.state = {...}``, two swapped) holds what the path reads now;
    # only a path that names one place in both scans (``global 'logger'`` of two modules names two)
    by_path = _unique(old)
    unique_now = _unique(now)
    by_path = {p: v for p, v in by_path.items() if p in unique_now}
    for (cid, key), (value, path) in now.items():
        was = (by_path[path], path) if path in by_path else old.get((cid, key))
        if was is not None and not same(was[0], value):
            out.append((describe(path), show(was[0]), show(value)))
    for (cid, key), (value, path) in old.items():
        box = after.boxes.get(cid)
        if box is not None and key not in box.entries:  # deleted, or now a value no guard compares
            out.append((describe(path), show(value), "(deleted)"))
    return out + _values_set(before)


def _values_set(before: Scan) -> list[tuple[str, str, str]]:
    """``(path, old, new)`` of the ``ContextVar`` values (:mod:`graphjit.context_values`) that differ from ``before``'s
    now (the call set them)."""
    out = []
    for (_oid, what), (var, getter, value, path) in before.wholes.items():
        if what == "value" and not same(value, now := getter(var)):
            out.append((f"value({describe(path)})", show(value), show(now)))
    return out


def _unique(values: dict[tuple[int, Any], tuple[Any, Path]]) -> dict[Path, Any]:
    """``path -> value`` of the paths that name one entry in ``values``."""
    seen: dict[Path, Any] = {}
    twice: set[Path] = set()
    for value, path in values.values():
        if path in seen:
            twice.add(path)
        seen[path] = value
    return {p: v for p, v in seen.items() if p not in twice}


def writes(before: Scan, rescan: Callable[[], Scan]) -> list[tuple[str, str, str]]:
    """:func:`written` of ``before`` and a scan made now (``rescan()``), walking again only where a value may have
    changed.  Each value ``before`` compares is first read again from its container, as the walk reads it but never
    through a container's own methods (``dict.get``, ``list.__getitem__``: no ``__missing__`` runs), and where every
    one is of the same type and equal, its container is a plain ``dict``, ``list`` or tuple (or an object, a class, a
    cell, a module's globals) and no list or dict of the walk grew past what a scan reads item by item, the answer
    is "none" without walking.  The walk compares only containers both scans reach, and stores a value by its type,
    so such a call would find nothing either; anything else takes the walk, whose answer is the one given.  Two
    walks per watched call were most of a call's warmup for a model with many keys (Gemma's graph per position).
    The ``ContextVar`` values ``before`` holds are read again either way (:func:`_values_set`: no walk needed)."""
    if _reads_same(before):
        return _values_set(before)
    return written(before, rescan())


_GONE = object()
_PLAIN_ITEMS = (dict, list, tuple)


def _reads_same(before: Scan) -> bool:
    for parent, kind, key, child, _path in before.links.values():  # a list or dict rebound: the walk decides
        if read_at(parent, kind, key) is not child:
            return False
    boxes = before.boxes
    sized: set[int] = set()
    for (cid, key), (value, _path) in before.values().items():
        box = boxes[cid]
        container = box.container
        kind = box.kind
        try:
            if kind == "cell":
                now = container.cell_contents
            elif kind == "attr":  # as the scan read it: a class's own dict, an instance's slot
                now = vars(container)[key] if isinstance(container, type) else object.__getattribute__(container, key)
            else:
                tp = type(container)
                if tp not in _PLAIN_ITEMS:
                    return False  # a subclass (its own items(), __iter__, __missing__): the walk decides
                if tp is tuple:
                    now = tuple.__getitem__(container, key)
                else:
                    if kind == "item" and box.owner is None and cid not in sized:  # a list or dict the walk walked
                        sized.add(cid)
                        if len(container) > MAX_ITEMS:
                            return False  # the walk reads no item of it now: it would see these as deleted
                    now = dict.get(container, key, _GONE) if tp is dict else list.__getitem__(container, key)
                    if now is _GONE:
                        return False
        except Exception:
            return False
        now = snapshot(now)
        if type(now) is not type(value) or not same(value, now):
            return False  # another type may be one the walk does not store (b"ab" -> bytearray(b"ab"))
    return True
