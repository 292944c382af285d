"""Tensors a graph reads off an attribute, a closure cell, a global or a Module's buffer that the caller rebinds to
new ones of the same kind: read by the graph from a tensor graphjit owns, copied in before each replay and back after.

A graph reads such a tensor at its address, so the guards pin it by identity (:meth:`graphjit.guards.Scan.pin`; a
Module's buffer is held by identity). A model that stores a new one on itself before each run (Qwen2-VL's
``rope_deltas`` in transformers before 5.20, made anew by every ``generate()``) would get a graph per tensor, each
keeping its tensor alive, and after :data:`graphjit.variants.Drift.MAX_VALUES` of them would run uncaptured for good.
Instead, the first time every value that changed for a key's graph is such a tensor (:func:`renewable`), the key is
captured again (:class:`Fed`): during that capture, and no other run of the function, each place holds a tensor
graphjit owns, filled with the caller's, so the graph reads and writes that one.  Its guards then check the caller's
tensor at the place by kind instead of identity (:meth:`Fed.valid`), and each replay (:class:`Feed`, under the
function's lock) copies the caller's tensor in before the graph and graphjit's back into it after, its version counter
put back (the only writes a fed graph can make are ones no counter tells, as ``.data`` or ``batch_norm``'s statistics,
which move none eagerly either): the caller's tensor ends as a run on it would leave it.  This is what
``torch.compile(mode="reduce-overhead")`` does for such a tensor: an input of its graph, copied in on each call.

Guarantees: the caller's code, and every run of the function's Python (warmups, calls that run uncaptured, verify's
eager reference, which the capture is compared with), only ever find the caller's own tensor there; a replay reads
and writes the values the caller's tensor has.  At each call a fed place must hold a tensor of its kind with a version
counter, owning its memory alone (no view of it, nor it of another tensor, is alive: :meth:`Backend.sole_storage`),
none of the tensors the graph holds, pins or writes otherwise (code may compare them by identity); else the guards
fail and the call goes the way of any changed value.  A tensor that is an argument of the call, that is at two fed
places, or that lies over memory the graph writes (two tensors over one memory: ``from_numpy`` twice) runs the call
uncaptured (:data:`ALIASED`): the copies could not keep such an alias, nor code its identity.

Refused (the key keeps a graph per tensor, as before): a change of anything else; a tensor of another type, shape,
dtype, device or strides, on another device than the graph's (a CUDA graph keeps a CPU scalar's value from its
capture), over :data:`MAX_BYTES`, one that requires grad (autograd would lose its history), a parameter, an inference
tensor, a tensor of a framework that cannot say it owns its memory alone or put a version counter back (Paddle); a
key whose warmup calls rebound or stored any tensor or changed a Python value the function reads (the Python the
replays skip would have stored the caller's), wrote that tensor, or could not tell what they wrote; a capture that is
not verified;
a graph with islands, ``dynamic=`` arguments or ``outputs="alias"`` (whose output could be graphjit's tensor); an
entry of a list or dict the guards read again where its parent holds it (one rebuilt before every call would be fed
at its old place); a place graphjit cannot write without running code of the owner's (a property, ``__slots__``, a
class attribute); a place already fed; a key a counter's family serves (:mod:`graphjit.families`), and a tracer that
freezes what it read into its program (Paddle's AST translation).  Not seen: Python that stores the tensor where no
watch looks (a class attribute, an argument's attribute): it keeps the first one.  While such a key captures again,
another thread reading the place finds graphjit's tensor.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import itertools
import types
import weakref
from collections.abc import Iterator, Sequence
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


ALIASED = "a tensor it reads is rebound to an argument of the call or to memory it reads otherwise"
CHANGED = "a tensor it reads was rebound while the call waited for another thread's"
WRITTEN = "it writes a tensor fed at a place the caller rebinds"
MAX_BYTES = 1 << 20
"""The largest tensor graphjit feeds (two copies a replay); a larger one rebound gets a graph of its own."""


def quiet(warm: Warmup) -> bool:
    """The key's warmup calls rebound or stored no tensor and changed no Python value the function reads, and could
    tell what they wrote: what renewing needs of them."""
    return warm.untracked is None and not warm.python_writes


def occupied(guard: GuardSet, warm: Warmup) -> list[Any]:
    """What a key's graph holds, pins (by identity) or writes besides its fed places: a fed tensor is none of these
    (code may compare them by identity) and lies over none of them."""
    return [*guard.tensors(), *(t for t, _path in warm.written.values())]


def renewable(guard: GuardSet, warm: Warmup, backend: Backend, device: str) -> list[tuple[Place, Any]] | None:
    """Where every value that differs from ``guard``'s capture is a held or pinned tensor rebound to one graphjit can
    feed, on the graph's ``device``, from a key whose warmups were :func:`quiet` (the module docstring says which):
    each place with the caller's tensor now; else None."""
    if not quiet(warm):
        return None
    rebound = guard.rebound_tensors()
    if not rebound:
        return None
    named = {describe(path) for *_rest, path in rebound}
    if any(path not in named for path, _old, _new in guard.differences()):
        return None  # something else changed too: a value, a hook, a loaded optimizer state
    taken = set(map(id, occupied(guard, warm)))
    out = []
    for container, key, by_attr, linked, was, now, path in rebound:
        if linked or id(was) in warm.written or id(now) in taken or not writable(container, key, by_attr):
            return None
        if _kind(backend, now) != _kind(backend, was) or not _feedable(backend, now) \
                or backend.device_str(now) != device:  # (a CUDA graph keeps a CPU scalar's value from its capture)
            return None
        out.append((Place(container, key, by_attr, path), now))
    return out


def _kind(b: Backend, t: Any) -> tuple[Any, ...]:
    return (t.__class__, b.meta_key(t), b.strides(t)) if isinstance(t, b.tensor_types()) else (t.__class__,)


def _feedable(b: Backend, t: Any) -> bool:
    """A tensor of at most :data:`MAX_BYTES` outside autograd, not a parameter, with a version counter (not an
    inference tensor, which takes no copy outside inference mode), owning its memory alone, whose layout a clone
    keeps (a copy fills it exactly)."""
    return (isinstance(t, b.tensor_types()) and b.versions_settable and not b.is_parameter(t)
            and not b.requires_grad(t) and b.nbytes(t) <= MAX_BYTES and b.version(t) is not None
            and b.sole_storage(t) and b.strides(b.clone(t)) == b.strides(t))


class Fed:
    """The fed places of one key of the arguments (and of the keys of its values): graphjit's tensor for each, bound
    there while the key, or one of its values, is captured (:meth:`bound`); :meth:`valid` is the graph's guard of the
    places, :class:`Feed` their copies around each replay."""

    __slots__ = ("backend", "kinds", "others", "places", "put", "tensors", "versions")

    def __init__(self, backend: Backend, found: list[tuple[Place, Any]], others: list[Any],
                 before: Fed | None = None) -> None:
        """``found``: each place with the caller's tensor there now; ``others``: the other tensors the renewed graph
        held, pinned or wrote (never bound in their stead: code may compare them by identity), kept weakly;
        ``before``: the key's earlier places (a second renewal, at other places), whose tensors this keeps."""
        self.backend = backend
        self.others: list[weakref.ref[Any]] = [*(before.others if before else ()), *map(weakref.ref, others)]
        self.put: list[tuple[Place, Any, Any]] = []  # (place, graphjit's tensor, the caller's) while bound
        self.versions: list[int | None] = []  # graphjit's tensors' version counters once bound
        self.places: list[Place] = [*(before.places if before else ()), *(place for place, _now in found)]
        self.tensors: list[Any] = [*(before.tensors if before else ()), *(backend.clone(now) for _place, now in found)]
        self.kinds: list[tuple[Any, ...]] = [*(before.kinds if before else ()),
                                             *(_kind(backend, now) for _place, now in found)]

    @property
    def paths(self) -> list[str]:
        return [describe(p.path) for p in self.places]

    def feeds(self, container: Any, key: Any) -> bool:
        """The place ``container[key]`` (or its attribute) is one of these."""
        return any(p.container is container and p.key == key for p in self.places)

    @contextlib.contextmanager
    def bound(self, warm: Warmup, verified: bool, written: list[Any]) -> Iterator[None]:
        """Around a capture of a key this serves: each place whose tensor graphjit can take holds graphjit's tensor,
        filled from the caller's; after, the caller's is back (where the place still holds graphjit's).  It can take
        a tensor of the place's kind, owning its memory alone, that is none of :attr:`others`, of the tensors
        ``warm``'s calls wrote and of ``written`` (the call's tensor arguments), nor at another place taken, from
        :func:`quiet` warmups, for a capture ``verified`` (compared with an eager run on the caller's tensor:
        :meth:`callers`)."""
        b = self.backend
        put = self.put = []
        others = {id(t) for t in (r() for r in self.others) if t is not None} | set(warm.written)
        others |= set(map(id, written))
        if quiet(warm) and verified:
            for place, mine, kind in zip(self.places, self.tensors, self.kinds):
                now = place.read()
                if now is not mine and id(now) not in others and _kind(b, now) == kind and b.sole_storage(now):
                    b.copy_(mine, now)
                    place.put(mine)
                    put.append((place, mine, now))
                    others.add(id(now))  # (one tensor at two places: the second keeps it, as code may compare them)
        self.versions = [b.version(mine) for _place, mine, _now in put]
        try:
            yield
        finally:
            self.put = []
            for place, mine, now in reversed(put):
                if place.read() is mine:
                    place.put(now)

    def counted(self) -> str | None:
        """Inside :meth:`bound`, after the build: which of graphjit's tensors bound the capture wrote with an op that
        moves its version counter (code the key's warmups ran on another tensor there), or None.  Such a graph is
        refused: its replays would write graphjit's tensor where an eager run moves the caller's counter."""
        b = self.backend
        for (place, mine, _now), version in zip(self.put, self.versions):
            if b.version(mine) != version:
                return (f"it writes {describe(place.path)} in place, a tensor the caller rebinds that graphjit feeds "
                        "it (the key's warmups wrote another tensor there): such a call runs uncaptured")
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

    def _state(self, i: int, taken: frozenset[int]) -> Any:
        """Place ``i``'s tensor now as :meth:`valid` and :meth:`state` judge it, hashable: its kind where it can be fed
        there; else ``"(deleted)"``, a non-tensor's class, or a tensor of ``taken``, one sharing its memory or an
        inference tensor by its identity."""
        now = self.places[i].read()
        b = self.backend
        if now is _GONE:
            return "(deleted)"
        if now.__class__ is not self.kinds[i][0]:
            return (now.__class__,)
        if id(now) in taken or b.version(now) is None or not b.sole_storage(now):
            return ("held", id(now))
        return _kind(b, now)

    def valid(self, which: list[int], taken: frozenset[int]) -> bool:
        """The guard of the places ``which`` (indices into :attr:`places`): each holds a tensor of its kind (not an
        inference tensor), owning its memory alone, that is none of ``taken`` (the ids of the other tensors its graph
        holds, pins or writes)."""
        for i in which:  # (a loop: this runs twice a replay)
            if self._state(i, taken) != self.kinds[i]:
                return False
        return True

    def state(self, which: list[int], taken: frozenset[int]) -> tuple[Any, ...]:
        """What :meth:`valid` decides on, hashable: each place's :meth:`_state`."""
        return tuple(self._state(i, taken) for i in which)


class Feed:
    """The copies of one graph's fed places around each of its replays (under the function's lock): the caller's
    tensors in before (:meth:`fill`), graphjit's back into them after (:meth:`back`, their version counters as they
    were: a write no counter tells, which is the only kind a fed graph can make, moves none eagerly either).

    ``fixed``: the other tensors the graph reads or writes at their addresses (held, pinned, written state: their
    memory stays while it lives)."""

    __slots__ = ("ends", "fed", "refused", "starts", "taken", "theirs", "which")

    def __init__(self, fed: Fed, which: list[int], taken: frozenset[int], fixed: list[Any]) -> None:
        self.fed, self.which, self.taken = fed, which, taken
        b = fed.backend
        spans = sorted(b.extent(t) for t in fixed if isinstance(t, b.tensor_types()))
        self.starts = [start for start, _end in spans]
        self.ends = list(itertools.accumulate((end for _start, end in spans), max))  # the furthest end so far
        self.theirs: list[Any] = []
        self.refused = ""  # why the last fill copied nothing

    def fill(self, tensors: Sequence[Any]) -> bool:
        """Before a replay of the call whose tensor leaves are ``tensors``: copy each place's tensor in and True; else
        False, with :attr:`refused` saying why (:data:`ALIASED`: one is an argument of the call or lies over memory of
        one, of another fed place or of another tensor the graph reads or writes; :data:`CHANGED`: a place changed
        since the guards held, on another thread)."""
        fed = self.fed
        self.theirs = []
        if not fed.valid(self.which, self.taken):
            self.refused = CHANGED
            return False
        theirs = [fed.places[i].read() for i in self.which]
        if not {id(t) for t in theirs}.isdisjoint(map(id, tensors)) or self._overlaps(theirs, tensors):
            self.refused = ALIASED
            return False
        fed.backend.copy_many([fed.tensors[i] for i in self.which], theirs, grad_free=True)  # (_feedable: no grad)
        self.theirs = theirs
        return True

    def _overlaps(self, theirs: list[Any], tensors: Sequence[Any]) -> bool:
        """One of ``theirs`` lies over memory of another, of an argument of the call (read each call: an argument
        passed again may have moved), or of a tensor the graph holds (two tensors over one memory: ``from_numpy`` or
        ``from_dlpack`` twice): the copies would not keep what the graph writes to one visible in the other."""
        b = self.fed.backend
        mine = [b.extent(t) for t in theirs]
        args = [b.extent(t) for t in tensors]
        starts, ends = self.starts, self.ends
        for k, (lo, hi) in enumerate(mine):
            if lo == hi:
                continue
            if any(lo < end and start < hi for start, end in (*mine[k + 1:], *args)):
                return True
            j = bisect.bisect_left(starts, hi)  # the fixed spans that start before this one ends
            if j and ends[j - 1] > lo:
                return True
        return False

    def back(self) -> None:
        """After that replay: graphjit's tensors back into the caller's (as the graph left them), the caller's version
        counters as they were."""
        theirs, self.theirs = self.theirs, []
        if theirs:
            b = self.fed.backend
            versions = [b.version(t) for t in theirs]
            b.copy_many(theirs, [self.fed.tensors[i] for i in self.which], grad_free=True)
            b.set_versions(theirs, versions)
