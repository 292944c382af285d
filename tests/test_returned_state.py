"""Outputs that are the function's own state, or views of another output, come back as an eager call returns them:
a module buffer (or a global tensor) the function updates in place and returns is that very tensor, so a caller that
resets it through the returned handle resets the state; ``return logits, logits[:, -1]`` returns a view of the
returned logits, so ``logits.div_(t)`` shows in it.  Before, replays returned copies of both (silently off eager's
next call).  CPU lifecycle through tests/graph_emulator.py."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import graphjit  # noqa: E402

pytestmark = pytest.mark.torch

STATE = torch.zeros(3)


class Acc(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("state", torch.zeros(4))

    def forward(self, x):
        self.state.mul_(0.5).add_(x)
        return self.state


@pytest.mark.parametrize("outputs", ["copy", "alias"])
@pytest.mark.parametrize("check", [False, True])
def test_a_returned_buffer_is_the_buffer(emu, monkeypatch, outputs, check):
    if check:
        monkeypatch.setenv("GRAPHJIT_CHECK_OUTPUTS", "1")
        graphjit.env.refresh()
    eager, m = Acc(), Acc()
    g = graphjit.graphed(m, outputs=outputs)
    with torch.no_grad():
        for i in range(6):
            x = torch.full((4,), float(i))
            want, got = eager(x), g(x)
            assert got is m.state and torch.equal(got, want)
        want.zero_()  # the caller resets the state through the returned tensor, as eager allows
        got.zero_()
        assert torch.equal(g(torch.ones(4)), eager(torch.ones(4)))
        assert m.state.tolist() == [1.0] * 4
    assert g.stats()["replays"] == 5


def test_a_returned_global_tensor_is_the_global(emu):
    def f(x):
        STATE.add_(x)
        return STATE, x * 2

    g = graphjit.graphed(f)
    STATE.zero_()
    with torch.no_grad():
        for _ in range(5):
            state, doubled = g(torch.ones(3))
            assert state is STATE and torch.equal(doubled, torch.full((3,), 2.0))
    assert STATE.tolist() == [5.0] * 3 and g.stats()["replays"] == 3


def head(h, w):
    logits = h @ w
    return logits, {"last": logits[:, -1], "first": logits[:, 0]}


@pytest.mark.parametrize("outputs", ["copy", "alias"])
def test_an_output_that_views_another_is_a_view_of_the_returned_one(emu, outputs):
    g = graphjit.graphed(head, outputs=outputs)
    torch.manual_seed(0)
    w = torch.randn(4, 5)
    with torch.no_grad():
        for _ in range(6):
            h = torch.randn(2, 3, 4)
            le, de = head(h, w)
            lg, dg = g(h, w)
            assert torch.equal(lg, le)
            le.div_(2.0)
            lg.div_(2.0)  # temperature applied in place to the full logits
            for k in ("last", "first"):
                assert torch.equal(dg[k], de[k]), k
                assert dg[k]._base is lg, k
    s = g.stats()
    assert s["replays"] == 4


def test_copies_stay_apart_where_eager_returns_two_tensors(emu):
    """Only a view is a view: two outputs over separate memory (or one a copy of the other's part) stay apart."""

    def f(x):
        y = x * 2
        return y, y[:, -1].clone()

    g = graphjit.graphed(f)
    with torch.no_grad():
        for _ in range(5):
            y, last = g(torch.ones(2, 3))
            y.zero_()
            assert last.tolist() == [2.0, 2.0] and last._base is None


@pytest.mark.parametrize("feeds", [True, False])
def test_feed_nodes_serve_views_of_outputs_and_state_outputs(emu, monkeypatch, feeds):
    """The graph's feed nodes (graphjit/handoff.py) copy only the outputs that are neither state nor views of another
    output; the others come back as on the copy path."""
    monkeypatch.setattr(type(emu), "feeds", feeds)
    acc = Acc()

    def f(h, w):
        logits, views = head(h, w)
        return logits, views, acc(h[0, 0])

    g = graphjit.graphed(f)
    ref = Acc()
    torch.manual_seed(0)
    w = torch.randn(4, 5)
    with torch.no_grad():
        for _ in range(6):
            h = torch.randn(2, 3, 4)
            lg, dg, state = g(h, w)
            le, de = head(h, w)
            assert state is acc.state and torch.equal(state, ref(h[0, 0]))
            lg.div_(2.0)
            le.div_(2.0)
            assert torch.equal(dg["last"], de["last"]) and dg["last"]._base is lg
    key = g.stats()["keys"][0]
    assert key["fed_replays"] == (key["replays"] - 1 if feeds else 0)
