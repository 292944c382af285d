"""What the benchmarks (``python -m graphjit bench``) ask the frameworks about the machine's GPUs.

* :func:`gpu_unavailable` and :func:`cuda_gpus`: whether a benchmark can run on GPUs here; they import
  the framework they ask (an ImportError means it is not installed);
* :func:`torch_info` and :func:`paddle_info`: the device description that
  :func:`graphjit.bench.common.environment` records in every JSON; they only read frameworks the
  program already imported (``sys.modules``), and never fail.
"""

from __future__ import annotations

import sys
from typing import Any

from ..bench.common import error_text


# -- can the benchmark run here? ---------------------------------------------------------------------
def gpu_unavailable(backend: str) -> str | None:
    """None when ``backend`` (``"torch"`` or ``"paddle"``) sees a CUDA GPU, else why not (imports the framework)."""
    if backend == "torch":
        import torch

        if not torch.backends.cuda.is_built():
            return f"torch {torch.__version__} is a CPU build"
        if not torch.cuda.is_available():
            return f"torch {torch.__version__} sees no CUDA device"
        return None
    import paddle

    if not paddle.is_compiled_with_cuda():
        return f"paddle {paddle.__version__} is a CPU build"
    if paddle.device.cuda.device_count() == 0:
        return f"paddle {paddle.__version__} sees no CUDA device"
    return None


def cuda_gpus() -> tuple[int, str]:
    """(CUDA devices torch sees, a description)."""
    import torch

    if not torch.backends.cuda.is_built():
        return 0, f"torch {torch.__version__} is a CPU build"
    if not torch.cuda.is_available():
        return 0, f"torch {torch.__version__} sees no CUDA device"
    count = torch.cuda.device_count()
    return count, f"torch {torch.__version__} sees {count} CUDA device{'s' if count != 1 else ''}"


# -- the device description of the JSON ------------------------------------------------------------
def torch_info() -> dict[str, Any]:
    """torch's version, CUDA version and, with a GPU, its name, count, capability and cuDNN (torch must be
    imported already); a failed query is recorded under ``"error"``."""
    torch = sys.modules["torch"]
    info: dict[str, Any] = {"version": torch.__version__, "cuda": getattr(torch.version, "cuda", None)}
    try:
        info["cuda_available"] = bool(torch.cuda.is_available())
        if info["cuda_available"]:
            idx = torch.cuda.current_device()
            info["gpu"] = torch.cuda.get_device_name(idx)
            info["gpu_count"] = torch.cuda.device_count()
            info["capability"] = ".".join(str(v) for v in torch.cuda.get_device_capability(idx))
            info["cudnn"] = torch.backends.cudnn.version()
    except Exception as exc:  # describing the machine must never fail the benchmark
        info["error"] = error_text(exc)
    return info


def paddle_info() -> dict[str, Any]:
    """paddle's version and, when compiled with CUDA, the CUDA version, GPU count and name (paddle must be
    imported already); a failed query is recorded under ``"error"``."""
    paddle = sys.modules["paddle"]
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
        info["error"] = error_text(exc)
    return info
