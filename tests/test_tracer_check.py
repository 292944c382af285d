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


def test_a_parameter_the_function_writes_is_written_once_on_a_keys_first_call(monkeypatch, caplog):
    """The traced run's writes are put back before the call's own run, parameters included where all of the state
    fits in half of GRAPHJIT_VERIFY_MAX_BYTES: a function that decays a weight in place (paddle.assign into the
    Parameter) leaves it as eager calls do, every output equals eager's, and no tracer is blamed for the difference
    it made itself (before, parameters were never put back: the first call of a key decayed the weight twice).
    paddle 2.6's sot does drop this assign (from the second call of the code on): the check now compares the weight
    and finds that.  Where the parameters do not fit, they are not put back, and a parameter the function writes
    replaces the tracer by eager, named in a warning (once)."""
    b = backends.get("paddle")
    monkeypatch.setattr(b, "checked_tracers", ("sot",))  # Paddle 3.x checks no tracer of its own: check it here
    buggy_sot = paddle.__version__.startswith("2.6")

    def model_and_step():
        paddle.seed(0)
        m = paddle.nn.Linear(8, 8)

        def step(x):
            y = m(x)
            paddle.assign(m.weight * 0.9, m.weight)
            return y

        return m, step

    rng = np.random.default_rng(0)
    xs = [paddle.to_tensor(rng.standard_normal((4, 8)).astype(np.float32)) for _ in range(4)]
    want_m, want_step = model_and_step()
    with paddle.no_grad():
        want = [want_step(x).numpy() for x in xs]
    m, step = model_and_step()
    g = graphjit.graphed(step, tracer="sot")
    with caplog.at_level("WARNING", logger="graphjit"), paddle.no_grad():
        got = [g(x).numpy() for x in xs]
    for a, w in zip(got, want):
        np.testing.assert_allclose(a, w, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(m.weight.numpy(), want_m.weight.numpy(), rtol=1e-6, atol=1e-6)
    replaced = g.stats()["tracer"]
    if buggy_sot:
        assert replaced and "the write to closure variable 'm'.weight differs" in replaced, replaced
    else:
        assert replaced is None, replaced  # nothing blamed on a tracer that computed right
    assert not [r for r in caplog.records if "may have written the parameter twice" in r.getMessage()]

    # half of the budget holds the input (4 x 8 floats: 128 bytes), not the parameters (weight and bias: 288): the
    # parameters are not put back, and the function writing one replaces the tracer, named in one warning
    monkeypatch.setenv("GRAPHJIT_VERIFY_MAX_BYTES", "256")
    from graphjit import env

    env.refresh()
    caplog.clear()
    m, step = model_and_step()
    g = graphjit.graphed(step, tracer="sot")
    with caplog.at_level("WARNING", logger="graphjit"), paddle.no_grad():
        for x in xs[:3]:
            g(x)
    said = [r.getMessage() for r in caplog.records if "may have written the parameter twice" in r.getMessage()]
    assert len(said) == 1 and "writes closure variable 'm'.weight" in said[0] and 'tracer="eager"' in said[0], said
    assert "writes closure variable 'm'.weight" in (g.stats()["tracer"] or ""), g.stats()["tracer"]
