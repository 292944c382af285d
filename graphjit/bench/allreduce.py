"""``python -m graphjit bench allreduce``: graphjit's custom all-reduce against NCCL on 2 (4, 6, 8) GPUs.

One worker process per GPU (torch, one NCCL group, as many ranks as GPUs are visible, rounded down
to 2, 4, 6 or 8, or ``--world-size``; ``python -m graphjit.bench.torch.allreduce
--worker CONFIG RANK``, started with :mod:`subprocess` by the command, rendezvous through a file in a
temporary folder), sizes 4 KiB to 64 MiB in powers of two (``--sizes``), dtype bf16 (``--dtype``).

Variants (``--variants``, all by default):

* ``nccl_eager`` / ``nccl_graph``: the framework's own ``all_reduce`` (NCCL), unwrapped
  (:func:`graphjit.collectives.swap.original`), eager and inside a CUDA graph;
* ``custom_{1shot,2shot,auto}_{eager,graph}``: ``torch.distributed.all_reduce`` as swapped by
  ``graphjit.collectives.init(scope="always", max_bytes=--ar-max-bytes)``, the algorithm forced with
  ``GRAPHJIT_AR_ALGO`` (the only switch the API offers; read at each call, at capture for graphs, and set
  alike on both ranks).  Eager calls copy through the staging buffer; captured calls are zero copy and
  registered with ``collectives.register_graph_buffers()`` right after the capture.  ``--ar-max-bytes``
  defaults to the largest size, so that the kernel itself is measured at every size (graphjit's default
  ``max_bytes`` is 8 MiB: above it, auto runs NCCL in real use);
* ``symm_two_shot_{eager,graph}``: ``torch.ops.symm_mem.two_shot_all_reduce_`` on a
  ``torch.distributed._symmetric_memory`` buffer, for reference; skipped, with the reason, when this torch
  lacks it or a 4 KiB probe fails.

Per size, each variant is first checked once against the correctly rounded sum of every rank's inputs
(``max_abs_diff``; tolerance one bf16/fp16/fp32 epsilon of the largest value, world - 1 of them for NCCL,
whose ring rounds after every hop), then timed.  A custom variant whose calls went to the framework's
collective (graphjit's ``collectives.stats()`` counts a fallback) is recorded as ``"fallback"`` with
graphjit's reasons and is not timed.  Timing, with CUDA events on the current stream, buffers holding
zeros (sums stay zero, so ``--iters`` in-place all-reduces never overflow; an all-reduce's time does not
depend on the values):

* eager: ``--iters`` back-to-back calls between two events;
* graph: ``--iters`` all-reduces captured back to back into ONE CUDA graph, the graph replayed once between
  two events (the replay's launch cost is spread over ``--iters`` all-reduces: this is the time of an
  all-reduce inside a model's graph, not of a one-all-reduce ``replay()`` call);
* before each measurement one untimed eager all-reduce of the same kind lines the two GPUs up;
* microseconds per all-reduce = event time / ``--iters``; median of ``--repeats`` measurements; the
  figure reported is the larger of the two ranks' medians (``rank_us`` has both).  ``host_us_per_call`` is
  the host's time per call in the same loop: eager figures close to it are bound by the host (Python and
  the framework's dispatch), not by the all-reduce;
* captures use ``capture_error_mode="thread_local"`` (the NCCL watchdog thread may query events meanwhile);
  captured custom all-reduces are freed with ``collectives.reset()`` after each graph variant.

The workers use GPUs 0 and 1 (``CUDA_VISIBLE_DEVICES`` picks others).

Rank 0 writes the JSON (``allreduce_<tag>.json`` under ``--out``; rewritten after every size) and the PNG
(latency against size, log-log, one line per variant) and prints the table: per size the timings, the ratio
custom auto / NCCL (in a graph and eager), the issue's targets (custom auto in a graph <= 6 us up to 256 KiB,
<= 10 us at 1 MiB, <= 20 us at 4 MiB; auto never slower than NCCL) and the measured crossovers (1shot/2shot,
NCCL/custom) to tune auto's thresholds from.  Exit status 1 when a variant failed, a result differed from NCCL,
or on GPUs a NCCL or custom variant did not run (fell back or was skipped; a fallback for "bytes > max" or "crossover"
alone is by design); the symmetric-memory reference may be skipped or fail (a note).  The targets never change
the exit status: they are results.

Safety: ``NCCL_NVLS_ENABLE=0`` and ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1`` are forced in both workers
(multicast is never enabled); the process group, a gloo side group (for the ranks' verdicts), the custom
kernel and the whole run have timeouts (``--timeout``); a worker that fails gets the other one stopped after
a grace period; every worker ends with ``os._exit`` after flushing (no interpreter teardown with NCCL and IPC
mappings alive).

Fewer than 2 CUDA GPUs: exits 1 with a one-line message, unless ``--allow-cpu``: a tiny smoke run of 2 gloo
processes on the CPU that times only the framework's all-reduce (recorded under ``nccl_eager`` with
``"backend": "gloo"``) and records the other variants as skipped with the reason.

This module is framework-neutral: options, the checks, the supervision of the workers, the worker protocol's
progress file and the combining of the ranks' results, ratios, crossovers, targets, summary, table and plot.
The worker itself (torch) is :mod:`graphjit.bench.torch.allreduce`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..procs import kill_all, supervise
from . import common
from .allreduce_results import KIB, LATENCY_TARGETS, MIB, VARIANTS, size_label
from .common import say

SUPPORTED_WORLDS = (2, 4, 6, 8)  # the custom kernel's world sizes

GPU_DEFAULTS: dict[str, Any] = {"sizes": [4 * KIB << k for k in range(15)], "iters": 100, "repeats": 10, "warmup": 10,
                                 "timeout": 1800.0}
CPU_DEFAULTS: dict[str, Any] = {"sizes": [4 * KIB, 64 * KIB], "iters": 5, "repeats": 3, "warmup": 1, "timeout": 120.0}

DTYPES = {"bf16": ("bfloat16", 2), "fp16": ("float16", 2), "fp32": ("float32", 4)}

FORCED_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
"""Set in every worker, whatever the caller's environment says: no NVLink SHARP / multicast."""
DROP_ENV = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
            "TORCHELASTIC_RUN_ID", "GRAPHJIT_AR_ALGO")
RECORDED_ENV = re.compile(r"^(NCCL_|TORCH_NCCL_|TORCH_SYMM_MEM_|GRAPHJIT_|PYTORCH_CUDA_ALLOC_CONF$|"
                          r"CUDA_VISIBLE_DEVICES$|CUDA_DEVICE_MAX_CONNECTIONS$)")
GRACE_S = 30.0  # after one worker failed or finished, how long the other may still run
COLLECTIVE_TIMEOUT_S = 300.0  # process groups (NCCL watchdog, gloo) at most; the custom kernel at most 60 s
CUSTOM_TIMEOUT_S = 60.0
WORKER_MODULE = "graphjit.bench.torch.allreduce"
"""The workers' module (torch), run as ``python -m WORKER_MODULE --worker CONFIG RANK``."""


# -- command line -----------------------------------------------------------------------------------
def size_list(text: str) -> list[int]:
    """``"4K,1M,64MiB,4096"`` -> bytes (K, M, G: powers of 1024; argparse type)."""
    out = []
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        m = re.fullmatch(r"(\d+)([KMG]?)(I?B)?", part.upper())
        if m is None:
            raise argparse.ArgumentTypeError(f"expected sizes in bytes like 4096, 4K, 1M, 64MiB; got {part!r}")
        value = int(m.group(1)) * {"": 1, "K": KIB, "M": MIB, "G": 1 << 30}[m.group(2)]
        if value <= 0:
            raise argparse.ArgumentTypeError(f"expected positive sizes, got {part!r}")
        out.append(value)
    if not out:
        raise argparse.ArgumentTypeError(f"expected comma-separated sizes, got {text!r}")
    return sorted(set(out))


def _csv_sizes(sizes: Sequence[int]) -> str:
    return ",".join(size_label(s).replace(" ", "").replace("iB", "") for s in sizes)


def max_blocks_arg(text: str) -> int:
    """``--ar-max-blocks``: an integer from 1 to 64 (the kernels' block limit)."""
    value = common.positive_int(text)
    if value > 64:
        raise argparse.ArgumentTypeError(f"expected an integer from 1 to 64, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("allreduce")
    g.add_argument("--sizes", type=size_list, default=None,
                   help=f"message sizes in bytes, comma-separated, K/M = 1024/1024^2 (default "
                        f"{_csv_sizes(GPU_DEFAULTS['sizes'][:1])}..{_csv_sizes(GPU_DEFAULTS['sizes'][-1:])} in powers "
                        f"of two; --allow-cpu on CPU: {_csv_sizes(CPU_DEFAULTS['sizes'])})")
    g.add_argument("--dtype", choices=tuple(DTYPES), default="bf16", help="element type (default bf16)")
    g.add_argument("--variants", default=None, help="comma-separated subset of: " + ",".join(VARIANTS))
    g.add_argument("--iters", type=common.positive_int, default=None,
                   help=f"all-reduces per measurement: back-to-back eager calls, or captured into one graph "
                        f"(default {GPU_DEFAULTS['iters']})")
    g.add_argument("--repeats", type=common.positive_int, default=None,
                   help=f"measurements per variant and size, median reported (default {GPU_DEFAULTS['repeats']})")
    g.add_argument("--warmup", type=common.positive_int, default=None,
                   help=f"untimed eager calls before timing an eager variant (default {GPU_DEFAULTS['warmup']})")
    g.add_argument("--ar-max-bytes", type=common.positive_int, default=None,
                   help="max_bytes of collectives.init (default: the largest size, rounded up to 16): larger "
                        "tensors fall back to NCCL and are recorded as fallback")
    g.add_argument("--ar-max-blocks", type=max_blocks_arg, default=None, metavar="1..64",
                   help="max_blocks of collectives.init: thread blocks per custom all-reduce kernel (default: "
                        "graphjit's default)")
    g.add_argument("--timeout", type=float, default=None,
                   help=f"seconds for the whole run before both workers are stopped (default "
                        f"{GPU_DEFAULTS['timeout']:.0f}; CPU smoke {CPU_DEFAULTS['timeout']:.0f})")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--allow-cpu", action="store_true",
                   help="with fewer than 2 CUDA GPUs, run a tiny smoke version (2 gloo processes on the CPU, the "
                        "framework's all-reduce only) instead of refusing")
    g.add_argument("--shared-gpu", action="store_true",
                   help="testing only: both ranks on GPU 0 of a 1-GPU machine (GRAPHJIT_AR_SHARED_GPU=1, a gloo "
                        "group): exercises the GPU code paths; the timings mean nothing (the ranks take turns)")
    g.add_argument("--world-size", type=int, default=None, choices=SUPPORTED_WORLDS,
                   help="processes, one GPU each (default: the most GPUs visible, rounded down to 2, 4, 6 or 8)")


# -- the command: checks, the 2 workers, their supervision ------------------------------------------
def child_environment(extra_path: str | None = None) -> dict[str, str]:
    """The workers' environment: the caller's, without launcher rendezvous variables and GRAPHJIT_AR_ALGO
    (set per variant), with :data:`FORCED_ENV` and graphjit importable."""
    environ = {k: v for k, v in os.environ.items() if k not in DROP_ENV}
    environ.update(FORCED_ENV)
    environ["PYTHONUNBUFFERED"] = "1"
    root = extra_path or str(Path(__file__).resolve().parents[2])
    environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, environ.get("PYTHONPATH", "")) if p)
    return environ


def _resolve(args: argparse.Namespace, on_gpu: bool) -> None:
    defaults = GPU_DEFAULTS if on_gpu else CPU_DEFAULTS
    for key, value in defaults.items():
        if getattr(args, key, None) is None:
            setattr(args, key, list(value) if isinstance(value, list) else value)


def _fail(message: str, code: int = 1) -> int:
    print(f"graphjit bench allreduce: {message}", file=sys.stderr, flush=True)
    return code


def run(args: argparse.Namespace) -> int:
    from .. import backends

    try:
        gpus, seen = backends.load("torch", "device").gpus()
    except ImportError as exc:
        return _fail(f"needs torch, which cannot be imported ({exc})")
    world = args.world_size or max([w for w in SUPPORTED_WORLDS if w <= gpus] or [2])
    shared = bool(getattr(args, "shared_gpu", False))
    if shared and gpus < 1:
        return _fail(f"--shared-gpu needs a CUDA GPU ({seen})", 2)
    if shared:
        world = 2
    on_gpu = gpus >= world or shared
    if args.world_size and gpus >= 2 and not on_gpu:
        return _fail(f"--world-size {world}: {seen}", 2)
    if not on_gpu and not args.allow_cpu:
        return _fail(f"needs 2 GPUs on one node ({seen}); run it on a machine with 2 GPUs, or pass --allow-cpu for a "
                     "tiny CPU smoke run with 2 gloo processes")
    _resolve(args, on_gpu)
    variants = list(VARIANTS) if not args.variants else [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or not variants:
        return _fail(f"unknown variant(s) {', '.join(unknown) or '(none)'}; expected some of {', '.join(VARIANTS)}", 2)
    variants = [v for v in VARIANTS if v in variants]  # the table's order
    dtype_name, elsize = DTYPES[args.dtype]
    bad = [s for s in args.sizes if s % elsize]
    if bad:
        return _fail(f"sizes must be multiples of the {args.dtype} element ({elsize} bytes): "
                     f"{', '.join(map(str, bad))}", 2)
    if not args.timeout > 0:
        return _fail(f"--timeout {args.timeout}: expected seconds > 0", 2)
    max_bytes = args.ar_max_bytes or max(args.sizes)
    max_bytes = max(16, -(-max_bytes // 16) * 16)

    tag = common.machine_tag(args)
    json_path, png_path = common.output_paths(args.out, f"allreduce_{tag}.json")
    json_path, png_path = json_path.resolve(), png_path.resolve()
    data = common.header("allreduce", args, tag)
    data.update({
        "device": "cuda" if on_gpu else "cpu",
        "smoke": not on_gpu or shared,
        "shared_gpu": shared,
        "world_size": world,
        "config": {
            "sizes": args.sizes, "dtype": args.dtype, "torch_dtype": dtype_name, "variants": variants,
            "iters": args.iters, "repeats": args.repeats, "warmup": args.warmup, "ar_max_bytes": max_bytes,
            "ar_max_blocks": args.ar_max_blocks,
            "timeout_s": args.timeout, "seed": args.seed, "backend": "nccl" if on_gpu and not shared else "gloo",
            "gpus_seen": seen, "rendezvous": "file", "timer": "cuda_events" if on_gpu else "host",
            "units": "microseconds per all-reduce",
            "eager_timing": "--iters back-to-back calls between two events, after one untimed all-reduce of the "
                            "same kind; median of --repeats; max over the ranks",
            "graph_timing": "--iters all-reduces captured back to back into one CUDA graph, replayed once between "
                            "two events (us = event time / iters), after one untimed eager all-reduce of the same "
                            "kind; median of --repeats; max over the ranks",
            "custom": "graphjit.collectives.init(scope='always', max_bytes=ar_max_bytes); algorithm forced with "
                      "GRAPHJIT_AR_ALGO per variant; captured all-reduces registered with register_graph_buffers()",
            "symm": "torch.ops.symm_mem.two_shot_all_reduce_ on a torch.distributed._symmetric_memory buffer",
            "targets": {label: target for label, _applies, target in LATENCY_TARGETS},
        },
        "results": [],
        "complete": False,
    })
    say(f"allreduce [{data['device']}, {args.dtype}, {world} ranks, {data['config']['backend']}]: "
        f"{len(args.sizes)} sizes {size_label(args.sizes[0])}..{size_label(args.sizes[-1])}, "
        f"{len(variants)} variants, iters={args.iters} repeats={args.repeats} -> {json_path}")
    tmp = Path(tempfile.mkdtemp(prefix="graphjit-bench-ar-"))
    cfg = {"data": data, "json_path": str(json_path), "png_path": str(png_path), "no_plot": bool(args.no_plot),
           "tmp": str(tmp), "rendezvous": str(tmp / "rendezvous"), "on_gpu": on_gpu, "shared": shared,
           "collective_timeout": min(COLLECTIVE_TIMEOUT_S, float(args.timeout))}
    (tmp / "config.json").write_text(json.dumps(cfg))
    keep = False
    try:
        codes, why = supervise_workers(tmp, float(args.timeout), world, shared)
        keep = bool(why) or any(c != 0 for c in codes)
        return report_workers(cfg, codes, why)
    finally:
        if keep:
            say(f"allreduce: the workers' logs stay in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def supervise_workers(tmp: Path, timeout: float, world: int, shared: bool = False
                      ) -> tuple[list[int | None], str | None]:
    """Start the workers (rank 0 writes to this process's stdout/stderr, the others to logs) and wait for them,
    at most ``timeout`` seconds; after one ended (failed, or finished first) the other gets :data:`GRACE_S`.
    Returns their exit codes (None: killed) and why they were stopped, if they were."""
    environ = child_environment()
    if shared:
        environ.update(GRAPHJIT_AR_SHARED_GPU="1")  # the workers share GPU 0 (a test mode)
    procs: list[subprocess.Popen[bytes]] = []
    why = None
    logs = []
    try:
        for rank in range(world):
            cmd = [sys.executable, "-m", WORKER_MODULE, "--worker", str(tmp / "config.json"), str(rank)]
            if rank == 0:
                procs.append(subprocess.Popen(cmd, env=environ))
            else:
                log = open(tmp / f"rank{rank}.log", "wb")  # closed below
                logs.append(log)
                procs.append(subprocess.Popen(cmd, env=environ, stdout=log, stderr=subprocess.STDOUT))
        stopped = supervise(procs, timeout, GRACE_S, grace_after="any")
        if stopped is not None and stopped[0] == "timeout":
            why = f"the {world} workers did not finish in {timeout:g} s (--timeout)"
        elif stopped is not None:
            ended = stopped[1]
            why = (f"rank {ended} ended (exit status {procs[ended].returncode}) and the other did not finish in "
                   f"{GRACE_S:.0f} s")
    except OSError as exc:
        why = f"could not start the {world} workers ({exc})"
    finally:
        kill_all(procs)
        for log in logs:
            log.close()
    codes: list[int | None] = [p.returncode if p.returncode is None or p.returncode >= 0 else None for p in procs]
    codes += [None] * (world - len(codes))
    return codes, why


def report_workers(cfg: dict[str, Any], codes: list[int | None], why: str | None) -> int:
    """Report the workers' fate; make sure the JSON says what happened when rank 0 could not finish it."""
    tmp = Path(cfg["tmp"])
    json_path = Path(cfg["json_path"])
    statuses = []
    for rank in range(len(codes)):
        st: dict[str, Any] = {"rank": rank, "exit_status": codes[rank]}
        with contextlib.suppress(OSError, ValueError):
            st.update(json.loads((tmp / f"rank{rank}.status.json").read_text()))
        statuses.append(st)
    ok = why is None and all(c == 0 for c in codes)
    data = None
    with contextlib.suppress(OSError, ValueError):
        data = json.loads(json_path.read_text())
    if ok and data is not None and data.get("complete"):
        return 0
    if why is None and codes[0] == 1 and data is not None and data.get("complete") and all(c == 0 for c in codes[1:]):
        return 1  # complete, but rank 0 found problems (printed in its summary)
    if data is None:
        data = cfg["data"]
    failed = sorted((s for s in statuses if s.get("error")), key=lambda s: s.get("failed_at") or math.inf)
    first = f"rank {failed[0]['rank']} failed in {failed[0].get('stage')}: {failed[0]['error']}" if failed else None
    data["error"] = "; ".join(e for e in (why, first) if e) or \
        "a worker ended with exit status " + ", ".join(str(c) for c in codes)
    data["workers"] = statuses
    with contextlib.suppress(OSError):
        common.write_json(json_path, data)
    say(f"allreduce: FAILED: {data['error']}")
    for st in statuses:
        say(f"  rank {st['rank']}: exit status {st.get('exit_status')}, stage {st.get('stage')!r}"
            + (f", error: {st['error']}" if st.get("error") else ""))
    shown = [failed[0]["rank"]] if failed and failed[0]["rank"] != 0 else \
        [r for r, c in enumerate(codes) if r != 0 and c != 0][:1] or [1]
    for r in shown:  # rank 0 wrote to this process's output already
        with contextlib.suppress(OSError):
            tail = (tmp / f"rank{r}.log").read_text(errors="replace").strip().splitlines()[-15:]
            if tail:
                say(f"  rank {r} log (last lines):")
                for line in tail:
                    say(f"    {line[:300]}")
    say(f"wrote {json_path} (incomplete)")
    return 1
