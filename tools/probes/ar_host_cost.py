"""Probe: where the host time of an eager custom all-reduce goes (torch), layer by layer.

An eager ``torch.distributed.all_reduce`` that graphjit swaps for its custom kernel passes through:
the published wrapper (``torch.compiler.disable``), wrapt, ``custom_ar.dispatch``,
``Communicator.call`` (settings, eligibility, stream, capture state), the ctypes call, and in C the
device guard, ``cudaStreamIsCapturing``, the copy into the staging buffer and the kernel launch.
This probe times each layer on its own, as host microseconds per call (``perf_counter_ns`` around
``--calls`` back-to-back calls, median of ``--repeats``; the GPU is synchronized between loops, not
inside them), and records a ``torch.profiler`` table of the full call for the CUDA runtime calls.

Host time is what it measures, not GPU time: with 2 GPUs (one rank per GPU, NCCL group) the
numbers are the real configuration's, and NCCL's eager call is timed too; with 1 GPU (shared mode:
both ranks on GPU 0, ``GRAPHJIT_AR_SHARED_GPU=1``, gloo group) the kernels take turns on the GPU,
so only the host-side numbers mean anything (the launch queue absorbs ``--calls`` launches).

Usage (GPU machine, repo root): ``PYTHONPATH=. python3 tools/probes/ar_host_cost.py --out DIR``.
Writes ``DIR/ar_host_cost.json`` (rank 0's numbers and the profiler table).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

WORLD = 2


def _time(fn: Callable[[], Any], calls: int, repeats: int, sync: Callable[[], None],
          barrier: Callable[[], None]) -> dict[str, float]:
    per_call = []
    for _ in range(repeats):
        barrier()
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        per_call.append((time.perf_counter_ns() - t0) / calls / 1000.0)
        sync()
    return {"median_us": round(statistics.median(per_call), 3), "min_us": round(min(per_call), 3)}


def worker(rank: int, args: argparse.Namespace, out: dict[str, Any]) -> None:
    import torch
    import torch.distributed as dist

    import graphjit
    from graphjit import env
    from graphjit.backends.dist_base import Call
    from graphjit.collectives import custom_ar

    gpus = torch.cuda.device_count()
    shared = gpus < WORLD
    device = 0 if shared else rank
    torch.cuda.set_device(device)
    backend = "gloo" if shared else "nccl"
    dist.init_process_group(backend, init_method=f"file://{args.out / 'rendezvous'}", rank=rank, world_size=WORLD)
    out.update(rank=rank, shared_gpu=shared, backend=backend, gpu=torch.cuda.get_device_name(device),
               torch=torch.__version__, python=sys.version.split()[0])
    original = dist.all_reduce  # before the swap
    report = graphjit.collectives.init(max_bytes=1 << 20, scope="always")
    out["init"] = report.as_dict()
    if not report:
        raise RuntimeError(f"collectives.init failed: {report.reason}")
    comm = custom_ar.communicators()[0]
    lib, ctx = comm.lib, comm.ctx
    dtype = torch.bfloat16
    n = args.bytes // 2
    x = torch.ones(n, device=f"cuda:{device}", dtype=dtype)
    stream = torch.cuda.current_stream(device).cuda_stream
    call = Call(x, dist.ReduceOp.SUM, None, False)
    torch_dist = comm.dist

    def sync() -> None:
        torch.cuda.synchronize(device)

    def barrier() -> None:
        sync()
        dist.barrier()

    def timed(fn: Callable[[], Any], gpu_work: bool = True) -> dict[str, float]:
        return _time(fn, args.calls if gpu_work else 10 * args.calls, args.repeats, sync, barrier)

    layers: dict[str, dict[str, float]] = {}
    # no GPU work: the pieces of Communicator.call
    layers["py_env_settings"] = timed(env.settings, False)
    layers["py_tensor_info"] = timed(lambda: torch_dist.tensor_info(x), False)
    layers["py_current_stream"] = timed(lambda: torch_dist.current_stream(device), False)
    layers["py_capturing"] = timed(torch_dist.capturing, False)
    layers["py_parse_call"] = timed(lambda: torch_dist.parse_call((x,), {}), False)
    layers["ctypes_trivial_call"] = timed(lambda: lib.choose_algo(2, 4096), False)  # no CUDA work: ctypes alone
    # GPU work, each layer adds to the one before
    layers["torch_add_"] = timed(lambda: x.mul_(1))
    layers["c_launch_only"] = timed(lambda: lib.all_reduce(ctx, comm.staging, comm.staging, n, 2, 1, stream))
    layers["c_copy_and_launch"] = timed(lambda: lib.all_reduce(ctx, x.data_ptr(), x.data_ptr(), n, 2, 1, stream))
    if "push" in custom_ar.ALGO_CODES:  # the push branch: zero-copy eager (no staging copy)
        push = custom_ar.ALGO_CODES["push"]
        layers["c_push_launch"] = timed(lambda: lib.all_reduce(ctx, x.data_ptr(), x.data_ptr(), n, 2, push, stream))
    layers["communicator_call"] = timed(lambda: comm.call(call, original, (x,), {}))
    layers["dispatch"] = timed(lambda: custom_ar.dispatch(torch_dist, original, (x,), {}))
    layers["swapped_all_reduce"] = timed(lambda: dist.all_reduce(x))
    if not shared:
        layers["nccl_all_reduce"] = timed(lambda: original(x))
    out["layers"] = layers

    from torch.profiler import ProfilerActivity, profile
    barrier()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(args.calls):
            dist.all_reduce(x)
        sync()
    out["profile_swapped"] = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
    out["stats"] = graphjit.collectives.stats()
    barrier()
    graphjit.collectives.shutdown()


def main_worker(rank: int, args: argparse.Namespace) -> None:
    out: dict[str, Any] = {}
    try:
        worker(rank, args, out)
        out["ok"] = True
    except BaseException:
        out["ok"] = False
        out["error"] = traceback.format_exc()
    (args.out / f"ar_host_cost_rank{rank}.json").write_text(json.dumps(out, indent=1))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--bytes", type=int, default=4096, help="message size (bfloat16), default 4096")
    p.add_argument("--calls", type=int, default=200, help="calls per timed loop")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--timeout", type=float, default=300)
    args = p.parse_args()
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "rendezvous").unlink(missing_ok=True)
    import torch
    import torch.multiprocessing as tmp

    if torch.cuda.device_count() < WORLD:
        os.environ["GRAPHJIT_AR_SHARED_GPU"] = "1"
    ctx = tmp.get_context("spawn")
    procs = [ctx.Process(target=main_worker, args=(r, args)) for r in range(WORLD)]
    for proc in procs:
        proc.start()
    deadline = time.time() + args.timeout
    for proc in procs:
        proc.join(max(1.0, deadline - time.time()))
    hung = [r for r, proc in enumerate(procs) if proc.is_alive()]
    for proc in procs:
        if proc.is_alive():
            proc.kill()
    results = []
    for r in range(WORLD):
        path = args.out / f"ar_host_cost_rank{r}.json"
        results.append(json.loads(path.read_text()) if path.exists() else {"ok": False, "error": "no output"})
        path.unlink(missing_ok=True)  # the summary holds every rank's section
    (args.out / "rendezvous").unlink(missing_ok=True)
    summary = {"probe": "ar_host_cost", "bytes": args.bytes, "calls": args.calls, "repeats": args.repeats,
               "hung_ranks": hung, "ranks": results}
    (args.out / "ar_host_cost.json").write_text(json.dumps(summary, indent=1))
    for r, res in enumerate(results):
        if not res.get("ok"):
            sys.stderr.write(f"rank {r}: {res.get('error')}\n")
    layers = results[0].get("layers", {})
    width = max((len(k) for k in layers), default=10)
    for name, v in layers.items():
        sys.stdout.write(f"{name:<{width}}  {v['median_us']:8.2f} us  (min {v['min_us']:.2f})\n")
    sys.stdout.write(results[0].get("profile_swapped", "") + "\n")
    return 0 if all(r.get("ok") for r in results) and not hung else 1


if __name__ == "__main__":
    raise SystemExit(main())
