"""The tree of a call's arguments and of a function's outputs: which values are containers, and how
to take their tensors out (:func:`collect_tensors`) and put others in (:func:`rebuild`).

Containers are lists, tuples, dicts and deques, subclasses included (each rebuilt as its own type:
NamedTuples, ``OrderedDict``, ``defaultdict`` with its factory, a ``deque`` with its ``maxlen``, a user's
dict or list subclass with its attributes), and *objects that hold tensors*: dataclass instances and objects of
Python classes (with ``__dict__`` or ``__slots__``), a user's class that defines its own ``__eq__`` and ``__hash__``
included (an ``__eq__`` may compare less than the function reads).  Their attributes
are walked like a dict's values, in the order :func:`object_fields` lists them.  A dict subclass's own attributes
(:func:`dict_attrs`: transformers' ``ModelOutput`` after ``out.extra = t``) are walked after its items, an attribute
that is its item of the same name standing for that item; a rebuilt one has them as the original had them, but for
those its constructor makes anew for each instance (:func:`made_anew`).  Not walked: values of C types
(``torch.dtype``, numpy scalars) and their subclasses (a ``str`` subclass), the standard library's value types
(``pathlib.Path``, ``Fraction``), enums and frozensets, the framework's stateful
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
import sys
import types
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from . import backends
from .errors import SignatureError

_CONTAINERS = (list, tuple, dict, set, frozenset, collections.deque)
SEQUENCES = (list, tuple, collections.deque)
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
    return tp.__eq__ is object.__eq__ or tp.__hash__ is None or _users_value_type(tp)


_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made by a class statement, not a C type


def _users_value_type(tp: type) -> bool:
    """A value type (its own ``__eq__`` and ``__hash__``) walked all the same: a user's Python class, whose ``__eq__``
    may compare less than the function reads.  Not one with a C base beside ``object`` (a ``str`` or ``date``
    subclass: its value is no attribute) nor one of the standard library (``pathlib.Path``, ``Fraction``: they
    compare all they hold, and fill caches lazily that would make every call another key)."""
    if any(not b.__flags__ & _HEAPTYPE for b in tp.__mro__[1:-1]):
        return False
    return tp.__module__.partition(".")[0] not in sys.stdlib_module_names


_LAYOUT: dict[type, tuple[bool, tuple[str, ...]]] = {}


def object_layout(tp: type) -> tuple[bool, tuple[str, ...]]:
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
                slots.extend(_mangled(cls, n) for n in names if n not in ("__dict__", "__weakref__"))
            layout = ("__dict__" in dir(tp), tuple(slots))
        _LAYOUT[tp] = layout
    return layout


def _mangled(cls: type, name: str) -> str:
    """The attribute a slot is stored as: a private name (``__buf``) as Python mangles it in ``cls`` (``_Cls__buf``)."""
    if name.startswith("__") and not name.endswith("__"):
        owner = cls.__name__.lstrip("_")
        if owner:
            return f"_{owner}{name}"
    return name


def object_fields(x: Any) -> list[tuple[str, Any]]:
    """The attributes of an object that :func:`is_object` accepts, in a fixed order."""
    use_dict, names = object_layout(type(x))
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


class _Mirror:
    __slots__ = ()

    def __repr__(self) -> str:
        return "MIRROR"


MIRROR: Any = _Mirror()
"""What :func:`dict_attrs` gives for an attribute that is the item of the same name (a mirror)."""
_ABSENT = object()


def dict_attrs(x: dict[Any, Any]) -> list[tuple[str, Any]]:
    """The attributes of a dict subclass instance (its ``__dict__``, in order), each with its value, or with
    :data:`MIRROR` where it is the item of the same name: transformers' ``ModelOutput`` keeps each field that is not
    None both as an item and as an attribute, and an attribute set after construction (``out.extra = t``, or a field
    set to None, which leaves its item) only as an attribute.  The walks take the attributes after the items: a
    mirror stands for its item (rebuilt as it), any other is walked like an object's attribute.  Empty for a plain
    dict and for an instance without attributes."""
    if type(x) is dict:
        return []
    d = getattr(x, "__dict__", None)
    if not d or type(d) is not dict:
        return []
    get = dict.get
    return [(n, MIRROR if get(x, n, _ABSENT) is v else v) for n, v in d.items()]


def collect_tensors(obj: Any, is_tensor: Callable[[Any], bool]) -> list[Any]:
    """The tensor leaves of ``obj`` in the order :func:`rebuild` replaces them."""
    found: list[Any] = []
    _collect(obj, is_tensor, found, set())
    return found


def _collect(x: Any, is_tensor: Callable[[Any], bool], found: list[Any], visiting: set[int]) -> None:
    if is_tensor(x):
        found.append(x)
    elif isinstance(x, SEQUENCES):
        for e in x:
            _collect(e, is_tensor, found, visiting)
    elif isinstance(x, dict):
        for v in x.values():
            _collect(v, is_tensor, found, visiting)
        if type(x) is not dict and id(x) not in visiting:
            visiting.add(id(x))
            for _name, v in dict_attrs(x):
                if v is not MIRROR:
                    _collect(v, is_tensor, found, visiting)
            visiting.discard(id(x))
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
    if isinstance(x, SEQUENCES):
        return (type(x), tuple(_structure(e, is_tensor, visiting) for e in x))
    if isinstance(x, dict):
        items = tuple((k, _structure(v, is_tensor, visiting)) for k, v in x.items())
        attrs = dict_attrs(x) if id(x) not in visiting else []
        if not attrs:
            return (type(x), items)
        anew = made_anew(x)
        visiting.add(id(x))
        described = tuple((n, v) if v is MIRROR else
                          (n, "made anew", type(v)) if n in anew and not collect_tensors(v, is_tensor) else
                          (n, _structure(v, is_tensor, visiting)) for n, v in attrs)
        visiting.discard(id(x))
        return (type(x), items, described)
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


def rebuild_call(args: tuple[Any, ...], kwargs: dict[str, Any], tensors: Sequence[Any],
                 is_tensor: Callable[[Any], bool]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Positional and keyword arguments with their tensors replaced (in the order ``keys.Signer.sign`` found them)."""
    ordered = list(args) + [kwargs[k] for k in sorted(kwargs)]
    rebuilt = rebuild(ordered, tensors, is_tensor)
    new_args = tuple(rebuilt[: len(args)])
    new_kwargs = dict(zip(sorted(kwargs), rebuilt[len(args):]))
    return new_args, {k: new_kwargs[k] for k in kwargs}


def _rebuild(x: Any, it: Iterator[Any], is_tensor: Callable[[Any], bool], visiting: set[int]) -> tuple[Any, bool]:
    """``(rebuilt x, whether every tensor under x was put back as itself)``."""
    if is_tensor(x):
        t = next(it)
        return t, t is x
    if isinstance(x, dict):
        pairs = [(k, _rebuild(v, it, is_tensor, visiting)) for k, v in x.items()]
        items = [(k, v) for k, (v, _same) in pairs]
        same = all(s for _k, (_v, s) in pairs)
        attrs = dict_attrs(x) if id(x) not in visiting else []
        if not attrs:
            return own_type(x, items), same
        visiting.add(id(x))
        rebuilt: list[tuple[str, Any]] = []
        for name, v in attrs:
            new = v
            if v is not MIRROR:
                new, kept = _rebuild(v, it, is_tensor, visiting)
                same = same and kept
            rebuilt.append((name, new))
        visiting.discard(id(x))
        out = own_type(x, items)
        anew = made_anew(x)
        fill_attrs(out.__dict__, items, [(a, v) for (a, v), (_n, was) in zip(rebuilt, attrs)
                                         if a not in anew or (was is not MIRROR and collect_tensors(was, is_tensor))])
        return out, same
    if isinstance(x, SEQUENCES):
        parts = [_rebuild(e, it, is_tensor, visiting) for e in x]
        items = [v for v, _same in parts]
        same = all(s for _v, s in parts)
        if type(x) is list:
            return items, same
        if type(x) is tuple:
            return tuple(items), same
        return own_type(x, items), same
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


# Where an argument object sits: (keyword or None, position, then (attribute?, key) steps down from there).
Path = tuple[Any, ...]
Call = tuple[Sequence[Any], dict[str, Any]]
"""A call's positional and keyword arguments."""


def places(args: Sequence[Any], kwargs: dict[str, Any], is_tensor: Callable[[Any], bool]
           ) -> dict[int, tuple[Path, int, int]]:
    """Every container and object in a call's arguments, by ``id``: ``(path, first, stop)``, where the call's
    tensor leaves ``first`` up to ``stop`` (in :func:`collect_tensors` order of ``list(args)`` followed by the keyword
    values in sorted order, as :func:`rebuild_call` lays them out) are the ones under it, and ``path`` finds the
    same place in another call of that layout (:func:`at`).  An object found at two places is left out: another call
    may pass two objects there, and which one an output is cannot be told."""
    found: dict[int, tuple[Path, int, int] | None] = {}
    count = [0]
    for i, a in enumerate(args):
        _place(a, (None, i), is_tensor, found, count, set())
    for k in sorted(kwargs):
        _place(kwargs[k], (k, None), is_tensor, found, count, set())
    return {i: p for i, p in found.items() if p is not None}


def _place(x: Any, path: Path, is_tensor: Callable[[Any], bool], found: dict[int, tuple[Path, int, int] | None],
           count: list[int], visiting: set[int]) -> None:
    if is_tensor(x):
        count[0] += 1
        return
    first = count[0]
    if isinstance(x, dict):
        for k, v in x.items():
            _place(v, (*path, (False, k)), is_tensor, found, count, visiting)
        if type(x) is not dict and id(x) not in visiting:
            visiting.add(id(x))
            for name, v in dict_attrs(x):
                if v is not MIRROR:
                    _place(v, (*path, (True, name)), is_tensor, found, count, visiting)
            visiting.discard(id(x))
    elif isinstance(x, SEQUENCES):
        for j, e in enumerate(x):
            _place(e, (*path, (False, j)), is_tensor, found, count, visiting)
    elif is_object(type(x)) and id(x) not in visiting:
        visiting.add(id(x))
        for name, v in object_fields(x):
            _place(v, (*path, (True, name)), is_tensor, found, count, visiting)
        visiting.discard(id(x))
    else:
        return
    found[id(x)] = (path, first, count[0]) if id(x) not in found else None


def at(path: Path, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """The value at ``path`` (from :func:`places`) in a call of ``args`` and ``kwargs``."""
    name, pos = path[0], path[1]
    x = kwargs[name] if name is not None else args[pos]
    for attr, key in path[2:]:
        x = getattr(x, key) if attr else x[key]
    return x


_ROUTE: dict[tuple[type, bool], bool] = {}  # (type, has own attributes) -> rebuilt by refilling a copy


def own_type(x: Any, items: list[Any]) -> Any:
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
    return _by_route(x, items, construct, refill, own_attrs)


def made(x: dict[Any, Any], items: list[tuple[Any, Any]], strict: bool = True) -> Any:
    """An instance of ``x``'s type holding ``items``, by :func:`own_type`, or (not ``strict``: a ``ModelOutput``
    whose fields are keyword-only, ``dataclass(kw_only=True)``) by its constructor taking them as keywords."""
    try:
        return own_type(x, items)
    except SignatureError:
        if strict:
            raise
        return type(x)(**dict(items))


def made_anew(x: dict[Any, Any]) -> frozenset[str]:
    """The attributes that ``x``'s constructor makes anew for each instance (two instances made from ``x``'s items
    hold different objects there: a stamp, a new list): a rebuilt instance keeps its own where nothing of the call's
    is under it; every other attribute is set as ``x`` has it.  None for a plain ``ModelOutput``
    (:func:`plain_model_output`: its constructor only sets its fields); for any other type found by making two
    instances, once per type and layout (its keys and attribute names): a constructor with side effects (a global
    counter) runs twice more then."""
    tp = type(x)
    if plain_model_output(tp):
        return frozenset()
    layouts = _ANEW.get(tp)
    if layouts is None:
        layouts = _ANEW[tp] = {}
    layout = (tuple(dict.keys(x)), tuple(x.__dict__))
    found = layouts.get(layout)
    if found is None:
        items = list(dict.items(x))
        try:
            one, two = made(x, items, False).__dict__, made(x, items, False).__dict__
            found = frozenset(n for n, v in one.items() if n in two and two[n] is not v)
        except Exception:  # not made twice: every attribute as the template has it
            found = frozenset()
        layouts[layout] = found
    return found


_ANEW: weakref.WeakKeyDictionary[type, dict[tuple[Any, ...], frozenset[str]]] = weakref.WeakKeyDictionary()
"""made_anew's findings, per type (held weakly: a class made at run time goes with its last instance)."""


def fill_attrs(d: dict[str, Any], items: list[tuple[Any, Any]], attrs: list[tuple[str, Any]]) -> None:
    """Sets ``attrs`` in the instance dict ``d``, a :data:`MIRROR` to the item of its name in ``items``."""
    mirrored = None
    for name, v in attrs:
        if v is MIRROR:
            if mirrored is None:
                mirrored = dict(items)
            v = mirrored[name]
        d[name] = v


def _by_route(x: Any, items: list[Any], construct: Callable[[], Any], refill: Callable[[], Any],
              own_attrs: bool) -> Any:
    """``x`` rebuilt by refilling a copy or by its constructor, whichever worked for its type before (tried in
    that order where ``x`` has attributes of its own, else the other way round)."""
    tp = type(x)
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


_STATE_HOOKS = ("__new__", "__post_init__", "__setitem__", "__setattr__", "__getattr__", "__getattribute__")
"""Methods a class between a ``ModelOutput`` and its base may not define for the state copy
(``rebuild_plan._state_copy``) to stand for its constructor."""


def plain_model_output(tp: type) -> bool:
    """Whether ``tp`` is a dataclass below a ``ModelOutput`` (transformers', PaddleFormers': the class of that name that
    defines ``__post_init__``) and adds nothing its constructor runs: no class between them defines one of
    :data:`_STATE_HOOKS` or an ``__init__`` other than the one ``dataclasses`` generates (unwrapped from wrappers
    defined beside that ``ModelOutput``, as transformers' renaming of old keyword names).  Such a constructor only
    sets the fields and calls ``ModelOutput.__post_init__``, whose state ``rebuild_plan._state_copy`` copies; any
    other type keeps its constructor (one that computes an attribute from its items' values, or aliases an item
    under another name, would not be seen by comparing one call's results).  Cached per type."""
    plain = _PLAIN.get(tp)
    if plain is None:
        plain = _PLAIN[tp] = _plain(tp)
    return plain


_PLAIN: weakref.WeakKeyDictionary[type, bool] = weakref.WeakKeyDictionary()


def _plain(tp: type) -> bool:
    mro = tp.__mro__
    base = next((c for c in mro if c.__name__ == "ModelOutput" and "__post_init__" in c.__dict__), None)
    if base is None or not dataclasses.is_dataclass(tp):
        return False
    home = getattr(base.__dict__["__post_init__"], "__code__", None)
    for c in mro[:mro.index(base)]:
        own = c.__dict__
        if any(name in own for name in _STATE_HOOKS):
            return False
        init = own.get("__init__")
        while init is not None and home is not None and getattr(init, "__code__", None) is not None and \
                init.__code__.co_filename == home.co_filename and hasattr(init, "__wrapped__"):
            init = init.__wrapped__
        if init is not None and getattr(getattr(init, "__code__", None), "co_filename", None) != "<string>":
            return False  # not dataclasses' own (it is made by exec)
    return True


def subscripts(subs: Sequence[Any]) -> str:
    """A path's steps as text: ``.name`` for an attribute (:class:`Attr`), ``[key]`` for an item."""
    return "".join(f".{s}" if isinstance(s, Attr) else f"[{s!r}]" for s in subs)
