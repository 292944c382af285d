"""``@graphjit.eager``: islands, the parts of a graphed function that run eagerly on every call.

An island is a function a graphed function calls that a CUDA graph cannot hold, or should not: attention
whose metadata changes shape every call, a ``.item()``, a CPU op, a data-dependent shape.  Marking it
``@graphjit.eager`` makes the graphed function *piecewise*: the capture ends the current segment where the
island is called, records the call, and starts the next segment after it (:class:`Recorder`); a replay
runs segment, island, segment, ... in order (:class:`graphjit.pieces.PiecewiseGraph`).

What an island guarantees and what it asks:

* It runs eagerly on every call: in warmup calls, in verify's eager reference and in every replay, with
  the tensors the previous segment left (the same objects, at the same addresses, as at capture) and the
  call's current dynamic arguments (:mod:`graphjit.dynamic`).  At capture it does not run (nothing does:
  a capture records); its outputs are then buffers the next segment reads, and each replay copies the
  island's outputs into them, except an output that *is* one of the island's input tensors (an island
  that writes in place, such as attention into a preallocated output): no copy there.  Two calls run it
  twice: the capturing call (verify's eager reference, the call's run, then verify's replay) and the first
  call with other dynamic values (the recheck's eager run, then its replay).  Each replay starts from the
  state the eager run started from, and its effects are undone afterwards: its tensors' writes and the
  generator by verify's copies, its Python effects where :class:`~graphjit.pystate.PyState` reaches them
  (containers and attributes reachable from the call or its dynamic arguments, not globals, files or C
  state).
* CPU-GPU syncs inside an island are allowed (the warmup's sync watch ignores them), and so are random
  draws (Paddle too: an island draws eagerly).
* For one key an island must return the same structure, shapes, dtypes and non-tensor values on every
  call (the next segment was captured reading them); a replay that gets anything else raises
  :class:`~graphjit.errors.IslandError` naming the island and what changed.  (An output shaped like one
  of the island's inputs in the warmup is taken to keep that shape: with ``buckets`` the capture sees
  padded inputs.)  The graphed function must call the same
  islands in the same order on every call of a key (else the key runs uncaptured).
* Called outside a graphed call, an island is the plain function.  Inside an island, graphed functions
  and other islands run as plain code.
* Tracers: the island is a graph break for Paddle SOT (registered as one) and for ``torch.compile``
  (``torch.compiler.disable``); for frameworks imported when ``eager`` runs (import the framework first).
  Paddle's AST tracer makes a static program, which runs no Python: an island called while it translates
  raises ``ConfigError`` (use ``tracer="sot"`` or ``"eager"``).
  The custom all-reduce works inside islands (collectives see a graphed call there).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar, overload

from . import backends, sites
from .backends.base import Backend, GraphHandle, open_segments, thread_value
from .dynamic import Index
from .errors import CaptureError, ConfigError
from .pieces import IslandStep, template_of
from .tree import collect_tensors, rebuild, structure

log = logging.getLogger("graphjit")
F = TypeVar("F", bound=Callable[..., Any])
class _Sink(threading.local):
    sink: Recorder | None = None  # a thread's default: read without an AttributeError raised and caught


_tls = _Sink()

__all__ = ["Island", "IslandCall", "Recorder", "collecting", "eager", "island_of", "recording"]


class Island:
    """One function marked ``@graphjit.eager``; calls go through :meth:`__call__`."""

    def __init__(self, fn: Callable[..., Any], name: str) -> None:
        self.fn = fn
        self.name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        sink = _tls.sink
        if sink is None:
            if backends.translating():
                raise ConfigError(f"island {self.name} was called while Paddle translates a static program "
                                  "(tracer='ast', or paddle.jit.to_static around it): a static program runs no Python, "
                                  "so it cannot run an island eagerly on every call; use tracer='sot' (the default) or "
                                  "'eager'")
            return self.fn(*args, **kwargs)
        return sink.call(self, args, kwargs)

    def __repr__(self) -> str:
        return f"<graphjit island {self.name}>"


@overload
def eager(fn: F, /) -> F: ...


@overload
def eager(fn: None = None, /, *, name: str | None = None) -> Callable[[F], F]: ...


def eager(fn: Callable[..., Any] | None = None, /, *, name: str | None = None) -> Any:
    """Mark ``fn`` as an island of the graphed functions that call it (see the module docstring).

    Refuses (``ConfigError``) what is not a plain callable: generator and async functions, classes, and
    something already graphed or already an island.
    """
    if fn is None:
        return functools.partial(_make, name=name)
    return _make(fn, name=name)


def _make(fn: Callable[..., Any], name: str | None) -> Any:
    if not callable(fn) or isinstance(fn, type):
        raise ConfigError(f"graphjit.eager needs a function, got {type(fn).__name__}")
    if island_of(fn) is not None:
        raise ConfigError(f"{getattr(fn, '__qualname__', fn)!r} is already an island")
    if getattr(fn, "graphjit_options", None) is not None:
        raise ConfigError(f"{getattr(fn, '__qualname__', fn)!r} is graphed; an island is run eagerly, so mark the "
                          "plain function with @graphjit.eager instead")
    if inspect.isgeneratorfunction(fn) or inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
        raise ConfigError(f"graphjit.eager got a generator or async function ({getattr(fn, '__qualname__', fn)}); "
                          "an island must return its results")
    island = Island(fn, name or getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn))

    @functools.wraps(fn)
    def call_island(*args: Any, **kwargs: Any) -> Any:
        return island(*args, **kwargs)

    call_island.__module__ = getattr(fn, "__module__", None) or __name__
    call_island.__graphjit_island__ = island  # type: ignore[attr-defined]
    public: Any = call_island
    for framework in backends.imported():
        public = backends.load(framework, "breaks").graph_break(public, f"graphjit island {island.name}")
    if public is not call_island:
        public.__graphjit_island__ = island
    return public


def island_of(fn: Any) -> Island | None:
    """The island behind a function ``eager`` returned, else None (also for an object whose attribute lookup raises
    something else than AttributeError: a dict whose ``__getattr__`` is ``__getitem__`` raises KeyError)."""
    try:
        found = getattr(fn, "__graphjit_island__", None)
    except Exception:
        return None
    return found if isinstance(found, Island) else None


def _sink(sink: Any) -> contextlib.AbstractContextManager[Any]:
    return thread_value(_tls, "sink", sink)


# -- warmup ------------------------------------------------------------------------------------
@dataclass
class IslandCall:
    """What one island call did in a watched warmup: enough for the capture to stand in for it."""

    island: Island
    skeleton: Any  # the output with every tensor replaced by a 0-element one of its dtype and device
    shapes: list[tuple[int, ...]]
    in_place: dict[int, int]  # output leaf -> the island's input leaf it is (an island that writes in place)
    shaped_like: dict[int, int]  # output leaf -> the first input leaf of its shape and dtype
    site: str  # where the graphed function called it


class Collector:
    """The islands one watched warmup call ran, with the generator state around each (so that random
    numbers an island draws are not taken for the segments')."""

    def __init__(self, backend: Backend, device: str) -> None:
        self.backend = backend
        self.device = device
        self.calls: list[IslandCall] = []
        self.rng_marks: list[tuple[Any, Any]] = []

    def call(self, island: Island, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if backends.translating():
            with _sink(None):
                return island(*args, **kwargs)  # raises: no island in a static program
        b = self.backend
        site = sites.caller(2)
        before = b.rng_state(self.device)
        with _sink(None), b.island_guard():
            out = island.fn(*args, **kwargs)
        self.rng_marks.append((before, b.rng_state(self.device)))
        is_tensor = _is_tensor_of(b)
        inputs = collect_tensors((args, kwargs), is_tensor)
        position = {id(t): i for i, t in enumerate(inputs)}
        metas = [b.meta_key(t)[:2] for t in inputs]
        leaves = collect_tensors(out, is_tensor)
        in_place = {j: position[id(t)] for j, t in enumerate(leaves) if id(t) in position}
        shaped_like = {}
        for j, t in enumerate(leaves):
            meta = b.meta_key(t)[:2]
            if meta in metas:
                shaped_like[j] = metas.index(meta)
        skeleton = rebuild(out, [b.empty([0], t) for t in leaves], is_tensor)
        self.calls.append(IslandCall(island, skeleton, [b.shape(t) for t in leaves], in_place, shaped_like, site))
        return out

    def drew_outside(self, start: Any, end: Any) -> bool:
        """True if the generator moved between the islands (in the segments), from ``start`` to ``end``."""
        b = self.backend
        marks = [start]
        for before, after in self.rng_marks:
            marks.extend((before, after))
        marks.append(end)
        return any(not b.rng_equal(marks[i], marks[i + 1]) for i in range(0, len(marks), 2))


@contextlib.contextmanager
def collecting(backend: Backend, device: str) -> Iterator[Collector]:
    """Record the islands called in the block (a watched warmup call)."""
    with _sink(Collector(backend, device)) as c:
        yield c


# -- capture -----------------------------------------------------------------------------------
class Recorder:
    """Cuts the capture in progress at every island call (see the module docstring); :attr:`steps` holds
    the segments' graphs and the islands' :class:`~graphjit.pieces.IslandStep` in order, the last segment
    excepted (the backend's capture returns it)."""

    def __init__(self, backend: Backend, warm: list[IslandCall], index: Index | None) -> None:
        self.backend = backend
        self.warm = warm
        self.index = index
        self.steps: list[GraphHandle | IslandStep] = []
        self.islands = 0

    def call(self, island: Island, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        k = self.islands
        seen = self.warm[k] if k < len(self.warm) else None
        if seen is None or seen.island is not island:
            was = f"{seen.island.name} (called at {seen.site})" if seen is not None else "no island"
            raise CaptureError(f"the capture called island {island.name} at {sites.caller(2)} where the warmup called "
                               f"{was}: the function must call the same islands in the same order on every call of a "
                               "key", reason="islands differ between calls")
        segments = open_segments()
        if segments is None:
            raise CaptureError(f"island {island.name}: the {self.backend.name} capture in progress cannot be cut into "
                               "segments", reason="capture cannot be cut at islands")
        self.steps.append(segments.cut())
        self.islands += 1
        b = self.backend
        is_tensor = _is_tensor_of(b)
        with _sink(None):
            inputs = collect_tensors((args, kwargs), is_tensor)
            buffers = [inputs[seen.in_place[j]] if j in seen.in_place else b.empty(_shape(b, seen, j, inputs), like)
                       for j, like in enumerate(collect_tensors(seen.skeleton, is_tensor))]
            for j, buf in enumerate(buffers):
                if j not in seen.in_place:
                    b.zero_(buf)  # defined contents until the first replay writes them
            out = rebuild(seen.skeleton, buffers, is_tensor)
            self.steps.append(IslandStep(b, island.fn, island.name, seen.site, template_of(args, kwargs, self.index),
                                         buffers, structure(out, is_tensor)))
        segments.resume()
        return out

    def release(self) -> None:
        """Free the segments cut so far (a failed capture)."""
        for s in self.steps:
            if isinstance(s, GraphHandle):
                with contextlib.suppress(Exception):
                    s.reset()
        self.steps = []


@contextlib.contextmanager
def recording(backend: Backend, warm: list[IslandCall], index: Index | None) -> Iterator[Recorder]:
    """Cut the capture that runs in the block at the islands it calls; on an exception the segments cut
    so far are freed."""
    rec = Recorder(backend, warm, index)
    try:
        with _sink(rec):
            yield rec
    except BaseException:
        rec.release()
        raise


def _shape(b: Backend, seen: IslandCall, j: int, inputs: list[Any]) -> tuple[int, ...]:
    """The shape output ``j`` of the island will have in this capture: that of the input it was shaped like in
    the warmup (a bucketed key's warmup ran on the caller's unpadded tensors, its capture on padded ones),
    else the warmup's."""
    i = seen.shaped_like.get(j)
    if i is not None and i < len(inputs):
        return b.shape(inputs[i])
    return seen.shapes[j]


def _is_tensor_of(b: Backend) -> Callable[[Any], bool]:
    types = b.tensor_types()
    return lambda x: isinstance(x, types)
