"""The pieces of a graphed layer's state: its constants, the per-signature record (:class:`LayerKey`), the
graph pairs of one signature (:class:`Slot`), one forward waiting for its backward (:class:`MicroBatch`), and
the simulated graph that tests on machines without CUDA replay."""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from ..backends.base import Backend, GraphHandle
from ..errors import GraphjitError
from ..stats import KeyStats
from ..tree import collect_tensors

DEFAULT_WARMUP = 3
DEFAULT_MAX_IN_FLIGHT = 8
DEFAULT_MAX_GRAPHS = 64
SIDE_WARMUPS = 2  # eager forward+backward passes on the capture stream right before a capture
OUTPUTS = ("copy", "alias")
_SCALAR_LEAVES = (bool, int, float, complex, str, bytes, type(None))

class _Recording(threading.local):
    recording: str | None = None  # a thread's default: read without an AttributeError raised and caught


_tls = _Recording()


def recording() -> str | None:
    """The name of the graphed layer whose graphs this thread is recording (its side warmup or its capture), or
    None."""
    return _tls.recording


@contextlib.contextmanager
def record_guard(name: str) -> Iterator[None]:
    """Mark this thread as recording the graphs of the graphed layer ``name`` (:func:`recording`)."""
    previous = recording()
    _tls.recording = name
    try:
        yield
    finally:
        _tls.recording = previous


# -- simulated graphs (tests on machines without CUDA) --------------------------------------------
class SimulatedGraph(GraphHandle):
    """A stand-in for a CUDA graph: ``replay`` re-runs the captured function and copies its tensor
    results into the tensors the "capture" returned, so that every static buffer, copy and slot of
    the graphed path is exercised on a CPU."""

    def __init__(self, backend: Backend, fn: Callable[[], Any], out: Any) -> None:
        self.backend = backend
        self.fn = fn
        self.is_tensor = is_tensor_of(backend)
        self.targets = collect_tensors(out, self.is_tensor)

    def replay(self) -> None:
        new = collect_tensors(self.fn(), self.is_tensor)
        if len(new) != len(self.targets):  # pragma: no cover - the graphed path checks the structure
            raise GraphjitError("simulated replay: the function returned a different structure")
        for dst, src in zip(self.targets, new):
            if dst is not src:
                self.backend.copy_(dst, src)

    def reset(self) -> None:
        self.targets = []


def simulated_capture(backend: Backend, fn: Callable[[], Any]) -> tuple[GraphHandle, Any]:
    out = fn()
    return SimulatedGraph(backend, fn, out), out


# -- per key, per slot, per micro-batch ------------------------------------------------------------
class Slot:
    """One forward graph and one backward graph with their static buffers and memory pool."""

    __slots__ = ("_owner", "bwd", "diff_idx", "fwd", "grad_out", "grads", "in_ptrs", "in_targets", "index",
                 "nondiff_idx", "out_flat", "out_obj", "params", "pool_bytes", "static_in", "targets")

    def __init__(self, index: int) -> None:
        self.index = index
        self.fwd: GraphHandle | None = None
        self.bwd: GraphHandle | None = None
        self.static_in: list[Any] = []
        self.in_ptrs: list[int] = []
        self.in_targets: list[int] = []  # positions of inputs that require grad
        self.params: list[Any] = []
        self.targets: list[Any] = []  # what the backward graph differentiates (kept alive with the slot)
        self.out_obj: Any = None
        self.out_flat: list[Any] = []
        self.diff_idx: list[int] = []  # flat outputs that carry a gradient
        self.nondiff_idx: list[int] = []
        self.grad_out: list[Any] = []  # static grad-outputs, one per diff output
        self.grads: list[Any] = []  # static gradients: inputs in in_targets, then params (None: unused)
        self._owner: weakref.ref[MicroBatch] | None = None
        self.pool_bytes = 0

    @property
    def owner(self) -> MicroBatch | None:
        """The micro-batch that last used this slot, while it lives.  Held weakly: the micro-batch holds
        the slot, and a cycle would leave the slot's graphs to the garbage collector once the layer is
        dropped (freed late, and possibly in the middle of another capture)."""
        return self._owner() if self._owner is not None else None

    @owner.setter
    def owner(self, mb: MicroBatch | None) -> None:
        self._owner = weakref.ref(mb) if mb is not None else None

    def free(self) -> bool:
        o = self.owner
        return o is None or o.done or o.abandoned

    def release(self) -> None:
        for g in (self.fwd, self.bwd):
            if g is not None:
                with contextlib.suppress(Exception):
                    g.reset()
        self.fwd = self.bwd = None


class MicroBatch:
    """One graphed forward waiting for its backward."""

    __slots__ = ("__weakref__", "abandoned", "copy_grads", "done", "entry", "n_inputs", "number", "ref", "slot",
                 "started")

    def __init__(self, number: int, entry: LayerKey, slot: Slot, n_inputs: int) -> None:
        self.number = number
        self.entry = entry
        self.slot = slot
        self.n_inputs = n_inputs
        self.copy_grads: list[bool] = []
        self.done = False
        self.abandoned = False
        self.started = False  # its forward replay ran (it is in the queue)
        self.ref: Any = None

    def watch(self, ctx: Any) -> None:
        """Mark the micro-batch abandoned when its autograd node dies without a backward."""
        me = weakref.ref(self)

        def gone(_: Any) -> None:
            mb = me()
            if mb is not None and not mb.done:
                mb.abandoned = True

        try:
            self.ref = weakref.ref(ctx, gone)
        except TypeError:  # a context without weak references: it stays in the queue until its backward
            self.ref = None


class LayerKey:
    """Everything graphjit knows about one input signature of the layer."""

    __slots__ = ("backward_replays", "checked", "device", "guard", "reason", "slots", "stats", "variant_at",
                 "variants")

    def __init__(self, stats: KeyStats, device: str) -> None:
        self.stats = stats
        self.device = device
        self.slots: list[Slot] = []
        self.reason: str | None = None  # set: this key runs eagerly (FALLBACK or EAGER state)
        self.backward_replays = 0
        self.checked = False  # outputs of the first call checked
        self.guard: Any = None  # the values its forward reads (training/values.py), from its first slot's recording
        self.variants = 0  # keys made for other values of those, from this key of the arguments, each soon after the
        self.variant_at = -(1 << 30)  # last (``variant_at``: the call that made the last): values that drift


def unsupported_leaf(x: Any, is_tensor: Callable[[Any], bool], path: str = "") -> tuple[str, type] | None:
    """The first leaf of ``x`` (depth first, with its index path) that is neither a tensor nor a constant,
    or None.  A module-level function like :func:`graphjit.buffers.collect_tensors`' walk (a recursive
    closure would be a reference cycle)."""
    if is_tensor(x) or isinstance(x, _SCALAR_LEAVES):
        return None
    if isinstance(x, (list, tuple)):
        children = [(f"{path}[{i}]", e) for i, e in enumerate(x)]
    elif isinstance(x, dict):
        children = [(f"{path}[{k!r}]", v) for k, v in x.items()]
    else:
        return path, type(x)
    for child_path, child in children:
        bad = unsupported_leaf(child, is_tensor, child_path)
        if bad is not None:
            return bad
    return None


def is_tensor_of(b: Backend) -> Callable[[Any], bool]:
    types = b.tensor_types()
    return lambda x: isinstance(x, types)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return next((line for line in text if line.strip()), type(exc).__name__)
