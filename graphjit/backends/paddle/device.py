"""What Paddle says about this machine's GPUs (the one answer the backend, the all-reduce, the benchmarks
and the doctor share), the description benchmarks record, tensors to numpy, and a GPU's current stream and
architecture as the csrc library takes them."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import paddle

# What paddle.device.current_stream wraps: the current stream of a GPU index, without building a Stream
# object; None where this Paddle has no such call (the public route then serves).
_RAW_STREAM = getattr(getattr(getattr(paddle, "base", None), "core", None), "_get_current_stream", None)


def current_stream(device: int) -> int:
    """The current stream of GPU ``device`` as a ``cudaStream_t`` integer (the all-reduce's and the batch copy's)."""
    if _RAW_STREAM is not None:
        try:
            return int(_RAW_STREAM(device).cuda_stream)
        except Exception:  # another signature or stream type: the public route below
            pass
    getter = getattr(paddle.device, "current_stream", None)
    stream = getter(paddle.CUDAPlace(device)) if getter is not None else paddle.device.cuda.current_stream(device)
    base: Any = getattr(stream, "stream_base", stream)
    handle = getattr(base, "cuda_stream", None)
    if handle is None:
        handle = base.raw_stream
    return int(handle)


def capability(device: int) -> tuple[int, int]:
    """GPU ``device``'s compute capability, ``(major, minor)``."""
    major, minor = paddle.device.cuda.get_device_capability(device)
    return int(major), int(minor)


@functools.cache
def arch(device: int) -> str:
    """GPU ``device``'s architecture as nvcc names it (``sm_90``), read once."""
    major, minor = capability(device)
    return f"sm_{major}{minor}"


def cuda_unavailable() -> str | None:
    """None when Paddle can run CUDA work here, else why not (a CPU build, no device)."""
    if not paddle.is_compiled_with_cuda():
        return f"paddle {paddle.__version__} is a CPU build"
    if paddle.device.cuda.device_count() == 0:
        return f"paddle {paddle.__version__} sees no CUDA device"
    return None


def describe() -> dict[str, Any]:
    """paddle's version and, when compiled with CUDA, the CUDA version, GPU count and name; a failed query is
    recorded under ``"error"``."""
    info: dict[str, Any] = {"version": paddle.__version__}
    try:
        info["compiled_with_cuda"] = bool(paddle.is_compiled_with_cuda())
        if info["compiled_with_cuda"]:
            info["cuda"] = paddle.version.cuda()
            count = paddle.device.cuda.device_count()
            info["gpu_count"] = count
            if count:
                info["gpu"] = paddle.device.cuda.get_device_name()
    except Exception as exc:
        info["error"] = f"{type(exc).__name__}: {exc}"
    return info


def to_numpy(t: Any) -> np.ndarray:
    """A numpy copy of ``t``; bfloat16 (which numpy lacks, and for which Paddle hands back the raw bits) as
    float32.  A copy kernel only: right also where a Paddle build has no kernels for the GPU."""
    arr = np.asarray(t.detach().numpy() if hasattr(t, "detach") else t.numpy())
    if t.dtype == paddle.bfloat16:
        arr = (arr.astype(np.uint32) << 16).view(np.float32)
    return arr
