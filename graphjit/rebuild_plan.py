"""The output tree of a replay planned once (:func:`rebuilder`): the walk of :func:`tree.rebuild` decided at capture,
so that a replay rebuilds only the containers and objects above a fresh leaf, hands back the call's own tensors and
argument objects where an eager call returns them, builds a container met twice once, and rebuilds a transformers
``ModelOutput`` from its state rather than by its constructor where both give the same (:func:`_own_dict`).

The walks are module-level functions, not recursive closures (see :mod:`graphjit.tree`).
"""

from __future__ import annotations

import collections
import copy
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from .tree import (
    MIRROR,
    SEQUENCES,
    Call,
    Path,
    at,
    collect_tensors,
    dict_attrs,
    is_object,
    made,
    made_anew,
    object_fields,
    own_type,
    plain_model_output,
)

FRESH = -1
"""A leaf source for :func:`rebuilder`: the leaf takes the next of the call's fresh tensors."""
KEEP = -2
"""A leaf source for :func:`rebuilder`: the leaf stays the template's own tensor."""


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
    run = _run if nodes.of_call else _run_fresh  # without the call's tensors or arguments: the fresh tensors alone
    if nodes.shared:  # one container or object met twice (``return out, out``): built once per call, kept in a slot
        node, slots = nodes.share(node)
        return functools.partial(_run_shared, node, slots, run)
    return functools.partial(run, node)


# A planned node: (kind, value, children).  kind: 0 a constant, 1 the i-th fresh tensor, 2 a dict, 3 a list,
# 4 a tuple, 5 another sequence, 6 an object (its changed attributes only), 7 the call's tensor i (value: (i, the
# template's)), 8 the call's argument at a path (value: (path, the node without a call)), 9 a dict subclass with
# attributes (value: (the template, [its decision], its attributes planned): _own_dict), 10 a
# container or object met more than once (value: (its slot, its node)): built at the first, the same object after.
_Node = tuple[int, Any, Any]
_UNSET = object()


class _Planner:
    """The walk of :func:`tree.rebuild` planned once: each node and whether no leaf under it changes."""

    def __init__(self, sources: Iterator[int], is_tensor: Callable[[Any], bool],
                 argument: Callable[[Any, list[Any]], Path | None] | None) -> None:
        self.sources = sources
        self.is_tensor = is_tensor
        self.argument = argument
        self.fresh_of: dict[int, int] = {}  # id(template's tensor) -> its index among the fresh ones
        self.of_call = False  # a node takes the call's tensors or arguments (kind 7 or 8)
        self.visiting: set[int] = set()
        self.taken: list[int] = []  # the sources consumed so far
        self.first: dict[int, tuple[_Node, bool, list[int]]] = {}  # id(container) -> its node, same, its sources
        self.shared: dict[int, _Node] = {}  # id(a first node met again) -> that node

    def plan(self, x: Any) -> tuple[_Node, bool]:
        """The node of ``x`` and whether it is ``x`` itself in every call (no leaf under it changes); consumes one
        source per tensor leaf, in :func:`collect_tensors` order."""
        if self.is_tensor(x):
            src = next(self.sources)
            self.taken.append(src)
            if src == KEEP:
                return (0, x, None), True
            if src == FRESH:  # a tensor met before takes the same fresh one (``return h, h``: one tensor twice)
                i = self.fresh_of.setdefault(id(x), len(self.fresh_of))
                return (1, i, None), False
            self.of_call = True
            return (7, (src, x), None), False
        start = len(self.taken)
        node, same = self._inner(x)
        if self.argument is not None and (isinstance(x, (dict, *SEQUENCES)) or is_object(type(x))):
            path = self.argument(x, collect_tensors(x, self.is_tensor))
            if path is not None:  # the call's own object: it differs from the template's in every call
                self.of_call = True
                return (8, (path, node), None), False
        if node[0] == 0:  # itself: the same object wherever it is met
            return node, same
        taken = self.taken[start:]
        first = self.first.get(id(x))
        if first is None:
            self.first[id(x)] = (node, same, taken)
        elif first[2] == taken:  # met again with the same leaves: the object built at its first place
            self.shared[id(first[0])] = first[0]
            return (10, id(first[0]), None), first[1]
        return node, same

    def share(self, node: _Node) -> tuple[_Node, int]:
        """``node`` with each node met more than once (:attr:`shared`) and its later places turned into a kind 10 node
        of one slot, and the number of slots: they follow the fresh tensors in the list a call's walk is given."""
        slots: dict[int, _Node] = {}
        base = len(self.fresh_of)

        def of(key: int) -> _Node:
            node = slots.get(key)
            if node is None:
                slot = base + len(slots)
                slots[key] = (10, (slot, None), None)  # its slot taken before the nodes under it take theirs
                node = slots[key] = (10, (slot, swap(self.shared[key])), None)
            return node

        def swap(n: _Node) -> _Node:
            kind, value, children = n
            if kind == 10:
                return of(value)
            if kind in (2, 9):
                children = [(k, pick(c)) for k, c in children]
                if kind == 9:
                    consts, mirrors, walked = value[2]
                    value = (value[0], value[1], (consts, mirrors, [(a, pick(c)) for a, c in walked]))
            elif kind in (3, 4, 5):
                children = [pick(c) for c in children]
            elif kind == 6:
                children = [(a, pick(c)) for a, c in children]
            elif kind == 8:
                value = (value[0], pick(value[1]))
            return (kind, value, children)

        def pick(n: _Node) -> _Node:
            return of(id(n)) if id(n) in self.shared else swap(n)

        top = pick(node)
        return top, len(slots)

    def _inner(self, x: Any) -> tuple[_Node, bool]:
        """The node of a container or object (a constant for anything else), its children planned."""
        if isinstance(x, dict):
            pairs = [(k, self.plan(v)) for k, v in x.items()]
            kids = [(k, n) for k, (n, _s) in pairs]
            same = all(s for _k, (_n, s) in pairs)
            attrs = dict_attrs(x) if id(x) not in self.visiting else []
            if not attrs:
                return (2, x, kids), same
            self.visiting.add(id(x))
            index = {k: i for i, k in enumerate(x.keys())}
            base: dict[str, Any] = {}  # the attributes in order, a constant's value in place
            mirrors: list[tuple[str, int]] = []  # (name, its item's index)
            walked: list[tuple[str, _Node]] = []  # (name, its node) where it changes
            for name, v in attrs:
                base[name] = None
                if v is MIRROR:
                    mirrors.append((name, index[name]))
                    continue
                n, kept = self.plan(v)
                same = same and kept
                if n[0] == 0:
                    base[name] = n[1]
                else:
                    walked.append((name, n))
            self.visiting.discard(id(x))
            plain = plain_model_output(type(x)) and not _slotted(type(x))
            return (9, (x, [None if plain else False, None], (base, tuple(mirrors), walked)), kids), same
        if isinstance(x, SEQUENCES):
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


def _run_shared(node: _Node, slots: int, run: Callable[..., Any], fresh: Sequence[Any],
                tensors: Sequence[Any] | None = None, call: Call | None = None) -> Any:
    """``run`` of a plan with kind 10 nodes: their slots, after the fresh tensors, empty for each call."""
    return run(node, [*fresh, *(_UNSET,) * slots], tensors, call)


def _run_fresh(node: _Node, fresh: Sequence[Any], tensors: Sequence[Any] | None = None, call: Call | None = None
               ) -> Any:
    """:func:`_run` of a plan with no node of the call's (kinds 7 and 8): the walk takes the fresh tensors alone."""
    return _walk(node, fresh)


def _walk(node: _Node, fresh: Sequence[Any]) -> Any:
    """:func:`_run` for nodes of every kind but 7 and 8, kept apart on purpose: a replay's outputs are rebuilt here
    on every call, and passing the call's tensors and arguments down every node cost 18% of that (a six-leaf
    output)."""
    kind, x, children = node
    if kind == 0:
        return x
    if kind == 1:
        return fresh[x]
    if kind == 2:
        return own_type(x, [(k, _walk(n, fresh)) for k, n in children])
    if kind == 9:
        return _own_dict(x, [(k, _walk(n, fresh)) for k, n in children], [_walk(n, fresh) for _a, n in x[2][2]])
    if kind == 3:
        return [_walk(n, fresh) for n in children]
    if kind == 4:
        return tuple(_walk(n, fresh) for n in children)
    if kind == 5:
        return own_type(x, [_walk(n, fresh) for n in children])
    if kind == 10:
        slot, inner = x
        made = fresh[slot]
        if made is _UNSET:
            made = fresh[slot] = _walk(inner, fresh)  # type: ignore[index]
        return made
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
        return own_type(x, [(k, _run(n, fresh, tensors, call)) for k, n in children])
    if kind == 9:
        return _own_dict(x, [(k, _run(n, fresh, tensors, call)) for k, n in children],
                         [_run(n, fresh, tensors, call) for _a, n in x[2][2]])
    if kind == 3:
        return [_run(n, fresh, tensors, call) for n in children]
    if kind == 4:
        return tuple(_run(n, fresh, tensors, call) for n in children)
    if kind == 5:
        return own_type(x, [_run(n, fresh, tensors, call) for n in children])
    if kind == 10:
        slot, inner = x
        made = fresh[slot]
        if made is _UNSET:
            made = fresh[slot] = _run(inner, fresh, tensors, call)  # type: ignore[index]
        return made
    clone = copy.copy(x)
    for name, n in children:
        object.__setattr__(clone, name, _run(n, fresh, tensors, call))
    return clone


def _own_dict(value: tuple[Any, list[Any], Any], items: list[tuple[Any, Any]], values: list[Any]) -> Any:
    """A planned dict subclass with attributes (node kind 9: ``value`` is ``(template, [decision, names], (its
    attributes in order with each constant's value, (mirror name, its item's index), (name, node) of those that
    change))``) rebuilt holding ``items`` and, as its attributes, the template's with a mirror its item's new value and
    the changing ones ``values``: by :func:`_state_copy` once this node's decision says so, else by :func:`own_type`
    with the attributes its constructor does not make anew set as the template had them (:func:`made_anew`: an
    attribute set after construction, a field set to None after it, which keeps its item, are as eager left them; an
    object the constructor makes for each instance is its own).  The decision is None (to be taken) only for a plain
    transformers or PaddleFormers ``ModelOutput`` (:func:`tree.plain_model_output`), and is taken once per node (one
    graph's output): at its first rebuild both ways are made and compared (:func:`_same_state`); where neither its
    items nor a refilled copy make one, its constructor takes the items as keywords."""
    x, decided, (base, mirrors, walked) = value
    attrs = base.copy()
    for name, i in mirrors:
        attrs[name] = items[i][1]
    for (name, _node), v in zip(walked, values):
        attrs[name] = v
    if decided[0]:
        return _state_copy(x, items, attrs)
    out = made(x, items, decided[0] is not None)
    anew = decided[1]
    if anew is None:  # those the constructor makes anew with nothing of the graph's under them: its own stay
        anew = decided[1] = made_anew(x) - {name for name, _node in walked}
    own = out.__dict__
    if anew:
        own.update((n, v) for n, v in attrs.items() if n not in anew)
    else:
        own.update(attrs)
    if decided[0] is None:
        try:
            decided[0] = _same_state(out, _state_copy(x, items, dict(attrs)))
        except Exception:  # instances that cannot be made without their constructor
            decided[0] = False
    return out


def _state_copy(x: dict[Any, Any], items: list[tuple[Any, Any]], attrs: dict[str, Any]) -> Any:
    """An instance of ``x``'s dict subclass made without its constructor or its own ``__setitem__``: ``items`` set
    by ``dict``'s (``OrderedDict``'s) own, ``attrs`` (a new dict: it is taken) as its ``__dict__``.  Used by
    :func:`_own_dict` only where it made the same state as the type's own route (transformers' ``ModelOutput``
    mirrors its non-None fields as items and attributes; its constructor took 21 us of a 60 us decode replay)."""
    base = _dict_base(x)
    clone = base.__new__(type(x))
    for k, v in items:
        base.__setitem__(clone, k, v)
    object.__setattr__(clone, "__dict__", attrs)
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

