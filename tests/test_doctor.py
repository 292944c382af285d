"""``python -m graphjit doctor`` on a CPU machine, and the pieces it is built from."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import graphjit.env
from graphjit import doctor
from graphjit.__main__ import main
from graphjit.collectives import csrc_build, library
from graphjit.doctor import allreduce, children, context, peers, system, toolchain
from graphjit.doctor.paddle import rows as paddle_doctor
from graphjit.doctor.torch import rows as torch_doctor

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
    assert first.startswith(f"graphjit {graphjit.__version__} doctor: no GPU"), first
    assert "will not be captured" in first and "traced function" in first
    rows = _table_rows(proc.stdout)
    assert rows and all(mark in ("pass", "fail", "skip") for mark, _ in rows), rows
    checks = {check: mark for mark, check in rows}
    assert checks["python"] == "pass" and checks["csrc build"] == "skip"
    assert checks["custom all-reduce"] == "skip"  # plain doctor never starts NCCL processes
    assert "not in this release" not in proc.stdout
    assert "no GPU: the build needs a target architecture, nothing compiled" in proc.stdout
    assert "--collectives" not in proc.stdout.splitlines()[1]
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


@cpu_only
@needs_framework
def test_collectives_on_cpu_exits_1_and_says_why(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """--collectives without GPUs: the custom all-reduce row fails (it needs 2 GPUs on one node); with nvcc,
    csrc is test-compiled for sm_90 into a temporary directory (the toolchain works), nothing is cached."""
    monkeypatch.setenv("GRAPHJIT_CACHE_DIR", str(tmp_path / "cache"))
    graphjit.env.refresh()
    target = tmp_path / "doctor.json"
    rc = main(["doctor", "--collectives", "--framework", INSTALLED[0], "--json", str(target)])
    out = capsys.readouterr().out
    assert rc == 1
    summary = out.splitlines()[1]
    assert summary.startswith("--collectives: the custom all-reduce cannot be checked here: it needs 2 GPUs on one "
                              "node; this machine has no GPU"), summary
    rows = _table_rows(out)
    assert ("fail", "custom all-reduce") in rows
    assert "fix: run python -m graphjit doctor --collectives on a machine with 2+ NVIDIA GPUs" in out
    last = out.rstrip().splitlines()[-2]  # the last line says "wrote PATH"
    assert last.startswith("exit status 1") and "custom all-reduce" in last, last
    data = json.loads(target.read_text())
    by_check = {r["check"]: r for r in data["rows"]}
    assert data["exit_code"] == 1 and data["options"]["collectives"] is True
    ar = by_check["custom all-reduce"]
    assert ar["status"] == "fail" and ar["blocking"] and "needs 2 GPUs on one node" in ar["result"]
    csrc = by_check["csrc build"]
    if toolchain.find_nvcc()[0] is not None:
        assert csrc["status"] == "pass", csrc
        assert "compiled csrc for sm_90 as a toolchain check" in csrc["result"]
        assert f"(ABI {csrc_build.ABI_VERSION})" in csrc["result"]
        assert csrc["data"]["test_arch"] == "sm_90" and csrc["data"]["seconds"] < 120
        assert not (tmp_path / "cache").exists() or not list((tmp_path / "cache").glob("*.so"))  # a temporary build
    else:
        assert csrc["status"] == "fail" and csrc["blocking"] and "GRAPHJIT_NVCC" in csrc["fix"]


@needs_framework
def test_progress_lines_go_to_stderr_one_per_section(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """A long command says what it does: one stderr line per section before it runs (the table stays on
    stdout, unchanged), and one before each step that takes seconds (here: the test build of csrc)."""
    monkeypatch.setenv("GRAPHJIT_CACHE_DIR", str(tmp_path / "cache"))
    graphjit.env.refresh()
    main(["doctor", "--collectives", "--framework", INSTALLED[0]])
    captured = capsys.readouterr()
    steps = [line for line in captured.err.splitlines() if line.startswith("graphjit doctor: checking ")]
    assert [s.split(":")[1].split()[-1] for s in steps[:3]] == ["system", INSTALLED[0], "collectives"], steps
    if shutil.which("nvcc") or os.environ.get("GRAPHJIT_NVCC"):
        assert any("build of csrc" in s for s in steps), steps
    assert "graphjit doctor: checking" not in captured.out


@cpu_only
@needs_framework
def test_csrc_row_without_nvcc(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No nvcc, no GPU: plain doctor skips the build (exit 0); --collectives fails it with the fix, unless a
    library built ahead of time for these sources is in GRAPHJIT_CACHE_DIR (then it is loaded)."""
    from graphjit.collectives import csrc_build

    monkeypatch.setenv("GRAPHJIT_NVCC", str(tmp_path / "no-such-nvcc"))
    monkeypatch.setenv("GRAPHJIT_CACHE_DIR", str(tmp_path / "cache"))
    graphjit.env.refresh()
    plain = doctor.diagnose(INSTALLED[0])
    rows = {r.check: r for r in plain.rows}
    assert rows["nvcc"].status == "fail" and not rows["nvcc"].blocking
    assert rows["csrc build"].status == "skip" and "python -m graphjit build --arch sm_90" in rows["csrc build"].fix
    assert plain.exit_code == 0

    report = doctor.diagnose(INSTALLED[0], collectives=True)
    rows = {r.check: r for r in report.rows}
    assert rows["nvcc"].status == "fail" and rows["nvcc"].blocking
    csrc = rows["csrc build"]
    assert csrc.status == "fail" and csrc.blocking and "no nvcc and no library built ahead of time" in csrc.result
    assert "GRAPHJIT_NVCC" in csrc.fix and "python -m graphjit build --arch sm_90" in csrc.fix
    assert rows["custom all-reduce"].status == "fail" and report.exit_code == 1

    built = csrc_build.library_path("sm_90")  # as if `python -m graphjit build --arch sm_90` had run
    built.parent.mkdir(parents=True)
    built.write_bytes(b"")
    monkeypatch.setattr(library, "Library", lambda path: object())
    report = doctor.diagnose(INSTALLED[0], collectives=True)
    csrc = next(r for r in report.rows if r.check == "csrc build")
    assert csrc.status == "pass" and "built ahead of time (sm_90" in csrc.result, csrc.result
    assert csrc.data["cached"] == ["sm_90"]


class _FakeLibrary:
    def __init__(self, path: Any) -> None:
        self.path = path

    def device_info(self, device: int) -> tuple[str, int, int]:
        return "00000000:1B:00.0", 9, 0


def _gpu_context(collectives: bool = False) -> context.Context:
    ctx = context.Context(doctor.Report(), ("torch",), False, collectives, 60.0)
    ctx.gpus["torch"] = [{"index": i, "name": "NVIDIA H200", "capability": "9.0", "memory_gib": 140.0}
                         for i in range(2)]
    return ctx


def test_csrc_row_loads_or_builds_for_the_gpu_arch(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """With GPUs (faked): the library for their architecture is built (no nvcc here: a failure with the fix, blocking
    only with --collectives) or loaded from the cache, and asked about GPU 0."""
    monkeypatch.setenv("GRAPHJIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("GRAPHJIT_NVCC", str(tmp_path / "no-such-nvcc"))
    graphjit.env.refresh()
    for collectives in (False, True):
        ctx = _gpu_context(collectives)
        toolchain.check_csrc(ctx)
        row = ctx.report.rows[-1]
        assert row.check == "csrc build" and row.status == "fail" and row.blocking == collectives
        assert row.result.startswith("sm_90: building failed: nvcc was not found"), row.result
        assert row.fix and "GRAPHJIT_NVCC" in row.fix and ctx.csrc == "fail" and ctx.csrc_fix == row.fix

    built = csrc_build.library_path("sm_90")
    built.parent.mkdir(parents=True)
    built.write_bytes(b"")
    monkeypatch.setattr(library, "Library", _FakeLibrary)
    ctx = _gpu_context()
    toolchain.check_csrc(ctx)
    row = ctx.report.rows[-1]
    assert row.status == "pass" and ctx.csrc == "pass"
    assert row.result.startswith(f"sm_90 cached ({built.name})")
    assert "GPU 0 is sm_90 at 00000000:1B:00.0" in row.result


def _rank_result(rank: int, **changes: Any) -> dict[str, Any]:
    cases = [{"mode": "eager", "dtype": dt, "algo": algo, "bytes": b, "calls": 1, "custom": True,
              "max_abs_diff": 0.0, "max_abs": 4.0, "tol": 4.0 * 2**-10}
             for dt in ("float32", "float16", "bfloat16") for algo in ("1shot", "2shot") for b in allreduce.AR_SIZES]
    cases += [{"mode": "graphed", "dtype": dt, "algo": "auto", "bytes": n * 4, "calls": 4, "custom": True,
               "max_abs_diff": 0.0, "max_abs": 9.0, "tol": 9.0 * 2**-7, "graphs": 1, "replays": 4, "captured": 1,
               "fallbacks": {}} for dt, n in allreduce.AR_GRAPHED]
    result = {"rank": rank, "stage": "done", "done": True, "init_s": 1.5, "cases": cases, "fallbacks": {},
              "reasons": {}, "report": {"enabled": True, "reason_key": None, "reason": None, "arch": "sm_90",
                                        "rank": rank, "world_size": 2}}
    result.update(changes)
    return result


def test_ar_verdict() -> None:
    ok = [_rank_result(0), _rank_result(1)]
    status, text, fix, lines, data = allreduce.ar_verdict(ok, ["", ""], None)
    assert status == "pass" and fix is None
    assert text.startswith("30 eager all-reduces (16 B to 8 MiB; float32, float16, bfloat16; one-shot and two-shot)")
    assert "2 graphed steps (8 replays) ran the custom kernel and match NCCL (max abs diff 0)" in text
    assert lines[0].startswith("eager    float32    10 call(s), 16 B .. 8 MiB (1shot+2shot): max abs diff 0")
    assert len(lines) == 5 and data["report"]["arch"] == "sm_90"

    wrong = [_rank_result(0), _rank_result(1)]
    wrong[1]["cases"][3]["max_abs_diff"] = 0.5
    status, text, fix, _, _ = allreduce.ar_verdict(wrong, ["", ""], None)
    assert status == "fail" and "differs from NCCL in 1 of 64 results (32 cases x 2 ranks)" in text
    # the shared-GPU test mode (GRAPHJIT_AR_SHARED_GPU=1, 1 GPU) compares with gloo and says so
    status, text, _, _, _ = allreduce.ar_verdict(ok, ["", ""], None, reference="gloo")
    assert status == "pass" and "match gloo" in text and "NCCL" not in text
    status, text, _, _, _ = allreduce.ar_verdict(wrong, ["", ""], None, reference="gloo")
    assert status == "fail" and "differs from gloo" in text
    assert "max abs diff 0.5" in text and "on rank 1" in text and fix and "bug" in fix

    vmm = [_rank_result(0, reasons={"VMM memory": "captured tensor in VMM memory"}), _rank_result(1)]
    vmm[0]["cases"][-1].update(custom=False, fallbacks={"VMM memory": 4})
    status, text, fix, _, _ = allreduce.ar_verdict(vmm, ["", ""], None)
    assert status == "fail" and "ran NCCL instead of the custom kernel" in text and "expandable_segments" in fix

    off = _rank_result(0)
    off["report"].update(enabled=False, reason_key="topology", reason="rank 0: the P2P write probe failed")
    status, text, fix, _, _ = allreduce.ar_verdict([off, _rank_result(1)], ["", ""], None)
    assert status == "fail" and text.startswith("collectives.init turned it off (topology): rank 0: the P2P")
    assert fix and "P2P" in fix

    hung = [_rank_result(0, stage="NCCL group", done=False), None]
    status, text, fix, lines, _ = allreduce.ar_verdict(hung, ["", "some NCCL error\n"], "the 2 processes did "
                                                        "not finish in 180 s")
    assert status == "fail" and "did not finish in 180 s; rank 1 wrote no result" in text
    assert "rank 0: NCCL group" in text and lines == ["rank 1: some NCCL error"]
    assert fix and "NCCL_DEBUG=INFO" in fix


@needs_framework
def test_collectives_with_two_gpus_runs_the_pair(monkeypatch: pytest.MonkeyPatch) -> None:
    """The wiring of --collectives on a 2-GPU machine (GPUs, csrc and the 2 processes faked); plain doctor
    never starts them."""
    calls: list[float] = []

    def pair(timeout: float, device: str = "cuda", framework: str = "torch") -> Any:
        calls.append(timeout)
        return [_rank_result(0), _rank_result(1)], ["", ""], None

    def csrc(ctx: context.Context) -> None:
        ctx.csrc = doctor.PASS
        ctx.report.add("collectives", "csrc build", doctor.PASS, "faked")

    monkeypatch.setattr(allreduce, "run_ar_pair", pair)
    monkeypatch.setattr(toolchain, "check_csrc", csrc)
    for backend in (torch_doctor, paddle_doctor):  # --framework INSTALLED[0] asks that framework's view
        monkeypatch.setattr(backend, "doctor_gpus", lambda ctx: (2, ["NVIDIA H200", "NVIDIA H200"], None))
    plain = doctor.diagnose(INSTALLED[0])
    assert not calls and next(r for r in plain.rows if r.check == "custom all-reduce").status == "skip"
    report = doctor.diagnose(INSTALLED[0], collectives=True, timeout=77)
    row = next(r for r in report.rows if r.check == "custom all-reduce")
    assert calls == [77] and row.status == "pass", row.result
    assert row.result.startswith("GPUs 0,1 of 2 (2 x NVIDIA H200), 30 eager all-reduces")
    reference = "NCCL" if INSTALLED[0] == "torch" else "the exact sum"  # Paddle's probe compares with numpy
    assert report.summary[-1] == (f"--collectives: the custom all-reduce matches {reference} on GPUs 0,1 of 2 "
                                  "(2 x NVIDIA H200)")
    assert "max abs diff 0" in report.render()

    for backend in (torch_doctor, paddle_doctor):
        monkeypatch.setattr(backend, "doctor_gpus", lambda ctx: (1, ["NVIDIA H200"], None))
    report = doctor.diagnose(INSTALLED[0], collectives=True)
    row = next(r for r in report.rows if r.check == "custom all-reduce")
    assert row.status == "fail"
    fw = INSTALLED[0]
    assert f"needs 2 GPUs on one node, visible to {fw}: {fw} sees 1 (NVIDIA H200)" in row.result
    assert report.exit_code == 1 and len(calls) == 1


def test_collectives_runs_through_paddle_where_torch_cannot(monkeypatch: pytest.MonkeyPatch) -> None:
    """No usable torch but 2 GPUs Paddle sees: the pair runs Paddle's probe; torch with 2 GPUs wins otherwise;
    --framework paddle picks Paddle's view even when torch could run it."""
    two = (2, ["NVIDIA H200", "NVIDIA H200"], None)
    monkeypatch.setattr(torch_doctor, "doctor_gpus", lambda ctx: (0, [], "torch is not installed"))
    monkeypatch.setattr(paddle_doctor, "doctor_gpus", lambda ctx: two)
    ctx = context.Context(doctor.Report(), ("paddle", "torch"), False, True, 60.0)
    assert allreduce.probe_framework(ctx) == ("paddle", *two)
    monkeypatch.setattr(torch_doctor, "doctor_gpus", lambda ctx: two)
    assert allreduce.probe_framework(ctx)[0] == "torch"
    monkeypatch.setattr(paddle_doctor, "doctor_gpus", lambda ctx: (1, ["NVIDIA H200"], None))
    explicit = context.Context(doctor.Report(), ("paddle",), True, True, 60.0)
    assert allreduce.probe_framework(explicit) == ("paddle", 1, ["NVIDIA H200"], None)
    monkeypatch.setattr(torch_doctor, "doctor_gpus", lambda ctx: (0, [], "torch is not installed"))
    monkeypatch.setattr(paddle_doctor, "doctor_gpus", lambda ctx: (0, [], "paddle sees no GPU it can capture on"))
    allreduce.check_custom_ar(ctx)  # neither: the row names torch's reason (the usual route)
    row = ctx.report.rows[-1]
    assert row.status == "fail" and "visible to torch" in row.result and "torch is not installed" in row.result


def test_paddle_view_of_the_gpus_comes_from_the_paddle_rows() -> None:
    ctx = _gpu_context()
    ctx.gpus["paddle"] = [{"index": i, "name": "NVIDIA H200"} for i in range(2)]
    assert paddle_doctor.doctor_gpus(ctx) == (2, ["NVIDIA H200", "NVIDIA H200"], None)
    count, names, why = paddle_doctor.doctor_gpus(_gpu_context())
    assert (count, names) == (0, []) and why == ("paddle sees no GPU it can capture on (see the paddle rows)"
                                                 if HAS_PADDLE else "paddle is not installed (the check runs "
                                                 "through paddle.distributed and NCCL)")


@pytest.mark.skipif(not HAS_PADDLE, reason="needs paddle")
@pytest.mark.slow
def paddle_version() -> str:
    import paddle

    return str(paddle.__version__)


def test_paddle_ar_probe_runs_on_cpu() -> None:
    """Paddle's 2-process probe in a gloo group on the CPU: it starts, runs every case and reports (the custom
    all-reduce is off there: CPU build; every call runs gloo and matches, counted under that reason)."""
    results, tails, why = allreduce.run_ar_pair(120, "cpu", framework="paddle")
    assert why is None, (why, tails)
    for rank, res in enumerate(results):
        assert res is not None and res["done"] and res["returncode"] == 0, (res, tails[rank])
        assert res["report"]["enabled"] is False and res["report"]["reason_key"] == "unavailable"
        cases = res["cases"]
        eager = [c for c in cases if c["mode"] == "eager"]
        graphed = [c for c in cases if c["mode"] == "graphed"]
        # float32 only on the CPU (Paddle's gloo sums float16 to inf there); the exact sum, in numpy, is the reference
        assert len(eager) == 2 * len(allreduce.AR_SIZES) and len(graphed) == len(allreduce.AR_GRAPHED)
        assert {c["dtype"] for c in cases} == {"float32"}
        assert all(c["max_abs_diff"] == 0.0 and c["max_abs"] > 0 and c["custom"] is False for c in cases), cases
        # Paddle 2.x checks its SOT on the first call of each graphed case: one all-reduce more per case
        checked = len(graphed) if int(paddle_version().split(".")[0]) < 3 else 0
        assert res["fallbacks"] == {"unavailable": len(eager) + sum(c["calls"] for c in graphed) + checked}, \
            res["fallbacks"]
    status, text, fix, _, _ = allreduce.ar_verdict(results, tails, why)
    assert status == "fail" and text.startswith("collectives.init turned it off (unavailable)") and fix


def test_collectives_setting_off_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRAPHJIT_CUSTOM_AR", "0")
    graphjit.env.refresh()
    ctx = _gpu_context(collectives=True)
    allreduce.check_custom_ar(ctx)
    row = ctx.report.rows[-1]
    assert row.status == "fail" and "GRAPHJIT_CUSTOM_AR=0" in row.result and "unset GRAPHJIT_CUSTOM_AR" in row.fix


@pytest.mark.skipif(not HAS_TORCH, reason="needs torch")
@pytest.mark.slow
def test_ar_probe_script_runs_on_cpu() -> None:
    """The 2-process probe, in a gloo group on the CPU: it starts, exchanges a port, runs every case and reports
    (collectives.init turns the custom all-reduce off: CPU build; every call runs gloo and matches)."""
    results, tails, why = allreduce.run_ar_pair(120, "cpu")
    assert why is None, (why, tails)
    for rank, res in enumerate(results):
        assert res is not None and res["done"] and res["returncode"] == 0, (res, tails[rank])
        assert res["report"]["enabled"] is False and res["report"]["reason_key"] == "unavailable"
        cases = res["cases"]
        assert len(cases) == 3 * 2 * len(allreduce.AR_SIZES) + len(allreduce.AR_GRAPHED)
        assert all(c["max_abs_diff"] == 0.0 and c["custom"] is False for c in cases), cases
        # every call (eager, and the graphed steps' calls, uncaptured here) counted under the reason it is off
        graphed_calls = sum(c.get("calls") or c.get("replays") or 0 for c in cases if c.get("mode") == "graphed")
        assert res["fallbacks"] == {"unavailable": 3 * 2 * len(allreduce.AR_SIZES) + graphed_calls}, res["fallbacks"]
    status, text, fix, _, _ = allreduce.ar_verdict(results, tails, why)
    assert status == "fail" and text.startswith("collectives.init turned it off (unavailable)") and fix


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
    assert {"python", "graphjit", "nvcc", "csrc build", "P2P access", "CUDA IPC", "custom all-reduce",
            f"{INSTALLED[0]} build"} <= checks
    assert data["counts"]["pass"] + data["counts"]["fail"] + data["counts"]["skip"] == len(rows)
    other = {"torch": "paddle", "paddle": "torch"}[INSTALLED[0]]
    assert not any(r["section"] == other for r in rows)  # --framework filters
    assert f"wrote {target}" in out


@pytest.mark.skipif(not HAS_TORCH, reason="needs torch")
def test_framework_named_but_missing_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
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
    info = system.nvidia_smi()
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
    path, source, problem = toolchain.find_nvcc()
    assert path is None and source == "GRAPHJIT_NVCC" and "not an executable" in problem


# -- the pieces -----------------------------------------------------------------------------------
def test_report_exit_code_counts_only_blocking_failures() -> None:
    r = doctor.Report(summary=["a summary"])
    r.add("s", "fine", doctor.PASS, "ok")
    r.add("s", "optional", doctor.FAIL, "broken", "do this", blocking=False, lines=["GPU0 X"])
    assert r.exit_code == 0
    text = r.render()
    assert text.splitlines()[0] == f"graphjit {graphjit.__version__} doctor: a summary"
    assert "fix: do this" in text and "GPU0 X" in text and "exit status 0" in text
    r.add("s", "needed", doctor.FAIL, "broken", "do that")
    assert r.exit_code == 1 and "exit status 1: 1 failed check(s) stop what you asked for: needed" in r.render()
    json.dumps(r.as_dict())


def test_parse_topo() -> None:
    text = ("\x1b[4m\tGPU0\tGPU1\tGPU2\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
            "GPU0\t X \tNV18\tSYS\t0-47\t0\t\tN/A\n"
            "GPU1\tNV18\t X \tPIX\t0-47\t0\t\tN/A\n"
            "GPU2\tSYS\tPIX\t X \t0-47\t0\t\tN/A\n\nLegend:\n\n  X    = Self\n")
    links = peers.parse_topo(text)
    assert links[(0, 1)] == "NV18" and links[(1, 0)] == "NV18"
    assert links[(0, 2)] == "SYS" and links[(1, 2)] == "PIX" and (0, 0) not in links
    assert peers.parse_topo("") == {}


def test_torch_arch_ok() -> None:
    archs = ["sm_80", "sm_86", "sm_90", "compute_90"]
    assert torch_doctor.torch_arch_ok("9.0", archs) and torch_doctor.torch_arch_ok("8.6", archs)
    assert torch_doctor.torch_arch_ok("12.0", archs)  # PTX for compute_90 runs on newer GPUs
    assert not torch_doctor.torch_arch_ok("7.5", archs)
    assert not torch_doctor.torch_arch_ok("12.0", ["sm_80", "sm_90"])


def test_child_crash_and_hang_are_reported() -> None:
    result, why = children.run_child(["-c", "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n"], 30)
    assert result is None and "crashed (SIGSEGV)" in why
    result, why = children.run_child(["-c", "import time\ntime.sleep(30)\n"], 1)
    assert result is None and "hung" in why
    result, why = children.run_child(["-c", f"print({children.RESULT_MARK!r} + '{{\"ok\": true}}')\n"], 30)
    assert result == {"ok": True} and why == ""


@pytest.mark.skipif(not HAS_PADDLE, reason="needs paddle")
def test_paddle_probe_script_runs_on_cpu() -> None:
    """The GPU probe's script, run on the CPU: it goes through graphjit and reports in JSON."""
    result, why = children.run_child(["-m", paddle_doctor.PADDLE_PROBE, "sot", "kernels", "cpu"], 120,
                                      {"MIN_GRAPH_SIZE": "0"})
    assert result is not None, why
    assert result["ok"], result
    assert result["worst"] == 0.0 and result["worst_numpy"] == 0.0 and result["elementwise_ok"] is True
    assert result["stats"]["calls"] == 4


@pytest.mark.skipif(not HAS_TORCH, reason="needs torch")
def test_ipc_probe_script_reports() -> None:
    result, why = children.run_child(["-m", peers.IPC_PROBE], 120)
    assert result is not None, why
    assert isinstance(result.get("ok"), bool)


# -- import and packaging ---------------------------------------------------------------------------
def test_import_graphjit_exposes_collectives_lazily() -> None:
    """``graphjit.collectives`` works after ``import graphjit`` but is imported on first use (numpy, ctypes: about
    50 ms that ``import graphjit`` does not pay); it imports no framework."""
    code = ("import sys, graphjit; before = 'graphjit.collectives' in sys.modules; c = graphjit.collectives; "
            "print(before, c is sys.modules['graphjit.collectives'], 'collectives' in graphjit.__all__, "
            "callable(c.init), sorted(m for m in ('torch', 'paddle') if m in sys.modules))")
    environ = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=environ,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "True", "True", "True", "[]"]
    with pytest.raises(AttributeError, match="no attribute 'no_such_thing'"):
        graphjit.no_such_thing  # noqa: B018


PROBES = (paddle_doctor.PADDLE_PROBE, peers.IPC_PROBE, allreduce.AR_PROBE)


def test_importing_the_doctor_imports_no_framework() -> None:
    """``graphjit.doctor``, the framework's doctor modules and the probe modules import neither torch nor paddle
    when imported (the checks and probes import them inside their functions); every probe module exists."""
    modules = ["graphjit.doctor", "graphjit.doctor.torch.rows", "graphjit.doctor.paddle.rows", *PROBES]
    code = (f"import importlib, sys; [importlib.import_module(m) for m in {modules!r}]; "
            "print(sorted(m for m in ('torch', 'paddle') if m in sys.modules))")
    environ = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=environ,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["[]"]
    assert all(m.startswith(("graphjit.doctor.torch.", "graphjit.doctor.paddle.")) for m in PROBES)


def _copy_source_tree(dest: Path) -> None:
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    for folder in ("graphjit", "csrc"):
        shutil.copytree(ROOT / folder, dest / folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


@pytest.mark.slow
def test_wheel_ships_every_module_and_csrc(tmp_path: Path) -> None:
    """The wheel holds every module of graphjit/ and the CUDA sources as graphjit/csrc, where an installed
    graphjit finds them (same cache key as the checkout); the sdist holds csrc/ (built in a copy of the tree)."""
    import tarfile
    import zipfile

    if importlib.util.find_spec("setuptools") is None:
        pytest.skip("setuptools is not installed (needed to build the wheel offline)")
    if importlib.util.find_spec("setuptools.command.bdist_wheel") is None and importlib.util.find_spec("wheel") is None:
        pytest.skip("neither setuptools >= 70.1 nor wheel is installed (needed to build the wheel offline)")
    src = tmp_path / "src"
    src.mkdir()
    _copy_source_tree(src)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                           str(tmp_path / "dist"), str(src)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    wheel = next((tmp_path / "dist").glob("graphjit-*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        site = tmp_path / "site"
        zf.extractall(site)
    sources = {p.relative_to(ROOT).as_posix() for p in (ROOT / "graphjit").rglob("*.py")
               if "__pycache__" not in p.parts}
    assert sources <= names, f"missing from the wheel (add the subpackage to pyproject.toml): {sources - names}"
    for name in ("graphjit_ar.cu", "custom_all_reduce.cuh", "batch_copy.cuh", "lane.c", "lane_checks.c",
                 "lane_guards.c", "lane.h"):
        assert f"graphjit/csrc/{name}" in names
        assert (site / "graphjit" / "csrc" / name).read_bytes() == (ROOT / "csrc" / name).read_bytes()

    code = ("from graphjit.collectives import csrc_build; print(csrc_build.csrc_dir()); "
            "print(csrc_build.library_path('sm_90').name)")
    environ = dict(os.environ, PYTHONPATH=str(site), GRAPHJIT_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=environ,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    from graphjit.collectives import csrc_build

    folder, name = proc.stdout.split()
    assert Path(folder) == site / "graphjit" / "csrc"
    assert name == csrc_build.library_path("sm_90", cache=tmp_path / "cache").name  # a checkout's build is reused

    proc = subprocess.run([sys.executable, "-c", "from setuptools import build_meta as b; print(b.build_sdist('sd'))"],
                          capture_output=True, text=True, timeout=300, cwd=src)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with tarfile.open(src / "sd" / proc.stdout.split()[-1]) as tf:
        members = {m.split("/", 1)[1] for m in tf.getnames() if "/" in m}
    assert {"csrc/graphjit_ar.cu", "csrc/custom_all_reduce.cuh", "graphjit/collectives/csrc_build.py"} <= members
