"""``python -m graphjit bench capture`` on the CPU: refuses without a GPU, a smoke run with --allow-cpu, and its
graphjit variant captured for real through the CPU stand-in for CUDA graphs (tests/graph_emulator.py)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from graphjit.__main__ import main
from graphjit.bench import REGISTRY

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.torch,
              pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU paths are for machines without a GPU")]


def test_the_default_sizes_are_vllms_51():
    sizes = REGISTRY["capture"].load().VLLM_SIZES
    assert len(sizes) == 51 and sizes[:4] == [1, 2, 4, 8] and sizes[-1] == 512 and sizes == sorted(set(sizes))


def test_without_gpu_refuses_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    assert main(["bench", "capture", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "needs a CUDA GPU" in err and "--allow-cpu" in err


def test_cpu_smoke_writes_json_and_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    rc = main(["bench", "capture", "--allow-cpu", "--out", str(tmp_path), "--tag", "ci"])
    out = capsys.readouterr().out
    assert rc == 0, out
    data = json.loads((tmp_path / "capture_torch_ci.json").read_text())
    assert data["complete"] is True and data["summary"]["ok"] is True, data["summary"]
    for variant in ("by_hand", "graphjit"):
        res = data["results"][variant]
        assert res["status"] == "ok" and res["equal_eager"] is True and res["seconds"] > 0, res
        assert len(res["gc"]["collections"]) == 3 and res["gc"]["total_s"] >= 0, res
    assert "time" in data["ratios"] and (tmp_path / "capture_torch_ci.png").exists()


def test_the_graphjit_variant_captures_every_size_once_and_replays_right(emu):
    from graphjit.bench.torch.capture import CaptureBench

    args = argparse.Namespace(sizes=[1, 2, 4, 8], layers=2, hidden=16, dtype="fp32", warmup=2, seed=0)
    res = CaptureBench(args, on_gpu=False).measure("graphjit")
    assert res["graphs"] == 4, res  # one graph per size, made inside the scope
    assert res["equal_eager"] is True and res["max_abs_diff"] == 0.0, res


def test_profile_writes_the_whole_profile_beside_the_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    import pstats

    rc = main(["bench", "capture", "--allow-cpu", "--profile", "--no-plot", "--out", str(tmp_path), "--tag", "ci"])
    assert rc == 0, capsys.readouterr().out
    data = json.loads((tmp_path / "capture_torch_ci.json").read_text())
    prof = data["profile"]
    assert prof["status"] == "ok" and prof["dump"] == "capture_torch_ci.pstats", prof
    stats = pstats.Stats(str(tmp_path / prof["dump"]))
    assert any(name == "step" for _file, _line, name in stats.stats), "the step's runs are in the profile"  # type: ignore[attr-defined]
