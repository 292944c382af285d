"""``python -m graphjit bench allreduce`` on the CPU: the refusal without 2 GPUs, the --allow-cpu smoke run
(2 gloo processes), the supervision's timeout, and the pure parts (sizes, crossovers, targets, fallbacks)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from graphjit.__main__ import main
from graphjit.bench import REGISTRY
from graphjit.bench import allreduce as ar
from graphjit.bench import allreduce_results as res

ROOT = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _gpus() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


below_two_gpus = pytest.mark.skipif(_gpus() >= 2, reason="this machine has 2 CUDA GPUs: the benchmark would run")


def _run_module(*args: str, timeout: float = 60, extra_env: dict[str, str] | None = None
                ) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("GRAPHJIT_")}
    environ["PYTHONPATH"] = str(ROOT) + os.pathsep + environ.get("PYTHONPATH", "")
    environ.update(extra_env or {})
    return subprocess.run([sys.executable, "-m", "graphjit", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=environ)


# -- the command ------------------------------------------------------------------------------------
def test_registered() -> None:
    assert REGISTRY["allreduce"].module == "graphjit.bench.allreduce"
    module = REGISTRY["allreduce"].load()
    assert callable(module.add_arguments) and callable(module.run)


@pytest.mark.torch
@below_two_gpus
def test_without_two_gpus_refuses_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "allreduce", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "needs 2 GPUs on one node" in err and "--allow-cpu" in err
    assert not list(tmp_path.iterdir())
    proc = _run_module("bench", "allreduce", "--out", str(tmp_path), timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [err]
    assert not list(tmp_path.iterdir())


@pytest.mark.torch
def test_bad_arguments(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "allreduce", "--allow-cpu", "--variants", "nccl_eager,bogus", "--out", str(tmp_path)]) == 2
    assert "bogus" in capsys.readouterr().err
    assert main(["bench", "allreduce", "--allow-cpu", "--dtype", "fp32", "--sizes", "4096,4098",
                 "--out", str(tmp_path)]) == 2
    assert "4098" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:  # argparse: the argument and the range it takes
        main(["bench", "allreduce", "--allow-cpu", "--ar-max-blocks", "65", "--out", str(tmp_path)])
    assert info.value.code == 2 and "--ar-max-blocks: expected an integer from 1 to 64" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


@pytest.mark.torch
@below_two_gpus
def test_allow_cpu_smoke_writes_json_and_png(tmp_path: Path) -> None:
    # Multicast must stay off in the workers whatever the caller's environment says.
    proc = _run_module("bench", "allreduce", "--allow-cpu", "--sizes", "4K,16K", "--iters", "3", "--repeats", "2",
                       "--ar-max-blocks", "8", "--out", str(tmp_path), "--tag", "ci box",
                       extra_env={"NCCL_NVLS_ENABLE": "1", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "0",
                                  "GRAPHJIT_AR_ALGO": "nccl", "MASTER_PORT": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    path = tmp_path / "allreduce_ci-box.json"
    data = json.loads(path.read_text())
    assert data["benchmark"] == "allreduce" and data["schema"] == 1 and data["tag"] == "ci-box"
    assert data["device"] == "cpu" and data["smoke"] is True and data["complete"] is True
    assert data["world_size"] == 2
    cfg = data["config"]
    assert cfg["sizes"] == [4096, 16384] and cfg["dtype"] == "bf16" and cfg["backend"] == "gloo"
    assert cfg["iters"] == 3 and cfg["repeats"] == 2 and cfg["variants"] == list(ar.VARIANTS)
    assert cfg["ar_max_blocks"] == 8
    assert "one CUDA graph" in cfg["graph_timing"] and cfg["rendezvous"] == "file"
    worker_env = data["env"]["worker_env"]
    assert worker_env["NCCL_NVLS_ENABLE"] == "0" and worker_env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
    assert "GRAPHJIT_AR_ALGO" not in worker_env and data["env"]["torch"]["version"]
    assert data["collectives"]["report"]["enabled"] is False
    assert data["symm_mem"]["available"] is False
    assert [r["bytes"] for r in data["results"]] == [4096, 16384]
    for r in data["results"]:
        v = r["variants"]
        assert set(v) == set(ar.VARIANTS)
        nccl = v["nccl_eager"]
        assert nccl["status"] == "ok" and nccl["backend"] == "gloo", nccl
        assert nccl["us_per_call"] > 0 and len(nccl["samples_us"]) == 2 and len(nccl["rank_us"]) == 2
        assert nccl["us_per_call"] == max(nccl["rank_us"])
        assert nccl["check"]["correct"] is True and nccl["check"]["max_abs_diff"] == 0.0
        for name in ar.VARIANTS:
            if name != "nccl_eager":
                assert v[name]["status"] == "skipped" and v[name]["reason"], (name, v[name])
        assert "custom all-reduce needs 2 CUDA GPUs" in v["custom_auto_graph"]["reason"]
        assert "CUDA graphs need a GPU" in v["nccl_graph"]["reason"]
    for key in ("ratios", "crossovers", "targets", "tuning"):
        assert key in data, key
    assert set(data["crossovers"]) == {"graph", "eager"}
    assert data["targets"]["auto_never_slower_than_nccl"]["graph"]["ok"] is None
    assert data["summary"] == {"ok": True, "problems": [], "notes": []}
    assert data["plot"] == "allreduce_ci-box.png"
    assert (tmp_path / data["plot"]).read_bytes()[:8] == PNG_MAGIC
    out = proc.stdout
    assert "auto/nccl graph" in out and "targets, custom auto in a graph" in out and "wrote" in out


@pytest.mark.torch
@below_two_gpus
def test_timeout_stops_the_workers_and_says_so(tmp_path: Path) -> None:
    target = tmp_path / "t.json"
    proc = _run_module("bench", "allreduce", "--allow-cpu", "--timeout", "0.3", "--no-plot", "--out", str(target),
                       extra_env={"TMPDIR": str(tmp_path)})  # the workers' logs are kept after a failure
    assert proc.returncode == 1
    assert "did not finish in 0.3 s" in proc.stdout
    kept = list(tmp_path.glob("graphjit-bench-ar-*"))
    assert len(kept) == 1 and f"logs stay in {kept[0]}" in proc.stdout
    data = json.loads(target.read_text())
    assert data["complete"] is False and "did not finish" in data["error"]
    assert [w["rank"] for w in data["workers"]] == [0, 1]


def test_one_failed_worker_gets_the_other_stopped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1 fails at once, rank 0 hangs: rank 0 is killed after the grace period, and the JSON names rank 1."""
    fake = tmp_path / "fake-python"
    fake.write_text("#!/bin/sh\n"  # argv: -m graphjit.bench.torch.allreduce --worker CONFIG RANK
                    'if [ "$5" = "1" ]; then echo "rank 1 exploded" >&2; exit 3; fi\nexec sleep 60\n')
    fake.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(fake))
    monkeypatch.setattr(ar, "GRACE_S", 0.5)
    codes, why = ar.supervise_workers(tmp_path, timeout=30, world=2)
    assert codes == [None, 3] and why is not None and "rank 1 ended (exit status 3)" in why
    (tmp_path / "rank1.status.json").write_text(json.dumps({"rank": 1, "stage": "size 4 KiB", "error": "boom",
                                                             "failed_at": 1.0}))
    cfg = {"tmp": str(tmp_path), "json_path": str(tmp_path / "r.json"), "data": {"benchmark": "allreduce"}}
    assert ar.report_workers(cfg, codes, why) == 1
    data = json.loads((tmp_path / "r.json").read_text())
    assert "rank 1 failed in size 4 KiB: boom" in data["error"] and data["workers"][1]["exit_status"] == 3


# -- the pure parts ---------------------------------------------------------------------------------
def test_size_list_and_labels() -> None:
    assert ar.size_list("4K,1M,64MiB,4096,2kb") == [2048, 4096, 1 << 20, 64 << 20]
    for bad in ("", "4X", "-4", "0"):
        with pytest.raises(argparse.ArgumentTypeError):
            ar.size_list(bad)
    assert [ar.size_label(b) for b in (48, 4096, 1 << 20, 3 << 19)] == ["48 B", "4 KiB", "1 MiB", "1536 KiB"]
    assert ar.GPU_DEFAULTS["sizes"][0] == 4096 and ar.GPU_DEFAULTS["sizes"][-1] == 64 << 20
    assert len(ar.GPU_DEFAULTS["sizes"]) == 15


def test_child_environment_forces_multicast_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    monkeypatch.setenv("TORCH_SYMM_MEM_DISABLE_MULTICAST", "0")
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    monkeypatch.setenv("GRAPHJIT_AR_ALGO", "2shot")
    environ = ar.child_environment()
    assert environ["NCCL_NVLS_ENABLE"] == "0" and environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
    assert "MASTER_ADDR" not in environ and "GRAPHJIT_AR_ALGO" not in environ
    assert str(ROOT) in environ["PYTHONPATH"].split(os.pathsep)


def _synthetic() -> dict[str, Any]:
    """Timings shaped like the H200 anchors: custom wins small, 2shot overtakes 1shot at 1 MiB, NCCL wins from
    8 MiB in a graph."""
    sizes = [4096 << k for k in range(15)]

    def us(base: float, gbps: float, s: int) -> float:
        return base + s / gbps / 1e3

    results = []
    for s in sizes:
        v = {"nccl_eager": us(25, 100, s), "nccl_graph": us(19, 260, s), "custom_1shot_eager": us(12, 150, s),
             "custom_2shot_eager": us(14, 250, s), "custom_1shot_graph": us(4, 150, s),
             "custom_2shot_graph": us(6, 250, s), "symm_two_shot_eager": us(9, 240, s)}
        v["custom_auto_eager"] = v["custom_1shot_eager"]
        v["custom_auto_graph"] = v["custom_1shot_graph"]
        variants: dict[str, Any] = {k: {"status": "ok", "us_per_call": t} for k, t in v.items()}
        variants["symm_two_shot_graph"] = {"status": "skipped", "reason": "not here"}
        results.append({"bytes": s, "auto_algo": "1shot", "variants": variants})
    return {"device": "cuda", "tag": "synthetic", "config": {"variants": list(ar.VARIANTS)}, "results": results}


def test_finalize_crossovers_targets_and_ratios(tmp_path: Path) -> None:
    data = res.finalize(_synthetic())
    g = data["crossovers"]["graph"]
    assert g["2shot_vs_1shot"]["from_bytes"] == 1 << 20 and g["2shot_vs_1shot"]["changes"] == 1
    assert g["nccl_vs_custom_auto"]["from_bytes"] == 8 << 20
    assert g["nccl_vs_best_custom"]["from_bytes"] is None  # 2shot stays ahead of NCCL
    assert data["crossovers"]["eager"]["nccl_vs_custom_auto"]["from_bytes"] is None
    assert data["tuning"]["two_shot_from_bytes"] == 1 << 20 and data["tuning"]["nccl_from_bytes"] is None
    lat = {t["target"]: t for t in data["targets"]["custom_auto_graph_latency"]}
    assert lat["<= 6 us up to 256 KiB"]["ok"] is True and len(lat["<= 6 us up to 256 KiB"]["sizes"]) == 7
    assert lat["<= 10 us at 1 MiB"]["ok"] is False and lat["<= 20 us at 4 MiB"]["ok"] is False
    slower = data["targets"]["auto_never_slower_than_nccl"]
    assert slower["graph"]["ok"] is False and slower["graph"]["slower_at"] == [8 << 20, 16 << 20, 32 << 20, 64 << 20]
    assert slower["eager"]["ok"] is True
    ratio = data["ratios"]["custom_auto_graph/nccl_graph"]
    assert ratio["4096"] == pytest.approx(res.us_of(data["results"][0], "custom_auto_graph") /
                                          res.us_of(data["results"][0], "nccl_graph"))
    assert data["summary"]["ok"] is True  # the symmetric-memory reference may be skipped
    text = res.table(data)
    assert "MISS" in text and "1 MiB" in text
    lines = "\n".join(res.report_lines(data))
    assert "custom_2shot faster than custom_1shot: from 1 MiB" in lines
    assert "nccl faster than custom_auto: from 8 MiB" in lines and "slower at 8 MiB" in lines
    assert "auto picks: 1shot at 4 KiB..64 MiB" in lines
    assert res.plot(data, tmp_path / "p.png") is None
    assert (tmp_path / "p.png").read_bytes()[:8] == PNG_MAGIC


def test_fallbacks_are_not_timings_and_are_problems() -> None:
    before = {"custom": {"eager": 5, "captured": 2}, "fallbacks": {"scope": 1}, "reasons": {"scope": "x"}}
    after = {"custom": {"eager": 5, "captured": 2}, "fallbacks": {"scope": 1, "bytes > max": 3},
             "reasons": {"scope": "x", "bytes > max": "67108864 bytes > max_bytes=8388608"}}
    d = res.custom_delta(before, after, expect="eager")
    assert d["status"] == "fallback" and d["fallback_reasons"] == {"bytes > max": "67108864 bytes > max_bytes=8388608"}
    assert d["fallback_calls"] == {"bytes > max": 3}
    nothing = res.custom_delta(before, before, expect="captured")
    assert nothing["status"] == "fallback" and "not run" in nothing["fallback_reasons"]
    ran = res.custom_delta(before, {**before, "custom": {"eager": 6, "captured": 2}}, expect="eager")
    assert "status" not in ran and ran["custom_calls"] == {"eager": 1, "captured": 0}

    ok = {"status": "ok", "samples_us": [5.0, 6.0], "median_us": 5.5, "host_us_per_call": 9.0}
    t = res.combine_timings([ok, {**ok, "median_us": 6.5}])
    assert t["status"] == "ok" and t["us_per_call"] == 6.5 and t["rank_us"] == [5.5, 6.5]
    t = res.combine_timings([ok, {"status": "fallback", "fallback_reasons": {"VMM memory": "y"}}])
    assert t["status"] == "fallback" and "us_per_call" not in t and t["fallback_reasons"] == {"VMM memory": "y"}
    c = res.combine_checks([{"status": "ok", "check": {"max_abs_diff": 0.0, "tol": 1.0, "correct": True,
                                                       "against": "NCCL"}},
                            {"status": "error", "error": "RuntimeError: boom", "traceback": "tb"}])
    assert c["status"] == "error" and c["errors"] == {"1": "RuntimeError: boom"} and c["check"]["correct"] is False

    data = _synthetic()
    data["results"][3]["variants"]["custom_2shot_graph"] = {"status": "fallback",
                                                            "fallback_reasons": {"VMM memory": "y"}}
    data["results"][4]["variants"]["custom_1shot_eager"]["check"] = {"correct": False, "max_abs_diff": 2.0,
                                                                     "tol": 0.1, "against": "NCCL"}
    problems = res.finalize(data)["summary"]["problems"]
    assert len(problems) == 2 and "fell back" in problems[0] and "differs from NCCL" in problems[1]
    assert "fb" in res.table(data)


def test_auto_handing_big_eager_calls_to_nccl_is_by_design_and_never_slower() -> None:
    data = _synthetic()
    for r in data["results"][-2:]:  # 32 and 64 MiB: auto's eager calls went to NCCL (the measured crossover)
        r["variants"]["custom_auto_eager"] = {"status": "fallback", "fallback_reasons": {"crossover": "x"}}
        r["variants"]["nccl_eager"]["us_per_call"] = 1.0  # would make auto slower, were auto timed there
    done = res.finalize(data)
    eager = done["targets"]["auto_never_slower_than_nccl"]["eager"]
    assert eager["ok"] is True and eager["not_measured"] == [] and eager["framework_by_design"] == [32 << 20, 64 << 20]
    assert done["summary"]["ok"] is True, done["summary"]
    data["results"][-1]["variants"]["custom_auto_eager"]["fallback_reasons"] = {"crossover": "x", "VMM memory": "y"}
    problems = res.finalize(data)["summary"]["problems"]
    assert len(problems) == 1 and "64 MiB custom_auto_eager: fell back" in problems[0]


def test_four_workers_one_fails_the_others_are_stopped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "fake-python"
    fake.write_text("#!/bin/sh\n"
                    'if [ "$5" = "3" ]; then exit 4; fi\nexec sleep 60\n')
    fake.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(fake))
    monkeypatch.setattr(ar, "GRACE_S", 0.5)
    codes, why = ar.supervise_workers(tmp_path, timeout=30, world=4)
    assert codes == [None, None, None, 4] and why is not None and "rank 3 ended (exit status 4)" in why


def test_shared_gpu_smoke_skips_are_not_problems_and_the_report_says_timings_mean_nothing() -> None:
    entry = {"bytes": 4096, "size": "4 KiB", "variants": {
        "nccl_eager": {"status": "ok", "us_per_call": 700.0, "check": {"correct": True}},
        "nccl_graph": {"status": "skipped", "reason": "shared-GPU smoke run: the framework's all-reduce is gloo there"},
        "custom_auto_graph": {"status": "skipped", "reason": "collectives.init raised: boom"}}}
    data = {"device": "cuda", "shared_gpu": True, "config": {"variants": list(entry["variants"])}, "results": [entry]}
    summary = res.summary(data)
    assert summary["problems"] == ["4 KiB custom_auto_graph: skipped: collectives.init raised: boom"]
    data["targets"] = {}
    assert any("shared-GPU smoke run" in line and "mean nothing" in line for line in res.report_lines(data))
