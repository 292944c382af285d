"""The backend protocol: everything graphjit's core needs from a tensor framework.

The core (``api``, ``keys``, ``buffers``, ``capture``, ``scope``) never imports paddle or torch; it
talks to a :class:`Backend`.  A backend is small on purpose: tensor metadata and copies, the tracer,
a graph capture that is always ended, and a graph handle to replay.
"""

from __future__ import annotations

import abc
import contextlib
import gc
import operator
import threading
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from ..feeds import StepContext

CAPTURE_LOCK = threading.RLock()
"""One capture at a time per process: graphjit's captures, warmups on the capture stream and pool anchors
all run under this lock (re-entrant: a capture may create its pool)."""

_pause_lock = threading.Lock()
_pause_depth = 0
_pause_restore = False


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while a capture runs; back as it was afterwards.

    The collector starts whenever allocations pass its threshold, so it may start in the middle of a
    capture and free unreachable cycles that hold CUDA graphs of earlier captures (a graphed function
    or layer the program dropped).  A graph cannot be destroyed while a stream captures: torch's
    destructor fails ("operation not permitted when stream is capturing") and the capture under way
    is invalidated ("operation failed due to a previous error during capture").  With the collector
    paused, such cycles are freed after the capture.

    The collector is process-wide, so the pause is counted across threads: the first block to enter
    records whether the collector was on and turns it off, the last one to leave turns it back on.
    Automatic collections stop for every thread meanwhile (captures take milliseconds); an explicit
    ``gc.collect()`` still runs.  Memory freed by reference counting alone is not affected.
    """
    global _pause_depth, _pause_restore
    with _pause_lock:
        if _pause_depth == 0:
            _pause_restore = gc.isenabled()
            gc.disable()
        _pause_depth += 1
    try:
        yield
    finally:
        with _pause_lock:
            _pause_depth -= 1
            if _pause_depth == 0 and _pause_restore:
                gc.enable()


class GraphHandle(abc.ABC):
    """One captured CUDA graph.  ``replay`` launches it on the stream it was captured for."""

    pool_bytes: int = 0
    feed: Any = None
    """The graph's feed nodes (:class:`graphjit.handoff.Feed`), where its capture added them; else None."""

    @abc.abstractmethod
    def replay(self) -> None: ...

    @abc.abstractmethod
    def reset(self) -> None:
        """Free the graph (its executable and, if private, its memory pool)."""

    def dump(self, path: Path) -> None:
        """Write a Graphviz dot file of the graph (only if the capture asked for it)."""
        raise NotImplementedError(f"{type(self).__name__} cannot write graph dumps")


class Segments(abc.ABC):
    """A capture in progress that an island cuts in two (piecewise capture, :mod:`graphjit.pieces`).

    The backend's :meth:`Backend.capture_graph` opens one for the duration of the capture
    (:func:`segments_open`); an island called inside the captured function ends the current segment
    with :meth:`cut` and, after recording itself, starts the next with :meth:`resume`.  Every segment
    is captured on the same stream into the same memory pool, so a segment may read what an earlier
    one left in the pool; they must be replayed in the order they were captured.
    """

    @abc.abstractmethod
    def cut(self) -> GraphHandle:
        """End the capture of the current segment and return its graph (captured, never replayed)."""

    @abc.abstractmethod
    def resume(self) -> None:
        """Begin capturing the next segment (same stream, same pool).  Only right after :meth:`cut`."""


class _Segments(threading.local):
    current: Segments | None = None  # what a thread that never opened one reads (no AttributeError raised and caught)


class _Islands(threading.local):
    depth = 0


_segments_tls = _Segments()
_island_tls = _Islands()


def in_island() -> bool:
    """True inside :meth:`Backend.island_guard` on this thread."""
    return _island_tls.depth > 0


@contextlib.contextmanager
def thread_value(tls: threading.local, name: str, value: Any) -> Iterator[Any]:
    """``tls.<name>`` is ``value`` on this thread for the block, as before afterwards (blocks nest)."""
    previous = getattr(tls, name, None)
    setattr(tls, name, value)
    try:
        yield value
    finally:
        setattr(tls, name, previous)


def segments_open(segments: Segments) -> contextlib.AbstractContextManager[Segments]:
    """Make ``segments`` the capture in progress on this thread for the block (nested captures restore
    the outer one)."""
    return thread_value(_segments_tls, "current", segments)


def open_segments() -> Segments | None:
    """The capture in progress on this thread that an island may cut, or None."""
    return _segments_tls.current


class LaneParts(NamedTuple):
    """A framework's part of a replay lane plan (:meth:`Backend.lane_parts`).

    ``probes``: functions of no argument (C functions, called on every call) that give ``expected`` exactly where the
    framework's modes are the key's (a probe that gives another value sends the call to the Python path, so the
    probes may refuse more than :meth:`Backend.modes` does, never less).  ``check``: called with the call's tensors,
    True only where each has the key's metadata and the given strides.  ``data_ptr``: a tensor's address
    (a C function where the framework has one)."""

    probes: tuple[Callable[[], Any], ...]
    expected: tuple[Any, ...]
    check: Callable[..., bool]
    data_ptr: Callable[[Any], int]


class Backend(abc.ABC):
    """What graphjit's core needs from one framework.

    Guarantees every implementation gives:

    * :meth:`capture` always ends the capture it began, also when the captured function raises or
      synchronises; afterwards no stream of this process is left capturing.
    * :meth:`meta_key` is cheap (it is on the replay hot path) and hashable.
    * Nothing here changes the framework's global state beyond the call (grad mode, streams and
      debug modes are restored on exit).
    """

    name: str = "base"
    tracers: tuple[str, ...] = ("eager",)
    default_tracer: str = "eager"
    counts_rebinds: bool = False
    """The framework tells :func:`graphjit.guard_set.note_rebind` whenever one of its modules rebinds a parameter or
    buffer (then a replay compares the tensors a graph holds only after that happened)."""
    poisoned: str | None = None
    """Set when the framework cannot run GPU work any more in this process (the reason, for users)."""
    checked_tracers: tuple[str, ...] = ()
    """Tracers whose program is checked against the Python function on the first call of every key
    (:mod:`graphjit.tracer_check`): translators known to compute wrong results for some functions."""
    host_watched_tracers: tuple[str, ...] = ()
    """Tracers that run a program of their own but run the Python they leave out of it (a graph break) as Python,
    between its parts: a warmup watches that Python for host reads a replay would not repeat (a clock read, a print,
    a log record; :class:`graphjit.names.NameRecorder` with ``names=False``), with the backend's compiler kept out of
    the watch (:meth:`compiles_unwatched`)."""
    simulator_modules: tuple[str, ...] = ()
    """Module prefixes of a tracer that runs the function's Python by simulating it (Paddle's SOT): a C function that
    code of theirs calls in a watched run of a :attr:`host_watched_tracers` tracer is called on the function's behalf,
    so a clock it reads or a print it makes is the function's (:class:`graphjit.names.NameRecorder`), where the frame
    that runs the tracer's code is the function's (not the tracer's own logging)."""
    captures_recoverable: bool = True
    """False where a capture broken by a CPU-GPU sync leaves the framework unusable (Paddle 2.6): graphjit
    then captures a key only after a warmup run watched for syncs."""

    # -- tensors ---------------------------------------------------------------------------
    @abc.abstractmethod
    def tensor_types(self) -> tuple[type, ...]:
        """The tensor classes of this framework (subclasses included by the caller's check)."""

    @abc.abstractmethod
    def meta_key(self, t: Any) -> tuple[Any, ...]:
        """``(shape, dtype, device, requires_grad)`` of ``t``, hashable, as cheap as possible."""

    def meta_check(self, tensors: Sequence[Any]) -> Callable[..., bool] | None:
        """A check, in one call, that tensors passed positionally have the ``meta_key`` of ``tensors`` (the same
        count, in order): True only where every ``meta_key`` would be equal (it may refuse more, strides or
        subclasses for one).  None where the framework has none (the caller reads each ``meta_key``)."""
        return None

    def lane_parts(self, modes: tuple[Any, ...], tensors: Sequence[Any],
                   strides: Sequence[Sequence[int]]) -> LaneParts | None:
        """What the replay lane (``graphjit/lane.py``) needs of the framework for a key whose modes are ``modes`` and
        whose tensors are like ``tensors`` with ``strides`` (each tensor's, in elements), or None where it has none
        (the Python path serves every call): see :class:`LaneParts`."""
        return None

    @abc.abstractmethod
    def shape(self, t: Any) -> tuple[int, ...]: ...

    @abc.abstractmethod
    def data_ptr(self, t: Any) -> int: ...

    @abc.abstractmethod
    def strides(self, t: Any) -> tuple[int, ...]:
        """The element strides of ``t``: with :meth:`data_ptr` and the shape, where a graph reads it from.  A view
        at the same address with other strides (``x.t()`` of a square ``x``) is another layout, not the same
        input."""

    @abc.abstractmethod
    def device_str(self, t: Any) -> str:
        """``"cpu"`` or ``"cuda:N"`` (``gpu:N`` is spelled ``cuda:N`` for every framework)."""

    @abc.abstractmethod
    def requires_grad(self, t: Any) -> bool: ...

    grad_flag: Callable[[Any], Any] = operator.attrgetter("requires_grad")
    """A tensor's requires-grad flag, read fast (compared, never interpreted: Paddle's is ``stop_gradient``)."""

    @abc.abstractmethod
    def is_floating(self, t: Any) -> bool: ...

    def unstrided(self, t: Any) -> str | None:
        """What ``t`` is where a graph cannot take it as an input (a sparse tensor: no one buffer at one address to
        copy into and read from), else None."""
        return None

    def unstrided_input(self, tensors: Sequence[Any], paths: Sequence[str]) -> str | None:
        """Why a call cannot be captured where one of its tensors is not strided (:meth:`unstrided`; the first, by
        its path), else None: the call then runs uncaptured under that reason."""
        for t, path in zip(tensors, paths):
            if (what := self.unstrided(t)) is not None:
                return f"{path} is {what}: a CUDA graph reads each input from one strided buffer (pass it dense)"
        return None

    @abc.abstractmethod
    def nbytes(self, t: Any) -> int: ...

    @abc.abstractmethod
    def empty(self, shape: Sequence[int], like: Any) -> Any:
        """A new uninitialised tensor of ``like``'s dtype and device with ``shape``."""

    def empty_as(self, shape: Sequence[int], like: Any) -> Any:
        """A new uninitialised tensor of ``like``'s dtype and device with ``shape`` (``like``'s, or a bucket's padded
        one), dense in ``like``'s order of dims where ``like`` is dense in another order than contiguous (a transposed
        or channels-last input's buffer is transposed or channels-last: the function captured on it sees the layout
        its key holds); contiguous otherwise (a slice, an expansion), and where the framework cannot lay one out."""
        return self.empty(shape, like)

    @abc.abstractmethod
    def zero_(self, t: Any) -> None: ...

    @abc.abstractmethod
    def clone(self, t: Any) -> Any:
        """A new tensor with ``t``'s contents, detached from autograd."""

    def view_offset(self, view: Any, base: Any) -> int | None:
        """How many elements past ``base``'s first ``view`` starts, where ``view`` lies in ``base``'s memory (a view
        of it, of its dtype), else None; None where the framework cannot say (an output that is a view of an input
        then comes back as a copy)."""
        return None

    def view_of(self, base: Any, like: Any, offset: int) -> Any:
        """A view of ``base`` with ``like``'s shape and strides, ``offset`` elements past ``base``'s first (only
        called where :meth:`view_offset` gave one)."""
        raise NotImplementedError

    @abc.abstractmethod
    def copy_(self, dst: Any, src: Any) -> None:
        """Copy ``src`` into ``dst`` (same shape and dtype; checked by the caller)."""

    def copy_many(self, dsts: Sequence[Any], srcs: Sequence[Any], grad_free: bool = False) -> None:
        """Copy pairwise; backends override this with a batched launch where they have one.
        ``grad_free``: the caller guarantees that no source requires grad (a cheaper path)."""
        for d, s in zip(dsts, srcs):
            self.copy_(d, s)

    def batch_operands(self) -> Any:
        """This framework's side of graphjit's batch copies (:class:`graphjit.batch_copy.Operands`), or None where
        it has none (the default: every copy is the framework's)."""
        return None

    @abc.abstractmethod
    def narrow(self, t: Any, dim: int, start: int, length: int) -> Any:
        """A view of ``t`` from ``start`` to ``start + length`` along ``dim`` (shares memory)."""

    @abc.abstractmethod
    def poison_(self, t: Any) -> None:
        """Fill ``t`` with NaN (floating) or the smallest integer (integral); bool is left as is."""

    @abc.abstractmethod
    def equal(self, a: Any, b: Any) -> bool:
        """Exact equality of contents, NaN equal to NaN (used to detect in-place mutation)."""

    def contents(self, tensors: Sequence[Any]) -> Any:
        """A copy of the contents of ``tensors`` that :meth:`changed` compares them with later (the default: a
        :meth:`clone` each; backends override it with fewer launches and one wait)."""
        return [self.clone(t) for t in tensors]

    def changed(self, tensors: Sequence[Any], copy: Any, known: Collection[int] = ()) -> list[int]:
        """The positions of those of ``tensors`` (the ones :meth:`contents` made ``copy`` of, in the same order)
        whose contents :meth:`equal` says differ from the copy now; those in ``known`` are left out, never compared
        (found written otherwise)."""
        return [i for i, (t, c) in enumerate(zip(tensors, copy)) if i not in known and not self.equal(t, c)]

    @abc.abstractmethod
    def rel_error(self, a: Any, b: Any) -> float:
        """``||a - b|| / ||b||`` computed in float64; ``inf`` when NaN positions differ."""

    @abc.abstractmethod
    def fingerprint(self, t: Any) -> str:
        """A short hash of the contents (for GRAPHJIT_DEBUG logs)."""

    # -- state a call may write (warmup and verify only; never on the replay path) ----------
    def version(self, t: Any) -> int | None:
        """``t``'s in-place version counter, or None where it has none (a write is then found by
        comparing contents)."""
        return None

    versions_complete: bool = False
    """True if every in-place write bumps :meth:`version` (torch); False if some do not (Paddle's
    ``copy_``), so that tensors whose version did not move are also compared by contents."""

    def tensor_state(self, t: Any) -> tuple[tuple[str, Any], ...]:
        """Tensors that ``t`` itself holds and a call may write, rebind or create (a parameter's gradient),
        as ``(attribute, tensor or None)``; walked with the objects a call reaches (:func:`graphjit.reach.walk`).
        Cheap: it runs for every reachable tensor in every warmup walk."""
        return ()

    module_holders: tuple[str, ...] = ()
    """The attribute through which the framework's Module/Layer objects hold their submodules (``_modules``):
    a guard reads its keys as the owner's attribute names (:mod:`graphjit.guards`)."""
    tensor_holders: tuple[str, ...] = ()
    """Attributes of the framework's Module/Layer objects whose dicts hold its tensors (``_parameters``,
    ``_buffers``): captured by address, not guarded as values (:mod:`graphjit.guards`)."""

    hook_holders: tuple[str, ...] = ()
    """Attributes of the framework's Module/Layer objects whose dicts hold the hooks a call runs (forward and
    backward): watched with a graph's guards (:mod:`graphjit.module_hooks`)."""

    def watch_loads(self, obj: Any) -> bool:
        """Have the framework say when ``obj``'s state is loaded (an optimizer's ``load_state_dict``: it rebinds the
        lists and dicts a graph's guards read; :func:`graphjit.guard_set.note_load`), once per object; True where it
        will.  Called for each optimizer, scheduler or scaler a guard scan reaches."""
        return False

    def hook_count(self) -> Callable[[], int] | None:
        """A function reading the framework's count of hook registrations (it moves whenever a hook is registered);
        None where the framework keeps none (module hooks are then not watched)."""
        return None

    def global_hooks(self) -> list[tuple[dict[Any, Any], tuple[Any, ...]]]:
        """The framework's global module hook dicts (run by every module call) with a path naming each."""
        return []

    renewed_attributes: tuple[tuple[type, str], ...] = ()
    """``(type, attribute)``: Python attributes the framework's own code sets to an equivalent new object on every
    call (Paddle's optimizers make a new ``helper`` in each ``step()``): neither a guarded value nor a write a
    replay would miss (:func:`graphjit.guards.scan` leaves them out)."""

    def set_tensor_state(self, t: Any, name: str, value: Any) -> None:  # noqa: B027 - optional, as tensor_state
        """Bind ``value`` (a tensor or None) as ``t``'s state ``name`` again (what :meth:`tensor_state` returned
        before a run graphjit undoes)."""

    def version_blind(self, path: tuple[Any, ...]) -> bool:
        """True for a tensor at ``path`` (:mod:`graphjit.reach`) that kernels may write without moving its
        version counter, so that warmup compares its contents too (torch's BatchNorm running statistics)."""
        return False

    versions_settable = False
    """:meth:`set_versions` puts version counters back (what feeding a rebound tensor needs: graphjit/renewals.py)."""

    def set_versions(self, tensors: Sequence[Any], versions: Sequence[int | None]) -> None:  # noqa: B027 - optional
        """Put ``tensors``' version counters back to ``versions`` (after a copy that stands for no write)."""

    def extent(self, t: Any) -> tuple[int, int]:
        """The bytes ``[start, end)`` ``t``'s elements lie in (empty for no elements)."""
        shape = self.shape(t)
        n = 1
        for d in shape:
            n *= d
        if n == 0:
            return (0, 0)
        start, reach = self.data_ptr(t), 1 + sum((d - 1) * abs(s) for d, s in zip(shape, self.strides(t)))
        return (start, start + reach * (self.nbytes(t) // n))

    def sole_storage(self, t: Any) -> bool:
        """True where no other tensor alive shares ``t``'s memory (no view of it, nor it a view): a copy of it can stand
        for it (:mod:`graphjit.renewals`).  False where the framework cannot tell."""
        return False

    def is_parameter(self, t: Any) -> bool:
        """True for a trainable parameter (``nn.Parameter``, Paddle's ``EagerParamBase``): a step
        graphjit captures does not write those, so they are never compared by contents."""
        return False

    def modes(self) -> tuple[Any, ...]:
        """The framework state a result depends on (grad mode, autocast, ...), hashable and cheap:
        it is part of every key."""
        return ()

    def mode_probes(self, modes: tuple[Any, ...]) -> tuple[tuple[Callable[[], Any], ...], tuple[Any, ...]]:
        """Functions of no argument, and what each must give, that all give it on a call only where :meth:`modes`
        would give ``modes`` (never looser; they may refuse more): C functions where the framework has them.  By
        default :meth:`modes` itself."""
        return (self.modes,), (modes,)

    def describe_modes(self, modes: tuple[Any, ...]) -> str:
        """A short label of ``modes`` for reports; empty for the framework's defaults."""
        return ""

    def rng_state(self, device: str) -> Any:
        """The state of the random generator a call on ``device`` draws from (None: no generator)."""
        return None

    def set_rng_state(self, device: str, state: Any) -> None:  # noqa: B027 - optional: no generator, nothing to set
        """Put back a state :meth:`rng_state` returned."""

    def rng_equal(self, a: Any, b: Any) -> bool:
        """True if two states of :meth:`rng_state` are the same (nothing was drawn in between)."""
        return True

    def host_generators(self, device: str) -> tuple[Any, ...]:
        """The framework's own generators a call on ``device`` may draw from on the host, other than
        :meth:`rng_state`'s (:class:`graphjit.host_random.Generator` each: torch's CPU generator for a CUDA device): a
        replay draws nothing from them, so they count as the host's global generators do (:mod:`graphjit.host_random`).
        None here."""
        return ()

    def rng_in_graphs(self) -> str | None:
        """None if a replay draws new random numbers and advances the generator as eager does;
        else why not (a key that draws random numbers then runs uncaptured with this reason)."""
        return None

    # -- tracing, devices, graphs ---------------------------------------------------------
    @abc.abstractmethod
    def trace(self, fn: Callable[..., Any], tracer: str) -> Callable[..., Any]:
        """Wrap ``fn`` with ``tracer``; the translation itself happens at the first call."""

    @abc.abstractmethod
    def graphs_unavailable(self, device: str) -> str | None:
        """``None`` if CUDA graphs can be captured for tensors on ``device``, else the reason."""

    @abc.abstractmethod
    def grad_enabled(self) -> bool: ...

    @abc.abstractmethod
    def new_pool(self, device: str) -> Any:
        """A memory pool several graphs can share (``None`` if the framework has none).  The caller keeps the
        returned object as long as it may capture into the pool; dropping it lets the framework free the
        pool once the graphs captured into it are gone."""

    def device_guard(self, device: str) -> contextlib.AbstractContextManager[Any]:
        """Make ``device`` current for the duration of the block."""
        return contextlib.nullcontext()

    def warmup_guard(self, device: str) -> contextlib.AbstractContextManager[Any]:
        """Where warmup runs (a side stream for torch); synchronised on exit."""
        return contextlib.nullcontext()

    def translating(self) -> bool:
        """True while the framework translates code to a static program (not a real call)."""
        return False

    def traced_call_guard(self) -> contextlib.AbstractContextManager[Any]:
        """Held around calls of the traced function (Paddle serialises its translators)."""
        return contextlib.nullcontext()

    def tracer_rereads_values(self, tracer: str) -> bool:
        """True if the traced function reads the Python values it uses on each call, or guards them itself (a
        new value runs new code); False for a translator that freezes them into its program at the first call
        (a changed value then needs a new translation)."""
        return True

    def tracer_misses_values(self, tracer: str) -> str | None:
        """Why ``tracer``'s guards may miss a Python value read off a class (so its program keeps running with the
        old value after it changed), or None where they do not.  Where they may, such a change after a capture makes
        graphjit trace the function with ``eager`` from then on
        (:meth:`graphjit.variants.ValueVariants.class_value_read`)."""
        return None

    def prepare_step(self, roots: list[tuple[str, Any]]) -> StepContext | None:
        """Once per key, at its first call: the :class:`~graphjit.feeds.StepContext` put around each of the key's
        calls when it is a training step (what it does with the training state the call reaches, ``roots``:
        optimizers made capturable once seen stepping, their lr fed from tensors, the gradient buffers kept).
        None: nothing to do."""
        return None

    def unversioned_writes(self, roots: list[tuple[str, Any]]) -> frozenset[int]:
        """``id()`` of the parameters among what ``roots`` reach that kernels may write without moving their
        version counters (warmup then compares their contents to see the write)."""
        return frozenset()

    def tracer_guard(self, target: Any, tracer: str, f_locals: dict[str, Any]) -> Any:
        """For a tracer with guards of its own: a callable returning None while the guards of the translation
        that ran for ``f_locals`` (the captured call's arguments by parameter name) still hold, else what failed
        (checked before each replay, beside graphjit's own guards).  None where there is nothing to check."""
        return None

    def tracer_failure(self, exc: BaseException, tracer: str) -> str | None:
        """A one-line description if ``exc``, raised by a call through ``tracer``, is a tracer's own internal failure,
        else None."""
        return None

    def original_error(self, exc: BaseException) -> BaseException | None:
        """The function's own exception behind ``exc`` where the tracer re-raised it changed, else None."""
        return None

    def sync_watch(self, hits: list[str]) -> contextlib.AbstractContextManager[None]:
        """Append a description of every CPU-GPU synchronisation inside the block to ``hits`` (with the
        Python file and line where the backend can tell).  Never raises for a sync: the block runs to
        its end, so a watched call is a complete eager call."""
        return contextlib.nullcontext()

    def compiles_unwatched(self, pause: Callable[[], None],
                           resume: Callable[[], None]) -> contextlib.AbstractContextManager[None]:
        """In the block, ``pause()`` where the framework's compiler starts translating and ``resume()`` where it
        ends (a warmup's Python-level watch is off for the compiler's own code, which runs no user code and adds
        no names).  Either may run on another thread than the block's; a backend without such a compiler calls
        neither."""
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def island_guard(self) -> Iterator[None]:
        """Around an island's run inside a watched warmup: CPU-GPU syncs inside the block are allowed
        (an island runs eagerly on every call), so :meth:`sync_watch` does not report them
        (:func:`in_island` is True in the block; watchers that record per call check it)."""
        _island_tls.depth += 1
        try:
            yield
        finally:
            _island_tls.depth -= 1

    def capture(self, fn: Callable[[], Any], device: str, pool: Any, debug: bool, feed: bool = False,
                operands: Callable[[], Iterable[Any]] | None = None) -> tuple[GraphHandle, Any]:
        """Capture ``fn()`` into a graph (:meth:`capture_graph`).  The capture is ended on every path, and
        Python's cyclic garbage collector does not run during it, nor while a failed one is ended
        (:func:`collector_paused`).  ``feed``: give the graph feed nodes where the backend can
        (:mod:`graphjit.handoff`).  ``operands``: the tensors the function computes with (its inputs and the state it
        reaches), for a backend that prepares its libraries by them before the capture; asked only where needed."""
        kw: dict[str, Any] = {}
        if feed:
            kw["feed"] = True
        if operands is not None:
            kw["operands"] = operands
        with collector_paused():
            return self.capture_graph(fn, device, pool, debug, **kw)

    @abc.abstractmethod
    def capture_graph(self, fn: Callable[[], Any], device: str, pool: Any, debug: bool, feed: bool = False,
                      operands: Callable[[], Iterable[Any]] | None = None) -> tuple[GraphHandle, Any]:
        """The framework's capture of ``fn()`` into a graph, ended on every path (:meth:`capture` calls it).
        ``feed``: where the backend can, the graph gets feed nodes and a ``feed`` attribute (:mod:`graphjit.handoff`);
        a backend without them ignores it.  ``operands``: see :meth:`capture` (torch: the dtype of its BLAS
        priming's product); a backend that needs none ignores it."""

    @abc.abstractmethod
    def synchronize(self, device: str) -> None: ...

    def capture_callable(self, traced: Callable[..., Any], original: Callable[..., Any],
                         tracer: str) -> Callable[..., Any]:
        """What runs inside the capture.  Backends may pick ``original`` where capturing the
        traced form is known to be unsafe; the choice is documented in the support matrix."""
        return traced
