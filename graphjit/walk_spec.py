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
``OrderedDict``) is described by what its own ``items()`` gives, as the walk reads it.
"""

from __future__ import annotations

import collections
from typing import Any

from . import backends
from .tree import is_object, object_layout

TENSOR, VALUE, SEQUENCE, DICT, OBJECT = 0, 1, 2, 3, 4
MAX_DEPTH = 32  # csrc/lane.c SPEC_DEPTH
_SCALARS = frozenset((int, float, bool, str, bytes, type(None), complex))  # keys._SCALARS: keyed without a hash


class _Unsupported(Exception):
    """A value the spec does not describe: the walk keeps signing the call."""


def spec_of_call(args: tuple[Any, ...], kwargs: dict[str, Any],
                 backend: Any) -> tuple[tuple[Any, ...], tuple[tuple[str, Any], ...]] | None:
    """``(one spec per positional argument, ((name, spec), ...) sorted by name)`` of a call the walk signed with
    ``backend``'s tensors, or None where some argument has a part the spec does not describe (see the module
    docstring).  A value other than a plain scalar, and a dict key, carries its hash: the key is found by it."""
    try:
        path: list[int] = []
        return (tuple(_spec(a, backend, path, 0) for a in args),
                tuple((name, _spec(kwargs[name], backend, path, 0)) for name in sorted(kwargs)))
    except (_Unsupported, RecursionError):
        return None


def _spec(x: Any, backend: Any, path: list[int], depth: int) -> Any:
    if depth >= MAX_DEPTH:
        raise _Unsupported("too deep")
    tp = type(x)
    if tp in _SCALARS:
        return (VALUE, tp, x, None)  # equal values of these types hash alike
    if tp is slice:
        raise _Unsupported("a slice")
    found = backends.for_type(tp)
    if found is not None:
        if found is not backend:
            raise _Unsupported("a tensor of another framework")
        return (TENSOR, tp)
    if isinstance(x, (tuple, list)):
        if tp not in (tuple, list) and tp.__iter__ not in (tuple.__iter__, list.__iter__):
            raise _Unsupported("a sequence iterated its own way")
        return (SEQUENCE, tp, tuple(_spec(e, backend, path, depth + 1) for e in x))
    if isinstance(x, (collections.deque, set)):
        raise _Unsupported("a deque or a set")
    if isinstance(x, dict):  # a subclass (transformers' ModelOutput, an OrderedDict) by its own items(), as walked
        keys, hashes, values = _items(x, backend, path, depth)
        return (DICT, tp, keys, hashes, values)
    if is_object(tp):
        return _object(x, tp, backend, path, depth)
    try:
        h = hash(x)
    except TypeError:
        raise _Unsupported("an unhashable value") from None
    return (VALUE, tp, x, h)


def _items(d: dict[Any, Any], backend: Any, path: list[int],
           depth: int) -> tuple[tuple[Any, ...], tuple[int, ...], tuple[Any, ...]]:
    items = list(d.items())  # as the walk takes them
    return (tuple(k for k, _v in items), tuple(hash(k) for k, _v in items),
            tuple(_spec(v, backend, path, depth + 1) for _k, v in items))


def _object(x: Any, tp: type, backend: Any, path: list[int], depth: int) -> Any:
    if id(x) in path:
        raise _Unsupported("a cycle")
    path.append(id(x))
    try:
        use_dict, names = object_layout(tp)
        keys: tuple[Any, ...] | None = None
        hashes: tuple[int, ...] = ()
        values: tuple[Any, ...] = ()
        if use_dict:
            d = getattr(x, "__dict__", None)
            if type(d) is not dict:
                raise _Unsupported("a __dict__ that is not a dict")
            keys, hashes, values = _items(d, backend, path, depth)
        slots: list[Any] = []
        for name in names:
            try:
                v = getattr(x, name)
            except AttributeError:
                slots.append(None)
                continue
            slots.append(_spec(v, backend, path, depth + 1))
        return (OBJECT, tp, keys, hashes, values, tuple(names), tuple(slots))
    finally:
        path.pop()
