"""The structure of a walked call, as the replay lane's C check takes it (``csrc/lane_checks.c``'s ``WalkCheck``), so
that :meth:`keys.Signer.sign_walk` can sign a call like the last walked one (a decode step of a Hugging Face model: its
cache object, its layers, their tensors and sizes) in one C call instead of walking its arguments in Python.

:func:`spec_of_call` describes each argument as the walk (``keys._WalkState.leaf``) saw it: a tensor of its exact
type; a value of its exact type and value (and, but for a plain scalar, its hash: a key is found by its hash as well as
by ``==``); a list or tuple, a dict (its keys with their hashes), an object walked
attribute by attribute (its ``__dict__`` keys in order, its slots), each with its items.  A call whose arguments match
the spec in every one of those, whose owner and modes are the key's and whose tensors pass the key's metadata check
would get the same key from the walk: the walk reads nothing else.  It refuses (None) what it does not describe, and
the walk keeps signing those calls: buckets, sets, deques, slices, a list or tuple subclass iterated its own way, a
``__dict__`` that is not a dict, an unhashable value inside an object (keyed by identity), a cycle, nesting deeper
than :data:`MAX_DEPTH` (containers and objects alike).  A dict subclass (transformers' ``ModelOutput``, an
``OrderedDict``) is described by what its own ``items()`` gives, as the walk reads it, and by its attributes
(:func:`tree.dict_attrs`: a mirror of an item stands for it).
"""

from __future__ import annotations

import collections
import math
from typing import Any

from . import backends
from .guardable import PER_CONTEXT
from .tree import MIRROR, dict_attrs, is_object, object_layout

TENSOR, VALUE, SEQUENCE, DICT, OBJECT, FREE, MIRROR_SPEC = 0, 1, 2, 3, 4, 5, 6


class SignedZero(float):
    """A float zero as a key holds it (:func:`part`): equal only to a float zero of its sign and hashing by it
    (``0.0 == -0.0`` in Python, but ``1 / x`` tells them apart, so they are two keys), shown as the float.  The C
    checks (csrc/lane_checks.c) compare a call's float with it by ``==``, which asks this class first."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        return (type(other) is float or type(other) is SignedZero) and float.__eq__(other, 0.0) is True and \
            math.copysign(1.0, other) == math.copysign(1.0, self)  # type: ignore[arg-type]

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:
        return hash(("graphjit zero", math.copysign(1.0, self)))


def part(x: float) -> float:
    """A float argument's value as a key holds it: itself, but a zero as a :class:`SignedZero` (of its sign)."""
    return SignedZero(x) if x == 0.0 else x
MAX_DEPTH = 32  # csrc/lane.c SPEC_DEPTH
_SCALARS = frozenset((int, float, bool, str, bytes, type(None), complex))  # keys._SCALARS: keyed without a hash


class _Unsupported(Exception):
    """A value the spec does not describe: the walk keeps signing the call."""


class _Walk:
    """One spec being made: the framework, the objects on the path (a cycle), the key paths of free values (ints that
    may change: :func:`counters`) and those found, in the walk's order."""

    __slots__ = ("backend", "found", "free", "path")

    def __init__(self, backend: Any, free: frozenset[tuple[int, ...]]) -> None:
        self.backend, self.free = backend, free
        self.path: list[int] = []
        self.found: list[tuple[int, ...]] = []


def spec_of_call(args: tuple[Any, ...], kwargs: dict[str, Any], backend: Any,
                 free: frozenset[tuple[int, ...]] = frozenset()) -> tuple[Any, Any, list[tuple[int, ...]]] | None:
    """``(one spec per positional argument, ((name, spec), ...) sorted by name, the key paths of its free values)`` of
    a call the walk signed with ``backend``'s tensors, or None where some argument has a part the spec does not
    describe (see the module docstring).  A value other than a plain scalar, and a dict key, carries its hash: the key
    is found by it.  An ``int`` whose place in the key (a path of indices, as :func:`counters` gives it) is in
    ``free`` is described by its type alone: the C check gathers its value, and the key is made with it."""
    walk = _Walk(backend, free)
    n = len(args)
    try:
        specs = tuple(_spec(a, walk, (1 + i,), 0) for i, a in enumerate(args))
        named = tuple((name, _spec(kwargs[name], walk, (1 + n + j, 1), 0)) for j, name in enumerate(sorted(kwargs)))
    except (_Unsupported, RecursionError):
        return None
    return specs, named, walk.found


def _scalar(x: Any, tp: type, walk: _Walk, value_path: tuple[int, ...]) -> Any:
    if tp is int and value_path in walk.free:
        walk.found.append(value_path)
        return (FREE, int)
    return (VALUE, tp, part(x) if tp is float else x, None)  # equal values of these types hash alike


def _spec(x: Any, walk: _Walk, kpath: tuple[int, ...], depth: int) -> Any:
    """``x``'s spec; ``kpath``: where the walk's part for ``x`` is in the key."""
    if depth >= MAX_DEPTH:
        raise _Unsupported("too deep")
    tp = type(x)
    if tp in _SCALARS:
        return _scalar(x, tp, walk, (*kpath, 1))  # the walk's part: (type, value)
    if tp is slice:
        raise _Unsupported("a slice")
    found = backends.for_type(tp)
    if found is not None:
        if found is not walk.backend:
            raise _Unsupported("a tensor of another framework")
        return (TENSOR, tp)
    if isinstance(x, (tuple, list)):  # (type, (item parts...))
        if tp not in (tuple, list) and tp.__iter__ not in (tuple.__iter__, list.__iter__):
            raise _Unsupported("a sequence iterated its own way")
        return (SEQUENCE, tp, tuple(_spec(e, walk, (*kpath, 1, i), depth + 1) for i, e in enumerate(x)))
    if isinstance(x, (collections.deque, set)):
        raise _Unsupported("a deque or a set")
    if isinstance(x, dict):  # a subclass (transformers' ModelOutput, an OrderedDict) by its own items(), as walked
        keys, hashes, values = _items(x, walk, kpath, depth)
        if tp is dict:
            return (DICT, tp, keys, hashes, values)
        return (DICT, tp, keys, hashes, values, *_attrs(x, walk, kpath, depth))
    if isinstance(x, PER_CONTEXT):
        raise _Unsupported("a ContextVar or a threading.local (keyed by what the calling one holds)")
    if is_object(tp):
        return _object(x, tp, walk, kpath, depth)
    try:
        h = hash(x)
    except TypeError:
        raise _Unsupported("an unhashable value") from None
    return (VALUE, tp, x, h)


def _items(d: dict[Any, Any], walk: _Walk, kpath: tuple[int, ...],
           depth: int) -> tuple[tuple[Any, ...], tuple[int, ...], tuple[Any, ...]]:
    """A dict's keys, their hashes and its values' specs; the walk's part: (type, (((key type, key), value part),
    ...))."""
    items = list(d.items())  # as the walk takes them
    return (tuple(k for k, _v in items), tuple(hash(k) for k, _v in items),
            tuple(_spec(v, walk, (*kpath, 1, i, 1), depth + 1) for i, (_k, v) in enumerate(items)))


def _attrs(d: dict[Any, Any], walk: _Walk, kpath: tuple[int, ...], depth: int) -> tuple[Any, Any, Any]:
    """A dict subclass's attributes (:func:`tree.dict_attrs`): their names (None: it has none), their hashes and their
    specs, a mirror's ``(MIRROR, None)``; the walk's part: (type, items part, ((name, MIRROR or value part), ...))."""
    attrs = dict_attrs(d)
    if not attrs:
        return None, (), ()
    if id(d) in walk.path:
        raise _Unsupported("a cycle")
    walk.path.append(id(d))
    try:
        return (tuple(n for n, _v in attrs), tuple(hash(n) for n, _v in attrs),
                tuple((MIRROR_SPEC, None) if v is MIRROR else _spec(v, walk, (*kpath, 2, i, 1), depth + 1)
                      for i, (_n, v) in enumerate(attrs)))
    finally:
        walk.path.pop()


def _object(x: Any, tp: type, walk: _Walk, kpath: tuple[int, ...], depth: int) -> Any:
    """An object's spec; the walk's part: (type, field part...), a field part (name, type, value) for a plain scalar,
    else (name, value part), for each attribute present (its __dict__ items, then its slots that are set)."""
    if id(x) in walk.path:
        raise _Unsupported("a cycle")
    walk.path.append(id(x))
    try:
        use_dict, names = object_layout(tp)
        keys: tuple[Any, ...] | None = None
        hashes: tuple[int, ...] = ()
        values: list[Any] = []
        at = 1  # the next field part's index in the object's part
        if use_dict:
            d = getattr(x, "__dict__", None)
            if type(d) is not dict:
                raise _Unsupported("a __dict__ that is not a dict")
            items = list(d.items())
            keys, hashes = tuple(k for k, _v in items), tuple(hash(k) for k, _v in items)
            for _k, v in items:
                values.append(_field(v, walk, (*kpath, at), depth))
                at += 1
        slots: list[Any] = []
        for name in names:
            try:
                v = getattr(x, name)
            except AttributeError:
                slots.append(None)
                continue
            slots.append(_field(v, walk, (*kpath, at), depth))
            at += 1
        return (OBJECT, tp, keys, hashes, tuple(values), tuple(names), tuple(slots))
    finally:
        walk.path.pop()


def _field(v: Any, walk: _Walk, fpath: tuple[int, ...], depth: int) -> Any:
    tp = type(v)
    if tp in _SCALARS:
        return _scalar(v, tp, walk, (*fpath, 2))  # (name, type, value)
    return _spec(v, walk, (*fpath, 1), depth + 1)  # (name, value part)


def counters(before: tuple[Any, ...], after: tuple[Any, ...]) -> frozenset[tuple[int, ...]] | None:
    """The paths (indices into the key's nested tuples) of the ints in which two walked keys differ, where they differ
    in nothing else (a cache layer's counter that every call advances), each where the walk keyed a plain int
    (``(int, value)`` or ``(name, int, value)``); None where they differ otherwise or not at all."""
    found: list[tuple[int, ...]] = []
    try:
        if not _differ_in_ints(before, after, (), found):
            return None
    except Exception:  # a comparison that fails: no counters
        return None
    return frozenset(found) if found else None


def _differ_in_ints(a: Any, b: Any, path: tuple[int, ...], found: list[tuple[int, ...]]) -> bool:
    if type(a) is not type(b) or not isinstance(a, tuple) or len(a) != len(b):
        return False
    for i, (x, y) in enumerate(zip(a, b)):
        if x is y or (type(x) is type(y) and x == y):
            continue
        if type(x) is int and type(y) is int and i >= 1 and a[i - 1] is int and b[i - 1] is int:
            found.append((*path, i))
        elif type(x) is tuple and not _differ_in_ints(x, y, (*path, i), found):
            return False
        elif type(x) is not tuple:
            return False
    return True


def key_maker(key: tuple[Any, ...], paths: list[tuple[int, ...]]) -> Any:
    """A function of the free values (in the order of ``paths``) that gives ``key``'s parts with those values put at
    their paths (each tuple on the way made again, the rest shared)."""
    tree: dict[int, Any] = {}
    for n, path in enumerate(paths):
        node = tree
        for i in path[:-1]:
            node = node.setdefault(i, {})
        node[path[-1]] = n

    def rebuild(t: tuple[Any, ...], node: dict[int, Any], values: list[Any]) -> tuple[Any, ...]:
        items = list(t)
        for i, sub in node.items():
            items[i] = values[sub] if type(sub) is int else rebuild(t[i], sub, values)
        return tuple(items)

    def make(values: list[Any]) -> tuple[Any, ...]:
        return rebuild(key, tree, values)

    return make
