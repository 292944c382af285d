"""graphjit's replay path with Paddle tensors, on the CPU: captures and replays by the Paddle graph emulator
(tests/graph_emulator_paddle.py, which runs the function again on replay), so that signing Paddle tensors, static
buffers, output copies and aliases, keys, guards, exactly-once state and capture scopes are tested in CI with the
Paddle builds it installs.  Frozen Python values are the torch emulator's and the GPU tests' (a replay here reads
them again)."""

from __future__ import annotations

import numpy as np
import pytest

import graphjit

pytestmark = pytest.mark.paddle

paddle = pytest.importorskip("paddle")

from graph_emulator_paddle import emulated_paddle  # noqa: E402

TRACERS = ["eager", "sot"]


@pytest.fixture
def emu():
    paddle.set_device("cpu")
    with emulated_paddle() as backend, paddle.no_grad():
        yield backend


def _inputs(seed: int, rows: int = 3) -> list:
    rng = np.random.default_rng(seed)
    return [paddle.to_tensor(rng.standard_normal((rows, 4)).astype("float32")) for _ in range(4)]


def _step(a, b, c, d):
    return paddle.matmul(a, b, transpose_y=True) + c.sum() * d.mean()


def _count(layer) -> float:
    return float(layer.calls.numpy().reshape(-1)[0])


def _equal(a, b) -> bool:
    return bool(np.array_equal(a.numpy(), b.numpy()))


@pytest.mark.parametrize("tracer", TRACERS)
def test_fresh_inputs_replay_and_each_result_is_its_own(emu, tracer):
    g = graphjit.graphed(_step, tracer=tracer)
    calls = [_inputs(s) for s in range(8)]
    got = [g(*xs) for xs in calls]
    for xs, out in zip(calls, got):  # an earlier result is not overwritten by a later replay
        assert _equal(out, _step(*xs))
    st = g.stats()
    assert st["graphs"] == 1 and st["replays"] == 8 - 2 and not st["fallbacks"], st


def test_alias_outputs_are_the_graphs_buffers_and_static_inputs_are_not_copied(emu):
    g = graphjit.graphed(_step, outputs="alias")
    for s in range(3):
        g(*_inputs(s))
    args, kwargs = g.static_inputs(*_inputs(0))
    copies = g.stats()["keys"][0]["input_copies"]
    first = g(*args, **kwargs)
    for s in range(4):
        for buf, x in zip(args, _inputs(10 + s)):
            paddle.assign(x, output=buf)
        out = g(*args, **kwargs)
        assert out is first and _equal(out, _step(*_inputs(10 + s)))
    assert g.stats()["keys"][0]["input_copies"] == copies  # zero-copy: the call passed the graph's own buffers


class Counter(paddle.nn.Layer):
    """State written in place on every call: a graph that replays once per call keeps it exact."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = paddle.nn.Linear(4, 4)
        self.register_buffer("calls", paddle.zeros([1]))
        self.scale = 1.0

    def forward(self, x):
        paddle.assign(self.calls + 1, output=self.calls)
        return self.lin(x) * self.scale + self.calls


@pytest.mark.parametrize("tracer", TRACERS)
def test_state_written_in_place_advances_once_per_call(emu, tracer):
    paddle.seed(0)
    layer, twin = Counter(), Counter()
    twin.set_state_dict(layer.state_dict())
    g = graphjit.graphed(layer, tracer=tracer)
    x = _inputs(1)[0]
    for n in range(1, 7):
        assert _equal(g(x), twin(x)), n
        assert _count(layer) == n == _count(twin)
    assert g.stats()["replays"] == 6 - 2


def test_a_changed_attribute_and_a_new_shape_are_followed(emu):
    paddle.seed(0)
    layer, twin = Counter(), Counter()
    twin.set_state_dict(layer.state_dict())
    g = graphjit.graphed(layer)
    x = _inputs(2)[0]
    for _ in range(4):
        assert _equal(g(x), twin(x))
    layer.scale = twin.scale = 3.0  # a value the graph read: calls run as eager would, a variant of the key
    for _ in range(3):
        assert _equal(g(x), twin(x))
    wide = _inputs(3, rows=5)[0]  # another shape: another key
    for _ in range(4):
        assert _equal(g(wide), twin(wide))
    assert _count(layer) == _count(twin) == 11
    st = g.stats()
    assert st["graphs"] == 3 and not st["fallbacks"], st
    assert [k["key"] for k in st["keys"] if "self.scale=3.0" in k["key"]], st["keys"]


def test_a_capture_scope_captures_each_size_on_its_first_call(emu):
    paddle.seed(0)
    layer, twin = Counter(), Counter()
    twin.set_state_dict(layer.state_dict())
    g = graphjit.graphed(layer)
    sizes = [4, 2, 1]
    with graphjit.capture_scope(progress=False):
        for rows in sizes:
            x = _inputs(rows, rows=rows)[0]
            assert _equal(g(x), twin(x))
    assert g.stats()["graphs"] == len(sizes)
    for rows in sizes * 2:
        x = _inputs(rows, rows=rows)[0]
        assert _equal(g(x), twin(x))
    assert _count(layer) == _count(twin) == 3 * len(sizes)
    assert g.stats()["replays"] == 2 * len(sizes) and not g.stats()["fallbacks"]


def test_grad_mode_is_part_of_the_key(emu):
    g = graphjit.graphed(_step)
    xs = _inputs(4)
    for _ in range(3):
        g(*xs)
    with paddle.enable_grad():
        outs = [g(*xs) for _ in range(4)]
    assert all(_equal(out, _step(*xs)) and out.stop_gradient for out in outs) and len(g.stats()["keys"]) == 2
    assert g.stats()["replays"] == 2 * (4 - 2) - 1  # (the third call of the first key was its capture's replay)


def test_a_paddle_key_is_told_once_that_the_lane_has_no_plan_for_it(emu, lane_on):
    """A Paddle graph has no feed nodes, so no handoff and no plan: the key is marked once, not asked every call."""
    g = graphjit.graphed(_step)
    xs = _inputs(5)
    for _ in range(8):
        assert _equal(g(*xs), _step(*xs))
    (entry,) = g._self_state.entries.values()
    assert entry.handoff is None and entry.lane is False and g.stats()["replays"] == 8 - 2


def test_the_paddle_host_cost_probe_measures_every_path(tmp_path):
    """tools/probes/host_cost_paddle_emulated.py (CI prints it) runs and every timed call replayed."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    out = tmp_path / "paddle_host.json"
    done = subprocess.run([sys.executable, "tools/probes/host_cost_paddle_emulated.py", "--iters", "100",
                           "--out", str(out)], cwd=root,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(root)})
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads(out.read_text())
    assert all(v > 0 for v in data["us"].values()), data["us"]
    for s in data["stats"].values():  # every call replayed but the key's two warmups
        assert s["replays"] == s["calls"] - 2 and not s["fallbacks"], data["stats"]


def test_the_paddle_host_profile_probe_profiles_replayed_calls(tmp_path):
    """tools/probes/host_profile_paddle.py --emulate runs, every timed and profiled call replayed, and its profiles
    name graphjit's own functions."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "tools/probes/host_profile_paddle.py", "--emulate", "--iters", "50",
                           "--calls", "200", "--out", str(tmp_path)], cwd=root,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(root)})
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads((tmp_path / "host_profile_paddle.json").read_text())
    assert all(v > 0 for v in data["us"].values()), data["us"]
    for s in data["stats"].values():
        assert s["replays"] == s["calls"] - 2 and not s["fallbacks"], data["stats"]
    assert "graphjit/keys.py" in data["profile_static_alias"] and "buffers.py" in data["profile_default"]
