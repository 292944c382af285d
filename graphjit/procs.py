"""Supervising a group of worker processes (2-GPU checks in doctor and the all-reduce benchmark).

:func:`supervise` waits for every process, never forever: past ``timeout_s`` or, once one process has
ended (``grace_after="any"``) or failed (``grace_after="failure"``), past ``grace_s`` more, it kills
whatever still runs.  A rank that waits in a collective for a peer that died would otherwise hang.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from typing import Literal


def supervise(procs: list[subprocess.Popen[bytes]], timeout_s: float, grace_s: float,
              grace_after: Literal["any", "failure"] = "failure", poll_s: float = 0.05) -> tuple[str, int] | None:
    """Wait for ``procs``; None when all ended by themselves, else why they were stopped:
    ``("timeout", -1)``, or ``("grace", rank)`` with the rank whose end started the grace period.
    Every process has ended (or been killed) when this returns."""
    try:
        deadline = time.monotonic() + timeout_s
        grace: float | None = None
        first = -1
        while True:
            codes = [p.poll() for p in procs]  # poll every process, each time
            if all(c is not None for c in codes):
                return None
            now = time.monotonic()
            if grace is None:
                ended = [r for r, c in enumerate(codes) if c is not None and (grace_after == "any" or c != 0)]
                if ended:
                    first, grace = ended[0], now + grace_s
            if now > deadline:
                return ("timeout", -1)
            if grace is not None and now > grace:
                return ("grace", first)
            time.sleep(poll_s)
    finally:
        kill_all(procs)


def kill_all(procs: list[subprocess.Popen[bytes]]) -> None:
    """Kill every process still running and reap it (10 s at most each)."""
    for p in procs:
        if p.poll() is None:
            p.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(10)
