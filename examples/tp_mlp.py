"""A tensor-parallel MLP on 2 processes, graphed with ``@graphjit.graphed`` (torch.distributed).

Megatron-style: the first linear is split by columns (each rank holds FFN/world columns of W1 and
b1), the second by rows (each rank holds the matching FFN/world rows of W2), so each rank computes a
partial output and one ``all_reduce`` (SUM) completes it; b2 is added after the reduce.  Every rank
then checks its result against a single-process reference computed with the full weights.

With 2 GPUs the processes use NCCL and each captures its step (matmuls and the all-reduce) into a
CUDA graph; ``graphjit.collectives.init()`` swaps the captured ``dist.all_reduce`` for graphjit's
custom kernel (``--no-custom-ar``: NCCL inside the graph), and rank 0 prints which one ran.
Otherwise they use gloo on the CPU and graphjit runs the function uncaptured (one log line per rank
says "no CUDA graph ..."; the custom all-reduce says why it is off).  Weights are closed over: a
graph uses them by address.

``--backend shared`` tries the GPU path on a machine with one GPU: every rank on ``cuda:0``, a gloo
group (NCCL refuses two ranks on one GPU) and ``GRAPHJIT_AR_SHARED_GPU=1``, graphjit's test mode in
which the custom all-reduce runs across processes that share a GPU.  The steps are captured and the
captured all-reduce is the custom kernel, but the ranks' kernels take turns on the GPU (slow), and an
all-reduce that falls back (``--no-custom-ar``) cannot run inside a graph with gloo, so graphjit runs
that step uncaptured.

    python examples/tp_mlp.py [--steps 5] [--world-size 2] [--backend auto|gloo|nccl|shared] [--no-custom-ar]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

BATCH, HIDDEN, FFN = 8, 128, 512


def full_weights(torch):
    """The unsplit weights, identical on every rank (same seed), in float64 for the reference."""
    g = torch.Generator().manual_seed(0)
    w1 = torch.randn(HIDDEN, FFN, generator=g, dtype=torch.float64) / HIDDEN**0.5
    b1 = torch.randn(FFN, generator=g, dtype=torch.float64) * 0.1
    w2 = torch.randn(FFN, HIDDEN, generator=g, dtype=torch.float64) / FFN**0.5
    b2 = torch.randn(HIDDEN, generator=g, dtype=torch.float64) * 0.1
    return w1, b1, w2, b2


def step_input(torch, step: int):
    """The same activations on every rank (tensor parallelism splits weights, not the batch)."""
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(BATCH, HIDDEN, generator=g, dtype=torch.float64)


def reference(torch, x, weights):
    w1, b1, w2, b2 = weights
    return torch.nn.functional.gelu(x @ w1 + b1) @ w2 + b2


def worker(rank: int, world: int, backend: str, init_file: str, steps: int, custom_ar: bool) -> None:
    """One rank.  Ends the process with os._exit (after flushing) so that no teardown can hang it."""
    code = 1
    try:
        logging.basicConfig(level=logging.INFO, format=f"[rank {rank}] %(message)s", stream=sys.stdout)
        code = run_rank(rank, world, backend, init_file, steps, custom_ar)
    except BaseException:
        traceback.print_exc()
        print(f"[rank {rank}] FAILED", flush=True)
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)


def run_rank(rank: int, world: int, backend: str, init_file: str, steps: int, custom_ar: bool) -> int:
    import torch
    import torch.distributed as dist

    import graphjit
    import graphjit.collectives

    device = {"nccl": torch.device(f"cuda:{rank}"), "shared": torch.device("cuda:0")}.get(backend, torch.device("cpu"))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    group_backend = "gloo" if backend == "shared" else backend
    dist.init_process_group(group_backend, init_method=f"file://{init_file}", rank=rank, world_size=world)
    if custom_ar:  # on every rank, after the process group: off (with its reason) where it cannot run
        graphjit.collectives.init()

    full = full_weights(torch)
    shard = FFN // world
    cols = slice(rank * shard, (rank + 1) * shard)
    w1, b1, w2, b2 = full
    # This rank's shards, float32 on its device: W1/b1 by columns, W2 by rows, b2 whole.
    w1_r = w1[:, cols].float().contiguous().to(device)
    b1_r = b1[cols].float().contiguous().to(device)
    w2_r = w2[cols, :].float().contiguous().to(device)
    b2_r = b2.float().to(device)

    @graphjit.graphed
    def tp_mlp(x):
        h = torch.nn.functional.gelu(x @ w1_r + b1_r)  # column-parallel: this rank's FFN/world features
        y = h @ w2_r  # row-parallel: a partial sum of the output
        dist.all_reduce(y)  # SUM over ranks completes it
        return y + b2_r

    worst = 0.0
    t0 = time.perf_counter()
    with torch.no_grad():
        for s in range(steps):
            x64 = step_input(torch, s)
            out = tp_mlp(x64.float().to(device))
            want = reference(torch, x64, full)
            err = float((out.double().cpu() - want).norm() / want.norm())
            worst = max(worst, err)
    elapsed = time.perf_counter() - t0
    ok = worst < 1e-5
    print(f"[rank {rank}] {backend} on {device}: {steps} steps in {elapsed:.2f} s; max relative difference vs the "
          f"single-process reference: {worst:.2e} ({'ok' if ok else 'MISMATCH'})", flush=True)
    if rank == 0:
        print(tp_mlp.report(), flush=True)
        ar = graphjit.collectives.stats()
        ran = f"graphjit's custom kernel for {ar['custom']['captured']} captured all-reduce(s)" \
            if ar["custom"]["captured"] else "the framework's all_reduce"
        why = "; ".join(f"{k} x{n}: {ar['reasons'].get(k, '')}" for k, n in ar["fallbacks"].items())
        print(f"all-reduce: {ran}" + (f" (fallbacks: {why})" if why else ""), flush=True)
    if custom_ar:
        graphjit.collectives.shutdown()
    dist.barrier()
    dist.destroy_process_group()
    return 0 if ok else 3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--world-size", type=int, default=2, help=f"processes (FFN={FFN} must divide by it)")
    parser.add_argument("--backend", choices=["auto", "gloo", "nccl", "shared"], default="auto",
                        help="auto: nccl when there is a GPU per process, else gloo on the CPU; shared: every "
                             "process on GPU 0 (graphjit's shared-GPU test mode, for a machine with one GPU)")
    parser.add_argument("--no-custom-ar", dest="custom_ar", action="store_false",
                        help="leave dist.all_reduce to the framework (NCCL inside the graph)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds to wait for the processes")
    args = parser.parse_args()
    if FFN % args.world_size:
        parser.error(f"--world-size must divide {FFN}")

    import torch
    import torch.multiprocessing as mp

    backend = args.backend
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= args.world_size else "gloo"
    if backend == "nccl" and torch.cuda.device_count() < args.world_size:
        parser.error(f"--backend nccl needs {args.world_size} GPUs, this machine has {torch.cuda.device_count()}")
    if backend == "shared":
        if not torch.cuda.is_available():
            parser.error("--backend shared needs a CUDA GPU")
        os.environ["GRAPHJIT_AR_SHARED_GPU"] = "1"  # read by graphjit in the ranks (spawned with this environment)

    ctx = mp.get_context("spawn")  # a fresh interpreter per rank (CUDA cannot be forked)
    with tempfile.TemporaryDirectory(prefix="graphjit-tp-") as tmp:
        init_file = str(Path(tmp) / "rendezvous")  # a FileStore: no port to pick, no race
        procs = [ctx.Process(target=worker, args=(r, args.world_size, backend, init_file, args.steps, args.custom_ar))
                 for r in range(args.world_size)]
        for p in procs:
            p.start()
        deadline = time.monotonic() + args.timeout
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
        codes = []
        for r, p in enumerate(procs):
            if p.is_alive():  # a rank hung (a peer died mid-collective, say): stop the ones we started
                print(f"rank {r} did not finish within {args.timeout:.0f} s; stopping it", file=sys.stderr)
                p.kill()
                p.join(10)
            codes.append(p.exitcode)
    if any(c != 0 for c in codes):
        print(f"tp_mlp: FAILED (exit codes per rank: {codes})", file=sys.stderr)
        return 1
    print(f"tp_mlp: {args.world_size} ranks, graphed result matches the single-process reference")
    return 0


if __name__ == "__main__":
    sys.exit(main())
