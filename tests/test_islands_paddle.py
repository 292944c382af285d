"""Islands and dynamic arguments with Paddle on the CPU: SOT breaks its graph at an island (the island runs
eagerly, syncs included), ``dynamic=`` is validated and leaves the key alone, and the sync watch lets
islands sync and names the function of a sync elsewhere.  Paddle captures need a GPU: the piecewise
replay itself is in tests/test_gpu_islands_paddle.py."""

from __future__ import annotations

import numpy as np
import pytest

paddle = pytest.importorskip("paddle")

import graphjit  # noqa: E402
from graphjit import backends  # noqa: E402
from graphjit.islands import island_of  # noqa: E402
from graphjit.sites import with_function  # noqa: E402

pytestmark = pytest.mark.paddle


@pytest.mark.parametrize("tracer", ["sot", "eager"])
def test_an_island_runs_eagerly_under_the_tracer(tracer):
    seen: list[float] = []

    @graphjit.eager
    def scale(h):
        m = float(h.abs().max())  # a host sync: SOT (2.6) fails on it unless the call is a graph break
        seen.append(m)
        return h / m

    def step(x):
        return scale(x * 2) + 1

    g = graphjit.graphed(step, tracer=tracer)
    for i in range(4):
        x = paddle.to_tensor(np.arange(1, 4, dtype="float32") * (i + 1))
        got = g(x).numpy()
        want = (x.numpy() * 2) / float(np.abs(x.numpy() * 2).max()) + 1
        np.testing.assert_allclose(got, want, rtol=1e-6)
    # the island's Python ran on every call (and once more in the first, where Paddle 2.x's SOT is checked: that
    # run's Python effects, this list's append among them, are put back with its tensors)
    assert len(seen) == 4
    assert island_of(scale) is not None


def test_dynamic_argument_leaves_the_key_alone():
    @graphjit.eager
    def pick(h, lens):
        return h[: len(lens)].sum(0)

    def step(x, lens):
        return pick(x + 1, lens)

    g = graphjit.graphed(step, dynamic=("lens",), tracer="eager")
    for n in range(1, 6):
        x = paddle.ones([6, 2])
        np.testing.assert_allclose(g(x, list(range(n))).numpy(), np.full(2, 2.0 * n))
    assert len(g.stats()["keys"]) == 1


def test_dynamic_is_validated():
    def step(x, meta):
        return x

    with pytest.raises(graphjit.ConfigError, match="does not have"):
        graphjit.graphed(step, dynamic=("lens",))
    with pytest.raises(graphjit.ConfigError, match="both dynamic and buckets"):
        graphjit.graphed(step, dynamic=("meta",), buckets={"meta": {0: [4]}})


def test_sync_watch_lets_islands_sync_and_names_the_function_elsewhere():
    b = backends.get("paddle")
    hits: list[str] = []

    def users_code():
        paddle.to_tensor([1.0])  # one of the host copies the watch records (on any device)

    with b.sync_watch(hits):
        with b.island_guard():
            paddle.to_tensor([2.0])  # inside an island: allowed, not recorded
        users_code()
    assert len(hits) == 1
    assert "test_islands_paddle.py" in hits[0]
    assert with_function(hits[0]).endswith("in users_code()")


@graphjit.eager
def _double(h):
    return h * 2


def _ast_step(x):  # module level: Paddle 2.6's AST tracer cannot see closure variables
    return _double(x) + 1


def test_the_ast_tracer_refuses_islands_clearly():
    """A static program runs no Python, so it cannot run an island on every call: translating one that calls an
    island (``tracer="ast"``'s program, made for a key's warmup where CUDA graphs exist) is a ConfigError naming the
    tracers that can.  On a CPU, where every call is uncaptured, ``tracer="ast"`` runs the Python function (a static
    program keeps the Python values it was translated with), island included."""
    g = graphjit.graphed(_ast_step, tracer="ast")
    assert float(g(paddle.ones([2])).numpy()[0]) == 3.0
    with pytest.raises(graphjit.ConfigError, match=r"static program.*tracer='sot'"):
        backends.get("paddle").trace(_ast_step, "ast")(paddle.ones([2]))
