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
    assert Scaled.forward.stats()["graphs"] == 0  # stats() drops the keys of the instances gone
    gc.collect()
    assert weight() is None, "the graph's guards kept the dead model's weight"


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


def test_a_model_gone_during_another_functions_capture_is_dropped_after_it(emu, monkeypatch):
    """A watched model that dies while another graphed function captures (here: inside it) has its graph released
    after that capture, never during it (a graph released during a capture invalidates the capture), even where a
    graphed call nested in the capture runs (before: that call released it)."""
    import graph_emulator

    Scaled.forward.reset()
    capturing = [False]
    released_in_capture: list[bool] = []
    reset = graph_emulator.EmulatedGraph.reset
    monkeypatch.setattr(graph_emulator.EmulatedGraph, "reset",
                        lambda self: (released_in_capture.append(capturing[0]), reset(self))[1])
    capture = type(emu).capture_graph

    def watched_capture(self, *a, **k):
        capturing[0] = True
        try:
            return capture(self, *a, **k)
        finally:
            capturing[0] = False

    monkeypatch.setattr(type(emu), "capture_graph", watched_capture)
    with torch.no_grad():
        x = torch.ones(1, 4)
        live = Scaled(1.0).eval()
        doomed = []
        for v in range(8):
            m = Scaled(float(v)).eval()
            for _ in range(4):
                m(x)
            doomed.append(m)
        del m
        pop = doomed.pop  # (a builtin method: graphjit does not walk what it holds)
        del doomed

        @graphjit.graphed
        def outer(x):
            pop()  # a watched model dies inside outer's runs, its capture included
            return live(x) + 1

        for _ in range(4):
            outer(x)
        Scaled.forward.stats()  # drops what is gone, outside every capture
    assert released_in_capture and not any(released_in_capture), released_in_capture


def test_stats_read_while_dead_models_are_collected(emu):
    """The weak references' callbacks only record that a model went: a collection in the middle of ``stats()``
    changes none of the dicts it reads (before: RuntimeError, dictionary changed size during iteration)."""
    Scaled.forward.reset()
    x = torch.ones(1, 4)
    models = []
    with torch.no_grad():
        for v in range(30):
            m = Scaled(float(v)).eval()
            for _ in range(4):
                m(x)
            m.box = [m]  # a cycle: it goes only at a collection
            models.append(m)
    del m
    models.clear()
    thresholds = gc.get_threshold()
    gc.set_threshold(1)  # a collection at the next allocations, as any allocation may trigger
    try:
        Scaled.forward.stats()
        Scaled.forward.report()
    finally:
        gc.set_threshold(*thresholds)
    gc.collect()
    assert Scaled.forward.stats()["graphs"] == 0


def test_an_instance_without_weak_references_is_held_until_reset(emu):
    """An instance that takes no weak reference is held by the function (its address stays its own) until
    ``reset()``, which lets it go."""

    class Holder:
        __slots__ = ("__dict__", "w")  # no __weakref__

        def __init__(self, v: float) -> None:
            self.w = torch.full((4, 4), v)

        @graphjit.graphed
        def f(self, x):
            return x @ self.w

    x = torch.ones(1, 4)
    for v in range(5):
        h = Holder(float(v))
        for _ in range(4):
            assert torch.equal(h.f(x), x @ h.w)
        del h
    gc.collect()
    alive = sum(type(o) is Holder for o in gc.get_objects())
    assert alive == 5 and Holder.f.stats()["graphs"] == 5
    Holder.f.reset()
    gc.collect()
    assert sum(type(o) is Holder for o in gc.get_objects()) == 0
