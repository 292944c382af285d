"""tools/generate_table.py: the README's bench generate table from committed JSON files, refused across commits."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def _tool():
    spec = importlib.util.spec_from_file_location("generate_table", ROOT / "tools" / "generate_table.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_one_commit_gives_one_row_per_family_and_batch_with_the_files_ratios():
    tool = _tool()
    files = [RESULTS / "generate_llama_torch_h200.json", RESULTS / "generate_qwen2_torch_h200.json"]
    lines, commits = tool.table(files)
    assert list(commits) == ["f8ef020"] and len(lines) == 2 + 4, lines
    llama = next(line for line in lines if line.startswith("| Llama 1 |"))
    cells = [c.strip() for c in llama.strip("|").split("|")]
    assert cells[5:] == ["0.124", "0.148", "0.84", "1"], cells  # compile tracer, HF compiled, their ratio, graphs


def test_rows_of_several_commits_are_refused_unless_asked_for(capsys: pytest.CaptureFixture[str]):
    tool = _tool()
    files = [str(RESULTS / "generate_gemma2_gemma3_text_torch_h200.json"), str(RESULTS / "generate_t5_torch_h200.json")]
    assert tool.main(files) == 1 and "several commits" in capsys.readouterr().err
    assert tool.main([*files, "--mixed"]) == 0
    out = capsys.readouterr().out
    assert "| Gemma 2 8 |" in out and "34a2aeb: 4" in out and "4494f63: 2" in out
