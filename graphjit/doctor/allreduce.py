"""The ``custom all-reduce`` row (``--collectives`` only; plain ``doctor`` never starts NCCL): two processes,
one per GPU, in a torch NCCL group (``python -m graphjit.doctor.torch.allreduce``) or, where torch cannot
run it and Paddle sees the GPUs (or with ``--framework paddle``), a Paddle one
(``python -m graphjit.doctor.paddle.allreduce``), run :func:`graphjit.collectives.init` and custom
all-reduces, eager and graphed, each compared with NCCL.

This module starts and supervises the pair (:func:`run_ar_pair`: a timeout, then the survivor is stopped)
and turns their JSON results into the row (:func:`ar_verdict`); it imports no framework (torch's view of
the GPUs comes from :mod:`graphjit.doctor.torch.rows`, imported lazily).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ..procs import kill_all, supervise
from .children import child_env
from .context import Context, framework_checks
from .report import FAIL, PASS, SKIP
from .text import count_names
from .toolchain import NVCC_FIX

AR_MAX_BYTES = 8 << 20
AR_SIZES = (16, 16 * 1001, 1 << 18, 1 << 21, AR_MAX_BYTES)
"""Bytes per eager case: the smallest, an odd multiple of 16, and up to ``max_bytes``."""
AR_GRAPHED = (("float32", 4096), ("bfloat16", 1 << 20))
"""(dtype, elements) of the graphed steps (``y = 2x; all_reduce(y); y + 1``), 4 calls each."""

AR_PROBES = {"torch": "graphjit.doctor.torch.allreduce", "paddle": "graphjit.doctor.paddle.allreduce"}
"""The module each of the 2 ranks runs, per framework: ``python -m MODULE RANK PORTS OUT DEVICE(cuda|shared|cpu)
TIMEOUT`` (PORTS: one free port for torch; three, comma-separated, for Paddle)."""
AR_PROBE = AR_PROBES["torch"]

_AR_DROP_ENV = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                "TORCHELASTIC_RUN_ID")

_AR_FIXES = {
    "disabled": "unset GRAPHJIT_CUSTOM_AR=0 and GRAPHJIT_DISABLE=1",
    "nccl": "unset GRAPHJIT_AR_ALGO=nccl",
    "topology": "the 2 GPUs need working P2P (see the P2P access and CUDA IPC rows; containers: --ipc=host); NCCL "
                "still works",
}
_AR_DEBUG_FIX = ("rerun with GRAPHJIT_DEBUG=1 NCCL_DEBUG=INFO python -m graphjit -vv doctor --collectives and report "
                 "the log; GRAPHJIT_CUSTOM_AR=0 keeps all_reduce on NCCL meanwhile")


def _free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for the pair's process group)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_ar_pair(timeout: float, device: str = "cuda", framework: str = "torch"
                ) -> tuple[list[dict[str, Any] | None], list[str], str | None]:
    """Run ``framework``'s probe (:data:`AR_PROBES`) as ranks 0 and 1; (each rank's result or None, each rank's
    log tail, why not)."""
    with tempfile.TemporaryDirectory(prefix="graphjit-doctor-ar-") as tmp:
        environ = child_env({"NCCL_NVLS_ENABLE": os.environ.get("NCCL_NVLS_ENABLE", "0")})
        for name in _AR_DROP_ENV:
            environ.pop(name, None)
        ports = ",".join(str(_free_port()) for _ in range(1 if framework == "torch" else 3))
        outs = [Path(tmp) / f"rank{r}.json" for r in range(2)]
        logs = [Path(tmp) / f"rank{r}.log" for r in range(2)]
        procs: list[subprocess.Popen[bytes]] = []
        why = None
        try:
            for r in range(2):
                with open(logs[r], "wb") as log:
                    procs.append(subprocess.Popen([sys.executable, "-m", AR_PROBES[framework], str(r), ports,
                                                   str(outs[r]), device, str(timeout)], stdout=log,
                                                  stderr=subprocess.STDOUT, cwd=tmp, env=environ))
            # one rank failed: the other gets a little longer, then is stopped
            stopped = supervise(procs, timeout, 20, grace_after="failure", poll_s=0.1)
            if stopped is not None:
                why = (f"the 2 processes did not finish in {timeout:.0f} s" if stopped[0] == "timeout"
                       else "one process failed and the other did not finish")
        except OSError as exc:
            why = f"could not start the 2 processes ({exc})"
        finally:
            kill_all(procs)
        results: list[dict[str, Any] | None] = []
        tails: list[str] = []
        for r in range(2):
            data = None
            with contextlib.suppress(OSError, ValueError):
                data = json.loads(outs[r].read_text())
            if data is not None and r < len(procs):
                data["returncode"] = procs[r].returncode
            results.append(data)
            tail = ""
            with contextlib.suppress(OSError):
                tail = logs[r].read_text(errors="replace")[-2000:]
            tails.append(tail)
    return results, tails, why


def _size(nbytes: int) -> str:
    """``8 MiB``, ``256 KiB``, ``16016 B``: whole MiB or KiB when exact, else bytes."""
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def ar_verdict(results: list[dict[str, Any] | None], tails: list[str], why: str | None, reference: str = "NCCL"
               ) -> tuple[str, str, str | None, list[str], dict[str, Any]]:
    """(status, result, fix, lines, data) of the custom all-reduce row from the 2 ranks' results; ``reference``:
    the framework's collective the results were compared with."""
    data: dict[str, Any] = {"ranks": results, "why": why}
    stages = ", ".join(f"rank {r}: {res.get('stage') if res else 'no result'}" for r, res in enumerate(results))
    log_lines = [f"rank {r}: {line.strip()[:200]}" for r, t in enumerate(tails) for line in t.strip().splitlines()[-3:]
                 if line.strip()]
    broken = [(r, res) for r, res in enumerate(results) if res is None or res.get("error") or not res.get("done")]
    if why or broken:
        detail = why or ""
        for r, res in broken:
            if res is None:
                detail += f"{'; ' if detail else ''}rank {r} wrote no result"
            elif res.get("error"):
                detail += f"{'; ' if detail else ''}rank {r} failed in {res.get('stage')}: {res['error']}"
        return FAIL, f"{detail or 'the probe did not finish'} ({stages})"[:600], _AR_DEBUG_FIX, log_lines, data
    reports = [res.get("report") or {} for res in results if res]
    off = next((rep for rep in reports if not rep.get("enabled")), None)
    if off is not None:
        key = off.get("reason_key") or "unavailable"
        data["report"] = off
        return (FAIL, f"collectives.init turned it off ({key}): {off.get('reason')}"[:600],
                _AR_FIXES.get(key, _AR_DEBUG_FIX), [], data)
    cases = [dict(c, rank=r) for r, res in enumerate(results) if res for c in res.get("cases", [])]
    data["report"] = reports[0]
    per_rank = f"{len(cases)} results ({len(cases) // max(len(results), 1)} cases x {len(results)} ranks)"
    fell_back = [c for c in cases if not c.get("custom")]
    wrong = [c for c in cases if not c.get("max_abs_diff", 0.0) <= c.get("tol", 0.0)]
    worst = max((c.get("max_abs_diff", 0.0) for c in cases), default=0.0)
    lines = []
    for mode in ("eager", "graphed"):
        for dtype in ("float32", "float16", "bfloat16"):
            sel = [c for c in cases if c["mode"] == mode and c["dtype"] == dtype and c["rank"] == 0]
            if not sel:
                continue
            every = [c for c in cases if c["mode"] == mode and c["dtype"] == dtype]
            sizes = sorted({c["bytes"] for c in sel})
            span = _size(sizes[0]) + (f" .. {_size(sizes[-1])}" if len(sizes) > 1 else "")
            algos = "+".join(sorted({c["algo"] for c in sel}))
            calls = sum(c["calls"] for c in sel)
            extra = f", {sum(c.get('replays') or 0 for c in sel)} replays" if mode == "graphed" else ""
            lines.append(f"{mode:8s} {dtype:9s} {calls:3d} call(s), {span} ({algos}{extra}): max abs diff "
                         f"{max(c.get('max_abs_diff', 0.0) for c in every):.3g}")
    if fell_back:
        reasons = {k: v for res in results if res for k, v in (res.get("reasons") or {}).items()}
        first = fell_back[0]
        text = (f"{len(fell_back)} of {per_rank} ran {reference} instead of the custom kernel (first: "
                f"{first['mode']} {first['dtype']} {_size(first['bytes'])}"
                + (f", fallbacks {first.get('fallbacks')}" if first.get("fallbacks") else "") + ")"
                + (f"; reasons: {'; '.join(f'{k}: {v}' for k, v in reasons.items())}" if reasons else ""))
        fix = ("unset expandable_segments in PYTORCH_CUDA_ALLOC_CONF (CUDA IPC cannot share VMM memory)"
               if "VMM memory" in reasons else _AR_DEBUG_FIX)
        return FAIL, text[:600], fix, lines, data
    if wrong:
        c = max(wrong, key=lambda c: c["max_abs_diff"] / max(c["tol"], 1e-30))
        return (FAIL, f"differs from {reference} in {len(wrong)} of {per_rank}; worst: {c['mode']} {c['dtype']} "
                f"{c['algo']} {_size(c['bytes'])} on rank {c['rank']}: max abs diff {c['max_abs_diff']:.3g} "
                f"(allowed {c['tol']:.3g})", "report this as a graphjit bug with the --json output; "
                "GRAPHJIT_CUSTOM_AR=0 keeps all_reduce on NCCL meanwhile", lines, data)
    eager = [c for c in cases if c["mode"] == "eager" and c["rank"] == 0]
    graphed = [c for c in cases if c["mode"] == "graphed" and c["rank"] == 0]
    sizes = sorted({c["bytes"] for c in eager})
    rep = reports[0]
    dtypes = ", ".join(d for d in ("float32", "float16", "bfloat16") if any(c["dtype"] == d for c in eager))
    text = (f"{len(eager)} eager all-reduces ({_size(sizes[0])} to {_size(sizes[-1])}; {dtypes}; "
            f"one-shot and two-shot) and {len(graphed)} graphed steps "
            f"({sum(c.get('replays') or 0 for c in graphed)} replays) ran the custom kernel and match {reference} "
            f"(max abs diff {worst:.3g}); init {max(res.get('init_s', 0.0) for res in results if res):.1f} s, "
            f"{rep.get('arch')}")
    return PASS, text, None, lines, data


def probe_framework(ctx: Context) -> tuple[str, int, list[str], str | None]:
    """(framework, GPUs it sees, their names, why it cannot run the check) for the 2-process check: torch when
    it can (its probe also covers ``tracer="compile"``'s custom op), Paddle when torch cannot and Paddle sees
    GPUs, or whichever ``--framework`` named."""
    checks = {fw: framework_checks(fw) for fw in ("torch", "paddle")}
    if ctx.explicit and len(ctx.frameworks) == 1:
        fw = ctx.frameworks[0]
        return (fw, *checks[fw].doctor_gpus(ctx))
    torch_view = checks["torch"].doctor_gpus(ctx)
    if torch_view[2] is None and torch_view[0] >= 2:
        return ("torch", *torch_view)
    paddle_view = checks["paddle"].doctor_gpus(ctx)
    if paddle_view[2] is None and paddle_view[0] > torch_view[0]:
        return ("paddle", *paddle_view)
    return ("torch", *torch_view)


def check_custom_ar(ctx: Context) -> None:
    """The ``custom all-reduce`` row: a skip without ``--collectives``; else a failure that says why it cannot
    run here (settings, fewer than 2 GPUs torch sees, csrc), or the 2-process check's verdict."""
    r = ctx.report
    check = "custom all-reduce"
    if not ctx.collectives:
        where = "this machine has no GPU; " if not ctx.system_gpus() and not ctx.gpus else ""
        r.add("collectives", check, SKIP, f"not checked: {where}--collectives runs it in 2 processes on 2 GPUs and "
              "compares it with NCCL", "python -m graphjit doctor --collectives (needs 2 GPUs on one node)")
        return
    from .. import env
    from ..collectives import custom_ar

    with contextlib.suppress(Exception):
        off = custom_ar.check_settings(env.settings())
        if off is not None:
            ctx.ar_summary = f"the custom all-reduce is off: {off[1]}"
            r.add("collectives", check, FAIL, f"off by setting ({off[0]}): {off[1]}", _AR_FIXES[off[0]], reason=off)
            return
    framework, count, names, why = probe_framework(ctx)
    gpus = ctx.system_gpus()
    shared = why is None and count == 1 and env.settings().ar_shared_gpu
    if why is not None or (count < 2 and not shared):
        if why is None:
            have = f"{framework} sees {count} ({count_names(names)})" if count else f"{framework} sees none"
        elif gpus:
            have = f"{why}, and nvidia-smi lists {gpus} GPU(s)"
        else:
            have = f"this machine has no GPU ({why})"
        ctx.ar_summary = f"the custom all-reduce cannot be checked here: it needs 2 GPUs on one node; {have}"
        fix: str | None  # also bound below to ar_verdict()'s fix, which may be None
        fix = (f"install a CUDA build of {framework} for your driver (the check runs through its NCCL group)"
               if why is not None and gpus >= 2 else
               "run python -m graphjit doctor --collectives on a machine with 2+ NVIDIA GPUs (and a CUDA build of "
               "torch or paddle)")
        r.add("collectives", check, FAIL, f"needs 2 GPUs on one node, visible to {framework}: {have}", fix,
              gpus=count, reason=why)
        return
    if ctx.csrc == FAIL:
        ctx.ar_summary = "the custom all-reduce cannot run here: csrc does not build or load (see the fixes)"
        r.add("collectives", check, FAIL, "not run: the csrc build failed (see above)", ctx.csrc_fix or NVCC_FIX.format(
            arch="sm_90"))
        return
    t0 = time.perf_counter()
    reference = "the exact sum" if framework == "paddle" else ("gloo" if shared else "NCCL")
    ctx.say(f"the custom all-reduce in 2 processes (init, {2 * len(AR_SIZES)} eager calls per dtype, "
            f"{len(AR_GRAPHED)} graphed steps; up to a minute)")
    results, tails, why = run_ar_pair(ctx.timeout, device="shared" if shared else "cuda", framework=framework)
    status, text, fix, lines, data = ar_verdict(results, tails, why, reference=reference)
    pair = (f"2 processes sharing GPU 0 ({count_names(names[:1])}; GRAPHJIT_AR_SHARED_GPU=1, a test mode: P2P, "
            "NVLink and speed not checked)" if shared else f"GPUs 0,1 of {count} ({count_names(names[:2])})")
    data["shared_gpu"] = bool(shared)
    data["framework"] = framework
    data["seconds"] = time.perf_counter() - t0
    ctx.ar_summary = (f"the custom all-reduce matches {reference} on {pair}" if status == PASS
                      else f"the custom all-reduce FAILS on {pair}: all_reduce runs the framework's collective "
                      f"({reference}) until it is fixed")
    r.add("collectives", check, status, f"{pair}, {text}", fix, lines=lines, **data)
