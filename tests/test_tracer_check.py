"""A translating tracer is checked against the Python function on the first call of each key (Paddle's sot and
ast; graphjit.tracer_check): where its program computes other results, the function is traced with "eager"
from then on, the reason is in report(), and every call still acts like one eager call.

paddlepaddle 2.6's SOT drops an in-place ``paddle.assign(value, state)`` into a tensor reached through a global
(CI runs this file under 2.6.2 too); a tracer made wrong on purpose shows the mechanism on any Paddle."""

from __future__ import annotations

import os

import numpy as np
import pytest

paddle = pytest.importorskip("paddle")

import graphjit  # noqa: E402
from graphjit import backends  # noqa: E402

pytestmark = pytest.mark.paddle
os.environ.setdefault("MIN_GRAPH_SIZE", "0")

N = 16
_S: dict = {}


def _step(x):
    paddle.assign(paddle.matmul(_S["state"], _S["a"]), _S["state"])
    return paddle.matmul(x, _S["state"])


def _run(fn, calls: int = 5):
    rng = np.random.default_rng(0)
    _S["state"] = paddle.to_tensor(rng.standard_normal((N, N)).astype(np.float32))
    _S["a"] = paddle.to_tensor((np.eye(N) + rng.standard_normal((N, N)) / N).astype(np.float32))
    xs = [paddle.to_tensor(rng.standard_normal((N, N)).astype(np.float32)) for _ in range(calls)]
    with paddle.no_grad():
        outs = [fn(x).numpy() for x in xs]
    return outs, _S["state"].numpy()


def test_the_default_tracer_gives_the_python_functions_results_for_in_place_global_state():
    want, want_state = _run(_step)
    g = graphjit.graphed(_step)  # tracer "sot"
    got, state = _run(g)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(state, want_state, rtol=1e-5, atol=1e-5)
    if paddle.__version__.startswith("2.6"):
        assert 'tracer="sot" replaced by "eager"' in (g.stats()["tracer"] or ""), g.stats()
        assert "global '_S'['state']" in g.report()


def test_a_tracer_that_computes_wrong_results_is_replaced_on_the_first_call(monkeypatch):
    b = backends.get("paddle")
    real = type(b).trace

    def wrong(self, fn, tracer):
        traced = real(self, fn, tracer)
        if tracer == "eager":
            return traced
        return lambda *a, **k: traced(*a, **k) * 2  # a translator's bug, made on purpose

    monkeypatch.setattr(type(b), "trace", wrong)
    monkeypatch.setattr(b, "checked_tracers", ("sot",))  # Paddle 3.x checks no tracer of its own
    calls = {"n": 0}

    def step(x):
        calls["n"] += 1
        return paddle.matmul(x, x)

    g = graphjit.graphed(step, tracer="sot")
    x = paddle.to_tensor(np.eye(4, dtype=np.float32) * 3)
    with paddle.no_grad():
        outs = [g(x).numpy() for _ in range(3)]
    assert all(np.array_equal(o, np.eye(4, dtype=np.float32) * 9) for o in outs), outs
    st = g.stats()
    assert st["tracer"] and "output 0 differs" in st["tracer"], st
    assert "tracer: paddle tracer=\"sot\" replaced" in g.report()
    # the first call ran the traced function once more, its writes and Python effects (this count) put back, then
    # the Python function: three calls counted once each
    assert calls["n"] == 3
