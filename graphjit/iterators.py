"""Whether a call advanced an iterator it reaches without receiving it: a generator, a ``list``/``dict``/``range``
iterator, ``itertools.count()``, held in a global, a closure cell or an object (``next(batches)`` in a step).  A
replay runs no Python, so it would not advance it, and a capture's run would take one item more than the calls made
(before, such a key's capture took an item, verify failed, and the function ran uncaptured one item ahead for good).
Such a key runs uncaptured from its first watched call on (:data:`REASON`), before any capture or extra run.

Framework-free.  The walk of the function's state (:func:`graphjit.reach.walk`) lists the iterators it meets
(:func:`kind`: generators, and iterators written in C that pickle their position); :func:`position` reads each one's
place before and after every watched call; an iterator over another (``map``, ``zip``, ``itertools.cycle``,
``chain``, ``islice``) by the places of the iterators it holds, :data:`MAX_NESTING` deep.  Not seen: an iterator class
written in Python (its attributes are values the guards compare: :mod:`graphjit.py_writes`), one that does not say its
position (a C iterator that does not pickle), one an island advances (it runs on every call).
"""

from __future__ import annotations

import types
from typing import Any

REASON = "advances an iterator on every call"

_SCALARS = (int, float, str, bytes, bool, type(None))
_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made by a class statement (as graphjit.tree reads it)
_KINDS: dict[type, str | None] = {}


def kind(tp: type) -> str | None:
    """``"generator"``, ``"reduce"`` (an iterator written in C: ``__next__`` and no ``__dict__``), or None."""
    found = _KINDS.get(tp, "")
    if found == "":
        if len(_KINDS) > 4096:
            _KINDS.clear()
        found = _KINDS[tp] = "generator" if tp is types.GeneratorType else (
            "reduce" if hasattr(tp, "__next__") and not tp.__dictoffset__ and not tp.__flags__ & _HEAPTYPE else None)
    return found


MAX_NESTING = 4
"""How many iterators deep a position looks into the iterators an iterator holds (``zip(map(f, a), b)``: two)."""


def _atom(v: Any, depth: int) -> Any:
    """A part of a position: a plain value as it is, a list or tuple by its length (a ``dict`` iterator's remaining
    items are a new list each time), an iterator by its own position (a ``map``'s or a ``cycle``'s inner iterator,
    :data:`MAX_NESTING` deep), any other object by its identity."""
    tp = type(v)
    if tp in _SCALARS:
        return v
    if tp in (list, tuple):
        return (tp.__name__, len(v))
    if tp is range:  # (a range iterator's pickle makes a new range each time: by its bounds, not its identity)
        return ("range", v.start, v.stop, v.step)
    if depth < MAX_NESTING and kind(tp) is not None:
        return ("in", position(v, depth + 1))
    return ("id", id(v))


def position(it: Any, depth: int = 0) -> Any:
    """Where ``it`` stands now, as a value that differs once it has advanced (None where it cannot say; ``depth``:
    how deep inside another iterator ``it`` is)."""
    try:
        if type(it) is types.GeneratorType:
            frame = it.gi_frame
            if frame is None:
                return ("done",)
            inner = it.gi_yieldfrom  # (``yield from data``: the place is the inner iterator's)
            return ("at", frame.f_lasti, tuple(_atom(v, depth) for v in frame.f_locals.values()),
                    None if inner is None else position(inner, depth + 1))
        reduced = it.__reduce__()
        parts = [reduced[0], *reduced[1]] if len(reduced) > 1 else list(reduced)
        for state in reduced[2:]:  # (a state tuple, as ``chain``'s (source, active), by its members)
            parts.extend(state if type(state) is tuple else (state,))
        return tuple(_atom(p, depth) for p in parts)
    except Exception:  # (a C iterator that does not pickle)
        return None


def positions(found: list[tuple[Any, str]]) -> list[Any]:
    """:func:`position` of each iterator in ``found`` (``(iterator, path)``), in order."""
    return [position(it) for it, _path in found]


def advanced(found: list[tuple[Any, str]], before: list[Any]) -> list[str]:
    """The paths of the iterators of ``found`` whose position differs from ``before`` (:func:`positions`)."""
    return [path for (it, path), was in zip(found, before) if was is not None and position(it) != was]
