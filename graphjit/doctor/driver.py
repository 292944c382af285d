"""The CUDA driver API through ctypes (``libcuda``), without any framework: driver version, device count,
peer access.  Best effort: every query returns None (or 0) when the library is missing or a call fails."""

from __future__ import annotations

import ctypes
from typing import Any


class CudaDriver:
    """The CUDA driver API through ctypes (best effort): version, device count, peer access."""

    def __init__(self) -> None:
        """Load ``libcuda`` and ``cuInit``; on failure ``lib`` is None and ``error`` says why."""
        self.lib: Any = None
        self.error: str | None = None
        for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll", "libcuda.dylib"):
            try:
                self.lib = ctypes.CDLL(name)
                break
            except OSError:
                continue
        if self.lib is None:
            self.error = "libcuda (the NVIDIA driver library) is not installed"
            return
        rc = self.lib.cuInit(0)
        if rc != 0:
            self.error = f"cuInit failed with CUDA driver error {rc}"
            self.lib = None

    def version(self) -> tuple[int, int] | None:
        """The CUDA version the driver supports, ``(major, minor)``; None if unknown."""
        if self.lib is None:
            return None
        v = ctypes.c_int(0)
        if self.lib.cuDriverGetVersion(ctypes.byref(v)) != 0:
            return None
        return v.value // 1000, (v.value % 1000) // 10

    def count(self) -> int:
        """How many CUDA devices the driver sees (0 if unknown)."""
        n = ctypes.c_int(0)
        if self.lib is None or self.lib.cuDeviceGetCount(ctypes.byref(n)) != 0:
            return 0
        return n.value

    def can_access_peer(self, i: int, j: int) -> bool | None:
        """Whether device ``i`` can access device ``j``'s memory; None if unknown."""
        if self.lib is None:
            return None
        a, b, ok = ctypes.c_int(0), ctypes.c_int(0), ctypes.c_int(0)
        if self.lib.cuDeviceGet(ctypes.byref(a), i) or self.lib.cuDeviceGet(ctypes.byref(b), j):
            return None
        if self.lib.cuDeviceCanAccessPeer(ctypes.byref(ok), a, b) != 0:
            return None
        return bool(ok.value)

