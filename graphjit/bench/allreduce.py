"""``python -m graphjit bench allreduce``: graphjit's custom all-reduce against NCCL on 2 (4, 6, 8) GPUs.

One worker process per GPU (torch, one NCCL group, as many ranks as GPUs are visible, rounded down
to 2, 4, 6 or 8, or ``--world-size``; ``python -m graphjit.bench.allreduce
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
or on GPUs a NCCL or custom variant did not run (fell back or was skipped; a fallback for "bytes > max" alone is
by configuration); the symmetric-memory reference may be skipped or fail (a note).  The targets never change
the exit status: they are results.

Safety: ``NCCL_NVLS_ENABLE=0`` and ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1`` are forced in both workers
(multicast is never enabled); the process group, a gloo side group (for the ranks' verdicts), the custom
kernel and the whole run have timeouts (``--timeout``); a worker that fails gets the other one stopped after
a grace period; every worker ends with ``os._exit`` after flushing (no interpreter teardown with NCCL and IPC
mappings alive).

Fewer than 2 CUDA GPUs: exits 1 with a one-line message, unless ``--allow-cpu``: a tiny smoke run of 2 gloo
processes on the CPU that times only the framework's all-reduce (recorded under ``nccl_eager`` with
``"backend": "gloo"``) and records the other variants as skipped with the reason.
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
import traceback
import warnings
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

FORCED_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
"""Set in every worker, whatever the caller's environment says: no NVLink SHARP / multicast."""
DROP_ENV = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
            "TORCHELASTIC_RUN_ID", "GRAPHJIT_AR_ALGO")
RECORDED_ENV = re.compile(r"^(NCCL_|TORCH_NCCL_|TORCH_SYMM_MEM_|GRAPHJIT_|PYTORCH_CUDA_ALLOC_CONF$|"
                          r"CUDA_VISIBLE_DEVICES$|CUDA_DEVICE_MAX_CONNECTIONS$)")
GRACE_S = 30.0  # after one worker failed or finished, how long the other may still run
COLLECTIVE_TIMEOUT_S = 300.0  # process groups (NCCL watchdog, gloo) at most; the custom kernel at most 60 s
CUSTOM_TIMEOUT_S = 60.0


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
def cuda_gpus() -> tuple[int, str]:
    """(CUDA devices torch sees, a description)."""
    import torch

    if not torch.backends.cuda.is_built():
        return 0, f"torch {torch.__version__} is a CPU build"
    if not torch.cuda.is_available():
        return 0, f"torch {torch.__version__} sees no CUDA device"
    count = torch.cuda.device_count()
    return count, f"torch {torch.__version__} sees {count} CUDA device{'s' if count != 1 else ''}"


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
    try:
        gpus, seen = cuda_gpus()
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
        codes, why = _supervise(tmp, float(args.timeout), world, shared)
        keep = bool(why) or any(c != 0 for c in codes)
        return _after(cfg, codes, why)
    finally:
        if keep:
            say(f"allreduce: the workers' logs stay in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def _supervise(tmp: Path, timeout: float, world: int, shared: bool = False) -> tuple[list[int | None], str | None]:
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
            cmd = [sys.executable, "-m", "graphjit.bench.allreduce", "--worker", str(tmp / "config.json"), str(rank)]
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


def _after(cfg: dict[str, Any], codes: list[int | None], why: str | None) -> int:
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
    data["targets"] = _targets(sizes, s)
    data["summary"] = _summary(data)
    return data


def _targets(sizes: list[int], s: dict[str, dict[int, float | None]]) -> dict[str, Any]:
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
        missing = [b for b in sizes if a[b] is None or n[b] is None]
        measured = len(sizes) - len(missing)
        never_slower[mode] = {"ok": (not slower and not missing) if measured else None, "slower_at": slower,
                              "not_measured": missing}
    return {"custom_auto_graph_latency": latency, "auto_never_slower_than_nccl": never_slower,
            "definition": "latency targets: custom auto inside a CUDA graph (variant custom_auto_graph); "
                          "never slower: custom_auto_<mode> <= nccl_<mode> at every measured size"}


def _summary(data: dict[str, Any]) -> dict[str, Any]:
    """Problems: an error, a wrong result, and on GPUs a NCCL or custom variant that did not run (fallback,
    skipped; a fallback only for "bytes > max" is by configuration and not a problem).  torch's symmetric
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
            elif st == "fallback" and must_run and set(v.get("fallback_reasons") or {"?": ""}) != {"bytes > max"}:
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


def _cell(entry: dict[str, Any], variant: str) -> Any:
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
        rows.append([size_label(b), _cell(r, "nccl_eager"), _cell(r, "nccl_graph"), _cell(r, "custom_1shot_graph"),
                     _cell(r, "custom_2shot_graph"), _cell(r, "custom_auto_graph"),
                     None if rg is None else f"{rg:.2f}", target, verdict, _cell(r, "custom_auto_eager"),
                     None if re_ is None else f"{re_:.2f}", _cell(r, "symm_two_shot_eager"),
                     _cell(r, "symm_two_shot_graph")])
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


# -- the worker (one per rank) ---------------------------------------------------------------------
class _Status:
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


class _Worker:
    def __init__(self, cfg: dict[str, Any], rank: int, status: _Status) -> None:
        from datetime import timedelta

        import torch
        import torch.distributed as dist

        self.cfg, self.rank, self.status = cfg, rank, status
        self.data: dict[str, Any] = cfg["data"]
        self.world = int(self.data["world_size"])
        c = self.data["config"]
        self.torch, self.dist = torch, dist
        self.gpu = bool(cfg["on_gpu"])
        self.shared = bool(cfg.get("shared"))
        self.sizes: list[int] = c["sizes"]
        self.variants: list[str] = c["variants"]
        self.iters, self.repeats, self.warmup = int(c["iters"]), int(c["repeats"]), int(c["warmup"])
        self.dtype = getattr(torch, c["torch_dtype"])
        if self.gpu:
            index = 0 if self.shared else rank
            torch.cuda.set_device(index)
            self.device = torch.device("cuda", index)
        else:
            self.device = torch.device("cpu")
        timeout = timedelta(seconds=float(cfg["collective_timeout"]))
        status.stage("process group")
        self.backend: str = c["backend"]  # nccl, or gloo (CPU and shared-GPU smoke runs)
        dist.init_process_group(self.backend, init_method=f"file://{cfg['rendezvous']}",
                                rank=rank, world_size=self.world, timeout=timeout)
        # Verdicts and results go through gloo on the CPU: they still work when a GPU collective went wrong.
        self.ctl = dist.new_group(list(range(self.world)), backend="gloo", timeout=timeout)
        self.group_name = getattr(dist.group.WORLD, "group_name", None)
        status.stage("collectives.init")
        import graphjit
        from graphjit import collectives
        from graphjit.collectives import custom_ar, swap

        self.graphjit, self.collectives = graphjit, collectives
        self.report: dict[str, Any] | None = None
        self.init_error: str | None = None
        self.lib: Any = None
        if any(VARIANTS[v][0] == "custom" for v in self.variants):
            try:
                rep = collectives.init(max_bytes=int(c["ar_max_bytes"]), scope="always", backend="torch",
                                       timeout_s=min(CUSTOM_TIMEOUT_S, float(cfg["collective_timeout"])),
                                       pointer_slots=max(custom_ar.DEFAULT_SLOTS, 2 * self.iters + 16))
                self.report = rep.as_dict()
                comms = custom_ar.communicators()
                if rep.enabled and comms:
                    self.lib = comms[0].lib
            except Exception as exc:
                self.init_error = common.error_text(exc)
        self.nccl = swap.original("torch")  # the framework's own all_reduce, never graphjit's
        self.symm_op: Any = None
        self.symm_mem: Any = None
        self.symm_reason: str | None = None
        if any(VARIANTS[v][0] == "symm" for v in self.variants):
            status.stage("symmetric memory probe")
            self.symm_reason = self._symm_probe()
        self.sbuf: Any = None

    # -- plumbing ---------------------------------------------------------------------------------
    def sync(self) -> None:
        if self.gpu:
            self.torch.cuda.synchronize()

    def agree(self, local: Any) -> list[Any]:
        out: list[Any] = [None] * self.world
        self.dist.all_gather_object(out, local, group=self.ctl)
        return out

    def set_algo(self, algo: str | None) -> None:
        if algo is None:
            os.environ.pop("GRAPHJIT_AR_ALGO", None)
        else:
            os.environ.update(GRAPHJIT_AR_ALGO=algo)  # graphjit reads it (env.py) after refresh_env()
        self.graphjit.refresh_env()

    def custom_stats(self) -> dict[str, Any]:
        return self.collectives.stats()

    def _symm_probe(self) -> str | None:
        """None if torch's symmetric-memory two_shot all-reduce works here (agreed by both ranks), else why not."""
        local: str | None = None
        if not self.gpu:
            local = "CPU smoke run: torch symmetric memory needs CUDA GPUs"
        elif self.shared:
            local = "shared-GPU smoke run: torch symmetric memory needs one GPU per rank"
        else:
            try:
                import torch.distributed._symmetric_memory as symm_mem

                op = getattr(getattr(self.torch.ops, "symm_mem", None), "two_shot_all_reduce_", None)
                if op is None:
                    local = f"torch {self.torch.__version__} has no torch.ops.symm_mem.two_shot_all_reduce_"
                elif not self.group_name:
                    local = "the process group has no group_name (torch too old for symmetric memory)"
                else:
                    self.symm_mem, self.symm_op = symm_mem, op
            except Exception as exc:
                local = f"torch.distributed._symmetric_memory is not importable: {common.error_text(exc)}"
        verdicts = self.agree(local)
        reason = next((f"rank {r}: {v}" for r, v in enumerate(verdicts) if v), None)
        if reason is None:
            try:
                buf = self.symm_alloc(4096 // self.dtype_size())
                buf.fill_(float(self.rank + 1))
                self.symm_op(buf, "sum", self.group_name)
                self.sync()
                local = None if bool((buf == float(self.world * (self.world + 1) // 2)).all()) else \
                    "the 4 KiB probe returned a wrong sum"
                del buf
            except Exception as exc:
                local = f"the 4 KiB probe failed: {common.error_text(exc)}"
            verdicts = self.agree(local)
            reason = next((f"rank {r}: {v}" for r, v in enumerate(verdicts) if v), None)
        if reason is not None:
            self.symm_op = None
        return reason

    def symm_alloc(self, numel: int) -> Any:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            enable = getattr(self.symm_mem, "enable_symm_mem_for_group", None)
            if enable is not None:  # needed before torch 2.7; a deprecated no-op afterwards
                with contextlib.suppress(Exception):
                    enable(self.group_name)
        buf = self.symm_mem.empty(numel, dtype=self.dtype, device=self.device)
        self.symm_mem.rendezvous(buf, self.group_name)
        return buf

    def dtype_size(self) -> int:
        return int(self.torch.empty((), dtype=self.dtype).element_size())

    # -- one size --------------------------------------------------------------------------------
    def run(self) -> int:
        torch = self.torch
        data = self.data
        if self.rank == 0:
            data["env"] = common.environment()
            data["env"]["worker_env"] = {k: v for k, v in sorted(os.environ.items()) if RECORDED_ENV.match(k)}
            data["collectives"] = {"report": self.report, "init_error": self.init_error}
            data["symm_mem"] = {"available": self.symm_op is not None, "reason": self.symm_reason}
            common.write_json(Path(self.cfg["json_path"]), data)
        es = self.dtype_size()
        for nbytes in self.sizes:
            label = size_label(nbytes)
            self.status.stage(f"size {label}")
            n = nbytes // es
            gen = torch.Generator(device=self.device)
            gen.manual_seed(int(self.cfg["data"]["config"]["seed"]) * 1_000_003 + 7919 * self.rank + nbytes)
            x = torch.randn(n, generator=gen, device=self.device).to(self.dtype)
            ref = x.clone()
            self.nccl(ref)
            parts = [torch.empty_like(x) for _ in range(self.world)]
            self.dist.all_gather(parts, x)
            exact = sum(p.double() for p in parts).to(self.dtype)  # correctly rounded sum of the inputs
            del parts
            entry: dict[str, Any] = {"bytes": nbytes, "size": label, "numel": n, "variants": {}}
            if self.lib is not None:
                with contextlib.suppress(Exception):
                    entry["auto_algo"] = {1: "1shot", 2: "2shot"}.get(self.lib.choose_algo(self.world, nbytes))
            self.sbuf = None
            if self.symm_op is not None and any(VARIANTS[v][0] == "symm" for v in self.variants):
                try:
                    self.sbuf = self.symm_alloc(n)
                    local = None
                except Exception as exc:
                    local = common.error_text(exc)
                verdicts = self.agree(local)
                bad = next((f"rank {r}: {v}" for r, v in enumerate(verdicts) if v), None)
                if bad:
                    self.sbuf = None
                    entry["symm_alloc_error"] = bad
            for name in self.variants:
                self.status.stage(f"size {label}, {name}")
                entry["variants"][name] = self.variant(name, x, ref, exact, entry.get("symm_alloc_error"))
            self.sbuf = None
            del x, ref, exact
            self.sync()
            data["results"].append(entry)
            if self.rank == 0:
                common.write_json(Path(self.cfg["json_path"]), data)
                say(f"allreduce: {label}: " + ", ".join(
                    f"{v} {_cell(entry, v):.1f}" if isinstance(_cell(entry, v), float) else f"{v} {_cell(entry, v)}"
                    for v in self.variants))
        self.status.stage("done")
        self.agree("done")  # both ranks are through every collective
        if self.rank != 0:
            return 0
        return self.finish()

    def finish(self) -> int:
        data = self.data
        finalize(data)
        data["complete"] = True
        json_path, png_path = Path(self.cfg["json_path"]), Path(self.cfg["png_path"])
        note = None
        if not self.cfg["no_plot"]:
            note = plot(data, png_path)
        data["plot"] = None if (self.cfg["no_plot"] or note) else png_path.name
        if note:
            data["plot_error"] = note
        common.write_json(json_path, data)
        say(table(data))
        for line in report_lines(data):
            say(line)
        for p in data["summary"]["problems"][:20]:
            say(f"problem: {p}")
        for p in data["summary"]["notes"][:5]:
            say(f"note: {p}")
        say(f"wrote {json_path}" + (f" and {png_path}" if data["plot"] else ""))
        if note:
            say(f"no plot: {note}")
        return 0 if data["summary"]["ok"] else 1

    # -- one variant -----------------------------------------------------------------------------
    def skip_reason(self, impl: str, mode: str, symm_alloc_error: str | None) -> str | None:
        if not self.gpu:
            if impl == "custom":
                why = "CPU smoke run (gloo, no GPU): the custom all-reduce needs 2 CUDA GPUs on one node"
                if self.report and self.report.get("reason"):
                    why += f" (collectives.init: {self.report['reason_key']}: {self.report['reason']})"
                return why
            if impl == "symm":
                return self.symm_reason or "CPU smoke run: torch symmetric memory needs CUDA GPUs"
            if mode == "graph":
                return "CPU smoke run: CUDA graphs need a GPU"
            return None
        if self.shared and impl == "nccl" and mode == "graph":
            return "shared-GPU smoke run: the framework's all-reduce is gloo there, which a CUDA graph cannot hold"
        if impl == "custom" and self.init_error:
            return f"collectives.init raised: {self.init_error}"
        if impl == "symm":
            if self.symm_reason:
                return f"torch symmetric memory unavailable: {self.symm_reason}"
            if symm_alloc_error:
                return f"allocating the symmetric-memory buffer failed: {symm_alloc_error}"
        return None

    def variant(self, name: str, x: Any, ref: Any, exact: Any, symm_alloc_error: str | None) -> dict[str, Any]:
        impl, algo, mode = VARIANTS[name]
        reason = self.skip_reason(impl, mode, symm_alloc_error)
        if reason:
            return {"status": "skipped", "reason": reason}
        if impl == "custom":
            self.set_algo(algo)
        out: dict[str, Any]
        try:
            checks = self.agree(common.guarded(lambda: self.check(impl, mode, x, ref, exact)))
            out = _combine_checks(checks)
            if impl == "nccl":
                out["backend"] = self.backend
            if out["status"] == "ok":
                timings = self.agree(common.guarded(lambda: self.timing(impl, mode, x.numel())))
                out.update(_combine_timings(timings))
        finally:
            self.sync()
            self.agree(None)  # both ranks are done with this variant's buffers and graphs
            if impl == "custom":
                if mode == "graph":
                    with contextlib.suppress(Exception):
                        self.collectives.reset()  # free the pointer-table slots of the dropped graphs
                self.set_algo(None)
        return out

    def one(self, impl: str, buf: Any) -> Callable[[], Any]:
        if impl == "nccl":
            return lambda: self.nccl(buf)
        if impl == "custom":
            return lambda: self.dist.all_reduce(buf)  # graphjit's swap (scope="always")
        return lambda: self.symm_op(buf, "sum", self.group_name)

    def capture(self, fn: Callable[[], Any], count: int, impl: str) -> Any:
        """A CUDA graph of ``count`` calls of ``fn`` (one warmup call on a side stream first).  thread_local
        capture mode: the NCCL watchdog thread may query events while this thread captures."""
        torch = self.torch
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            for _ in range(count):
                fn()
        torch.cuda.synchronize()
        if impl == "custom":
            self.collectives.register_graph_buffers()  # a collective: both ranks captured the same
        return graph

    def check(self, impl: str, mode: str, x: Any, ref: Any, exact: Any) -> dict[str, Any]:
        """One all-reduce of ``x`` through the variant, compared with the correctly rounded sum; custom variants:
        did graphjit's kernel run, or the framework's collective (a fallback)?"""
        before = self.custom_stats() if impl == "custom" else None
        buf = self.sbuf if impl == "symm" else x.clone()
        if impl == "symm":
            buf.copy_(x)
        if mode == "eager":
            self.one(impl, buf)()
        else:
            graph = self.capture(self.one(impl, buf), 1, impl)
            buf.copy_(x)
            graph.replay()
            del graph
        self.sync()
        # Against the correctly rounded sum of the inputs.  The custom kernel adds in fp32 and rounds
        # once: within one eps of the largest value.  NCCL's ring rounds to the dtype after every hop:
        # up to world - 1 roundings.
        want, against = exact, "the correctly rounded sum"
        diff = float((buf.double() - want.double()).abs().max())
        scale = float(want.double().abs().max())
        roundings = max(1, self.world - 1) if impl == "nccl" else 1
        tol = float(self.torch.finfo(self.dtype).eps) * scale * roundings
        out: dict[str, Any] = {"status": "ok", "check": {"max_abs_diff": diff, "max_abs": scale, "tol": tol,
                                                         "correct": bool(diff <= tol), "against": against}}
        if before is not None:
            out.update(_custom_delta(before, self.custom_stats(), expect="eager" if mode == "eager" else "captured"))
        return out

    def timing(self, impl: str, mode: str, numel: int) -> dict[str, Any]:
        torch = self.torch
        before = self.custom_stats() if impl == "custom" else None
        if impl == "symm":
            buf = self.sbuf
            buf.zero_()
        else:
            buf = torch.zeros(numel, dtype=self.dtype, device=self.device)
        one = self.one(impl, buf)
        iters = self.iters
        if mode == "eager":
            for _ in range(self.warmup):
                one()

            def body() -> None:
                for _ in range(iters):
                    one()
        else:
            graph = self.capture(one, iters, impl)
            graph.replay()  # warmup replay
            body = graph.replay
        self.sync()
        samples, host = [], []
        perf = time.perf_counter_ns
        for _ in range(self.repeats):
            one()  # untimed: lines the two ranks up
            if self.gpu:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                t0 = perf()
                body()
                t1 = perf()
                end.record()
                end.synchronize()
                samples.append(start.elapsed_time(end) * 1e3 / iters)
            else:
                t0 = perf()
                body()
                t1 = perf()
                samples.append((t1 - t0) / 1e3 / iters)
            host.append((t1 - t0) / 1e3 / iters)
        self.sync()
        out: dict[str, Any] = {"status": "ok", "samples_us": samples, "median_us": common.median(samples),
                               "host_us_per_call": common.median(host)}
        if before is not None:
            delta = _custom_delta(before, self.custom_stats(), expect=None)
            out.update(delta)
        return out


def _custom_delta(before: dict[str, Any], after: dict[str, Any], expect: str | None) -> dict[str, Any]:
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


def _combine_checks(per_rank: list[dict[str, Any]]) -> dict[str, Any]:
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


def _combine_timings(per_rank: list[dict[str, Any]]) -> dict[str, Any]:
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


def _worker_main(argv: list[str]) -> None:
    """A worker's whole life: whatever happens, it ends here with ``os._exit`` after flushing."""
    code = 1
    status: _Status | None = None
    try:
        os.environ.update(FORCED_ENV)  # again, before torch and NCCL read them
        cfg = json.loads(Path(argv[0]).read_text())
        rank = int(argv[1])
        status = _Status(Path(cfg["tmp"]) / f"rank{rank}.status.json", rank)
        code = _Worker(cfg, rank, status).run()
        status.data["done"] = True
        status.save()
    except BaseException as exc:
        if status is not None:
            status.fail(exc)
        traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)  # no interpreter teardown: NCCL, the IPC mappings and graphs go with the process


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        _worker_main(sys.argv[2:])
    print("usage: python -m graphjit bench allreduce [options]  (this module's entry point is for its workers)",
          file=sys.stderr)
    sys.exit(2)
