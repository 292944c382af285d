"""Values that live per thread or per context: a ``contextvars.ContextVar``'s value and a ``threading.local``'s
attributes (:func:`graphjit.guards.scan` meets them among the objects a function reaches).

A graph froze what its capture read through them (``x * SCALE.get()``, ``x * tls.k``), and neither is an attribute of
an object's ``__dict__``: a ``ContextVar`` holds no attributes at all and a ``threading.local`` keeps each thread's
attributes apart from the object's own (empty) ``__dict__``, so the walk of objects saw nothing to guard and a replay
after ``SCALE.set(5.0)`` or ``tls.k = 7.0`` returned the old value's result.  Guaranteed here: a ``ContextVar`` the
call's code may ``get`` is guarded by its value in the context where the check runs (:func:`context_value`: a value a
guard compares as it is, any other object by identity, an unset variable as :data:`ABSENT`), and the object it holds is
walked as any other; a ``threading.local``'s attributes the code names are guarded by ``getattr`` on the object itself,
so each check reads the calling thread's (another thread's values are another graph's, or no graph's).  Not seen: a
tensor held only through either (its address is captured, a rebound one is not pinned).
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .guard_sources import pinnable
from .guardable import PER_CONTEXT, Identity, by_identity, guardable, snapshot

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
    value = current(var)
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


def per_context(obj: Any) -> bool:
    """``obj`` is a ``ContextVar`` or a ``threading.local`` (:data:`~graphjit.guardable.PER_CONTEXT`)."""
    return isinstance(obj, PER_CONTEXT)


def scan_into(obj: Any, path: Path, named: frozenset[str] | None, out: Scan, pins: bool,
              is_tensor: Callable[[Any], bool], push: Callable[..., None]) -> None:
    """What the walk guards of ``obj`` (:func:`per_context`, met at ``path``), added to ``out``: a ``ContextVar``'s
    value (where the code that ran names ``get``), shown as ``value(path)``, the object it holds handed to ``push``;
    a ``threading.local``'s attributes of the calling thread that ``named`` allows (None: all), read by ``getattr``,
    a tensor pinned where ``pins``, the objects handed to ``push`` (``push(child, path, at=(parent, kind, key) or
    None)``)."""
    if isinstance(obj, contextvars.ContextVar):
        if "get" not in out.names:
            return
        out.wholes.setdefault((id(obj), "value"), (obj, context_value, context_value(obj), path))
        value = current(obj)
        if value is not ABSENT and not guardable(value):  # what it holds, walked (``.get().bias``)
            push(value, (*path, (".", "get"), ("()", None)), at=None)
        return
    for k, child in list((attributes(obj) or {}).items()):
        if not isinstance(k, str) or (named is not None and k not in named):
            continue
        where = (*path, (".", k))
        if guardable(child) or by_identity(child, is_tensor):
            out.add(obj, "attr", k, child, where)
        elif pins and pinnable(child):
            out.pin(obj, "attr", k, child, where)
        if not guardable(child):
            push(child, where, at=(obj, "attr", k))
