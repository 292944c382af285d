"""Python scalars a call advances inside the objects it is passed, set again after each replay of its key.

A key holds the values of the scalars inside the objects a call is passed (:mod:`graphjit.keys`).  Some calls
change them: transformers' sliding-window cache layers (Gemma 2 and 3) count their length in a Python int,
``layer.cumulative_length_int += 1``, on every decode step.  Such a call changes its own key, and its graph is
right only for the value its key holds (the count also sets the attention mask's offset, frozen into the graph).
Replayed as it is, the graph would leave the count where the capture left it, and the next call would find it
there and replay the same graph again.

An *advance* makes such a key replayable: where every leaf a warmup run changed is a plain scalar (``int``,
``float`` or ``bool``, of one type before and after) stored in a list, a dict or an object's attribute reached
from an argument, graphjit records the value each one had after the run.  Every later watched run of the key must
leave the same values (the key fixes the values before; a call whose values after depend on anything else runs
uncaptured), and each replay sets them, in the order the key lists them, as the call's Python code would have.
The next call then signs with the advanced values and finds the next key: one graph per value of the counter,
each captured on its own, as CUDAGraph Trees records one graph per value of an int input.

What is checked, so that a replay leaves what one eager call would:

* the scalars are all the run changed of its key: put back to their values before the run, the call signs to the
  key again (:meth:`Advances.explains`; a change the leaves' texts do not show, a value's type, is caught here);
* every watched run of the key, and its capturing call, leaves them at the same values (a call whose values after
  depend on anything else than the key runs uncaptured);
* a run of a key whose scalars are already known (a later warmup run, the capturing call) leaves the objects on
  their paths in place: a call that replaces one (``cache.state = State(n + 1)``) would have its value set in the
  old object by a replay.  A key captured after a single watched run (``warmup=1``) is checked by its capturing
  call;
* before each replay, the call's scalars share places as in the calls that found them (:meth:`Advances.targets`:
  a cache whose two layers are one object advances that object twice, eagerly): a call where they do not runs
  uncaptured, counted under :data:`LAYOUT`.

Refused (the key runs uncaptured, as before, under ``changes its own signature``): a changed tensor, ``None`` that
became a value, a scalar in a tuple or a deque, the function's own arguments being rebound, a function with
``dynamic=`` arguments, and a key whose graph has islands (an island's Python would read the scalars before the
replay's end sets them).  Nothing here runs on a replay path of a key without advances.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .leaves import BOUND, MODES, Change, Label
from .tree import Attr

_INT = re.compile(r"-?\d+")

LAYOUT = "holds the values it advances in objects shared otherwise than at capture"
"""The reason of a call of a key with advances whose scalars' objects are shared otherwise than in the calls that
found them (two layers that are one object, or one that became two): eager would advance them otherwise."""

Target = tuple[Any, bool, Any]
"""Where one scalar lives in a call: ``(the object holding it, is_attribute, its name or subscript)``."""


@dataclass(frozen=True)
class Advance:
    """One scalar a key's call moves from ``before`` to ``after``: found at ``root`` (an argument's position or
    name) through ``steps`` (``(is_attribute, name-or-subscript)``, the last one the scalar's own)."""

    label: Label
    root: int | str
    steps: tuple[tuple[bool, Any], ...]
    before: Any
    after: Any

    def target(self, args: Sequence[Any], kwargs: dict[str, Any]) -> Target:
        """Where the scalar lives in this call (raises LookupError/AttributeError/TypeError where the path is
        gone)."""
        return _target(self.root, self.steps, args, kwargs)


def _chain(root: int | str, steps: Sequence[tuple[bool, Any]], args: Sequence[Any],
           kwargs: dict[str, Any]) -> list[Any]:
    """The objects on a scalar's path in a call: the argument, then each object its steps but the last lead to
    (raises LookupError/AttributeError/TypeError where the path is gone)."""
    obj = args[root] if isinstance(root, int) else kwargs[root]
    out = [obj]
    for is_attr, sub in steps[:-1]:
        obj = getattr(obj, sub) if is_attr else obj[sub]
        out.append(obj)
    return out


def _target(root: int | str, steps: Sequence[tuple[bool, Any]], args: Sequence[Any],
            kwargs: dict[str, Any]) -> Target:
    is_attr, sub = steps[-1]
    return _chain(root, steps, args, kwargs)[-1], is_attr, sub


def put(target: Target, value: Any) -> None:
    """Set a scalar where :meth:`Advance.target` found it: an item by subscript, an attribute in the object's
    ``__dict__`` where the walk read it (:func:`graphjit.tree.object_fields`), else its slot, past any
    ``__setattr__`` of the class (a frozen dataclass's), as the call itself must have written it."""
    obj, is_attr, sub = target
    if not is_attr:
        obj[sub] = value
        return
    d = getattr(obj, "__dict__", None)
    if isinstance(d, dict) and sub in d:
        d[sub] = value
    else:
        object.__setattr__(obj, sub, value)


def _layout(targets: Sequence[Target]) -> tuple[int, ...]:
    """Which scalars share a place: for each, the index of the first one at the same object and name."""
    first: dict[tuple[int, Any], int] = {}
    return tuple(first.setdefault((id(obj), sub), i) for i, (obj, _a, sub) in enumerate(targets))


class Advances:
    """The scalars one key's call advances (see the module docstring): :meth:`targets` before each replay (None:
    the call cannot replay), :meth:`apply` after it."""

    __slots__ = ("counted", "items", "layout", "paths")

    def __init__(self, items: Sequence[Advance], paths: Sequence[str], layout: tuple[int, ...],
                 counted: frozenset[int] = frozenset()) -> None:
        self.items = tuple(items)
        self.paths = tuple(paths)  # for stats and report: ``argument 'cache'.layers[0].n``
        self.layout = layout  # which of them share a place in the calls that found them (_layout)
        # ints a replay moves by their step from the call's own value instead of setting (a family's counters,
        # graphjit/families.py: its graph serves other values of them); once per place, as the run moved it once
        self.counted = counted

    def counting(self, counted: frozenset[int]) -> Advances:
        """These advances, the ``counted`` ones (indices of ``int`` items) moved by their step from the call's value
        (:mod:`graphjit.families`)."""
        return Advances(self.items, self.paths, self.layout, counted)

    def targets(self, args: Sequence[Any], kwargs: dict[str, Any]) -> list[Target] | None:
        """Where this call holds the scalars, or None where a path is gone or they share places otherwise than in
        the calls that found them (eager would advance a shared one twice): the call must then run uncaptured."""
        try:
            found = [item.target(args, kwargs) for item in self.items]
        except (LookupError, AttributeError, TypeError):
            return None
        return found if _layout(found) == self.layout else None

    def apply(self, targets: Sequence[Target]) -> None:
        """What the call's Python code would have left: each scalar set to its value after the call; a counted one
        moved by its step from its value in this call (for the key's own value, the same)."""
        counted = self.counted
        for i, (item, target) in enumerate(zip(self.items, targets)):
            if i not in counted:
                put(target, item.after)
            elif self.layout[i] == i:  # a place two paths share moved once, by the whole step the run made
                put(target, value_at(target) + (item.after - item.before))

    def explains(self, args: Sequence[Any], kwargs: dict[str, Any], sign: Callable[[], Any], key: Any) -> bool:
        """Whether these scalars are all the run changed of its key: with each put back to its value before the run,
        ``sign()`` gives ``key`` again (a change the leaves' texts do not show, such as a value's type, would not);
        the values after the run are set again in any case."""
        targets = self.targets(args, kwargs)
        if targets is None:
            return False
        try:
            for item, target in zip(self.items, targets):
                put(target, item.before)
            return bool(sign() == key)
        finally:
            for item, target in zip(self.items, targets):
                put(target, item.after)

    def left(self, args: Sequence[Any], kwargs: dict[str, Any]) -> bool:
        """Whether this call's objects hold the values after (a capturing call's run left them the same way)."""
        targets = self.targets(args, kwargs)
        return targets is not None and all(
            type(v := value_at(t)) is type(item.after) and v == item.after for item, t in zip(self.items, targets))

    def holders(self, args: Sequence[Any], kwargs: dict[str, Any]) -> tuple[int, ...] | None:
        """``id()`` of every object on the scalars' paths in this call (None where a path is gone): a run that
        replaced one of them by a new object holding the advanced value is not one a replay can redo, since a
        replay sets the value in the object the call was passed."""
        try:
            return tuple(id(obj) for item in self.items for obj in _chain(item.root, item.steps, args, kwargs))
        except (LookupError, AttributeError, TypeError):
            return None

    def same_as(self, other: Advances) -> bool:
        """The same scalars left at the same values (of the same types), in places shared the same way."""
        return self.layout == other.layout and len(self.items) == len(other.items) and all(
            a.label == b.label and type(a.after) is type(b.after) and a.after == b.after
            for a, b in zip(self.items, other.items))


def value_at(target: Target) -> Any:
    """The scalar at ``target`` now."""
    obj, is_attr, sub = target
    return getattr(obj, sub) if is_attr else obj[sub]


def find(found: Sequence[Change], args: Sequence[Any], kwargs: dict[str, Any]) -> list[Advance] | None:
    """The advances of a run whose signature changed at ``found`` (its leaves' texts before and after), read in the
    call's bound ``args`` and ``kwargs`` as the run left them; None where any change is not one (module docstring)."""
    out: list[Advance] = []
    for change in found:
        item = _advance(change, args, kwargs)
        if item is None:
            return None
        out.append(item)
    return out or None


def layout_of(items: Sequence[Advance], args: Sequence[Any], kwargs: dict[str, Any]) -> tuple[int, ...]:
    """:func:`_layout` of the places ``items`` have in this call (found by :func:`find`: every path resolves)."""
    return _layout([item.target(args, kwargs) for item in items])


def _advance(change: Change, args: Sequence[Any], kwargs: dict[str, Any]) -> Advance | None:
    label = change.label
    if label in (MODES, BOUND) or len(label) < 3 or change.old is None or change.new is None:
        return None  # a scalar bound to an argument itself cannot be changed by the call
    root = label[1]
    if isinstance(root, bool) or not isinstance(root, (int, str)):
        return None
    steps = tuple((isinstance(sub, Attr), sub) for sub in label[2:])
    try:
        target = _target(root, steps, args, kwargs)
        value = value_at(target)
    except (LookupError, AttributeError, TypeError):
        return None
    parent, is_attr, sub = target
    before = _parsed(value, change.old)
    if not _settable(parent, is_attr, sub) or before is _NO or repr(value) != change.new:
        return None
    return Advance(label, root, steps, before, value)


def _settable(parent: Any, is_attr: bool, sub: Any) -> bool:
    if not is_attr:  # (not a deque: the Python state graphjit puts back around its own runs copies lists and dicts)
        return isinstance(parent, (list, dict))
    d = getattr(parent, "__dict__", None)
    if isinstance(d, dict) and sub in d:
        return True
    return any(sub in getattr(cls, "__slots__", ()) for cls in type(parent).__mro__)


_NO = object()


def _parsed(value: Any, before: str) -> Any:
    """The value of ``before`` (the text its leaf had) if ``value`` is an advanceable scalar and ``before`` the text
    of one of the same type; else :data:`_NO`."""
    tp = type(value)
    if tp is bool:
        return before == "True" if before in ("True", "False") else _NO
    if tp is int:
        return int(before) if _INT.fullmatch(before) else _NO
    if tp is float:
        if before in ("True", "False", "None") or _INT.fullmatch(before):
            return _NO
        try:
            return float(before)
        except ValueError:
            return _NO
    return _NO


__all__ = ["LAYOUT", "Advance", "Advances", "find", "layout_of", "put", "value_at"]
