"""``python -m graphjit doctor`` on a CPU machine, and the pieces it is built from."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import graphjit.env
from graphjit import doctor
from graphjit.__main__ import main

ROOT = Path(__file__).resolve().parents[1]
HAS_TORCH = importlib.util.find_spec("torch") is not None
HAS_PADDLE = importlib.util.find_spec("paddle") is not None
INSTALLED = [fw for fw, present in (("torch", HAS_TORCH), ("paddle", HAS_PADDLE)) if present]


def any_gpu() -> bool:
    from conftest import paddle_cuda, torch_cuda

    return shutil.which("nvidia-smi") is not None or torch_cuda() or paddle_cuda()


cpu_only = pytest.mark.skipif("any_gpu()", reason="this machine has a GPU")
needs_framework = pytest.mark.skipif(not INSTALLED, reason="needs torch or paddle")


def _table_rows(out: str) -> list[tuple[str, str]]:
    """(mark, check) of every table row of the doctor's output."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("mark  check"))
    rows = []
    for line in lines[start + 2:]:
        if not line.strip():
            break
        if not line.startswith(" "):
            mark, rest = line[:4], line[6:]
            rows.append((mark, rest.split("  ")[0].strip()))
    return rows


# -- the command ----------------------------------------------------------------------------------
@cpu_only
@needs_framework
def test_doctor_on_cpu_says_no_gpu_and_exits_0() -> None:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("GRAPHJIT_")}
    environ["PYTHONPATH"] = str(ROOT) + os.pathsep + environ.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-m", "graphjit", "doctor"], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env=environ)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    first = proc.stdout.splitlines()[0]
    assert first.startswith("graphjit doctor: no GPU"), first
    assert "will not be captured" in first and "traced function" in first
    rows = _table_rows(proc.stdout)
    assert rows and all(mark in ("pass", "fail", "skip") for mark, _ in rows), rows
    checks = {check: mark for mark, check in rows}
    assert checks["python"] == "pass" and checks["csrc build"] == "skip"
    assert "custom all-reduce: not in this release" in proc.stdout
    for fw in INSTALLED:
        assert checks[f"{fw} build"] == "pass"
        assert checks[f"{fw} GPUs"] == "skip"
    if HAS_TORCH:
        assert checks["torch capture+replay"] == "skip"
    if HAS_PADDLE:
        assert checks["paddle graphed (sot)"] == "skip"
        for flag in ("FLAGS_new_executor_use_cuda_graph", "FLAGS_allocator_strategy",
                     "FLAGS_use_stream_safe_cuda_allocator"):
            assert flag in checks
    assert "fail" not in checks.values(), proc.stdout
    assert proc.stdout.rstrip().splitlines()[-1].startswith("exit status 0")


@needs_framework
def test_collectives_is_not_in_this_release(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["doctor", "--collectives", "--framework", INSTALLED[0]])
    out = capsys.readouterr().out
    assert rc != 0
    assert "custom all-reduce: not in this release" in out.splitlines()[1]
    assert ("fail", "csrc build") in _table_rows(out)
    assert "exit status 1" in out and "csrc build" in out.splitlines()[-1]


@needs_framework
def test_json_has_every_row(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "sub" / "doctor.json"
    rc = main(["doctor", "--framework", INSTALLED[0], "--json", str(target)])
    out = capsys.readouterr().out
    data = json.loads(target.read_text())
    assert data["exit_code"] == rc and data["options"]["framework"] == INSTALLED[0]
    assert data["summary"][0] in out.splitlines()[0]
    rows = data["rows"]
    assert [(r["status"], r["check"]) for r in rows] == _table_rows(out)
    for r in rows:
        assert set(r) >= {"section", "check", "status", "result", "fix", "blocking", "data"}
        assert r["status"] in ("pass", "fail", "skip") and r["result"]
    checks = {r["check"] for r in rows}
    assert {"python", "graphjit", "nvcc", "csrc build", "P2P access", "CUDA IPC", f"{INSTALLED[0]} build"} <= checks
    assert data["counts"]["pass"] + data["counts"]["fail"] + data["counts"]["skip"] == len(rows)
    other = {"torch": "paddle", "paddle": "torch"}[INSTALLED[0]]
    assert not any(r["section"] == other for r in rows)  # --framework filters
    assert f"wrote {target}" in out


@pytest.mark.skipif(not HAS_TORCH, reason="needs torch")
def test_framework_named_but_missing_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(doctor.importlib.util, "find_spec",
                        lambda name, *a: None if name == "paddle" else real(name, *a))
    report = doctor.diagnose("paddle")
    row = next(r for r in report.rows if r.check == "paddle")
    assert row.status == "fail" and row.fix and "pip install" in row.fix
    assert report.exit_code == 1
    assert doctor.diagnose("all").exit_code == 0 or any_gpu()  # "all": a missing framework is a skip


FAKE_SMI = """#!/bin/sh
case "$*" in
  *compute_cap*) echo "Field \"compute_cap\" is not a valid field to query." >&2; exit 2 ;;
  *--query-gpu*) printf '0, NVIDIA H200, 580.159.04, 143771\n1, NVIDIA H200, 580.159.04, 143771\n' ;;
  *topo*) printf '\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV18\t0-47\nGPU1\tNV18\t X \t0-47\n' ;;
  *) exit 1 ;;
esac
"""


@cpu_only
@pytest.mark.skipif(not HAS_TORCH or sys.platform == "win32", reason="needs torch and a POSIX shell")
def test_gpu_without_a_cuda_build_fails(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """nvidia-smi lists GPUs (a fake one here) but torch is a CPU build: a failure, with the fix."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text(FAKE_SMI)
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    info = doctor._nvidia_smi()
    assert info is not None and "error" not in info and info["driver"] == "580.159.04"  # retried without compute_cap
    assert [g["name"] for g in info["gpus"]] == ["NVIDIA H200", "NVIDIA H200"]
    report = doctor.diagnose("torch")
    rows = {r.check: r for r in report.rows}
    assert rows["NVIDIA driver"].status == "pass" and "2 x NVIDIA H200" in rows["NVIDIA driver"].result
    assert rows["torch build"].status == "fail" and "CUDA build" in rows["torch build"].fix
    assert "2 NVIDIA GPU(s) but no checked framework can use them" in report.summary[0]
    assert report.exit_code == 1
    assert "fix: install a CUDA build of torch" in report.render()


@needs_framework
def test_bad_graphjit_variable_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRAPHJIT_MAX_GRAPHS", "lots")
    report = doctor.diagnose(INSTALLED[0])
    row = next(r for r in report.rows if r.check == "GRAPHJIT_* variables")
    assert row.status == "fail" and "GRAPHJIT_MAX_GRAPHS" in row.result and report.exit_code == 1


@needs_framework
def test_disable_skips_the_capture_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRAPHJIT_DISABLE", "1")
    report = doctor.diagnose(INSTALLED[0])
    env_row = next(r for r in report.rows if r.check == "GRAPHJIT_* variables")
    assert env_row.status == "skip" and "GRAPHJIT_DISABLE" in (env_row.fix or "")
    graphed = [r for r in report.rows if "capture+replay" in r.check or "graphed (" in r.check]
    assert graphed and all(r.status == "skip" and "GRAPHJIT_DISABLE" in r.result for r in graphed)


def test_bad_nvcc_variable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GRAPHJIT_NVCC", str(tmp_path / "no-such-nvcc"))
    graphjit.env.refresh()
    path, source, problem = doctor._find_nvcc()
    assert path is None and source == "GRAPHJIT_NVCC" and "not an executable" in problem


# -- the pieces -----------------------------------------------------------------------------------
def test_report_exit_code_counts_only_blocking_failures() -> None:
    r = doctor.Report(summary=["a summary"])
    r.add("s", "fine", doctor.PASS, "ok")
    r.add("s", "optional", doctor.FAIL, "broken", "do this", blocking=False, lines=["GPU0 X"])
    assert r.exit_code == 0
    text = r.render()
    assert text.splitlines()[0] == "graphjit doctor: a summary"
    assert "fix: do this" in text and "GPU0 X" in text and "exit status 0" in text
    r.add("s", "needed", doctor.FAIL, "broken", "do that")
    assert r.exit_code == 1 and "exit status 1: 1 failed check(s) stop what you asked for: needed" in r.render()
    json.dumps(r.as_dict())


def test_parse_topo() -> None:
    text = ("\x1b[4m\tGPU0\tGPU1\tGPU2\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
            "GPU0\t X \tNV18\tSYS\t0-47\t0\t\tN/A\n"
            "GPU1\tNV18\t X \tPIX\t0-47\t0\t\tN/A\n"
            "GPU2\tSYS\tPIX\t X \t0-47\t0\t\tN/A\n\nLegend:\n\n  X    = Self\n")
    links = doctor._parse_topo(text)
    assert links[(0, 1)] == "NV18" and links[(1, 0)] == "NV18"
    assert links[(0, 2)] == "SYS" and links[(1, 2)] == "PIX" and (0, 0) not in links
    assert doctor._parse_topo("") == {}


def test_torch_arch_ok() -> None:
    archs = ["sm_80", "sm_86", "sm_90", "compute_90"]
    assert doctor._torch_arch_ok("9.0", archs) and doctor._torch_arch_ok("8.6", archs)
    assert doctor._torch_arch_ok("12.0", archs)  # PTX for compute_90 runs on newer GPUs
    assert not doctor._torch_arch_ok("7.5", archs)
    assert not doctor._torch_arch_ok("12.0", ["sm_80", "sm_90"])


def test_child_crash_and_hang_are_reported() -> None:
    result, why = doctor._run_child("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n", [], 30)
    assert result is None and "crashed (SIGSEGV)" in why
    result, why = doctor._run_child("import time\ntime.sleep(30)\n", [], 1)
    assert result is None and "hung" in why
    result, why = doctor._run_child(f"print({doctor.RESULT_MARK!r} + '{{\"ok\": true}}')\n", [], 30)
    assert result == {"ok": True} and why == ""


@pytest.mark.skipif(not HAS_PADDLE, reason="needs paddle")
def test_paddle_probe_script_runs_on_cpu() -> None:
    """The GPU probe's script, run on the CPU: it goes through graphjit and reports in JSON."""
    result, why = doctor._run_child(doctor._PADDLE_PROBE, ["sot", "kernels", "cpu"], 120, {"MIN_GRAPH_SIZE": "0"})
    assert result is not None, why
    assert result["ok"], result
    assert result["worst"] == 0.0 and result["worst_numpy"] == 0.0 and result["elementwise_ok"] is True
    assert result["stats"]["calls"] == 4


@pytest.mark.skipif(not HAS_TORCH, reason="needs torch")
def test_ipc_probe_script_reports() -> None:
    result, why = doctor._run_child(doctor._IPC_PROBE, [], 120)
    assert result is not None, why
    assert isinstance(result.get("ok"), bool)
