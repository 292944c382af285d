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

``--json PATH`` also writes every row (and the facts behind it) as JSON.  This package imports no
framework, not even inside its functions: a framework's checks live in
:mod:`graphjit.doctor.torch.rows` and :mod:`graphjit.doctor.paddle.rows`, imported on first use,
and the probes that run in their own processes in ``graphjit.backends.*_doctor_*`` modules.  The modules:

* :mod:`.report`: the rows, the table and the exit status;
* :mod:`.context`: what one run's checks share;
* :mod:`.children`: running commands and probe processes;
* :mod:`.driver`: the CUDA driver API through ctypes;
* :mod:`.system`: Python, dependencies, ``GRAPHJIT_*`` variables, driver;
* :mod:`.capture`: the capture-and-replay row of every framework;
* :mod:`.toolchain`: nvcc and the csrc build;
* :mod:`.peers`: P2P, NVLink and CUDA IPC;
* :mod:`.allreduce`: the 2-process custom all-reduce check (``--collectives``);
* :mod:`.summary`: the summary lines; this module: the entry points.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path

from . import allreduce, peers, toolchain
from .context import Context, framework_checks
from .report import FAIL, PASS, SKIP, Report, Row
from .summary import summarise
from .system import check_system

__all__ = ["FAIL", "FRAMEWORKS", "PASS", "SKIP", "Report", "Row", "add_arguments", "diagnose", "run"]

FRAMEWORKS = ("torch", "paddle")


def _check_collectives(ctx: Context) -> None:
    """The rows the custom all-reduce needs, in order: nvcc, csrc build, P2P/NVLink/IPC, the all-reduce itself."""
    ctx.say("collectives: nvcc, the csrc build, P2P/NVLink/IPC" + (", the 2-process all-reduce" if ctx.collectives
                                                                   else ""))
    toolchain.check_nvcc(ctx)
    toolchain.check_csrc(ctx)
    peers.check_peers(ctx)
    allreduce.check_custom_ar(ctx)


_MISSING = {  # framework -> (the fix when --framework named it; the row and its fix otherwise)
    "torch": ("pip install torch (a CUDA build for GPUs: see https://pytorch.org/get-started/locally/)",
              "not installed (pass --framework paddle to check only Paddle)", "pip install torch, if you use PyTorch"),
    "paddle": ("pip install paddlepaddle-gpu (or paddlepaddle for CPU); see https://www.paddlepaddle.org.cn/install/quick",
               "not installed (pass --framework torch to check only PyTorch)",
               "pip install paddlepaddle-gpu, if you use Paddle"),
}


def _missing(ctx: Context, name: str) -> bool:
    """True, with the framework's one row, when ``name`` is not installed (a failure when ``--framework``
    named it, else a skip); found without importing it."""
    if importlib.util.find_spec(name) is not None:
        return False
    named_fix, text, fix = _MISSING[name]
    if ctx.explicit:
        ctx.report.add(name, name, FAIL, "not installed", named_fix)
    else:
        ctx.report.add(name, name, SKIP, text, fix)
    return True


def diagnose(framework: str = "all", collectives: bool = False, timeout: float = 180.0,
             progress: Callable[[str], None] | None = None) -> Report:
    """Run every check; the :class:`Report` holds the rows, the summary and the exit status.  ``progress``,
    if given, is called with a short line before each section and each step that takes seconds."""
    frameworks = FRAMEWORKS if framework == "all" else (framework,)
    report = Report(options={"framework": framework, "collectives": collectives, "timeout_s": timeout})
    ctx = Context(report, frameworks, framework != "all", collectives, timeout, progress=progress)
    ctx.say("system: Python, packages, GRAPHJIT_* variables, the NVIDIA driver")
    check_system(ctx)
    for name in frameworks:
        ctx.say(f"{name}: build, GPUs, a capture and replay")
        if not _missing(ctx, name):
            framework_checks(name).check(ctx)
    if framework == "all" and not any(importlib.util.find_spec(n) for n in FRAMEWORKS):
        report.add("system", "frameworks", FAIL, "neither paddle nor torch is installed",
                   "pip install paddlepaddle-gpu or torch (graphjit graphs functions of one of them)")
    _check_collectives(ctx)
    summarise(ctx)
    return report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``doctor`` command's options: ``--framework``, ``--collectives``, ``--json``, ``--timeout``."""
    parser.add_argument("--framework", choices=("all", *FRAMEWORKS), default="all",
                        help="which framework to check (default all: every installed one)")
    parser.add_argument("--collectives", action="store_true",
                        help="also check the custom all-reduce: build csrc, run it in 2 processes on 2 GPUs and "
                             "compare it with NCCL (exits non-zero when it cannot work here)")
    parser.add_argument("--json", metavar="PATH", default=None, help="also write the results as JSON to PATH")
    parser.add_argument("--timeout", type=float, default=180.0, metavar="S",
                        help="seconds each probe subprocess may take (default 180)")


def _progress(step: str) -> None:
    print(f"graphjit doctor: checking {step} ...", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    """The ``doctor`` command: print the report, write ``--json``, return the exit status."""
    report = diagnose(args.framework, args.collectives, args.timeout, progress=_progress)
    print(report.render(), flush=True)
    code = report.exit_code
    if args.json:
        from ..records import write_json

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

