"""graphed_layer with Paddle on the CPU (CI, also under paddlepaddle 2.6.2 without torch): gradients equal to
eager, FIFO order, the wrapper layer, and what a dropped layer leaves behind.  The simulated-graph path
(``_simulate=True``) runs every static buffer, slot, copy and gradient hand-over of the graphed path, with
a "replay" that re-runs the layer (see tests/test_training.py for the torch side).
"""

from __future__ import annotations

import copy
import logging

import numpy as np
import pytest

import graphjit
from graphjit import UnsupportedOutputError


@pytest.fixture
def paddle_cpu():
    paddle = pytest.importorskip("paddle")
    paddle.set_device("cpu")
    return paddle


def paddle_block(paddle, seed=0):
    class PBlock(paddle.nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.a = paddle.nn.Linear(6, 12)
            self.b = paddle.nn.Linear(12, 6)
            self.unused = self.create_parameter([3])

        def forward(self, x, y=None):
            h = paddle.nn.functional.gelu(self.a(x))
            out = self.b(h)
            if y is not None:
                out = out + y
            return out, {"h": h}

    paddle.seed(seed)
    return PBlock()


def p_loss(out):
    y, extra = out
    return (y * y).sum() + extra["h"].sum() * 0.5


@pytest.mark.paddle
@pytest.mark.parametrize("simulate", [False, True])
def test_paddle_gradients_equal_eager_across_accumulation_steps(paddle_cpu, simulate, gj_log):
    paddle = paddle_cpu
    m, ref = paddle_block(paddle), paddle_block(paddle)
    ref.set_state_dict(m.state_dict())
    g = graphjit.graphed_layer(m, warmup=2, _simulate=simulate)
    assert isinstance(g, paddle.nn.Layer) and g.layer is m
    rng = np.random.default_rng(0)
    for _step in range(3):
        for _micro in range(3):
            xn = rng.standard_normal((4, 6)).astype("float32")
            yn = rng.standard_normal((4, 6)).astype("float32")
            x, xr = paddle.to_tensor(xn, stop_gradient=False), paddle.to_tensor(xn, stop_gradient=False)
            y = paddle.to_tensor(yn)
            out, want = g(x, y), ref(xr, y)
            np.testing.assert_allclose(out[0].numpy(), want[0].numpy(), rtol=1e-6, atol=1e-6)
            p_loss(out).backward()
            p_loss(want).backward()
            np.testing.assert_allclose(x.grad.numpy(), xr.grad.numpy(), rtol=1e-5, atol=1e-6)
        for (n, p), (_, q) in zip(m.named_parameters(), ref.named_parameters()):
            if q.grad is None:
                assert p.grad is None, n
            else:
                np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-5, atol=1e-6, err_msg=n)
        if _step == 1:
            m.clear_gradients()
            ref.clear_gradients()
    s = g.stats()
    if simulate:
        assert s["captures"] == 1 and s["replays"] == 7 and s["backward_replays"] == 7
    else:
        lines = [r for r in gj_log.records if "no CUDA graph" in r.getMessage()]
        assert len(lines) == 1 and lines[0].levelno == logging.INFO
        assert s["captures"] == 0 and list(s["fallbacks"].values()) == [9]


@pytest.mark.paddle
def test_paddle_backward_out_of_order_names_the_expected_micro_batch(paddle_cpu):
    paddle = paddle_cpu
    g = graphjit.graphed_layer(paddle_block(paddle), warmup=1, _simulate=True)

    def x():
        return paddle.to_tensor(np.ones((2, 6), "float32"), stop_gradient=False)

    p_loss(g(x())).backward()
    o2, o3 = g(x()), g(x())
    with pytest.raises(Exception, match=r"BackwardOrderError.*micro-batch 3 ran before the backward of micro-batch 2"):
        p_loss(o3).backward()  # Paddle's engine re-raises it as an OSError carrying the message
    p_loss(o2).backward()
    p_loss(o3).backward()
    assert g.stats()["in_flight"] == 0 and g.stats()["backward_replays"] == 2


@pytest.mark.paddle
def test_paddle_one_f_one_b_and_disable(paddle_cpu, monkeypatch):
    paddle = paddle_cpu
    m, ref = paddle_block(paddle, 3), paddle_block(paddle, 3)
    ref.set_state_dict(m.state_dict())
    g = graphjit.graphed_layer(m, warmup=3, _simulate=True)
    rng = np.random.default_rng(1)
    for _step in range(3):
        xs = [paddle.to_tensor(rng.standard_normal((3, 6)).astype("float32")) for _ in range(4)]
        got, want = [], []
        for layer, losses in ((g, got), (ref, want)):
            outs = {}
            for op in ("F0", "F1", "F2", "B0", "F3", "B1", "B2", "B3"):
                i = int(op[1])
                if op[0] == "F":
                    outs[i] = layer(xs[i])
                else:
                    loss = p_loss(outs.pop(i))
                    losses.append(float(loss))
                    loss.backward()
        np.testing.assert_allclose(got, want, rtol=1e-5)
        for p, q in zip(m.parameters(), ref.parameters()):
            if q.grad is not None:
                np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-5, atol=1e-6)
        m.clear_gradients()
        ref.clear_gradients()
    k = g.stats()["keys"][0]
    assert k["slots"] == 3 and k["backward_replays"] == 9
    monkeypatch.setenv("GRAPHJIT_DISABLE", "1")
    graphjit.refresh_env()
    before = g.stats()["calls"]
    p_loss(g(xs[0])).backward()
    assert g.stats()["calls"] == before and g.stats()["disabled_calls"] == 1


@pytest.mark.paddle
def test_paddle_unsupported_output(paddle_cpu):
    paddle = paddle_cpu

    class Bad(paddle.nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.lin = paddle.nn.Linear(2, 2)

        def forward(self, x):
            return self.lin(x), {1, 2}

    with pytest.raises(UnsupportedOutputError, match=r"builtins\.set"):
        graphjit.graphed_layer(Bad())(paddle.ones([1, 2]))


@pytest.mark.paddle
def test_paddle_layer_wrapper_repr_cast_and_deepcopy(paddle_cpu):
    paddle = paddle_cpu
    m = paddle_block(paddle)
    g = graphjit.graphed_layer(m, warmup=1, max_in_flight=2, _simulate=True)
    assert "warmup=1" in repr(g) and "max_in_flight=2" in repr(g)
    assert [id(p) for p in g.parameters()] == [id(p) for p in m.parameters()]
    for _ in range(2):
        p_loss(g(paddle.randn([4, 6]))).backward()
    assert g.stats()["replays"] == 1
    c = copy.deepcopy(g)
    assert c.layer is not m and c.stats()["keys"] == [] and c._graphjit_core.max_in_flight == 2
    for p, q in zip(c.parameters(), m.parameters()):
        np.testing.assert_array_equal(p.numpy(), q.numpy())
    for _ in range(2):
        p_loss(c(paddle.randn([4, 6]))).backward()
    assert c.stats()["replays"] == 1 and g.stats()["calls"] == 2
    g.to(dtype="float64")  # casts the parameters the graphs captured: every graph is dropped
    assert g.stats()["keys"] == []
    out = g(paddle.randn([4, 6]).astype("float64"))
    assert out[0].dtype == paddle.float64


@pytest.mark.paddle
def test_paddle_astype_drops_the_graphs(paddle_cpu):
    """Paddle's Layer.astype casts the parameters without going through _apply: the wrapper drops its graphs
    (they captured the old parameters by address)."""
    paddle = paddle_cpu
    m = paddle_block(paddle)
    g = graphjit.graphed_layer(m, warmup=1, _simulate=True)
    for _ in range(2):
        p_loss(g(paddle.randn([4, 6]))).backward()
    assert len(g.stats()["keys"]) == 1
    assert g.astype("float64") is g
    assert g.stats()["keys"] == []


@pytest.mark.paddle
def test_a_dropped_paddle_layer_frees_its_graphs_without_the_collector(paddle_cpu, freed_by_refcount):
    paddle = paddle_cpu

    def use():
        g = graphjit.graphed_layer(paddle_block(paddle), warmup=1, _simulate=True)
        for _ in range(3):
            p_loss(g(paddle.randn([4, 6]))).backward()
        g(paddle.randn([4, 6]))  # forward only: abandoned
        assert g.stats()["replays"] >= 2
        core = g._graphjit_core
        return [core, *(x for e in core.entries.values() for s in e.slots for x in (s.fwd, s.bwd))]

    assert freed_by_refcount(use)
