"""Values that live per thread or per context: a ``contextvars.ContextVar``'s value and a ``threading.local``'s
attributes (:func:`graphjit.guards.scan` meets them among the objects a function reaches).

A graph froze what its capture read through them (``x * SCALE.get()``, ``x * tls.k``), and neither is an attribute of
an object's ``__dict__``: a ``ContextVar`` holds no attributes at all and a ``threading.local`` keeps each thread's
attributes apart from the object's own (empty) ``__dict__``, so the walk of objects saw nothing to guard and a replay
after ``SCALE.set(5.0)`` or ``tls.k = 7.0`` returned the old value's result.  Guaranteed here: a ``ContextVar`` the
call's code may ``get`` or ``set`` is guarded by its value in the context where the check runs (:func:`context_value`:
a value a guard compares as it is, any other object by identity, an unset variable as :data:`ABSENT`), and the object
it holds is walked as any other; a ``threading.local`` is walked as any object, its ``__dict__`` read through
:class:`ThreadAttributes`, so each check reads the calling thread's attributes (another thread's values are another
graph's, or no graph's), names it finds absent stay absent there, and its class and slots are guarded as any class's.
A function that sets a ``ContextVar`` on every call writes a value (:mod:`graphjit.py_writes`): it runs uncaptured.
One passed as an argument is keyed by what it holds in the calling context or thread (:func:`held`).
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from .guardable import PER_CONTEXT, Identity, guardable, hashable, snapshot

if TYPE_CHECKING:
    from .guards import Scan
    from .reach import Path


class _Absent:
    __slots__ = ()

    def __repr__(self) -> str:
        return "<unset>"


ABSENT = _Absent()
"""What :func:`context_value` gives for a ``ContextVar`` without a value (nor a default) in the calling context."""


def context_value(var: contextvars.ContextVar[Any]) -> Any:
    """``var``'s value in the calling context as a guard compares it: a value :func:`guardable` accepts as itself (a
    set as a frozen copy), any other object by its identity (:class:`~graphjit.guardable.Identity`), :data:`ABSENT`
    where it has none."""
    return _compared(current(var))


def _compared(value: Any) -> Any:
    """``value`` as a guard compares it: itself (a set as a frozen copy) where :func:`guardable` accepts it,
    :data:`ABSENT` as it is, any other object by its identity."""
    return value if value is ABSENT else snapshot(value) if guardable(value) else Identity(value)


def current(var: contextvars.ContextVar[Any]) -> Any:
    """``var``'s value in the calling context, :data:`ABSENT` where it has none."""
    try:
        return var.get()
    except LookupError:
        return ABSENT


def attributes(obj: Any) -> dict[str, Any] | None:
    """A ``threading.local``'s attributes of the calling thread (the dict itself), None for anything else."""
    if not isinstance(obj, threading.local):
        return None
    try:
        d = threading.local.__getattribute__(obj, "__dict__")
    except AttributeError:
        return None
    return d if isinstance(d, dict) else None


def held(obj: Any) -> Any:
    """What a ``ContextVar`` (its value) or a ``threading.local`` (the calling thread's attributes) passed as an
    argument is keyed by (:mod:`graphjit.keys`): each value as a guard compares it, a value by itself, any other object
    (a tensor, a config) by its identity, never walked (a tensor there is no input: the graph reads it where it is)."""
    if isinstance(obj, contextvars.ContextVar):
        return hashable(_compared(current(obj)))
    return tuple((k, hashable(_compared(v))) for k, v in sorted((attributes(obj) or {}).items(),
                                                               key=lambda kv: str(kv[0])))


def per_context(obj: Any) -> bool:
    """``obj`` is a ``ContextVar`` or a ``threading.local`` (:data:`~graphjit.guardable.PER_CONTEXT`)."""
    return isinstance(obj, PER_CONTEXT)


class ThreadAttributes:
    """A ``threading.local``'s attributes as the guards read an object's ``__dict__``, in whichever thread reads them
    (the object's own ``__dict__`` is empty): ``view[k]``, ``k in view``, ``get``, ``items``, ``keys`` (itself: a
    live view, ``isdisjoint``), iteration.  Read only."""

    __slots__ = ("local",)

    def __init__(self, local: threading.local) -> None:
        self.local = local

    def _now(self) -> dict[str, Any]:
        return attributes(self.local) or {}

    def __getitem__(self, key: str) -> Any:
        return self._now()[key]

    def __contains__(self, key: object) -> bool:
        return key in self._now()

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._now()))

    def __len__(self) -> int:
        return len(self._now())

    def get(self, key: str, default: Any = None) -> Any:
        return self._now().get(key, default)

    def items(self) -> list[tuple[str, Any]]:
        return list(self._now().items())

    def keys(self) -> ThreadAttributes:
        return self

    def isdisjoint(self, names: Iterable[Any]) -> bool:
        return self._now().keys().isdisjoint(names)


def object_dict(obj: Any) -> Any:
    """What the guards read as ``obj``'s ``__dict__``: a :class:`ThreadAttributes` of a ``threading.local``, else
    None (the object's own, :func:`graphjit.reach.instance_dict`)."""
    return ThreadAttributes(obj) if isinstance(obj, threading.local) else None


_USED = frozenset(("get", "set", "reset"))


def scan_into(obj: Any, path: Path, out: Scan, push: Callable[..., None]) -> bool:
    """Where ``obj`` is a ``ContextVar`` (met at ``path``): its value, where the code that ran names ``get``, ``set`` or
    ``reset``, added to
    ``out`` (shown as ``value(path)``), the object it holds handed to ``push`` (``push(child, path, at=None)``); True.
    False for anything else (a ``threading.local`` is walked as an object, through :func:`object_dict`)."""
    if not isinstance(obj, contextvars.ContextVar):
        return False
    if not out.names.isdisjoint(_USED):  # (code that only sets it: its writes are a value too, py_writes.py)
        out.wholes.setdefault((id(obj), "value"), (obj, context_value, context_value(obj), path))
        value = current(obj)
        if value is not ABSENT and not guardable(value):  # what it holds, walked (``.get().bias``)
            push(value, (*path, (".", "get"), ("()", None)), at=None)
    return True
