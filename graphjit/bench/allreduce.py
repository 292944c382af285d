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
import itertools
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

from ..procs import kill_all, supervise
from . import common
from .common import say

SUPPORTED_WORLDS = (2, 4, 6, 8)  # the custom kernel's world sizes
KIB, MIB = 1 << 10, 1 << 20

# name -> (implementation, algorithm, mode)
VARIANTS: dict[str, tuple[str, str | None, str]] = {
    "nccl_eager": ("nccl", None, "eager"),
    "nccl_graph": ("nccl", None, "graph"),
    "custom_1shot_eager": ("custom", "1shot", "eager"),
    "custom_2shot_eager": ("custom", "2shot", "eager"),
    "custom_auto_eager": ("custom", "auto", "eager"),
    "custom_1shot_graph": ("custom", "1shot", "graph"),
    "custom_2shot_graph": ("custom", "2shot", "graph"),
    "custom_auto_graph": ("custom", "auto", "graph"),
    "symm_two_shot_eager": ("symm", "two_shot", "eager"),
    "symm_two_shot_graph": ("symm", "two_shot", "graph"),
}

GPU_DEFAULTS: dict[str, Any] = {"sizes": [4 * KIB << k for k in range(15)], "iters": 100, "repeats": 10, "warmup": 10,
                                 "timeout": 1800.0}
CPU_DEFAULTS: dict[str, Any] = {"sizes": [4 * KIB, 64 * KIB], "iters": 5, "repeats": 3, "warmup": 1, "timeout": 120.0}

DTYPES = {"bf16": ("bfloat16", 2), "fp16": ("float16", 2), "fp32": ("float32", 4)}

# The targets for the custom all-reduce (auto) inside a CUDA graph: (label, applies to size, microseconds).
LATENCY_TARGETS: tuple[tuple[str, Callable[[int], bool], float], ...] = (
    ("<= 6 us up to 256 KiB", lambda s: s <= 256 * KIB, 6.0),
    ("<= 10 us at 1 MiB", lambda s: s == MIB, 10.0),
    ("<= 20 us at 4 MiB", lambda s: s == 4 * MIB, 20.0),
)

# Fallback reasons that are graphjit's choice, not a failure: larger than max_bytes, or auto sending an eager call
# above its measured crossover to the framework's collective (collectives.custom_ar.EAGER_NCCL_ABOVE).
BY_DESIGN = frozenset({"bytes > max", "crossover"})
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


def size_label(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", MIB), ("KiB", KIB)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


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


# -- the results: ratios, crossovers, targets, summary (pure; rank 0 and the tests) -----------------
def us_of(entry: dict[str, Any], variant: str) -> float | None:
    v = entry.get("variants", {}).get(variant) or {}
    us = v.get("us_per_call")
    return float(us) if v.get("status") == "ok" and isinstance(us, (int, float)) and math.isfinite(us) else None


def _series(results: list[dict[str, Any]], variant: str) -> dict[int, float | None]:
    return {r["bytes"]: us_of(r, variant) for r in results}


def crossover(sizes: Sequence[int], a: dict[int, float | None], b: dict[int, float | None], a_name: str,
              b_name: str) -> dict[str, Any]:
    """Where ``b`` overtakes ``a``: ``from_bytes`` is the smallest measured size from which ``b`` is faster at that
    size and every larger size measured (None: ``a`` wins at the largest), with the winner per size and how often
    the winner changes along the sizes (more than once: noisy or not monotone)."""
    both = [s for s in sorted(sizes) if a.get(s) is not None and b.get(s) is not None]
    winners = {s: (b_name if b[s] < a[s] else a_name) for s in both}  # type: ignore[operator]
    start = None
    for s in reversed(both):
        if winners[s] != b_name:
            break
        start = s
    changes = sum(1 for x, y in itertools.pairwise(both) if winners[x] != winners[y])
    return {"faster": b_name, "than": a_name, "from_bytes": start,
            "from": size_label(start) if start is not None else None,
            "winner_by_size": {str(s): w for s, w in winners.items()}, "changes": changes,
            "measured_sizes": len(both)}


def finalize(data: dict[str, Any]) -> dict[str, Any]:
    """Add ``ratios``, ``crossovers``, ``targets``, ``tuning`` and ``summary`` to ``data`` (from its results)."""
    results = data.get("results", [])
    sizes = [r["bytes"] for r in results]
    s = {v: _series(results, v) for v in VARIANTS}

    def ratio(num: str, den: str) -> dict[str, float | None]:
        return {str(b): (cast(float, s[num][b]) / cast(float, s[den][b]) if s[num][b] is not None and s[den][b]
                         else None) for b in sizes}

    data["ratios"] = {
        "custom_auto_graph/nccl_graph": ratio("custom_auto_graph", "nccl_graph"),
        "custom_auto_eager/nccl_eager": ratio("custom_auto_eager", "nccl_eager"),
        "custom_2shot_graph/custom_1shot_graph": ratio("custom_2shot_graph", "custom_1shot_graph"),
        "custom_auto_graph/symm_two_shot_graph": ratio("custom_auto_graph", "symm_two_shot_graph"),
    }
    crossovers: dict[str, Any] = {}
    for mode in ("graph", "eager"):
        best = {b: min((v for v in (s[f"custom_1shot_{mode}"][b], s[f"custom_2shot_{mode}"][b]) if v is not None),
                       default=None) for b in sizes}
        crossovers[mode] = {
            "2shot_vs_1shot": crossover(sizes, s[f"custom_1shot_{mode}"], s[f"custom_2shot_{mode}"], "custom_1shot",
                                        "custom_2shot"),
            "nccl_vs_custom_auto": crossover(sizes, s[f"custom_auto_{mode}"], s[f"nccl_{mode}"], "custom_auto",
                                             "nccl"),
            "nccl_vs_best_custom": crossover(sizes, best, s[f"nccl_{mode}"], "custom_best", "nccl"),
        }
    data["crossovers"] = crossovers
    g = crossovers["graph"]
    data["tuning"] = {
        "two_shot_from_bytes": g["2shot_vs_1shot"]["from_bytes"],
        "nccl_from_bytes": g["nccl_vs_best_custom"]["from_bytes"],
        "auto_algo_by_size": {str(r["bytes"]): r.get("auto_algo") for r in results},
        "note": "in a graph: 2shot is faster than 1shot from two_shot_from_bytes on (None: never, at the sizes "
                "measured); NCCL is faster than the better custom algorithm from nccl_from_bytes on (None: never): "
                "auto's 1shot/2shot threshold and max_bytes can be set from these (world size 2)",
    }
    data["targets"] = _targets(sizes, s, _auto_chose_framework(results))
    data["summary"] = summary(data)
    return data


def fell_back_by_design(v: dict[str, Any]) -> bool:
    """Whether a variant's calls all went to the framework's collective for :data:`BY_DESIGN` reasons only."""
    return v.get("status") == "fallback" and set(v.get("fallback_reasons") or {"?": ""}) <= BY_DESIGN


def _auto_chose_framework(results: list[dict[str, Any]]) -> dict[str, set[int]]:
    """Per mode, the sizes at which custom auto handed its calls to the framework's collective by design
    (:data:`BY_DESIGN`): there auto *is* NCCL, so it cannot be slower than NCCL."""
    chose: dict[str, set[int]] = {"graph": set(), "eager": set()}
    for r in results:
        for mode in chose:
            if fell_back_by_design(r.get("variants", {}).get(f"custom_auto_{mode}") or {}):
                chose[mode].add(r["bytes"])
    return chose


def _targets(sizes: list[int], s: dict[str, dict[int, float | None]],
             framework: dict[str, set[int]]) -> dict[str, Any]:
    auto = s["custom_auto_graph"]
    latency = []
    for label, applies, target in LATENCY_TARGETS:
        rows = [{"bytes": b, "us": auto[b], "target_us": target,
                 "ok": None if auto[b] is None else bool(cast(float, auto[b]) <= target)} for b in sizes if applies(b)]
        verdicts = [r["ok"] for r in rows]
        # False: missed at a measured size; None: nothing measured, or some size not measured (see "sizes")
        ok = False if False in verdicts else (True if verdicts and None not in verdicts else None)
        latency.append({"target": label, "target_us": target, "sizes": rows, "ok": ok})
    never_slower = {}
    for mode in ("graph", "eager"):
        a, n = s[f"custom_auto_{mode}"], s[f"nccl_{mode}"]
        slower = [b for b in sizes if a[b] is not None and n[b] is not None and cast(float, a[b]) > cast(float, n[b])]
        chose = framework[mode]
        missing = [b for b in sizes if (a[b] is None or n[b] is None) and b not in chose]
        measured = len(sizes) - len(missing)
        never_slower[mode] = {"ok": (not slower and not missing) if measured else None, "slower_at": slower,
                              "not_measured": missing, "framework_by_design": sorted(chose)}
    return {"custom_auto_graph_latency": latency, "auto_never_slower_than_nccl": never_slower,
            "definition": "latency targets: custom auto inside a CUDA graph (variant custom_auto_graph); "
                          "never slower: custom_auto_<mode> <= nccl_<mode> at every measured size"}


def summary(data: dict[str, Any]) -> dict[str, Any]:
    """Problems: an error, a wrong result, and on GPUs a NCCL or custom variant that did not run (fallback,
    skipped; a fallback only for :data:`BY_DESIGN` reasons is graphjit's choice and not a problem).  torch's symmetric
    memory is a reference: skipped or failed, it is a note.  On the CPU smoke run only ``nccl_eager`` (gloo)
    must run."""
    on_gpu = data.get("device") == "cuda"
    problems: list[str] = []
    notes: list[str] = []
    for r in data.get("results", []):
        for name, v in r.get("variants", {}).items():
            st = v.get("status")
            where = f"{size_label(r['bytes'])} {name}"
            must_run = name == "nccl_eager" or (on_gpu and VARIANTS[name][0] in ("nccl", "custom"))
            if st == "error":
                (problems if VARIANTS[name][0] != "symm" else notes).append(f"{where}: error: {v.get('error')}")
            elif st == "fallback" and must_run and not fell_back_by_design(v):
                # (larger than --ar-max-bytes: graphjit sends it to NCCL by design; recorded, not a problem)
                problems.append(f"{where}: fell back to the framework's collective: {v.get('fallback_reasons')}")
            elif st == "skipped" and must_run and not str(v.get("reason", "")).startswith("shared-GPU smoke run"):
                problems.append(f"{where}: skipped: {v.get('reason')}")
            chk = v.get("check")
            if chk and chk.get("correct") is False:
                problems.append(f"{where}: differs from {chk.get('against')}: max abs diff {chk.get('max_abs_diff')} "
                                f"> {chk.get('tol')}")
    if not data.get("results"):
        problems.append("no size was measured")
    return {"ok": not problems, "problems": problems, "notes": notes}


# -- table and plot (rank 0) -----------------------------------------------------------------------
SHORT = {"fallback": "fb", "skipped": "skip", "error": "err"}


def variant_cell(entry: dict[str, Any], variant: str) -> Any:
    v = entry.get("variants", {}).get(variant)
    if not v:
        return None
    if v.get("status") != "ok":
        return SHORT.get(v.get("status", ""), v.get("status"))
    us = v.get("us_per_call")
    bad = (v.get("check") or {}).get("correct") is False
    return f"{us:.1f}!" if bad else us


def table(data: dict[str, Any]) -> str:
    rows = []
    ratios = data.get("ratios", {})
    for r in data.get("results", []):
        b = r["bytes"]
        target = next((t for _label, applies, t in LATENCY_TARGETS if applies(b)), None)
        auto = us_of(r, "custom_auto_graph")
        verdict = None if target is None or auto is None else ("ok" if auto <= target else "MISS")
        rg = ratios.get("custom_auto_graph/nccl_graph", {}).get(str(b))
        re_ = ratios.get("custom_auto_eager/nccl_eager", {}).get(str(b))
        rows.append([size_label(b), variant_cell(r, "nccl_eager"), variant_cell(r, "nccl_graph"),
                     variant_cell(r, "custom_1shot_graph"), variant_cell(r, "custom_2shot_graph"),
                     variant_cell(r, "custom_auto_graph"), None if rg is None else f"{rg:.2f}", target, verdict,
                     variant_cell(r, "custom_auto_eager"), None if re_ is None else f"{re_:.2f}",
                     variant_cell(r, "symm_two_shot_eager"), variant_cell(r, "symm_two_shot_graph")])
    head = ["size", "nccl eager", "nccl graph", "1shot graph", "2shot graph", "auto graph", "auto/nccl graph",
            "target us", "target", "auto eager", "auto/nccl eager", "symm eager", "symm graph"]
    return common.format_table(head, rows)


def report_lines(data: dict[str, Any]) -> list[str]:
    lines = ["(us per all-reduce, median; fb: fell back to the framework's collective (not timed), skip: skipped, "
             "err: error, !: differs from NCCL; symm: torch symmetric-memory two_shot)"]
    if data.get("shared_gpu"):
        lines.append("shared-GPU smoke run (--shared-gpu): both ranks take turns on one GPU and the framework's "
                     "all-reduce is gloo: the results are checked, the timings and targets below mean nothing")
    t = data.get("targets", {})
    parts = []
    for item in t.get("custom_auto_graph_latency", []):
        ok = item["ok"]
        missing = [size_label(r["bytes"]) for r in item["sizes"] if r["ok"] is None]
        if ok is False:
            state = "MISSED at " + ", ".join(size_label(r["bytes"]) for r in item["sizes"] if r["ok"] is False)
        elif ok:
            state = "ok"
        else:
            state = "not measured" + (f" at {', '.join(missing)}" if missing else " (size not in the sweep)")
        parts.append(f"{item['target']}: {state}")
    lines.append("targets, custom auto in a graph: " + "; ".join(parts))
    for mode, item in t.get("auto_never_slower_than_nccl", {}).items():
        if item["ok"] is None:
            state = "not measured"
        elif item["ok"]:
            state = "ok"
        else:
            bits = []
            if item["slower_at"]:
                bits.append("slower at " + ", ".join(size_label(b) for b in item["slower_at"]))
            if item["not_measured"]:
                bits.append("not measured at " + ", ".join(size_label(b) for b in item["not_measured"]))
            state = "NO: " + "; ".join(bits)
        lines.append(f"target, auto never slower than NCCL ({mode}): {state}")
    for mode, c in data.get("crossovers", {}).items():
        bits = []
        for c_item in c.values():
            if not c_item["measured_sizes"]:
                continue
            where = f"from {c_item['from']}" if c_item["from"] else "never"
            noisy = f" (winner changes {c_item['changes']}x)" if c_item["changes"] > 1 else ""
            bits.append(f"{c_item['faster']} faster than {c_item['than']}: {where}{noisy}")
        if bits:
            lines.append(f"crossovers ({mode}): " + "; ".join(bits))
    algos = {k: v for k, v in data.get("tuning", {}).get("auto_algo_by_size", {}).items() if v}
    if algos:
        picks: dict[str, list[str]] = {}
        for k, v in algos.items():
            picks.setdefault(v, []).append(size_label(int(k)))
        lines.append("auto picks: " + "; ".join(f"{a} at {', '.join(ss) if len(ss) < 4 else ss[0] + '..' + ss[-1]}"
                                                for a, ss in picks.items()))
    return lines


def plot(data: dict[str, Any], png_path: Path) -> str | None:
    results = data.get("results", [])
    sizes = [r["bytes"] for r in results]
    series: dict[str, list[float | None]] = {}
    styles: dict[str, dict[str, Any]] = {}
    colors = {"nccl": "C0", "custom_1shot": "C1", "custom_2shot": "C2", "custom_auto": "C3", "symm_two_shot": "C4"}
    for v in data.get("config", {}).get("variants", list(VARIANTS)):
        series[v] = [us_of(r, v) for r in results]
        base, mode = v.rsplit("_", 1)
        styles[v] = {"color": colors.get(base, "C5"), "linestyle": "-" if mode == "graph" else "--",
                     "marker": "o" if mode == "graph" else "s"}
        if base == "custom_auto":  # auto runs 1shot or 2shot: wide and translucent, so the line below shows
            styles[v].update(linewidth=3.5, alpha=0.4, marker="none")
    targets = [next((t for _l, applies, t in LATENCY_TARGETS if applies(b)), None) for b in sizes]
    if data.get("device") == "cuda" and any(t is not None for t in targets):
        series["target (auto, graph)"] = targets
        styles["target (auto, graph)"] = {"color": "black", "linestyle": "none", "marker": "x", "markersize": 6}
    cfg = data.get("config", {})
    env = data.get("env", {}).get("torch", {})
    title = (f"all-reduce, {data.get('world_size')} ranks, {cfg.get('dtype')}, {cfg.get('backend')} ({data.get('tag')}"
             f"{', ' + env['gpu'] if env.get('gpu') else ''})")
    return common.line_plot(png_path, title, sizes, series, "message size", "microseconds per all-reduce (median)",
                            log_x=True, log_y=True, x_labels=[size_label(b).replace(" ", "") for b in sizes],
                            styles=styles,
                            notes=[f"graph: {cfg.get('iters')} all-reduces captured in one graph, replayed once; "
                                   f"eager (dashed): {cfg.get('iters')} back-to-back calls; median of "
                                   f"{cfg.get('repeats')}, max over ranks; custom max_bytes {cfg.get('ar_max_bytes')}"])


# -- the workers' side, framework-neutral (the worker: graphjit.bench.torch.allreduce) ------
class WorkerStatus:
    """This rank's progress file (stage, error), read by the command when something goes wrong."""

    def __init__(self, path: Path, rank: int) -> None:
        self.path = path
        self.data: dict[str, Any] = {"rank": rank, "stage": "start", "done": False}
        self.save()

    def stage(self, text: str) -> None:
        self.data["stage"] = text
        self.save()

    def fail(self, exc: BaseException) -> None:
        self.data["error"] = common.error_text(exc)
        self.data["failed_at"] = time.time()  # the first rank to fail is usually the cause
        self.data["traceback"] = common.traceback_tail(exc, 20)
        self.save()

    def save(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        with contextlib.suppress(OSError):
            tmp.write_text(json.dumps(self.data, default=str))
            os.replace(tmp, self.path)


def custom_delta(before: dict[str, Any], after: dict[str, Any], expect: str | None) -> dict[str, Any]:
    """What graphjit's counters say about the calls between two ``collectives.stats()``: kernel calls, and the
    fallbacks with their reasons (then the status is ``fallback``)."""
    calls = {k: after["custom"][k] - before["custom"][k] for k in ("eager", "captured")}
    fallbacks = {k: n - before["fallbacks"].get(k, 0) for k, n in after["fallbacks"].items()
                 if n - before["fallbacks"].get(k, 0) > 0}
    out: dict[str, Any] = {"custom_calls": calls}
    if fallbacks:
        out["status"] = "fallback"
        out["fallback_reasons"] = {k: after["reasons"].get(k, "") for k in fallbacks}
        out["fallback_calls"] = fallbacks
    elif expect is not None and calls[expect] < 1:
        out["status"] = "fallback"
        out["fallback_reasons"] = {"not run": f"graphjit's counters show no {expect} custom all-reduce"}
    return out


def _worst(statuses: Sequence[str]) -> str:
    return "error" if "error" in statuses else ("fallback" if "fallback" in statuses else "ok")


def combine_checks(per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"status": _worst([c.get("status", "error") for c in per_rank])}
    errors = {str(r): c["error"] for r, c in enumerate(per_rank) if c.get("error")}
    if errors:
        out["error"] = next(iter(errors.values()))
        out["errors"] = errors
        out["traceback"] = next((c.get("traceback") for c in per_rank if c.get("traceback")), None)
    checks = [c["check"] for c in per_rank if c.get("check")]
    if checks:
        out["check"] = {"max_abs_diff": max(c["max_abs_diff"] for c in checks),
                        "tol": min(c["tol"] for c in checks), "against": checks[0]["against"],
                        "correct": all(c["correct"] for c in checks) and len(checks) == len(per_rank)}
    reasons: dict[str, str] = {}
    for c in per_rank:
        reasons.update(c.get("fallback_reasons") or {})
    if reasons:
        out["fallback_reasons"] = reasons
    calls = [c.get("custom_calls") for c in per_rank if c.get("custom_calls")]
    if calls:
        out["check_custom_calls"] = calls[0]
    return out


def combine_timings(per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    status = _worst([t.get("status", "error") for t in per_rank])
    out: dict[str, Any] = {"status": status}
    if status == "error":
        errors = {str(r): t["error"] for r, t in enumerate(per_rank) if t.get("error")}
        out["error"] = next(iter(errors.values()), "timing failed")
        out["errors"] = errors
        out["traceback"] = next((t.get("traceback") for t in per_rank if t.get("traceback")), None)
        return out
    if status == "fallback":
        reasons: dict[str, str] = {}
        for t in per_rank:
            reasons.update(t.get("fallback_reasons") or {})
        out["fallback_reasons"] = reasons
        out["note"] = "some timed calls ran the framework's collective: no custom timing recorded"
        return out
    medians = [t["median_us"] for t in per_rank]
    us = max(medians)
    samples = per_rank[0]["samples_us"]
    out.update({"us_per_call": us, "rank_us": medians, "samples_us": samples,
                "spread": (max(samples) - min(samples)) / medians[0] if medians[0] else None,
                "host_us_per_call": per_rank[0]["host_us_per_call"]})
    if per_rank[0].get("custom_calls"):
        out["custom_calls"] = per_rank[0]["custom_calls"]
    return out
