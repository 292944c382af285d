"""The BLAS workspaces of graphjit's capture stream, made outside every capture (:func:`prime`).

torch keeps one cuBLAS and one cuBLASLt workspace per (handle, stream); a capture must find the ones of its stream made
already, or they come from the graph's memory pool and pin it.  torch 2.11 keeps them while graphs captured with them
live and after one of those is reset (``tools/probes/cublas_workspace_reset.py`` on an H200); a torch that frees a
stream's workspaces when a graph of that stream is destroyed (pytorch#193402) would free them under graphjit's other
graphs of the same capture stream, which nothing here guards against.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

import torch

PRODUCT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
"""The dtypes the priming's cuBLASLt product may take (those torch's addmm sends to cuBLASLt)."""

_product: dict[int, torch.dtype] = {}  # device index -> the dtype of the priming's product, chosen at its first capture
_lock = threading.Lock()


def prime(stream: Any, index: int, operands: Callable[[], Iterable[Any]] | None = None) -> None:
    """Make cuBLAS and cuBLASLt give this thread's handle a workspace for ``stream`` outside the capture.

    torch caches one workspace per (handle, stream) and library and allocates it at the first use of the library on
    that stream; made during a capture, it comes from the graph's pool and pins that pool's memory for as long as the
    process lives (a dropped function would never give its pool back).  Per capture (a lookup once the workspaces
    exist): cuBLAS's through ``torch.cuda.current_blas_handle()``, which sets the handle's workspace for the current
    stream and launches nothing, and cuBLASLt's through one tiny product with a bias (addmm: cuBLASLt).  The workspaces
    do not depend on the dtype: one product, not one per dtype and library (0.13 ms a capture instead of 0.22 on the
    H200).  Its dtype is :func:`product_dtype`'s for the device (fp32 until one is found): the first product of a dtype
    loads its kernels, 64-90 ms for fp32 where the function computes in bf16 and 3-5 ms in bf16 (one H100);
    ``tools/probes/blas_workspace_pool.py`` shows the priming is needed and enough, in any of these dtypes."""
    device = f"cuda:{index}"
    with _lock:
        dtype = _product.get(index)
        if dtype is None:
            dtype = product_dtype(operands, device)
            if dtype is not None:
                _product[index] = dtype
    with torch.cuda.stream(stream), torch.no_grad():
        # zeros: a memory checker's initcheck reads no garbage
        a = torch.zeros(8, 8, device=device, dtype=dtype or torch.float32)
        try:
            torch.cuda.current_blas_handle()
        except Exception:  # a torch without it: a product reaches cuBLAS
            torch.mm(a, a)
        torch.nn.functional.linear(a, a, a[0])


def product_dtype(operands: Callable[[], Iterable[Any]] | None, device: str) -> torch.dtype | None:
    """The dtype the function's products run in, as far as a capture can tell beforehand: autocast's where autocast
    is on for ``device``'s type (fp32 weights then multiply in it), else the dtype of :data:`PRODUCT_DTYPES` that
    holds the most bytes among the tensors ``operands()`` gives on ``device`` (a model's weights outweigh its fp32
    buffers).  None where neither says (no operands, none of those dtypes there, ``operands`` failed): the device's
    choice is then left to a later capture."""
    want = torch.device(device)
    try:
        if torch.is_autocast_enabled(want.type):
            auto = torch.get_autocast_dtype(want.type)
            if auto in PRODUCT_DTYPES:
                return auto
    except (AttributeError, TypeError, RuntimeError):  # a torch without the per-device autocast queries
        pass
    if operands is None:
        return None
    sizes: dict[torch.dtype, int] = {}
    try:
        for t in operands():
            if isinstance(t, torch.Tensor) and t.dtype in PRODUCT_DTYPES and t.device == want:
                sizes[t.dtype] = sizes.get(t.dtype, 0) + t.numel() * t.element_size()
    except Exception:  # (a tensor subclass that fails to say its dtype or size): as without them
        return None
    return max(sizes, key=lambda d: sizes[d]) if sizes else None
