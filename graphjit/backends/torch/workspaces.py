"""The BLAS workspaces of graphjit's capture stream, made outside every capture (:func:`prime`).

torch keeps one cuBLAS and one cuBLASLt workspace per (handle, stream); a capture must find the ones of its stream made
already, or they come from the graph's memory pool and pin it.  torch 2.11 keeps them while graphs captured with them
live and after one of those is reset (``tools/probes/cublas_workspace_reset.py`` on an H200); a torch that frees a
stream's workspaces when a graph of that stream is destroyed (pytorch#193402) would free them under graphjit's other
graphs of the same capture stream, which nothing here guards against.
"""

from __future__ import annotations

from typing import Any

import torch


def prime(stream: Any, index: int) -> None:
    """Make cuBLAS and cuBLASLt give this thread's handle a workspace for ``stream`` outside the capture.

    torch caches one workspace per (handle, stream) and library and allocates it at the first use of the library on
    that stream; made during a capture, it comes from the graph's pool and pins that pool's memory for as long as the
    process lives (a dropped function would never give its pool back).  Per capture (a lookup once the workspaces
    exist): cuBLAS's through ``torch.cuda.current_blas_handle()``, which sets the handle's workspace for the current
    stream and launches nothing, and cuBLASLt's through one tiny fp32 product with a bias (addmm: cuBLASLt).  The
    workspaces do not depend on the dtype: one product, not one per dtype and library (0.13 ms a capture instead of
    0.22 on the H200).  The first capture of a process still pays for starting cuBLASLt where nothing used it yet
    (about 60-70 ms there); ``tools/probes/blas_workspace_pool.py`` shows the priming is needed and enough."""
    with torch.cuda.stream(stream), torch.no_grad():
        a = torch.zeros(8, 8, device=f"cuda:{index}")  # zeros: a memory checker's initcheck reads no garbage
        try:
            torch.cuda.current_blas_handle()
        except Exception:  # a torch without it: a product reaches cuBLAS
            torch.mm(a, a)
        torch.nn.functional.linear(a, a, a[0])
