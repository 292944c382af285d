"""What a graphed function can reach: the tensors held by its arguments, its closure, the globals it
names, and the object it is bound to.

:func:`roots` lists where to look; :func:`walk` follows containers (lists, tuples, dicts) and object
attributes (``__dict__`` and ``__slots__``, so ``nn.Module`` / ``paddle.nn.Layer`` parameters,
buffers and submodules, cache objects, dataclasses) and returns every tensor it finds with the path
that leads to it (``argument 'cache'.layers[0].keys``).  Two walks of the same roots, before and
after a call, tell which tensors the call rebound (:func:`rebinds`).

This runs during warmup and verify only, never on the replay path.  It sees what Python references
lead to; a tensor that only a C extension or an unreachable module holds is not seen, and
:attr:`Reach.truncated` says when the walk stopped at its size limit.
"""

from __future__ import annotations

import collections
import functools
import os
import sysconfig
import types
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from . import backends, iterators

Path = tuple[Any, ...]
"""A root name followed by steps: ``("argument 'x'", (".", "layers"), ("[]", 0))``."""

MAX_NODES = 200_000
MAX_DEPTH = 64
MAX_FUNCTIONS = 64

ATOMS = frozenset((int, float, bool, str, bytes, complex, type(None), range, slice))
"""Values a walk does not enter: they hold nothing."""
OPAQUE = (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
          types.CodeType, types.FrameType, types.GeneratorType, types.CoroutineType, types.MethodWrapperType,
          types.WrapperDescriptorType, types.MethodDescriptorType, property, staticmethod, classmethod)
"""Objects a walk does not enter: code, classes and modules, not state."""
FOREIGN_MODULES = frozenset(("logging", "threading", "asyncio", "concurrent", "multiprocessing", "queue", "socket",
                             "_io", "io", "weakref", "_thread", "selectors", "subprocess"))
"""Top-level modules whose objects (a logger's manager, a thread, a pool) hold no value a graph reads and are
changed by other threads: the guards' and the Python-state walks do not enter them."""


class OwnWrapper:
    """The base of graphjit's own wrappers (a graphed function, a graphed Layer/Module object): the walks of
    graphjit (:func:`walk`, :func:`graphjit.guards.scan`, :class:`graphjit.pystate.PyState`) go through one to the
    object it wraps, whose state the code it calls reads, and never into the wrapper's own (a graphed function's keys,
    graphs and counters, which a nested call changes: graphjit's bookkeeping, never a value of the user's call)."""

    __slots__ = ()


_OWN: dict[type, bool] = {}


def unwrap_own(obj: Any) -> Any:
    """``obj``, or the object a graphjit wrapper (:class:`OwnWrapper`) around it wraps, unwrapped again where that is
    one too.  Decided by ``type(obj)`` (a wrapper says its wrapped object's class is its own), once per type."""
    for _ in range(16):
        tp = type(obj)
        own = _OWN.get(tp)
        if own is None:
            if len(_OWN) >= 4096:
                _OWN.clear()
            own = _OWN[tp] = issubclass(tp, OwnWrapper)
        if not own:
            return obj
        obj = obj.__wrapped__
    return obj


PLAIN_CONTAINERS = frozenset((dict, list, tuple, set, frozenset, collections.OrderedDict))
"""Containers (these exact types: no ``__len__`` of a subclass is called) a walk skips when empty."""


class Visits:
    """The budget of one walk: each object once, at most ``max_nodes`` objects, at most ``max_depth`` deep.

    :meth:`first` is True the first time an object is met within the limits; past them it is False and
    :attr:`truncated` is set, and past ``max_nodes`` :attr:`full` too (the walk stops)."""

    __slots__ = ("full", "max_depth", "max_nodes", "nodes", "seen", "truncated")

    def __init__(self, max_nodes: int = 200_000, max_depth: int = 64) -> None:
        self.seen: set[int] = set()
        self.nodes = 0
        self.max_nodes = max_nodes
        self.max_depth = max_depth
        self.truncated = False
        self.full = False

    def first(self, obj: Any, depth: int) -> bool:
        oid = id(obj)
        if oid in self.seen:
            return False
        self.seen.add(oid)
        self.nodes += 1
        if self.nodes > self.max_nodes or depth > self.max_depth:
            self.truncated = True
            self.full = self.nodes > self.max_nodes
            return False
        return True


@dataclass
class Reach:
    """The tensors one walk found."""

    tensors: dict[int, tuple[Any, Path]] = field(default_factory=dict)
    """``id(tensor) -> (tensor, the first path that leads to it)``."""
    bindings: dict[Path, int] = field(default_factory=dict)
    """``path -> id(tensor)`` for every path that ends at a tensor."""
    truncated: bool = False
    """The walk stopped at :data:`MAX_NODES` or :data:`MAX_DEPTH`: some tensors may be missing."""
    iterators: list[tuple[Any, str]] = field(default_factory=list)
    """``(iterator, path)`` of the iterators met (:mod:`graphjit.iterators`): a watched call reads their positions."""


HOLDERS = frozenset(("_modules", "_parameters", "_buffers", "_sub_layers"))
"""The dicts through which a torch Module or a Paddle Layer holds its submodules, parameters and buffers: a path
through one is shown as the attribute the code reads (``self.child.scale``, not ``self._modules['child'].scale``)."""


def describe(path: Path) -> str:
    """``argument 'cache'.layers[0].keys`` for a path."""
    root, *steps = path
    out = [str(root)]
    holder = False
    for kind, key in steps:
        if holder and kind == "[]" and isinstance(key, str) and key.isidentifier():
            out[-1] = f".{key}"  # (in place of the holder's own step)
        else:
            out.append(f".{key}" if kind == "." else "()" if kind == "()" else f"[{key!r}]")
        holder = kind == "." and key in HOLDERS
    return "".join(out)


def functions(fn: Any, visit: Callable[[types.FunctionType], Iterable[Any]], objects: list[tuple[str, Any]],
              skip: Callable[[Any], bool] = lambda f: False, opaque: tuple[type, ...] = OPAQUE) -> None:
    """Walk ``fn`` and the Python functions it reaches, up to :data:`MAX_FUNCTIONS`: ``visit(f)`` sees each Python
    function once and returns the callables to follow from it (those its closure and globals hold).  A bound
    method adds ``("self", obj)`` to ``objects`` (also a decorated one: before unwrapping, whose ``__wrapped__``
    is unbound), a ``functools.partial`` adds its bound arguments and is followed into its function, a callable
    object that is not ``opaque`` adds ``("the callable", obj)`` (its attributes are its state); a callable ``skip``
    accepts is not followed."""
    seen: set[int] = set()
    todo = [fn]
    while todo and len(seen) < MAX_FUNCTIONS:
        f = todo.pop()
        if skip(f):
            continue
        if isinstance(f, types.MethodType):
            objects.append(("self", f.__self__))
            f = f.__func__
        f = unwrap(f)
        if id(f) in seen:
            continue
        seen.add(id(f))
        if isinstance(f, types.MethodType):
            objects.append(("self", f.__self__))
            f = f.__func__
        if isinstance(f, functools.partial):  # its bound arguments are state the call reads, its function code
            objects.extend((n, v) for n, v in (("partial's arguments", f.args), ("partial's keywords", f.keywords))
                           if v)
            todo.append(f.func)
            continue
        if not isinstance(f, types.FunctionType):
            if f is not None and not isinstance(f, opaque):
                objects.append(("the callable", f))
            continue
        todo.extend(visit(f))


def roots(fn: Callable[..., Any], bound: Any, args: Iterable[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """Where a call of ``fn`` may find state: ``args`` (``(name, value)`` pairs), the object ``fn``
    is bound to (``bound``), the cells of ``fn``'s closure, and the globals its code names.  A
    global or closure function written in Python is followed too (its own closure and globals), up
    to :data:`MAX_FUNCTIONS` functions (:func:`functions`)."""
    out: list[tuple[str, Any]] = list(args)
    if bound is not None:
        out.append(("self", bound))

    def visit(f: types.FunctionType) -> list[Any]:
        follow: list[Any] = []
        code = f.__code__
        for name, cell in zip(code.co_freevars, f.__closure__ or ()):
            try:
                value = cell.cell_contents
            except ValueError:  # an empty cell (a name assigned after the function was made)
                continue
            if isinstance(value, (types.FunctionType, types.MethodType)):
                follow.append(value)
            else:
                out.append((f"closure variable {name!r}", value))
        g = f.__globals__
        for name in global_names(code):
            if name not in g:
                continue
            value = g[name]
            if isinstance(value, (types.FunctionType, types.MethodType)):
                follow.append(value)
            elif not isinstance(value, OPAQUE):
                out.append((f"global {name!r}", value))
        return follow

    functions(fn, visit, out)
    return out


def walk(roots_: list[tuple[str, Any]], is_tensor: Callable[[Any], bool],
         tensor_state: Callable[[Any], Iterable[tuple[str, Any]]] | None = None) -> Reach:
    """Every tensor reachable from ``roots_`` through containers and object attributes, and through
    ``tensor_state(t)`` of each tensor found: the state a tensor itself holds (a parameter's ``.grad``,
    path ``....weight.grad``).

    The walk keeps each object's path as a link to its parent's and spells it out for tensors only, and pushes no
    value it would not enter (:data:`ATOMS`, :data:`OPAQUE`) nor an empty container: a module holds a dozen hook
    dicts, nearly always empty, a model's configuration hundreds of plain values, and warmup walks the function's
    state twice per call.  Whether a value is :data:`OPAQUE` is decided by its type, once per type: ``isinstance``
    would ask each instance its ``__class__``, which a configuration class with its own ``__getattribute__``
    (transformers') answers slowly, and every layer holds the model's configuration."""
    reach = Reach()
    visits = Visits(MAX_NODES, MAX_DEPTH)
    seen, first = visits.seen, visits.first
    bindings, tensors = reach.bindings, reach.tensors
    skip = skipped
    # (object, link, depth); a link is (None, root name) or (the parent's link, step)
    stack: list[tuple[Any, tuple[Any, Any], int]] = [(value, (None, name), 0) for name, value in reversed(roots_)
                                                      if not skip(value)]
    found = reach.iterators
    found.extend((v, name) for name, v in roots_ if type(v) is types.GeneratorType)  # (skipped: opaque)
    empty = PLAIN_CONTAINERS
    while stack:
        obj, link, depth = stack.pop()
        obj = unwrap_own(obj)  # a graphed Module: what it wraps, not graphjit's state
        if is_tensor(obj):
            path = _spelled(link)
            bindings[path] = id(obj)
            tensors.setdefault(id(obj), (obj, path))
            if tensor_state is not None and depth <= MAX_DEPTH:
                for name, child in tensor_state(obj):
                    if child is not None:
                        stack.append((child, (link, (".", name)), depth + 1))
            continue
        if id(obj) in seen:  # (Visits.first's own test, without its call for the most common answer)
            continue
        if not first(obj, depth):
            if visits.full:
                break
            continue
        if iterators.kind(type(obj)) is not None:
            found.append((obj, describe(_spelled(link))))
        depth += 1
        kept: list[tuple[Any, tuple[Any, Any], int]] = []
        for kind, items in _items(obj):
            for key, child in items:
                if (type(child) in empty and not child) or skip(child):
                    if type(child) is types.GeneratorType and first(child, depth):
                        found.append((child, describe(_spelled((link, (kind, key))))))
                    continue
                kept.append((child, (link, (kind, key)), depth))
        kept.reverse()  # popped in their own order: a tensor's path is the first that leads to it
        stack.extend(kept)
    reach.truncated = visits.truncated
    return reach


class ByType:
    """``type(v) in atoms or isinstance(v, kinds)``, decided once per type of ``v``: ``isinstance`` asks a value its
    ``__class__``, slowly where its class has its own ``__getattribute__`` (transformers' configurations, which every
    layer of a model holds).  A type that says another class is its own (a ``__class__`` of its own: a wrapt proxy,
    such as a graphed function standing for the function it wraps) is asked each time, as ``isinstance`` would."""

    __slots__ = ("atoms", "kinds", "known")

    MAX_TYPES = 4096
    """Types remembered at most: classes made at run time (one per call, say) are not kept alive forever."""

    def __init__(self, kinds: tuple[type, ...], atoms: frozenset[Any] = frozenset()) -> None:
        self.kinds = kinds
        self.atoms = atoms
        self.known: dict[type, bool | None] = {}

    def __call__(self, v: Any) -> bool:
        tp = type(v)
        found = self.known.get(tp, _UNKNOWN)
        if found is _UNKNOWN:
            found = self.decide(tp)
        return isinstance(v, self.kinds) if found is None else found  # type: ignore[return-value]

    def decide(self, tp: type) -> bool | None:
        if len(self.known) >= self.MAX_TYPES:
            self.known.clear()
        found = self.known[tp] = None if tells_class(tp) else tp in self.atoms or issubclass(tp, self.kinds)
        return found


def tells_class(tp: type) -> bool:
    """Instances of ``tp`` may say another class is theirs (a ``__class__`` of its own below ``object``)."""
    return any("__class__" in vars(c) for c in tp.__mro__[:-1])


_UNKNOWN: Any = object()
skipped = ByType(OPAQUE, ATOMS)
"""A value a walk does not enter (:data:`ATOMS`, :data:`OPAQUE`)."""


def _items(obj: Any) -> list[tuple[str, Iterable[tuple[Any, Any]]]]:
    """``(step kind, (key, child) pairs)`` of what ``obj`` holds: items of a list, tuple or dict (``"[]"``), none of a
    set, attributes of any other object (``"."``: its ``__dict__``, then its ``__slots__``)."""
    tp = type(obj)
    if tp is list or tp is tuple or isinstance(obj, (list, tuple)):
        return [("[]", enumerate(obj))]
    if tp is dict or isinstance(obj, dict):
        return [("[]", list(obj.items()))]
    if isinstance(obj, (set, frozenset)):
        return []
    out: list[tuple[str, Iterable[tuple[Any, Any]]]] = []
    d = instance_dict(obj)
    if d is not None:
        out.append((".", list(d.items())))
    slots = slots_of(tp)
    if slots:
        out.append((".", _slot_values(obj, slots)))
    return out


def _slot_values(obj: Any, names: tuple[str, ...]) -> list[tuple[str, Any]]:
    out = []
    for name in names:
        try:
            out.append((name, object.__getattribute__(obj, name)))
        except (AttributeError, TypeError):
            continue
    return out


def _spelled(link: tuple[Any, Any]) -> Path:
    """The path a walk's link stands for: ``(root name, step, ...)``."""
    steps = []
    while link[0] is not None:
        link, step = link
        steps.append(step)
    steps.append(link[1])
    steps.reverse()
    return tuple(steps)


def added_tensors(before: Reach, after: Reach) -> list[tuple[Any, Path]]:
    """The tensors ``after`` reaches at paths that held none in ``before`` (state a call created), each once."""
    out: dict[int, tuple[Any, Path]] = {}
    for p, tid in after.bindings.items():
        if p not in before.bindings and tid not in before.tensors and tid not in out:
            out[tid] = (after.tensors[tid][0], p)
    return list(out.values())


def addresses(reach: Reach, data_ptr: Callable[[Any], int]) -> dict[int, int]:
    """``id(tensor) -> address of its memory`` for every tensor of ``reach`` (those that have one)."""
    out: dict[int, int] = {}
    for tid, (t, _path) in reach.tensors.items():
        try:
            out[tid] = data_ptr(t)
        except Exception:  # a tensor without memory of its own (meta, sparse): nothing to compare
            continue
    return out


def moved(reach: Reach, before: dict[int, int], data_ptr: Callable[[Any], int]) -> list[Path]:
    """Paths of the tensors of ``reach`` whose memory is not where :func:`addresses` found it: the same tensor
    object now over other memory (torch's ``.data =``/``set_``/``resize_``, a tracer that writes a result back
    by sharing its buffer).  A CUDA graph would go on reading and writing the old memory."""
    now = addresses(reach, data_ptr)
    return [path for tid, (_t, path) in reach.tensors.items()
            if tid in before and tid in now and now[tid] != before[tid]]


def rebinds(before: Reach, after: Reach) -> tuple[list[Path], list[Path]]:
    """``(rebound, added)``: paths whose tensor was replaced or removed by the call, and paths that
    hold a tensor only after it.  A gradient set to None (``.grad``) is not a rebinding: a replay leaves it
    as it is, and the next call's backward or graph writes it again where it is used."""
    now = after.bindings
    rebound = [p for p, tid in before.bindings.items()
               if now.get(p) != tid and (p in now or p[-1:] != ((".", "grad"),))]
    added = [p for p in now if p not in before.bindings]
    return rebound, added


def same_roots(a: list[tuple[str, Any]], b: list[tuple[str, Any]]) -> bool:
    """Whether two lists of roots (:func:`roots`) name the same objects under the same names."""
    return len(a) == len(b) and all(x[0] == y[0] and x[1] is y[1] for x, y in zip(a, b, strict=True))


def unwrap(fn: Any) -> Any:
    """The Python function behind decorators that keep ``__wrapped__`` (functools.wraps, wrapt); a class is
    returned as it is."""
    seen = 0
    while seen < 16:
        inner = getattr(fn, "__wrapped__", None) if not isinstance(fn, type) else None
        if inner is None or inner is fn:
            break
        fn, seen = inner, seen + 1
    return fn


def global_names(code: types.CodeType) -> list[str]:
    """Global names ``code`` and the code objects nested in it refer to."""
    names: list[str] = []
    todo = [code]
    while todo:
        c = todo.pop()
        names.extend(c.co_names)
        todo.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    return list(dict.fromkeys(names))


_SLOTS: dict[type, tuple[str, ...]] = {}


def slots_of(tp: type) -> tuple[str, ...]:
    """The ``__slots__`` names of ``tp`` and its bases (``__dict__`` and ``__weakref__`` aside), cached."""
    found = _SLOTS.get(tp)
    if found is None:
        names: list[str] = []
        for cls in tp.__mro__:
            own = cls.__dict__.get("__slots__", ())
            for n in (own,) if isinstance(own, str) else own:
                if n not in ("__dict__", "__weakref__"):
                    names.append(n)
        found = _SLOTS[tp] = tuple(names)
    return found


def instance_dict(obj: Any) -> dict[str, Any] | None:
    """``obj``'s own ``__dict__`` (read past any ``__getattr__`` / ``__getattribute__`` of its class), or None."""
    try:
        d = object.__getattribute__(obj, "__dict__")
    except (AttributeError, TypeError):
        return None
    return d if isinstance(d, dict) else None


HOLDER_DEPTH = 2
HOLDER_ITEMS = 64


def instances(roots: list[tuple[str, Any]], kinds: tuple[type, ...],
              opaque: tuple[type, ...] = ()) -> list[tuple[str, Any]]:
    """The objects of ``kinds`` among ``roots`` and up to :data:`HOLDER_DEPTH` levels into their lists, tuples,
    dicts and plain objects' attributes (a trainer holding ``.optimizer``), the first :data:`HOLDER_ITEMS` of each,
    each object once, named by where it was found.  Objects of ``opaque`` (and types, modules, functions) are not
    entered.  Used once per key to find the training state a step reaches; never on the replay path."""
    found: dict[int, tuple[str, Any]] = {}
    seen: set[int] = set()
    stop = (type, types.ModuleType, types.FunctionType, *opaque)
    for name, value in roots:
        for where, obj in _holders(name, value, 0, seen, kinds, stop):
            found.setdefault(id(obj), (where, obj))
    return list(found.values())


def _holders(name: str, value: Any, depth: int, seen: set[int], kinds: tuple[type, ...],
             stop: tuple[type, ...]) -> Iterable[tuple[str, Any]]:
    if isinstance(value, kinds):
        yield name, value
        return
    if depth >= HOLDER_DEPTH or id(value) in seen or isinstance(value, stop) or value.__class__ in ATOMS:
        return
    seen.add(id(value))
    if isinstance(value, (list, tuple)):
        items: list[tuple[str, Any]] = [(f"{name}[{i}]", v) for i, v in enumerate(value[:HOLDER_ITEMS])]
    elif isinstance(value, dict):
        items = [(f"{name}[{k!r}]", v) for k, v in list(value.items())[:HOLDER_ITEMS]]
    else:
        d = getattr(value, "__dict__", None)
        if not isinstance(d, dict):
            return
        items = [(f"{name}.{k}", v) for k, v in list(d.items())[:HOLDER_ITEMS]]
    for where, v in items:
        yield from _holders(where, v, depth + 1, seen, kinds, stop)


def modules_in(name: str, value: Any, depth: int = 0) -> Iterator[tuple[str, Any]]:
    """``(path, object)`` of the Layer/Module objects in an argument (itself, or in its lists, tuples and dicts, three
    levels down, 64 items each): a key holds them by identity, not by their values."""
    if depth > 3:
        return
    if backends.identity_keyed(type(value)):
        yield name, value
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value[:64]):
            yield from modules_in(f"{name}[{i}]", v, depth + 1)
    elif isinstance(value, dict):
        for k, v in list(value.items())[:64]:
            yield from modules_in(f"{name}[{k!r}]", v, depth + 1)


_USER_MODULES: dict[str, bool] = {}  # a module's file -> whether it is the user's own code
_NOT_USER = tuple(dict.fromkeys(os.path.realpath(p) + os.sep for k, p in sysconfig.get_paths().items()
                                if k in ("stdlib", "platstdlib", "purelib", "platlib")))
_PACKAGES = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}")  # any installed package's folder
_GRAPHJIT = os.path.dirname(os.path.realpath(__file__)) + os.sep


def user_module(m: types.ModuleType) -> bool:
    """Whether ``m`` is a module of the user's own code (``import config`` beside the script), whose attributes a
    function reads as values (``config.SCALE``): one with a file outside Python's standard library, the installed
    packages (any site-packages or dist-packages folder: torch, transformers) and graphjit, whose attributes are code
    and constants."""
    return user_globals(m.__dict__)  # (not getattr: a module's own __getattr__ may raise anything)


def user_globals(g: dict[str, Any]) -> bool:
    """:func:`user_module` of the module whose globals are ``g``."""
    file = g.get("__file__")
    if not isinstance(file, str):
        return False  # built into the interpreter, or a namespace package
    found = _USER_MODULES.get(file)
    if found is None:
        real = os.path.realpath(file)
        found = _USER_MODULES[file] = not real.startswith((*_NOT_USER, _GRAPHJIT)) and not any(
            part in real for part in _PACKAGES)
    return found


def class_methods(tp: type, names: Iterable[str] | None = None) -> dict[str, Any]:
    """``name -> object`` of the plain methods (functions in a class ``__dict__``, not dunders) and descriptors
    (``property``, ``staticmethod``: its function, ``cached_property``) that instances of ``tp`` find along its MRO,
    of ``names`` where given, each only where reading it off ``tp`` gives that very object (a metaclass that wraps
    lookups, a ``classmethod``, bound anew at each read: left out, a guard could not compare it)."""
    out: dict[str, Any] = {}
    for _cls, k, child in _found_on_classes(tp, names):
        found = child.__func__ if type(child) is staticmethod else child
        if type(found) is types.FunctionType or isinstance(child, _DESCRIPTORS):
            try:
                if getattr(tp, k) is found:
                    out[k] = found
            except Exception:  # a class's own lookup may raise anything
                continue
    return out


_DESCRIPTORS = (property, functools.cached_property)


def inherited_values(tp: type, keep: Callable[[Any], bool], names: Iterable[str] | None = None) -> dict[str, Any]:
    """``name -> value`` of the values ``keep`` accepts (the guardable ones: numbers, strings, ...) that instances of
    ``tp`` find on one of its bases (not on ``tp`` itself), of ``names`` where given: a guard reads them off ``tp``, so
    one set later on ``tp`` or on a class between shadows it."""
    return {k: child for cls, k, child in _found_on_classes(tp, names) if cls is not tp and keep(child)}


def _found_on_classes(tp: type, names: Iterable[str] | None) -> Iterator[tuple[type, str, Any]]:
    """``(class, name, value)`` of each attribute (not a dunder; of ``names`` where given) that instances of ``tp`` find
    on a class of its MRO, from the first class that defines it (``object`` and builtin classes left out)."""
    seen: set[str] = set()
    wanted = None if names is None else set(names)
    for cls in tp.__mro__:
        if cls is object or cls.__module__ == "builtins":
            continue
        for k, child in list(vars(cls).items()):
            if not isinstance(k, str) or k in seen or k.startswith("__") or (wanted is not None and k not in wanted):
                continue
            seen.add(k)
            yield cls, k, child


def own_class(v: Any) -> bool:
    """``v`` is a class whose attributes a walk reads: not a builtin one, nor one of :data:`FOREIGN_MODULES`."""
    return isinstance(v, type) and v.__module__.partition(".")[0] not in _NOT_WALKED


_NOT_WALKED = FOREIGN_MODULES | {"builtins", "typing", "abc", "collections", "enum", "types"}
