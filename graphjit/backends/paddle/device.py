"""What Paddle says about this machine's GPUs (the one answer the backend, the all-reduce, the benchmarks
and the doctor share), the description benchmarks record, and tensors to numpy."""

from __future__ import annotations

from typing import Any

import numpy as np
import paddle


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
