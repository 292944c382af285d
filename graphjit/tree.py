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


FRESH = -1
"""A leaf source for :func:`rebuilder`: the leaf takes the next of the call's fresh tensors."""
KEEP = -2
"""A leaf source for :func:`rebuilder`: the leaf stays the template's own tensor."""

# Where an argument object sits: (keyword or None, position, then (attribute?, key) steps down from there).
Path = tuple[Any, ...]
Call = tuple[Sequence[Any], dict[str, Any]]
"""A call's positional and keyword arguments."""


def places(args: Sequence[Any], kwargs: dict[str, Any], is_tensor: Callable[[Any], bool]
           ) -> dict[int, tuple[Path, int, int]]:
    """Every container and object in a call's arguments, by ``id``: ``(path, first, stop)``, where the call's
    tensor leaves ``first`` up to ``stop`` (in :func:`collect_tensors` order of ``list(args)`` followed by the keyword
    values in sorted order, as ``keys.rebuild_call`` lays them out) are the ones under it, and ``path`` finds the
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
    elif isinstance(x, _SEQUENCES):
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


def rebuilder(obj: Any, sources: Sequence[int], is_tensor: Callable[[Any], bool],
              argument: Callable[[Any, list[Any]], Path | None] | None = None
              ) -> Callable[..., Any]:
    """:func:`rebuild` of ``obj`` planned once for many calls, each leaf (in :func:`collect_tensors` order) taken
    from where ``sources`` says: :data:`FRESH`, the next of the call's fresh tensors (a tensor met again, the one it
    took before); :data:`KEEP`, ``obj``'s own; an index ``i``, the call's own tensor ``i`` (an output that is one of
    the call's inputs, as an eager call returns it).

    The returned function is ``run(fresh, tensors=None, call=None)``.  Without ``tensors`` the input leaves stay
    ``obj``'s own.  ``argument(x, leaves)`` says whether a container or object ``x`` of ``obj`` (holding the tensors
    ``leaves``) is one of the capturing call's arguments, unchanged: its path (:func:`places`), where ``run`` given
    the ``call`` (its ``(args, kwargs)``) returns the call's own object at that path as it is, as an eager call
    returns the object it was given (a cache, with its layers and counters: the caller's, not a copy).

    The walk is done here: the function rebuilds the other containers (always, as :func:`rebuild` does: the caller
    never gets ``obj``'s own) and only the objects above a leaf that changes; an object with no such leaf under it
    is returned as it is without being walked."""
    nodes = _Planner(iter(sources), is_tensor, argument)
    node, _same = nodes.plan(obj)
    if not nodes.of_call:  # fresh tensors and constants only: the walk with the fresh tensors alone
        return functools.partial(_run_fresh, node)
    return functools.partial(_run, node)


# A planned node: (kind, value, children).  kind: 0 a constant, 1 the i-th fresh tensor, 2 a dict, 3 a list,
# 4 a tuple, 5 another sequence, 6 an object (its changed attributes only), 7 the call's tensor i (value: (i, the
# template's)), 8 the call's argument at a path (value: (path, the node without a call)), 9 a dict subclass with
# attributes of its own (value: (the template, [its decision]): _own_dict).
_Node = tuple[int, Any, Any]


class _Planner:
    """The walk of :func:`_rebuild` planned once: each node and whether no leaf under it changes."""

    def __init__(self, sources: Iterator[int], is_tensor: Callable[[Any], bool],
                 argument: Callable[[Any, list[Any]], Path | None] | None) -> None:
        self.sources = sources
        self.is_tensor = is_tensor
        self.argument = argument
        self.fresh_of: dict[int, int] = {}  # id(template's tensor) -> its index among the fresh ones
        self.of_call = False  # a node takes the call's tensors or arguments (kind 7 or 8)
        self.visiting: set[int] = set()

    def plan(self, x: Any) -> tuple[_Node, bool]:
        """The node of ``x`` and whether it is ``x`` itself in every call (no leaf under it changes); consumes one
        source per tensor leaf, in :func:`collect_tensors` order."""
        if self.is_tensor(x):
            src = next(self.sources)
            if src == KEEP:
                return (0, x, None), True
            if src == FRESH:  # a tensor met before takes the same fresh one (``return h, h``: one tensor twice)
                i = self.fresh_of.setdefault(id(x), len(self.fresh_of))
                return (1, i, None), False
            self.of_call = True
            return (7, (src, x), None), False
        node, same = self._inner(x)
        if self.argument is not None and (isinstance(x, (dict, *_SEQUENCES)) or is_object(type(x))):
            path = self.argument(x, collect_tensors(x, self.is_tensor))
            if path is not None:  # the call's own object: it differs from the template's in every call
                self.of_call = True
                return (8, (path, node), None), False
        return node, same

    def _inner(self, x: Any) -> tuple[_Node, bool]:
        """The node of a container or object (a constant for anything else), its children planned."""
        if isinstance(x, dict):
            pairs = [(k, self.plan(v)) for k, v in x.items()]
            kids = [(k, n) for k, (n, _s) in pairs]
            same = all(s for _k, (_n, s) in pairs)
            if getattr(x, "__dict__", None) and not isinstance(x, collections.defaultdict):
                plain = _plain_model_output(type(x)) and not _slotted(type(x))
                return (9, (x, [None if plain else False]), kids), same
            return (2, x, kids), same
        if isinstance(x, _SEQUENCES):
            parts = [self.plan(e) for e in x]
            kind = 3 if type(x) is list else 4 if type(x) is tuple else 5
            return (kind, x, [n for n, _s in parts]), all(s for _n, s in parts)
        if is_object(type(x)) and id(x) not in self.visiting:
            self.visiting.add(id(x))
            fields = [(name, self.plan(v)) for name, v in object_fields(x)]
            self.visiting.discard(id(x))
            moved = [(name, n) for name, (n, same) in fields if not same]
            return ((6, x, moved), False) if moved else ((0, x, None), True)
        return (0, x, None), True


def _run_fresh(node: _Node, fresh: Sequence[Any], tensors: Sequence[Any] | None = None, call: Call | None = None
               ) -> Any:
    """:func:`_run` of a plan with no node of the call's (kinds 0 to 6): the walk takes the fresh tensors alone."""
    return _walk(node, fresh)


def _walk(node: _Node, fresh: Sequence[Any]) -> Any:
    """:func:`_run` for nodes of kinds 0 to 6, kept apart on purpose: a replay's outputs are rebuilt here on every
    call, and passing the call's tensors and arguments down every node cost 18% of that (a six-leaf output)."""
    kind, x, children = node
    if kind == 0:
        return x
    if kind == 1:
        return fresh[x]
    if kind == 2:
        return _own_type(x, [(k, _walk(n, fresh)) for k, n in children])
    if kind == 9:
        return _own_dict(x, [(k, _walk(n, fresh)) for k, n in children])
    if kind == 3:
        return [_walk(n, fresh) for n in children]
    if kind == 4:
        return tuple(_walk(n, fresh) for n in children)
    if kind == 5:
        return _own_type(x, [_walk(n, fresh) for n in children])
    clone = copy.copy(x)
    for name, n in children:
        object.__setattr__(clone, name, _walk(n, fresh))
    return clone


def _run(node: _Node, fresh: Sequence[Any], tensors: Sequence[Any] | None = None,
         call: Call | None = None) -> Any:
    """The value of a planned ``node`` for one call: ``fresh`` its fresh tensors, ``tensors`` its own tensors and
    ``call`` its ``(args, kwargs)`` (without them, the template's tensors and objects)."""
    kind, x, children = node
    if kind == 0:
        return x
    if kind == 1:
        return fresh[x]
    if kind == 7:
        return tensors[x[0]] if tensors is not None else x[1]
    if kind == 8:
        if call is not None:
            try:
                return at(x[0], *call)
            except (LookupError, AttributeError, TypeError):  # a call of the key built otherwise (an odd __eq__)
                pass
        return _run(x[1], fresh, tensors, call)
    if kind == 2:
        return _own_type(x, [(k, _run(n, fresh, tensors, call)) for k, n in children])
    if kind == 9:
        return _own_dict(x, [(k, _run(n, fresh, tensors, call)) for k, n in children])
    if kind == 3:
        return [_run(n, fresh, tensors, call) for n in children]
    if kind == 4:
        return tuple(_run(n, fresh, tensors, call) for n in children)
    if kind == 5:
        return _own_type(x, [_run(n, fresh, tensors, call) for n in children])
    clone = copy.copy(x)
    for name, n in children:
        object.__setattr__(clone, name, _run(n, fresh, tensors, call))
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
    return _by_route(x, items, construct, refill, own_attrs)


def _own_dict(value: tuple[Any, list[bool | None]], items: list[tuple[Any, Any]]) -> Any:
    """A planned dict subclass with attributes of its own (node kind 9: ``value`` is ``(template, [decision])``) rebuilt
    holding ``items``: by :func:`_state_copy` once this node's decision says so, else by :func:`_own_type`.  The
    decision is None (to be taken) only for a plain transformers or PaddleFormers ``ModelOutput``
    (:func:`_plain_model_output`), and is taken once per node (one graph's output): at its first rebuild both ways are
    made and compared (:func:`_same_state`); where neither its items nor a refilled copy make one, its constructor
    takes the items as keywords."""
    x, decided = value
    if decided[0]:
        return _state_copy(x, items)
    try:
        out = _own_type(x, items)
    except SignatureError:
        if decided[0] is not None:
            raise
        out = type(x)(**dict(items))  # a ModelOutput whose fields are keyword-only (dataclass(kw_only=True))
    if decided[0] is None:
        try:
            decided[0] = _same_state(out, _state_copy(x, items))
        except Exception:  # instances that cannot be made without their constructor
            decided[0] = False
    return out


_STATE_HOOKS = ("__new__", "__post_init__", "__setitem__", "__setattr__", "__getattr__", "__getattribute__")
"""Methods a class between a ``ModelOutput`` and its base may not define for :func:`_state_copy` to stand for its
constructor."""


def _plain_model_output(tp: type) -> bool:
    """Whether ``tp`` is a dataclass below a ``ModelOutput`` (transformers', PaddleFormers': the class of that name that
    defines ``__post_init__``) and adds nothing its constructor runs: no class between them defines one of
    :data:`_STATE_HOOKS` or an ``__init__`` other than the one ``dataclasses`` generates (unwrapped from wrappers
    defined beside that ``ModelOutput``, as transformers' renaming of old keyword names).  Such a constructor only
    sets the fields and calls ``ModelOutput.__post_init__``, whose state :func:`_state_copy` copies; any other type
    keeps its constructor (one that computes an attribute from its items' values, or aliases an item under another
    name, would not be seen by comparing one call's results)."""
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


def _state_copy(x: dict[Any, Any], items: list[tuple[Any, Any]]) -> Any:
    """An instance of ``x``'s dict subclass made without its constructor or its own ``__setitem__``: ``items`` set
    by ``dict``'s (``OrderedDict``'s) own, then ``x``'s attributes, an attribute named as a key taking that key's new
    value.  Used by :func:`_own_dict` only where it made the same state as the type's own route (transformers'
    ``ModelOutput`` mirrors its non-None fields as items and attributes; its constructor took 21 us of a 60 us
    decode replay)."""
    base = _dict_base(x)
    clone = base.__new__(type(x))
    attrs = dict(x.__dict__)
    for k, v in items:
        base.__setitem__(clone, k, v)
        if k in attrs:
            attrs[k] = v
    clone.__dict__.update(attrs)
    return clone


def _dict_base(x: dict[Any, Any]) -> Any:
    """The builtin mapping type whose own methods hold ``x``'s items in order."""
    return collections.OrderedDict if isinstance(x, collections.OrderedDict) else dict


def _same_state(a: Any, b: Any) -> bool:
    """Whether two dict-subclass instances with a ``__dict__`` (and no slots: :func:`_slotted`) are of one type and
    hold the same objects, as items and as attributes, in the same order."""
    if type(a) is not type(b):
        return False
    base = _dict_base(a)
    pairs_a, pairs_b = list(base.items(a)), list(base.items(b))
    attrs_a, attrs_b = list(vars(a).items()), list(vars(b).items())
    return len(pairs_a) == len(pairs_b) and len(attrs_a) == len(attrs_b) and all(
        ka == kb and va is vb for (ka, va), (kb, vb) in zip(pairs_a + attrs_a, pairs_b + attrs_b))


def _slotted(tp: type) -> bool:
    """Whether instances of ``tp`` keep values in slots (``__slots__`` naming more than ``__dict__``)."""
    for c in tp.__mro__:
        slots = c.__dict__.get("__slots__", ())
        if any(n not in ("__dict__", "__weakref__") for n in ((slots,) if isinstance(slots, str) else slots)):
            return True
    return False


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
