"""``python -m graphjit bench train`` on the CPU: refuses without a GPU, smoke run with --allow-cpu."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graphjit.__main__ import main
from graphjit.bench import REGISTRY

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.torch,
              pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU paths are for machines without a GPU")]

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_registered():
    assert "train" in REGISTRY
    module = REGISTRY["train"].load()
    assert callable(module.add_arguments) and callable(module.run)


def test_without_gpu_refuses_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    assert main(["bench", "train", "--out", str(tmp_path)]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "needs a CUDA GPU" in err and "--allow-cpu" in err
    assert not list(tmp_path.iterdir())


def test_bad_arguments(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    assert main(["bench", "train", "--allow-cpu", "--models", "mlp,rnn", "--out", str(tmp_path)]) == 2
    assert "rnn" in capsys.readouterr().err
    assert main(["bench", "train", "--allow-cpu", "--warmup", "2", "--out", str(tmp_path)]) == 2
    assert "--warmup 2" in capsys.readouterr().err


def test_cpu_smoke_writes_json_and_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    rc = main(["bench", "train", "--allow-cpu", "--hidden", "8", "--layers", "1", "--seq", "4", "--batch", "2",
               "--steps", "2", "--repeats", "1", "--check-steps", "5", "--out", str(tmp_path), "--tag", "ci"])
    out = capsys.readouterr().out
    assert rc == 0, out
    path = tmp_path / "train_torch_ci.json"
    data = json.loads(path.read_text())
    assert data["benchmark"] == "train" and data["device"] == "cpu" and data["smoke"] is True
    assert data["complete"] is True and data["summary"] == {"ok": True, "problems": []}
    assert data["config"]["models"] == ["mlp", "block"] and data["config"]["hidden"] == 8
    for kind in ("mlp", "block"):
        r = data["results"][kind]
        check = r["check"]
        # no CUDA: graphed_layer runs the model eagerly, so it matches eager exactly
        assert check["correct"] is True and check["max_loss_rel_diff"] == 0.0 and check["steps"] == 5
        for variant in ("eager", "graphed", "graphed_alias"):
            v = r["variants"][variant]
            assert v["status"] == "ok" and v["us_per_step"] > 0 and len(v["samples_us"]) == 1, (kind, variant, v)
        g = r["variants"]["graphed"]
        assert g["captured"] is False and any(k.startswith("no CUDA graphs") for k in g["stats"]["fallbacks"])
        assert set(r["speedup_vs_eager"]) == {"graphed", "graphed_alias"}
    assert data["plot"] == "train_torch_ci.png"
    assert (tmp_path / "train_torch_ci.png").read_bytes()[:8] == PNG_MAGIC
    assert "speedup" in out and "wrote" in out


def test_cpu_smoke_of_the_whole_step_mode(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """--mode step: the whole step (zero_grad, forward, backward, clipping, AdamW, LambdaLR) in one function, eager
    against @graphed (no CUDA here: it runs uncaptured, equal to eager) and reduce-overhead (skipped without CUDA)."""
    rc = main(["bench", "train", "--mode", "step", "--allow-cpu", "--hidden", "8", "--layers", "1", "--seq", "4",
               "--batch", "2", "--steps", "2", "--repeats", "1", "--check-steps", "5", "--out", str(tmp_path),
               "--tag", "ci", "--no-plot"])
    out = capsys.readouterr().out
    assert rc == 0, out
    data = json.loads((tmp_path / "train_step_torch_ci.json").read_text())
    assert data["config"]["mode"] == "step" and data["config"]["variants"] == ["eager", "graphed", "compiled"]
    assert "AdamW" in data["config"]["step"] and data["summary"]["ok"] is True
    for kind in ("mlp", "block"):
        r = data["results"][kind]
        assert r["check"]["correct"] is True and r["check"]["max_loss_rel_diff"] == 0.0
        assert r["variants"]["graphed"]["status"] == "ok" and r["variants"]["compiled"]["status"] == "skipped"
    assert "graphed/compiled" in out
