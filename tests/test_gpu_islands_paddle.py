"""GPU tests, Paddle: piecewise capture with real CUDA graphs through the Paddle GPU kit (make
test-gpu-paddle).  The kit's paddlepaddle-gpu 2.6.2 computes only matmul and copies right on Hopper, so
the segments are matmuls with a cyclic shift (exact for small integers) and the island reads a per-call
host value and does its work with numpy (host copies: a sync, fine in an island); every check is in numpy.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import graphjit

pytestmark = [pytest.mark.gpu, pytest.mark.paddle]

os.environ.setdefault("MIN_GRAPH_SIZE", "0")

paddle = pytest.importorskip("paddle")

N = 64
_S: dict[str, object] = {}


def T(a: np.ndarray):
    return paddle.to_tensor(np.ascontiguousarray(a, dtype=np.float32), place=paddle.CUDAPlace(0))


def shift() -> np.ndarray:
    return np.roll(np.eye(N, dtype=np.float32), 1, axis=1)


def start() -> np.ndarray:
    return (np.arange(N, dtype=np.float32) % 17).reshape(1, N)


@graphjit.eager
def rotate_by(h, meta):
    """Roll ``h`` by the call's own amount (a host int in the dynamic metadata), on the host."""
    out = np.roll(h.numpy(), meta["k"], axis=1)
    return paddle.to_tensor(out, place=h.place)


@pytest.mark.parametrize("tracer", ["eager", "sot"])
def test_matmul_segments_around_an_island(tracer):
    _S["state"], _S["shift"] = T(start()), T(shift())

    def step(x, meta):
        new = paddle.matmul(_S["state"], _S["shift"])
        paddle.assign(new, _S["state"])  # the state advances one place per call (segment 0)
        h = rotate_by(paddle.matmul(new, x), meta)  # the island: its own roll, different every call
        return paddle.matmul(h, _S["shift"])  # segment 1

    g = graphjit.graphed(step, tracer=tracer, dynamic=("meta",))
    eye = np.eye(N, dtype=np.float32)
    state = start()
    with paddle.no_grad():
        for n in range(1, 21):
            k = (3 * n) % 7
            state = np.roll(state, 1, axis=1)
            want = np.roll(np.roll(state, k, axis=1), 1, axis=1)
            got = g(T(eye), {"k": k}).numpy()
            assert np.array_equal(got, want), (tracer, n)
            assert np.array_equal(_S["state"].numpy(), state), (tracer, n)
    s = g.stats()
    assert s["graphs"] == 1 and not s["fallbacks"], s
    key = s["keys"][0]
    assert key["segments"] == 2 and key["islands"] == 1 and key["verify"].startswith("passed"), key
    assert s["replays"] == 18
