"""What the 2-process all-reduce probes of ``doctor --collectives`` share (framework-neutral).

Each framework's probe (:mod:`graphjit.doctor.torch.allreduce`, :mod:`graphjit.doctor.paddle.allreduce`)
runs as one rank and reports through a :class:`ProbeRun`: a JSON result rewritten atomically at every stage
(so that a hang or a crash still says where it stopped), the cases, the collectives' statistics, and an exit
through ``os._exit`` (no interpreter teardown with NCCL and IPC mappings alive).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any, NoReturn

from .. import env
from .allreduce import AR_MAX_BYTES


def placement(kind: str, rank: int) -> tuple[bool, int, str]:
    """(on a GPU, the GPU index, the group's backend) of ``rank`` for the probe's DEVICE ``kind``: "cuda" (one GPU
    per rank, NCCL), "shared" (both ranks on GPU 0, gloo: ``GRAPHJIT_AR_SHARED_GPU=1``) or "cpu" (gloo)."""
    return kind in ("cuda", "shared"), 0 if kind == "shared" else rank, "nccl" if kind == "cuda" else "gloo"


def set_algo(algo: str) -> None:
    """``GRAPHJIT_AR_ALGO=algo`` for the calls that follow (the setting is read at each call)."""
    os.environ.update(GRAPHJIT_AR_ALGO=algo)  # a write: settings are read in graphjit.env only
    env.refresh()


def custom_calls(collectives: Any, what: str) -> int:
    """How many all-reduces ran the custom kernel so far, ``what``: "eager" or "captured"."""
    return int(collectives.stats()["custom"][what])


class ProbeRun:
    """The result file of one rank: ``rank``, ``stage``, ``done``, ``cases`` and, at the end, ``fallbacks``
    and ``reasons``, or ``error`` and ``traceback``."""

    def __init__(self, rank: int, out: str, stage: str) -> None:
        self.out = out
        self.result: dict[str, Any] = {"rank": rank, "stage": stage, "cases": [], "done": False}

    def save(self) -> None:
        with open(self.out + ".tmp", "w") as f:
            json.dump(self.result, f, default=str)
        os.replace(self.out + ".tmp", self.out)

    def stage(self, name: str) -> None:
        """Record that ``name`` starts (and save: a hang there leaves it named)."""
        self.result["stage"] = name
        self.save()

    def stage_group(self, backend: str) -> None:
        """The stage of joining the process group (``backend``: "nccl" or "gloo")."""
        self.stage(f"{'NCCL' if backend == 'nccl' else backend} group")

    def finish(self, code: int) -> NoReturn:
        self.save()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # no interpreter teardown: NCCL and the IPC mappings go with the process

    def done(self, stats: dict[str, Any] | None = None) -> NoReturn:
        """Finish successfully; ``stats``: :func:`graphjit.collectives.stats` at the end."""
        if stats is not None:
            self.result["fallbacks"], self.result["reasons"] = stats["fallbacks"], stats["reasons"]
        self.result["stage"], self.result["done"] = "done", True
        self.finish(0)

    def init_collectives(self, collectives: Any, backend: str, timeout: float, gpu: bool) -> Any:
        """``collectives.init`` for the check (max_bytes :data:`~graphjit.doctor.allreduce.AR_MAX_BYTES`, the
        kernel's watchdog at most 60 s), timed and recorded.  On a GPU, a custom all-reduce that init turned
        off ends the run here (the verdict reads why from the report); on the CPU the calls go on, to the
        framework's collective."""
        self.stage("collectives.init")
        t0 = time.perf_counter()
        report = collectives.init(max_bytes=AR_MAX_BYTES, timeout_s=min(60.0, timeout), backend=backend)
        self.result["init_s"] = round(time.perf_counter() - t0, 2)
        self.result["report"] = report.as_dict()
        self.save()
        if gpu and not report.enabled:
            self.done()
        return report

    def run(self, body: Callable[[ProbeRun], None]) -> NoReturn:
        """Run ``body`` (which ends with :meth:`done`); any exception becomes ``error`` and exit status 1."""
        try:
            body(self)
            self.done()
        except BaseException as exc:
            lines = [line for line in str(exc).strip().splitlines() if line.strip()]
            self.result["error"] = (type(exc).__name__ + ": " + (lines[-1] if lines else ""))[:400]
            self.result["traceback"] = traceback.format_exc()[-3000:]
            self.finish(1)


def record_diff(case: dict[str, Any], diff: float, scale: float, eps: float) -> None:
    """Fold one comparison into ``case``: the largest absolute difference and value so far, and the tolerance,
    one ulp (``eps``) of the largest value."""
    case["max_abs_diff"] = max(case.get("max_abs_diff", 0.0), diff)
    case["max_abs"] = max(case.get("max_abs", 0.0), scale)
    case["tol"] = eps * case["max_abs"]


def close_graphed_case(case: dict[str, Any], fn_stats: dict[str, Any], captured: int) -> dict[str, Any]:
    """A graphed step's case: its graphed function's stats and how many all-reduces were captured; it ran the
    custom kernel if at least one was captured, the graph replayed, and nothing fell back."""
    case.update(graphs=fn_stats.get("graphs"), replays=fn_stats.get("replays"),
                fallbacks=fn_stats.get("fallbacks") or {}, captured=captured)
    case["custom"] = bool(captured >= 1 and case["replays"] and not case["fallbacks"])
    return case
