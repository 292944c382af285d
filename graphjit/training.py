"""``graphjit.graphed_layer``: forward and backward CUDA graphs for training a Layer or Module.

``graphed_layer(layer, warmup=3)`` returns a wrapper (a ``torch.nn.Module`` for a torch module, a
``paddle.nn.Layer`` for a Paddle layer) that calls like ``layer`` and, per input signature (shapes,
dtypes, devices, requires-grad flags and non-tensor values, as ``@graphed`` keys them; plus the
layer's train/eval mode and, for torch, the autocast state), goes through these states:

WARMUP
    The first ``warmup`` calls of a key run the layer eagerly (plain autograd, exactly eager).
CAPTURE (record)
    The next call records a *slot*: graphjit-owned static inputs, then ``2`` more eager forward and
    backward passes on a side stream (lazy initialisation of the backward kernels; module buffers
    such as running statistics and the RNG state are restored afterwards), then the forward graph and,
    right after it and into the same memory pool, the backward graph: ``autograd.grad`` of the
    outputs that require grad with respect to the inputs that require grad and the layer's trainable
    parameters.  ``.backward()`` never runs inside a capture, so no ``.grad`` is touched there.  With
    ``verify`` (default from ``GRAPHJIT_VERIFY``) both graphs are replayed once and compared with the
    eager pass (outputs, and gradients for grad-outputs equal to the outputs); a mismatch falls back.
REPLAY
    A call copies its tensors into the slot's static inputs (only those at another address),
    replays the forward graph and returns copies of the outputs through an autograd function
    (``torch.autograd.Function`` / ``paddle.autograd.PyLayer``); its backward copies the incoming
    gradients into the static grad-outputs, replays the backward graph, and returns the gradients.
FALLBACK / EAGER
    A key whose capture failed (reason in :meth:`stats`), a machine without CUDA (one INFO line per
    layer), grad mode off, nothing requiring grad, or ``GRAPHJIT_DISABLE=1``: the layer runs eagerly.

Outputs.  ``outputs="copy"`` (default) returns fresh tensors: a later forward of the same slot
cannot change what the caller holds.  ``outputs="alias"`` returns the slot's static output buffers
(no copy), valid until that slot's next forward (after this micro-batch's backward).

Gradients, exactly as eager.  The layer's trainable parameters are inputs of the autograd function,
so torch's / Paddle's own gradient accumulation stores their gradients (and runs their hooks, e.g.
DDP's).  Where that accumulation may keep the tensor it is handed as ``.grad`` (torch: ``.grad`` is
None; Paddle: always, since after ``clear_gradients()`` it keeps the next incoming tensor), it gets a
fresh copy of the graph's gradient buffer, as eager gets a fresh tensor; otherwise (torch, ``.grad``
exists) the buffer itself is added into ``.grad`` in place.  Gradients of leaf inputs are fresh copies
(they become ``.grad``); with torch, gradients flowing on to non-leaf inputs are the buffers
themselves (consumed within the backward pass; Paddle: copies).  So gradient accumulation over
micro-batches gives the same ``.grad`` as eager, never a buffer a later replay overwrites.  Any number
of outputs may carry gradients; inputs may or may not require grad; unused inputs and parameters get
no gradient, as in eager.

Several micro-batches in flight (1F1B and interleaved pipeline schedules).  A forward replay
overwrites its slot's saved activations, so a forward issued before the previous micro-batch's
backward takes another slot: each key has up to ``max_in_flight`` slots, each with its own forward
graph, backward graph, static buffers and memory pool, recorded lazily the first time that many
micro-batches are outstanding.  Memory cost per slot: about one eager forward-plus-backward of the
layer (saved activations and backward temporaries, kept reserved in the slot's pool), plus its
static inputs, outputs and grad-outputs, plus one set of gradient buffers the size of the inputs that
require grad and of the trainable parameters.  A plain loop (one micro-batch at a time) uses one
slot; a 1F1B stage with P micro-batches in flight uses P.  Beyond ``max_in_flight`` a micro-batch
runs eagerly (said once; an error in strict mode).  Backwards must come in forward order (first in,
first out): a backward out of that order raises :class:`~graphjit.errors.BackwardOrderError` naming
the micro-batch expected (a micro-batch whose outputs were dropped without a backward frees its slot
and leaves the queue).  With Paddle, the error reaches the caller wrapped by Paddle's autograd
engine (an ``OSError`` whose text carries the message).

Environment (read through :mod:`graphjit.env`) and Paddle's ``CUDAGraphedLayer`` toggles:

* ``GRAPHJIT_DISABLE=1`` calls the wrapped layer itself (no warmup counting, no capture): the
  counterpart of ``PADDLE_DEBUG_CUDAGRAPHEDLAYER_FALLBACK_TO_DEFAULT=1``.
* ``GRAPHJIT_DEBUG=1`` logs every state change at DEBUG level (warmup k/n, record of a slot with its
  capture time and pool size, each forward and backward replay with micro-batch number, slot and
  fingerprints of inputs, outputs and gradients, each fallback): the counterpart of
  ``PADDLE_DEBUG_ENABLE_CUDAGRAPH_LAYER_LOGGING=1``.  graphjit does not read the Paddle variables.
* ``GRAPHJIT_STRICT``, ``GRAPHJIT_VERIFY``, ``GRAPHJIT_MAX_GRAPHS`` (input signatures per layer) and
  ``GRAPHJIT_DUMP_DIR`` apply as for ``@graphed``.

Restrictions (as for any CUDA graph): parameters are captured by address (an optimizer updates them
in place, which is fine; after replacing parameter tensors, moving the layer, or changing which
parameters require grad, call :meth:`reset`); Python side effects and forward hooks run during warmup
and capture only; the layer must not synchronise the CPU with the GPU; tensors that require grad and
that the layer uses must be its parameters or its inputs (torch: checked at capture); backward
through one micro-batch twice (``retain_graph=True``) and double backward are not supported.
"""

from __future__ import annotations

import abc
import collections
import contextlib
import copy
import gc
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from . import backends, env
from . import scope as scope_mod
from .backends.base import CAPTURE_LOCK, Backend, GraphHandle
from .buffers import collect_tensors
from .capture import tolerance
from .errors import (
    BackwardOrderError,
    CaptureError,
    ConfigError,
    GraphjitError,
    UnrecoverableCaptureError,
    UnsupportedOutputError,
    VerifyError,
)
from .keys import CallSignature, Signer, rebuild, rebuild_call
from .stats import FunctionStats, KeyStats, State

log = logging.getLogger("graphjit")

DEFAULT_WARMUP = 3
DEFAULT_MAX_IN_FLIGHT = 8
DEFAULT_MAX_GRAPHS = 64
SIDE_WARMUPS = 2  # eager forward+backward passes on the capture stream right before a capture
OUTPUTS = ("copy", "alias")
_SCALAR_LEAVES = (bool, int, float, complex, str, bytes, type(None))

_tls = threading.local()


def _recording() -> bool:
    return bool(getattr(_tls, "recording", False))


@contextlib.contextmanager
def _record_guard() -> Iterator[None]:
    previous = _recording()
    _tls.recording = True
    try:
        yield
    finally:
        _tls.recording = previous


# -- the framework glue: implemented in backends/torch/training.py and backends/paddle/training.py ---
class Glue(abc.ABC):
    """What the state machine needs from a framework's autograd, for one wrapped layer."""

    backend: Backend
    layer: Any

    @abc.abstractmethod
    def call_layer(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Call the wrapped layer as the user would (grad mode as it is)."""

    @abc.abstractmethod
    def run_layer(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Call the wrapped layer with grad mode on (inside an autograd function or a capture)."""

    @abc.abstractmethod
    def mode_key(self) -> tuple[Any, ...]:
        """State outside the arguments that changes what the layer computes (train/eval, autocast)."""

    @abc.abstractmethod
    def trainable_params(self) -> list[Any]:
        """The layer's parameters that require grad, in a fixed order."""

    def begin_capture_params(self, params: list[Any]) -> list[Any]:
        """The tensors the recorded graphs differentiate with respect to, one per parameter, in
        ``params`` order; :meth:`run_layer` uses them until :meth:`end_capture_params`.  Default:
        the parameters themselves."""
        return params

    def end_capture_params(self) -> None:  # noqa: B027 - an optional hook; the default has nothing to undo
        """Back to the layer's own parameters."""

    @abc.abstractmethod
    def static_input(self, t: Any) -> Any:
        """A new leaf tensor with ``t``'s contents that requires grad exactly when ``t`` does."""

    @abc.abstractmethod
    def grad(self, outputs: Sequence[Any], targets: Sequence[Any], grad_outputs: Sequence[Any]) -> list[Any]:
        """Gradients of ``outputs`` (weighted by ``grad_outputs``) for ``targets``; None where unused.
        Never writes any ``.grad``."""

    @abc.abstractmethod
    def apply(self, core: GraphedLayerCore, mb: MicroBatch, tensors: Sequence[Any]) -> tuple[Any, ...]:
        """Run the autograd function of one graphed micro-batch (inputs, then parameters)."""

    @abc.abstractmethod
    def detach(self, t: Any) -> Any:
        """A tensor sharing ``t``'s memory, without autograd history."""

    @abc.abstractmethod
    def may_keep_grad(self, p: Any) -> bool:
        """True if the framework's accumulation may keep the gradient tensor handed to it as ``p.grad``
        (instead of adding it into an existing one): then it gets a fresh copy, never a graph buffer."""

    @abc.abstractmethod
    def copy_input_grad(self, t: Any) -> bool:
        """True if the gradient for input ``t`` must be a fresh tensor (it may be kept as a ``.grad``);
        False if it only flows on to the node that produced ``t`` within the backward pass."""

    @abc.abstractmethod
    def snapshot(self) -> Any:
        """Module state that a forward may change (buffers, RNG), to undo extra warmup passes."""

    @abc.abstractmethod
    def restore(self, snap: Any) -> None: ...

    def stray_leaves(self, outputs: Sequence[Any], targets: Sequence[Any]) -> list[str]:
        """Tensors that require grad, feed ``outputs``, and are not in ``targets`` (their gradient
        would be lost by the graphs); descriptions for the message.  Empty where unknown."""
        return []

    def hooks(self) -> list[str]:
        """Names of submodules with forward/backward hooks (they do not run on replays)."""
        return []

    def default_device(self) -> str | None:
        """The device of the layer's first parameter (for layers called without tensors)."""
        return None


# -- simulated graphs (tests on machines without CUDA) --------------------------------------------
class SimulatedGraph(GraphHandle):
    """A stand-in for a CUDA graph: ``replay`` re-runs the captured function and copies its tensor
    results into the tensors the "capture" returned, so that every static buffer, copy and slot of
    the graphed path is exercised on a CPU."""

    def __init__(self, backend: Backend, fn: Callable[[], Any], out: Any) -> None:
        self.backend = backend
        self.fn = fn
        self.is_tensor = _is_tensor_of(backend)
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

    def __init__(self, number: int, entry: KeyEntry, slot: Slot, n_inputs: int) -> None:
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


class KeyEntry:
    """Everything graphjit knows about one input signature of the layer."""

    __slots__ = ("backward_replays", "checked", "device", "reason", "slots", "stats")

    def __init__(self, stats: KeyStats, device: str) -> None:
        self.stats = stats
        self.device = device
        self.slots: list[Slot] = []
        self.reason: str | None = None  # set: this key runs eagerly (FALLBACK or EAGER state)
        self.backward_replays = 0
        self.checked = False  # outputs of the first call checked


# -- the state machine -----------------------------------------------------------------------------
class GraphedLayerCore:
    """Framework-neutral state of one graphed layer: keys, slots, the FIFO queue, stats."""

    def __init__(self, glue: Glue, name: str, warmup: int = DEFAULT_WARMUP, max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
                 outputs: str = "copy", verify: bool | None = None, strict: bool | None = None,
                 max_graphs: int | None = None, simulate: bool = False) -> None:
        self.glue = glue
        self.backend = glue.backend
        self.name = name
        self.warmup = warmup
        self.max_in_flight = max_in_flight
        self.outputs = outputs
        self.verify_opt = verify
        self.strict_opt = strict
        self.max_graphs_opt = max_graphs
        self.simulate = simulate
        self.options = {"warmup": warmup, "max_in_flight": max_in_flight, "outputs": outputs, "verify": verify,
                        "strict": strict, "max_graphs": max_graphs, "simulate": simulate}
        self.signer = Signer(getattr(glue.layer, "forward", glue.layer), None, self.backend.name, name)
        self.stats = FunctionStats(name)
        self.entries: dict[tuple[Any, ...], KeyEntry] = {}
        self.queue: collections.deque[MicroBatch] = collections.deque()
        self.lock = threading.RLock()
        self.said: set[str] = set()
        self.is_tensor = _is_tensor_of(self.backend)
        self.micro_batches = 0  # graphed forwards
        self.forwards = 0  # every non-disabled call: numbers the micro-batches

    # -- settings --------------------------------------------------------------------------
    def strict(self) -> bool:
        return env.settings().strict if self.strict_opt is None else self.strict_opt

    def verify(self) -> bool:
        return env.settings().verify if self.verify_opt is None else self.verify_opt

    def max_graphs(self) -> int:
        if self.max_graphs_opt is not None:
            return self.max_graphs_opt
        from_env = env.settings().max_graphs
        return DEFAULT_MAX_GRAPHS if from_env is None else from_env

    def say_once(self, level: int, topic: str, msg: str, *args: Any) -> None:
        if topic not in self.said:
            self.said.add(topic)
            log.log(level, msg, *args)

    # -- the call --------------------------------------------------------------------------
    def call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        settings = env.settings()
        if settings.disable:
            self.stats.disabled_calls += 1
            return self.glue.call_layer(args, kwargs)
        self.stats.calls += 1
        self.forwards += 1
        if _recording() or scope_mod.phase() == "capture":
            # Called inside another graph's warmup or capture (a graphed layer within a graphed layer):
            # the outer graph records this layer's kernels.
            self.stats.fallback("inside another capture")
            return self.glue.call_layer(args, kwargs)
        if not self.backend.grad_enabled():
            self.stats.fallback("grad disabled (inference; use @graphjit.graphed for inference graphs)")
            return self.glue.call_layer(args, kwargs)
        sig = self.signer.sign(None, args, kwargs)
        key = (*sig.key, *self.glue.mode_key())
        entry = self.entries.get(key)
        if entry is None:
            with self.lock:
                entry = self.entries.get(key)
                if entry is None:
                    entry = self.new_entry(key, sig)
                    if entry is None:  # max_graphs reached: counted, runs eagerly
                        return self.eager_checked(args, kwargs, "max_graphs reached", None)
        if entry.reason is not None:
            entry.stats.uncaptured += 1
            self.stats.fallback(entry.reason)
            out = self.glue.call_layer(args, kwargs)
            if not entry.checked:  # the same layer must fail the same way on every machine
                entry.checked = True
                self.check_outputs(out)
            return out
        st = entry.stats
        if st.warmups < self.warmup:
            return self.warmup_call(entry, args, kwargs)
        with self.lock:
            self.purge()
            slot = next((s for s in entry.slots if s.free()), None)
            if slot is None:
                if len(entry.slots) >= self.max_in_flight:
                    return self.too_many_in_flight(entry, args, kwargs)
                slot = self.record(entry, sig, args, kwargs)
                if slot is None:  # the capture failed: this key runs eagerly from now on
                    return self.glue.call_layer(args, kwargs)
            mb = MicroBatch(self.forwards, entry, slot, len(sig.tensors))
            slot.owner = mb
        params = slot.params
        try:
            flat = self.glue.apply(self, mb, [*sig.tensors, *params])
        except BaseException:
            mb.abandoned = True
            raise
        if slot.out_obj is None or self.is_tensor(slot.out_obj):
            return flat[0]
        return rebuild(slot.out_obj, list(flat), self.is_tensor)

    def new_entry(self, key: tuple[Any, ...], sig: CallSignature) -> KeyEntry | None:
        b = self.backend
        label = self.label(sig)
        devices = sorted({b.device_str(t) for t in sig.tensors})
        if not devices:
            d = self.glue.default_device()
            devices = [d] if d else ["cpu"]
        reason: str | None = None
        state = State.FALLBACK
        if len(devices) > 1:
            reason = f"inputs on several devices ({', '.join(devices)})"
            self.say_once(logging.WARNING, reason, "graphjit %s: %s; running the layer eagerly", self.name, reason)
        elif not self.simulate:
            unavailable = b.graphs_unavailable(devices[0])
            if unavailable is not None:
                reason, state = "no CUDA graphs: " + unavailable, State.EAGER
                self.say_once(logging.INFO, "nocuda", "graphjit %s: no CUDA graph (%s); running the layer eagerly",
                              self.name, unavailable)
        if reason is None and not any(b.requires_grad(t) for t in sig.tensors) and not self.glue.trainable_params():
            reason, state = "nothing requires grad (use @graphjit.graphed for inference graphs)", State.EAGER
        if reason is None and sum(1 for e in self.entries.values() if e.reason is None) >= self.max_graphs():
            msg = (f"max_graphs={self.max_graphs()} input signatures already graphed; new signatures run eagerly "
                   "(raise max_graphs or GRAPHJIT_MAX_GRAPHS)")
            if self.strict():
                raise CaptureError(f"{self.name}: {msg}", reason="max_graphs reached")
            self.say_once(logging.WARNING, "max_graphs", "graphjit %s: %s", self.name, msg)
            return None
        st = KeyStats(label=label)
        entry = KeyEntry(st, devices[0])
        if reason is not None:
            st.state, st.reason, entry.reason = state, reason, reason
        self.stats.keys[key] = st
        self.entries[key] = entry
        if env.settings().debug:
            log.debug("graphjit %s [%s]: new key on %s%s", self.name, label, devices[0],
                      f" (eager: {reason})" if reason else f", {self.warmup} warmup call(s) first")
        return entry

    def eager_checked(self, args: tuple[Any, ...], kwargs: dict[str, Any], reason: str,
                      entry: KeyEntry | None) -> Any:
        self.stats.fallback(reason)
        if entry is not None:
            entry.stats.uncaptured += 1
        return self.glue.call_layer(args, kwargs)

    def warmup_call(self, entry: KeyEntry, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        st = entry.stats
        out = self.glue.call_layer(args, kwargs)
        if not entry.checked:
            entry.checked = True
            self.check_outputs(out)
        st.warmups += 1
        st.state = State.WARMUP
        if env.settings().debug:
            log.debug("graphjit %s [%s]: warmup %d/%d (eager) outputs=%s", self.name, st.label, st.warmups,
                      self.warmup, self.fingerprints(collect_tensors(out, self.is_tensor)))
        return out

    def too_many_in_flight(self, entry: KeyEntry, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        msg = (f"more than max_in_flight={self.max_in_flight} micro-batches of one input signature are waiting "
               "for their backward; the extra ones run eagerly (raise max_in_flight, at the cost of one more "
               "graph pair and its activation memory each)")
        if self.strict():
            raise CaptureError(f"{self.name} [{entry.stats.label}]: {msg}", reason="too many micro-batches in flight")
        self.say_once(logging.WARNING, "inflight", "graphjit %s [%s]: %s", self.name, entry.stats.label, msg)
        return self.eager_checked(args, kwargs, "too many micro-batches in flight", entry)

    # -- record a slot ---------------------------------------------------------------------
    def record(self, entry: KeyEntry, sig: CallSignature, args: tuple[Any, ...],
               kwargs: dict[str, Any]) -> Slot | None:
        """Record a new slot for ``entry``; None (the key now runs eagerly) if that fails."""
        st = entry.stats
        try:
            slot = self.build_slot(entry, sig, args, kwargs)
        except CaptureError as exc:
            st.state, st.reason = State.FALLBACK, str(exc)
            entry.reason = exc.reason
            for s in entry.slots:  # slots of micro-batches still in flight stay usable for their backward
                if s.free():
                    s.release()
            if isinstance(exc, UnrecoverableCaptureError) or self.strict():
                raise
            self.stats.fallback(exc.reason)
            st.uncaptured += 1
            self.say_once(logging.WARNING, "fail:" + exc.reason, "graphjit %s; running the layer eagerly", exc)
            return None
        entry.slots.append(slot)
        st.state = State.REPLAY
        return slot

    def build_slot(self, entry: KeyEntry, sig: CallSignature, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Slot:
        b, glue = self.backend, self.glue
        st = entry.stats
        device = entry.device
        debug = env.settings().debug
        dump_dir = env.settings().dump_dir
        slot = Slot(len(entry.slots))
        if not entry.slots:
            hooked = glue.hooks()
            if hooked:
                self.say_once(logging.WARNING, "hooks", "graphjit %s: hooks on %s run during warmup and capture only, "
                              "not on graph replays", self.name, ", ".join(hooked[:5]))
        t0 = time.perf_counter()
        with CAPTURE_LOCK, b.device_guard(device), _record_guard():
            st.state = State.CAPTURE
            if b.poisoned is not None:
                raise UnrecoverableCaptureError(f"{self.name}: {b.poisoned}")
            static_in = [glue.static_input(t) for t in sig.tensors]
            sargs, skwargs = rebuild_call(args, kwargs, static_in, self.is_tensor)
            in_targets = [i for i, t in enumerate(static_in) if b.requires_grad(t)]
            params = glue.trainable_params()
            # (a simulated capture re-runs the layer at each "replay", after the aliases are gone)
            param_targets = params if self.simulate else glue.begin_capture_params(params)
            targets = [static_in[i] for i in in_targets] + param_targets
            snap = glue.snapshot()
            try:
                expected_out, expected_shape, expected_diff, expected_grads = self.side_warmup(
                    sargs, skwargs, targets, device, snap, st.label)
            except BaseException:
                glue.end_capture_params()
                raise
            finally:
                glue.restore(snap)
            b.synchronize(device)
            slot.targets = targets  # keep the differentiated tensors alive with the slot

            holder: dict[str, Any] = {}

            def forward() -> Any:
                out = glue.run_layer(sargs, skwargs)
                holder["out"] = out
                return out

            capture = self.capture_fn(device, dump_dir is not None)
            phase = "warmup" if self.simulate else "capture"  # a simulated capture runs collectives eagerly
            t_cap = time.perf_counter()
            try:
                with self.capture_errors("forward", st.label):
                    with scope_mod.graphed_call(phase):
                        slot.fwd, out_obj = capture(forward)
                    self.after_capture()
                out_flat = collect_tensors(out_obj, self.is_tensor)
                diff_idx = [j for j, o in enumerate(out_flat) if b.requires_grad(o)]
                if rebuild(out_obj, [None] * len(out_flat), self.is_tensor) != expected_shape or \
                        diff_idx != expected_diff:
                    raise CaptureError(f"{self.name} [{st.label}]: the layer returned a different structure during "
                                       "the capture than in warmup", reason="outputs differ between warmup and capture")
                grad_out = [b.empty(b.shape(out_flat[j]), out_flat[j]) for j in diff_idx]

                is_tensor = self.is_tensor  # not self: a simulated graph keeps this closure (no cycle to the core)

                def backward() -> Any:
                    flat = collect_tensors(holder["out"], is_tensor)
                    return tuple(glue.grad([flat[j] for j in diff_idx], targets, grad_out))

                with self.capture_errors("backward", st.label):
                    with scope_mod.graphed_call(phase):
                        slot.bwd, grads = capture(backward)
                    self.after_capture()
                capture_ms = (time.perf_counter() - t_cap) * 1e3
                slot.static_in = static_in
                slot.in_ptrs = [b.data_ptr(t) for t in static_in]
                slot.in_targets = in_targets
                slot.params = params
                slot.out_obj = out_obj
                slot.out_flat = out_flat
                slot.diff_idx = diff_idx
                slot.nondiff_idx = [j for j in range(len(out_flat)) if j not in set(diff_idx)]
                slot.grad_out = grad_out
                slot.grads = list(grads)
                slot.pool_bytes = slot.fwd.pool_bytes + slot.bwd.pool_bytes
                glue.restore(snap)  # (a simulated capture runs the layer)
                if self.verify():
                    try:
                        self.verify_slot(slot, expected_out, expected_grads, st.label)
                    finally:
                        glue.restore(snap)  # the call itself replays from the state eager would see
                    b.synchronize(device)
                if dump_dir is not None:
                    self.dump(slot, dump_dir, st.label)
            except BaseException:
                slot.release()
                raise
            finally:
                glue.end_capture_params()
        st.captures += 1
        st.capture_ms += capture_ms
        st.pool_bytes += slot.pool_bytes
        if debug:
            log.debug("graphjit %s [%s]: recorded slot %d (forward + backward graphs) in %.1f ms (capture %.1f ms), "
                      "pool %d bytes, %d outputs (%d with grad), %d gradients", self.name, st.label, slot.index,
                      (time.perf_counter() - t0) * 1e3, capture_ms, slot.pool_bytes, len(out_flat), len(diff_idx),
                      sum(1 for g in slot.grads if g is not None))
        return slot

    def after_capture(self) -> None:
        """Run the hooks due right after a capture, before its first replay (graphjit.collectives
        registers the captured all-reduce buffers on every rank there)."""
        if self.simulate:
            return
        for hook in list(getattr(scope_mod, "AFTER_CAPTURE", ())):
            hook()

    @contextlib.contextmanager
    def capture_errors(self, which: str, label: str) -> Iterator[None]:
        """Name the layer, the key and the graph in a capture failure (a CaptureError either way)."""
        try:
            yield
        except UnrecoverableCaptureError:
            raise
        except CaptureError as exc:
            raise CaptureError(f"{self.name} [{label}]: the {which} capture failed: {exc}", reason=exc.reason) from exc
        except Exception as exc:
            raise CaptureError(f"{self.name} [{label}]: the {which} capture failed: {_first_line(exc)}",
                               reason="capture failed: " + _first_line(exc)[:120]) from exc

    def capture_fn(self, device: str, debug: bool) -> Callable[[Callable[[], Any]], tuple[GraphHandle, Any]]:
        b = self.backend
        if self.simulate:
            return lambda fn: simulated_capture(b, fn)
        pool = b.new_pool(device)  # one pool per slot: slots replay in any order (pipeline schedules)
        return lambda fn: b.capture(fn, device, pool, debug)

    def side_warmup(self, sargs: tuple[Any, ...], skwargs: dict[str, Any], targets: list[Any], device: str,
                    snap: Any, label: str) -> tuple[list[Any], Any, list[int], list[Any]]:
        """Eager forward+backward passes on the capture stream; returns what verify compares with."""
        b, glue = self.backend, self.glue
        guard = contextlib.nullcontext() if self.simulate else b.warmup_guard(device)
        expected_out: list[Any] = []
        expected_grads: list[Any] = []
        shape: Any = None
        diff: list[int] = []
        with guard, scope_mod.graphed_call("warmup"):
            for _ in range(SIDE_WARMUPS):
                glue.restore(snap)  # each pass starts from the state the real call will see
                out = glue.run_layer(sargs, skwargs)
                flat = collect_tensors(out, self.is_tensor)
                diff = [j for j, o in enumerate(flat) if b.requires_grad(o)]
                if not diff:
                    raise CaptureError(f"{self.name} [{label}]: no output requires grad, so there is no backward "
                                       "to graph", reason="no output requires grad")
                stray = glue.stray_leaves([flat[j] for j in diff], targets)
                if stray:
                    raise CaptureError(
                        f"{self.name} [{label}]: the layer uses tensors that require grad but are neither its "
                        f"parameters nor its inputs ({'; '.join(stray[:3])}); the graphs would not produce their "
                        "gradients. Register them as parameters of the layer or pass them as inputs",
                        reason="uses tensors that require grad outside its parameters and inputs")
                probe = [b.clone(flat[j]) for j in diff]  # grad-outputs: the outputs themselves
                grads = glue.grad([flat[j] for j in diff], targets, probe)
                expected_out = [b.clone(o) for o in flat]
                expected_grads = [None if g is None else b.clone(g) for g in grads]
                shape = rebuild(out, [None] * len(flat), self.is_tensor)
                del out, flat, probe, grads
        return expected_out, shape, diff, expected_grads

    def verify_slot(self, slot: Slot, expected_out: list[Any], expected_grads: list[Any], label: str) -> None:
        b = self.backend
        assert slot.fwd is not None and slot.bwd is not None
        slot.fwd.replay()
        for j, (got, want) in enumerate(zip(slot.out_flat, expected_out)):
            err = b.rel_error(got, want)
            if not err <= tolerance(want):
                raise VerifyError(f"{self.name} [{label}]: verify failed: output {j} of the forward graph differs from "
                                  f"eager by {err:.3g} (relative). The layer depends on something a CUDA graph freezes "
                                  "(a Python value, the host clock or RNG, an output not computed on the GPU); pass "
                                  "verify=False only if that difference is expected (e.g. dropout)")
        for j, dst in zip(slot.diff_idx, slot.grad_out):
            b.copy_(dst, slot.out_flat[j])
        slot.bwd.replay()
        for k, (got, want) in enumerate(zip(slot.grads, expected_grads)):
            if (got is None) != (want is None):
                raise VerifyError(f"{self.name} [{label}]: verify failed: gradient {k} is "
                                  f"{'missing' if got is None else 'present'} in the backward graph but not in eager")
            if got is None:
                continue
            err = b.rel_error(got, want)
            if not err <= tolerance(want):
                raise VerifyError(f"{self.name} [{label}]: verify failed: gradient {k} of the backward graph differs "
                                  f"from eager by {err:.3g} (relative)")

    def dump(self, slot: Slot, folder: Any, label: str) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in f"{self.name}-{label}-slot{slot.index}")
        for kind, g in (("fwd", slot.fwd), ("bwd", slot.bwd)):
            path = folder / f"{stem}-{kind}.dot"
            try:
                assert g is not None
                g.dump(path)
                log.info("graphjit %s: wrote %s", self.name, path)
            except Exception as exc:  # a dump is a debugging aid; never fail the call for it
                log.warning("graphjit %s: could not write the graph dump %s: %s", self.name, path, exc)

    # -- inside the autograd function ------------------------------------------------------
    def forward_replay(self, mb: MicroBatch, inputs: Sequence[Any]) -> tuple[list[Any], list[Any]]:
        """Load inputs, replay the forward graph; return (outputs, the non-differentiable ones)."""
        b = self.backend
        slot = mb.slot
        entry = mb.entry
        with self.lock:
            dsts, srcs = [], []
            ptr = b.data_ptr
            for s, p, t in zip(slot.static_in, slot.in_ptrs, inputs):
                if ptr(t) != p:
                    dsts.append(s)
                    srcs.append(t)
            if dsts:
                b.copy_many(dsts, srcs)
                entry.stats.input_copies += len(dsts)
            assert slot.fwd is not None
            slot.fwd.replay()
            entry.stats.replays += 1
            if self.outputs == "copy":
                outs = [b.clone(o) for o in slot.out_flat]
            else:
                outs = [self.glue.detach(o) for o in slot.out_flat]
            mb.copy_grads = [self.glue.copy_input_grad(t) for t in inputs]
            mb.started = True
            self.queue.append(mb)
            self.micro_batches += 1
        if env.settings().debug:
            log.debug("graphjit %s [%s]: forward replay micro-batch %d slot %d inputs=%s outputs=%s", self.name,
                      entry.stats.label, mb.number, slot.index, self.fingerprints(list(inputs)),
                      self.fingerprints(outs))
        return outs, [outs[j] for j in slot.nondiff_idx]

    def backward_replay(self, mb: MicroBatch, grads: Sequence[Any]) -> list[Any]:
        """Check FIFO order, load grad-outputs, replay the backward graph; gradients for the function's
        tensor inputs (layer inputs, then parameters)."""
        b, glue = self.backend, self.glue
        slot = mb.slot
        entry = mb.entry
        with self.lock:
            if mb.done:
                raise GraphjitError(
                    f"{self.name}: a second backward through micro-batch {mb.number} (retain_graph=True); "
                    "graphed_layer supports one backward per forward (the backward graph reuses the forward's saved "
                    "activations)")
            self.check_order(mb)
            self.queue.popleft()
            for j, dst in zip(slot.diff_idx, slot.grad_out):
                g = grads[j]
                if g is None:
                    b.zero_(dst)
                elif b.data_ptr(g) != b.data_ptr(dst):
                    b.copy_(dst, g)
            assert slot.bwd is not None
            slot.bwd.replay()
            entry.backward_replays += 1
            mb.done = True
            out: list[Any] = [None] * mb.n_inputs
            k = 0
            for i in slot.in_targets:
                g = slot.grads[k]
                k += 1
                if g is not None:
                    out[i] = b.clone(g) if mb.copy_grads[i] else glue.detach(g)
            for p in slot.params:
                g = slot.grads[k]
                k += 1
                if g is None:
                    out.append(None)
                else:  # a fresh tensor where eager's accumulation would keep it, else added in place
                    out.append(b.clone(g) if glue.may_keep_grad(p) else glue.detach(g))
        if env.settings().debug:
            log.debug("graphjit %s [%s]: backward replay micro-batch %d slot %d grad_outputs=%s gradients=%s",
                      self.name, entry.stats.label, mb.number, slot.index,
                      self.fingerprints([g for g in grads if g is not None]),
                      self.fingerprints([g for g in out if g is not None]))
        return out

    def check_order(self, mb: MicroBatch) -> None:
        self.purge()
        if self.queue and self.queue[0] is mb:
            return
        gc.collect()  # a micro-batch dropped without backward may still wait for the collector
        self.purge()
        if self.queue and self.queue[0] is mb:
            return
        if mb not in self.queue:  # pragma: no cover - only a bug in graphjit gets here
            raise GraphjitError(f"{self.name}: micro-batch {mb.number} is not waiting for a backward")
        head = self.queue[0]
        raise BackwardOrderError(
            f"{self.name}: backward of micro-batch {mb.number} ran before the backward of micro-batch {head.number}, "
            f"which was forwarded earlier and still waits for its backward. graphed_layer runs backwards in forward "
            f"order (first in, first out), as 1F1B and interleaved pipeline schedules do: run the backward of "
            f"micro-batch {head.number} first (micro-batches are numbered by forward call of this layer, from 1), or "
            "drop its outputs if it will never get one. Calling one graphed layer twice in one forward and then one "
            "backward reverses the order: wrap the layer once per use instead.")

    def purge(self) -> None:
        """Drop finished or abandoned micro-batches from the head of the queue."""
        q = self.queue
        while q and (q[0].done or q[0].abandoned):
            q.popleft()
        if any(m.abandoned for m in q):
            self.queue = collections.deque(m for m in q if not m.abandoned)

    # -- housekeeping ----------------------------------------------------------------------
    def in_flight(self) -> int:
        self.purge()
        return len(self.queue)

    def reset(self) -> None:
        with self.lock:
            waiting = self.in_flight()
            if waiting:
                gc.collect()
                waiting = self.in_flight()
            if waiting:
                raise GraphjitError(f"{self.name}: reset() while {waiting} micro-batch(es) wait for their backward; "
                                    "run their backwards (or drop their outputs) first")
            for entry in self.entries.values():
                for s in entry.slots:
                    s.release()
            self.entries.clear()
            self.stats.keys.clear()
            self.said.clear()

    def stats_dict(self) -> dict[str, Any]:
        with self.lock:
            d = self.stats.as_dict()
            extra = {id(e.stats): e for e in self.entries.values()}
            by_label = list(self.stats.keys.values())
            for kd, ks in zip(d["keys"], by_label):
                e = extra.get(id(ks))
                kd["slots"] = len(e.slots) if e is not None else 0
                kd["backward_replays"] = e.backward_replays if e is not None else 0
            d["layer"] = self.name
            d["warmup"] = self.warmup
            d["max_in_flight"] = self.max_in_flight
            d["outputs"] = self.outputs
            d["micro_batches"] = self.micro_batches
            d["backward_replays"] = sum(e.backward_replays for e in self.entries.values())
            d["in_flight"] = self.in_flight()
            d["pool_bytes"] = sum(k.pool_bytes for k in self.stats.keys.values())
            d["simulated"] = self.simulate
            return d

    def report(self) -> str:
        d = self.stats_dict()
        lines = [self.stats.report(),
                 f"  micro-batches graphed {d['micro_batches']}, backward replays {d['backward_replays']}, "
                 f"in flight {d['in_flight']}"]
        return "\n".join(lines)

    # -- helpers ---------------------------------------------------------------------------
    def label(self, sig: CallSignature) -> str:
        b = self.backend
        parts = []
        for path, t in zip(sig.paths, sig.tensors):
            name = path.replace("argument ", "").strip("'")
            parts.append(f"{name}{list(b.shape(t))}" + ("*" if b.requires_grad(t) else ""))
        if sig.tensors:
            meta = b.meta_key(sig.tensors[0])
            dtype = str(meta[1]).replace("paddle.", "").replace("torch.", "")
            parts.append(f"{dtype}@{b.device_str(sig.tensors[0])}")
        mode = self.glue.mode_key()
        if mode and mode[0] is False:
            parts.append("eval")
        return " ".join(parts) if parts else "()"

    def check_outputs(self, out: Any) -> None:
        """Raise :class:`UnsupportedOutputError` unless ``out`` is tensors in tuples, lists and dicts."""
        is_tensor = self.is_tensor
        bad = _unsupported_leaf(out, is_tensor)
        if bad is not None:
            path, tp = bad
            raise UnsupportedOutputError(
                f"{self.name}: the layer returned a {tp.__module__}.{tp.__qualname__} at output{path}; graphed_layer "
                f"supports {self.backend.name} tensors in (nested) tuples, lists and dicts, plus constants (None, "
                "numbers, strings). Return the tensors (e.g. as a tuple or a dict) and build the object outside")
        if not collect_tensors(out, is_tensor):
            raise UnsupportedOutputError(f"{self.name}: the layer returned no {self.backend.name} tensor")

    def fingerprints(self, tensors: list[Any]) -> str:
        b = self.backend
        out = []
        for t in tensors:
            try:
                out.append(b.fingerprint(t))
            except Exception:  # a debugging aid only
                out.append("?")
        return ",".join(out)


class GraphedLayerMixin:
    """The methods both frameworks' wrappers share (``GraphedModule`` for torch, ``GraphedPaddleLayer``
    for Paddle); it comes first in their bases, before ``torch.nn.Module`` / ``paddle.nn.Layer``.

    The wrapper keeps the wrapped layer as ``self.layer`` (a submodule: parameters, buffers and the
    train/eval mode are the layer's) and the :class:`GraphedLayerCore` outside the framework's
    attribute machinery (``object.__setattr__``), so it is neither a submodule nor state-dict entry.
    """

    layer: Any
    _graphjit_core: GraphedLayerCore

    def _attach_core(self, glue: Glue, options: dict[str, Any]) -> None:
        core = GraphedLayerCore(glue, _layer_name(type(glue.layer).__name__), **options)
        object.__setattr__(self, "_graphjit_core", core)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._graphjit_core.call(args, kwargs)

    def stats(self) -> dict[str, Any]:
        """Counters per input signature (warmups, captures = slots recorded, replays, backward replays,
        fallbacks and their reasons, capture ms, pool bytes) and the layer's micro-batch counts."""
        return self._graphjit_core.stats_dict()

    def report(self) -> str:
        return self._graphjit_core.report()

    def reset(self) -> None:
        """Stop using every graph (after replacing parameter tensors); refused while micro-batches wait.
        torch frees the graphs' memory once no output refers to it; Paddle keeps its graphs allocated
        until the process ends (see ``PaddleGraph``)."""
        self._graphjit_core.reset()

    def _apply(self, *args: Any, **kwargs: Any) -> Any:
        # torch's .to(), .cuda(), .half(), ... and Paddle's .to(), .float(), .bfloat16() move or replace the
        # parameters the graphs captured by address: every graph is dropped (the framework's _apply runs
        # first).  Paddle's astype() does not come through here: GraphedPaddleLayer overrides it.
        out = super()._apply(*args, **kwargs)  # type: ignore[misc]
        core = self.__dict__.get("_graphjit_core")
        if core is not None:
            core.reset()
        return out

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        """A copy of the wrapped layer, graphed anew with the same options (graphs are not copied)."""
        new = type(self)(copy.deepcopy(self.layer, memo), dict(self._graphjit_core.options))  # type: ignore[call-arg]
        memo[id(self)] = new
        return new

    def extra_repr(self) -> str:
        c = self._graphjit_core
        return f"warmup={c.warmup}, max_in_flight={c.max_in_flight}, outputs={c.outputs!r}"


_NAMES_GIVEN: collections.Counter[str] = collections.Counter()
_NAMES_LOCK = threading.Lock()


def _layer_name(cls_name: str) -> str:
    """``graphed_layer(Block)`` for the first graphed layer of a class, ``graphed_layer(Block#2)`` for the
    second, ...: reports and logs of two layers of one class are told apart."""
    with _NAMES_LOCK:
        _NAMES_GIVEN[cls_name] += 1
        n = _NAMES_GIVEN[cls_name]
    return f"graphed_layer({cls_name})" if n == 1 else f"graphed_layer({cls_name}#{n})"


def _unsupported_leaf(x: Any, is_tensor: Callable[[Any], bool], path: str = "") -> tuple[str, type] | None:
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
        bad = _unsupported_leaf(child, is_tensor, child_path)
        if bad is not None:
            return bad
    return None


def _is_tensor_of(b: Backend) -> Callable[[Any], bool]:
    types = b.tensor_types()
    return lambda x: isinstance(x, types)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return next((line for line in text if line.strip()), type(exc).__name__)


# -- the public entry point ------------------------------------------------------------------------
def _validate(warmup: Any, max_in_flight: Any, outputs: Any, verify: Any, strict: Any, max_graphs: Any) -> None:
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 1:
        raise ConfigError(f"warmup={warmup!r}: expected an integer >= 1 (eager steps before the graphs are recorded: "
                          "lazy initialisation must not end up in a capture)")
    if isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int) or max_in_flight < 1:
        raise ConfigError(f"max_in_flight={max_in_flight!r}: expected an integer >= 1 (micro-batches of one input "
                          "signature that may wait for their backward at once)")
    if not isinstance(outputs, str) or outputs not in OUTPUTS:
        raise ConfigError(f"outputs={outputs!r}: expected one of {', '.join(repr(o) for o in OUTPUTS)}")
    for name, value in (("verify", verify), ("strict", strict)):
        if value is not None and not isinstance(value, bool):
            raise ConfigError(f"{name}={value!r}: expected True, False or None (None: from GRAPHJIT_{name.upper()})")
    if max_graphs is not None and (isinstance(max_graphs, bool) or not isinstance(max_graphs, int) or max_graphs < 1):
        raise ConfigError(f"max_graphs={max_graphs!r}: expected an integer >= 1 or None")


def _framework_of(layer: Any) -> str | None:
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and isinstance(layer, torch.nn.Module):
        return "torch"
    paddle = sys.modules.get("paddle")
    if paddle is not None and isinstance(layer, paddle.nn.Layer):
        return "paddle"
    return None


def graphed_layer(layer: Any, warmup: int = DEFAULT_WARMUP, *, max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
                  outputs: str = "copy", verify: bool | None = None, strict: bool | None = None,
                  max_graphs: int | None = None, _simulate: bool = False) -> Any:
    """Wrap ``layer`` (a ``torch.nn.Module`` or a ``paddle.nn.Layer``) for training with CUDA graphs.

    Returns a module/layer of the same framework that calls like ``layer`` (its parameters, state
    dict under the prefix ``layer.``, and ``train()``/``eval()`` are the wrapped layer's), plus
    ``stats()``, ``report()`` and ``reset()``.  The first ``warmup`` calls of each input signature run
    eagerly; then a forward graph and a backward graph are recorded and replayed (see the module
    docstring for the states, the FIFO rule for micro-batches, gradient semantics and the memory
    cost).  ``max_in_flight``: graph pairs per input signature, i.e. micro-batches that may wait for
    their backward at once.  ``outputs``: "copy" (fresh tensors) or "alias" (static buffers, valid
    until that slot's next forward).  ``verify``/``strict``/``max_graphs``: as for ``@graphed``
    (defaults from ``GRAPHJIT_VERIFY``/``GRAPHJIT_STRICT``/``GRAPHJIT_MAX_GRAPHS``).

    ``_simulate=True`` is for tests on machines without CUDA: the graphed path runs with every
    static buffer, slot and copy, but a "replay" re-runs the layer instead of a CUDA graph.
    """
    _validate(warmup, max_in_flight, outputs, verify, strict, max_graphs)
    if getattr(layer, "_graphjit_core", None) is not None:
        raise ConfigError(f"{type(layer).__name__} is already a graphed layer")
    framework = _framework_of(layer)
    if framework is None:
        tp = type(layer)
        raise ConfigError(f"graphed_layer() needs a torch.nn.Module or a paddle.nn.Layer, got "
                          f"{tp.__module__}.{tp.__qualname__} (for a plain function use @graphjit.graphed)")
    backends.get(framework)  # the backend instance (raises BackendError if it cannot be built)
    options = {"warmup": warmup, "max_in_flight": max_in_flight, "outputs": outputs, "verify": verify,
               "strict": strict, "max_graphs": max_graphs, "simulate": bool(_simulate)}
    if framework == "torch":
        from .backends.torch.training import GraphedModule

        return GraphedModule(layer, options)
    from .backends.paddle.training import GraphedPaddleLayer

    return GraphedPaddleLayer(layer, options)


__all__ = ["BackwardOrderError", "Glue", "GraphedLayerCore", "graphed_layer"]
