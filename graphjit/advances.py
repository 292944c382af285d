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

A run of a key whose scalars are already known (a later warmup run, the capturing call) is checked to leave the
objects on their paths in place: a key whose call replaces one (``cache.state = State(n + 1)``) runs uncaptured,
since a replay would set the value in the old object where the call made a new one.  A key captured after a single
watched run (``warmup=1``) is checked by its capturing call.

Refused (the key runs uncaptured, as before, under ``changes its own signature``): a changed tensor, ``None`` that
became a value, a scalar in a tuple (it cannot be set), the function's own arguments being rebound, or a function
with ``dynamic=`` arguments.  Nothing here runs on a replay path of a key without advances.
"""

from __future__ import annotations

import collections
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .leaves import BOUND, MODES, Change, Label
from .tree import Attr

_INT = re.compile(r"-?\d+")


@dataclass(frozen=True)
class Advance:
    """One scalar a key's call leaves at ``after``: found at ``root`` (an argument's position or name) through
    ``steps`` (``(is_attribute, name-or-subscript)``, the last one the scalar's own)."""

    label: Label
    root: int | str
    steps: tuple[tuple[bool, Any], ...]
    after: Any

    def set(self, args: Sequence[Any], kwargs: dict[str, Any]) -> None:
        """Set the scalar in this call's objects (raises LookupError/AttributeError where the path is gone)."""
        obj = args[self.root] if isinstance(self.root, int) else kwargs[self.root]
        for is_attr, sub in self.steps[:-1]:
            obj = getattr(obj, sub) if is_attr else obj[sub]
        is_attr, sub = self.steps[-1]
        if not is_attr:
            obj[sub] = self.after
            return
        d = getattr(obj, "__dict__", None)
        if isinstance(d, dict) and sub in d:  # where the walk read it (tree.object_fields): no __setattr__ hook
            d[sub] = self.after
        else:
            setattr(obj, sub, self.after)


class Advances:
    """The scalars one key's call advances (see the module docstring); :meth:`apply` after each replay."""

    __slots__ = ("items", "paths")

    def __init__(self, items: Sequence[Advance], paths: Sequence[str]) -> None:
        self.items = tuple(items)
        self.paths = tuple(paths)  # for stats and report: ``argument 'cache'.layers[0].n``

    def apply(self, args: Sequence[Any], kwargs: dict[str, Any]) -> None:
        """What the call's Python code would have left: each scalar set to its value after the call."""
        for item in self.items:
            item.set(args, kwargs)

    def holders(self, args: Sequence[Any], kwargs: dict[str, Any]) -> tuple[int, ...] | None:
        """``id()`` of every object on the scalars' paths in this call (None where a path is gone): a run that
        replaced one of them by a new object holding the advanced value is not one a replay can redo, since a
        replay sets the value in the object the call was passed."""
        out: list[int] = []
        try:
            for item in self.items:
                obj = args[item.root] if isinstance(item.root, int) else kwargs[item.root]
                out.append(id(obj))
                for is_attr, sub in item.steps[:-1]:
                    obj = getattr(obj, sub) if is_attr else obj[sub]
                    out.append(id(obj))
        except (LookupError, AttributeError, TypeError):
            return None
        return tuple(out)

    def same_as(self, other: Advances) -> bool:
        """The same scalars left at the same values (of the same types)."""
        return len(self.items) == len(other.items) and all(
            a.label == b.label and type(a.after) is type(b.after) and a.after == b.after
            for a, b in zip(self.items, other.items))


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


def _advance(change: Change, args: Sequence[Any], kwargs: dict[str, Any]) -> Advance | None:
    label = change.label
    if label in (MODES, BOUND) or len(label) < 3 or change.old is None or change.new is None:
        return None  # a scalar bound to an argument itself cannot be changed by the call
    root = label[1]
    if isinstance(root, bool) or not isinstance(root, (int, str)):
        return None
    steps = tuple((isinstance(sub, Attr), sub) for sub in label[2:])
    try:
        parent = args[root] if isinstance(root, int) else kwargs[root]
        for is_attr, sub in steps[:-1]:
            parent = getattr(parent, sub) if is_attr else parent[sub]
        is_attr, sub = steps[-1]
        value = getattr(parent, sub) if is_attr else parent[sub]
    except (LookupError, AttributeError, TypeError):
        return None
    if not _settable(parent, is_attr, sub) or not _scalar(value, change.old) or repr(value) != change.new:
        return None
    return Advance(label, root, steps, value)


def _settable(parent: Any, is_attr: bool, sub: Any) -> bool:
    if not is_attr:
        return isinstance(parent, (list, dict, collections.deque))
    d = getattr(parent, "__dict__", None)
    if isinstance(d, dict) and sub in d:
        return True
    return any(sub in getattr(cls, "__slots__", ()) for cls in type(parent).__mro__)


def _scalar(value: Any, before: str) -> bool:
    """``value`` is an advanceable scalar, and ``before`` (the text its leaf had) a value of the same type."""
    tp = type(value)
    if tp is bool:
        return before in ("True", "False")
    if tp is int:
        return _INT.fullmatch(before) is not None
    if tp is float:
        if before in ("True", "False", "None") or _INT.fullmatch(before):
            return False
        try:
            float(before)
        except ValueError:
            return False
        return True
    return False


__all__ = ["Advance", "Advances", "find"]
