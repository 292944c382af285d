"""The probes a maintainer reruns on the GPU machine (tools/probes/) still run: a CPU smoke run of each that has one
(its numbers mean nothing; the point is that a probe does not fail before measuring, as replay_profile.py once did
after static_inputs() began to need the key's warmup calls)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.torch


def _run(args: list[str]) -> str:
    done = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_replay_profile_runs_on_emulated_graphs(tmp_path: Path):
    _run(["tools/probes/replay_profile.py", "--emulate", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "replay_profile.json").read_text())
    us = data["us"]
    for part in ("graphed_default", "graphed_default_python", "part_sign", "part_graph_replay", "sum_of_parts_default"):
        assert isinstance(us[part], float) and us[part] > 0, (part, us)
    assert "lane" in data and "profile_top" in data


def test_host_cost_emulated_measures_the_lane_and_an_island_boundary(tmp_path: Path):
    out = tmp_path / "host.json"
    _run(["tools/probes/host_cost_emulated.py", "--out", str(out)])
    data = json.loads(out.read_text())
    assert data["lane_on_us"]["default"] > 0 and data["lane_off_us"]["default"] > 0
    assert data["island_boundary_us"]["piecewise"] > data["island_boundary_us"]["whole"] > 0


def test_piecewise_profile_runs_on_the_cpu(tmp_path: Path):
    _run(["tools/probes/piecewise_profile.py", "--layers", "2", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "piecewise_profile.json").read_text())
    assert data["us"]["piecewise_step"] > 0 and data["us"]["sdpa_bool_mask_sliced"] > 0
    assert "Self CPU" in data["profile"]


def test_hf_decode_host_emulated_times_a_decode_step_both_ways(tmp_path: Path):
    pytest.importorskip("transformers")
    out = tmp_path / "hf.json"
    _run(["tools/probes/hf_decode_host_emulated.py", "--layers", "2", "--out", str(out)])
    data = json.loads(out.read_text())["L2"]
    assert data["checks"]["call_us"] > 0 and data["walk_only"]["sign_us"] > 0
    assert data["checks"]["tensors"] == data["walk_only"]["tensors"] > 2


def test_first_call_profile_takes_the_compile_tracers_first_call_apart(tmp_path: Path):
    _run(["tools/probes/first_call_profile.py", "--family", "llama", "--layers", "1", "--hidden", "32", "--dtype",
          "fp32", "--emulate", "--new-tokens", "4", "--top", "3", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "first_call_profile_llama_b1.json").read_text())
    res = data["variants"]["graphed_compile"]
    assert res["first_s"] > 0 and res["compile_s"] is not None and 0 < res["compile_s"] < res["first_s"]
    assert res["outside_compile_s"] > 0 and len(res["gc_count_by_generation"]) == 3
    assert res["stats"]["captures"] >= 1 and "generation.py" in res["top_cumulative"]


def test_capture_scope_emulated_splits_graphjits_own_time_from_the_step_and_the_emulator(tmp_path: Path):
    out = tmp_path / "scope.json"
    _run(["tools/probes/capture_scope_emulated.py", "--layers", "1", "--hidden", "8", "--sizes", "1,2,3",
          "--out", str(out)])
    data = json.loads(out.read_text())
    assert data["graphs"] == 3 and data["fallbacks"] == {}
    parts = data["parts_ms_per_size"]
    assert data["total_ms_per_size"] > data["emulator_ms_per_size"] > 0 and data["graphjit_own_ms_per_size"] > 0
    assert parts["write probes: what a run wrote"] > 0 and parts["the key's guard set"] > 0
    assert data["calls_per_size"]["watched runs (the step's own run included)"] == 2  # the call's own, the extra run
