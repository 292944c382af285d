"""A graphed method keys its graphs by its instance's id: when the instance goes, its keys go with it
(graphjit/drops.py).  Before, they stayed: the dead model's parameters and graphs were kept for good (counted against
``max_graphs``), and a new model that Python put at the dead one's address replayed the dead one's graph, with its
weights: a silently wrong result.  CPU lifecycle through tests/graph_emulator.py."""

from __future__ import annotations

import gc
import weakref

import pytest

torch = pytest.importorskip("torch")

import graphjit  # noqa: E402

pytestmark = pytest.mark.torch


class Scaled(torch.nn.Module):
    def __init__(self, value: float) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        torch.nn.init.constant_(self.lin.weight, value)
        torch.nn.init.zeros_(self.lin.bias)

    @graphjit.graphed
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


@pytest.mark.parametrize("lane", [False, True])
def test_a_model_at_a_dead_models_address_replays_its_own_weights(emu, request, lane):
    if lane:
        request.getfixturevalue("lane_on")
    Scaled.forward.reset()
    x = torch.ones(1, 4)
    seen: set[int] = set()
    reused = 0
    for v in range(40):
        m = Scaled(float(v)).eval()
        reused += id(m) in seen
        seen.add(id(m))
        with torch.no_grad():
            for _ in range(4):  # two warmups, the capture, a replay (and the lane's, where loaded)
                assert torch.equal(m(x), torch.full((1, 4), 4.0 * v)), (v, reused)
        del m
        gc.collect()
    if not reused:
        pytest.skip("Python put no model at a dead one's address")
    st = Scaled.forward.stats()
    assert st["graphs"] == 0 and st["keys"] == [], Scaled.forward.report()


def test_a_dead_models_parameters_and_graphs_go_with_it(emu):
    Scaled.forward.reset()
    m = Scaled(2.0).eval()
    with torch.no_grad():
        for _ in range(4):
            m(torch.ones(1, 4))
    assert Scaled.forward.stats()["graphs"] == 1
    weight = weakref.ref(m.lin.weight)
    del m
    gc.collect()
    assert weight() is None, "the graph's guards kept the dead model's weight"
    assert Scaled.forward.stats()["graphs"] == 0


def test_a_model_gone_while_the_function_is_busy_is_dropped_at_the_next_call(emu):
    """Where the instance goes while the function's lock is held (its own call, another thread's), its keys are
    dropped by the next call instead, before that call is signed."""
    Scaled.forward.reset()
    state = Scaled.forward._self_state
    x = torch.ones(1, 4)
    a, b = Scaled(1.0).eval(), Scaled(3.0).eval()
    with torch.no_grad():
        for _ in range(4):
            a(x), b(x)
        weight = weakref.ref(a.lin.weight)
        with state.lock:
            del a
            gc.collect()
        assert weight() is not None and state.gone
        assert torch.equal(b(x), torch.full((1, 4), 12.0))
        assert weight() is None and not state.gone
        assert Scaled.forward.stats()["graphs"] == 1
        for _ in range(3):
            assert torch.equal(b(x), torch.full((1, 4), 12.0))
