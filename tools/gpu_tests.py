"""Run the GPU test files, each in a process of its own, a few at a time (``make test-gpu``).

A capture that goes wrong can leave a process unable to use CUDA (a stream left capturing, a generator
left in capture mode, a poisoned context).  graphjit must never do that, and tests/conftest.py fails the
test after which the process is unhealthy; running every file in a fresh process also keeps such a failure
from spilling into the files after it.  One GPU is shared by the processes (the tests check results, not
speed).

Usage: ``python3 tools/gpu_tests.py [-m EXPR] [-j N] [--timeout S] [--logs DIR] [FILE ...]``; exits 1 if
any file failed, timed out or ran no test.  Prints each file's summary line, the failures of failing files
and the totals.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COUNTS = re.compile(r"(\d+) (passed|failed|skipped|error|errors|deselected|xfailed|xpassed)")


def gpu_files(expr: str) -> list[Path]:
    """The test files that hold GPU tests of the framework ``expr`` selects: Paddle's (their marks say
    paddle) or the others; a file with both (test_gpu_training.py) runs in either."""
    paddle = "paddle" in expr and "not paddle" not in expr
    out = []
    for p in sorted((ROOT / "tests").glob("test_*.py")):
        text = p.read_text()
        if "pytest.mark.gpu" not in text:
            continue
        has_paddle, has_torch = "pytest.mark.paddle" in text, "pytest.mark.torch" in text
        if (paddle and has_paddle) or (not paddle and (has_torch or not has_paddle)):
            out.append(p)
    return out


def run_file(path: Path, expr: str, python: str, timeout: float, logs: Path) -> tuple[Path, int, str, float]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(x for x in (str(ROOT), os.environ.get("PYTHONPATH", "")) if x),
               PYTHONUNBUFFERED="1", GRAPHJIT_TEST_HARD_EXIT="1")
    cmd = [python, "-m", "pytest", "-q", "-m", expr, str(path), "-p", "no:cacheprovider", "-rfEs",
           "--durations=5"]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        out, rc = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        out += f"\nTIMEOUT after {timeout:.0f} s"
        rc = 124
    (logs / f"{path.stem}.log").write_text(out)
    return path, rc, out, time.perf_counter() - t0


def summary_line(out: str) -> str:
    lines = [ln for ln in out.splitlines() if COUNTS.search(ln) and (" in " in ln or "TIMEOUT" in ln)]
    return lines[-1].strip("= ") if lines else out.strip().splitlines()[-1] if out.strip() else "(no output)"


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", default="gpu and not paddle", help="pytest marker expression")
    ap.add_argument("-j", type=int, default=3, help="files run at once")
    ap.add_argument("--timeout", type=float, default=420.0, help="seconds per file")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--logs", default=os.environ.get("GPU_TEST_LOGS", "/tmp/graphjit-gpu-tests"))
    ap.add_argument("files", nargs="*")
    args = ap.parse_args(argv)
    logs = Path(args.logs)
    logs.mkdir(parents=True, exist_ok=True)
    files = [Path(f).resolve() for f in args.files] or gpu_files(args.m)
    totals: dict[str, int] = {}
    bad = []
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(1, args.j)) as pool:
        futures = [pool.submit(run_file, f, args.m, args.python, args.timeout, logs) for f in files]
        for fut in futures:
            path, rc, out, secs = fut.result()
            line = summary_line(out)
            print(f"{path.name:40s} {secs:6.1f} s  rc={rc}  {line}", flush=True)
            for n, kind in COUNTS.findall(line):
                kind = {"errors": "error"}.get(kind, kind)
                totals[kind] = totals.get(kind, 0) + int(n)
            if rc not in (0, 5) or "failed" in line or "error" in line:
                bad.append((path, out))
    for path, out in bad:
        print(f"\n===== {path.name} =====")
        print("\n".join(out.splitlines()[-80:]))
    total = ", ".join(f"{n} {k}" for k, n in sorted(totals.items()))
    print(f"\nTOTAL: {total} in {time.perf_counter() - t0:.0f} s; {len(bad)} file(s) failed")
    return 1 if bad or not totals.get("passed") else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
