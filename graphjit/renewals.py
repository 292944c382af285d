"""Tensors a graph reads off an attribute, a closure cell, a global or a Module's buffer that the caller rebinds to
new ones of the same kind: read by the graph from a tensor graphjit owns, filled before each replay.

A graph reads such a tensor at its address, so the guards pin it by identity (:meth:`graphjit.guards.Scan.pin`; a
Module's buffer is held by identity, which is where Paddle keeps any tensor set on a Layer). A model that stores a new
one on itself before each run (Qwen2-VL's ``rope_deltas`` in transformers before 5.20, made anew by every
``generate()``) would get a graph per tensor, each keeping its tensor alive, and after
:data:`graphjit.variants.Drift.MAX_VALUES` of them would run uncaptured for good.  Instead, the first time every value
that changed for a key's graph is such a tensor (:func:`renewable`), the key is captured again (:class:`Fed`): during
that capture, and no other run of the function, each place holds a tensor graphjit owns, filled with the caller's; the
graph reads it there, and its guards, instead of that tensor's identity, check that the caller's tensor at the place
is still of its kind and copy it in (one device copy on the call's stream, before the replay's kernels:
:meth:`graphjit.guard_set.GuardSet.holds`).  This is what ``torch.compile(mode="reduce-overhead")`` does for such a
tensor: an input of its graph, copied in on each call.

Guarantees: the caller's code, and every run of the function's Python (warmups, calls that run uncaptured, islands),
only ever find the caller's own tensor there; a replay computes with the values the caller's tensor has at the call.
A tensor there of another kind, or the very tensor another guard of the graph holds (code may compare the two by
identity), fails the check: the call goes the way of any changed value.

Refused (the key keeps a graph per tensor, as before): a change of anything else; a tensor of another type, shape,
dtype, device, strides or ``requires_grad``, one that requires grad (autograd would lose its history), a parameter, an
inference tensor; a key whose warmup calls wrote that tensor, wrote an argument in place, rebound or stored any
tensor or changed a Python value the function reads (the graph would write graphjit's tensor, or the Python the
replays skip would have stored the caller's), or could not tell what they wrote; a graph with islands (their Python
runs on every replay); an entry of a list or dict the guards read again where its parent holds it (one rebuilt before
every call would be fed at its old place); a place graphjit cannot write without running code of the owner's (a
property, ``__slots__``, a class attribute); a key a counter's family serves (:mod:`graphjit.families`), and a tracer
that freezes what it read into its program (Paddle's AST translation).
"""

from __future__ import annotations

import collections
import contextlib
import types
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .reach import Path, describe

if TYPE_CHECKING:
    from .backends.base import Backend
    from .guard_set import GuardSet
    from .warmup import Warmup

REASON = "recaptured: a tensor it reads was rebound"

_GONE = object()
"""What :meth:`Place.read` gives for an entry that is gone."""


@dataclass(frozen=True)
class Place:
    """Where a fed tensor sits: ``container``'s attribute ``key`` (``by_attr``: an object's ``__dict__`` entry or a
    closure cell's contents) or its item ``key`` (a plain list or dict, a Module's buffer dict)."""

    container: Any
    key: Any
    by_attr: bool
    path: Path

    def read(self) -> Any:
        try:
            return getattr(self.container, self.key) if self.by_attr else self.container[self.key]
        except Exception:
            return _GONE

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


ALIASED = "a tensor it reads is rebound to one the call writes"


def quiet(warm: Warmup) -> bool:
    """The key's warmup calls rebound or stored no tensor and changed no Python value the function reads, and could
    tell what they wrote: what renewing needs of them."""
    return warm.untracked is None and not warm.python_writes


def _span(b: Backend, t: Any) -> tuple[int, int]:
    """The bytes ``[start, end)`` a tensor's elements lie in (empty for no elements)."""
    shape = b.shape(t)
    n = 1
    for d in shape:
        n *= d
    if n == 0:
        return (0, 0)
    start = b.data_ptr(t)
    extent = 1 + sum((d - 1) * abs(s) for d, s in zip(shape, b.strides(t)))
    return (start, start + extent * (b.nbytes(t) // n))


def overlaps(b: Backend, t: Any, others: list[Any]) -> bool:
    """``t``'s memory overlaps one of ``others``' (a tensor an argument of the call that it writes in place)."""
    lo, hi = _span(b, t)
    for o in others:
        olo, ohi = _span(b, o)
        if lo < ohi and olo < hi:
            return True
    return False


def renewable(guard: GuardSet, warm: Warmup, backend: Backend) -> list[tuple[Place, Any]] | None:
    """Where every value that differs from ``guard``'s capture is a held or pinned tensor rebound to one graphjit can
    feed, from a key whose warmups were :func:`quiet` (the module docstring says which): each place with the caller's
    tensor now; else None."""
    if not quiet(warm):
        return None
    rebound = guard.rebound_tensors()
    if not rebound:
        return None
    named = {describe(path) for *_rest, path in rebound}
    if any(path not in named for path, _old, _new in guard.differences()):
        return None  # something else changed too: a value, a hook, a loaded optimizer state
    taken = {id(v) for v in guard.tensors()} | set(warm.written)
    out = []
    for container, key, by_attr, linked, was, now, path in rebound:
        if linked or id(was) in warm.written or id(now) in taken or not writable(container, key, by_attr):
            return None
        if _kind(backend, now) != _kind(backend, was) or not _feedable(backend, now):
            return None
        out.append((Place(container, key, by_attr, path), now))
    return out


def _kind(b: Backend, t: Any) -> tuple[Any, ...]:
    return (t.__class__, b.meta_key(t), b.strides(t)) if isinstance(t, b.tensor_types()) else (t.__class__,)


def _feedable(b: Backend, t: Any) -> bool:
    """A tensor outside autograd, not a parameter, with a version counter (not an inference tensor, which takes no
    copy outside inference mode), whose layout a clone keeps (a copy fills it exactly)."""
    return (isinstance(t, b.tensor_types()) and not b.is_parameter(t) and not b.requires_grad(t)
            and b.version(t) is not None and b.strides(b.clone(t)) == b.strides(t))


class Fed:
    """The fed places of one key of the arguments (and of the keys of its values): graphjit's tensor for each, bound
    there while the key, or one of its values, is captured (:meth:`bound`), and checked and filled before each replay
    (:meth:`check`, which the graph's guards call)."""

    __slots__ = ("backend", "filled", "kinds", "others", "places", "put", "tensors")

    def __init__(self, backend: Backend, found: list[tuple[Place, Any]], others: set[int],
                 before: Fed | None = None) -> None:
        """``found``: each place with the caller's tensor there now; ``others``: the ids of the other tensors the
        renewed graph held, pinned or wrote (never bound in their stead: code may compare them by identity);
        ``before``: the key's earlier places (a second renewal, at other places), whose tensors this keeps."""
        self.backend = backend
        self.others: frozenset[int] = frozenset(others) | (before.others if before else frozenset())
        self.put: list[tuple[Place, Any, Any]] = []  # (place, graphjit's tensor, the caller's) while bound
        self.filled: list[Any] = []  # a copy of what each of those was filled with
        self.places: list[Place] = [*(before.places if before else ()), *(place for place, _now in found)]
        self.tensors: list[Any] = [*(before.tensors if before else ()), *(backend.clone(now) for _place, now in found)]
        self.kinds: list[tuple[Any, ...]] = [*(before.kinds if before else ()),
                                             *(_kind(backend, now) for _place, now in found)]

    @property
    def paths(self) -> list[str]:
        return [describe(p.path) for p in self.places]

    @contextlib.contextmanager
    def bound(self, warm: Warmup, verified: bool, written: list[Any]) -> Iterator[None]:
        """Around a capture of a key this serves: each place whose tensor graphjit can take (of its kind, not one of
        :attr:`others` or a tensor ``warm``'s calls wrote, nor over the memory of ``written``, the call's arguments it
        writes in place; from :func:`quiet` warmups, for a capture ``verified``, whose :meth:`written` check catches a
        write no counter told) holds graphjit's tensor, filled from the caller's; after, the caller's is back (where
        the place still holds graphjit's)."""
        b = self.backend
        put = self.put = []
        if quiet(warm) and verified:
            for place, mine, kind in zip(self.places, self.tensors, self.kinds):
                now = place.read()
                if (now is not mine and id(now) not in warm.written and id(now) not in self.others
                        and _kind(b, now) == kind and not overlaps(b, now, written)):
                    b.copy_(mine, now)
                    place.put(mine)
                    put.append((place, mine, now))
        self.filled = [b.clone(mine) for _place, mine, _now in put]
        try:
            yield
        finally:
            self.put, self.filled = [], []
            for place, mine, now in put:
                if place.read() is mine:
                    place.put(now)

    def written(self) -> str | None:
        """Inside :meth:`bound`, after verify's replay: which bound tensor of graphjit's the graph wrote (a kernel that
        moves no version counter, as ``batch_norm``'s running statistics on a plain attribute), or None.  Such a
        graph would never write the caller's tensor: the capture is refused."""
        for (place, mine, _now), was in zip(self.put, self.filled):
            if not self.backend.equal(mine, was):
                return (f"it writes {describe(place.path)}, a tensor rebound between calls that graphjit fed it from a "
                        "copy (a write no version counter told): its graph would never write the caller's tensor")
        return None

    @contextlib.contextmanager
    def callers(self) -> Iterator[None]:
        """Inside :meth:`bound`: the caller's tensors at their places again (verify's eager reference, which is the
        call's own run: a graph whose kernels depend on which tensor is there differs from it)."""
        put = self.put
        for place, mine, now in put:
            if place.read() is mine:
                place.put(now)
        try:
            yield
        finally:
            for place, mine, now in put:
                if place.read() is now:
                    place.put(mine)

    def entries(self, pinned: list[tuple[Any, Any, Any, Path]]) -> list[tuple[int, int]]:
        """``(index in pinned, index in places)`` of each entry of ``pinned`` (``(container, key, value, path)``: a
        guard set's held or pinned tensors) that is one of this key's places holding graphjit's tensor."""
        mine = {id(t): i for i, t in enumerate(self.tensors)}
        out = []
        for j, (c, k, v, _path) in enumerate(pinned):
            i = mine.get(id(v))
            if i is not None and self.places[i].container is c and self.places[i].key == k:
                out.append((j, i))
        return out

    def check(self, which: list[int], taken: frozenset[int]) -> bool:
        """Before a replay: each place of ``which`` (indices into :attr:`places`) holds a tensor of its kind that is
        not one of ``taken`` (the ids of the other tensors its graph holds or writes); if so, each is copied into
        graphjit's tensor (one batched copy) and True."""
        b = self.backend
        srcs, dsts = [], []
        for i in which:
            now = self.places[i].read()
            mine = self.tensors[i]
            if now is mine:
                continue
            if now.__class__ is not self.kinds[i][0] or id(now) in taken or _kind(b, now) != self.kinds[i]:
                return False
            srcs.append(now)
            dsts.append(mine)
        if srcs:
            b.copy_many(dsts, srcs, grad_free=True)  # (neither side requires grad: _feedable)
        return True

    def aliased(self, which: list[int], written: list[Any]) -> bool:
        """A place of ``which`` holds a tensor over the memory of one of ``written`` (the call's arguments its graph
        writes in place): graphjit's copy, made before the replay, would miss that write."""
        b = self.backend
        for i in which:
            now = self.places[i].read()
            if now is not _GONE and overlaps(b, now, written):
                return True
        return False

    def state(self, which: list[int], taken: frozenset[int]) -> tuple[Any, ...]:
        """What :meth:`check` decides on, hashable: each place's kind now (a tensor of ``taken`` by its identity)."""
        b = self.backend
        out = []
        for i in which:
            now = self.places[i].read()
            out.append(("held", id(now)) if id(now) in taken else _kind(b, now) if now is not _GONE else "(deleted)")
        return tuple(out)
