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


def test_each_target_says_where_it_was_met_and_which_rows_were_over():
    tool = _tool()
    lines = tool.targets([RESULTS / "generate_gpt2_310e829_torch_h100.json"])
    assert lines[0].startswith("graphed first / HF compiled first at most 0.1: met in 2 of 2 rows"), lines
    # GPT-2 at batch 1 in that run: 6.43 against 5.29 s; at batch 8 4.81 against 6.36 s
    assert lines[1].startswith("compile tracer first / HF compiled first at most 1: met in 1 of 2 rows"), lines
    assert lines[1].endswith("over: gpt2 B1 1.216"), lines


def test_a_later_row_cut_by_the_time_budget_keeps_the_earlier_whole_one():
    tool = _tool()
    runs = tool.load([RESULTS / "generate_qwen2_moe_mixtral_qwen2_vl_gemma2_gemma3_text_310e829_torch_h100.json",
                      RESULTS / "generate_t5_qwen3_qwen2_moe_mixtral_88ecf75_torch_h100.json"])
    # 88ecf75's run: Qwen2-MoE whole, Mixtral B1 without the compile tracer, Mixtral B8 not at all
    assert runs.rows["qwen2_moe B1"][0] == "88ecf75" and runs.rows["t5 B8"][0] == "88ecf75"
    assert runs.rows["mixtral B1"][0] == "310e829" and runs.rows["mixtral B8"][0] == "310e829"
    assert tool.ran(runs.rows["mixtral B1"][1]) == 4
