"""The system rows: Python, graphjit and its dependencies, the ``GRAPHJIT_*`` variables, the NVIDIA driver
and the GPUs ``nvidia-smi`` lists (no framework involved)."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
import sys
from typing import Any

from .children import ROOT, run_command
from .context import Context
from .report import FAIL, PASS, SKIP
from .text import count_names, first_line


def _dist_version(name: str) -> str | None:
    """The installed version of distribution ``name``; None if it is not installed."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def check_system(ctx: Context) -> None:
    """The ``system`` rows: python, graphjit (and numpy, wrapt), ``GRAPHJIT_*`` variables, NVIDIA driver; sets
    ``ctx.smi`` and ``ctx.disabled``."""
    r = ctx.report
    from .. import __version__
    from ..records import git_commit

    vi = sys.version_info
    py = f"{platform.python_version()} ({platform.python_implementation()}, {platform.system()} {platform.machine()})"
    if vi < (3, 10):
        r.add("system", "python", FAIL, py, "graphjit needs Python >= 3.10; use Python 3.11 (Paddle 2.6's SOT "
              "tracer supports at most 3.11)", executable=sys.executable)
    else:
        r.add("system", "python", PASS, py, executable=sys.executable)
    commit = git_commit()
    deps = {name: _dist_version(name) for name in ("numpy", "wrapt")}
    missing = [n for n, v in deps.items() if v is None]
    text = f"{__version__}{f' (git {commit})' if commit else ''} at {ROOT / 'graphjit'}; " + ", ".join(
        f"{n} {v or 'MISSING'}" for n, v in deps.items())
    r.add("system", "graphjit", FAIL if missing else PASS, text,
          f"pip install {' '.join(missing)}" if missing else None, version=__version__, commit=commit, deps=deps)

    from .. import env
    from ..errors import ConfigError

    set_vars = {k: v for k, v in sorted(os.environ.items()) if k.startswith("GRAPHJIT_")}
    try:
        settings = env.refresh()
    except ConfigError as exc:
        r.add("system", "GRAPHJIT_* variables", FAIL, str(exc), "fix or unset that variable (python -m graphjit "
              "env lists every variable and its values)", variables=set_vars)
    else:
        shown = ", ".join(f"{k}={v}" for k, v in set_vars.items()) or "none set (defaults)"
        if settings.disable:
            ctx.disabled = True
            r.add("system", "GRAPHJIT_* variables", SKIP, shown + "; GRAPHJIT_DISABLE=1: graphed functions call "
                  "the original function, nothing is captured", "unset GRAPHJIT_DISABLE to capture graphs",
                  variables=set_vars)
        else:
            r.add("system", "GRAPHJIT_* variables", PASS, shown, variables=set_vars)
        check_lane(ctx, settings.lane)

    ctx.smi = nvidia_smi()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    note = f"; CUDA_VISIBLE_DEVICES={visible!r}" if visible is not None else ""
    if ctx.smi is None:
        r.add("system", "NVIDIA driver", SKIP, "nvidia-smi not found: no NVIDIA driver on this machine" + note,
              "on a GPU machine, install the NVIDIA driver (nvidia-smi must work)", smi=None)
    elif ctx.smi.get("error"):
        # Not blocking by itself: the frameworks' GPU rows say whether a GPU can be used.
        r.add("system", "NVIDIA driver", FAIL, f"nvidia-smi failed: {ctx.smi['error']}" + note,
              "nvidia-smi must list the GPUs: check the driver installation (dmesg, nvidia-smi)", blocking=False,
              smi=ctx.smi)
    else:
        gpus = ctx.smi["gpus"]
        names = count_names([g["name"] for g in gpus])
        caps = sorted({g["capability"] for g in gpus if g.get("capability")})
        cuda = ctx.cuda_driver().version()
        text = (f"{len(gpus)} GPU(s): {names}" + (f" ({', '.join('sm_' + c.replace('.', '') for c in caps)})"
                                                   if caps else "")
                + f", driver {ctx.smi.get('driver') or '?'}" + (f" (CUDA {cuda[0]}.{cuda[1]})" if cuda else "") + note)
        r.add("system", "NVIDIA driver", PASS if gpus else SKIP, text, smi=ctx.smi,
              cuda_driver=f"{cuda[0]}.{cuda[1]}" if cuda else None)


def nvidia_smi() -> dict[str, Any] | None:
    """The GPUs and driver version ``nvidia-smi`` lists (retried without ``compute_cap`` for old drivers);
    None without ``nvidia-smi``; ``error`` set when it fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    info: dict[str, Any] = {"path": exe, "gpus": [], "driver": None}
    fields = ["index", "name", "driver_version", "compute_cap", "memory.total"]
    for attempt in (fields, [f for f in fields if f != "compute_cap"]):
        proc = run_command([exe, f"--query-gpu={','.join(attempt)}", "--format=csv,noheader,nounits"])
        if proc is None:
            info["error"] = "nvidia-smi did not answer within 20 s"
            return info
        if proc.returncode == 0:
            info.pop("error", None)
            for line in proc.stdout.strip().splitlines():
                parts = [p.strip() for p in line.split(",")]
                if len(parts) != len(attempt):
                    continue
                row = dict(zip(attempt, parts))
                info["driver"] = row.get("driver_version")
                info["gpus"].append({"index": row["index"], "name": row["name"],
                                     "capability": row.get("compute_cap"), "memory_mib": row.get("memory.total")})
            return info
        last = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or [f"exit status {proc.returncode}"]
        info["error"] = last[0][:200]
    return info


def check_lane(ctx: Context, setting: str) -> None:
    """The ``replay lane`` row: the lane loaded here where it is built, else whether it can be built (a C compiler,
    Python's headers); writes nothing.  Never a failure: without it every call takes graphjit's Python path."""
    from .. import lane

    r = ctx.report
    if setting == "off":
        r.add("system", "replay lane", SKIP, "GRAPHJIT_LANE=off: every replayed call takes graphjit's Python path",
              "unset GRAPHJIT_LANE to serve plain replayed calls in C")
        return
    try:
        built = lane.library_path().is_file()
    except lane.LaneBuildError as exc:
        r.add("system", "replay lane", SKIP, first_line(exc), "reinstall graphjit", lane=lane.status())
        return
    if built:
        loaded = lane.prepare()
        if loaded is None:
            r.add("system", "replay lane", SKIP, f"built but not loaded: {lane.status().get('failed')}",
                  f"delete {lane.library_path()} to build it again", lane=lane.status())
        else:
            r.add("system", "replay lane", PASS, f"{lane.library_path()} (plain replayed calls are served in C)",
                  lane=lane.status())
        return
    missing = lane.missing_tools()
    if missing is not None:
        r.add("system", "replay lane", SKIP, f"cannot be built here: {missing}; every replayed call takes "
              "graphjit's Python path", "install a C compiler and Python's development headers (python3-dev)")
        return
    cc = shutil.which(lane.compiler()[0])
    r.add("system", "replay lane", PASS, f"not built yet ({cc}): builds itself where a key first replays twice in a "
          "row (GRAPHJIT_LANE=auto: in the background)", "python -m graphjit build builds it ahead of time")
