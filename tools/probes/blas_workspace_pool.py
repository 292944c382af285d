"""Probe (GPU): is graphjit's priming of the BLAS workspaces needed, and enough?  In a fresh process, the first capture
of bf16 products through cuBLAS (``mm``) and cuBLASLt (``linear`` with a bias); after dropping the function, the
memory pools that still hold segments.  ``--no-prime`` replaces graphjit's priming by nothing: a graph pool left in the
list is a workspace made inside the capture (what ``test_the_first_capture_of_a_process_leaves_no_blas_workspace_in_
its_pool`` checks does not happen).  ``--cublas-only`` keeps the priming's ``current_blas_handle()`` and drops its
cuBLASLt product: with ``--library cublaslt``, no graph pool left means cuBLASLt uses the cuBLAS workspace of the
stream (torch's unified workspaces), so the product is not needed on that torch (torch 2.11 leaves a pool: it is);
``prime_s`` is the first priming's seconds.  ``--dtype`` has graphjit's priming compute in that dtype (without it, in
the function's: bf16 here): the first product of a dtype loads its kernels (3-5 ms in bf16, 64-90 ms in fp32 on an
H100).  ``--library`` picks the function's product: ``both``, ``cublas`` or ``cublaslt``."""

from __future__ import annotations

import argparse
import gc
import json
import time
from typing import Any

import torch

import graphjit


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--no-prime", action="store_true")
    p.add_argument("--cublas-only", action="store_true")
    p.add_argument("--library", choices=("both", "cublas", "cublaslt"), default="both")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None)
    a = p.parse_args()
    from graphjit.backends.torch import workspaces

    timed: dict[str, float] = {}
    real_prime = workspaces.prime

    def cublas_only(stream: torch.cuda.Stream, index: int, operands: Any = None) -> None:
        with torch.cuda.stream(stream):
            torch.cuda.current_blas_handle()

    def of_dtype(stream: torch.cuda.Stream, index: int, operands: Any = None) -> None:
        # graphjit's own priming, told the function computes in --dtype (the process's first capture chooses it)
        real_prime(stream, index, lambda: [torch.zeros(1, device=f"cuda:{index}", dtype=getattr(torch, a.dtype))])

    chosen = (lambda stream, index, operands=None: None) if a.no_prime else cublas_only if a.cublas_only else \
        of_dtype if a.dtype else real_prime

    def prime(stream: torch.cuda.Stream, index: int, operands: Any = None) -> None:
        t0 = time.perf_counter()
        chosen(stream, index, operands)
        torch.cuda.synchronize()
        timed.setdefault("prime_s", time.perf_counter() - t0)

    workspaces.prime = prime
    dev = torch.device("cuda", 0)
    w = torch.randn(1024, 1024, device=dev, dtype=torch.bfloat16)
    b = torch.randn(1024, device=dev, dtype=torch.bfloat16)
    x = torch.randn(64, 1024, device=dev, dtype=torch.bfloat16)

    def step(x: torch.Tensor) -> torch.Tensor:
        if a.library == "cublas":
            return x @ w
        if a.library == "cublaslt":
            return torch.nn.functional.linear(x, w, b)
        return torch.nn.functional.linear(x @ w, w, b)

    torch.cuda.synchronize()
    f = graphjit.graphed(step)
    with torch.no_grad():
        for _ in range(4):
            f(x)
    replays = f.stats()["replays"]
    del f
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    pools = sorted({tuple(s["segment_pool_id"]) for s in torch.cuda.memory_snapshot()})
    print(json.dumps({"no_prime": a.no_prime, "cublas_only": a.cublas_only, "library": a.library, "dtype": a.dtype,
                      "replays": replays,
                      "pools": pools, **timed}))


if __name__ == "__main__":
    main()
