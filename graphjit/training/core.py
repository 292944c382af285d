"""The state machine of one graphed layer (framework-neutral): per input signature, warmup calls, the
recording of a slot (:mod:`graphjit.training.record`), forward and backward replays through the framework's
autograd function, the FIFO order of micro-batches, stats.  See :mod:`graphjit.training` for the states."""

from __future__ import annotations

import collections
import gc
import logging
import threading
from collections.abc import Sequence
from typing import Any

from .. import env
from .. import scope as scope_mod
from ..errors import BackwardOrderError, CaptureError, GraphjitError, UnsupportedOutputError
from ..guards import WRITES
from ..keys import CallSignature, Signer, rebuild
from ..policy import Policy
from ..stats import FunctionStats, KeyStats, State
from ..tree import collect_tensors
from . import values as layer_values
from . import watch
from .glue import Glue
from .record import SlotRecorder
from .slots import (
    DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_WARMUP,
    LayerKey,
    MicroBatch,
    is_tensor_of,
    recording,
    unsupported_leaf,
)
from .values import changed_key

log = logging.getLogger("graphjit")


# -- the state machine -----------------------------------------------------------------------------
class GraphedLayerCore(Policy, SlotRecorder):
    """Framework-neutral state of one graphed layer: keys, slots, the FIFO queue, stats."""

    def __init__(self, glue: Glue, name: str, warmup: int = DEFAULT_WARMUP, max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
                 outputs: str = "copy", verify: bool | None = None, strict: bool | None = None,
                 max_graphs: int | None = None, simulate: bool = False) -> None:
        Policy.__init__(self, name, strict, verify, max_graphs)
        self.glue = glue
        self.backend = glue.backend
        self.warmup = warmup
        self.max_in_flight = max_in_flight
        self.outputs = outputs
        self.simulate = simulate
        self.options = {"warmup": warmup, "max_in_flight": max_in_flight, "outputs": outputs, "verify": verify,
                        "strict": strict, "max_graphs": max_graphs, "simulate": simulate}
        self.signer = Signer(getattr(glue.layer, "forward", glue.layer), None, self.backend.name, name)
        self.stats = FunctionStats(name)
        self.entries: dict[tuple[Any, ...], LayerKey] = {}
        self.queue: collections.deque[MicroBatch] = collections.deque()
        self.lock = threading.RLock()
        self.is_tensor = is_tensor_of(self.backend)
        self.micro_batches = 0  # graphed forwards
        self.forwards = 0  # every non-disabled call: numbers the micro-batches

    # -- the call --------------------------------------------------------------------------
    def call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        settings = env.settings()
        if settings.disable:
            self.stats.disabled_calls += 1
            return self.glue.call_layer(args, kwargs)
        self.stats.calls += 1
        self.forwards += 1
        outside = self.eager_context()
        if outside is not None:
            self.stats.fallback(outside)
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
        base, hops = entry, 0
        while entry.guard is not None and not entry.guard.holds():  # a value its forward reads changed since
            found = changed_key(key, entry.guard, hops, base.variants)
            if isinstance(found, str):
                return self.eager_checked(args, kwargs, found, entry)
            key, shown = found
            hops += 1
            with self.lock:
                other = self.entries.get(key)
                if other is None:  # (a change within a key's warmup of the last one: the values drift)
                    quick = self.forwards - base.variant_at <= self.warmup + 1
                    base.variants, base.variant_at = (base.variants + 1 if quick else 1), self.forwards
                    other = self.new_entry(key, sig, shown)
                    if other is None:  # max_graphs reached: counted, runs eagerly
                        return self.eager_checked(args, kwargs, "max_graphs reached", None)
            entry = other
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

    def eager_context(self) -> str | None:
        """Why this call must run the layer eagerly whatever its key, from what surrounds the call (None: nothing
        does).  Refused, each with its own reason: a call inside another graph's recording (a graphed layer within a
        graphed layer, or within a ``@graphed`` capture: the outer graph records this layer's kernels); a call that
        re-enters this layer while its own graphs are being recorded; and whatever the framework's glue refuses
        (:meth:`Glue.eager_reason`: torch's non-reentrant activation checkpointing)."""
        owner = recording()
        if owner == self.name:
            return ("called again while its own graphs are being recorded (the layer calls itself, or something "
                    "its backward runs calls it)")
        if owner is not None:
            return f"inside another capture (the recording of {owner})"
        if scope_mod.phase() == "capture":
            return "inside another capture (a @graphed function's capture)"
        return self.glue.eager_reason()

    def new_entry(self, key: tuple[Any, ...], sig: CallSignature, values: str = "") -> LayerKey | None:
        """A new key (``values``: what its forward reads differently from the key of the same arguments, for its
        label); None where ``max_graphs`` is reached."""
        b = self.backend
        label = self.label(sig) + (f" [{values}]" if values else "")
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
        if reason is None and self.over_key_limit(sum(1 for e in self.entries.values() if e.reason is None),
                                                  "input signatures", "raise max_graphs or GRAPHJIT_MAX_GRAPHS"):
            return None
        st = KeyStats(label=label)
        entry = LayerKey(st, devices[0])
        if reason is not None:
            st.state, st.reason, entry.reason = state, reason, reason
        self.stats.keys[key] = st
        self.entries[key] = entry
        if env.settings().debug:
            log.debug("graphjit %s [%s]: new key on %s%s", self.name, label, devices[0],
                      f" (eager: {reason})" if reason else f", {self.warmup} warmup call(s) first")
        return entry

    def eager_checked(self, args: tuple[Any, ...], kwargs: dict[str, Any], reason: str,
                      entry: LayerKey | None) -> Any:
        self.stats.fallback(reason)
        if entry is not None:
            entry.stats.uncaptured += 1
        return self.glue.call_layer(args, kwargs)

    def warmup_call(self, entry: LayerKey, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """One eager call of a key before its recording, watched (:mod:`graphjit.training.watch`): a key whose call
        stores tensors in an object it receives, or writes a tensor argument in place, runs eagerly from then on; so
        does one whose last warmup call writes a Python value its forward reads (:func:`.values.python_writes`), or
        reads the clock, advances an iterator or prints (:func:`.watch.host_reads`)."""
        st = entry.stats
        roots = watch.named_arguments(getattr(self.glue.layer, "forward", self.glue.layer), args, kwargs)
        python: str | None = None
        host: watch.ArgumentWrites | None = None

        def last() -> Any:
            nonlocal python
            out, python = layer_values.python_writes(self.backend, self.glue.layer, args, kwargs,
                                                     lambda: self.glue.call_layer(args, kwargs))
            return out

        def run() -> Any:
            nonlocal host
            if st.warmups < self.warmup - 1:  # (warmup_call runs only while st.warmups < self.warmup)
                return self.glue.call_layer(args, kwargs)
            # the last warmup call (the only one where warmup=1): a Python value it writes is written every call, and
            # what it reads from the host (the clock, an iterator's item, a print) is read every call
            out, host = watch.host_reads(self.backend, self.glue.layer, roots, last, st.warmups == 0)
            return out

        first = st.warmups == 0 and self.warmup > 1  # (a later warmup call sees a draw every call makes)
        out, writes = watch.watched_call(self.backend, run, roots, env.settings().verify_max_bytes, first,
                                         entry.device)
        if not entry.checked:
            entry.checked = True
            self.check_outputs(out)
        if writes is None:
            writes = host
        if writes is None and python is not None:
            writes = watch.ArgumentWrites(
                WRITES, f"the layer's call writes a Python value its forward reads: {python}; graphed_layer records "
                "its graphs with extra eager passes, which would write it again, and a replay runs no Python, so it "
                "would not: calls of this input signature run the layer eagerly (keep such state outside the layer, "
                "or in a tensor updated in place)")
        if writes is not None:
            st.state, st.reason, st.detail, entry.reason = State.FALLBACK, writes.reason, writes.message, writes.reason
            st.uncaptured += 1
            self.stats.fallback(writes.reason)
            if self.strict():
                raise CaptureError(f"{self.name} [{st.label}]: {writes.message}", reason=writes.reason)
            self.say_once(logging.WARNING, "writes:" + writes.reason, "graphjit %s [%s]: %s", self.name, st.label,
                          writes.message)
            return out
        st.warmups += 1
        st.state = State.WARMUP
        if env.settings().debug:
            log.debug("graphjit %s [%s]: warmup %d/%d (eager) outputs=%s", self.name, st.label, st.warmups,
                      self.warmup, self.fingerprints(collect_tensors(out, self.is_tensor)))
        return out

    def too_many_in_flight(self, entry: LayerKey, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        msg = (f"more than max_in_flight={self.max_in_flight} micro-batches of one input signature are waiting "
               "for their backward; the extra ones run eagerly (raise max_in_flight, at the cost of one more "
               "graph pair and its activation memory each)")
        if self.strict():
            raise CaptureError(f"{self.name} [{entry.stats.label}]: {msg}", reason="too many micro-batches in flight")
        self.say_once(logging.WARNING, "inflight", "graphjit %s [%s]: %s", self.name, entry.stats.label, msg)
        return self.eager_checked(args, kwargs, "too many micro-batches in flight", entry)

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

    def forward_step(self, ctx: Any, mb: MicroBatch, tensors: Sequence[Any]) -> tuple[Any, ...]:
        """The body of the framework's autograd function's forward (torch ``autograd.Function``, Paddle
        ``PyLayer``): replay, keep ``(self, mb)`` on ``ctx`` for backward, mark the non-differentiable outputs."""
        outs, nondiff = self.forward_replay(mb, tensors[: mb.n_inputs])
        ctx.graphjit = (self, mb)
        mb.watch(ctx)
        if nondiff:
            ctx.mark_non_differentiable(*nondiff)
        return tuple(outs)

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
        bad = unsupported_leaf(out, is_tensor)
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
