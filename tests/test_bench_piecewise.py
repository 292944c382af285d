"""``python -m graphjit bench piecewise`` on the CPU: refuses without a GPU, smoke run with --allow-cpu
(every variant checked against eager; timings mean nothing there)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graphjit.__main__ import main
from graphjit.bench import REGISTRY

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.torch,
              pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU paths are for machines without a GPU")]


def test_registered():
    module = REGISTRY["piecewise"].load()
    assert callable(module.add_arguments) and callable(module.run)


def test_without_gpu_refuses_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    assert main(["bench", "piecewise", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "needs a CUDA GPU" in err
    assert main(["bench", "piecewise", "--allow-cpu", "--warmup", "2", "--out", str(tmp_path)]) == 2
    assert "--warmup 2" in capsys.readouterr().err


def test_cpu_smoke_checks_every_variant_and_writes_json_and_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    rc = main(["bench", "piecewise", "--allow-cpu", "--out", str(tmp_path), "--tag", "ci"])
    out = capsys.readouterr().out
    assert rc == 0, out
    data = json.loads((tmp_path / "piecewise_decode_torch_ci.json").read_text())
    assert data["benchmark"] == "piecewise" and data["smoke"] is True and data["complete"] is True
    assert data["summary"]["ok"] is True, data["summary"]
    for v, res in data["results"]["L2 B1"]["variants"].items():
        assert res["status"] == "ok" and res["equal_eager"] is True and res["us_per_step"] > 0, (v, res)
    assert data["boundary"]["status"] == "ok" and data["boundary"]["islands"] == 2
    assert (tmp_path / "piecewise_decode_torch_ci.png").exists()
    assert "island boundary costs" in out
