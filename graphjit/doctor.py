"""``python -m graphjit doctor``: what works on this machine, and why not.

Prints a first summary line (is there a GPU, will graphs be captured), then one row per check with a
mark (``pass`` / ``fail`` / ``skip``) and, under each failure, the fix in one line:

* system: Python, graphjit and its dependencies, the ``GRAPHJIT_*`` variables, the NVIDIA driver
  and the GPUs ``nvidia-smi`` lists;
* per framework (``--framework paddle|torch|all``): version and build (CUDA or CPU), the GPUs the
  framework sees (count, names, compute capability, driver), and a tiny capture-and-replay through
  :func:`graphjit.graphed` on the GPU, checked against eager.  Paddle's checks use only matmul and
  copies and are compared in numpy (paddlepaddle-gpu 2.6.2 has no working elementwise kernels on
  Hopper); Paddle's GPU runs happen in subprocesses (one per tracer: eager, sot), so a crash in
  Paddle cannot take the doctor down.  Paddle also gets its capture flags and a kernel check (does
  an elementwise add on the GPU compute right);
* collectives (the custom all-reduce, :mod:`graphjit.collectives`):

  - ``nvcc`` (``GRAPHJIT_NVCC``, ``PATH``, ``CUDA_HOME``, ``/usr/local/cuda``) and its version;
  - ``csrc build``: compile-or-load the library for the architecture of this machine's GPUs, in
    ``GRAPHJIT_CACHE_DIR`` (as :func:`graphjit.collectives.init` would on first use), and query GPU 0
    through it.  Without a GPU there is no target architecture: the row is a ``skip`` (nothing is
    compiled), except with ``--collectives``, which compiles csrc once for sm_90 into a temporary
    directory (a few seconds) and loads it, to prove the toolchain;
  - the P2P / NVLink matrix between visible GPUs and a CUDA IPC probe between two processes;
  - ``custom all-reduce`` (``--collectives`` only; plain ``doctor`` never starts NCCL): two processes,
    one per GPU (GPUs 0 and 1 as torch sees them), in a torch NCCL group run
    :func:`graphjit.collectives.init` and custom all-reduces of 16 B to 8 MiB in float32, float16
    and bfloat16 with the one-shot and two-shot kernels, eager and inside :func:`graphjit.graphed`
    steps, each compared with NCCL's result (max abs diff, allowed one ulp of the largest value).
    ``NCCL_NVLS_ENABLE`` is 0 in those processes unless set.  With fewer than 2 GPUs, or without
    a CUDA build of torch, the row fails and says why.

Exit status: 0 when everything asked for can work; 1 when a check that matters for what was asked
fails (for instance a GPU that no installed framework can use, a capture that fails, a framework
named with ``--framework`` that is not installed, or, with ``--collectives``, a custom all-reduce
that cannot be built or run here or that differs from NCCL; on a machine with fewer than 2 GPUs
``--collectives`` always exits 1).  A CPU-only machine exits 0 without ``--collectives``: graphjit
then runs the traced function, and the summary line says so.  Failures of checks that only the
custom all-reduce needs (nvcc, csrc build, P2P, NVLink, IPC) and Paddle's kernel check are shown as
``fail`` but change the exit status only with ``--collectives`` (respectively never); the last line
says which failures count.

``--json PATH`` also writes every row (and the facts behind it) as JSON.  Frameworks are imported
only inside the functions below, never when this module is imported.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast

from .procs import kill_all, supervise

PASS, FAIL, SKIP = "pass", "fail", "skip"
FRAMEWORKS = ("torch", "paddle")
RESULT_MARK = "graphjit-doctor-result: "
ROOT = Path(__file__).resolve().parents[1]  # the folder holding the graphjit package (for subprocesses)


# -- rows and the report ----------------------------------------------------------------------------
@dataclass
class Row:
    """One line of the doctor's table."""

    section: str
    check: str
    status: str  # PASS | FAIL | SKIP
    result: str
    fix: str | None = None
    blocking: bool = True
    """A failure here makes the exit status non-zero (False: informational for what was asked)."""
    lines: list[str] = field(default_factory=list)
    """Extra lines printed under the row (a P2P matrix, say)."""
    data: dict[str, Any] = field(default_factory=dict)
    """Facts behind the row, for ``--json``."""

    def as_dict(self) -> dict[str, Any]:
        return {"section": self.section, "check": self.check, "status": self.status, "result": self.result,
                "fix": self.fix, "blocking": self.blocking, "lines": list(self.lines), "data": self.data}


@dataclass
class Report:
    """Every row, the summary lines and the exit status."""

    rows: list[Row] = field(default_factory=list)
    summary: list[str] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)

    def add(self, section: str, check: str, status: str, result: str, fix: str | None = None, *,
            blocking: bool = True, lines: list[str] | None = None, **data: Any) -> Row:
        row = Row(section, check, status, result, fix, blocking, list(lines or []), data)
        self.rows.append(row)
        return row

    def failures(self, blocking: bool | None = None) -> list[Row]:
        return [r for r in self.rows if r.status == FAIL and (blocking is None or r.blocking == blocking)]

    @property
    def exit_code(self) -> int:
        return 1 if self.failures(blocking=True) else 0

    def render(self) -> str:
        width = max([len(r.check) for r in self.rows] + [5])
        out = [*(f"graphjit doctor: {s}" for s in self.summary[:1]), *self.summary[1:], ""]
        out.append(f"{'mark':4s}  {'check':{width}s}  result")
        out.append(f"{'-' * 4}  {'-' * width}  {'-' * 6}")
        indent = " " * (6 + width + 2)
        for r in self.rows:
            out.append(f"{r.status:4s}  {r.check:{width}s}  {r.result}")
            out.extend(indent + line for line in r.lines)
            if r.fix and r.status in (FAIL, SKIP):
                out.append(f"{indent}{'fix' if r.status == FAIL else 'hint'}: {r.fix}")
        out.append("")
        blocking, other = self.failures(blocking=True), self.failures(blocking=False)
        if blocking:
            out.append(f"exit status 1: {len(blocking)} failed check(s) stop what you asked for: "
                       + ", ".join(r.check for r in blocking))
        else:
            out.append("exit status 0: nothing you asked for is blocked")
        if other:
            out.append(f"  {len(other)} failed check(s) do not change the exit status "
                       f"({', '.join(r.check for r in other)}): "
                       "they matter only for the custom all-reduce (--collectives) or for your own model's kernels")
        return "\n".join(out)

    def as_dict(self) -> dict[str, Any]:
        from . import __version__

        counts = {s: sum(1 for r in self.rows if r.status == s) for s in (PASS, FAIL, SKIP)}
        return {"tool": "graphjit doctor", "graphjit": __version__, "options": self.options,
                "summary": self.summary, "exit_code": self.exit_code, "counts": counts,
                "rows": [r.as_dict() for r in self.rows]}


# -- small helpers ----------------------------------------------------------------------------------
def _first_line(exc: BaseException) -> str:
    text = [line for line in str(exc).strip().splitlines() if line.strip()]
    return f"{type(exc).__name__}: {text[-1] if text else ''}".strip().rstrip(":")[:300]


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _run(cmd: list[str], timeout: float = 20, **kwargs: Any) -> subprocess.CompletedProcess[str] | None:
    """Run a command; None if it cannot be started or runs past ``timeout``."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False, **kwargs)
    except (OSError, subprocess.SubprocessError):
        return None


def _signal_name(code: int) -> str:
    with contextlib.suppress(ValueError):
        return signal.Signals(-code).name
    return f"signal {-code}"


def _child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    environ = dict(os.environ)
    environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), environ.get("PYTHONPATH", "")) if p)
    environ.setdefault("PYTHONUNBUFFERED", "1")
    environ.update(extra or {})
    return environ


def _run_child(script: str, argv: list[str], timeout: float, extra_env: dict[str, str] | None = None
               ) -> tuple[dict[str, Any] | None, str]:
    """Run ``script`` in a fresh Python; return (the JSON it reported, None if none) and why not."""
    with tempfile.TemporaryDirectory(prefix="graphjit-doctor-") as tmp:
        path = Path(tmp) / "probe.py"  # a file, not -c: tracers read the function's source
        path.write_text(script)
        try:
            proc = subprocess.run([sys.executable, str(path), *argv], capture_output=True, text=True,
                                  timeout=timeout, cwd=tmp, env=_child_env(extra_env), check=False)
        except subprocess.TimeoutExpired:
            return None, f"the probe process hung for more than {timeout:.0f} s"
        except OSError as exc:
            return None, f"could not start a Python subprocess ({exc})"
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_MARK):
            with contextlib.suppress(ValueError):
                return json.loads(line[len(RESULT_MARK):]), ""
    tail = " | ".join(line.strip() for line in proc.stderr.strip().splitlines()[-3:])[-400:]
    how = (f"crashed ({_signal_name(proc.returncode)})" if proc.returncode < 0
           else f"exited with status {proc.returncode} without a result")
    return None, f"the probe process {how}" + (f": {tail}" if tail else "")


class _Driver:
    """The CUDA driver API through ctypes (best effort): version, device count, peer access."""

    def __init__(self) -> None:
        self.lib: Any = None
        self.error: str | None = None
        for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll", "libcuda.dylib"):
            try:
                self.lib = ctypes.CDLL(name)
                break
            except OSError:
                continue
        if self.lib is None:
            self.error = "libcuda (the NVIDIA driver library) is not installed"
            return
        rc = self.lib.cuInit(0)
        if rc != 0:
            self.error = f"cuInit failed with CUDA driver error {rc}"
            self.lib = None

    def version(self) -> tuple[int, int] | None:
        if self.lib is None:
            return None
        v = ctypes.c_int(0)
        if self.lib.cuDriverGetVersion(ctypes.byref(v)) != 0:
            return None
        return v.value // 1000, (v.value % 1000) // 10

    def count(self) -> int:
        n = ctypes.c_int(0)
        if self.lib is None or self.lib.cuDeviceGetCount(ctypes.byref(n)) != 0:
            return 0
        return n.value

    def can_access_peer(self, i: int, j: int) -> bool | None:
        if self.lib is None:
            return None
        a, b, ok = ctypes.c_int(0), ctypes.c_int(0), ctypes.c_int(0)
        if self.lib.cuDeviceGet(ctypes.byref(a), i) or self.lib.cuDeviceGet(ctypes.byref(b), j):
            return None
        if self.lib.cuDeviceCanAccessPeer(ctypes.byref(ok), a, b) != 0:
            return None
        return bool(ok.value)


# -- the checks -------------------------------------------------------------------------------------
@dataclass
class _Context:
    report: Report
    frameworks: tuple[str, ...]
    explicit: bool
    collectives: bool
    timeout: float
    smi: dict[str, Any] | None = None
    driver: _Driver | None = None
    gpus: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # framework -> devices it sees
    captures: dict[str, str] = field(default_factory=dict)  # "torch", "paddle eager", ... -> PASS/FAIL/SKIP
    disabled: bool = False
    nvcc: str | None = None  # the nvcc the nvcc row found and ran
    nvcc_version: tuple[int, int] | None = None
    csrc: str = SKIP  # the csrc build row's status
    csrc_fix: str | None = None
    ar_summary: str | None = None  # the --collectives summary line

    def cuda_driver(self) -> _Driver:
        if self.driver is None:
            self.driver = _Driver()
        return self.driver

    def system_gpus(self) -> int:
        return len(self.smi["gpus"]) if self.smi and self.smi.get("gpus") else 0


def _check_system(ctx: _Context) -> None:
    r = ctx.report
    from . import __version__
    from .bench.common import git_commit

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

    from . import env
    from .errors import ConfigError

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

    ctx.smi = _nvidia_smi()
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
        names = _count_names([g["name"] for g in gpus])
        caps = sorted({g["capability"] for g in gpus if g.get("capability")})
        cuda = ctx.cuda_driver().version()
        text = (f"{len(gpus)} GPU(s): {names}" + (f" ({', '.join('sm_' + c.replace('.', '') for c in caps)})"
                                                   if caps else "")
                + f", driver {ctx.smi.get('driver') or '?'}" + (f" (CUDA {cuda[0]}.{cuda[1]})" if cuda else "") + note)
        r.add("system", "NVIDIA driver", PASS if gpus else SKIP, text, smi=ctx.smi,
              cuda_driver=f"{cuda[0]}.{cuda[1]}" if cuda else None)


def _count_names(names: list[str]) -> str:
    seen: dict[str, int] = {}
    for n in names:
        seen[n] = seen.get(n, 0) + 1
    return ", ".join(f"{c} x {n}" if c > 1 else n for n, c in seen.items()) or "none"


def _nvidia_smi() -> dict[str, Any] | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    info: dict[str, Any] = {"path": exe, "gpus": [], "driver": None}
    fields = ["index", "name", "driver_version", "compute_cap", "memory.total"]
    for attempt in (fields, [f for f in fields if f != "compute_cap"]):
        proc = _run([exe, f"--query-gpu={','.join(attempt)}", "--format=csv,noheader,nounits"])
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


def _gpu_text(devices: list[dict[str, Any]], driver: str | None) -> str:
    names = _count_names([d["name"] for d in devices])
    caps = ", ".join(sorted({f"sm_{d['capability'].replace('.', '')}" for d in devices if d.get("capability")}))
    mem = devices[0].get("memory_gib") if devices else None
    spec = f" ({caps}" + (f", {mem:.0f} GiB" if mem else "") + ")" if caps else ""
    return f"{len(devices)} GPU(s): {names}{spec}" + (f", driver {driver}" if driver else "")


def _driver_text(ctx: _Context) -> str | None:
    if ctx.smi and ctx.smi.get("driver"):
        return str(ctx.smi["driver"])
    v = ctx.cuda_driver().version()
    return f"CUDA {v[0]}.{v[1]} driver API" if v else None


# -- torch ------------------------------------------------------------------------------------------
def _check_torch(ctx: _Context) -> None:
    r = ctx.report
    if importlib.util.find_spec("torch") is None:
        if ctx.explicit:
            r.add("torch", "torch", FAIL, "not installed", "pip install torch (a CUDA build for GPUs: see "
                  "https://pytorch.org/get-started/locally/)")
        else:
            r.add("torch", "torch", SKIP, "not installed (pass --framework paddle to check only Paddle)",
                  "pip install torch, if you use PyTorch")
        return
    try:
        import torch
    except Exception as exc:
        r.add("torch", "torch", FAIL, f"import failed: {_first_line(exc)}", "reinstall torch (pip install "
              "--force-reinstall torch) in this environment")
        return
    cuda_build = bool(torch.backends.cuda.is_built()) and torch.version.cuda is not None
    hip = getattr(torch.version, "hip", None)
    build = f"CUDA {torch.version.cuda} build" if cuda_build else (f"ROCm {hip} build" if hip else "CPU build")
    facts: dict[str, Any] = {"version": torch.__version__, "cuda": torch.version.cuda, "hip": hip}
    if not cuda_build and ctx.system_gpus():
        r.add("torch", "torch build", FAIL, f"{torch.__version__}, {build}, but this machine has "
              f"{ctx.system_gpus()} NVIDIA GPU(s)", "install a CUDA build of torch for your driver, e.g. pip install "
              "torch --index-url https://download.pytorch.org/whl/cu128", **facts)
    else:
        r.add("torch", "torch build", PASS, f"{torch.__version__}, {build}", **facts)

    devices: list[dict[str, Any]] = []
    if hip:
        r.add("torch", "torch GPUs", SKIP, "ROCm build: graphjit supports CUDA GPUs only")
    elif not cuda_build:
        r.add("torch", "torch GPUs", SKIP, "CPU build: no GPU")
    elif not torch.cuda.is_available():
        status = FAIL if ctx.system_gpus() else SKIP
        r.add("torch", "torch GPUs", status, "torch sees no CUDA GPU"
              + (f" although nvidia-smi lists {ctx.system_gpus()}" if ctx.system_gpus() else ""),
              f"check CUDA_VISIBLE_DEVICES and that the driver supports CUDA {torch.version.cuda} "
              "(nvidia-smi shows the highest CUDA version it supports)" if status == FAIL else None)
    else:
        try:
            arch_list = list(torch.cuda.get_arch_list())
            for i in range(torch.cuda.device_count()):
                p = torch.cuda.get_device_properties(i)
                devices.append({"index": i, "name": p.name, "capability": f"{p.major}.{p.minor}",
                                "memory_gib": p.total_memory / 2**30})
        except Exception as exc:
            r.add("torch", "torch GPUs", FAIL, f"querying the GPUs failed: {_first_line(exc)}",
                  "check the driver with nvidia-smi")
        else:
            ctx.gpus["torch"] = devices
            unsupported = sorted({d["capability"] for d in devices if not _torch_arch_ok(d["capability"], arch_list)})
            text = _gpu_text(devices, _driver_text(ctx))
            if unsupported and arch_list:
                r.add("torch", "torch GPUs", FAIL, f"{text}; torch {torch.__version__} has no kernels for "
                      f"{', '.join('sm_' + c.replace('.', '') for c in unsupported)} (built for {' '.join(arch_list)})",
                      "install a torch build that supports this GPU (a newer CUDA wheel)", devices=devices,
                      arch_list=arch_list)
            else:
                r.add("torch", "torch GPUs", PASS, text, devices=devices, arch_list=arch_list)
    _torch_capture(ctx, torch, bool(devices))


def _torch_arch_ok(capability: str, arch_list: list[str]) -> bool:
    major, minor = (int(v) for v in capability.split("."))
    cc = major * 10 + minor
    for arch in arch_list:
        m = re.fullmatch(r"(sm|compute)_(\d+)([a-z]?)", arch)
        if not m:
            continue
        n = int(m.group(2))
        if m.group(1) == "sm" and n == cc:
            return True
        if m.group(1) == "compute" and n <= cc:  # PTX that the driver compiles for this GPU
            return True
    return False


def _torch_capture(ctx: _Context, torch: Any, gpu: bool) -> None:
    r = ctx.report
    if ctx.disabled:
        r.add("torch", "torch capture+replay", SKIP, "GRAPHJIT_DISABLE=1", "unset GRAPHJIT_DISABLE")
        ctx.captures["torch"] = SKIP
        return
    import graphjit

    device = "cuda:0" if gpu else "cpu"
    calls = 4
    try:
        g = torch.Generator().manual_seed(0)
        w1 = torch.randn(64, 64, generator=g).to(device)
        w2 = torch.randn(64, 32, generator=g).to(device)

        def tiny(x: Any) -> Any:
            return torch.relu(x @ w1) @ w2 + 1.0

        step = cast(graphjit.GraphedFunction, graphjit.graphed(tiny, strict=True))
        worst = 0.0
        with torch.no_grad():
            for _ in range(calls):
                x = torch.randn(8, 64, generator=g).to(device)
                got = step(x)
                want = tiny(x)
                err = float((got.double() - want.double()).norm() / want.double().norm().clamp_min(1e-30))
                worst = max(worst, err)
        stats = step.stats()
    except Exception as exc:
        ctx.captures["torch"] = FAIL
        r.add("torch", "torch capture+replay", FAIL, f"{'on ' + device if gpu else 'CPU fallback'}: {_first_line(exc)}",
              "run with GRAPHJIT_DEBUG=1 python -m graphjit -vv doctor --framework torch and report the log")
        return
    _graphed_row(ctx, "torch", "torch capture+replay", gpu, device, stats, worst, calls, 1e-4)


def _graphed_row(ctx: _Context, section: str, check: str, gpu: bool, device: str, stats: dict[str, Any],
                 worst: float, calls: int, tol: float, tag: str | None = None) -> None:
    r = ctx.report
    tag = tag or section
    data: dict[str, Any] = {"device": device, "stats": stats, "max_rel_error": worst, "calls": calls}
    if worst > tol:
        ctx.captures[tag] = FAIL
        r.add(section, check, FAIL, f"on {device}: graphed result differs from eager by {worst:.3g} (relative)",
              "report this as a graphjit bug, with GRAPHJIT_DEBUG=1 output", **data)
        return
    if not gpu:
        ctx.captures[tag] = SKIP
        reasons = "; ".join(stats.get("fallbacks", {})) or "none recorded"
        r.add(section, check, SKIP, f"not captured (no GPU for {section}); graphed ran the traced function and "
              f"matched eager ({calls} calls; {reasons})", **data)
        return
    if stats.get("graphs") == 1 and stats.get("replays", 0) >= calls and not stats.get("fallbacks"):
        ctx.captures[tag] = PASS
        key = (stats.get("keys") or [{}])[0]
        r.add(section, check, PASS, f"on {device}: 1 graph, {stats['replays']} replays match eager "
              f"(max rel. error {worst:.1e}, capture {key.get('capture_ms', 0):.1f} ms)", **data)
        return
    ctx.captures[tag] = FAIL
    reasons = "; ".join(f"{k} x{v}" for k, v in (stats.get("fallbacks") or {}).items()) or "no replays"
    r.add(section, check, FAIL, f"on {device}: not replayed ({reasons})",
          "run with GRAPHJIT_DEBUG=1 python -m graphjit -vv doctor and report the log", **data)


# -- paddle -----------------------------------------------------------------------------------------
_PADDLE_PROBE = textwrap.dedent('''
    """graphjit doctor: a tiny Paddle capture-and-replay on GPU 0 (matmul and copies only, checked in numpy)."""
    import json, os, sys, traceback
    result = {"ok": False}

    def done():
        sys.stdout.write(%(mark)r + json.dumps(result) + "\\n")
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # never run Paddle's teardown with graphs alive

    try:
        import numpy as np
        import paddle
        import graphjit

        tracer, kernels = sys.argv[1], sys.argv[2] == "kernels"
        place = paddle.CUDAPlace(0) if sys.argv[3] == "gpu" else paddle.CPUPlace()  # cpu: tests of this script
        rng = np.random.default_rng(0)
        # Small integers: every product and sum is exact in fp32, also under TF32.
        W1_np = rng.integers(-2, 3, (64, 64)).astype(np.float32)
        W2_np = rng.integers(-2, 3, (64, 32)).astype(np.float32)
        W1 = paddle.to_tensor(W1_np, place=place)
        W2 = paddle.to_tensor(W2_np, place=place)

        def tiny(x):
            return paddle.matmul(paddle.matmul(x, W1), W2)

        step = graphjit.graphed(tiny, tracer=tracer, strict=True)
        calls, worst, worst_np = 4, 0.0, 0.0
        with paddle.no_grad():
            for _ in range(calls):
                x_np = rng.integers(-2, 3, (8, 64)).astype(np.float32)
                x = paddle.to_tensor(x_np, place=place)
                got = step(x).numpy().astype(np.float64)
                eager = tiny(x).numpy().astype(np.float64)
                want = x_np.astype(np.float64) @ W1_np.astype(np.float64) @ W2_np.astype(np.float64)
                scale = max(float(np.linalg.norm(want)), 1e-30)
                worst = max(worst, float(np.linalg.norm(got - eager)) / scale)
                worst_np = max(worst_np, float(np.linalg.norm(got - want)) / scale)
        result.update(ok=True, calls=calls, worst=worst, worst_numpy=worst_np, stats=step.stats())
        if kernels:
            try:
                a = paddle.to_tensor(x_np, place=place)
                s = paddle.add(a, a).numpy()
                result["elementwise_ok"] = bool(np.array_equal(s, 2 * x_np))
            except Exception as exc:
                result["elementwise_ok"] = False
                result["elementwise_error"] = type(exc).__name__ + ": " + str(exc).strip().splitlines()[-1][:200]
    except BaseException as exc:
        lines = [l for l in str(exc).strip().splitlines() if l.strip()]
        result["error"] = (type(exc).__name__ + ": " + (lines[-1] if lines else ""))[:300]
        result["traceback"] = traceback.format_exc()[-2000:]
    done()
''') % {"mark": RESULT_MARK}


def _check_paddle(ctx: _Context) -> None:
    r = ctx.report
    if importlib.util.find_spec("paddle") is None:
        if ctx.explicit:
            r.add("paddle", "paddle", FAIL, "not installed", "pip install paddlepaddle-gpu (or paddlepaddle for "
                  "CPU); see https://www.paddlepaddle.org.cn/install/quick")
        else:
            r.add("paddle", "paddle", SKIP, "not installed (pass --framework torch to check only PyTorch)",
                  "pip install paddlepaddle-gpu, if you use Paddle")
        return
    try:
        with warnings.catch_warnings():  # paddle warns about ccache at import: not the doctor's business
            warnings.simplefilter("ignore")
            import paddle
    except Exception as exc:
        r.add("paddle", "paddle", FAIL, f"import failed: {_first_line(exc)}", "reinstall paddle (pip install "
              "--force-reinstall paddlepaddle-gpu) in this environment")
        return
    version = paddle.__version__
    cuda_build = bool(paddle.is_compiled_with_cuda())
    rocm = bool(getattr(paddle, "is_compiled_with_rocm", lambda: False)())
    facts: dict[str, Any] = {"version": version, "compiled_with_cuda": cuda_build}
    if cuda_build:
        with contextlib.suppress(Exception):
            facts["cuda"], facts["cudnn"] = paddle.version.cuda(), paddle.version.cudnn()
        with contextlib.suppress(Exception):
            facts["cuda_archs"] = [int(a) for a in paddle.version.cuda_archs()]
        build = (f"{'ROCm' if rocm else 'CUDA'} {facts.get('cuda', '?')} / cuDNN {facts.get('cudnn', '?')} build"
                 + (f" (kernels for {_archs_text(facts['cuda_archs'])})" if facts.get("cuda_archs") else ""))
    else:
        build = "CPU build"
    sot_note = ""
    if sys.version_info >= (3, 12) and int(version.split(".")[0]) < 3 and version != "0.0.0":
        sot_note = f"; SOT needs Python <= 3.11 with paddle {version} (it falls back to the AST tracer)"
    if not cuda_build and ctx.system_gpus():
        r.add("paddle", "paddle build", FAIL, f"{version}, {build}, but this machine has {ctx.system_gpus()} NVIDIA "
              "GPU(s)" + sot_note, "pip uninstall paddlepaddle && pip install paddlepaddle-gpu (the build for your "
              "CUDA version: https://www.paddlepaddle.org.cn/install/quick)", **facts)
    else:
        r.add("paddle", "paddle build", PASS, f"{version}, {build}" + sot_note, **facts)

    devices: list[dict[str, Any]] = []
    graphs_ok = True
    if not cuda_build:
        r.add("paddle", "paddle GPUs", SKIP, "CPU build: no GPU")
    else:
        try:
            import paddle.device.cuda.graphs as graphs

            graphs_ok = bool(graphs.is_cuda_graph_supported())
            for i in range(paddle.device.cuda.device_count()):
                props = paddle.device.cuda.get_device_properties(i)
                devices.append({"index": i, "name": props.name, "capability": f"{props.major}.{props.minor}",
                                "memory_gib": getattr(props, "total_memory", 0) / 2**30})
        except Exception as exc:
            r.add("paddle", "paddle GPUs", FAIL, f"querying the GPUs failed: {_first_line(exc)}",
                  "check the driver with nvidia-smi and that it supports paddle's CUDA version")
        else:
            if not devices:
                status = FAIL if ctx.system_gpus() else SKIP
                r.add("paddle", "paddle GPUs", status, "paddle sees no GPU"
                      + (f" although nvidia-smi lists {ctx.system_gpus()}" if ctx.system_gpus() else ""),
                      f"check CUDA_VISIBLE_DEVICES and that the driver supports CUDA {facts.get('cuda', '?')}"
                      if status == FAIL else None)
            elif not graphs_ok:
                r.add("paddle", "paddle GPUs", FAIL, _gpu_text(devices, _driver_text(ctx))
                      + f"; paddle {version} was built without CUDA graph support",
                      "install an official paddlepaddle-gpu wheel (built with CUDA graphs)", devices=devices)
            else:
                ctx.gpus["paddle"] = devices
                r.add("paddle", "paddle GPUs", PASS, _gpu_text(devices, _driver_text(ctx)), devices=devices)
    _paddle_flags(ctx, paddle, bool(devices))
    if devices and graphs_ok:
        _paddle_gpu_probes(ctx, devices, facts.get("cuda_archs") or [])
    else:
        _paddle_cpu_fallback(ctx, paddle)


def _archs_text(archs: list[int]) -> str:
    archs = sorted(archs)
    if len(archs) > 3:
        return f"sm_{archs[0]}..sm_{archs[-1]}"
    return ", ".join(f"sm_{a}" for a in archs)


def _paddle_flags(ctx: _Context, paddle: Any, gpu: bool) -> None:
    r = ctx.report

    def flag(name: str) -> Any:
        try:
            return paddle.get_flags([name])[name]
        except Exception:
            return None

    def add(name: str, ok: bool, value: Any, good: str, fix: str) -> None:
        env_value = os.environ.get(name)
        text = f"{value!r}" + (f" (from the environment: {env_value})" if env_value is not None else "") + f"; {good}"
        if not gpu:
            r.add("paddle", name, SKIP, f"{value!r} (no GPU: used only for CUDA graphs)", value=value, env=env_value)
        elif value is None:
            r.add("paddle", name, SKIP, f"paddle {paddle.__version__} has no such flag", value=None, env=env_value)
        else:
            r.add("paddle", name, PASS if ok else FAIL, text, None if ok else fix, value=value, env=env_value)

    v = flag("FLAGS_new_executor_use_cuda_graph")
    add("FLAGS_new_executor_use_cuda_graph", True, v,
        "graphjit sets it to True at the first capture (run_program needs it)", "")
    v = flag("FLAGS_allocator_strategy")
    add("FLAGS_allocator_strategy", v == "auto_growth", v, "must be auto_growth for CUDA graphs",
        "unset FLAGS_allocator_strategy (or export FLAGS_allocator_strategy=auto_growth) before starting Python")
    v = flag("FLAGS_use_stream_safe_cuda_allocator")
    add("FLAGS_use_stream_safe_cuda_allocator", v is None or bool(v), v,
        "must be on (run_program inside a capture needs it)",
        "unset FLAGS_use_stream_safe_cuda_allocator (or export it as 1) before starting Python")


def _paddle_gpu_probes(ctx: _Context, devices: list[dict[str, Any]], archs: list[int]) -> None:
    """Eager and SOT capture-and-replay, each in its own process (a Paddle crash cannot end the doctor)."""
    r = ctx.report
    if ctx.disabled:
        for tracer in ("eager", "sot"):
            r.add("paddle", f"paddle capture+replay ({tracer})", SKIP, "GRAPHJIT_DISABLE=1", "unset GRAPHJIT_DISABLE")
            ctx.captures[f"paddle {tracer}"] = SKIP
        return
    # SOT leaves functions smaller than MIN_GRAPH_SIZE ops uncompiled: 0 makes the probe go through SOT.
    extra = {"MIN_GRAPH_SIZE": os.environ.get("MIN_GRAPH_SIZE", "0")}
    kernels: dict[str, Any] | None = None
    for tracer in ("eager", "sot"):
        check = f"paddle capture+replay ({tracer})"
        tag = f"paddle {tracer}"
        result, why = _run_child(_PADDLE_PROBE, [tracer, "kernels" if tracer == "eager" else "-", "gpu"],
                                ctx.timeout, extra)
        if result is None:
            ctx.captures[tag] = FAIL
            r.add("paddle", check, FAIL, f"on cuda:0: {why}",
                  "run the same probe with GRAPHJIT_DEBUG=1 python -m graphjit -vv doctor --framework paddle; "
                  + ("use tracer='eager' or 'ast' until this is fixed" if tracer == "sot" else "report the log"))
            continue
        if tracer == "eager":
            kernels = result
        if not result.get("ok"):
            ctx.captures[tag] = FAIL
            r.add("paddle", check, FAIL, f"on cuda:0: {result.get('error')}",
                  "see the error; GRAPHJIT_DEBUG=1 python -m graphjit -vv doctor --framework paddle shows more",
                  traceback=result.get("traceback"))
            continue
        worst = max(float(result["worst"]), float(result["worst_numpy"]))
        _graphed_row(ctx, "paddle", check, True, "cuda:0", result["stats"], worst, int(result["calls"]), 1e-6, tag)
    _paddle_kernels(ctx, devices, archs, kernels)


def _paddle_kernels(ctx: _Context, devices: list[dict[str, Any]], archs: list[int],
                    probe: dict[str, Any] | None) -> None:
    r = ctx.report
    caps = sorted({int(d["capability"].replace(".", "")) for d in devices})
    missing = [c for c in caps if archs and c not in archs]
    built = f"built for {_archs_text(archs)}" if archs else "its arch list is unknown"
    if probe is None or "elementwise_ok" not in probe:
        r.add("paddle", "paddle kernels", SKIP, "not checked (the eager probe did not finish)"
              + (f"; paddle is {built}, the GPU is sm_{missing[0]}" if missing else ""), blocking=False)
        return
    if probe["elementwise_ok"]:
        r.add("paddle", "paddle kernels", PASS, "elementwise add on cuda:0 matches numpy"
              + (f" (paddle {built}; sm_{missing[0]} runs through PTX)" if missing else ""), blocking=False)
        return
    r.add("paddle", "paddle kernels", FAIL, "elementwise add on cuda:0 returns wrong values"
          + (f" ({probe['elementwise_error']})" if probe.get("elementwise_error") else "")
          + (f": paddle is {built}, the GPU is sm_{missing[0]}" if missing else "")
          + "; matmul and copies (what graphjit's check uses) compute right",
          "install a Paddle build with kernels for this GPU (paddlepaddle-gpu 3.x for CUDA 12 on Hopper); until "
          "then only matmul, copies and NCCL compute right", blocking=False, archs=archs, capabilities=caps)


def _paddle_cpu_fallback(ctx: _Context, paddle: Any) -> None:
    """No Paddle GPU: graphjit runs the traced (SOT) function; check that it matches eager."""
    r = ctx.report
    check = "paddle graphed (sot)"
    if ctx.disabled:
        r.add("paddle", check, SKIP, "GRAPHJIT_DISABLE=1", "unset GRAPHJIT_DISABLE")
        ctx.captures["paddle sot"] = SKIP
        return
    import numpy as np

    import graphjit

    calls = 3
    try:
        place = paddle.CPUPlace()
        rng = np.random.default_rng(0)
        w1 = paddle.to_tensor(rng.integers(-2, 3, (64, 64)).astype(np.float32), place=place)
        w2 = paddle.to_tensor(rng.integers(-2, 3, (64, 32)).astype(np.float32), place=place)

        def tiny(x: Any) -> Any:
            return paddle.matmul(paddle.matmul(x, w1), w2)

        step = cast(graphjit.GraphedFunction, graphjit.graphed(tiny, tracer="sot", strict=True))
        worst = 0.0
        with paddle.no_grad():
            for _ in range(calls):
                x = paddle.to_tensor(rng.integers(-2, 3, (8, 64)).astype(np.float32), place=place)
                got, want = step(x).numpy().astype(np.float64), tiny(x).numpy().astype(np.float64)
                worst = max(worst, float(np.linalg.norm(got - want)) / max(float(np.linalg.norm(want)), 1e-30))
        stats = step.stats()
    except Exception as exc:
        ctx.captures["paddle sot"] = FAIL
        r.add("paddle", check, FAIL, f"CPU fallback: {_first_line(exc)}",
              "run GRAPHJIT_DEBUG=1 python -m graphjit -vv doctor --framework paddle and report the log")
        return
    _graphed_row(ctx, "paddle", check, False, "cpu", stats, worst, calls, 1e-6, "paddle sot")


# -- collectives ------------------------------------------------------------------------------------
def _find_nvcc() -> tuple[str | None, str, str | None]:
    """(path, where it came from, problem): GRAPHJIT_NVCC, then PATH, then $CUDA_HOME/bin/nvcc, then
    /usr/local/cuda/bin/nvcc (the order of :func:`graphjit.collectives._lib.find_nvcc`)."""
    from . import env
    from .errors import ConfigError

    try:
        configured = env.settings().nvcc
    except ConfigError:  # another variable is malformed (its own row says so)
        configured = None
    if configured:
        path = shutil.which(configured) or (configured if os.access(configured, os.X_OK) else None)
        if path is None:
            return None, "GRAPHJIT_NVCC", f"GRAPHJIT_NVCC={configured!r} is not an executable"
        return path, "GRAPHJIT_NVCC", None
    path = shutil.which("nvcc")
    if path:
        return path, "PATH", None
    for var, home in (("CUDA_HOME", os.environ.get("CUDA_HOME")), ("CUDA_PATH", os.environ.get("CUDA_PATH")),
                      ("/usr/local/cuda", "/usr/local/cuda")):
        if home:
            candidate = Path(home) / "bin" / "nvcc"
            if os.access(candidate, os.X_OK):
                return str(candidate), var, None
    return None, "", None


NVCC_FIX = ("install the CUDA toolkit (nvcc) or set GRAPHJIT_NVCC / CUDA_HOME; or run `python -m graphjit build "
            "--arch {arch}` where nvcc exists and share GRAPHJIT_CACHE_DIR")


def _check_collectives(ctx: _Context) -> None:
    _check_nvcc(ctx)
    _check_csrc(ctx)
    _check_peers(ctx)
    _check_custom_ar(ctx)


def _check_nvcc(ctx: _Context) -> None:
    r = ctx.report
    blocking = ctx.collectives
    needed = "builds csrc (the custom all-reduce) once per GPU architecture"
    path, source, problem = _find_nvcc()
    if problem:
        r.add("collectives", "nvcc", FAIL, problem, "point GRAPHJIT_NVCC at nvcc (e.g. /usr/local/cuda/bin/nvcc) "
              "or unset it", blocking=blocking)
        return
    if path is None:
        r.add("collectives", "nvcc", SKIP, f"not found (GRAPHJIT_NVCC, PATH, CUDA_HOME, /usr/local/cuda); {needed}: "
              "without it only libraries built ahead of time (python -m graphjit build) load",
              "install the CUDA toolkit, or set GRAPHJIT_NVCC / CUDA_HOME", path=None)
        return
    proc = _run([path, "--version"], timeout=30)
    m = re.search(r"release (\d+)\.(\d+), V([\w.]+)", proc.stdout if proc else "")
    if not m:
        r.add("collectives", "nvcc", FAIL, f"{path} (from {source}) did not report a version",
              "check the CUDA toolkit installation (nvcc --version must work)", blocking=blocking, path=path)
        return
    version = (int(m.group(1)), int(m.group(2)))
    ctx.nvcc, ctx.nvcc_version = path, version
    drv = ctx.cuda_driver().version() if (ctx.smi or ctx.gpus) else None
    text = f"CUDA {version[0]}.{version[1]} (V{m.group(3)}) at {path} (from {source}); {needed}"
    data: dict[str, Any] = {"path": path, "source": source, "version": f"{version[0]}.{version[1]}", "full": m.group(3)}
    if drv and version[0] > drv[0]:
        r.add("collectives", "nvcc", FAIL, text + f"; newer than the driver's CUDA {drv[0]}.{drv[1]}: "
              "what it builds would not load", "use an nvcc that matches the driver (GRAPHJIT_NVCC) or update "
              "the driver", blocking=blocking, **data)
    else:
        r.add("collectives", "nvcc", PASS, text, **data)


def _gpu_archs(ctx: _Context) -> list[str]:
    """The architectures (sm_XX) of this machine's GPUs: a framework's view, else nvidia-smi's."""
    from .collectives import _lib

    caps = [d.get("capability") for devices in ctx.gpus.values() for d in devices]
    if not caps and ctx.smi:
        caps = [g.get("capability") for g in ctx.smi.get("gpus") or []]
    archs: list[str] = []
    for cap in caps:
        with contextlib.suppress(Exception):
            arch = _lib.normalize_arch(cap)
            if arch not in archs:
                archs.append(arch)
    return archs


def _cached_archs(sources: dict[str, bytes]) -> list[str]:
    """Architectures with a library for the current sources in GRAPHJIT_CACHE_DIR (nothing is built)."""
    from .collectives import _lib

    found: list[str] = []
    with contextlib.suppress(Exception):
        for path in sorted(_lib.cache_dir().glob(f"{_lib.LIBRARY_PREFIX}-sm_*-*.so")):
            arch = path.name.split("-")[1]
            if arch not in found and _lib.library_path(arch, sources=sources) == path:
                found.append(arch)
    return found


def _build_fix(message: str, arch: str) -> str:
    if "nvcc was not found" in message:
        return NVCC_FIX.format(arch=arch)
    if "cache directory" in message or "lock" in message:
        return "set GRAPHJIT_CACHE_DIR to a writable directory (or wait for the other build to finish)"
    if "nvcc failed" in message or "did not finish" in message or "cannot run nvcc" in message:
        return (f"use a CUDA toolkit whose nvcc supports {arch} (GRAPHJIT_NVCC), then `python -m graphjit build "
                f"--arch {arch} --force`")
    if "sources" in message:
        return "reinstall graphjit (its wheel carries graphjit/csrc) or install it from a source checkout"
    return f"delete the cached library and rebuild it: `python -m graphjit build --arch {arch} --force`"


def _build_error_row(ctx: _Context, exc: BaseException, arch: str, what: str, **data: Any) -> None:
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    first = lines[0] if lines else type(exc).__name__
    ctx.csrc_fix = _build_fix(str(exc), arch)
    ctx.report.add("collectives", "csrc build", FAIL, f"{what}: {first}"[:400], ctx.csrc_fix,
                   blocking=ctx.collectives, lines=[line[:200] for line in lines[1:][-6:]], error=str(exc)[-4000:],
                   **data)


def _check_csrc(ctx: _Context) -> None:
    """Compile-or-load the library for this machine's GPUs; without a GPU, say so (and, with --collectives,
    compile it once into a temporary directory: a toolchain check)."""
    r = ctx.report
    ctx.csrc = FAIL
    from .collectives import _lib

    folder = _lib.csrc_dir()
    if folder is None:
        ctx.csrc_fix = _build_fix("sources", "sm_90")
        r.add("collectives", "csrc build", FAIL, "the CUDA sources (csrc/graphjit_ar.cu, csrc/custom_all_reduce.cuh) "
              "are not next to the graphjit package", ctx.csrc_fix, blocking=ctx.collectives)
        return
    sources = _lib.read_sources(folder)
    cached = _cached_archs(sources)
    archs = _gpu_archs(ctx)
    facts: dict[str, Any] = {"sources": str(folder), "cached": cached, "nvcc": ctx.nvcc}
    with contextlib.suppress(Exception):
        facts["cache_dir"] = str(_lib.cache_dir())
    where = f"GRAPHJIT_CACHE_DIR={facts.get('cache_dir', '?')}"
    if not archs and ctx.system_gpus():
        ctx.csrc = SKIP
        r.add("collectives", "csrc build", SKIP, f"nvidia-smi lists {ctx.system_gpus()} GPU(s) but not their compute "
              "capability, and no framework sees them: the build needs a target architecture",
              "build for your GPUs explicitly: python -m graphjit build --arch sm_80 (or sm_90, ...)", **facts)
        return
    if not archs:
        _csrc_without_gpu(ctx, cached, where, facts)
        return
    built: list[str] = []
    t_all = time.perf_counter()
    lib = None
    for arch in archs:
        existed = False
        try:
            existed = _lib.library_path(arch, sources=sources).is_file()
            t0 = time.perf_counter()
            path = _lib.build(arch, nvcc=ctx.nvcc, timeout=ctx.timeout, lock_timeout=ctx.timeout)
            lib = _lib.Library(path)
        except Exception as exc:
            _build_error_row(ctx, exc, arch, f"{arch}: " + ("loading the cached library failed" if existed
                                                            else "building failed"), **facts)
            return
        built.append(f"{arch} {'cached' if existed else f'built in {time.perf_counter() - t0:.1f} s'} ({path.name})")
    facts["libraries"] = built
    assert lib is not None  # archs is not empty, and each pass of the loop set lib or returned
    try:
        pci, major, minor = lib.device_info(0)
    except Exception as exc:
        ctx.csrc_fix = ("update the NVIDIA driver to one that supports the CUDA version of nvcc, or set GRAPHJIT_NVCC "
                        f"to an nvcc that matches the driver and rerun `python -m graphjit build --arch {archs[0]} "
                        "--force`")
        r.add("collectives", "csrc build", FAIL, f"{', '.join(built)}; but the library cannot query GPU 0: "
              f"{_first_line(exc)}", ctx.csrc_fix, blocking=ctx.collectives, **facts)
        return
    ctx.csrc = PASS
    r.add("collectives", "csrc build", PASS, f"{', '.join(built)} in {where}; loaded, GPU 0 is sm_{major}{minor} at "
          f"{pci}", seconds=time.perf_counter() - t_all, **facts)


def _csrc_without_gpu(ctx: _Context, cached: list[str], where: str, facts: dict[str, Any]) -> None:
    r = ctx.report
    from .collectives import _lib

    have = f"; libraries built ahead of time for these sources: {', '.join(cached)}" if cached else ""
    if not ctx.collectives:
        ctx.csrc = SKIP
        r.add("collectives", "csrc build", SKIP, f"no GPU: the build needs a target architecture, nothing compiled "
              f"(sources at {facts['sources']}){have}", "`python -m graphjit build --arch sm_90` compiles it ahead of "
              "time without a GPU; `python -m graphjit doctor --collectives` test-compiles it", **facts)
        return
    if ctx.nvcc is None:
        if cached:  # a library built ahead of time: check that it loads (nothing to compile it with here)
            try:
                for arch in cached:
                    _lib.Library(_lib.library_path(arch))
            except Exception as exc:
                _build_error_row(ctx, exc, arch, f"{arch}: loading the cached library failed", **facts)
                return
            ctx.csrc = PASS
            r.add("collectives", "csrc build", PASS, f"no GPU and no nvcc here; the libraries built ahead of time "
                  f"({', '.join(cached)}, {where}) load", **facts)
            return
        ctx.csrc_fix = NVCC_FIX.format(arch="sm_90")
        r.add("collectives", "csrc build", FAIL, "no nvcc and no library built ahead of time: csrc cannot be built "
              "here", ctx.csrc_fix, blocking=True, **facts)
        return
    arch = "sm_90" if (ctx.nvcc_version or (0, 0)) >= (11, 8) else "sm_80"
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="graphjit-doctor-csrc-") as tmp:
        try:
            path = _lib.build(arch, cache=tmp, nvcc=ctx.nvcc, timeout=ctx.timeout, lock_timeout=ctx.timeout)
            abi = _lib.Library(path)._dll.gj_ar_abi_version()
        except Exception as exc:
            _build_error_row(ctx, exc, arch, f"test build for {arch} failed", **facts)
            return
    ctx.csrc = PASS
    facts.update(test_arch=arch, seconds=time.perf_counter() - t0)
    r.add("collectives", "csrc build", PASS, f"no GPU: compiled csrc for {arch} as a toolchain check in "
          f"{facts['seconds']:.1f} s (temporary directory, deleted) and loaded it (ABI {abi}){have}", **facts)


def _check_peers(ctx: _Context) -> None:
    r = ctx.report
    blocking = ctx.collectives
    count, names, access = _peer_matrix(ctx)
    if count == 0:
        for check in ("P2P access", "NVLink", "CUDA IPC"):
            r.add("collectives", check, SKIP, "no GPU that a checked framework can use" if ctx.system_gpus()
                  else "no GPU")
        return
    if count == 1:
        for check in ("P2P access", "NVLink"):
            r.add("collectives", check, SKIP, "one GPU: no peers")
        r.add("collectives", "CUDA IPC", SKIP, "one GPU: IPC between ranks needs two GPUs")
        return
    header = "      " + " ".join(f"GPU{j:<3d}" for j in range(count))
    lines = [header]
    for i in range(count):
        cells = ["X" if i == j else {True: "yes", False: "no", None: "?"}[access.get((i, j))] for j in range(count)]
        lines.append(f"GPU{i:<3d}" + "".join(f"{c:<7s}"[:7] for c in cells))
    missing = [f"{i}->{j}" for (i, j), ok in sorted(access.items()) if ok is False]
    unknown = [f"{i}->{j}" for (i, j), ok in sorted(access.items()) if ok is None]
    if missing:
        r.add("collectives", "P2P access", FAIL, f"{count} GPUs; no peer access {', '.join(missing)}",
              "check nvidia-smi topo -p2p r and the BIOS/IOMMU settings (ACS must allow P2P); the framework's "
              "all-reduce still works", blocking=blocking, lines=lines, matrix=_jsonable(access))
    elif unknown:
        r.add("collectives", "P2P access", SKIP, f"{count} GPUs; could not query {', '.join(unknown)}",
              lines=lines, matrix=_jsonable(access))
    else:
        r.add("collectives", "P2P access", PASS, f"{count} GPUs ({names}); every pair can access its peer",
              lines=lines, matrix=_jsonable(access))
    _nvlink(ctx, count)
    _ipc(ctx)


_V = TypeVar("_V")


def _jsonable(access: Mapping[tuple[int, int], _V]) -> dict[str, _V]:
    return {f"{i}->{j}": v for (i, j), v in sorted(access.items())}


def _peer_matrix(ctx: _Context) -> tuple[int, str, dict[tuple[int, int], bool | None]]:
    """GPU count, names and can-access-peer per ordered pair (torch if it sees the GPUs, else the driver)."""
    access: dict[tuple[int, int], bool | None] = {}
    torch_devices = ctx.gpus.get("torch")
    if torch_devices:
        import torch

        n = len(torch_devices)
        for i in range(n):
            for j in range(n):
                if i != j:
                    try:
                        access[(i, j)] = bool(torch.cuda.can_device_access_peer(i, j))
                    except Exception:
                        access[(i, j)] = None
        return n, _count_names([d["name"] for d in torch_devices]), access
    devices = next(iter(ctx.gpus.values()), None)
    if not devices:
        return 0, "", access
    drv = ctx.cuda_driver()
    n = len(devices)
    for i in range(n):
        for j in range(n):
            if i != j:
                access[(i, j)] = drv.can_access_peer(i, j)
    return n, _count_names([d["name"] for d in devices]), access


def _nvlink(ctx: _Context, count: int) -> None:
    r = ctx.report
    exe = shutil.which("nvidia-smi")
    proc = _run([exe, "topo", "-m"]) if exe else None
    if proc is None or proc.returncode != 0:
        r.add("collectives", "NVLink", SKIP, "nvidia-smi topo -m is not available" if exe is None or proc is None
              else "nvidia-smi topo -m failed")
        return
    links = _parse_topo(proc.stdout)
    if not links:
        r.add("collectives", "NVLink", SKIP, "could not read nvidia-smi topo -m", raw=proc.stdout[-2000:])
        return
    kinds = sorted(set(links.values()))
    text = ", ".join(f"GPU{i}-GPU{j} {k}" for (i, j), k in sorted(links.items()) if i < j)
    if all(k.startswith("NV") for k in links.values()):
        r.add("collectives", "NVLink", PASS, f"NVLink between every pair ({'/'.join(kinds)})", links=_jsonable(links))
    elif count > 2:
        r.add("collectives", "NVLink", FAIL, f"not every pair has NVLink: {text}",
              "above 2 GPUs the custom all-reduce needs NVLink between all pairs; the framework's all-reduce still "
              "works", blocking=ctx.collectives, links=_jsonable(links))
    else:
        r.add("collectives", "NVLink", SKIP, f"no NVLink: {text} (PCIe P2P is enough for 2 GPUs)",
              links=_jsonable(links))


def _parse_topo(text: str) -> dict[tuple[int, int], str]:
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return {}
    header = lines[0].split()
    gpu_cols = [i for i, h in enumerate(header) if re.fullmatch(r"GPU\d+", h)]
    links: dict[tuple[int, int], str] = {}
    for line in lines[1:]:
        parts = line.split()
        m = re.fullmatch(r"GPU(\d+)", parts[0]) if parts else None
        if not m:
            continue
        i = int(m.group(1))
        for col in gpu_cols:
            if col + 1 < len(parts):
                j = int(header[col][3:])
                if i != j:
                    links[(i, j)] = parts[col + 1]
    return links


_IPC_PROBE = textwrap.dedent('''
    """graphjit doctor: CUDA IPC between two processes (a GPU 0 tensor shared with a process on GPU 1)."""
    import json, os, sys, traceback
    result = {"ok": False}

    def consumer(q, back):
        try:
            import torch
            torch.cuda.set_device(1)
            t = q.get(timeout=60)             # opened through cudaIpcOpenMemHandle
            t.mul_(2)                          # written by this process
            peer = t.to("cuda:1")              # read across GPUs
            torch.cuda.synchronize()
            back.put(("ok", float(peer.sum().item())))
        except BaseException as exc:
            back.put(("error", type(exc).__name__ + ": " + str(exc).strip()[-200:]))

    if __name__ == "__main__":
        try:
            import torch
            import torch.multiprocessing as mp
            ctx = mp.get_context("spawn")
            q, back = ctx.Queue(), ctx.Queue()
            t = torch.arange(1024, dtype=torch.float32, device="cuda:0")
            p = ctx.Process(target=consumer, args=(q, back))
            p.start()
            q.put(t)
            status, value = back.get(timeout=90)
            p.join(30)
            if p.is_alive():
                p.kill()
            torch.cuda.synchronize()
            want = 2 * torch.arange(1024, dtype=torch.float32, device="cuda:0")
            if status != "ok":
                result["error"] = value
            else:
                result["written"] = bool(torch.equal(t, want))
                result["peer_read"] = value == float(want.sum().item())
                result["ok"] = result["written"] and result["peer_read"]
        except BaseException as exc:
            result["error"] = (type(exc).__name__ + ": " + str(exc).strip())[-300:]
            result["traceback"] = traceback.format_exc()[-2000:]
        sys.stdout.write(%(mark)r + json.dumps(result) + "\\n")
        sys.stdout.flush()
        os._exit(0)
''') % {"mark": RESULT_MARK}


def _ipc(ctx: _Context) -> None:
    r = ctx.report
    if "torch" not in ctx.gpus:
        r.add("collectives", "CUDA IPC", SKIP, "the probe needs torch with CUDA", "pip install a CUDA build of torch "
              "to run this probe")
        return
    result, why = _run_child(_IPC_PROBE, [], ctx.timeout)
    if result is None:
        r.add("collectives", "CUDA IPC", FAIL, f"probe failed: {why}", "check that processes may share GPU memory "
              "(containers: --ipc=host); the framework's all-reduce still works", blocking=ctx.collectives)
    elif not result.get("ok"):
        detail = result.get("error") or (f"written={result.get('written')}, peer_read={result.get('peer_read')}")
        r.add("collectives", "CUDA IPC", FAIL, f"a tensor shared between two processes did not work: {detail}",
              "check that processes may share GPU memory (containers: --ipc=host) and P2P works",
              blocking=ctx.collectives, probe=result)
    else:
        r.add("collectives", "CUDA IPC", PASS, "a GPU 0 tensor shared with a second process was written there and "
              "read from GPU 1", probe=result)


# -- the custom all-reduce on 2 GPUs, against NCCL (--collectives) ---------------------------------
AR_MAX_BYTES = 8 << 20
AR_SIZES = (16, 16 * 1001, 1 << 18, 1 << 21, AR_MAX_BYTES)
"""Bytes per eager case: the smallest, an odd multiple of 16, and up to ``max_bytes``."""
AR_GRAPHED = (("float32", 4096), ("bfloat16", 1 << 20))
"""(dtype, elements) of the graphed steps (``y = 2x; all_reduce(y); y + 1``), 4 calls each."""

_AR_PROBE = textwrap.dedent('''
    """graphjit doctor: the custom all-reduce in a 2-process group, one process per GPU, against NCCL.

    argv: RANK PORT OUT DEVICE(cuda|shared|cpu) TIMEOUT.  "shared": both ranks on GPU 0 in a gloo group
    (GRAPHJIT_AR_SHARED_GPU=1, a test mode), against gloo.  "cpu" (tests of this script) runs the same steps
    in a gloo group, where collectives.init turns the custom all-reduce off and every call runs the
    framework's own.
    """
    import json, os, sys, time, traceback
    from datetime import timedelta

    rank, port, out, kind, timeout = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], float(sys.argv[5])
    SIZES, GRAPHED, MAX_BYTES = %(sizes)r, %(graphed)r, %(max_bytes)d
    result = {"rank": rank, "stage": "import torch", "cases": [], "done": False}

    def save():
        with open(out + ".tmp", "w") as f:
            json.dump(result, f, default=str)
        os.replace(out + ".tmp", out)

    def finish(code):
        save()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # no interpreter teardown: NCCL and the IPC mappings go with the process

    try:
        import torch
        import torch.distributed as dist

        gpu = kind in ("cuda", "shared")
        index = 0 if kind == "shared" else rank
        if gpu:
            torch.cuda.set_device(index)
        dev = torch.device("cuda", index) if gpu else torch.device("cpu")
        sync = torch.cuda.synchronize if gpu else (lambda: None)
        backend = "nccl" if kind == "cuda" else "gloo"
        result["stage"] = f"{backend.upper() if backend == 'nccl' else backend} group"
        save()
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=2, timeout=timedelta(seconds=timeout))
        import graphjit
        from graphjit import collectives, scope
        from graphjit.collectives import swap

        result["stage"] = "collectives.init"
        save()
        t0 = time.perf_counter()
        report = collectives.init(max_bytes=MAX_BYTES, timeout_s=min(60.0, timeout), backend="torch")
        result["init_s"] = round(time.perf_counter() - t0, 2)
        result["report"] = report.as_dict()
        save()
        if gpu and not report.enabled:
            result["done"] = True
            finish(0)
        nccl = swap.original("torch")  # the framework's own all_reduce (NCCL; gloo in the shared mode), unwrapped
        user_algo = graphjit.env.settings().ar_algo  # GRAPHJIT_AR_ALGO, restored after the eager cases

        def set_algo(algo):
            os.environ.update(GRAPHJIT_AR_ALGO=algo)
            graphjit.refresh_env()

        def compare(case, got, ref):
            diff = float((got.double() - ref.double()).abs().max())
            scale = float(ref.double().abs().max())
            case["max_abs_diff"] = max(case.get("max_abs_diff", 0.0), diff)
            case["max_abs"] = max(case.get("max_abs", 0.0), scale)
            case["tol"] = float(torch.finfo(got.dtype).eps) * case["max_abs"]  # one ulp of the largest value

        def custom_count(what):
            return collectives.stats()["custom"][what]

        result["stage"] = "eager all-reduces"
        for name in ("float32", "float16", "bfloat16"):
            dtype = getattr(torch, name)
            size = torch.empty((), dtype=dtype).element_size()
            for algo in ("1shot", "2shot"):
                set_algo(algo)
                for nbytes in SIZES:
                    g = torch.Generator(device=dev)
                    g.manual_seed(1000 * rank + nbytes)
                    x = torch.randn(nbytes // size, generator=g, device=dev).to(dtype)
                    ref = x.clone()
                    nccl(ref)
                    got = x.clone()
                    before = custom_count("eager")
                    with scope.graphed_call("warmup"):  # inside a graphed call: the custom kernel's eager path
                        dist.all_reduce(got)
                    sync()
                    case = {"mode": "eager", "dtype": name, "algo": algo, "bytes": nbytes, "calls": 1,
                            "custom": custom_count("eager") - before == 1}
                    compare(case, got, ref)
                    result["cases"].append(case)
        set_algo(user_algo)
        result["stage"] = "graphed steps"
        save()

        def step(x):
            y = x * 2.0
            dist.all_reduce(y)
            return y + 1.0

        for name, numel in GRAPHED:
            dtype = getattr(torch, name)
            fn = graphjit.graphed(step)
            before = custom_count("captured")
            g = torch.Generator(device=dev)
            g.manual_seed(7 + rank)
            case = {"mode": "graphed", "dtype": name, "algo": user_algo,
                    "bytes": numel * torch.empty((), dtype=dtype).element_size(), "calls": 4}
            with torch.no_grad():
                for _ in range(case["calls"]):
                    x = torch.randn(numel, generator=g, device=dev).to(dtype)
                    got = fn(x).clone()
                    ref = x * 2.0
                    nccl(ref)
                    ref = ref + 1.0
                    sync()
                    compare(case, got, ref)
            st = fn.stats()
            case.update(graphs=st.get("graphs"), replays=st.get("replays"), fallbacks=st.get("fallbacks") or {},
                        captured=custom_count("captured") - before)
            case["custom"] = bool(case["captured"] >= 1 and case["replays"] and not case["fallbacks"])
            result["cases"].append(case)
        stats = collectives.stats()
        result["fallbacks"], result["reasons"] = stats["fallbacks"], stats["reasons"]
        result["stage"], result["done"] = "done", True
        finish(0)
    except BaseException as exc:
        lines = [l for l in str(exc).strip().splitlines() if l.strip()]
        result["error"] = (type(exc).__name__ + ": " + (lines[-1] if lines else ""))[:400]
        result["traceback"] = traceback.format_exc()[-3000:]
        finish(1)
''') % {"sizes": AR_SIZES, "graphed": AR_GRAPHED, "max_bytes": AR_MAX_BYTES}

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
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_ar_pair(timeout: float, device: str = "cuda") -> tuple[list[dict[str, Any] | None], list[str], str | None]:
    """Run :data:`_AR_PROBE` as ranks 0 and 1; (each rank's result or None, each rank's log tail, why not)."""
    with tempfile.TemporaryDirectory(prefix="graphjit-doctor-ar-") as tmp:
        script = Path(tmp) / "ar_probe.py"
        script.write_text(_AR_PROBE)
        environ = _child_env({"NCCL_NVLS_ENABLE": os.environ.get("NCCL_NVLS_ENABLE", "0")})
        for name in _AR_DROP_ENV:
            environ.pop(name, None)
        port = _free_port()
        outs = [Path(tmp) / f"rank{r}.json" for r in range(2)]
        logs = [Path(tmp) / f"rank{r}.log" for r in range(2)]
        procs: list[subprocess.Popen[bytes]] = []
        why = None
        try:
            for r in range(2):
                with open(logs[r], "wb") as log:
                    procs.append(subprocess.Popen([sys.executable, str(script), str(r), str(port), str(outs[r]), device,
                                                   str(timeout)], stdout=log, stderr=subprocess.STDOUT, cwd=tmp,
                                                  env=environ))
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
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def _ar_verdict(results: list[dict[str, Any] | None], tails: list[str], why: str | None, reference: str = "NCCL"
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
    text = (f"{len(eager)} eager all-reduces ({_size(sizes[0])} to {_size(sizes[-1])}; float32, float16, "
            f"bfloat16; one-shot and two-shot) and {len(graphed)} graphed steps "
            f"({sum(c.get('replays') or 0 for c in graphed)} replays) ran the custom kernel and match {reference} "
            f"(max abs diff {worst:.3g}); init {max(res.get('init_s', 0.0) for res in results if res):.1f} s, "
            f"{rep.get('arch')}")
    return PASS, text, None, lines, data


def _torch_gpus(ctx: _Context) -> tuple[int, list[str], str | None]:
    """(GPUs torch sees, their names, why torch cannot run the check) for --collectives."""
    if ctx.gpus.get("torch"):
        devices = ctx.gpus["torch"]
        return len(devices), [d["name"] for d in devices], None
    if importlib.util.find_spec("torch") is None:
        return 0, [], "torch is not installed (the check runs through torch.distributed and NCCL)"
    try:
        import torch

        if not (torch.backends.cuda.is_built() and torch.version.cuda):
            return 0, [], f"torch {torch.__version__} is a CPU build"
        if not torch.cuda.is_available():
            return 0, [], f"torch {torch.__version__} sees no CUDA GPU"
        n = torch.cuda.device_count()
        return n, [torch.cuda.get_device_name(i) for i in range(n)], None
    except Exception as exc:
        return 0, [], f"torch cannot query the GPUs: {_first_line(exc)}"


def _check_custom_ar(ctx: _Context) -> None:
    r = ctx.report
    check = "custom all-reduce"
    if not ctx.collectives:
        where = "this machine has no GPU; " if not ctx.system_gpus() and not ctx.gpus else ""
        r.add("collectives", check, SKIP, f"not checked: {where}--collectives runs it in 2 processes on 2 GPUs and "
              "compares it with NCCL", "python -m graphjit doctor --collectives (needs 2 GPUs on one node)")
        return
    from . import env
    from .collectives import custom_ar

    with contextlib.suppress(Exception):
        off = custom_ar.check_settings(env.settings())
        if off is not None:
            ctx.ar_summary = f"the custom all-reduce is off: {off[1]}"
            r.add("collectives", check, FAIL, f"off by setting ({off[0]}): {off[1]}", _AR_FIXES[off[0]], reason=off)
            return
    count, names, why = _torch_gpus(ctx)
    gpus = ctx.system_gpus()
    shared = why is None and count == 1 and env.settings().ar_shared_gpu
    if why is not None or (count < 2 and not shared):
        if why is None:
            have = f"torch sees {count} ({_count_names(names)})" if count else "torch sees none"
        elif gpus:
            have = f"{why}, and nvidia-smi lists {gpus} GPU(s)"
        else:
            have = f"this machine has no GPU ({why})"
        ctx.ar_summary = f"the custom all-reduce cannot be checked here: it needs 2 GPUs on one node; {have}"
        fix: str | None  # also bound below to _ar_verdict()'s fix, which may be None
        fix = ("install a CUDA build of torch for your driver (the check runs through torch + NCCL; Paddle uses the "
               "same library)" if why is not None and gpus >= 2 else
               "run python -m graphjit doctor --collectives on a machine with 2+ NVIDIA GPUs (and a CUDA build of "
               "torch)")
        r.add("collectives", check, FAIL, f"needs 2 GPUs on one node, visible to torch: {have}", fix, gpus=count,
              reason=why)
        return
    if ctx.csrc == FAIL:
        ctx.ar_summary = "the custom all-reduce cannot run here: csrc does not build or load (see the fixes)"
        r.add("collectives", check, FAIL, "not run: the csrc build failed (see above)", ctx.csrc_fix or NVCC_FIX.format(
            arch="sm_90"))
        return
    t0 = time.perf_counter()
    reference = "gloo" if shared else "NCCL"
    results, tails, why = _run_ar_pair(ctx.timeout, device="shared" if shared else "cuda")
    status, text, fix, lines, data = _ar_verdict(results, tails, why, reference=reference)
    pair = (f"2 processes sharing GPU 0 ({_count_names(names[:1])}; GRAPHJIT_AR_SHARED_GPU=1, a test mode: P2P, "
            "NVLink and speed not checked)" if shared else f"GPUs 0,1 of {count} ({_count_names(names[:2])})")
    data["shared_gpu"] = bool(shared)
    data["seconds"] = time.perf_counter() - t0
    ctx.ar_summary = (f"the custom all-reduce matches {reference} on {pair}" if status == PASS
                      else f"the custom all-reduce FAILS on {pair}: all_reduce runs the framework's collective "
                      f"({reference}) until it is fixed")
    r.add("collectives", check, status, f"{pair}, {text}", fix, lines=lines, **data)


# -- summary, entry points --------------------------------------------------------------------------
def _summarise(ctx: _Context) -> None:
    r = ctx.report
    seen = {fw: devs for fw, devs in ctx.gpus.items() if devs}
    lines: list[str] = []
    if not seen and not ctx.system_gpus():
        broken = " (nvidia-smi failed: see below)" if ctx.smi and ctx.smi.get("error") else ""
        lines.append(f"no GPU on this machine{broken}: CUDA graphs will not be captured; graphed functions run the "
                     "traced function instead (one info log line says why)")
    elif not seen:
        lines.append(f"this machine has {ctx.system_gpus()} NVIDIA GPU(s) but no checked framework can use them: "
                     "CUDA graphs will not be captured and graphed functions run the traced function instead; "
                     "see the fixes below")
    else:
        devices = next(iter(seen.values()))
        ok = [k for k, v in ctx.captures.items() if v == PASS]
        bad = [k for k, v in ctx.captures.items() if v == FAIL]
        text = f"{_count_names([d['name'] for d in devices])}: "
        if ok and not bad:
            text += "CUDA graphs are captured and replayed correctly with " + ", ".join(ok)
        elif ok:
            text += f"CUDA graphs work with {', '.join(ok)}; they FAIL with {', '.join(bad)} (see the fixes below)"
        elif bad:
            text += f"CUDA graph capture FAILS with {', '.join(bad)}: graphjit falls back to the traced function"
        else:
            text += "capture not checked"
        lines.append(text)
    if ctx.collectives and ctx.ar_summary:
        lines.append(f"--collectives: {ctx.ar_summary}")
    r.summary = lines


def diagnose(framework: str = "all", collectives: bool = False, timeout: float = 180.0) -> Report:
    """Run every check; the :class:`Report` holds the rows, the summary and the exit status."""
    frameworks = FRAMEWORKS if framework == "all" else (framework,)
    report = Report(options={"framework": framework, "collectives": collectives, "timeout_s": timeout})
    ctx = _Context(report, frameworks, framework != "all", collectives, timeout)
    _check_system(ctx)
    checks: dict[str, Callable[[_Context], None]] = {"torch": _check_torch, "paddle": _check_paddle}
    for name in frameworks:
        checks[name](ctx)
    if framework == "all" and not any(importlib.util.find_spec(n) for n in FRAMEWORKS):
        report.add("system", "frameworks", FAIL, "neither paddle nor torch is installed",
                   "pip install paddlepaddle-gpu or torch (graphjit graphs functions of one of them)")
    _check_collectives(ctx)
    _summarise(ctx)
    return report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--framework", choices=("all", *FRAMEWORKS), default="all",
                        help="which framework to check (default all: every installed one)")
    parser.add_argument("--collectives", action="store_true",
                        help="also check the custom all-reduce: build csrc, run it in 2 processes on 2 GPUs and "
                             "compare it with NCCL (exits non-zero when it cannot work here)")
    parser.add_argument("--json", metavar="PATH", default=None, help="also write the results as JSON to PATH")
    parser.add_argument("--timeout", type=float, default=180.0, metavar="S",
                        help="seconds each probe subprocess may take (default 180)")


def run(args: argparse.Namespace) -> int:
    """The ``doctor`` command: print the report, write ``--json``, return the exit status."""
    report = diagnose(args.framework, args.collectives, args.timeout)
    print(report.render(), flush=True)
    code = report.exit_code
    if args.json:
        from .bench.common import write_json

        data = report.as_dict()
        data["argv"] = list(getattr(args, "argv", []) or [])
        try:
            path = Path(args.json)
            path.parent.mkdir(parents=True, exist_ok=True)
            write_json(path, data)
        except OSError as exc:
            print(f"graphjit doctor: could not write {args.json}: {exc}", file=sys.stderr, flush=True)
            return 1
        print(f"wrote {args.json}", flush=True)
    return code

