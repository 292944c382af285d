"""PaddlePaddle side of graphjit's collectives: ``paddle.distributed`` groups, tensors, streams.

The swap wraps ``paddle.distributed.all_reduce`` (the attribute of the ``paddle.distributed``
package).  ``all_reduce(tensor, op=ReduceOp.SUM, group=None, sync_op=True)`` returns a task in
dynamic mode; the custom path returns a task-like object that is already complete (``wait()``
returns True at once: the kernel was enqueued on the calculation stream, which is where Paddle's
own synchronous all-reduce leaves the result too).

SOT (``paddle.jit.to_static(full_graph=False)``): Paddle's SOT treats ``paddle.distributed.all_reduce``
as a Paddle API and would record it into its static program, where the swap cannot reach it.
graphjit registers the wrapper as a graph-break function instead (``mark_graph_break``): SOT
compiles the code before the call into one subgraph, runs the call eagerly (the swap sees real
tensors and can launch the custom kernel, also inside a capture), and resumes translating after
it.  In AST mode (``full_graph=True``) or any static program the call is recorded as Paddle's
own collective op and the swap passes it through (reason "static mode").
"""

from __future__ import annotations

import functools
import math
import pickle
from collections.abc import Hashable
from typing import Any

import numpy as np
import paddle
import paddle.distributed as dist

from ..dist_base import Call, DistBackend, TensorInfo
from . import breaks
from . import device as cuda_device
from .sot import skip_graphjit_in_sot

_DTYPES = {paddle.float32: "float32", paddle.float16: "float16", paddle.bfloat16: "bfloat16"}


class CompletedTask:
    """What the custom path returns in place of Paddle's task: the work is already enqueued."""

    def wait(self, timeout: Any = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None

    def is_sync(self) -> bool:
        return True


class Dist(DistBackend):
    name = "paddle"
    flag_name = "sync_op"
    flag_default = True
    flag_is_blocking = True
    default_op = dist.ReduceOp.SUM

    def wrap_target(self) -> tuple[Any, str]:
        return dist, "all_reduce"

    always_opaque = True

    def publish(self, wrapper: Any) -> Any:
        """A plain function that calls ``wrapper``: SOT must see a function it can register as a graph
        break, not a wrapt proxy (Paddle 2.6's SOT traces into the proxy's call, and into graphjit).
        Also puts graphjit's own files on SOT's skip list: the call runs eagerly after the graph
        break, and SOT's frame hook must not translate graphjit's dispatch code then."""
        skip_graphjit_in_sot()

        @functools.wraps(wrapper)
        def all_reduce(*args: Any, **kwargs: Any) -> Any:
            return wrapper(*args, **kwargs)

        all_reduce.__module__ = __name__  # not a Paddle API module: SOT must not record it as an op
        return all_reduce

    def mark_graph_break(self, fn: Any) -> str | None:
        return breaks.register(fn)

    # -- process groups ----------------------------------------------------------------------
    def initialized(self) -> bool:
        return bool(dist.is_initialized())

    def resolve_group(self, group: Any) -> Any:
        if group is not None:
            return group
        from paddle.distributed.collective import _get_global_group

        return _get_global_group()

    def group_key(self, group: Any) -> Hashable:
        return ("paddle", int(self.resolve_group(group).id))

    def rank(self, group: Any) -> int:
        return int(self.resolve_group(group).rank)

    def world_size(self, group: Any) -> int:
        return int(self.resolve_group(group).nranks)

    def all_gather_object(self, obj: Any, group: Any) -> list[Any]:
        """Every rank's ``obj``, in the group's rank order (a collective).

        Built from broadcasts of host-filled uint8/int64 tensors, one rank at a time (size, then
        bytes), not ``paddle.distributed.all_gather_object``: that one also runs Paddle's own
        comparison and split kernels, which paddlepaddle-gpu 2.6 lacks for newer GPUs (Hopper);
        broadcasts into a tensor and host copies work on every GPU and on gloo.  The tensors live on
        the current device, except in a gloo group (host tensors only: Paddle's gloo reads the
        tensor's memory from the host), where they are CPU tensors.
        """
        g = self.resolve_group(group)
        me = int(dist.get_rank())
        mine = pickle.dumps(obj)
        gloo = str(getattr(g, "backend", "")).upper() == "GLOO"
        place = paddle.CPUPlace() if gloo else paddle.framework._current_expected_place()
        out: list[Any] = []
        for src in [int(r) for r in g.ranks]:
            size = paddle.to_tensor(np.array([len(mine) if src == me else 0], np.int64), place=place)
            dist.broadcast(size, src=src, group=g)
            n = int(np.asarray(size.numpy()).reshape(-1)[0])
            data = np.frombuffer(mine, np.uint8) if src == me else np.zeros(n, np.uint8)
            buf = paddle.to_tensor(data, place=place)
            dist.broadcast(buf, src=src, group=g)
            out.append(pickle.loads(np.asarray(buf.numpy()).tobytes()))
        return out

    # -- calls ---------------------------------------------------------------------------------
    def is_sum(self, op: Any) -> bool:
        return bool(op == dist.ReduceOp.SUM)

    def tensor_info(self, t: Any) -> TensorInfo | None:
        if not isinstance(t, paddle.Tensor):
            return None
        place = t.place
        if place.is_gpu_place():
            device = f"cuda:{place.gpu_device_id()}"
        else:
            device = "cpu" if place.is_cpu_place() else str(place)
        numel = math.prod(t.shape)  # Tensor.numel() is a tensor in some Paddle versions
        contiguous = bool(t.is_contiguous()) if hasattr(t, "is_contiguous") else True
        dtype = _DTYPES.get(t.dtype) or str(t.dtype).replace("paddle.", "")
        return TensorInfo(dtype, numel, numel * int(t.element_size()), int(t.data_ptr()), contiguous, device)

    def result(self, call: Call) -> Any:
        return CompletedTask()

    def static_mode(self) -> bool:
        return not paddle.in_dynamic_mode()

    # -- devices and streams ---------------------------------------------------------------------
    def cuda_unavailable(self) -> str | None:
        if not paddle.is_compiled_with_cuda():
            return f"paddle {paddle.__version__} is a CPU build"
        if paddle.device.cuda.device_count() == 0:
            return "paddle sees no CUDA device"
        device = str(paddle.device.get_device())
        if not device.startswith("gpu"):
            return (f"paddle's current device is {device}, not a GPU: call paddle.set_device('gpu:<local rank>') "
                    "before collectives.init()")
        return None

    def current_device(self) -> int:
        place = paddle.framework._current_expected_place()
        if hasattr(place, "gpu_device_id"):
            return int(place.gpu_device_id())
        return int(str(paddle.device.get_device()).split(":")[-1])

    def capability(self, device: int) -> tuple[int, int]:
        return cuda_device.capability(device)

    def current_stream(self, device: int) -> int:
        return cuda_device.current_stream(device)

    def capturing(self) -> bool:
        probe = getattr(paddle.base.core, "is_cuda_graph_capturing", None)
        return bool(probe()) if probe is not None else False

    def synchronize(self, device: int) -> None:
        paddle.device.cuda.synchronize(device)

    def from_numpy(self, array: Any, device: int) -> Any:
        return paddle.to_tensor(np.ascontiguousarray(array), place=paddle.CUDAPlace(device))

    def to_numpy(self, t: Any) -> Any:
        arr = np.asarray(t.numpy())
        if t.dtype == paddle.bfloat16:  # numpy has no bfloat16: Paddle hands back the raw bits
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        return arr
