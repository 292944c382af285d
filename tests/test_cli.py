"""The command line: ``python -m graphjit env`` and ``bench {dispatch,decode}`` (CPU, fast)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from graphjit import env
from graphjit.__main__ import main
from graphjit.bench import REGISTRY, common, register

HAS_TORCH = importlib.util.find_spec("torch") is not None
HAS_PADDLE = importlib.util.find_spec("paddle") is not None


def torch_cuda() -> bool:
    if not HAS_TORCH:
        return False
    import torch

    return bool(torch.cuda.is_available())


ROOT = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _run_module(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("GRAPHJIT_")}
    environ["PYTHONPATH"] = str(ROOT) + os.pathsep + environ.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", "graphjit", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=environ)


def _load(path: Path) -> dict:
    assert path.is_file(), f"{path} was not written"
    return json.loads(path.read_text())


def _is_png(path: Path) -> bool:
    return path.is_file() and path.read_bytes()[:8] == PNG_MAGIC


# -- env and the parser --------------------------------------------------------------------------
def test_env_lists_every_variable(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["env"]) == 0
    out = capsys.readouterr().out
    assert out.strip() == env.table_markdown()
    for v in env.VARIABLES:
        assert f"`{v.name}`" in out


def test_python_dash_m_graphjit_env() -> None:
    proc = _run_module("env", timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert "GRAPHJIT_DISABLE" in proc.stdout and "GRAPHJIT_STRICT" in proc.stdout


def test_no_command_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "bench" in capsys.readouterr().out


def test_bench_needs_a_name(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["bench"])
    assert exc.value.code == 2
    assert "decode" in capsys.readouterr().err


def test_registry_modules_have_the_protocol() -> None:
    assert {"decode", "dispatch"} <= set(REGISTRY)
    for bench in REGISTRY.values():
        module = bench.load()
        assert callable(module.add_arguments) and callable(module.run), bench.module
    with pytest.raises(ValueError, match="already registered"):
        register("dispatch", "graphjit.bench.dispatch", "twice")


def test_common_helpers(tmp_path: Path) -> None:
    assert common.sanitize_tag("my host/01 (gpu)") == "my-host-01-gpu"
    assert common.sanitize_tag("") == "unknown"
    assert common.int_list("8,32") == [8, 32]
    for bad in ("8,x", "0", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            common.int_list(bad)
    j, p = common.output_paths(str(tmp_path / "sub"), "x.json")
    assert j == tmp_path / "sub" / "x.json" and p == tmp_path / "sub" / "x.png" and j.parent.is_dir()
    j, p = common.output_paths(str(tmp_path / "named.json"), "ignored.json")
    assert j == tmp_path / "named.json" and p == tmp_path / "named.png"
    commit = common.git_commit()
    assert commit is None or (len(commit) == 7 and all(c in "0123456789abcdef" for c in commit))
    assert common.clean({"a": float("nan"), "b": (1, 2.5)}) == {"a": "nan", "b": [1, 2.5]}


# -- bench dispatch ------------------------------------------------------------------------------
@pytest.mark.skipif(not (HAS_TORCH or HAS_PADDLE), reason="needs torch or paddle")
def test_dispatch_writes_json_and_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["bench", "dispatch", "--iters", "200", "--repeats", "3", "--out", str(tmp_path), "--tag", "ci box"])
    out = capsys.readouterr().out
    assert rc == 0, out
    files = sorted(tmp_path.glob("dispatch_ci-box_*.json"))
    assert len(files) == 1, list(tmp_path.iterdir())
    data = _load(files[0])
    assert data["benchmark"] == "dispatch" and data["tag"] == "ci-box" and data["schema"] == 1
    assert data["config"]["iters"] == 200 and data["config"]["repeats"] == 3 and data["config"]["n_tensors"] == 4
    e = data["env"]
    for key in ("python", "cpu_count", "git_commit", "packages", "platform"):
        assert key in e
    assert e["python"] == ".".join(str(v) for v in sys.version_info[:3])
    ok = {fw: r for fw, r in data["results"].items() if r["status"] == "ok"}
    assert set(ok) == {fw for fw, present in (("torch", HAS_TORCH), ("paddle", HAS_PADDLE)) if present}
    for fw, r in ok.items():
        assert fw in e and e[fw]["version"]
        us = r["us"]
        assert 0 < us["direct"] < us["graphed"], (fw, us)
        assert 0 < us["sign"]
        assert len(r["samples_us"]["graphed"]) == 3
        assert r["ratio"]["graphed_vs_direct"] == pytest.approx(us["graphed"] / us["direct"])
        assert r["overhead_us"] == pytest.approx(us["graphed"] - us["direct"])
        assert r["graphed_path"].startswith("fallback: no CUDA graphs") or r["graphed_path"] == "replay"
        assert r["stats"]["calls"] > 600
    assert data["plot"] == files[0].with_suffix(".png").name
    assert _is_png(files[0].with_suffix(".png"))
    assert "graphed/direct" in out


@pytest.mark.torch
def test_dispatch_out_json_path_and_hard_exit(tmp_path: Path) -> None:
    target = tmp_path / "d.json"
    proc = _run_module("bench", "dispatch", "--backend", "torch", "--iters", "20", "--repeats", "1",
                       "--no-plot", "--out", str(target), "--hard-exit")
    assert proc.returncode == 0, proc.stderr
    data = _load(target)
    assert list(data["results"]) == ["torch"] and data["results"]["torch"]["status"] == "ok"
    assert data["plot"] is None and not target.with_suffix(".png").exists()


# -- bench decode --------------------------------------------------------------------------------
@pytest.mark.torch
@pytest.mark.skipif(torch_cuda(), reason="this machine has a CUDA GPU")
def test_decode_without_gpu_refuses(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "decode", "--out", str(tmp_path)]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "needs a CUDA GPU" in err and "--allow-cpu" in err
    assert not list(tmp_path.iterdir())


@pytest.mark.torch
def test_decode_unknown_variant(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "decode", "--allow-cpu", "--variants", "eager,bogus", "--out", str(tmp_path)]) == 2
    assert "bogus" in capsys.readouterr().err


@pytest.mark.torch
@pytest.mark.skipif(torch_cuda(), reason="the CPU smoke run is for machines without a GPU")
def test_decode_cpu_smoke_torch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["bench", "decode", "--allow-cpu", "--backend", "torch", "--layers", "2", "--hidden", "32",
               "--batch", "1,3", "--iters", "2", "--repeats", "2", "--host-iters", "5", "--out", str(tmp_path),
               "--tag", "ci"])
    out = capsys.readouterr().out
    assert rc == 0, out
    path = tmp_path / "decode_torch_ci.json"
    data = _load(path)
    assert data["benchmark"] == "decode" and data["backend"] == "torch" and data["device"] == "cpu"
    assert data["smoke"] is True and data["complete"] is True and data["numerics_unverified"] is False
    assert data["config"]["dtype"] == "bf16" and data["config"]["layers"] == [2]
    assert data["summary"]["ok"] is True, data["summary"]
    assert [c["label"] for c in data["configs"]] == ["L2 H32 B1", "L2 H32 B3"]
    for cfg in data["configs"]:
        v = cfg["variants"]
        assert v["raw_graph"] == {"status": "skipped", "reason": "needs a CUDA GPU"}
        for name in ("eager", "graphed", "graphed_alias"):
            r = v[name]
            assert r["status"] == "ok", (name, r)
            assert r["us_per_step"] > 0 and len(r["samples_us"]) == 2
            # On CPU graphjit runs the traced function: bit-identical to eager.
            assert r["rel_error"] == 0.0 and r["max_rel_error"] == 0.0 and r["correct"] is True
        assert v["graphed"]["captured"] is False
        assert any("no CUDA graphs" in reason for reason in v["graphed"]["fallback_reasons"])
        skipped = {"compile_reduce_overhead", "graphed_compile", "graphed_compile_alias"}
        assert set(data["config"]["skipped_variants"]) == skipped
    host = data["host_cost"]
    assert host["n_inputs"] == 4 and {"eager", "graphed", "part_sign"} <= set(host["us"])
    assert "raw_replay" not in host["us"] and not host["errors"]
    assert _is_png(tmp_path / "decode_torch_ci.png")
    assert "L2 H32 B3" in out and "wrote" in out


@pytest.mark.torch
@pytest.mark.skipif(torch_cuda(), reason="the CPU smoke run is for machines without a GPU")
def test_decode_host_only_measures_no_steps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--host-only: the host-cost part alone (for a framework whose step kernels cannot run on the GPU)."""
    rc = main(["bench", "decode", "--allow-cpu", "--host-only", "--host-iters", "5", "--no-plot",
               "--out", str(tmp_path), "--tag", "ci"])
    assert rc == 0, capsys.readouterr().out
    data = _load(tmp_path / "decode_torch_ci.json")
    assert data["configs"] == [] and data["complete"] is True
    assert {"eager", "graphed", "part_sign"} <= set(data["host_cost"]["us"])


@pytest.mark.paddle
def test_decode_cpu_smoke_paddle(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import paddle

    if paddle.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0:
        pytest.skip("the CPU smoke run is for machines without a GPU")
    rc = main(["bench", "decode", "--allow-cpu", "--backend", "paddle", "--variants", "eager,raw_graph,graphed",
               "--layers", "2", "--hidden", "16", "--batch", "2", "--iters", "2", "--repeats", "1",
               "--host-iters", "5", "--no-plot", "--out", str(tmp_path), "--tag", "ci"])
    assert rc == 0, capsys.readouterr().out
    data = _load(tmp_path / "decode_paddle_ci.json")
    assert data["config"]["dtype"] == "fp32" and data["numerics_unverified"] is False
    v = data["configs"][0]["variants"]
    assert v["raw_graph"]["status"] == "skipped"
    assert v["graphed"]["status"] == "ok" and v["graphed"]["rel_error"] == 0.0
    assert data["plot"] is None and not (tmp_path / "decode_paddle_ci.png").exists()


def test_the_command_line_imports_only_the_benchmark_it_runs() -> None:
    """Building the parser for ``bench dispatch`` imports that benchmark's module and no other one."""
    import subprocess
    import sys

    code = ("import sys; from graphjit.__main__ import build_parser; build_parser(['bench', 'dispatch']); "
            "print(sorted(m for m in sys.modules if m.startswith('graphjit.bench.') and m != 'graphjit.bench.common'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["['graphjit.bench.dispatch']"]


def test_a_benchmark_whose_framework_half_cannot_start_says_so_in_its_json(tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """``bench.common.start``: the error and its traceback go into the JSON, one line says so, None comes back; a
    half that starts is returned with the JSON's environment read again."""
    from graphjit.bench import common

    path = tmp_path / "x.json"
    data: dict = {"env": None}

    def broken() -> None:
        raise ImportError("no module named 'torch'")

    assert common.start("capture", data, path, broken) is None
    assert "capture: could not start torch: ImportError: no module named 'torch'" in capsys.readouterr().out
    written = _load(path)
    assert written["error"] == "ImportError: no module named 'torch'" and "broken" in written["traceback"]
    half = object()
    assert common.start("capture", data, path, lambda: half) is half and data["env"]["python"]


def test_a_bad_setting_or_path_is_one_line_not_a_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An invalid GRAPHJIT_* value is the ConfigError's line (status 2); an output path that cannot be written is
    the OSError's line (status 1); neither prints a traceback (``-v`` adds it)."""
    run = subprocess.run([sys.executable, "-m", "graphjit", "build"], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "GRAPHJIT_MAX_GRAPHS": "abc"})
    assert run.returncode == 2 and "GRAPHJIT_MAX_GRAPHS='abc'" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr, run.stderr
    blocker = tmp_path / "file"
    blocker.write_text("")
    out = str(blocker / "sub" / "x.json")
    assert main(["bench", "dispatch", "--iters", "2", "--repeats", "1", "--no-plot", "--out", out]) == 1
    err = capsys.readouterr().err
    assert err.startswith("graphjit: ") and "Traceback" not in err, err
