"""Running other programs for the doctor: commands (``nvidia-smi``, ``nvcc``) and probe processes.

Every probe that touches a GPU runs in a fresh Python (``python -m graphjit.backends.<probe>``), so that a
crash, a hang or a framework's teardown cannot take the doctor down.  A probe reports by printing one line
that starts with :data:`RESULT_MARK` followed by JSON; :func:`run_child` returns that JSON, or says why
there is none (crashed with a signal, exited without a result, hung past its timeout, could not start).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

RESULT_MARK = "graphjit-doctor-result: "
ROOT = Path(__file__).resolve().parents[2]  # the folder holding the graphjit package (for subprocesses)


def run_command(cmd: list[str], timeout: float = 20, **kwargs: Any) -> subprocess.CompletedProcess[str] | None:
    """Run a command; None if it cannot be started or runs past ``timeout``."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False, **kwargs)
    except (OSError, subprocess.SubprocessError):
        return None


def _signal_name(code: int) -> str:
    """The name of the signal that ended a process with return code ``code`` (< 0), e.g. ``SIGSEGV``."""
    with contextlib.suppress(ValueError):
        return signal.Signals(-code).name
    return f"signal {-code}"


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment for a child: graphjit's folder first on ``PYTHONPATH``, unbuffered output
    (unless set), then ``extra``."""
    environ = dict(os.environ)
    environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), environ.get("PYTHONPATH", "")) if p)
    environ.setdefault("PYTHONUNBUFFERED", "1")
    environ.update(extra or {})
    return environ


def run_child(args: list[str], timeout: float, extra_env: dict[str, str] | None = None
              ) -> tuple[dict[str, Any] | None, str]:
    """Run ``python ARGS`` (``-m graphjit.backends.<probe> ...``) in a fresh Python, in a temporary directory;
    return (the JSON it reported, None if none) and why not."""
    with tempfile.TemporaryDirectory(prefix="graphjit-doctor-") as tmp:
        # -m, not -c: tracers read the function's source; the temporary directory is sys.path[0]
        try:
            proc = subprocess.run([sys.executable, *args], capture_output=True, text=True,
                                  timeout=timeout, cwd=tmp, env=child_env(extra_env), check=False)
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
