"""``python -m graphjit bench hf`` on the CPU: refuses without a GPU, smoke run with --allow-cpu."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graphjit.__main__ import main
from graphjit.bench import REGISTRY

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

pytestmark = [pytest.mark.torch,
              pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU paths are for machines without a GPU")]


def test_registered():
    module = REGISTRY["hf"].load()
    assert callable(module.add_arguments) and callable(module.run)


def test_without_gpu_refuses_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    assert main(["bench", "hf", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "needs a CUDA GPU" in err and "--allow-cpu" in err
    assert not list(tmp_path.iterdir())


def test_bad_arguments(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    assert main(["bench", "hf", "--allow-cpu", "--variants", "eager,turbo", "--out", str(tmp_path)]) == 2
    assert "turbo" in capsys.readouterr().err
    assert main(["bench", "hf", "--allow-cpu", "--warmup", "2", "--out", str(tmp_path)]) == 2
    assert "--warmup 2" in capsys.readouterr().err


def test_cpu_smoke_checks_tokens_and_writes_json_and_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    rc = main(["bench", "hf", "--allow-cpu", "--variants", "eager,cuda_graph,graphed", "--dtype", "fp32",
               "--out", str(tmp_path), "--tag", "ci"])
    out = capsys.readouterr().out
    assert rc == 0, out
    data = json.loads((tmp_path / "hf_llama_torch_ci.json").read_text())
    assert data["benchmark"] == "hf" and data["smoke"] is True and data["complete"] is True
    assert data["summary"]["ok"] is True, data["summary"]
    r = data["results"]["L2 B1"]["variants"]
    assert r["cuda_graph"]["status"] == "skipped"
    for v in ("eager", "graphed"):
        assert r[v]["status"] == "ok" and r[v]["us_per_step"] > 0 and r[v]["tokens_equal_eager"] is True, r[v]
    assert r["graphed"]["max_logit_rel_diff"] < 1e-5  # no CUDA: the graphed step ran eagerly
    assert any(k.startswith("no CUDA graphs") for k in r["graphed"]["stats"]["fallbacks"])
    assert (tmp_path / "hf_llama_torch_ci.png").read_bytes()[:4] == b"\x89PNG"
