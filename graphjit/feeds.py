"""Hyperparameters a graphed training step reads as Python numbers, fed to its graph through device tensors.

A CUDA graph bakes every Python number its kernels were launched with.  An optimizer's learning rate changes
every step under a schedule; guarded (:mod:`graphjit.guards`), such a value would end the graph on every call.
An optimizer that accepts its learning rate as a tensor (torch's Adam and AdamW made capturable, or fused)
reads it from device memory instead.  While graphjit runs a call of a graphed function (warmup, capture, verify
and replay alike), each fed ``param_group["lr"]`` holds a device tensor graphjit owns, filled with the number
the user, a scheduler or ``ReduceLROnPlateau`` put there; after the call the number is back.  The graph reads
the tensor, so a new number costs one fill kernel before the replay, and no new capture.

Guarantees: the user's code and schedulers only ever see their own numbers outside a graphed call; a tensor one
slot holds is filled before any kernel of the call that reads it runs (same stream), and only when its number
changed; slots are shared by every graphed function and key that reads the same group (one tensor per group
entry), so a fill is never skipped for a tensor another key filled since.  A tuple of numbers (Adam's betas) is fed
through a tuple of tensors.  Refuses: a value that is not a plain number or such a tuple at the time of the call
(a tensor the user put there, say) is left in place and guarded as any value.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

NUMBER = (int, float)
ZERO_DECIDES = frozenset(("momentum", "weight_decay"))
"""Names whose zero decides what the step does, not only by how much (torch's SGD keeps no momentum buffer at
momentum 0): a zero stays a number, guarded, so it gets a graph of its own."""


class Slot:
    """The device tensor of one ``group[name]`` and the number it holds."""

    __slots__ = ("last", "tensor")

    def __init__(self, tensor: Any) -> None:
        self.tensor = tensor
        self.last: float | None = None


_SLOTS: weakref.WeakKeyDictionary[Any, dict[tuple[int, str], Slot]] = weakref.WeakKeyDictionary()


def slot(owner: Any, group: int, name: str, make: Callable[[], Any]) -> Slot:
    """The one slot of ``owner.param_groups[group][name]`` (made by ``make()`` the first time)."""
    slots = _SLOTS.setdefault(owner, {})
    found = slots.get((group, name))
    if found is None:
        found = slots[(group, name)] = Slot(make())
    return found


def _numbers_for(value: Any, tensors: Any) -> bool:
    """True if ``value`` is a tuple of numbers with one tensor of the tuple ``tensors`` for each."""
    return (value.__class__ is tuple and tensors.__class__ is tuple and len(value) == len(tensors)
            and all(v.__class__ in NUMBER for v in value))


class StepPart:
    """One part of a :class:`StepContext`; every hook does nothing unless a part says otherwise."""

    __slots__ = ()

    def enter(self) -> None:
        """Before the call (``exit`` follows only an ``enter`` that returned)."""

    def exit(self) -> None:
        """After the call, also when it raised."""

    def learn(self) -> bool:
        """After a call that ran the Python function; True if the step's state changed."""
        return False

    def replayed(self) -> None:
        """After a replay."""

    def captured(self) -> None:
        """Once a key the context serves is captured."""

    def stale(self) -> str | None:
        """Before a replay (after ``enter``): why the captured graph no longer acts as the call would, or None."""
        return None


class Feeds(StepPart):
    """The fed entries of one key: a context manager put around each call graphjit runs for it.

    ``entries``: ``(container, name, slot)``; ``fill(tensor, number)`` writes a number into a slot's tensor
    without a host sync."""

    __slots__ = ("entries", "fill", "saved")

    def __init__(self, entries: list[tuple[dict[str, Any], str, Slot]], fill: Callable[[Any, float], None]) -> None:
        self.entries = entries
        self.fill = fill
        self.saved: list[Any] = []

    def __len__(self) -> int:
        return len(self.entries)

    def enter(self) -> None:
        saved = self.saved = []
        for container, name, s in self.entries:
            value = container[name]
            saved.append(value)
            if value.__class__ in NUMBER and value == 0 and name in ZERO_DECIDES:
                continue  # left a number: a zero turns a part of the step off, as it does eagerly
            if value.__class__ not in NUMBER:
                if not _numbers_for(value, s.tensor):
                    continue  # the user's own tensor (or the slot itself, in a nested call): left as it is
                if value != s.last:  # a tuple of numbers (Adam's betas), a tuple of tensors its slot
                    for t, v in zip(s.tensor, value):
                        self.fill(t, v)
                    s.last = value
            elif value != s.last:
                self.fill(s.tensor, value)
                s.last = value
            container[name] = s.tensor

    def exit(self) -> None:
        for (container, name, s), value in zip(self.entries, self.saved):
            if container.get(name) is s.tensor and value is not s.tensor:
                container[name] = value
        self.saved = []


class StepContext:
    """What graphjit puts around each call of a key of a training step (:meth:`Backend.prepare_step`): parts
    with ``enter()`` / ``exit()`` (run in reverse order, also when the call raises; ``exit`` of a part not
    entered does nothing), ``learn()``, called after a call that ran the Python function (warmup, capture),
    when the step's state may have grown, ``replayed()`` after a replay, and ``captured()``, once a key it serves
    is captured."""

    __slots__ = ("parts",)

    def __init__(self, parts: list[StepPart]) -> None:
        self.parts = parts

    def __enter__(self) -> StepContext:
        done = []
        try:
            for part in self.parts:
                part.enter()
                done.append(part)
        except BaseException:
            for part in reversed(done):
                part.exit()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for part in reversed(self.parts):
            part.exit()

    def learn(self) -> bool:
        """True if a part changed the step's state (an optimizer made capturable): the key needs another watched
        warmup call before its capture."""
        changed = False
        for part in self.parts:
            changed = bool(part.learn()) or changed
        return changed

    def replayed(self) -> None:
        """After a replay of a key this context serves."""
        for part in self.parts:
            part.replayed()

    def captured(self) -> None:
        """A key this context serves is captured."""
        for part in self.parts:
            part.captured()

    def stale(self) -> str | None:
        """Before a replay of a key this context serves: the first part's reason why the graph would not act as the
        call does (the call then runs uncaptured under it), or None."""
        for part in self.parts:
            why = part.stale()
            if why is not None:
                return why
        return None
