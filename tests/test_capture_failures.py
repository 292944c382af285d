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


def test_static_buffers_that_cannot_be_allocated_run_the_key_uncaptured():
    """A bucket whose padded input buffers cannot be allocated (here more memory than exists; on a GPU, any bucket
    whose buffers run the device out of memory): the call returns the eager result, and the key runs uncaptured
    with the reason, instead of the allocator's error on every call."""
    def f(x):
        return x * 2

    with emulated_torch():
        g = graphjit.graphed(f, buckets={"x": {0: [1 << 40]}})
        x = torch.ones(2, 2)
        for _ in range(4):
            assert torch.equal(g(x), x * 2)
    assert "static buffers failed" in g.stats()["fallbacks"], g.report()


def test_a_dump_folder_that_cannot_be_made_costs_the_dump_alone(tmp_path, monkeypatch, caplog):
    """GRAPHJIT_DUMP_DIR under a file (no folder can be made there): a warning, and the key captures and replays
    as without the variable (the folder's error escaped every call from the capturing one on, after the function
    had run)."""
    import graphjit.env

    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("GRAPHJIT_DUMP_DIR", str(blocker / "dots"))
    graphjit.env.refresh()
    acc = torch.zeros(1)

    def step(x):
        acc.add_(x)
        return acc * 1

    with emulated_torch(), caplog.at_level("WARNING", logger="graphjit"):
        g = graphjit.graphed(step)
        for i in range(5):
            assert g(torch.ones(1)).item() == i + 1.0
    assert g.stats()["replays"] >= 2 and "could not write the graph dump" in caplog.text, g.report()
