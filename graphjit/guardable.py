"""Which Python values a guard compares, and how (:mod:`graphjit.guards` finds them and checks them).

:func:`guardable` says whether a value is compared by ``==`` (numbers, strings, ``None``, enum members, hashable
atoms written in C, tuples and frozensets of these, sets of these by a frozen copy of their contents:
:func:`snapshot`); :func:`by_identity` whether another object held in an attribute, a cell, a global, a list or a
dict is compared as an object instead: by identity first, then by ``==`` (a function, a submodule, a config object, a
tuple holding objects).  What a value's type alone decides is decided once per
type (:class:`~graphjit.reach.ByType` says why).
"""

from __future__ import annotations

import array
import collections
import contextvars
import enum
import marshal
import operator
import threading
import types
import weakref
from collections.abc import Callable
from typing import Any

from . import backends
from .reach import OPAQUE, ByType, tells_class

MAX_TUPLE = 64
MAX_ITEMS = 256
"""A list, dict or set with more items is not guarded item by item (a lookup table: checking it would cost more than
the replay saves); the README's "What a graph remembers" says so."""

SCALARS = (int, float, complex, str, bytes, bool, type(None))
PER_CONTEXT = (contextvars.ContextVar, threading.local)
"""Objects whose values depend on the thread or context reading them (:mod:`graphjit.context_values`)."""
OPAQUE_VALUES = (*OPAQUE, types.CellType, BaseException)
"""Objects neither compared nor walked: code, classes, modules, cells, exceptions."""
opaque = ByType(OPAQUE_VALUES)


def guardable(v: Any, depth: int = 0) -> bool:
    """True if ``v`` is a value a guard compares (see the module docstring).  What ``v``'s type alone decides is
    decided once per type (:class:`~graphjit.reach.ByType` says why); a tuple's, a frozenset's and a set's items,
    and whether an atom written in C hashes, are asked of each value."""
    tp = type(v)
    kind = _KINDS.get(tp)
    if kind is None:
        kind = _kind(tp)
    if kind is _YES:
        return True
    if kind is _NO:
        return False
    if kind is _CONTENTS:
        return _contents(v, depth)
    if kind is _ATOM:
        if backends.for_type(tp) is not None:  # (asked each time: a framework's backend may register later)
            return False
        try:
            hash(v)
        except TypeError:
            return False
        return True  # a hashable atom written in C: torch.dtype, torch.device, numpy scalars
    return _asked(v, depth)


_YES, _NO, _CONTENTS, _ATOM, _ASK = "yes", "no", "contents", "atom", "ask"
_KINDS: dict[type, str] = {}


def _kind(tp: type) -> str:
    """What ``tp`` alone says of its values for :func:`guardable`."""
    if len(_KINDS) >= ByType.MAX_TYPES:
        _KINDS.clear()
    if tells_class(tp):
        kind = _ASK
    elif issubclass(tp, SCALARS) or issubclass(tp, enum.Enum):
        kind = _YES
    elif issubclass(tp, (tuple, frozenset, set)):
        kind = _CONTENTS
    elif issubclass(tp, (list, dict, bytearray)) or issubclass(tp, OPAQUE_VALUES) or issubclass(tp, PER_CONTEXT):
        kind = _NO  # (a ContextVar, a threading.local: walked, their values guarded where read: context_values.py)
    elif any("__dict__" in vars(c) or c.__dict__.get("__slots__") for c in tp.__mro__ if c is not object):
        kind = _NO  # an object: walked, its values guarded one by one
    else:
        kind = _ATOM
    _KINDS[tp] = kind
    return kind


def _contents(v: Any, depth: int) -> bool:
    """:func:`guardable` of a tuple, a frozenset (their items, a few levels deep) or a set (compared by its contents,
    hashable as a set's are, through a frozen copy: :func:`snapshot`; not inside another value)."""
    if isinstance(v, set):
        return depth == 0 and len(v) <= MAX_ITEMS
    return depth < 3 and len(v) <= MAX_TUPLE and all(guardable(e, depth + 1) for e in v)


def _asked(v: Any, depth: int) -> bool:
    """:func:`guardable` of a value whose type says another class is its own (a proxy), asked as ``isinstance``
    asks: through the class it says."""
    if isinstance(v, SCALARS) or isinstance(v, enum.Enum):
        return True
    if isinstance(v, (tuple, frozenset, set)):
        return _contents(v, depth)
    if isinstance(v, (list, dict, bytearray)) or isinstance(v, OPAQUE_VALUES) or backends.for_type(type(v)) is not None:
        return False
    if hasattr(v, "__dict__"):
        return False  # an object: walked, its values guarded one by one
    try:
        hash(v)
    except TypeError:
        return False
    return True


class SetContents(frozenset):  # type: ignore[type-arg]
    """A frozen copy of a set's contents, shown as the set it was (in reasons and key labels)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return repr(set(self))


def snapshot(v: Any) -> Any:
    """What a guard keeps of a guardable value: the value itself, a set as a frozen copy of its contents (a set
    is changed in place: keeping the object would compare it with itself).  ``set == frozenset`` compares contents,
    so a replay's check reads the live set against the copy as it is."""
    return SetContents(v) if isinstance(v, set) else v


TYPED = frozenset((int, float, complex, bool, str, type(None)))
"""The exact types of the values a guard compares by type and bits as well as by value (:func:`typed`)."""


def typed(v: Any) -> bool:
    """``v`` is a plain number, bool, string or None (these exact types) or a tuple (exactly) of such values: a guard
    compares it by its type and bits (``marshal``'s bytes, version 2: no references, so equal values give equal bytes),
    so ``1``, ``1.0`` and ``True`` are three values (a result's dtype follows the Python type), ``0.0`` and ``-0.0``
    two (``1 / x``), a NaN equal to the same NaN.  Any other value is compared by identity, then ``==``."""
    tp = type(v)
    if tp is tuple:
        return all(map(typed, v))
    return tp in TYPED


def same_value(now: Any, was: Any) -> bool:
    """A guard's comparison of a value read now with the value read at capture (see :func:`typed`); may raise."""
    if now is was:
        return True
    if typed(was):
        return typed(now) and marshal.dumps(now, 2) == marshal.dumps(was, 2)
    return bool(now == was)


def by_identity(v: Any, is_tensor: Callable[[Any], bool]) -> bool:
    """True for a value a guard compares as an object: by identity first, then by ``==``, where an exception counts as
    a change (a function, a class, a Module or Layer, a config object, whose ``==`` may compare its fields as a
    dataclass's does, a tuple holding such objects).  Not a tensor (captured by address), nor a list, dict, set or
    deque (their items are guarded one by one), nor a module or a closure cell.  A replay of a graph that used another
    such object (a swapped submodule, a rebound global function, ``m.cfg = dataclasses.replace(m.cfg, k=3)``,
    ``m.cfg = (3, gate)``) would be stale; while the same object stays, nothing but its identity is compared."""
    if _function(v):  # equal only to themselves (a bound method: same function, same object)
        return True
    return not (_module_or_cell(v) or _walked(v) or is_tensor(v) or backends.for_type(type(v)) is not None)


_FUNCTIONS = (types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.BuiltinMethodType)
_function = ByType(_FUNCTIONS)
_module_or_cell = ByType((types.ModuleType, types.CellType))
_walked = ByType((list, dict, set, bytearray, collections.deque))


def hashable(v: Any) -> Any:
    """``v`` as part of a key of read values: itself where it hashes (a :func:`typed` one by its type and bits: values
    a guard tells apart are keys apart), a set as a frozen copy of its contents, a
    tuple item by item (with its type), any other object by its type and identity (the guard holds it, so the
    identity is not reused while the key can be looked up; an equal object of another identity passes the guard's
    ``==`` without a key of its own)."""
    if isinstance(v, tuple) and any(map(backends.is_tensor, v)):
        return (type(v), tuple(map(hashable, v)))  # a tensor's hash is its identity, but its == compares values
    try:
        hash(v)
        if not backends.is_tensor(v):
            return ("typed", marshal.dumps(v, 2)) if typed(v) else v  # 1, 1.0 and True: three keys
    except TypeError:
        pass
    if isinstance(v, set):
        return SetContents(v)
    if isinstance(v, tuple):
        return (type(v), tuple(map(hashable, v)))
    return (type(v), "id", id(v))


class Identity:
    """An object as part of a call's key by identity (an unhashable value inside an argument object): equal only to
    the same object while it lives.  It keeps a weak reference where the object takes one (the key keeps nothing
    alive, and an object later born at the same address is another key); else the object itself (its address is
    not reused while the key lives)."""

    __slots__ = ("_hash", "_ref")

    def __init__(self, obj: Any) -> None:
        self._hash = id(obj)
        try:
            self._ref: Callable[[], Any] = weakref.ref(obj)
        except TypeError:
            self._ref = lambda: obj

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Identity) or other._hash != self._hash:
            return False
        obj = self._ref()
        return obj is not None and obj is other._ref()

    def __repr__(self) -> str:
        return f"<identity {self._hash:#x}>"


SCALAR_TYPES = frozenset((int, float, complex, str, bytes, bool, type(None)))
"""The types of the values :func:`plain` and :func:`settings` count as plain."""


def settings(d: dict[Any, Any]) -> bool:
    """``d`` holds settings: string keys and plain values (numbers, strings, ``None``, and lists, tuples and dicts of
    these, nested a few levels), not a cache a function fills by key (one entry per shape, tensors or objects in its
    values), whose new keys must not end the other graphs."""
    return all(type(k) is str for k in d) and all(plain(v, 0) for v in d.values())


def plain(v: Any, depth: int) -> bool:
    """``v`` is a plain value or a small container of plain values (no tensor, no object), at most 4 levels deep."""
    tp = type(v)
    if tp in SCALAR_TYPES:
        return True
    if depth >= 4 or tp not in (list, tuple, dict) or len(v) > MAX_ITEMS:
        return False
    return all(plain(e, depth + 1) for e in (v.values() if tp is dict else v))


CONTENTS_BYTES = 4096
"""A bytearray, ``array.array`` or numpy array of at most this many bytes is guarded by its contents."""
_TO_BYTES = operator.methodcaller("tobytes")


def contents_of(obj: Any) -> Callable[[Any], Any] | None:
    """For a bytearray, an ``array.array`` or a numpy array of numbers, booleans or dates of at most
    :data:`CONTENTS_BYTES`: the getter of its contents as bytes, which a guard compares whole (one C call, NaN equal to
    itself: ``scales[1] = 0.5`` in place is a change); None for any other value (compared by identity where held)."""
    if isinstance(obj, bytearray):
        return bytes if len(obj) <= CONTENTS_BYTES else None
    if isinstance(obj, array.array):
        return _TO_BYTES if len(obj) * obj.itemsize <= CONTENTS_BYTES else None
    tp = type(obj)
    if tp.__name__ == "ndarray" and tp.__module__ == "numpy" and obj.dtype.kind in "biufcmM" and \
            obj.nbytes <= CONTENTS_BYTES:
        return _TO_BYTES
    return None
