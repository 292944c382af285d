"""Probe: the all-reduce C API across 2 processes that share ONE GPU (CUDA IPC, time-sliced).

What it exercises that the single-process tests (tests/test_gpu_ar_local.py) cannot: buffers
mapped from another process with cudaIpcOpenMemHandle (gj_ar_create), the write-and-verify probe
through those mappings, and the registration of captured inputs by IPC handle
(gj_ar_pending_handles / gj_ar_register_pending).  What it cannot show: anything about P2P
between GPUs, or timings (two processes on one GPU take turns; a call costs time slices).

Each rank: alloc + handle exchange (pipes), create, probe, eager one-shot/two-shot all-reduces
checked exactly, a captured graph registered by handle and replayed with new inputs, checked
exactly.  Writes JSON with per-step results and seconds.

Usage (GPU machine, repo root): ``PYTHONPATH=. python3 tools/probes/ar_two_process_one_gpu.py --out DIR``
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

WORLD = 2
MAX_BYTES = 1 << 20


def worker(rank: int, conn: Any, replays: int, out: dict[str, Any]) -> None:
    import torch

    from graphjit.collectives import csrc_build, library

    steps: dict[str, Any] = {}
    out.update(rank=rank, steps=steps)
    t_all = time.perf_counter()

    def exchange(obj: Any) -> list[Any]:
        conn.send(obj)
        other = conn.recv()
        return [obj, other] if rank == 0 else [other, obj]

    torch.cuda.set_device(0)
    major, minor = torch.cuda.get_device_capability()
    lib = library.load(f"sm_{major}{minor}")
    header = lib.limits()["header_bytes"]
    signal, sh = lib.alloc(0, header + MAX_BYTES)
    staging, th = lib.alloc(0, MAX_BYTES)
    handles = exchange((sh, th))
    ctx = lib.create(rank, WORLD, 0, [h[0] for h in handles], signal, header + MAX_BYTES, [h[1] for h in handles],
                     staging, MAX_BYTES, 64, 8, 60.0)
    steps["create"] = "ok"
    stream = torch.cuda.current_stream().cuda_stream
    token = exchange(12345 + rank)[0]
    lib.probe_write(ctx, token, stream)
    exchange("wrote")
    mask = lib.probe_check(ctx, token, stream)
    steps["probe_mask"] = mask
    exchange("checked")

    # eager, exact: integer-valued float32
    wrong = 0
    t0 = time.perf_counter()
    calls = 0
    for algo in (1, 2):
        for n in (4, 1000 * 4, 65536 + 4 * 7, MAX_BYTES // 4):
            base = (torch.arange(n, device="cuda", dtype=torch.float32) % 97) + 1
            x = base * (rank + 1)
            lib.all_reduce(ctx, x.data_ptr(), x.data_ptr(), n, 0, algo, stream)
            torch.cuda.synchronize()
            wrong += int((x != base * 3).sum())
            calls += 1
    steps["eager"] = {"calls": calls, "wrong_elements": wrong, "seconds": round(time.perf_counter() - t0, 3)}

    # captured: zero copy, registered by IPC handle, replayed with new inputs
    buf = torch.zeros(4096, device="cuda")
    half = torch.zeros(65536 + 8, device="cuda", dtype=torch.float16)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        s = torch.cuda.current_stream().cuda_stream
        lib.all_reduce(ctx, buf.data_ptr(), buf.data_ptr(), buf.numel(), 0, 1, s)
        lib.all_reduce(ctx, half.data_ptr(), half.data_ptr(), half.numel(), 1, 2, s)
    count = lib.pending(ctx)
    hs, offs = lib.pending_handles(ctx, count)
    every = exchange((hs, offs))
    lib.register_pending(ctx, count, [e[0] for e in every], [e[1] for e in every], stream)
    steps["registered"] = count
    exchange("registered")
    wrong_graph = torch.zeros((), dtype=torch.int64, device="cuda")
    base32 = (torch.arange(4096, device="cuda", dtype=torch.float32) % 13) - 6
    base16 = ((torch.arange(65536 + 8, device="cuda") % 7) - 3).to(torch.float16)
    t0 = time.perf_counter()
    for it in range(replays):
        shift = it % 5 - 2
        torch.add(base32 * (rank + 1), shift, out=buf)
        torch.add(base16 * (rank + 1), shift, out=half)
        g.replay()
        wrong_graph += (buf != base32 * 3 + 2 * shift).sum() + (half != base16 * 3 + 2 * shift).sum()
    torch.cuda.synchronize()
    steps["graph"] = {"replays": replays, "wrong_elements": int(wrong_graph),
                      "seconds": round(time.perf_counter() - t0, 3)}
    exchange("done")
    lib.reset(ctx)
    lib.destroy(ctx)
    lib.free(0, signal)
    lib.free(0, staging)
    out["seconds"] = round(time.perf_counter() - t_all, 3)


def main_worker(rank: int, conn: Any, replays: int, path: str) -> None:
    out: dict[str, Any] = {}
    try:
        worker(rank, conn, replays, out)
        out["ok"] = True
    except BaseException:
        out["ok"] = False
        out["error"] = traceback.format_exc()
    Path(path).write_text(json.dumps(out, indent=1))
    sys.stdout.flush()
    os._exit(0)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--replays", type=int, default=1000)
    p.add_argument("--timeout", type=float, default=240)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    ctx = mp.get_context("spawn")
    a, b = ctx.Pipe()
    paths = [str(args.out / f"ar_2proc_rank{r}.json") for r in range(WORLD)]
    procs = [ctx.Process(target=main_worker, args=(r, conn, args.replays, paths[r])) for r, conn in enumerate((a, b))]
    for proc in procs:
        proc.start()
    deadline = time.time() + args.timeout
    for proc in procs:
        proc.join(max(1.0, deadline - time.time()))
    for proc in procs:
        if proc.is_alive():
            proc.kill()
    result = {"ranks": [json.loads(Path(q).read_text()) if Path(q).exists() else {"ok": False, "error": "no result"}
                        for q in paths]}
    result["ok"] = all(r.get("ok") for r in result["ranks"])
    (args.out / "ar_2proc_one_gpu.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
