"""A capture that fails runs the call uncaptured, with the reason counted (CPU, through the emulated CUDA graph of
tests/graph_emulator.py; on a GPU, with what the failure leaves in torch: tests/test_gpu_health.py)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from graph_emulator import emulated_torch  # noqa: E402

import graphjit  # noqa: E402
from graphjit import scope  # noqa: E402

pytestmark = pytest.mark.torch


def test_the_functions_own_exception_while_captured_runs_the_call_eagerly():
    """An exception only the capture sees (the function looks at something that differs under capture) is a
    capture failure: that call and the later ones run eagerly, as their eager calls would not raise."""
    w = torch.randn(4, 4)

    def step(x):
        if scope.phase() == "capture":  # what torch.cuda.is_current_stream_capturing() tells on a GPU
            raise ValueError("not while captured")
        return x @ w + 1

    xs = [torch.randn(2, 4) for _ in range(5)]
    with emulated_torch():
        g = graphjit.graphed(step)
        got = [g(x) for x in xs]
    assert all(torch.equal(a, x @ w + 1) for a, x in zip(got, xs))
    st = g.stats()
    assert st["graphs"] == 0 and st["fallbacks"] == {"the function raised ValueError during capture": 3}, st
    assert "not while captured" in st["keys"][0]["detail"] and "test_capture_failures.py" in st["keys"][0]["detail"]


def test_strict_mode_raises_the_capture_failure_after_the_eager_run():
    def step(x):
        if scope.phase() == "capture":
            raise ValueError("not while captured")
        return x * 2

    with emulated_torch():
        g = graphjit.graphed(step, strict=True)
        g(torch.ones(2))
        g(torch.ones(2))
        with pytest.raises(graphjit.CaptureError, match="raised ValueError") as info:
            g(torch.ones(2))
    assert info.value.executed and torch.equal(info.value.result, torch.full((2,), 2.0))
