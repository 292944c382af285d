"""What torch says about this machine's GPUs: the one answer to "can torch run CUDA here" that the
backend, the all-reduce, the benchmarks and the doctor share, the description benchmarks record, and a GPU's
current stream and architecture as the csrc library takes them."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

# The current stream's cudaStream_t as an int, without building a torch.cuda.Stream (what
# torch._inductor's get_raw_stream calls); None in a CPU build or a torch without it.
_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def raw_stream() -> Callable[[int], int] | None:
    """torch's C function that gives GPU ``device``'s current stream as an integer, where this torch has it."""
    return _RAW_STREAM


def current_stream(device: int) -> int:
    """The current stream of GPU ``device`` as a ``cudaStream_t`` integer (the all-reduce's and the batch copy's)."""
    if _RAW_STREAM is not None:
        return int(_RAW_STREAM(device))
    return int(torch.cuda.current_stream(device).cuda_stream)


def capability(device: int) -> tuple[int, int]:
    """GPU ``device``'s compute capability, ``(major, minor)``."""
    major, minor = torch.cuda.get_device_capability(device)
    return int(major), int(minor)


@functools.cache
def arch(device: int) -> str:
    """GPU ``device``'s architecture as nvcc names it (``sm_90``), read once."""
    major, minor = capability(device)
    return f"sm_{major}{minor}"


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


def reserved(index: int) -> int:
    """``torch.cuda.memory_reserved(index)`` without flattening every allocator statistic into a dict (which
    ``memory_stats`` does, a noticeable part of capturing many small graphs); torch's own call where the raw one
    is missing."""
    raw = getattr(torch._C, "_cuda_memoryStats", None)
    if raw is not None:
        try:
            return int(raw(index)["reserved_bytes"]["all"]["current"])
        except (KeyError, TypeError, RuntimeError):
            pass
    return int(torch.cuda.memory_reserved(index))
