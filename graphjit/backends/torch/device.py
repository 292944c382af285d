"""What torch says about this machine's GPUs: the one answer to "can torch run CUDA here" that the
backend, the all-reduce, the benchmarks and the doctor share, and the description benchmarks record."""

from __future__ import annotations

from typing import Any

import torch


def cuda_unavailable() -> str | None:
    """None when torch can run CUDA work here, else why not (a CPU build, no device)."""
    if not torch.backends.cuda.is_built() or torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU build"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA device"
    return None


def gpus() -> tuple[int, str]:
    """(CUDA devices torch sees, a description)."""
    why = cuda_unavailable()
    if why is not None:
        return 0, why
    count = torch.cuda.device_count()
    return count, f"torch {torch.__version__} sees {count} CUDA device{'s' if count != 1 else ''}"


def describe() -> dict[str, Any]:
    """torch's version, CUDA version and, with a GPU, its name, count, capability and cuDNN; a failed query is
    recorded under ``"error"`` (describing the machine never fails)."""
    info: dict[str, Any] = {"version": torch.__version__, "cuda": getattr(torch.version, "cuda", None)}
    try:
        info["cuda_available"] = bool(torch.cuda.is_available())
        if info["cuda_available"]:
            idx = torch.cuda.current_device()
            info["gpu"] = torch.cuda.get_device_name(idx)
            info["gpu_count"] = torch.cuda.device_count()
            info["capability"] = ".".join(str(v) for v in torch.cuda.get_device_capability(idx))
            info["cudnn"] = torch.backends.cudnn.version()
    except Exception as exc:
        info["error"] = f"{type(exc).__name__}: {exc}"
    return info
