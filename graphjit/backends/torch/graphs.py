"""PyTorch backend: torch.cuda.CUDAGraph capture on a side stream, tracers ``eager`` and ``compile``.

Capture follows the rules ``torch/cuda/graphs.py`` documents: warmup on a side stream, capture with
``capture_error_mode="thread_local"`` into a pool shared by the graphs of one function (or scope),
replay on the current stream.  ``tracer="compile"`` wraps the function with ``torch.compile`` with
Inductor's own CUDA graphs switched off, so that graphjit owns the one graph.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import threading
import warnings
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from ... import host_random, layouts
from ...errors import BackendError, CaptureError
from ...feeds import StepContext
from ..base import CAPTURE_LOCK, Backend, GraphHandle, LaneParts, Segments, collector_paused, segments_open
from . import contents as contents_mod
from . import device as cuda_device
from . import dynamo, hooks, rebinds, tensor_checks, versions, workspaces
from . import feed as feed_mod
from . import modes as torch_modes
from .breaks import dynamo_off, shield
from .modes import autocast_cache_off
from .recovery import recover
from .syncs import SyncWatcher

log = logging.getLogger("graphjit")

_SYNC_HINT = (
    "the function synchronises the CPU with the GPU (for example .item(), .cpu(), .tolist(), "
    "print(tensor), torch.nonzero, or Python control flow on a tensor value); a CUDA graph cannot "
    "contain that. Move the sync out of the graphed function or make the value a tensor."
)


_LIVENESS_ONLY = frozenset(("_tracker", "check_alive", "pool", "super", "replay"))


def _thin_wrapper(fn: Any) -> bool:
    """True where ``CUDAGraph.replay`` does nothing in Python but torch's input-liveness check before its C++ replay
    (torch 2.11-2.13); False for anything more (a replay that instantiates a ``keep_graph`` graph first, hooks)."""
    code = getattr(fn, "__code__", None)
    return code is not None and set(code.co_names) <= _LIVENESS_ONLY


class TorchGraph(GraphHandle):
    """One captured ``CUDAGraph``; ``feed``: its feed nodes (:mod:`.feed`), which every replay by torch first
    sets to copy nothing."""

    def __init__(self, graph: Any, pool_bytes: int) -> None:
        self._graph = graph
        self.pool_bytes = pool_bytes
        self.feed = None  # set by feed.attach, with the replay that clears the feed first
        replay = graph.replay
        raw = getattr(torch._C, "_CUDAGraph", None)
        if raw is not None and isinstance(graph, raw) and getattr(graph, "_tracker", None) is None \
                and _thin_wrapper(getattr(type(graph), "replay", None)):
            # torch's C++ replay itself: its Python wrapper only checks input liveness, which graphjit never turns
            # on (capture_begin's check_input_liveness); one Python frame less per launch, boundaries included
            replay = raw.replay.__get__(graph)
        self.replay = replay  # type: ignore[method-assign]  # one call less on the hot path

    def replay(self) -> None:
        self._graph.replay()

    def reset(self) -> None:
        feed, self.feed = self.feed, None
        if feed is not None:  # its table names the executable reset() frees: the library refuses it from now on
            feed.retire()
            self.replay = self._graph.replay  # type: ignore[method-assign]  # torch's own error on a reset graph
        self._graph.reset()

    def dump(self, path: Path) -> None:
        self._graph.debug_dump(str(path))


class _TorchSegments(Segments):
    """The capture in progress: one ``CUDAGraph`` per segment, all on the capture stream (the current
    stream while they are captured) and into one pool (a handle: the function's, or one made for it).

    ``open`` is True from the moment a segment's ``capture_begin`` returned until its ``capture_end``
    returned: what :func:`.recovery.recover` must clean up after a failure."""

    def __init__(self, pool: Any, debug: bool, reserved_before: int, index: int, feed_lib: Any = None) -> None:
        self.pool = pool
        self.debug = debug
        self.reserved = reserved_before
        self.index = index
        self.graph: Any = None
        self.open = False
        self.feed_lib = feed_lib  # feed nodes wanted (graphjit.handoff): the library that adds them
        self.in_node = 0

    def begin(self) -> None:
        graph = _new_graph(keep=self.debug or self.feed_lib is not None)
        if self.debug:
            graph.enable_debug_mode()
        self.graph = graph
        graph.capture_begin(pool=self.pool, capture_error_mode="thread_local")
        self.open = True
        if self.feed_lib is not None:
            self.in_node = feed_mod.add_node(self.feed_lib, self.index)
            if not self.in_node:
                self.feed_lib = None

    def end(self) -> GraphHandle:
        """The last cut: the feed's out node added first where the capture has its in node (no island cut it),
        and the feed attached to the graph (:mod:`.feed`)."""
        out_node = feed_mod.add_node(self.feed_lib, self.index) if self.feed_lib is not None else 0
        graph = self.graph
        done = self.cut()
        if out_node:
            feed_mod.attach(done, graph, self.feed_lib, self.in_node, out_node, self.index)
        return done

    def cut(self) -> GraphHandle:
        self.graph.capture_end()
        self.open = False
        now = cuda_device.reserved(self.index)
        done = TorchGraph(self.graph, max(0, now - self.reserved))
        self.reserved = now
        return done

    def resume(self) -> None:
        self.feed_lib = None  # an island cut the capture: its segments replay without feeds
        self.begin()


class TorchPool:
    """A memory-pool handle several graphs share, and the empty *anchor* graph that keeps the pool alive.

    torch frees a private pool once every graph captured into it was reset, and a later capture into
    that handle then fails an allocator assertion (and leaves torch's RNG state believing a capture is
    under way).  The anchor, captured into the pool and never reset while this object lives, makes any
    reset-and-recapture through this object safe.  Whoever captures into the pool holds this object: a
    graphed function and a capture scope for their lifetime; a graphed layer only while it records a
    slot (forward and backward graph), since nothing captures into a slot's pool afterwards.  Once it
    is dropped and the pool's graphs are reset, the pool's memory goes back to torch's allocator
    (``torch.cuda.empty_cache()`` returns it to the device).
    """

    __slots__ = ("anchor", "handle")

    def __init__(self, handle: Any, anchor: Any) -> None:
        self.handle = handle
        self.anchor = anchor


class TorchBackend(Backend):
    name = "torch"
    tracers = ("eager", "compile")
    default_tracer = "eager"
    host_watched_tracers = ("compile",)  # Dynamo runs a graph break's code as Python

    def __init__(self) -> None:
        shield()
        self.counts_rebinds = rebinds.count_rebinds()
        self._streams: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._unavailable: dict[str, str | None] = {}
        # The reads of every tensor on the replay path, as C callables (no Python frame per tensor): the
        # same values as the methods below, which document them.
        self.data_ptr = torch.Tensor.data_ptr  # type: ignore[method-assign,assignment]
        self.strides = torch.Tensor.stride  # type: ignore[method-assign,assignment]

    # -- tensors ---------------------------------------------------------------------------
    def tensor_types(self) -> tuple[type, ...]:
        return (torch.Tensor,)

    def traced_call_guard(self) -> contextlib.AbstractContextManager[Any]:
        """Dynamo's frame hook off around the graphed function's own runs (:func:`.breaks.dynamo_off`)."""
        return dynamo_off()

    def meta_key(self, t: Any) -> tuple[Any, ...]:
        """Shape, dtype, device, requires_grad and the layout class (:mod:`graphjit.layouts`: None where contiguous)."""
        return (t.shape, t.dtype, t.device, t.requires_grad, tensor_checks.layout(t))

    def meta_check(self, tensors: Sequence[Any]) -> Callable[..., bool] | None:
        """:func:`.tensor_checks.meta_check`: Dynamo's ``TensorGuards`` with each tensor's layout class."""
        return tensor_checks.meta_check(tensors)

    def mode_probes(self, modes: tuple[Any, ...]) -> tuple[tuple[Callable[[], Any], ...], tuple[Any, ...]]:
        """torch's C functions (:func:`.modes.probes`) where ``modes`` were read outside autocast and torch function
        modes; else :meth:`modes` itself."""
        probes = torch_modes.probes(modes)
        return probes if probes is not None else super().mode_probes(modes)

    def lane_parts(self, modes: tuple[Any, ...], tensors: Sequence[Any],
                   strides: Sequence[Sequence[int]]) -> LaneParts | None:
        """The modes' probes (:meth:`mode_probes`: torch's C functions, or :meth:`modes` itself for modes read inside
        an autocast block or a ``torch.device`` context), ``TensorGuards`` with ``strides`` fixed too, and
        ``Tensor.data_ptr``; None on a torch without ``TensorGuards``."""
        probes = self.mode_probes(modes)
        check = tensor_checks.fixed_check(tensors, strides)
        if check is None:
            return None
        return LaneParts(probes[0], probes[1], check, torch.Tensor.data_ptr)

    def shape(self, t: Any) -> tuple[int, ...]:
        return tuple(t.shape)

    def data_ptr(self, t: Any) -> int:
        return int(t.data_ptr())

    def strides(self, t: Any) -> tuple[int, ...]:
        return tuple(t.stride())

    def device_str(self, t: Any) -> str:
        d = t.device
        return "cpu" if d.type == "cpu" else f"{d.type}:{d.index if d.index is not None else 0}"

    def requires_grad(self, t: Any) -> bool:
        return bool(t.requires_grad)

    def is_floating(self, t: Any) -> bool:
        return bool(t.is_floating_point() or t.is_complex())

    def unstrided(self, t: Any) -> str | None:
        return None if t.layout is torch.strided else f"a tensor of layout {t.layout}"

    def nbytes(self, t: Any) -> int:
        return int(t.numel() * t.element_size())

    def empty(self, shape: Sequence[int], like: Any) -> Any:
        return torch.empty(tuple(shape), dtype=like.dtype, device=like.device)

    def empty_as(self, shape: Sequence[int], like: Any) -> Any:
        layout = tensor_checks.layout(like)
        if layout is None or layout[0] != "dense":
            return self.empty(shape, like)
        return torch.empty_strided(tuple(shape), layouts.dense_strides(shape, layout), dtype=like.dtype,
                                   device=like.device)

    def zero_(self, t: Any) -> None:
        with torch.no_grad():
            t.zero_()

    def clone(self, t: Any) -> Any:
        """A copy that needs no grad: contiguous (the strides of size-1 dims made so too) where ``t`` is, else dense
        in ``t``'s order of dims, as eager's results of a transposed or channels-last tensor are."""
        if t.requires_grad:
            t = t.detach()
        return t.clone(memory_format=torch.contiguous_format if t.is_contiguous() else torch.preserve_format)

    def view_offset(self, view: Any, base: Any) -> int | None:
        if view.dtype != base.dtype or view.device != base.device:
            return None
        try:
            if view.untyped_storage().data_ptr() != base.untyped_storage().data_ptr():
                return None
            return int(view.storage_offset() - base.storage_offset())
        except (RuntimeError, NotImplementedError):  # a tensor without a storage of its own (sparse, nested)
            return None

    def view_of(self, base: Any, like: Any, offset: int) -> Any:
        return base.as_strided(like.shape, like.stride(), base.storage_offset() + offset)

    def copy_(self, dst: Any, src: Any) -> None:
        with torch.no_grad():
            dst.copy_(src)

    def batch_operands(self) -> Any:
        from .copies import OPERANDS  # imported where a capture plans its copies, not with the backend
        return OPERANDS

    def copy_many(self, dsts: Sequence[Any], srcs: Sequence[Any], grad_free: bool = False) -> None:
        if grad_free:  # no source requires grad: no autograd to keep out (the guard costs ~1 us)
            if len(dsts) == 1:
                dsts[0].copy_(srcs[0])
            else:
                torch._foreach_copy_(list(dsts), list(srcs))
            return
        with torch.no_grad():
            if len(dsts) == 1:
                dsts[0].copy_(srcs[0])
            else:
                torch._foreach_copy_(list(dsts), list(srcs))

    def narrow(self, t: Any, dim: int, start: int, length: int) -> Any:
        return t.narrow(dim, start, length)

    def poison_(self, t: Any) -> None:
        with torch.no_grad():
            if t.is_floating_point() or t.is_complex():
                t.fill_(float("nan"))
            elif t.dtype != torch.bool:
                t.fill_(torch.iinfo(t.dtype).min)

    def equal(self, a: Any, b: Any) -> bool:
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        if a.is_floating_point() or a.is_complex():
            return bool(torch.equal(torch.nan_to_num(a.detach(), nan=0.0), torch.nan_to_num(b.detach(), nan=0.0))
                        and torch.equal(torch.isnan(a), torch.isnan(b)))
        return bool(torch.equal(a, b))

    def contents(self, tensors: Sequence[Any]) -> Any:
        return contents_mod.contents(self, tensors)

    def changed(self, tensors: Sequence[Any], copy: Any, known: Collection[int] = ()) -> list[int]:
        return contents_mod.changed(self, tensors, copy, known)

    def rel_error(self, a: Any, b: Any) -> float:
        if a.shape != b.shape:
            return float("inf")
        try:
            if a.dtype == b.dtype and torch.equal(a, b):  # the usual verify: one kernel instead of ten
                return 0.0
        except (NotImplementedError, RuntimeError):  # a dtype torch.equal does not take (complex32 on the CPU)
            pass
        if not (a.is_floating_point() or a.is_complex()):
            return float("inf")
        a64, b64 = _float64(a), _float64(b)
        if not torch.equal(torch.isnan(a64), torch.isnan(b64)):
            return float("inf")
        a64, b64 = torch.nan_to_num(a64, nan=0.0), torch.nan_to_num(b64, nan=0.0)
        denom = float(torch.linalg.vector_norm(b64))
        err = float(torch.linalg.vector_norm(a64 - b64))
        if denom == 0.0:
            return 0.0 if err == 0.0 else float("inf")
        return err / denom

    def fingerprint(self, t: Any) -> str:
        data = t.detach().contiguous().cpu()
        raw = data.reshape(-1).view(torch.uint8).numpy().tobytes() if data.numel() else b""
        return hashlib.blake2b(raw, digest_size=6).hexdigest()

    # -- state a call may write, modes, random numbers --------------------------------------
    module_holders = ("_modules",)
    tensor_holders = ("_parameters", "_buffers")
    hook_holders = hooks.HOLDERS

    def watch_loads(self, obj: Any) -> bool:
        return rebinds.watch_loads(obj)

    def hook_count(self) -> Callable[[], int] | None:
        return hooks.count()

    def global_hooks(self) -> list[tuple[dict[Any, Any], tuple[Any, ...]]]:
        return hooks.global_dicts()
    versions_complete = True

    def version(self, t: Any) -> int | None:
        if t.is_inference():  # inference tensors keep no version counter
            return None
        return int(t._version)

    def is_parameter(self, t: Any) -> bool:
        return isinstance(t, torch.nn.Parameter)

    versions_settable = versions.SETTABLE
    set_versions = staticmethod(versions.set_versions)
    sole_storage = staticmethod(versions.sole_storage)

    def extent(self, t: Any) -> tuple[int, int]:
        if t.is_contiguous():  # three C calls for the common case
            start = t.data_ptr()
            return start, start + t.nbytes
        return super().extent(t)

    def tensor_state(self, t: Any) -> tuple[tuple[str, Any], ...]:
        """A leaf that requires grad holds its ``.grad``: backward accumulates into it (a write),
        ``zero_grad(set_to_none=True)`` then backward replaces it (a rebinding)."""
        if t.requires_grad and t.is_leaf:
            return (("grad", t.grad),)
        return ()

    def set_tensor_state(self, t: Any, name: str, value: Any) -> None:
        if name == "grad":
            t.grad = value

    def prepare_step(self, roots: list[tuple[str, Any]]) -> StepContext | None:
        from .optimizers import prepare

        return prepare(roots)

    def unversioned_writes(self, roots: list[tuple[str, Any]]) -> frozenset[int]:
        from .optimizers import fused_parameters

        return fused_parameters(roots)

    def version_blind(self, path: tuple[Any, ...]) -> bool:
        """A module buffer (``native_batch_norm`` / ``cudnn_batch_norm`` update the running statistics in place
        without moving their version counters: their schemas do not mark them written), or an optimizer's state
        (on CUDA, torch 2.11's ``_foreach_lerp_`` updates Adam's ``exp_avg`` without moving its counter: seen on
        an H200)."""
        return (len(path) >= 3 and path[-2] == (".", "_buffers")) or (".", "state") in path[1:]

    modes = staticmethod(torch_modes.read)  # every call reads them: no method of its own in between

    def describe_modes(self, modes: tuple[Any, ...]) -> str:
        return torch_modes.describe(modes)

    def rng_state(self, device: str) -> Any:
        if device.startswith("cuda"):
            return torch.cuda.default_generators[_index(device)].get_state()
        return torch.default_generator.get_state()

    def set_rng_state(self, device: str, state: Any) -> None:
        if device.startswith("cuda"):
            torch.cuda.default_generators[_index(device)].set_state(state)
        else:
            torch.default_generator.set_state(state)

    def rng_equal(self, a: Any, b: Any) -> bool:
        return bool(torch.equal(a, b))

    def host_generators(self, device: str) -> tuple[Any, ...]:
        """torch's CPU generator (``torch.rand(3)``, ``torch.randperm(n)`` without a device) for a call on a GPU; none
        for a call on the CPU, whose generator is :meth:`rng_state`'s."""
        return _CPU_GENERATOR if not device.startswith("cpu") else ()

    # -- tracing ---------------------------------------------------------------------------
    def trace(self, fn: Callable[..., Any], tracer: str) -> Callable[..., Any]:
        if tracer == "eager":
            return fn
        if tracer == "compile":
            # Inductor's own CUDA graphs off: graphjit captures the compiled kernels itself.
            return dynamo.for_capture(torch.compile(fn, options={"triton.cudagraphs": False}))
        raise BackendError(f"tracer={tracer!r} is not a torch tracer; expected one of {self.tracers}")

    def tracer_misses_values(self, tracer: str) -> str | None:
        """``tracer="compile"`` on a torch whose Dynamo installs no guard on a number read off a class (pytorch#176851,
        a regression of torch 2.10-2.11: the compiled code keeps the old value after the class attribute changed),
        found once per process by compiling a probe with Dynamo's eager backend."""
        if tracer != "compile":
            return None
        return dynamo.class_attribute_guards_missing()

    def tracer_guard(self, target: Any, tracer: str, f_locals: dict[str, Any]) -> Any:
        """``tracer="compile"``: the guards of the Dynamo cache entry of ``target``'s code that ``f_locals`` (the
        captured call, static buffers and all) selects, checked with those same locals before each replay:
        they hold while every value Dynamo read (globals, attributes, closure cells, config) is unchanged."""
        if tracer != "compile":
            return None
        return dynamo.cache_entry_guard(target, f_locals)

    # -- devices and graphs ----------------------------------------------------------------
    def graphs_unavailable(self, device: str) -> str | None:
        if device in self._unavailable:
            return self._unavailable[device]
        reason: str | None = None
        if not torch.backends.cuda.is_built():
            reason = f"torch {torch.__version__} is a CPU build"
        elif not torch.cuda.is_available():
            reason = "torch sees no CUDA device"
        elif not device.startswith("cuda"):
            reason = f"inputs are on {device}; CUDA graphs need CUDA tensors"
        self._unavailable[device] = reason
        return reason

    def grad_enabled(self) -> bool:
        return bool(torch.is_grad_enabled())

    def new_pool(self, device: str) -> TorchPool:
        """A pool several graphs share, with its anchor graph (see :class:`TorchPool`)."""
        # Under the capture lock: the anchor is a capture on the shared side stream, which must not
        # meet another thread's capture or warmup there.
        with CAPTURE_LOCK, torch.cuda.device(_index(device)):
            handle = torch.cuda.graph_pool_handle()
            anchor = torch.cuda.CUDAGraph()
            stream = self._side_stream(device)
            stream.wait_stream(torch.cuda.current_stream())
            with warnings.catch_warnings():  # torch warns that the (intentionally) empty graph is empty
                warnings.simplefilter("ignore")
                with collector_paused(), torch.cuda.graph(anchor, pool=handle, stream=stream,
                                                          capture_error_mode="thread_local"):
                    pass
            return TorchPool(handle, anchor)

    def device_guard(self, device: str) -> contextlib.AbstractContextManager[Any]:
        if device.startswith("cuda"):
            return torch.cuda.device(_index(device))
        return contextlib.nullcontext()

    def _side_stream(self, device: str) -> Any:
        with self._lock:
            s = self._streams.get(device)
            if s is None:
                s = torch.cuda.Stream(device=_index(device))
                self._streams[device] = s
            return s

    @contextlib.contextmanager
    def warmup_guard(self, device: str) -> Iterator[None]:
        side = self._side_stream(device)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            yield
        torch.cuda.current_stream().wait_stream(side)
        side.synchronize()

    def sync_watch(self, hits: list[str]) -> contextlib.AbstractContextManager[None]:
        """Append ``"<torch's report> at <file>:<line>"`` to ``hits`` for every CPU-GPU sync this thread
        makes in the block (:mod:`.syncs`: only torch's report of a synchronising call counts, other
        threads' syncs do not); the block runs to its end either way."""
        if not torch.cuda.is_available():
            return contextlib.nullcontext()
        return _SYNC_WATCHER.watch(hits)

    def compiles_unwatched(self, pause: Callable[[], None],
                           resume: Callable[[], None]) -> contextlib.AbstractContextManager[None]:
        return dynamo.compiles_unwatched(pause, resume)

    @contextlib.contextmanager
    def island_guard(self) -> Iterator[None]:
        """Inside :meth:`sync_watch`: the block's syncs are allowed (an island may sync)."""
        with super().island_guard(), _SYNC_WATCHER.island():
            yield

    def capture_graph(self, fn: Callable[[], Any], device: str, pool: Any, debug: bool, feed: bool = False,
                      operands: Callable[[], Iterable[Any]] | None = None) -> tuple[GraphHandle, Any]:
        """Capture ``fn()`` on the side stream, as ``torch.cuda.graph`` does (synchronise, free cached
        blocks, ``capture_begin`` with ``capture_error_mode="thread_local"``), in segments where an island
        cuts it (:class:`_TorchSegments`); returns the last segment's graph.  The stream's BLAS workspaces are made
        first (:func:`.workspaces.prime`, with ``operands``).

        On failure the capture is ended and torch's allocator and generator are put back
        (:func:`.recovery.recover`), then :class:`CaptureError` is raised for a failure of the capture
        itself and the function's own exception is re-raised unchanged."""
        stream = self._side_stream(device)
        index = _index(device)
        before = cuda_device.reserved(index)
        handle = pool.handle if isinstance(pool, TorchPool) else pool
        if handle is None:
            handle = torch.cuda.graph_pool_handle()  # known to graphjit, so a failed capture can release it
        workspaces.prime(stream, index, operands)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        feed_lib = feed_mod.library(index) if feed else None
        segments = _TorchSegments(handle, debug, before, index, feed_lib)
        try:
            with autocast_cache_off(), torch.cuda.stream(stream), segments_open(segments):
                segments.begin()
                out = fn()
                last = segments.end()
        except BaseException as exc:
            recover(segments.graph, segments.open, stream, handle, index)
            text = str(exc)
            if isinstance(exc, RuntimeError) and ("capturing" in text or "capture" in text.lower()):
                raise CaptureError(
                    f"capture failed: {text.splitlines()[0] if text else type(exc).__name__}. "
                    f"Usual causes: {_SYNC_HINT}",
                    reason="capture failed: " + (text.splitlines()[0][:120] if text else type(exc).__name__),
                ) from exc
            raise
        torch.cuda.current_stream().wait_stream(stream)
        return last, out

    def synchronize(self, device: str) -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize(_index(device))


_SYNC_WATCHER = SyncWatcher(torch.cuda.get_sync_debug_mode, torch.cuda.set_sync_debug_mode)
_CPU_GENERATOR = (host_random.Generator("torch's CPU generator", torch.default_generator.get_state,
                                        torch.default_generator.set_state, lambda a, b: bool(torch.equal(a, b))),)

def _float64(t: Any) -> Any:
    """``t`` in float64; a complex tensor as its real and imaginary parts (``.double()`` drops the imaginary part)."""
    t = t.detach()
    return torch.view_as_real(t.to(torch.complex128)) if t.is_complex() else t.double()


def _new_graph(keep: bool) -> Any:
    """A CUDAGraph; ``keep``: keep the cudaGraph_t after instantiation so it can be dumped (torch
    >= 2.6 frees it otherwise, and debug_dump then writes nothing)."""
    if keep:
        with contextlib.suppress(TypeError):
            return torch.cuda.CUDAGraph(keep_graph=True)
    return torch.cuda.CUDAGraph()


def _index(device: str) -> int:
    return int(device.split(":", 1)[1]) if ":" in device else 0
