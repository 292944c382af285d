"""Multi-process GPU tests: launch one worker process per rank, collect their JSON, read sections.

A test file that uses this runs itself as the worker script (``python FILE RANK PORT OUT [MODE]``);
each worker runs named sections in order, records a section's exception instead of stopping (one
broken section does not hide the others), writes its results after every section, and ends with
``os._exit`` (NCCL, Paddle and IPC mappings may hang at interpreter exit).

After every section the ranks meet at a barrier (files next to the results): no rank starts a
section's collectives while another is still in the previous one's, and if any rank's section
raised, every rank stops there (the next sections' collectives would pair with the wrong calls).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

import pytest

from graphjit.procs import supervise


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(script: Path, world: int, name: str, out_dir: Path, environ: dict[str, str], timeout: float,
           extra_args: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Run ``script`` as ``world`` worker processes; their JSON results, in rank order.

    Fails the test (with the tail of every rank's log) if a worker does not finish in ``timeout``
    seconds (all are killed) or writes no result.
    """
    port = free_port()
    environ = {**environ, "GJ_MP_WORLD": str(world), "GJ_MP_TIMEOUT": str(timeout)}
    outs = [out_dir / f"{name}-{r}.json" for r in range(world)]
    logs = [out_dir / f"{name}-{r}.log" for r in range(world)]
    procs = []
    for r in range(world):
        with open(logs[r], "w") as log:
            procs.append(subprocess.Popen([sys.executable, str(script), str(r), str(port), str(outs[r]), *extra_args],
                                          env=environ, stdout=log, stderr=subprocess.STDOUT, cwd=script.parents[1]))
    if supervise(procs, timeout, grace_s=timeout) is not None:  # every worker is killed when this returns
        tails = "\n".join(f"--- rank {r} ---\n{logs[r].read_text()[-3000:]}" for r in range(world))
        pytest.fail(f"the {name} workers did not finish in {timeout:.0f} s:\n{tails}")
    results = []
    for r in range(world):
        if not outs[r].is_file():
            pytest.fail(f"rank {r} of {name} wrote no result (exit {procs[r].returncode}):\n"
                        f"{logs[r].read_text()[-6000:]}")
        results.append(json.loads(outs[r].read_text()))
    return results


def section(results: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    """Every rank's section ``name``; fails the test if a rank crashed, skipped it or raised in it."""
    out = []
    for r, res in enumerate(results):
        if "fatal" in res:
            pytest.fail(f"rank {r} crashed before section {name}:\n{res['fatal']}")
        sec = res["sections"].get(name)
        if sec is None:
            pytest.fail(f"rank {r} did not run section {name} (earlier error: {res.get('first_error')})")
        if "error" in sec:
            pytest.fail(f"rank {r}, section {name} raised:\n{sec['error']}")
        out.append(sec)
    return out


def barrier(out: Path, section: str, ok: bool) -> bool:
    """Wait until every rank finished ``section``; True if all of them succeeded.

    Each rank writes ``<out>.<section>.ok`` or ``.fail`` and waits for the others' files (the rank's
    own results file ``<name>-<rank>.json`` names its peers' ``<name>-<r>.json``).  Gives up after
    the launcher's timeout (the launcher kills the workers first).
    """
    world = int(os.environ.get("GJ_MP_WORLD", "1"))
    stem, _, _rank = out.stem.rpartition("-")
    (out.parent / f"{out.name}.{section}.{'ok' if ok else 'fail'}").write_text("")
    deadline = time.monotonic() + float(os.environ.get("GJ_MP_TIMEOUT", "600"))
    while time.monotonic() < deadline:
        states = []
        for r in range(world):
            peer = out.parent / f"{stem}-{r}.json"
            states.append("ok" if Path(f"{peer}.{section}.ok").exists() else
                          "fail" if Path(f"{peer}.{section}.fail").exists() else None)
        if None not in states:
            return all(st == "ok" for st in states)
        time.sleep(0.02)
    return False


def run_worker(make: Callable[[], Any], sections: Sequence[str], out: Path,
               enabled: Callable[[Any], bool] = lambda w: True) -> NoReturn:
    """Worker side: ``make()`` the worker, run its ``section_<name>`` methods, write JSON, ``os._exit``.

    After section ``init``, stops if ``enabled(worker)`` is false (nothing else can work); after any
    section, stops if a rank's section raised (see :func:`barrier`).
    """
    result: dict[str, Any] = {"sections": {}}
    code = 0
    try:
        w = make()
        for name in sections:
            t0 = time.perf_counter()
            try:
                sec = getattr(w, f"section_{name}")()
            except BaseException:
                sec = {"error": traceback.format_exc()}
                result.setdefault("first_error", f"{name}: {sec['error'][-1500:]}")
                code = 1
            sec["seconds"] = round(time.perf_counter() - t0, 2)
            result["sections"][name] = sec
            out.write_text(json.dumps(result, default=str))
            if not barrier(out, name, "error" not in sec):
                result["stopped_after"] = f"{name}: a rank's section raised (or a rank did not arrive)"
                break
            if name == "init" and not enabled(w):
                break
    except BaseException:
        result["fatal"] = traceback.format_exc()
        code = 1
    out.write_text(json.dumps(result, default=str))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
