"""Paddle: finding CPU-GPU syncs in a warmup run (torch's job of the same name is ``backends/torch/syncs.py``).

Paddle has no sync debug mode: for the block, the Tensor methods and module functions that copy device memory to
the host are replaced by recorders, for the calling thread only (other threads call through unchanged), so that a
sync is reported before any capture begins.  Guarantees: the block runs to its end (a recorder never raises) and
every replaced attribute is put back when it ends.  Limits: a sync made another way (a kernel that waits, a C++
call) is found only when the capture fails on it.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator
from typing import Any

import paddle

from ..base import in_island

SYNC_HINT = (
    "the function synchronises the CPU with the GPU (for example .numpy(), .item(), .tolist(), "
    "float(tensor), print(tensor), or Python control flow on a tensor value); a CUDA graph cannot "
    "contain that. Move the sync out of the graphed function or keep the value a tensor."
)

# Tensor methods that copy device memory to the host and so synchronise; patched (for the calling
# thread only) during the last warmup so that a sync is reported before any capture begins.
SYNC_METHODS = ("numpy", "item", "tolist", "__bool__", "__float__", "__int__", "__index__", "cpu", "__array__",
                "__str__", "__repr__", "__format__")

# Module-level functions that synchronise (or copy from the host synchronously) when called on the
# GPU; patched like SYNC_METHODS.  A capture they invalidate cannot be recovered in Paddle 2.6.
SYNC_FUNCTIONS = (("paddle", "to_tensor"), ("paddle.device", "synchronize"), ("paddle.device.cuda", "synchronize"))


@contextlib.contextmanager
def watch(hits: list[str]) -> Iterator[None]:
    """Record (never raise) every call, on this thread, of a Tensor method or function that copies
    device memory to the host (``SYNC_METHODS``, ``SYNC_FUNCTIONS``) inside the block, with the
    Python line that made it.  The methods are patched on ``paddle.Tensor`` for the block only."""
    me = threading.get_ident()
    saved: dict[str, Any] = {}

    def where() -> str:
        frame = sys._getframe(2)
        return f"{frame.f_code.co_filename}:{frame.f_lineno}"

    def guard(name: str, original: Any) -> Any:
        def patched(self_: Any, *args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() == me and not in_island() and self_.place.is_gpu_place():
                hits.append(f"Tensor.{name} on a GPU tensor at {where()}")
            return original(self_, *args, **kwargs)
        return patched

    def guard_fn(name: str, original: Any) -> Any:
        def patched(*args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() == me and not in_island():
                hits.append(f"{name} at {where()}")
            return original(*args, **kwargs)
        return patched

    for name in SYNC_METHODS:
        original = getattr(paddle.Tensor, name, None)
        if original is None:
            continue
        try:
            setattr(paddle.Tensor, name, guard(name, original))
            saved[name] = original
        except (TypeError, AttributeError):
            continue
    modules: list[tuple[Any, str, Any]] = []
    for module_name, attr in SYNC_FUNCTIONS:
        module = sys.modules.get(module_name)
        original = getattr(module, attr, None) if module is not None else None
        if original is not None:
            setattr(module, attr, guard_fn(f"{module_name}.{attr}", original))
            modules.append((module, attr, original))
    try:
        yield
    finally:
        for name, original in saved.items():
            setattr(paddle.Tensor, name, original)
        for module, attr, original in modules:
            setattr(module, attr, original)

