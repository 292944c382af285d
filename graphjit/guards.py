"""Guards: the Python values a graph froze when it was captured, checked before every replay.

A CUDA graph holds the kernels of one run of the function, with every Python value that run read baked
in: a temperature in an attribute, a global flag, the learning rate in an optimizer's ``param_groups``,
a slice bound.  The key (:mod:`graphjit.keys`) covers the arguments; everything else the function reads
is guarded here, as Dynamo and Paddle's SOT guard the values a compiled frame reads.

What is guarded (decided once per key, at capture, by :func:`scan`):

* **Where**: the closure cells and the globals of the function (and of the Python functions it reaches
  through them, up to :data:`reach.MAX_FUNCTIONS`; islands are not followed: they run on every call), the object
  it is bound to (``self``, a graphed Layer/Module object), a callable object's attributes, and the
  Layer/Module objects passed as arguments (keyed by identity); from there, containers (lists, tuples,
  dicts) and object attributes (``__dict__``, ``__slots__``): submodules, configs, optimizers and their
  ``param_groups``, schedulers; through a graphed function or Module to what it wraps, never into graphjit's own
  state (:class:`~graphjit.reach.OwnWrapper`).  Tensors are captured by address; those a Module holds are held
  (below), the others (a closure's, a global, an object's attribute, a list or dict entry) are pinned: compared by
  identity before every replay (:meth:`Scan.pin`; one rebound to a tensor of the same kind may be fed instead:
  :mod:`graphjit.renewals`).
* **Which values**: numbers, bools, strings, bytes, ``None``, enum members, other hashable atoms without
  attributes (``torch.dtype``, ``torch.device``), and tuples of these, compared by ``==``, sets by a frozen copy of
  their contents, tuples of these and of objects item by item (:mod:`graphjit.guardable`); and, by identity,
  the objects held in attributes, closure cells and globals (a function, a submodule, a config object: a
  rebound one is another graph's); class attributes the instances do not shadow; the entries of a
  Module's ``_parameters`` / ``_buffers`` the code names, by identity (*held* tensors: the graph reads them at
  their addresses, so a rebound one, ``m.b = new_tensor``, is another graph's), compared only after the framework
  said one of its modules rebound a parameter or buffer (:func:`note_rebind`, torch's registration hooks; always
  where the framework cannot say: Paddle).  Not: lists and dicts of more than :data:`MAX_ITEMS` items (lookup
  tables); a tensor's storage replaced in place (``p.data = ...``, ``module.half()``).
* **Lengths**: of every list reached and of a container module's dict of submodules (``ModuleList``,
  ``Sequential``, ``ModuleDict``): code that iterates them would run an item added after the capture.  **Keys**, in
  order, of every dict of settings reached (string keys, plain values) where the function's code iterates a dict
  (names ``items``, ``keys`` or ``values``: ``for k, v in options.items()`` would read a key added later).  Not of
  other dicts: a cache a function fills by key (one entry per shape) would end its other graphs.
* **Shadowing**: a class attribute an object reads (``self.temp`` where only the class sets ``temp``) is guarded on
  the class, and the object's ``__dict__`` is guarded to stay without that name (shown as ``own(self.temp)``): an
  instance attribute set after the capture would shadow the value the graph froze.
* **Per context**: a ``ContextVar``'s value, a ``threading.local``'s attributes (:mod:`graphjit.context_values`).
* **Module hooks**: the forward and backward hook dicts of the modules reached, and the framework's global ones
  (:mod:`graphjit.module_hooks`): a hook registered or removed after the capture is a changed read value.
* **Which names**: every attribute step of a value's path must be named by code the call may run
  (:mod:`graphjit.names`: the function's code, the functions reached above, and the code its last warmup call
  ran as Python, per object: the code that took that object as an argument; where that run is unknown the
  methods of the classes reached).  A value only the training loop names (``model.step_count``) is not read by the
  function and changes nothing.  Dict keys and list items below a named attribute always count.

:class:`GuardSet` keeps one getter per container (``operator.itemgetter`` / ``attrgetter`` of the guarded names), the
values it returned at capture, and where each list, dict and tuple was found (:meth:`Scan.link`: a rebound one,
``m.cfg = {...}``, is read there again).  :meth:`GuardSet.holds` checks those parents by identity in one pass
(:class:`~graphjit.guard_links.Links`) and compares every getter's result in one list comparison (identity, then
``==``): about 35 ns per container, 50 per linked one, a few per value.  :func:`scan` runs at capture and in watched
warmup calls (a function that writes a Python value on every call: :mod:`graphjit.py_writes`), never on a replay.
"""

from __future__ import annotations

import collections
import functools
import operator
import types
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from . import absences, backends, context_values
from .guard_links import Place
from .guard_set import DELETED, GuardSet, HasKey, note_rebind, same, show
from .guard_sources import LINKED, Sources, pinnable, sources
from .guardable import MAX_ITEMS, SCALAR_TYPES, by_identity, contents_of, guardable, opaque, settings, snapshot
from .module_hooks import collect_hooks, of_self
from .names import NO_PROBES, Probes, class_names
from .reach import (
    FOREIGN_MODULES,
    PLAIN_CONTAINERS,
    Path,
    Visits,
    class_methods,
    describe,
    inherited_values,
    instance_dict,
    own_class,
    slots_of,
    unwrap_own,
    user_globals,
    user_module,
)

__all__ = ["DELETED", "MAX_DEPTH", "MAX_ITEMS", "MAX_NODES", "READ_VALUES", "REASON", "WRITES", "GuardSet", "Scan",
           "Sources", "describe", "guardable", "note_rebind", "same", "scan", "show", "sources"]

MAX_NODES = 100_000
MAX_DEPTH = 48
REASON = "value read by the function changed"
"""The start of the reason of a call whose guarded values differ from every captured graph's (a path follows)."""
READ_VALUES = "values the function reads"
"""The part of a key, before its modes, that holds the read values a graph was captured for (:class:`GuardSet`)."""
WRITES = "writes a Python value on every call"  # the reason of a key whose function changes a guarded value itself


_ITERATING = frozenset(("items", "keys", "values"))


@dataclass
class _Box:
    """One container's guarded entries, read by ``kind``: ``"item"`` or ``"globals"`` by subscript (a dict, a list,
    a module's globals), ``"attr"`` or ``"cell"`` by attribute (an object's slots, a class, a closure cell)."""

    container: Any
    kind: str
    entries: dict[Any, tuple[Any, Path]] = field(default_factory=dict)  # key -> (value, path)
    owner: Any = None  # the object whose ``__dict__`` the container is, if it is one


@dataclass
class Scan:
    """The guardable values one walk found, by container, and the names the code may read."""

    boxes: dict[int, _Box] = field(default_factory=dict)
    names: set[str] = field(default_factory=set)
    truncated: bool = False
    renewed: tuple[tuple[type, str], ...] = ()  # (type, attribute) the framework renews every call: not values
    loads: bool = False  # an object reached says when its state is loaded (an optimizer's load_state_dict)
    held: dict[int, _Box] = field(default_factory=dict)  # a Module's parameter and buffer dicts: tensors by identity
    pinned: dict[int, _Box] = field(default_factory=dict)  # other tensors the code reads: by identity, every replay
    hooks: dict[int, tuple[dict[Any, Any], Path]] = field(default_factory=dict)  # the modules' hook dicts reached
    functions: dict[int, tuple[Any, Path]] = field(default_factory=dict)  # Python functions reached in objects
    # whole containers: ``(id, what) -> (container, getter, value, path)``; what: "len" (lists, container modules'
    # dicts), "keys" (dicts of settings, their keys in order) or "has:NAME" (an instance dict without a class
    # attribute's name: :meth:`unshadowed`)
    wholes: dict[tuple[int, str], tuple[Any, Callable[[Any], Any], Any, Path]] = field(default_factory=dict)
    class_containers: dict[int, set[str]] = field(default_factory=dict)  # id(class) -> its containers walked
    # id(list, dict or tuple) -> where the walk first read it (:data:`~graphjit.guard_links.Place`), in the order met (a
    # parent before its children); a guard reads it there again where the parent now holds another (``m.cfg = {...}``)
    links: dict[int, Place] = field(default_factory=dict)
    absent: dict[int, tuple[dict[str, Any], set[str], Path, bool]] = field(default_factory=dict)  # kept_absent
    second: dict[int, list[Place]] = field(default_factory=dict)  # other places the walk found the same one at
    in_place: set[int] = field(default_factory=set)  # ids of the objects' __dict__s walked (read in place, never moved)

    def renews(self, owner: Any, key: Any) -> bool:  # ``renewed``: not a value, not walked (its counters count up)
        return bool(self.renewed) and any(key == n and isinstance(owner, t) for t, n in self.renewed)

    def add(self, container: Any, kind: str, key: Any, value: Any, path: Path, owner: Any = None) -> None:
        container, key, value = absences.where_stored(container, key, value)  # (os.environ's: its own dict)
        box = self.boxes.get(id(container))
        if box is None:
            box = self.boxes[id(container)] = _Box(container, kind, owner=owner)
        box.entries.setdefault(key, (snapshot(value), path))

    def link(self, child: Any, parent: Any, kind: str, key: Any, path: Path) -> None:
        """``child`` was read as ``parent[key]`` (kind ``"item"``, ``"globals"``) or ``getattr(parent, key)``
        (``"attr"``, ``"cell"``) at ``path``: where it is a list or a dict (held by no identity guard: a rebuilt equal
        one is the same value) or a tuple (compared by ``==``: an equal one may hold other lists), remember where, so a
        rebound one is read there again (:class:`~graphjit.guard_links.Links`); a second place too."""
        if not isinstance(child, LINKED):
            return
        place = (parent, kind, key, child, path)
        first = self.links.setdefault(id(child), place)
        if first is not place and not (first[0] is parent and first[2] == key):
            self.second.setdefault(id(child), []).append(place)

    def length(self, container: Any, path: Path) -> None:
        """A list, or a container module's dict of submodules, whose length is guarded: code that iterates it runs an
        item added after the capture, which the graph does not hold (any size: ``len`` costs the same)."""
        self.wholes.setdefault((id(container), "len"), (container, len, len(container), path))

    def key_set(self, container: dict[str, Any], path: Path) -> None:
        """A dict of settings (string keys, plain values) whose keys are guarded, in order: code that iterates it
        (``for k, v in options.items()``) would read a key added after the capture."""
        self.wholes.setdefault((id(container), "keys"), (container, tuple, tuple(container), path))

    def unshadowed(self, d: dict[str, Any], name: str, path: Path) -> None:
        """A dict ``d`` without ``name`` the code may read: the guard that it stays without.  An instance's
        ``__dict__`` without a class attribute the instance reads (an instance attribute set after the capture would
        shadow the class's value the graph froze), or without a name the code probes (``getattr`` with a default,
        ``hasattr``), a dict without a key it probes (``get``, ``in``), a module's globals without a name it loads."""
        d, key = absences.where_absent(d, name)  # (os.environ's: its own dict)
        self.wholes.setdefault((id(d), "has:" + name), (d, HasKey(key), False, path))

    def kept_absent(self, d: dict[str, Any], name: str, path: Path, keys: bool) -> None:
        """``name`` is not in ``d`` (found at ``path``), looked up with a fallback: the guard that it stays out, one C
        ``isdisjoint`` per dict for all such names: an object's ``__dict__`` (``keys`` False: ``absent(path)``, read in
        place) or a dict read as a value (``keys`` True: ``absent keys(path)``, read where its parent holds it now)."""
        got = self.absent.get(id(d))
        if got is None:
            got = self.absent[id(d)] = (d, set(), path, keys)
        got[1].add(name)

    def named_wholes(self) -> list[tuple[str, Any, Callable[[Any], Any], Any, Path]]:
        """``(what, container, getter, value, path)`` of the :meth:`length`, :meth:`key_set` and :meth:`unshadowed`
        entries (``len``, ``keys``, ``own``) whose path's attribute steps are all named by code the function may run."""
        out = [("own" if what.startswith("has:") else what, *e) for (_i, what), e in self.wholes.items()
               if _attributes_named(e[3], self.names)]
        for d, names, path, keys in self.absent.values():
            if not _attributes_named(path, self.names):
                continue
            kept = frozenset(names)  # a dict: itself (read where rebound); an object's __dict__: its live keys view
            out.append(("absent keys", d, kept.isdisjoint, True, path) if keys else
                       ("absent", d.keys(), operator.methodcaller("isdisjoint", kept), True, path))
        return out

    def hold(self, container: Any, key: Any, value: Any, path: Path) -> None:
        """A tensor (None; ``DELETED``: a name its code looked up, absent) a Module holds in its dict ``container``
        of parameters, buffers or submodules: compared by identity (``.get(key, DELETED)``)."""
        box = self.held.get(id(container))
        if box is None:
            box = self.held[id(container)] = _Box(container, "item")
        box.entries.setdefault(key, (value, path))

    def pin(self, container: Any, kind: str, key: Any, value: Any, path: Path) -> None:
        """A tensor held elsewhere than in a Module's parameter or buffer dict, or a list or dict whose entries are
        guarded (in a closure cell, a global, an object's attribute, a list or dict entry): compared by identity before
        every replay (no framework says when it is rebound)."""
        box = self.pinned.get(id(container))
        if box is None:
            box = self.pinned[id(container)] = _Box(container, kind)
        box.entries.setdefault(key, (value, path))

    def values(self, held: bool = False, pinned: bool = False) -> dict[tuple[int, Any], tuple[Any, Path]]:
        """``(id(container), key) -> (value, path)`` of every candidate whose path's attribute steps are all named
        by code the function may run (a closure variable's or global's own name always counts, and so does a dict
        key: it may come from a variable); ``held``: of the held tensors instead; ``pinned``: of the pinned ones."""
        names = self.names
        out: dict[tuple[int, Any], tuple[Any, Path]] = {}
        for cid, box in (self.held if held else self.pinned if pinned else self.boxes).items():
            prefix: Path | None = None  # the entries of a box share their container's path: checked once
            named = False
            for key, vp in box.entries.items():
                path = vp[1]
                if len(path) < 2:
                    out[(cid, key)] = vp
                    continue
                if path[:-1] != prefix:
                    prefix = path[:-1]
                    named = _attributes_named(prefix, names)
                last = path[-1]
                if named and (last[0] != "." or last[1] in names):
                    out[(cid, key)] = vp
        return out


def _attributes_named(path: Path, names: set[str]) -> bool:
    """Every attribute step of ``path`` (after its root) is a name in ``names``."""
    return all(step[1] in names for step in path[1:] if step[0] == ".")


def _push(stack: list[tuple[Any, Path, int, Any]], unpinned: set[int], pins: bool, child: Any, path: Path, depth: int,
          out: Scan, at: tuple[Any, str, Any] | None) -> None:
    """Walk ``child`` next, read as ``at`` (``(parent, kind, key)``: :meth:`Scan.link`; None: a ContextVar's value,
    read whole); where its parent pins nothing (under an optimizer, a scheduler, a scaler), neither does it."""
    if not pins:
        unpinned.add(id(child))
    if at is not None:
        out.link(child, *at, path)
    stack.append((child, path, depth, None))


def _graphjits(obj: Any) -> bool:
    """``obj`` is one of graphjit's own objects (a method graphjit put in a model's place, ``graph_generation``'s
    ``_prepare_static_cache``): its state is graphjit's bookkeeping, never a value of the call."""
    return type(obj).__module__.partition(".")[0] == "graphjit"


def _follow_method(out: Scan, stack: list[tuple[Any, Path, int, Any]], child: Any, path: Path, depth: int) -> None:
    """Where ``child`` (a value guarded by identity) is a bound method, walk the object it is bound to next: what
    its code reads off ``self`` (``self.post = pp.scale`` reads ``pp.temperature``) is a value of the call too (the
    call reads ``__self__`` when it calls the method: a name of its code).  Where it is a Python function (``self.act
    = lambda x: x * k``, ``fns[0]``), its closure cells, globals and defaults are sources of the call's values, taken
    with the hooks' (:func:`_hook_sources`); where it is a weak reference, the object it refers to is walked."""
    if type(child) is types.MethodType and not opaque(child.__self__) and not _graphjits(child.__self__):
        out.names.add("__self__")
        stack.append((child.__self__, (*path, (".", "__self__")), depth + 1, None))
    elif type(child) is types.FunctionType and user_globals(child.__globals__):  # (not an installed package's)
        out.functions.setdefault(id(child), (child, path))
    elif type(child) is weakref.ReferenceType:  # what it refers to (``self._parent().scale``), read off that object
        target = child()
        if target is not None and not opaque(target):
            stack.append((target, (*path, ("()", "")), depth + 1, None))


def scan(src: Sources, is_tensor: Callable[[Any], bool], ran: Iterable[str] | None = None, holders: Iterable[str] = (),
         by_object: dict[int, frozenset[str]] | None = None, transparent: Iterable[str] = (),
         renewed: tuple[tuple[type, str], ...] = (), hook_holders: tuple[str, ...] = (),
         watch_loads: Callable[[Any], bool] | None = None, probes: Probes = NO_PROBES,
         probed_by_object: dict[int, frozenset[str]] | None = None,
         read_globals: Iterable[tuple[Any, str]] = (), hooks_outside: bool = False,
         global_hooks: Iterable[tuple[dict[Any, Any], Path]] = ()) -> Scan:
    """Every guardable value the sources reach (see the module docstring).  ``ran``: the names the code of the
    last warmup call used (:class:`NameRecorder`, the function run as Python); None where that is not known
    (a tracer that runs a program instead, a profiler in the way): then every name the methods of the classes
    of the reached objects use counts.  ``holders``: attributes whose dicts hold a module's tensors
    (``_parameters``, ``_buffers``: their entries are captured by address, a ``None`` bias among them too).

    ``by_object``: ``id(object) -> names`` the code that ran with that object as an argument used (``self``
    included; :class:`~graphjit.names.NameRecorder`).  With it an attribute of such an object counts only if
    that code or the function's own code names it (a Linear's ``training`` flag, which no code of the call reads
    off the Linear, is not a value of the call); an object no code took as an argument (a config reached as
    ``self.config``) is checked against every name that ran.  ``transparent``: the attributes through which a
    Module holds its submodules, parameters and buffers: their dict keys count as the owner's attributes.
    ``hook_holders``: attributes whose dicts hold a module's hooks, collected in ``Scan.hooks`` for
    :mod:`graphjit.module_hooks` (empty or not: a hook registered later lands there), of every module reached and
    of all modules below it, named or not; their entries are not values.  ``watch_loads(obj)``: for each optimizer,
    scheduler or scaler reached, True where the framework will say when its state is loaded (``Scan.loads``:
    :func:`graphjit.guard_set.note_load`), which rebinds the lists and dicts whose entries are guarded.

    ``probes``: what the code that ran may find absent (:func:`graphjit.names.code_probes`), kept absent where
    :mod:`graphjit.absences` says (``probed_by_object``: ``id(object) -> names`` its code looked up on it while it was
    an argument).  ``read_globals``: ``(globals, name)`` the code that ran loaded (:func:`~.absences.of_globals`)."""
    holding = frozenset(holders)
    children = tuple(transparent)
    through = frozenset(children) | holding
    out = Scan(renewed=renewed, links=dict(src.anchors))
    out.names.update(src.names)
    # the attributes through which a Module holds its submodules count as named (which of their keys count: decided by
    # the walk, keys_of), and the method its __call__ runs; a value under a submodule was dropped for want of "_modules"
    out.names.update(through, ("forward",))
    if ran is not None:
        out.names.update(ran)
    own: dict[int, frozenset[str]] = {}
    probes = probes | src.probes
    for g, var, gpath in src.absent:
        out.unshadowed(g, var, gpath)

    def names_for(o: Any) -> Any:
        if by_object is None:
            return None
        got = own.get(id(o))
        if got is None:
            known = by_object.get(id(o))
            got = own[id(o)] = frozenset(out.names) if known is None else known | src.names
        return got
    # the function's code iterates a dict (.items(), .keys(), .values()): its dicts of settings have their keys guarded
    iterates = not _ITERATING.isdisjoint(src.names)
    classes: set[type] = set()  # the classes of the objects reached
    instances: list[tuple[type, dict[str, Any], Path, Any]] = []  # (class, __dict__, path, names) of those objects
    by_name: set[type] = set()  # classes reached as values (a global class, one held in an attribute)
    _take_slots(out, src.slots, by_name)
    visits = Visits(MAX_NODES, MAX_DEPTH)
    stack: list[tuple[Any, Path, int, Any]] = [(value, (name,), 0, None) for name, value in reversed(src.objects)]
    absences.of_globals(read_globals, src.own_globals, out, stack)
    absences.of_environment(read_globals, out)
    done: set[type] = set()
    # what an optimizer, a scheduler or a scaler holds (and everything below): its tensors are state, captured by
    # address, never pinned (an optimizer's state holds several per parameter: a check of each per replay would cost)
    unpinned: set[int] = set()
    hooked: set[int] = set()  # the hooks whose closure cells and globals were taken as sources
    while True:  # the objects reached, then the containers their classes hold, until no new class is reached
        while stack:
            obj, path, depth, keys_of = stack.pop()  # keys_of: a held dict's keys count as its owner's attributes
            obj = unwrap_own(obj)  # a graphed function or Module: what it wraps, never graphjit's own state
            tp = type(obj)
            if tp is types.MethodType or tp is types.FunctionType:  # (guarded by identity where it was found) what
                _follow_method(out, stack, obj, path, depth - 1)  # it is bound to, or its closure and globals
                continue
            if tp is types.ModuleType:  # a user's module an object holds (``self.cfg = config``): the globals the
                if user_module(obj):  # call's code names, as of one held as a global (non-user modules: opaque)
                    stack.append((vars(obj), path, depth + 1, frozenset(out.names)))
                continue
            pins = id(obj) not in unpinned
            if isinstance(obj, (list, collections.deque)):
                out.length(obj, path)
            if tp is dict and not obj and keys_of is None and absences.probed_dict(obj, path, through):
                for k in probes.keys:  # an empty dict: the keys its code probes stay absent
                    out.kept_absent(obj, k, path, True)
            if (tp in PLAIN_CONTAINERS and not obj) or tp in SCALAR_TYPES or is_tensor(obj) or opaque(obj):
                if own_class(obj):  # a class held by an object or a container: its attributes, as below
                    by_name.add(obj)
                continue  # (a module's dozen hook dicts are nearly always empty: nothing to guard in them)
            if not visits.first(obj, depth):
                if visits.full:
                    break
                continue
            if isinstance(obj, (tuple, frozenset, set)):
                for i, child in enumerate(obj if isinstance(obj, tuple) else ()):
                    if isinstance(child, set) and guardable(child):  # a set in a tuple changes in place: read again
                        out.add(obj, "item", i, child, (*path, ("[]", i)))
                    elif pins and pinnable(child):  # a tensor in a tuple: by identity (``==`` would compare values)
                        out.pin(obj, "item", i, child, (*path, ("[]", i)))
                    elif not guardable(child):
                        _push(stack, unpinned, pins, child, (*path, ("[]", i)), depth + 1, out, (obj, "item", i))
                continue
            if isinstance(obj, (list, collections.deque)):
                big = len(obj) > MAX_ITEMS
                for i, child in enumerate(obj):
                    if (guardable(child) or by_identity(child, is_tensor)) and not big:
                        out.add(obj, "item", i, child, (*path, ("[]", i)))
                        _follow_method(out, stack, child, (*path, ("[]", i)), depth)
                    elif pins and pinnable(child) and not big:
                        out.pin(obj, "item", i, child, (*path, ("[]", i)))
                    if not guardable(child):
                        _push(stack, unpinned, pins, child, (*path, ("[]", i)), depth + 1, out, (obj, "item", i))
                continue
            if context_values.scan_into(obj, path, out, functools.partial(  # a ContextVar: its value
                    _push, stack, unpinned, pins, depth=depth + 1, out=out)):
                continue
            if (whole := contents_of(obj)) is not None:  # a bytearray, a numpy array: edited in place (``a[0] = 2``)
                out.wholes.setdefault((id(obj), "contents"), (obj, whole, whole(obj), path))
                continue
            if isinstance(obj, dict):
                holder = len(path) > 1 and path[-1][0] == "." and path[-1][1] in holding
                big = (len(obj) > MAX_ITEMS and keys_of is None) or holder  # (named keys only: any size)
                if iterates and not big and keys_of is None and settings(obj):
                    out.key_set(obj, path)
                if not big and keys_of is None and absences.probed_dict(obj, path, through):
                    for k in probes.keys:
                        if k not in obj:
                            out.kept_absent(obj, k, path, True)
                for k, child in list(obj.items()):
                    if keys_of is not None and k not in keys_of:
                        continue  # a submodule (parameter, buffer) no code of the call names
                    if holder and (child is None or is_tensor(child)):
                        out.hold(obj, k, child, (*path, ("[]", k)))
                        continue
                    if (guardable(child) or by_identity(child, is_tensor)) and not big:
                        out.add(obj, "item", k, child, (*path, ("[]", k)))
                        _follow_method(out, stack, child, (*path, ("[]", k)), depth)
                    elif pins and pinnable(child) and not big:
                        out.pin(obj, "item", k, child, (*path, ("[]", k)))
                    if not guardable(child):
                        _push(stack, unpinned, pins, child, (*path, ("[]", k)), depth + 1, out, (obj, "item", k))
                continue
            if tp.__module__.partition(".")[0] in FOREIGN_MODULES and not context_values.per_context(obj):
                continue
            if isinstance(obj, functools.partial):  # what its call passes, read in C: ``p.keywords["scale"] = 2.0``
                out.names.update(("args", "keywords"))
                out.names.add("func")
                _follow_method(out, stack, obj.func, (*path, (".", "func")), depth)
                for name, child in (("args", obj.args), ("keywords", obj.keywords)):
                    if guardable(child):
                        out.add(obj, "attr", name, child, (*path, (".", name)))
                    else:
                        _push(stack, unpinned, pins, child, (*path, (".", name)), depth + 1, out, (obj, "attr", name))
            classes.add(tp)
            named = names_for(obj)
            d = context_values.object_dict(obj)  # a threading.local's: the calling thread's attributes
            d = instance_dict(obj) if d is None else d
            if backends.identity_keyed(tp) and (d is None or holding.isdisjoint(d)):  # not a Module: its state
                pins = False
                if watch_loads is not None and watch_loads(obj):
                    out.loads = True
            if d is not None:
                out.in_place.add(id(d))
                instances.append((tp, d, path, named))
                if hook_holders:
                    collect_hooks(d, path, hook_holders, children, out.hooks)
                for k, child in list(d.items()):
                    if not isinstance(k, str) or k in hook_holders or out.renews(obj, k):  # hooks: HookWatch's
                        continue
                    container = hasattr(tp, "__getitem__") or hasattr(tp, "__iter__")
                    if container and k in children and isinstance(child, dict):
                        out.length(child, (*path, (".", k)))  # a module appended to a ModuleList would run uncaptured
                    if named is not None and k in through:
                        # a container module (ModuleList, ModuleDict, Sequential) hands out its entries by index or by
                        # a key in a variable: all count; another module's entries count where its code names them
                        keys = None if container else named
                        stack.append((child, (*path, (".", k)), depth + 1, keys))
                        continue
                    if named is not None and k not in named:
                        continue  # no code of the call reads it off this object
                    if guardable(child):
                        out.add(d, "item", k, child, (*path, (".", k)), obj)
                        _follow_method(out, stack, child, (*path, (".", k)), depth)
                        continue
                    if by_identity(child, is_tensor):
                        out.add(d, "item", k, child, (*path, (".", k)), obj)
                    elif pins and pinnable(child) and k not in through:
                        out.pin(d, "item", k, child, (*path, (".", k)))
                    _push(stack, unpinned, pins, child, (*path, (".", k)), depth + 1, out, (d, "item", k))
                for k in absences.attribute_probes(obj, depth, probes, src.probes, by_object, probed_by_object):
                    if k not in d and not absences.on_class(tp, k) and not any(k in d.get(h, ()) for h in through):
                        out.kept_absent(d, k, path, False)
                        for h in (h for h in through if isinstance(d.get(h), dict)):  # a Module's: held absent
                            out.hold(d[h], k, DELETED, (*path, (".", h), ("[]", k)))  # (``register_buffer``)
            for name in slots_of(tp):
                if (named is not None and name not in named) or out.renews(obj, name):
                    continue
                try:
                    child = object.__getattribute__(obj, name)
                except (AttributeError, TypeError):
                    continue
                if guardable(child) or by_identity(child, is_tensor):
                    out.add(obj, "attr", name, child, (*path, (".", name)))
                    _follow_method(out, stack, child, (*path, (".", name)), depth)
                elif pins and pinnable(child):
                    out.pin(obj, "attr", name, child, (*path, (".", name)))
                if not guardable(child):
                    _push(stack, unpinned, pins, child, (*path, (".", name)), depth + 1, out, (obj, "attr", name))
        more = _hook_sources(out, hooked, by_name, hooks_outside, global_hooks)
        if more:  # what the hooks found so far hold: walked like the function's own
            stack.extend(more)
            continue
        new = [tp for tp in classes | by_name if tp not in done]
        if not new:
            break
        done.update(new)
        for tp in new:
            # a class the code reads as a value: the attributes the function's code names (or code that ran with the
            # class as its argument: a classmethod), not every name its methods use (a counter only the loop ticks)
            read = None if tp in classes else src.names | (by_object or {}).get(id(tp), frozenset())
            _class_attributes(tp, out, stack, ran, read)
    _unshadowed(out, instances)
    out.truncated = visits.truncated
    return out


def _take_slots(out: Scan, slots: Iterable[tuple[Any, str, Any, Path]], by_name: set[type]) -> None:
    """The values of closure cells, globals and helpers' defaults (:attr:`Sources.slots`): guarded, a tensor pinned, a
    class remembered."""
    for container, kind, key, path in slots:
        try:
            value = container[key] if kind == "globals" else getattr(container, key)
        except (KeyError, ValueError, AttributeError):
            continue
        if pinnable(value):
            out.pin(container, kind, key, value, path)
            continue
        out.add(container, kind, key, value, path)
        if own_class(value):  # a class the function names: its attributes are read values too (``Config.scale``)
            by_name.add(value)


def _hook_sources(out: Scan, taken: set[int], by_name: set[type], outside: bool,
                  global_hooks: Iterable[tuple[dict[Any, Any], Path]]) -> list[tuple[Any, Path, int, Any]]:
    """The closure cells and globals of the module hooks found so far (:attr:`Scan.hooks`), each hook once, as sources
    of the call's values: guarded (a steering hook's ``out * ctl.coef`` or ``scale[0]``), and the objects they hold
    returned to walk.  A hook runs inside the call: what it reads is read by the graph as much as the function's own.
    ``outside``: the graphed function is the ``forward`` of the object the scan calls ``self``, whose own hooks run
    outside it (:func:`graphjit.module_hooks.watch`): their closures are not the call's.  A hook whose code cannot be
    read (an object whose ``__getattr__`` raises) is left out.  ``global_hooks``: the framework's hook dicts that run
    around every module's call (torch's ``register_module_forward_hook``), taken where the scan reached a module."""
    stack: list[tuple[Any, Path, int, Any]] = []
    hooked = [(hooks, path, True) for hooks, path in [*out.hooks.values(), *(global_hooks if out.hooks else ())]]
    reached = [({id(fn): fn}, path, False) for fn, path in out.functions.values()]  # by id: no "[key]" in the label
    for hooks, path, hook in [*hooked, *reached]:
        if hook and outside and of_self(path):  # (a function self holds runs inside the call: not skipped)
            continue
        for key, fn in list(hooks.items()):
            if not callable(fn) or id(fn) in taken:
                continue
            taken.add(id(fn))
            where = describe(path if key == id(fn) else (*path, ("[]", key)))
            try:
                found = sources(fn, None)
            except Exception:  # a user object's lookups may raise anything
                continue
            out.names.update(found.names)
            _take_slots(out, [(c, k, n, (f"{where}: {p[0]}", *p[1:])) for c, k, n, p in found.slots], by_name)
            stack.extend((value, (f"{where}: {name}",), 0, None) for name, value in found.objects)
    return stack


def _unshadowed(out: Scan, instances: list[tuple[type, dict[str, Any], Path, Any]]) -> None:
    """For each reached object, each class attribute guarded on its class (or a base) that the code may read off
    it and its ``__dict__`` does not hold: guard that it stays so (:meth:`Scan.unshadowed`)."""
    read_off: dict[int, set[str]] = {}
    for cid, box in out.boxes.items():
        if box.kind == "attr" and isinstance(box.container, type):
            read_off[cid] = {k for k, (v, _p) in box.entries.items() if type(v) is not types.FunctionType}
    for cid, names in out.class_containers.items():
        read_off.setdefault(cid, set()).update(names)
    if not read_off:
        return
    for tp, d, path, named in instances:
        for cls in tp.__mro__:
            for k in read_off.get(id(cls), ()):
                if k not in d and (named is None or k in named):
                    out.unshadowed(d, k, (*path, (".", k)))


def _class_attributes(tp: type, out: Scan, stack: list[tuple[Any, Path, int, Any]], ran: Iterable[str] | None,
                      read: frozenset[str] | None) -> None:
    """The class attributes of ``tp`` (and its bases) that instances read where they do not shadow them (``read``:
    only these names): plain values and methods (by identity) are guarded; a list, tuple or dict of at most
    :data:`MAX_ITEMS` entries is put on ``stack`` for the walk, which guards its length, its items and what they hold,
    nested containers and objects included (shared state: ``table = {"scale": [2.0]}`` on the class)."""
    if ran is None and read is None:
        out.names.update(class_names(tp))
    for cls in tp.__mro__:
        if cls is object or cls.__module__ == "builtins" or id(cls) in out.boxes:
            continue
        for k, child in list(vars(cls).items()):
            if not isinstance(k, str) or k.startswith("__") or (read is not None and k not in read):
                continue
            cpath: Path = (f"class {cls.__qualname__}", (".", k))
            if guardable(child):
                out.add(cls, "attr", k, child, cpath)
            elif isinstance(child, (list, tuple, dict)) and 0 < len(child) <= MAX_ITEMS:
                out.link(child, cls, "attr", k, cpath)
                stack.append((child, cpath, 1, None))
                out.class_containers.setdefault(id(cls), set()).add(k)
            elif isinstance(child, list):
                out.length(child, cpath)
    # what its instances find on a base, read off ``tp`` itself: one set later on it, a class between or the base
    # (``Sub.scale = 5.0``, ``Attention.forward = f``, ``Block.s = property(...)``) is a changed value
    for k, method in {**inherited_values(tp, guardable, read), **class_methods(tp, read)}.items():
        out.add(tp, "attr", k, method, (f"class {tp.__qualname__}", (".", k)))


