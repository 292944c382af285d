"""PyTorch side of graphjit's collectives: ``torch.distributed`` groups, tensors, streams.

The swap wraps ``torch.distributed.all_reduce`` (the attribute of the ``torch.distributed``
package; code that did ``from torch.distributed import all_reduce`` before the swap keeps the
original).  ``all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False)`` returns None, or a
``Work`` when ``async_op=True``; the custom path returns the same: a Work that is already
complete (the kernel was enqueued on the current stream, which is what ``Work.wait()`` orders the
current stream after), built from a completed ``torch.futures.Future``.

torch.compile (``tracer="compile"``): Dynamo sees through a wrapt proxy (it reads the original's
code and compares equal to it) and would rewrite the call into a functional collective or trace
the original's body, bypassing the swap without a word.  So while the custom all-reduce is enabled
for some group, ``torch.distributed.all_reduce`` holds a plain function instead (:meth:`Dist.publish`):

* outside compiled code it calls the swap (about a microsecond more per call);
* traced by Dynamo, a call on the default group with ``op=SUM`` and ``async_op=False`` (what
  tensor-parallel layers do) becomes the custom op ``graphjit::all_reduce_`` in the graph, so
  ``fullgraph=True`` keeps working; when the compiled code runs, the op calls the swap on real
  tensors, which launches (or, inside a capture, captures) the custom kernel or runs NCCL;
* any other call is passed through ``torch.compiler.disable``: Dynamo breaks its graph there and
  the swap runs eagerly (``fullgraph=True`` refuses such calls, with a message naming graphjit).
"""

from __future__ import annotations

import functools
from collections.abc import Hashable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ..dist_base import Call, DistBackend, TensorInfo, from_compiled_graph
from . import breaks
from . import device as cuda_device

_DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
_COMPILE_REASON = ("graphjit's all_reduce swap runs eagerly for calls with a group, an op other than SUM or "
                   "async_op=True while graphjit.collectives' custom all-reduce is on (it must see real tensors); "
                   "compile without fullgraph=True, or call graphjit.collectives.shutdown() first")
_SUM = dist.ReduceOp.SUM
_OP_NAME = "graphjit::all_reduce_"
_CUDA_NAMES = [f"cuda:{i}" for i in range(64)]  # device strings of TensorInfo, built once


def _compile_op() -> Any:
    """``torch.ops.graphjit.all_reduce_`` (defined once), or None where torch has no ``torch.library.custom_op``."""
    ops = getattr(torch.ops, "graphjit", None)
    if ops is not None and hasattr(ops, "all_reduce_"):
        return ops.all_reduce_
    custom_op = getattr(torch.library, "custom_op", None)
    if custom_op is None:  # torch < 2.4
        return None

    @custom_op(_OP_NAME, mutates_args=("tensor",))
    def all_reduce_(tensor: torch.Tensor) -> None:
        """In-place SUM over the default group through whatever ``torch.distributed.all_reduce`` is now
        (graphjit's swap: the custom kernel or NCCL)."""
        with from_compiled_graph():
            dist.all_reduce(tensor)

    @all_reduce_.register_fake  # type: ignore[misc]  # register_fake returns the function it was given
    def _(tensor: torch.Tensor) -> None:
        return None

    return torch.ops.graphjit.all_reduce_


class _CompletedWork:
    """Stand-in for ``dist.Work`` where torch cannot build one (or not now: during a capture)."""

    def __init__(self, tensor: Any) -> None:
        self._tensor = tensor
        self._future: Any = None

    def wait(self, timeout: Any = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def exception(self) -> None:
        return None

    def get_future(self) -> Any:
        if self._future is None:
            self._future = _future_of(self._tensor)
        return self._future

    def result(self) -> list[Any]:
        return [self._tensor]

    def synchronize(self) -> None:
        return None


def _future_of(t: Any) -> Any:
    future: torch.futures.Future[list[Any]] = (
        torch.futures.Future(devices=[t.device]) if t.is_cuda else torch.futures.Future())
    future.set_result([t])
    return future


class Dist(DistBackend):
    name = "torch"
    flag_name = "async_op"
    default_op = _SUM

    def publish(self, wrapper: Any) -> Any:
        is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None)
        if is_compiling is None:  # torch < 2.3: no collective rewrites to avoid either (nor torch.compiler.disable)
            return wrapper
        eager = breaks.compiler_disable(wrapper, _COMPILE_REASON)
        custom = _compile_op()

        @functools.wraps(wrapper)
        def all_reduce(*args: Any, **kwargs: Any) -> Any:
            if custom is not None and is_compiling():
                call = self.parse_call(args, kwargs)  # a default-group, synchronous SUM of a tensor?
                if (call is not None and isinstance(call.tensor, torch.Tensor) and call.op is _SUM
                        and call.group is None and call.blocking):
                    custom(call.tensor)  # into the compiled graph; the op calls the swap when the graph runs
                    return None
            return eager(*args, **kwargs)

        return all_reduce

    def wrap_target(self) -> tuple[Any, str]:
        return dist, "all_reduce"

    # -- process groups ----------------------------------------------------------------------
    def initialized(self) -> bool:
        return bool(dist.is_available() and dist.is_initialized())

    def resolve_group(self, group: Any) -> Any:
        return dist.group.WORLD if group is None else group

    def group_key(self, group: Any) -> Hashable:
        return ("torch", id(self.resolve_group(group)))

    def rank(self, group: Any) -> int:
        return int(dist.get_rank(self.resolve_group(group)))

    def world_size(self, group: Any) -> int:
        return int(dist.get_world_size(self.resolve_group(group)))

    def all_gather_object(self, obj: Any, group: Any) -> list[Any]:
        group = self.resolve_group(group)
        out: list[Any] = [None] * self.world_size(group)
        dist.all_gather_object(out, obj, group=group)
        return out

    # -- calls ---------------------------------------------------------------------------------
    def is_sum(self, op: Any) -> bool:
        if op is _SUM:
            return True
        try:
            return bool(op == dist.ReduceOp.SUM)
        except Exception:  # a ReduceOp that does not compare (premul_sum with a tensor factor)
            return False

    def tensor_info(self, t: Any) -> TensorInfo | None:
        if not isinstance(t, torch.Tensor) or t.is_sparse:
            return None
        if t.is_cuda and 0 <= (index := t.get_device()) < len(_CUDA_NAMES):
            device = _CUDA_NAMES[index]
        else:
            d = t.device
            device = "cpu" if d.type == "cpu" else f"{d.type}:{d.index if d.index is not None else 0}"
        numel = t.numel()
        return TensorInfo(_DTYPES.get(t.dtype) or str(t.dtype).replace("torch.", ""), numel,
                          numel * t.element_size(), t.data_ptr(), t.is_contiguous(), device)

    def result(self, call: Call) -> Any:
        if call.blocking:
            return None
        t = call.tensor
        make = getattr(torch._C._distributed_c10d, "_create_work_from_future", None)
        # A device future records an event on the current stream: not while that stream captures.
        if make is not None and not (t.is_cuda and torch.cuda.is_current_stream_capturing()):
            try:
                return make(_future_of(t))
            except Exception:  # an older torch with another signature
                pass
        return _CompletedWork(t)

    # -- devices and streams ---------------------------------------------------------------------
    def cuda_unavailable(self) -> str | None:
        if not torch.backends.cuda.is_built():
            return f"torch {torch.__version__} is a CPU build"
        if not torch.cuda.is_available():
            return "torch sees no CUDA device"
        return None

    def current_device(self) -> int:
        return int(torch.cuda.current_device())

    def capability(self, device: int) -> tuple[int, int]:
        return cuda_device.capability(device)

    def current_stream(self, device: int) -> int:
        return cuda_device.current_stream(device)

    def capturing(self) -> bool:
        return bool(torch.cuda.is_current_stream_capturing())

    def synchronize(self, device: int) -> None:
        torch.cuda.synchronize(device)

    def from_numpy(self, array: Any, device: int) -> Any:
        return torch.from_numpy(np.ascontiguousarray(array)).to(f"cuda:{device}")

    def to_numpy(self, t: Any) -> Any:
        t = t.detach()
        if t.dtype == torch.bfloat16:
            t = t.float()
        return t.cpu().numpy()
