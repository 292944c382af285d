"""GPU tests, torch: the process stays healthy after every kind of failed capture, and the first graphed key
of a fresh process captures (make test-gpu).  Each case runs in a fresh process (tests/gpu_health_child.py):
what a failure leaves behind in torch (a generator in capture mode, a pool still recording, memory held) shows
only in what the process does next.

After the failure the process must: draw random numbers (eagerly and in a new graph, following the generator
as eager does), capture and replay new graphs, and get back the memory the failed capture held once the
function is dropped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.torch]
pytest.importorskip("torch")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child(kind: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRAPHJIT_")}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "gpu_health_child.py"), kind],
                          capture_output=True, text=True, timeout=180, cwd=ROOT, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(lines[-1][len("RESULT "):])
    assert "crash" not in res, res.get("tb", res)
    return res


def healthy(res: dict) -> None:
    assert res["reserved_after_drop_minus_base"] <= 0, res  # the failed capture's memory came back
    rng = res["rng"]
    assert rng["graphs"] == 1 and rng["replays"] >= 3 and not rng["fallbacks"] and rng["equal_eager"], res


def test_the_first_graphed_key_of_a_fresh_process_captures():
    """torch's one-time notice about its sync debug mode (the first switch to it in a process) is no sync."""
    res = child("fresh")
    assert res["warm"] == 1, res  # the process's very first graphed key
    assert res["graphs"] == 1 and res["replays"] == 3 and not res["fallbacks"] and res["outputs_equal_eager"], res
    assert res["other_key"] == {"graphs": 1, "equal": True}, res
    healthy(res)


def test_healthy_after_a_sync_that_only_the_capture_sees():
    res = child("sync_only_the_capture_sees")
    assert res["graphs"] == 0 and res["outputs_equal_eager"], res
    assert any(r.startswith("capture failed") for r in res["fallbacks"]), res
    assert res["other_key"] == {"graphs": 1, "equal": True}, res  # a new key of the process captures
    healthy(res)


def test_healthy_after_an_op_that_cannot_be_captured():
    res = child("uncapturable_op")
    assert res["graphs"] == 0 and res["outputs_equal_eager"] and res["fallbacks"], res
    healthy(res)


def test_healthy_after_the_functions_own_exception_inside_the_capture():
    """The function raised only while captured: the call runs uncaptured (eager does not raise), with the reason."""
    res = child("raises_in_capture")
    assert res["graphs"] == 0 and res["outputs_equal_eager"], res
    assert any("ValueError" in r for r in res["fallbacks"]), res
    assert res["other_key"] == {"graphs": 1, "equal": True}, res
    healthy(res)


def test_healthy_after_an_island_that_breaks_its_contract():
    res = child("island_breaks_contract")
    assert res["graphs"] == 0 and res["verify"] == ["failed"], res
    healthy(res)
