"""Guarded values with Paddle on the CPU: what the guards find in a Layer and a closure (the CPU has no CUDA
graphs for Paddle, so the replays themselves are tested on the GPU: tests/test_gpu_guards_paddle.py)."""

from __future__ import annotations

import pytest

import graphjit
from graphjit import backends, guards

pytestmark = pytest.mark.paddle

paddle = pytest.importorskip("paddle")


def test_a_layer_attribute_and_a_closed_over_dict_item_are_guarded():
    class Pick(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.lin = paddle.nn.Linear(4, 4)
            self.k = 1
            self.step_count = 0  # named by no code the layer runs

        def forward(self, x):
            return self.lin(x) * self.k * CFG["scale"]

    CFG = {"scale": 2.0}
    layer = Pick()
    src = guards.sources(type(layer).forward, layer)
    found = guards.scan(src, lambda x: isinstance(x, paddle.Tensor))
    guard = guards.GuardSet(found)
    paths = {guards.describe(p) for _v, p in found.values().values()}
    assert "self.k" in paths and "self.training" in paths and "self.step_count" not in paths, paths
    assert any("'scale'" in p for p in paths), paths
    assert guard.holds()
    layer.step_count = 5
    assert guard.holds()  # the loop's own counter ends no graph
    layer.k = 3
    assert not guard.holds() and guard.change() == ("self.k", "1", "3")
    CFG["scale"] = 4.0
    layer.k = 1
    assert not guard.holds() and guard.change()[0].endswith("['scale']")


def test_a_sublayer_attribute_and_a_swapped_sublayer_are_guarded():
    """A value a sublayer's forward reads off the sublayer (held in the parent's ``_sub_layers``), and the sublayer
    itself by identity, shown as the attributes the code reads."""

    class Child(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.lin = paddle.nn.Linear(4, 4)
            self.scale = 1.0

        def forward(self, x):
            return self.lin(x) * self.scale

    class Parent(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.child = Child()

        def forward(self, x):
            return self.child(x) + 1

    layer = Parent()
    b = backends.get("paddle")
    src = guards.sources(type(layer).forward, layer)
    found = guards.scan(src, lambda x: isinstance(x, paddle.Tensor), None, b.tensor_holders, None, b.module_holders)
    guard = guards.GuardSet(found)
    paths = {guards.describe(p) for _v, p in found.values().values()}
    assert "self.child.scale" in paths and "self.child" in paths, paths
    assert guard.holds()
    layer.child.scale = 2.0
    assert not guard.holds() and guard.change() == ("self.child.scale", "1.0", "2.0")
    layer.child.scale = 1.0
    layer.child = Child()
    assert not guard.holds() and guard.change()[0] == "self.child"


def test_the_ast_tracer_is_known_to_freeze_values():
    backend = backends.get("paddle")
    assert not backend.tracer_rereads_values("ast")
    assert backend.tracer_rereads_values("sot") and backend.tracer_rereads_values("eager")
    assert graphjit.graphed(lambda x: x, tracer="ast") is not None


AST_SCALE = 2.0


def _ast_scaled(x):
    return x * AST_SCALE


def test_an_uncaptured_call_under_the_ast_tracer_reads_the_current_values():
    """A static program keeps the Python values it was translated with (plain ``to_static`` returns the old global
    after it changed): an uncaptured call under ``tracer="ast"`` (here every call: the CPU has no CUDA graphs) runs
    the Python function, so it reads the current ones, as the eager call does."""
    global AST_SCALE
    g = graphjit.graphed(_ast_scaled, tracer="ast")
    x = paddle.ones([2])
    try:
        assert float(g(x).numpy()[0]) == 2.0
        AST_SCALE = 5.0
        assert float(g(x).numpy()[0]) == 5.0
    finally:
        AST_SCALE = 2.0


def test_a_rebound_dict_of_a_layer_is_read_anew():
    """``layer.cfg = {...}`` after the capture: the guards read the new dict (an equal one holds, another value is a
    change naming the path), as with torch."""

    class Scaled(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.lin = paddle.nn.Linear(4, 4)
            self.cfg = {"scale": 1.0}

        def forward(self, x):
            return self.lin(x) * self.cfg["scale"]

    layer = Scaled()
    found = guards.scan(guards.sources(type(layer).forward, layer), lambda x: isinstance(x, paddle.Tensor))
    guard = guards.GuardSet(found)
    assert guard.holds()
    layer.cfg = {"scale": 1.0}
    assert guard.holds()
    layer.cfg = {"scale": 2.0}
    assert not guard.holds() and guard.change() == ("self.cfg['scale']", "1.0", "2.0")


def test_set_state_dict_loads_an_optimizers_state_into_the_same_tensors():
    """Why Paddle's ``optimizer.set_state_dict`` needs no watch (torch's ``load_state_dict`` rebinds ``state`` and gets
    one: guard_set.note_load): it writes the loaded moments into the accumulator tensors a captured step reads, so the
    graph reads the loaded values; a Paddle that rebinds them would fail here."""
    import numpy as np

    paddle.seed(0)
    lin = paddle.nn.Linear(4, 4)
    opt = paddle.optimizer.AdamW(learning_rate=0.01, parameters=lin.parameters())

    def step():
        lin(paddle.ones([2, 4])).sum().backward()
        opt.step()
        opt.clear_grad()

    step()
    saved = {k: (v.clone() if isinstance(v, paddle.Tensor) else v) for k, v in opt.state_dict().items()}
    held = {(n, p): t for n, d in opt._accumulators.items() for p, t in d.items()}
    step()
    opt.set_state_dict(saved)
    now = {(n, p): t for n, d in opt._accumulators.items() for p, t in d.items()}
    assert now.keys() == held.keys() and all(now[k] is held[k] for k in held)
    loaded = [t for t in held.values() if t.name in saved]
    assert loaded and all(np.array_equal(t.numpy(), saved[t.name].numpy()) for t in loaded)
