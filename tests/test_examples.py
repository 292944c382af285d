"""Every script in examples/ runs on this machine (CPU: the fallback log line), with few steps.

The parameters come from the files present, so a new example is picked up without editing this
test: an example that takes ``--steps`` gets a small value; one that takes ``--framework`` runs once
per installed framework; one that imports a framework that is not installed is skipped.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import paddle_cuda, torch_cuda

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
INSTALLED = [fw for fw in ("paddle", "torch") if importlib.util.find_spec(fw) is not None]
FALLBACK_LINE = "no CUDA graph"


def _cases() -> list:
    cases = []
    for path in EXAMPLES:
        source = path.read_text()
        args = ["--steps", "2"] if "--steps" in source else []
        if "--framework" in source:
            for fw in ("paddle", "torch"):
                mark = pytest.mark.skipif(fw not in INSTALLED, reason=f"{fw} is not installed")
                cases.append(pytest.param(path, fw, [*args, "--framework", fw], id=f"{path.stem}-{fw}", marks=mark))
        else:
            needed = [fw for fw in ("paddle", "torch") if f"import {fw}" in source]
            extras = [m for m in ("transformers", "paddleformers") if f"import {m}" in source]
            missing = [fw for fw in needed if fw not in INSTALLED]
            missing += [m for m in extras if importlib.util.find_spec(m) is None]
            mark = pytest.mark.skipif(bool(missing), reason=f"{', '.join(missing)} not installed")
            fw = needed[0] if len(needed) == 1 else None
            cases.append(pytest.param(path, fw, args, id=path.stem, marks=mark))
    return cases


def test_the_examples_are_found() -> None:
    names = {p.name for p in EXAMPLES}
    assert {"quickstart.py", "decode_loop.py", "tp_mlp.py"} <= names


@pytest.mark.parametrize(("path", "framework", "args"), _cases())
def test_example_runs(path: Path, framework: str | None, args: list[str]) -> None:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("GRAPHJIT_")}
    environ["PYTHONPATH"] = str(ROOT) + os.pathsep + environ.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, str(path), *args], capture_output=True, text=True, timeout=180,
                          cwd=ROOT, env=environ)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{path.name} {' '.join(args)} exited {proc.returncode}:\n{out[-4000:]}"
    gpu = {"torch": torch_cuda, "paddle": paddle_cuda}
    if framework is None or not gpu[framework]():  # on a GPU the graphs are captured: no fallback line
        assert FALLBACK_LINE in out, out[-4000:]


@pytest.mark.skipif("torch" not in INSTALLED, reason="torch is not installed")
def test_tp_mlp_shared_mode_says_it_needs_a_gpu() -> None:
    if torch_cuda():
        pytest.skip("a GPU is here: tests/test_gpu_torch.py runs this mode")
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "tp_mlp.py"), "--backend", "shared"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 2 and "--backend shared needs a CUDA GPU" in proc.stderr, proc.stderr
