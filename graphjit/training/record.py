"""Recording one slot of a graphed layer: static inputs, the side-stream warmup, the forward graph and,
into the same pool, the backward graph, then verify (the methods :class:`~graphjit.training.core.GraphedLayerCore`
inherits from :class:`SlotRecorder`)."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from .. import env
from .. import scope as scope_mod
from ..backends.base import CAPTURE_LOCK, GraphHandle
from ..errors import CaptureError, UnrecoverableCaptureError, VerifyError
from ..keys import CallSignature, rebuild, rebuild_call
from ..names import NameRecorder
from ..stats import State
from ..tree import collect_tensors
from ..writes import tolerance
from .slots import SIDE_WARMUPS, LayerKey, Slot, first_line, record_guard, simulated_capture
from .values import layer_guard

if TYPE_CHECKING:
    from ..backends.base import Backend
    from ..stats import FunctionStats
    from .glue import Glue

log = logging.getLogger("graphjit")


class SlotRecorder:
    """Records the graph pairs of a slot (a mixin of :class:`~graphjit.training.core.GraphedLayerCore`, which
    provides the attributes and policy methods declared here)."""

    name: str
    backend: Backend
    glue: Glue
    stats: FunctionStats
    simulate: bool
    is_tensor: Callable[[Any], bool]

    def strict(self) -> bool:  # Policy's
        raise NotImplementedError

    def verify(self) -> bool:  # Policy's
        raise NotImplementedError

    def say_once(self, level: int, topic: str, msg: str, *args: Any) -> None:  # Policy's
        raise NotImplementedError

    # -- record a slot ---------------------------------------------------------------------
    def record(self, entry: LayerKey, sig: CallSignature, args: tuple[Any, ...],
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
        except BaseException:  # the layer's own exception (or an interrupt): the key is not left "capturing"
            st.state = State.REPLAY if entry.slots else State.WARMUP
            raise
        entry.slots.append(slot)
        st.state = State.REPLAY
        return slot

    def build_slot(self, entry: LayerKey, sig: CallSignature, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Slot:
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
        with CAPTURE_LOCK, b.device_guard(device), record_guard(self.name):
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
            names = NameRecorder() if not entry.slots else None  # the first slot's: which values its code reads
            try:
                expected_out, expected_shape, expected_diff, expected_grads = self.side_warmup(
                    sargs, skwargs, targets, device, snap, st.label, names)
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

            # the layer's inputs and trainable parameters: what its products compute with (the BLAS priming's dtype)
            capture = self.capture_fn(device, dump_dir is not None, lambda: [*static_in, *params])
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
                if names is not None:  # read now: the values the graphs were captured with (the state restored)
                    entry.guard = layer_guard(b, glue.layer, args, kwargs, names)
                    if entry.guard is not None:
                        st.guards = entry.guard.size
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
            raise CaptureError(f"{self.name} [{label}]: the {which} capture failed: {first_line(exc)}",
                               reason="capture failed: " + first_line(exc)[:120]) from exc

    def capture_fn(self, device: str, debug: bool, operands: Callable[[], Iterable[Any]] | None = None
                   ) -> Callable[[Callable[[], Any]], tuple[GraphHandle, Any]]:
        """The slot's capture of a function into its own pool (``operands``: :meth:`Backend.capture`'s)."""
        b = self.backend
        if self.simulate:
            return lambda fn: simulated_capture(b, fn)
        pool = b.new_pool(device)  # one pool per slot: slots replay in any order (pipeline schedules)
        return lambda fn: b.capture(fn, device, pool, debug, operands=operands)

    def side_warmup(self, sargs: tuple[Any, ...], skwargs: dict[str, Any], targets: list[Any], device: str,
                    snap: Any, label: str, names: Any = None) -> tuple[list[Any], Any, list[int], list[Any]]:
        """Eager forward+backward passes on the capture stream; returns what verify compares with.  ``names``: a
        :class:`~graphjit.names.NameRecorder` the first pass's forward runs under (the names its code uses)."""
        b, glue = self.backend, self.glue
        guard = contextlib.nullcontext() if self.simulate else b.warmup_guard(device)
        expected_out: list[Any] = []
        expected_grads: list[Any] = []
        shape: Any = None
        diff: list[int] = []
        with guard, scope_mod.graphed_call("warmup"):
            for k in range(SIDE_WARMUPS):
                glue.restore(snap)  # each pass starts from the state the real call will see
                with names if names is not None and k == 0 else contextlib.nullcontext():
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
