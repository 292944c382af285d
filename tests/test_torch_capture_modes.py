"""The framework modes a torch capture changes for itself: the autocast cast cache is off inside a capture only where
autocast is on (CPU tests of the helper the real capture and tests/graph_emulator.py both use)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from graphjit.backends.torch.graphs import autocast_cache_off  # noqa: E402

pytestmark = pytest.mark.torch


def test_without_autocast_the_cache_flag_is_left_alone():
    assert torch.is_autocast_cache_enabled()
    with autocast_cache_off():
        assert torch.is_autocast_cache_enabled()
    assert torch.is_autocast_cache_enabled()


def test_under_autocast_the_capture_keeps_no_cast_cache_and_the_flag_comes_back():
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with autocast_cache_off():
            assert not torch.is_autocast_cache_enabled()
        assert torch.is_autocast_cache_enabled()
        with pytest.raises(ValueError), autocast_cache_off():
            raise ValueError("the function's own error")
        assert torch.is_autocast_cache_enabled()


def test_a_compiled_function_is_not_recompiled_by_a_capture_without_autocast():
    """The flag is in the global state Dynamo's guards check: a capture that flipped it made ``tracer="compile"``
    compile again inside the capture (found on the H200 with T5 and Gemma 3)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()

    @torch.compile(backend="eager")
    def f(x):
        return x * 2 + 1

    x = torch.ones(4)
    f(x)
    compiled = counters["stats"]["unique_graphs"]
    with autocast_cache_off():  # what a capture does around the function
        assert torch.equal(f(x), torch.full((4,), 3.0))
    assert counters["stats"]["unique_graphs"] == compiled
    torch.set_autocast_cache_enabled(False)  # what every capture did before: Dynamo compiles again
    try:
        f(x)
    finally:
        torch.set_autocast_cache_enabled(True)
    assert counters["stats"]["unique_graphs"] == compiled + 1
