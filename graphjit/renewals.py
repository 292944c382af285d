"""Tensors a graph reads off an attribute, a closure cell, a global or a list or dict entry that the caller rebinds
to new ones of the same kind: read by the graph through a tensor graphjit owns, filled before each call.

A graph reads such a tensor at its address, so the guards pin it by identity (:meth:`graphjit.guards.Scan.pin`; a
Module's buffer too, held by identity, which is where Paddle keeps a tensor set as a Layer's attribute). A
model that stores a new one on itself before each run (Qwen2-VL's ``rope_deltas`` in transformers before 5.20, made
anew by every ``generate()``) would get a graph per tensor, each keeping its tensor alive, and after
:data:`graphjit.variants.Drift.MAX_VALUES` of them would run uncaptured for good.  Instead, the first time every value
that changed for a key's graph is such a tensor (:func:`renewable`), the key is captured again with a tensor graphjit
owns at each of those places (:class:`Renewed`, a part of the key's :class:`~graphjit.feeds.StepContext`): while
graphjit runs a call of the key (warmup, capture, verify and replay alike) the place holds graphjit's tensor, filled
with the values of the caller's (one device copy on the call's stream, before any kernel of the call); after the call
the caller's tensor is back.  This is what ``torch.compile(mode="reduce-overhead")`` does for such a tensor: an input of
its graph, copied in on each call.

Guarantees: outside a graphed call the caller's code only ever finds its own tensor there; every call reads the values
the caller's tensor has at the call, wherever it was rebound; a call that wrote graphjit's tensor in place (code the
warmups did not run) has it copied back into the caller's, after that call and after every replay from then on.

Refused (the key keeps a graph per tensor, as before): a change of anything else; a tensor of another type, shape,
dtype, device, strides or ``requires_grad``, one that requires grad (autograd would lose its history), a parameter;
a tensor the key's warmup calls wrote in place or could not tell (:attr:`graphjit.warmup.Warmup.untracked`); a place
graphjit cannot write without running code of the owner's (a property, a class attribute, a container that is not a
plain ``list`` or ``dict``); an entry of a list or dict the guards read again where its parent holds it (one rebuilt
before every call would be fed at its old place); a key a counter's family serves (:mod:`graphjit.families`).
"""

from __future__ import annotations

import collections
import types
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .feeds import StepPart
from .reach import Path, describe

if TYPE_CHECKING:
    from .backends.base import Backend
    from .guard_set import GuardSet
    from .warmup import Warmup

REASON = "recaptured: a tensor it reads was rebound"

_LEFT = object()
"""Saved for a place whose tensor was left as it is (not of the kind fed there, or graphjit's own)."""


@dataclass(frozen=True)
class Place:
    """Where a fed tensor sits: ``container``'s attribute ``key`` (``by_attr``: an object's ``__dict__`` entry or a
    closure cell's contents) or its item ``key`` (a plain list or dict)."""

    container: Any
    key: Any
    by_attr: bool
    path: Path

    def read(self) -> Any:
        try:
            return getattr(self.container, self.key) if self.by_attr else self.container[self.key]
        except Exception:
            return _LEFT

    def put(self, value: Any) -> None:
        """Bind ``value`` here without running the owner's code (no ``__setattr__``, no property)."""
        c = self.container
        if not self.by_attr:
            c[self.key] = value
        elif isinstance(c, types.CellType):
            c.cell_contents = value
        else:
            vars(c)[self.key] = value


def writable(container: Any, key: Any, by_attr: bool) -> bool:
    """True where :meth:`Place.put` can bind another value and every later read finds it (see :class:`Place`)."""
    if not by_attr:
        return type(container) in (list, dict, collections.OrderedDict)  # (Paddle's Layer keeps its buffers in one)
    if isinstance(container, types.CellType):
        return key == "cell_contents"
    if isinstance(container, type) or not isinstance(key, str) or \
            type(container).__getattribute__ is not object.__getattribute__:  # (reads that may not find __dict__)
        return False
    try:
        own = vars(container)
    except TypeError:  # __slots__
        return False
    if key not in own:
        return False
    found = getattr(type(container), key, None)  # a data descriptor of the class would take the read first
    return found is None or not hasattr(type(found), "__set__")


def renewable(guard: GuardSet, warm: Warmup, backend: Backend) -> list[tuple[Place, Any, Any]] | None:
    """Where every value that differs from ``guard``'s capture is a held or pinned tensor rebound to one graphjit can
    feed (the module docstring says which): each place, with the caller's tensor now and graphjit's copy of it; else
    None."""
    if warm.untracked is not None:
        return None
    rebound = guard.rebound_tensors()
    if not rebound:
        return None
    named = {describe(path) for *_rest, path in rebound}
    if any(path not in named for path, _old, _new in guard.differences()):
        return None  # something else changed too: a value, a hook, a loaded optimizer state
    out = []
    for container, key, by_attr, linked, was, now, path in rebound:
        if linked or id(was) in warm.written or not writable(container, key, by_attr):
            return None
        mine = _copy(backend, was, now)
        if mine is None:
            return None
        out.append((Place(container, key, by_attr, path), now, mine))
    return out


def _copy(b: Backend, was: Any, now: Any) -> Any:
    """graphjit's copy of ``now``, where ``now`` is a tensor of ``was``'s kind outside autograd that a copy fills
    exactly (a layout a clone keeps) and whose writes its version counter tells; else None."""
    if now.__class__ is not was.__class__ or not isinstance(now, b.tensor_types()) or b.is_parameter(now):
        return None
    if b.requires_grad(now) or b.meta_key(now) != b.meta_key(was) or b.strides(now) != b.strides(was):
        return None
    mine = b.clone(now)
    if b.strides(mine) != b.strides(now) or b.version(now) is None or b.version(mine) is None:
        return None  # (an inference tensor keeps no version counter, and takes no copy outside inference mode)
    return mine


class Renewed(StepPart):
    """The places of one key whose tensors graphjit feeds: each holds graphjit's tensor while a call of the key runs,
    filled from the caller's tensor there (see the module docstring)."""

    __slots__ = ("backend", "metas", "places", "saved", "tensors", "versions", "writes")

    def __init__(self, backend: Backend, found: Iterable[tuple[Place, Any, Any]]) -> None:
        self.backend = backend
        self.places: list[Place] = []
        self.tensors: list[Any] = []
        self.metas: list[tuple[Any, ...]] = []
        for place, now, mine in found:
            self.places.append(place)
            self.tensors.append(mine)
            self.metas.append((now.__class__, backend.meta_key(now), backend.strides(now)))
        self.saved: list[Any] = []
        self.versions: list[int | None] = []
        self.writes = False  # a call wrote a fed tensor: every replay copies it back

    @property
    def paths(self) -> list[str]:
        return [describe(p.path) for p in self.places]

    def enter(self) -> None:
        b = self.backend
        saved = self.saved = []
        for place, mine, meta in zip(self.places, self.tensors, self.metas):
            now = place.read()
            if now is mine or now.__class__ is not meta[0] or (b.meta_key(now), b.strides(now)) != meta[1:]:
                saved.append(_LEFT)  # another kind of value: the guards compare it (its graph, or a new one)
                continue
            b.copy_many((mine,), (now,), grad_free=True)  # (neither requires grad: renewable refuses such tensors)
            saved.append(now)
            place.put(mine)
        self.versions = [b.version(t) for t in self.tensors]  # (after the copies, which count)

    def exit(self) -> None:
        b = self.backend
        for place, mine, theirs, version in zip(self.places, self.tensors, self.saved, self.versions):
            if theirs is _LEFT or place.read() is not mine:
                continue  # left, or rebound by the call itself: the call's binding stays
            if b.version(mine) != version:  # written by the call: the caller's tensor too, and after every replay
                b.copy_(theirs, mine)
                self.writes = True
            place.put(theirs)
        self.saved = []

    def replayed(self) -> None:
        if self.writes:
            for mine, theirs in zip(self.tensors, self.saved):
                if theirs is not _LEFT:
                    self.backend.copy_(theirs, mine)
