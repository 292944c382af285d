"""The tree of a call's arguments and of a function's outputs: which values are containers, and how
to take their tensors out (:func:`collect_tensors`) and put others in (:func:`rebuild`).

Containers are lists, tuples, dicts and deques, subclasses included (each rebuilt as its own type:
NamedTuples, ``OrderedDict``, ``defaultdict`` with its factory, a ``deque`` with its ``maxlen``, a user's
dict or list subclass with its attributes), and *objects that hold tensors*: dataclass instances and plain
objects (with ``__dict__`` or ``__slots__``) whose type does not define its own equality.  Their attributes
are walked like a dict's values, in the order :func:`object_fields` lists them.  Not walked: value types (a
type with its own ``__eq__`` and ``__hash__``: ``torch.dtype``, enums, frozensets), the framework's stateful
objects (``nn.Module`` / ``paddle.nn.Layer``, optimizers, learning-rate schedulers, gradient scalers: their
tensors are state, captured by address, and the key holds them by identity), functions, classes and
modules.  A container that cannot be rebuilt as its own type raises a :class:`SignatureError`
naming it (a capture turns it into an uncaptured key).

The walks are module-level functions, not recursive closures: a closure that calls itself is a
reference cycle, and it would keep the tensors it collects alive until the garbage collector runs.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import enum
import functools
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from . import backends
from .errors import SignatureError

_CONTAINERS = (list, tuple, dict, set, frozenset, collections.deque)
_SEQUENCES = (list, tuple, collections.deque)
_NOT_OBJECTS = (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
                functools.partial, enum.Enum, BaseException, *_CONTAINERS)
_KIND: dict[type, bool] = {}


class Attr(str):
    """An attribute name in a leaf's label (printed ``.name``, where a subscript prints ``[key]``)."""

    __slots__ = ()


def is_object(tp: type) -> bool:
    """True if values of type ``tp`` are walked attribute by attribute (see the module docstring)."""
    kind = _KIND.get(tp)
    if kind is None:
        kind = _KIND[tp] = _classify(tp)
    return kind


def _classify(tp: type) -> bool:
    if issubclass(tp, _NOT_OBJECTS) or backends.identity_keyed(tp):
        return False
    if dataclasses.is_dataclass(tp):
        return True
    has_dict = "__dict__" in dir(tp) and not tp.__dict__.get("__slots__")
    has_slots = any(c.__dict__.get("__slots__") for c in tp.__mro__ if c is not object)
    if not (has_dict or has_slots):
        return False  # a C type (numpy arrays, locks, dtypes): hashed by value or identity as it says
    return tp.__eq__ is object.__eq__ or tp.__hash__ is None  # value types stay values


_LAYOUT: dict[type, tuple[bool, tuple[str, ...]]] = {}


def _layout(tp: type) -> tuple[bool, tuple[str, ...]]:
    """``(read __dict__, fixed attribute names)`` of an object type: a dataclass's fields, else the
    instance dict followed by the ``__slots__`` of the class and its bases."""
    layout = _LAYOUT.get(tp)
    if layout is None:
        if dataclasses.is_dataclass(tp):
            layout = (False, tuple(f.name for f in dataclasses.fields(tp)))
        else:
            slots: list[str] = []
            for cls in tp.__mro__:
                own = cls.__dict__.get("__slots__", ())
                names = (own,) if isinstance(own, str) else own
                slots.extend(n for n in names if n not in ("__dict__", "__weakref__"))
            layout = ("__dict__" in dir(tp), tuple(slots))
        _LAYOUT[tp] = layout
    return layout


def object_fields(x: Any) -> list[tuple[str, Any]]:
    """The attributes of an object that :func:`is_object` accepts, in a fixed order."""
    use_dict, names = _layout(type(x))
    out: list[tuple[str, Any]] = []
    if use_dict:
        d = getattr(x, "__dict__", None)
        if isinstance(d, dict):
            out.extend(d.items())
    for name in names:
        try:
            out.append((name, getattr(x, name)))
        except AttributeError:  # an unset slot
            continue
    return out


def collect_tensors(obj: Any, is_tensor: Callable[[Any], bool]) -> list[Any]:
    """The tensor leaves of ``obj`` in the order :func:`rebuild` replaces them."""
    found: list[Any] = []
    _collect(obj, is_tensor, found, set())
    return found


def _collect(x: Any, is_tensor: Callable[[Any], bool], found: list[Any], visiting: set[int]) -> None:
    if is_tensor(x):
        found.append(x)
    elif isinstance(x, _SEQUENCES):
        for e in x:
            _collect(e, is_tensor, found, visiting)
    elif isinstance(x, dict):
        for v in x.values():
            _collect(v, is_tensor, found, visiting)
    elif is_object(type(x)) and id(x) not in visiting:
        visiting.add(id(x))
        for _name, v in object_fields(x):
            _collect(v, is_tensor, found, visiting)
        visiting.discard(id(x))


_TENSOR = object()


def structure(obj: Any, is_tensor: Callable[[Any], bool]) -> Any:
    """A comparable description of ``obj`` without its tensors: container and object types, keys and
    attribute names, and the other leaves (by value when hashable, by type otherwise)."""
    return _structure(obj, is_tensor, set())


def _structure(x: Any, is_tensor: Callable[[Any], bool], visiting: set[int]) -> Any:
    if is_tensor(x):
        return _TENSOR
    if isinstance(x, _SEQUENCES):
        return (type(x), tuple(_structure(e, is_tensor, visiting) for e in x))
    if isinstance(x, dict):
        return (type(x), tuple((k, _structure(v, is_tensor, visiting)) for k, v in x.items()))
    if is_object(type(x)) and id(x) not in visiting:
        visiting.add(id(x))
        out = (type(x), tuple((n, _structure(v, is_tensor, visiting)) for n, v in object_fields(x)))
        visiting.discard(id(x))
        return out
    try:
        hash(x)
    except TypeError:
        return ("unhashable", type(x))
    return x


def rebuild(obj: Any, tensors: Sequence[Any], is_tensor: Callable[[Any], bool]) -> Any:
    """``obj`` with its tensor leaves replaced, in :func:`collect_tensors` order, by ``tensors``.

    Containers are rebuilt; an object is shallow-copied with the attributes that changed set on the
    copy (the original is never modified), or returned as it is when no tensor under it changed (a
    cache object whose tensors are put back as themselves is the caller's own object again, lists of
    layers and all).
    """
    return _rebuild(obj, iter(tensors), is_tensor, set())[0]


def _rebuild(x: Any, it: Iterator[Any], is_tensor: Callable[[Any], bool], visiting: set[int]) -> tuple[Any, bool]:
    """``(rebuilt x, whether every tensor under x was put back as itself)``."""
    if is_tensor(x):
        t = next(it)
        return t, t is x
    if isinstance(x, dict):
        pairs = [(k, _rebuild(v, it, is_tensor, visiting)) for k, v in x.items()]
        return _own_type(x, [(k, v) for k, (v, _same) in pairs]), all(same for _k, (_v, same) in pairs)
    if isinstance(x, _SEQUENCES):
        parts = [_rebuild(e, it, is_tensor, visiting) for e in x]
        items = [v for v, _same in parts]
        same = all(s for _v, s in parts)
        if type(x) is list:
            return items, same
        if type(x) is tuple:
            return tuple(items), same
        return _own_type(x, items), same
    if is_object(type(x)) and id(x) not in visiting:
        visiting.add(id(x))
        changed = []
        for name, v in object_fields(x):
            new, same = _rebuild(v, it, is_tensor, visiting)
            if not same:
                changed.append((name, new))
        visiting.discard(id(x))
        if not changed:
            return x, True
        clone = copy.copy(x)
        for name, new in changed:
            object.__setattr__(clone, name, new)
        return clone, False
    return x, True


def rebuilder(obj: Any, changed: Sequence[bool], is_tensor: Callable[[Any], bool]) -> Callable[[Sequence[Any]], Any]:
    """:func:`rebuild` of ``obj`` planned once, for calls that replace only the leaves marked in ``changed`` (in
    :func:`collect_tensors` order): the returned function takes the new tensors of those leaves alone, in order,
    and gives what ``rebuild(obj, tensors, is_tensor)`` gives for the full list with every other leaf ``obj``'s own.

    The walk is done here: the function rebuilds the containers (always, as :func:`rebuild` does: the caller never
    gets ``obj``'s own) and only the objects above a changed leaf; an object with no changed leaf under it (a cache
    handed back as the caller's own) is returned as it is without being walked.  For the outputs of a replay,
    where which leaves are fresh is decided at capture."""
    rank = iter(range(sum(1 for c in changed if c)))
    node, _same = _plan(obj, iter(changed), rank, is_tensor, set())
    return functools.partial(_run, node)


# A planned node: (kind, value, children).  kind: 0 a constant, 1 the i-th tensor, 2 a dict, 3 a list,
# 4 a tuple, 5 another sequence, 6 an object (its changed attributes only).
_Node = tuple[int, Any, Any]


def _plan(x: Any, changed: Iterator[bool], rank: Iterator[int], is_tensor: Callable[[Any], bool],
          visiting: set[int]) -> tuple[_Node, bool]:
    """The node of ``x`` and whether no leaf under it changes (the walk of :func:`_rebuild`); ``changed`` gives each
    leaf's flag in turn, ``rank`` each changed leaf's place in the function's argument."""
    if is_tensor(x):
        return ((1, next(rank), None), False) if next(changed) else ((0, x, None), True)
    if isinstance(x, dict):
        pairs = [(k, _plan(v, changed, rank, is_tensor, visiting)) for k, v in x.items()]
        return (2, x, [(k, n) for k, (n, _s) in pairs]), all(s for _k, (_n, s) in pairs)
    if isinstance(x, _SEQUENCES):
        parts = [_plan(e, changed, rank, is_tensor, visiting) for e in x]
        kind = 3 if type(x) is list else 4 if type(x) is tuple else 5
        return (kind, x, [n for n, _s in parts]), all(s for _n, s in parts)
    if is_object(type(x)) and id(x) not in visiting:
        visiting.add(id(x))
        fields = [(name, _plan(v, changed, rank, is_tensor, visiting)) for name, v in object_fields(x)]
        visiting.discard(id(x))
        moved = [(name, n) for name, (n, same) in fields if not same]
        return ((6, x, moved), False) if moved else ((0, x, None), True)
    return (0, x, None), True


def _run(node: _Node, tensors: Sequence[Any]) -> Any:
    kind, x, children = node
    if kind == 0:
        return x
    if kind == 1:
        return tensors[x]
    if kind == 2:
        return _own_type(x, [(k, _run(n, tensors)) for k, n in children])
    if kind == 3:
        return [_run(n, tensors) for n in children]
    if kind == 4:
        return tuple(_run(n, tensors) for n in children)
    if kind == 5:
        return _own_type(x, [_run(n, tensors) for n in children])
    clone = copy.copy(x)
    for name, n in children:
        object.__setattr__(clone, name, _run(n, tensors))
    return clone


_ROUTE: dict[tuple[type, bool], bool] = {}  # (type, has own attributes) -> rebuilt by refilling a copy


def _own_type(x: Any, items: list[Any]) -> Any:
    """A copy of the container ``x`` (a dict: ``items`` are pairs) holding ``items``, as ``x``'s own type: a
    NamedTuple by its fields, a ``defaultdict`` with its factory, a deque (subclasses too) with its ``maxlen``, an
    instance with attributes of its own as a shallow copy refilled (its attributes kept), any other type by its
    constructor from the items (``OrderedDict``, transformers' ``ModelOutput``, a user's list or dict), or, where
    the constructor takes other arguments, as a shallow copy refilled.  Raises :class:`SignatureError`
    naming the type where both fail."""
    tp = type(x)
    if isinstance(x, tuple):
        return tp(*items) if hasattr(x, "_fields") else tp(items)
    if isinstance(x, collections.defaultdict):
        refilled = copy.copy(x)
        refilled.clear()
        refilled.update(items)
        return refilled
    if isinstance(x, collections.deque) and tp is collections.deque:
        return collections.deque(items, maxlen=x.maxlen)

    def construct() -> Any:
        return tp(items)

    def refill() -> Any:
        clone: Any = copy.copy(x)
        if isinstance(clone, dict):
            clone.clear()
            clone.update(items)
        elif isinstance(clone, collections.deque):
            clone.clear()
            clone.extend(items)
        else:
            clone[:] = items
        return clone

    own_attrs = isinstance(x, collections.deque) or bool(getattr(x, "__dict__", None))
    route = _ROUTE.get((tp, own_attrs))
    if route is not None:  # the way that worked for this type before (outputs are rebuilt on every replay)
        try:
            return refill() if route else construct()
        except Exception:
            _ROUTE.pop((tp, own_attrs), None)
    first, second = (refill, construct) if own_attrs else (construct, refill)
    try:
        out = first()
        _ROUTE[(tp, own_attrs)] = first is refill
        return out
    except Exception:  # e.g. a ModelOutput refuses update(), a constructor takes other arguments
        pass
    try:
        out = second()
        _ROUTE[(tp, own_attrs)] = second is refill
        return out
    except Exception as exc:
        raise SignatureError(f"graphjit cannot rebuild a {tp.__module__}.{tp.__qualname__} holding tensors with "
                             f"other tensors in them ({type(exc).__name__}: {exc}); pass the tensors in a plain "
                             "list, tuple or dict, or give the type a constructor from its items") from exc
