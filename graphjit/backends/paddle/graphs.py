"""PaddlePaddle backend: ``paddle.device.cuda.graphs.CUDAGraph`` capture, tracers sot/ast/eager.

Written against the public API of both generations: 2.6 (``CUDAGraph(place, mode)``, a private
memory pool per graph) and 3.x (``CUDAGraph(place, mode, pool_id)``, shared pools through
``core.CUDAGraph.gen_new_memory_pool_id``).  Comparisons, fingerprints and mutation checks run in
numpy on the host: they are off the hot path, and they stay right on GPUs for which a Paddle build
ships no kernels (paddlepaddle-gpu 2.6.2 on Hopper computes elementwise ops wrong there).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import inspect
import logging
import operator
import os
import threading
import types
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import paddle

from ... import layouts
from ...errors import BackendError, CaptureError, UnrecoverableCaptureError
from ...feeds import StepContext
from ..base import Backend, GraphHandle, Segments, segments_open
from . import hooks, sot, syncs
from . import modes as paddle_modes
from .sot import PACKAGE_DIR, SotFunction

log = logging.getLogger("graphjit")

_TRACE_LOCK = threading.RLock()  # SOT and AST translation are not thread-safe: one traced call at a time

# run_program (the op that executes to_static programs) refuses to run inside a capture unless these
# are set; Paddle raises a clear error for each otherwise.
_CAPTURE_FLAGS = {"FLAGS_new_executor_use_cuda_graph": True, "FLAGS_sync_nccl_allreduce": False}


class PaddleGraph(GraphHandle):
    """A Paddle graph that is never destroyed while the process runs.

    Paddle frees a graph's memory pool when the graph is reset or destroyed, and a tensor of that
    pool (a graph output, an intermediate autograd or run_program kept) freed afterwards crashes
    Paddle's allocator (SIGSEGV or heap corruption; seen with paddlepaddle-gpu 2.6.2, also at
    interpreter exit, when Python frees objects in arbitrary order).  So graphjit takes one extra
    reference to every Paddle graph it captures: :meth:`reset` stops using the graph, and its memory
    stays reserved until the process ends.
    """

    def __init__(self, graph: Any, pool_bytes: int) -> None:
        self._graph = graph
        self.pool_bytes = pool_bytes
        # One reference that is never released (not even at interpreter exit, when module globals
        # are cleared): the graph outlives every tensor of its pool.
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(graph))

    def replay(self) -> None:
        self._graph.replay()

    def reset(self) -> None:
        """Stop using the graph (its memory pool is kept: see the class docstring)."""

    def dump(self, path: Path) -> None:
        # Paddle writes one dot file per graph into a folder.
        self._graph.print_to_dot_files(str(path.with_suffix("")))


class _PaddleSegments(Segments):
    """The capture in progress: one Paddle ``CUDAGraph`` per segment, made by ``make`` (same place, mode and
    pool id for all)."""

    def __init__(self, make: Callable[[], Any], index: int) -> None:
        self.make = make
        self.index = index
        self.graph: Any = None
        self.capturing = False
        self.reserved = _reserved(index)

    def cut(self) -> GraphHandle:
        self.capturing = False
        self.graph.capture_end()
        now = _reserved(self.index)
        done = PaddleGraph(self.graph, max(0, now - self.reserved))
        self.reserved = now
        return done

    def resume(self) -> None:
        self.graph = self.make()
        self.graph.capture_begin()
        self.capturing = True


def _to_numpy(t: Any) -> np.ndarray:
    arr = np.asarray(t.detach().numpy() if hasattr(t, "detach") else t.numpy())
    if t.dtype == paddle.bfloat16:  # numpy has no bfloat16: Paddle hands back the raw uint16 bits
        arr = (arr.astype(np.uint32) << 16).view(np.float32)
    return arr


@functools.lru_cache(maxsize=1)
def _dtypes_are_singletons() -> bool:
    """True if a tensor's ``dtype`` is one object per dtype (Paddle 3.x), so ``is`` compares it; 2.6 makes new ones."""
    try:
        a, b = (paddle.to_tensor([0.0], place=paddle.CPUPlace()) for _ in range(2))  # host memory: capture-safe
        return bool(a.dtype is b.dtype)
    except Exception:
        return False


_STRIDED = callable(getattr(paddle.Tensor, "is_contiguous", None))
"""This Paddle has strided views (``transpose``, slices: 3.x), whose layout a function can see: keys hold it."""


def _layout(t: Any) -> layouts.Layout:
    """``t``'s layout class (:mod:`graphjit.layouts`); None where contiguous or this Paddle has no strided views."""
    if not _STRIDED:
        return None
    try:
        return None if t.is_contiguous() else layouts.of(t.shape, t.strides)
    except Exception:  # a tensor without strides (sparse): the check of unstrided inputs runs it uncaptured
        return None


def _fused_check(expected: list[tuple[Any, ...]], singletons: bool, strided: bool) -> Callable[..., bool]:
    """:meth:`PaddleBackend.meta_check`'s loop: ``expected`` holds each tensor's shape, dtype (its int where
    ``singletons`` is False), stop_gradient, place and layout class (checked where ``strided``)."""
    count = len(expected)

    def check(*ts: Any) -> bool:
        if len(ts) != count:
            return False
        for t, (shape, dtype, stop, place, shaped) in zip(ts, expected):
            if (t.dtype is not dtype if singletons else int(t.dtype) != dtype) or t.stop_gradient is not stop \
                    or t.shape != shape or not place._equals(t.place):
                return False
            if strided and ((not t.is_contiguous() and _layout(t) is not None) if shaped is None
                            else _layout(t) != shaped):
                return False
        return True
    return check


def _places_hash_by_value() -> bool:
    """True if two Place objects for one device are equal and hash alike (Paddle 3.x; not 2.6)."""
    try:
        t = paddle.to_tensor([0.0], place=paddle.CPUPlace())  # host memory: safe during a capture
        a, b = t.place, t.place  # two Place objects for one device
        return bool(a is not b and a == b and hash(a) == hash(b) and str(a) == str(b))
    except Exception:
        return False


_DY2ST_ERROR_DATA = "Error data about original source code information and traceback."  # paddle.jit error.py
_OWN_DIRS = (os.path.dirname(paddle.__file__) + os.sep, PACKAGE_DIR)


def _foreign_frames(exc: BaseException) -> bool:
    """True if the traceback of ``exc`` has a frame outside Paddle and graphjit (the user's code ran)."""
    tb = exc.__traceback__
    while tb is not None:
        if not tb.tb_frame.f_code.co_filename.startswith(_OWN_DIRS):
            return True
        tb = tb.tb_next
    return False


class PaddleBackend(Backend):
    name = "paddle"
    tracers = ("sot", "ast", "eager")
    default_tracer = "sot"
    captures_recoverable = False  # 2.6 stays in capture mode after a capture a sync broke
    # SOT runs what it cannot translate by simulating the function's bytecode and calling the C functions the code
    # calls from its own frames: a watched run sees the clocks the function reads there
    host_watched_tracers = ("sot",)
    simulator_modules = ("paddle.jit.sot.opcode_translator.",)  # (its executor; not its logging utilities)

    def __init__(self) -> None:
        # Paddle 2.x's SOT drops an in-place paddle.assign(value, state) into state reached through a global
        # (outputs and state wrong from the second call, graphjit or not): its programs are checked
        # (graphjit.tracer_check).  3.x computes that right; its tracers are not checked.
        self.checked_tracers = ("sot",) if int(paddle.__version__.split(".")[0]) < 3 else ()
        self._unavailable: dict[str, str | None] = {}
        self._flags_set = False
        import paddle.device.cuda.graphs as _graphs  # not imported by `import paddle` in 2.6

        self._graphs = _graphs
        params = inspect.signature(_graphs.CUDAGraph.__init__).parameters
        core_graph = getattr(_graphs, "CoreCUDAGraph", None)
        self.shared_pools = "pool_id" in params and hasattr(core_graph, "gen_new_memory_pool_id")
        if _places_hash_by_value():  # Paddle 3.x: the Place itself is a key (0.6 us less per tensor than str)
            self.meta_key = self._meta_key_place  # type: ignore[method-assign]
        if isinstance(getattr(paddle.Tensor, "data_ptr", None), types.MethodDescriptorType):
            # the C method itself on the replay path (it returns an int in 2.6 and 3.x): no Python frame per tensor
            self.data_ptr = paddle.Tensor.data_ptr  # type: ignore[method-assign,assignment]

    # -- tensors ---------------------------------------------------------------------------
    def tensor_types(self) -> tuple[type, ...]:
        return (paddle.Tensor,)

    def meta_key(self, t: Any) -> tuple[Any, ...]:
        """Shape, dtype, place, requires_grad and the layout class (:mod:`graphjit.layouts`: None where contiguous,
        and on a Paddle without strided views)."""
        # str(place): Place objects of paddle 2.6 hash by identity, a new one per access
        return (tuple(t.shape), t.dtype, str(t.place), not t.stop_gradient, _layout(t))

    def _meta_key_place(self, t: Any) -> tuple[Any, ...]:
        return (tuple(t.shape), t.dtype, t.place, not t.stop_gradient, _layout(t))

    def meta_check(self, tensors: Sequence[Any]) -> Callable[..., bool] | None:
        """One Python loop over the tensors: each one's dtype (by identity where Paddle's dtypes are singletons, as in
        3.x; else its int), stop_gradient, shape, place (``Place._equals``, no string made nor Place compared through
        ``==``) and, where this Paddle has strided views, layout class (``is_contiguous()`` for one keyed contiguous)
        against ``tensors``'; about half of reading and comparing every ``meta_key``.  Never looser than
        :meth:`meta_key`.  None where this Paddle's Place has no ``_equals``."""
        try:
            expected = [(t.shape, t.dtype, bool(t.stop_gradient), t.place, _layout(t)) for t in tensors]
            if not all(callable(getattr(place, "_equals", None)) for _s, _d, _g, place, _l in expected):
                return None
            if not _dtypes_are_singletons():  # Paddle 2.6: a new dtype object per read, whose == costs 0.9 us; its int
                expected = [(shape, int(d), stop, place, shaped) for shape, d, stop, place, shaped in expected]
        except Exception:
            return None
        return _fused_check(expected, _dtypes_are_singletons(), _STRIDED)

    def shape(self, t: Any) -> tuple[int, ...]:
        return tuple(t.shape)

    def data_ptr(self, t: Any) -> int:
        return int(t.data_ptr())

    def strides(self, t: Any) -> tuple[int, ...]:
        return tuple(t.strides)

    def device_str(self, t: Any) -> str:
        place = t.place
        if place.is_gpu_place():
            return f"cuda:{place.gpu_device_id()}"
        return "cpu" if place.is_cpu_place() else str(place)

    def requires_grad(self, t: Any) -> bool:
        return not t.stop_gradient

    grad_flag = operator.attrgetter("stop_gradient")

    def is_floating(self, t: Any) -> bool:
        return bool(t.is_floating_point())

    def unstrided(self, t: Any) -> str | None:
        return "a sparse tensor" if t.is_sparse() else None

    def nbytes(self, t: Any) -> int:
        return int(t.numel()) * int(t.element_size())

    def empty(self, shape: Sequence[int], like: Any) -> Any:
        out = paddle.empty(list(shape), dtype=like.dtype)
        if out.place != like.place:
            out = out._copy_to(like.place, False)
        return out

    def zero_(self, t: Any) -> None:
        with paddle.no_grad():
            t.zero_()

    def clone(self, t: Any) -> Any:
        if paddle_modes.grad_enabled():
            with paddle.no_grad():  # (entering it costs about a microsecond: not where grad is off already)
                out = t.clone()  # one copy kernel (computes right on every GPU, Hopper with 2.6.2 included)
        else:
            out = t.clone()
        out.stop_gradient = True
        return out

    def copy_(self, dst: Any, src: Any) -> None:
        with paddle.no_grad():
            dst.copy_(src, False)

    def batch_operands(self) -> Any:
        from .copies import OPERANDS  # imported where a capture plans its copies, not with the backend
        return OPERANDS

    def copy_many(self, dsts: Sequence[Any], srcs: Sequence[Any], grad_free: bool = False) -> None:
        """Pairwise ``copy_``, under one ``no_grad`` for all of them, and none where no source requires grad
        (``grad_free``: the copy records nothing then); entering it costs about a microsecond in Paddle 2.6."""
        if grad_free:
            for d, s in zip(dsts, srcs):
                d.copy_(s, False)
            return
        with paddle.no_grad():
            for d, s in zip(dsts, srcs):
                d.copy_(s, False)

    def narrow(self, t: Any, dim: int, start: int, length: int) -> Any:
        view = paddle.slice(t, axes=[dim], starts=[start], ends=[start + length])
        if start == 0 and view.data_ptr() != t.data_ptr():
            raise BackendError(f"paddle {paddle.__version__}: slicing does not return a view here; "
                               "buckets need views (remove buckets= or upgrade Paddle)")
        return view

    def poison_(self, t: Any) -> None:
        arr = _to_numpy(t)
        if np.issubdtype(arr.dtype, np.floating) and t.dtype != paddle.bfloat16:
            arr = np.full_like(arr, np.nan)
        elif t.dtype == paddle.bfloat16:
            arr = np.full(arr.shape, 0x7FC0, dtype=np.uint16)
        elif np.issubdtype(arr.dtype, np.integer):
            arr = np.full_like(arr, np.iinfo(arr.dtype).min)
        else:
            return
        t.copy_(paddle.to_tensor(arr, place=t.place), False)

    def equal(self, a: Any, b: Any) -> bool:
        x, y = _to_numpy(a), _to_numpy(b)
        return x.shape == y.shape and bool(np.array_equal(x, y, equal_nan=np.issubdtype(x.dtype, np.floating)))

    def rel_error(self, a: Any, b: Any) -> float:
        x, y = _to_numpy(a), _to_numpy(b)
        if x.shape != y.shape:
            return float("inf")
        if not np.issubdtype(x.dtype, np.floating):
            return 0.0 if np.array_equal(x, y) else float("inf")
        x64, y64 = x.astype(np.float64), y.astype(np.float64)
        if not np.array_equal(np.isnan(x64), np.isnan(y64)):
            return float("inf")
        x64, y64 = np.nan_to_num(x64, nan=0.0), np.nan_to_num(y64, nan=0.0)
        denom = float(np.linalg.norm(y64))
        err = float(np.linalg.norm(x64 - y64))
        if denom == 0.0:
            return 0.0 if err == 0.0 else float("inf")
        return err / denom

    def fingerprint(self, t: Any) -> str:
        return hashlib.blake2b(np.ascontiguousarray(_to_numpy(t)).tobytes(), digest_size=6).hexdigest()

    # -- state a call may write, modes, random numbers --------------------------------------
    module_holders = ("_sub_layers",)
    tensor_holders = ("_parameters", "_buffers")
    hook_holders = hooks.HOLDERS

    def hook_count(self) -> Callable[[], int] | None:
        return hooks.count()
    renewed_attributes = ((paddle.optimizer.Optimizer, "helper"),)  # a new LayerHelper in every step()
    versions_complete = False  # Tensor.copy_ does not bump inplace_version (seen in 3.3.1)

    def version(self, t: Any) -> int | None:
        try:
            return int(t.inplace_version)
        except Exception:  # a Paddle without the counter: compare contents
            return None

    def is_parameter(self, t: Any) -> bool:
        return _PARAM_TYPE is not None and isinstance(t, _PARAM_TYPE)

    def modes(self) -> tuple[Any, ...]:
        return paddle_modes.read()

    def describe_modes(self, modes: tuple[Any, ...]) -> str:
        return paddle_modes.describe(modes)

    def _generator(self, device: str) -> Any:
        if device.startswith("cuda"):
            return paddle.base.core.default_cuda_generator(int(device.split(":", 1)[1]) if ":" in device else 0)
        return paddle.base.core.default_cpu_generator()

    def rng_state(self, device: str) -> Any:
        return self._generator(device).get_state()

    def set_rng_state(self, device: str, state: Any) -> None:
        self._generator(device).set_state(state)

    def rng_equal(self, a: Any, b: Any) -> bool:
        # GeneratorState compares by identity; its text holds seed, offset and engine state, and an
        # address (0x...) that changes with every copy
        return _state_text(a) == _state_text(b)

    def rng_in_graphs(self) -> str | None:
        return (f"the function draws random numbers, and paddle {paddle.__version__}'s random kernels take their seed "
                "and offset from the host when they are launched, so a CUDA graph would replay the numbers drawn at "
                "capture (Paddle re-seeds only its dropout kernels on replay)")

    # -- tracing ---------------------------------------------------------------------------
    def trace(self, fn: Callable[..., Any], tracer: str) -> Callable[..., Any]:
        if tracer == "eager":
            return fn
        if tracer == "sot":
            return SotFunction(fn)
        if tracer == "ast":
            return paddle.jit.to_static(fn, full_graph=True)
        raise BackendError(f"tracer={tracer!r} is not a paddle tracer; expected one of {self.tracers}")

    def translating(self) -> bool:
        return not paddle.in_dynamic_mode()

    def compiles_unwatched(self, pause: Callable[[], None],
                           resume: Callable[[], None]) -> contextlib.AbstractContextManager[None]:
        return sot.translations_unwatched(pause, resume)

    def tracer_rereads_values(self, tracer: str) -> bool:
        """The AST tracer builds a static program once per input spec, with the Python values it read then (a call
        with other values runs the Python function); SOT guards what it reads and translates again; eager reads
        them on every call."""
        return tracer != "ast"

    def traced_call_guard(self) -> contextlib.AbstractContextManager[Any]:
        return _TRACE_LOCK

    def tracer_failure(self, exc: BaseException, tracer: str) -> str | None:
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        text = lines[-1][:300] if lines else type(exc).__name__
        # SOT's InnerError: SOT failed inside itself (e.g. Paddle 2.6 cannot translate float(tensor)).
        if type(exc).__name__ == "InnerError" and type(exc).__module__.startswith("paddle.jit.sot"):
            return text
        # to_static's own argument handling or transformation raised: no frame of the call ran outside Paddle
        # and graphjit (the function's own errors come from its own frames, or from its transformed code,
        # which Paddle marks with its error data).  Not under the eager tracer, which translates nothing: there a
        # Paddle function graphed itself raises its own errors from no Python frame
        if tracer != "eager" and isinstance(exc, (TypeError, ValueError, AttributeError, NotImplementedError)) \
                and getattr(exc, _DY2ST_ERROR_DATA, None) is None and not _foreign_frames(exc):
            return f"{type(exc).__name__} in paddle: {text}"
        return None

    def original_error(self, exc: BaseException) -> BaseException | None:
        """The function's own exception that to_static re-raised with a longer message (and, for a KeyError,
        as another type): Paddle keeps it in the error data it attaches."""
        data = getattr(exc, _DY2ST_ERROR_DATA, None)
        original = getattr(data, "error_value", None)
        return original if isinstance(original, BaseException) else None

    # -- devices and graphs ----------------------------------------------------------------
    def graphs_unavailable(self, device: str) -> str | None:
        if device in self._unavailable:
            return self._unavailable[device]
        reason: str | None = None
        if not paddle.is_compiled_with_cuda():
            reason = f"paddle {paddle.__version__} is a CPU build"
        elif not self._graphs.is_cuda_graph_supported():
            reason = f"paddle {paddle.__version__} was built without CUDA graph support"
        elif paddle.device.cuda.device_count() == 0:
            reason = "paddle sees no CUDA device"
        elif _flag("FLAGS_allocator_strategy", "auto_growth") != "auto_growth":
            reason = ("FLAGS_allocator_strategy is not auto_growth, which Paddle's CUDA graphs need; "
                      "unset it or set FLAGS_allocator_strategy=auto_growth before starting")
        elif not _flag("FLAGS_use_stream_safe_cuda_allocator", True):
            reason = ("FLAGS_use_stream_safe_cuda_allocator is off; Paddle runs to_static programs in a "
                      "capture only with it on: unset it")

        elif not device.startswith("cuda"):
            reason = f"inputs are on {device}; CUDA graphs need GPU tensors"
        self._unavailable[device] = reason
        return reason

    def prepare_step(self, roots: list[tuple[str, Any]]) -> StepContext | None:
        from .optimizers import prepare

        return prepare(roots)

    def grad_enabled(self) -> bool:
        return paddle_modes.grad_enabled()

    def new_pool(self, device: str) -> Any:
        if not self.shared_pools:
            return None
        return self._graphs.CoreCUDAGraph.gen_new_memory_pool_id()

    def _ensure_flags(self) -> None:
        if self._flags_set:
            return
        wanted: dict[str, bool | str | float] = {}
        for name, value in _CAPTURE_FLAGS.items():
            with contextlib.suppress(Exception):
                if paddle.get_flags([name])[name] != value:
                    wanted[name] = value
        if wanted:
            paddle.set_flags(wanted)
            log.info("graphjit: set %s so that to_static programs can run inside a CUDA graph capture",
                     ", ".join(f"{k}={int(v)}" for k, v in wanted.items()))
        self._flags_set = True

    def sync_watch(self, hits: list[str]) -> contextlib.AbstractContextManager[None]:
        """Record (never raise) every call, on this thread, of a Tensor method or function that copies device memory
        to the host inside the block, with the Python line that made it (:func:`.syncs.watch`)."""
        return syncs.watch(hits)

    def capture_graph(self, fn: Callable[[], Any], device: str, pool: Any, debug: bool, feed: bool = False,
                      operands: Callable[[], Iterable[Any]] | None = None) -> tuple[GraphHandle, Any]:
        """Capture ``fn()`` with ``CUDAGraph(mode="thread_local")``, in segments where an island cuts it
        (:class:`_PaddleSegments`); returns the last segment's graph.  ``operands`` is not needed here."""
        self._ensure_flags()
        index = int(device.split(":", 1)[1]) if ":" in device else 0
        kwargs = {"pool_id": pool} if (pool is not None and self.shared_pools) else {}
        segments = _PaddleSegments(lambda: self._graphs.CUDAGraph(place=paddle.CUDAPlace(index), mode="thread_local",
                                                                  **kwargs), index)
        segments.resume()
        try:
            with segments_open(segments):
                out = fn()
        except BaseException as exc:
            ended = _end_quietly(segments.graph) if segments.capturing else True
            text = str(exc).strip().splitlines()
            first = text[-1] if text else type(exc).__name__
            self._check_not_capturing(first)
            if isinstance(exc, CaptureError):
                raise
            raise CaptureError(
                f"capture failed: {first[:300]}. Usual causes: {syncs.SYNC_HINT}"
                + ("" if ended else " (ending the capture failed too)"),
                reason="capture failed: " + first[:120]) from exc
        try:
            last = segments.cut()
        except Exception as exc:
            text = str(exc).strip().splitlines()
            first = text[-1] if text else type(exc).__name__
            self._check_not_capturing(first)
            raise CaptureError(f"capture failed at capture_end: {first[:300]}. Usual causes: {syncs.SYNC_HINT}",
                               reason="capture failed: " + first[:120]) from exc
        return last, out

    def _check_not_capturing(self, cause: str) -> None:
        """After a failed capture: if Paddle is still in capture mode, nothing on the GPU can run again."""
        capturing = getattr(paddle.base.core, "is_cuda_graph_capturing", None)
        if capturing is not None and capturing():
            self.poisoned = (f"an earlier capture failed ({cause[:200]}) and paddle {paddle.__version__} stayed in "
                             "capture mode; every GPU call in this process now fails. Restart the process")
            raise UnrecoverableCaptureError(
                f"paddle {paddle.__version__} cannot recover from this failed CUDA graph capture: it stays in "
                f"capture mode and every later GPU call in this process fails (cause: {cause[:300]}). "
                f"Fix the function ({syncs.SYNC_HINT}) and restart the process; exit with os._exit() to avoid a "
                "crash at interpreter exit.")

    def synchronize(self, device: str) -> None:
        if device.startswith("cuda"):
            paddle.device.cuda.synchronize(int(device.split(":", 1)[1]) if ":" in device else 0)


_PARAM_TYPE: type | None = getattr(getattr(getattr(paddle, "base", None), "framework", None), "EagerParamBase", None)


def _state_text(state: Any) -> str:
    return " ".join(tok for tok in str(state).split() if not tok.startswith("0x"))


def _end_quietly(graph: Any) -> bool:
    try:
        graph.capture_end()
        return True
    except Exception as exc:  # the capture was invalidated; ending it is what matters
        log.debug("graphjit: capture_end after a failed capture raised: %s", exc)
        return False


def _reserved(index: int) -> int:
    with contextlib.suppress(Exception):
        return int(paddle.device.cuda.memory_reserved(index))
    return 0


def _flag(name: str, default: Any) -> Any:
    try:
        return paddle.get_flags([name])[name]
    except Exception:  # a flag this Paddle does not have
        return default
