"""``python -m graphjit bench piecewise`` on the CPU: refuses without a GPU, smoke run with --allow-cpu
(every variant checked against eager; timings mean nothing there)."""

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
    variants = data["results"]["L2 B1"]["variants"]
    for v, res in variants.items():
        assert res["status"] == "ok" and res["equal_eager"] is True and res["max_rel_diff"] == 0.0, (v, res)
        assert res["us_per_step"] > 0 and res["first_pass_host_us_per_step"] > 0, (v, res)
        # warmup (4) + the warm pass and the timed repeats over the same steps (3 + 2 x 3) + the last check
        assert res.get("stats", {}).get("calls", 14) == 14, (v, res)
    assert variants["whole_fixed"]["reference"] == "eager, fixed-shape step"
    assert variants["whole_fixed"]["function_check"]["equal"] is True
    boundary = data["boundary"]
    assert boundary["status"] == "ok" and boundary["islands"] == 2 and boundary["layers"] == 3, boundary
    assert (tmp_path / "piecewise_decode_torch_ci.png").exists()
    assert "island boundary costs" in out


def _bench(**overrides: object):
    from graphjit.bench.torch.piecewise import PiecewiseBench

    args = argparse.Namespace(hidden=64, max_cache=32, seed=0, warmup=3, steps=2, repeats=1, attention="auto")
    for k, v in overrides.items():
        setattr(args, k, v)
    return PiecewiseBench(args, on_gpu=False)


@pytest.mark.parametrize("layers,batch", [(1, 1), (3, 4)])
def test_fixed_shape_step_computes_the_varlen_step(layers: int, batch: int):
    """whole_fixed's step (attention over the whole cache, masked) is the eager varlen step's function: the same
    outputs and the same caches afterwards (float32, to rounding: CPU attention over 32 entries and over fewer
    adds in another order)."""
    bench = _bench()
    varlen, varlen_caches = bench.model(layers, batch, fixed=False)
    fixed, fixed_caches = bench.model(layers, batch, fixed=True)
    metas = bench.metas(batch, 5)
    assert len({m["max_len"] for m in metas}) > 1  # max_len changes: the varlen step's shapes change
    with torch.no_grad():
        for x, meta in zip(bench.inputs(batch, 5), metas):
            torch.testing.assert_close(fixed(x, *bench.call_args(meta, True)), varlen(x, *bench.call_args(meta, False)),
                                       rtol=1e-5, atol=1e-6)
    for (vk, vv), (fk, fv) in zip(varlen_caches, fixed_caches):
        torch.testing.assert_close(fk, vk, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(fv, vv, rtol=1e-5, atol=1e-6)
    assert bench.function_check(layers, batch) <= 1e-5


def test_function_check_sees_a_different_function():
    """The check is not vacuous: a fixed-shape step that attends over the unmasked cache is told apart."""
    bench = _bench()
    varlen, _ = bench.model(2, 2, fixed=False)
    fixed, _ = bench.model(2, 2, fixed=True)
    with torch.no_grad():
        for x, meta in zip(bench.inputs(2, 3), bench.metas(2, 3)):
            pos, fixed_meta = bench.call_args(meta, True)
            unmasked = {**fixed_meta, "mask": torch.ones_like(meta["mask"])}
            want = varlen(x, *bench.call_args(meta, False))
            assert bench.rel_diff(fixed(x, pos, unmasked), want) > 1e-3
    assert bench.rel_diff(torch.zeros(3), torch.zeros(3)) == 0.0


def test_a_variant_that_differs_from_eager_is_a_problem():
    from graphjit.bench import piecewise

    ok = {"status": "ok", "equal_eager": True, "max_rel_diff": 0.0, "reference": "eager, varlen step"}
    data = {"results": {"L1 B1": {"layers": 1, "batch": 1, "ratios": {}, "variants": {
        "eager": ok,
        "piecewise": {**ok, "equal_eager": False, "max_rel_diff": 0.02},
        "whole_fixed": {**ok, "reference": "eager, fixed-shape step",
                        "function_check": {"dtype": "float32", "equal": False, "max_rel_diff": 0.1, "tolerance": 1e-5}},
    }}}, "boundary": {"status": "error", "error": "1 captured segment(s) empty"}}
    problems = piecewise._summary(data, on_gpu=False)["problems"]
    assert len(problems) == 3, problems
    assert "L1 B1/piecewise: outputs differ from eager, varlen step (0.02)" in problems
    assert any(p.startswith("L1 B1/whole_fixed: the fixed-shape step differs from the varlen step") for p in problems)
    assert any("empty" in p for p in problems)
