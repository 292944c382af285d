"""GPU tests, Paddle: every @graphed call acts like exactly one eager call, with real CUDA graphs
through the Paddle GPU kit (make test-gpu-paddle).

The kit's paddlepaddle-gpu 2.6.2 computes only matmul and copies right on Hopper, so the state here is
advanced by a matmul with a cyclic shift (a permutation: exact in fp32 and TF32 for small integers) and
written back with ``paddle.assign`` / ``Tensor.copy_``; every check is in numpy.  After n calls the
state is the start shifted n places: a call that ran its work twice (or not at all) shows.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest
from unseen import Unseen

import graphjit

pytestmark = [pytest.mark.gpu, pytest.mark.paddle]

os.environ.setdefault("MIN_GRAPH_SIZE", "0")  # SOT compiles even these small functions

paddle = pytest.importorskip("paddle")

N = 64


def T(a: np.ndarray):
    return paddle.to_tensor(np.ascontiguousarray(a, dtype=np.float32), place=paddle.CUDAPlace(0))


def shift() -> np.ndarray:
    return np.roll(np.eye(N, dtype=np.float32), 1, axis=1)  # x @ shift moves every entry one place right


def start() -> np.ndarray:
    return (np.arange(N, dtype=np.float32) % 17).reshape(1, N)  # small integers: exact under TF32


def after(n: int) -> np.ndarray:
    return np.roll(start(), n, axis=1)


_S: dict[str, object] = {}  # module level: the AST tracer cannot see closure variables


@pytest.mark.parametrize("tracer", ["eager", "sot"])
def test_closed_over_state_advances_exactly_once_per_call(tracer):
    _S["state"], _S["shift"] = T(start()), T(shift())

    def step(x):
        new = paddle.matmul(_S["state"], _S["shift"])
        paddle.assign(new, _S["state"])  # in place: the state advances one place per call
        return paddle.matmul(new, x)

    g = graphjit.graphed(step, tracer=tracer)
    eye = np.eye(N, dtype=np.float32)
    with paddle.no_grad():
        for n in range(1, 21):
            out = g(T(eye)).numpy()
            assert np.array_equal(out, after(n)), (tracer, n)
            assert np.array_equal(_S["state"].numpy(), after(n)), (tracer, n)
    s = g.stats()
    assert s["graphs"] == 1 and s["replays"] == 18 and not s["fallbacks"], s
    assert s["keys"][0]["verify"] == "passed", s


def test_inside_capture_scope_and_after_a_failed_verify():
    _S["state"], _S["shift"] = T(start()), T(shift())
    turns = Unseen()  # a host value no guard sees: verify is what catches it

    def step(x):
        new = paddle.matmul(_S["state"], _S["shift"])
        paddle.assign(new, _S["state"])
        return paddle.matmul(new, x)

    g = graphjit.graphed(step, tracer="eager")
    eye = np.eye(N, dtype=np.float32)
    with paddle.no_grad():
        with graphjit.capture_scope(progress=False):
            g(T(eye))
        assert np.array_equal(_S["state"].numpy(), after(1))  # the scope's call ran once
        for n in range(2, 11):
            assert np.array_equal(g(T(eye)).numpy(), after(n)), n
    assert g.stats()["replays"] == 9

    _S["state"] = T(start())
    leaky_w = [T(np.eye(N, dtype=np.float32)), T(np.eye(N, dtype=np.float32) * 2)]

    def leaky(x):
        new = paddle.matmul(_S["state"], _S["shift"])
        paddle.assign(new, _S["state"])
        return paddle.matmul(paddle.matmul(new, x), leaky_w[next(turns) % 2])  # a Python value the graph freezes

    f = graphjit.graphed(leaky, tracer="eager")
    with paddle.no_grad():
        for n in range(1, 9):
            f(T(eye))
            assert np.array_equal(_S["state"].numpy(), after(n)), n
    assert f.stats()["keys"][0]["verify"] == "failed"


@dataclasses.dataclass
class Holder:
    state: object
    label: str = "s"


def test_an_argument_object_that_holds_tensors():
    sh = T(shift())

    def step(x, holder):
        new = paddle.matmul(holder.state, sh)
        holder.state.copy_(new, False)  # Paddle's copy_ bumps no version counter: found by contents
        return paddle.matmul(new, x)

    g = graphjit.graphed(step, tracer="eager")
    h = Holder(T(start()))
    eye = np.eye(N, dtype=np.float32)
    with paddle.no_grad():
        for n in range(1, 11):
            assert np.array_equal(g(T(eye), h).numpy(), after(n)), n
        assert np.array_equal(h.state.numpy(), after(10))
        other = Holder(T(start()))  # same shapes: same key, its tensor copied in and back
        for n in range(1, 4):
            assert np.array_equal(g(T(eye), other).numpy(), after(n)), n
        assert np.array_equal(other.state.numpy(), after(3)) and np.array_equal(h.state.numpy(), after(10))
    s = g.stats()
    assert s["graphs"] == 1 and not s["fallbacks"], s
    assert "holder.state[1, 64]" in s["keys"][0]["key"]


def test_a_rebinding_and_random_draws_run_uncaptured_with_their_reasons():
    sh = T(shift())

    def rebinds(holder):
        holder.state = paddle.matmul(holder.state, sh)  # a new tensor every call
        return holder.state

    g = graphjit.graphed(rebinds, tracer="eager")
    h = Holder(T(start()))
    with paddle.no_grad():
        for n in range(1, 6):
            assert np.array_equal(g(h).numpy(), after(n))
    assert g.stats()["fallbacks"] == {"rebinds a tensor held by an object": 5}
    assert "argument 'holder'.state" in g.report()

    noisy = graphjit.graphed(lambda x: paddle.matmul(x, paddle.rand([N, N])), tracer="eager")
    with paddle.no_grad():
        for _ in range(4):
            noisy(T(np.eye(N, dtype=np.float32)))  # values unchecked: the kit's Paddle draws garbage on Hopper
    st = noisy.stats()
    assert st["graphs"] == 0 and st["fallbacks"] == {"draws random numbers": 4}, st
