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


def test_inside_an_autocast_block_switched_off_the_capture_keeps_no_cast_cache():
    """The outer block's casts stay cached while an inner ``enabled=False`` block runs, and a block the function
    enters takes them: the cache is off for the capture there too."""
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.autocast("cpu", enabled=False):
        with autocast_cache_off():
            assert not torch.is_autocast_cache_enabled()
        assert torch.is_autocast_cache_enabled()


def test_a_graph_captured_inside_a_switched_off_block_reads_no_cast_of_the_callers(emu):
    """End to end on the CPU stand-in (from a review): the caller's autocast cached W's bf16 cast, then switched
    autocast off around the graphed calls; the function enters autocast itself.  A capture that read the cached
    cast kept reading it after W changed (an optimizer step after the caller's block): 3.4 off eager."""
    import graphjit

    weight = torch.nn.Parameter(torch.randn(4, 4, generator=torch.Generator().manual_seed(0)))

    def body(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return torch.mm(x, weight).float()

    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        f = graphjit.graphed(body)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            torch.mm(x, weight)  # the caller's own autocast: the weight's bf16 cast cached
            with torch.autocast("cpu", enabled=False):
                for _ in range(4):
                    f(x)
        weight.mul_(2.0)
        got = f(x)
        assert f.stats()["replays"] >= 2
        assert torch.equal(got, body(x))


def test_a_default_dtype_set_after_the_capture_is_another_key(emu):
    """``torch.ones(3)`` inside the function makes the default dtype: a graph froze the one of its capture, so a call
    under another default dtype is another key (its own warmup and graph), never the old graph."""
    import graphjit

    f = graphjit.graphed(lambda x: x + torch.ones(3))
    x = torch.ones(3)
    try:
        for i in range(8):
            if i == 4:
                torch.set_default_dtype(torch.float64)
            got, want = f(x), x + torch.ones(3)
            assert got.dtype == want.dtype and torch.equal(got, want), (i, f.report())
        assert f.stats()["graphs"] == 2 and "default dtype float64" in f.report(), f.report()
    finally:
        torch.set_default_dtype(torch.float32)


def test_a_default_device_set_after_the_capture_is_another_key(emu):
    """``torch.set_default_device`` (or a ``torch.device`` block) decides where ``torch.zeros(3)`` is made: a graph
    froze the device of its capture, so a call under another default device is another key, never the old graph."""
    import graphjit

    def body(x):
        return x * 2, torch.zeros(3)

    f = graphjit.graphed(body)
    x = torch.ones(3)
    try:
        for i in range(8):
            if i == 4:
                torch.set_default_device("meta")
            got, want = f(x), body(x)
            assert [t.device for t in got] == [t.device for t in want], (i, f.report())
    finally:
        torch.set_default_device(None)
    with torch.device("meta"):
        assert f(x)[1].device.type == "meta"
    assert f(x)[1].device.type == "cpu"
    assert "default device meta" in f.report(), f.report()


@pytest.mark.parametrize("flag, off, label", [
    ("cuda.matmul.allow_bf16_reduced_precision_reduction", False, "cuBLAS bf16 reduction off"),
    ("cuda.matmul.allow_fp16_reduced_precision_reduction", False, "cuBLAS fp16 reduction off"),
    ("cudnn.allow_tf32", False, "cuDNN tf32 off"),
    ("cudnn.deterministic", True, "cuDNN deterministic on"),
    ("cudnn.enabled", False, "cuDNN off"),
])
def test_a_kernel_flag_set_after_the_capture_is_another_key(emu, flag, off, label):
    """A graph froze the kernels its capture chose (a bf16 GEMM's reduction, cuDNN's algorithm): a call after
    ``torch.backends...`` changed the flag is another key (its own warmup and graph), never the old graph; back to
    the flag of the first capture, the first graph replays again."""
    import graphjit

    owner_name, _, attr = flag.rpartition(".")
    owner = torch.backends
    for part in owner_name.split("."):
        owner = getattr(owner, part)
    before = getattr(owner, attr)
    f = graphjit.graphed(lambda x: x * 2)
    x = torch.ones(3)
    try:
        for _ in range(4):
            f(x)
        assert f.stats()["graphs"] == 1
        setattr(owner, attr, off)
        for _ in range(4):
            assert torch.equal(f(x), x * 2)
        assert f.stats()["graphs"] == 2 and label in f.report(), f.report()
    finally:
        setattr(owner, attr, before)
    replays = f.stats()["replays"]
    f(x)
    assert f.stats()["graphs"] == 2 and f.stats()["replays"] == replays + 1


def test_the_lane_check_refuses_a_call_under_other_kernel_flags(lane_on):
    """The replay lane's C check reads the same flags (a shortcut to the key the Python path gives, never looser)."""
    from graphjit.keys import Signer

    x = torch.ones(3)
    signer = Signer(lambda x: x * 2, None, "auto", "f")
    for _ in range(3):
        key = signer.sign(None, (x,), {}).key
    assert signer._fast, "the lane is loaded: the signer's layout has its C check"
    check = signer._fast[0]
    assert check(None, (x,)) is not None
    before = torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    try:
        assert check(None, (x,)) is None
        assert signer.sign(None, (x,), {}).key != key
    finally:
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = before
    assert check(None, (x,)) is not None


def test_paddles_modes_hold_its_default_dtype():
    paddle = pytest.importorskip("paddle")
    from graphjit.backends import get

    b = get("paddle")
    before = b.modes()
    paddle.set_default_dtype("float64")
    try:
        assert b.modes() != before and "default dtype float64" in b.describe_modes(b.modes())
    finally:
        paddle.set_default_dtype("float32")
    assert b.modes() == before and "default dtype" not in b.describe_modes(before)
