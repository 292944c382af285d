"""graphjit's batch copies (graphjit/batch_copy.py): the plumbing of pointers and sizes around a replay, on the CPU.

The library's kernel runs only on a GPU (tests/test_gpu_torch.py and tests/test_gpu_paddle.py run it); here a
stand-in with the library's C signature copies host memory with ``ctypes.memmove``, so the pointers, sizes and
entry order graphjit hands it are checked for real: a wrong pointer or size gives wrong outputs, not a skipped
assertion.  The CPU tensors play GPU ones through a stand-in of the framework's side (:class:`_CpuOperands`)."""

from __future__ import annotations

import ctypes
import logging
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import graphjit  # noqa: E402
from graphjit import batch_copy  # noqa: E402
from graphjit.backends.torch.copies import TorchOperands  # noqa: E402

pytestmark = pytest.mark.torch


class _CpuOperands(TorchOperands):
    """torch's operands, with dense CPU tensors standing in for one GPU's, inputs included."""

    inputs = True

    def target(self, t: Any) -> tuple[str, int] | None:
        if t.is_complex() or not t.is_contiguous():
            return None
        return "sm_test", 0

    def stream(self, device: int) -> Any:
        return lambda: 0


class _HostLibrary:
    """The library's ``copy_batch(n, dsts, srcs, bytes, device, stream)`` with memmove; ``fail`` makes it refuse."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.calls: list[int] = []

    def copy_batch(self, n: int, dsts: int, srcs: int, sizes: int, device: int, stream: int) -> int:
        """The C function's contract: three arrays of n entries, given by address."""
        if self.fail:
            return 2
        dst = (ctypes.c_uint64 * n).from_address(dsts)
        src = (ctypes.c_uint64 * n).from_address(srcs)
        size = (ctypes.c_int64 * n).from_address(sizes)
        for k in range(n):
            ctypes.memmove(dst[k], src[k], size[k])
        self.calls.append(n)
        return 0

    def last_error(self) -> str:
        return "the stand-in refused"


@pytest.fixture
def host_batches(emu, monkeypatch):
    lib = _HostLibrary()
    monkeypatch.setattr(type(emu), "batch_operands", lambda self: _CpuOperands(), raising=False)
    monkeypatch.setattr(batch_copy, "library", lambda arch, device: lib)
    return lib


def _step(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    h = a @ b + c
    return h * scale, (h.sum(0) - a[0]).to(torch.float64)


def _inputs(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(5, 7, generator=g), torch.randn(7, 7, generator=g), torch.randn(5, 7, generator=g)


def test_new_inputs_each_call_go_in_and_out_through_one_batch_each(host_batches):
    g = graphjit.graphed(_step)
    for seed in range(6):
        args = _inputs(seed)
        out = g(*args, 0.5)
        want = _step(*args, 0.5)
        assert all(torch.equal(o, w) for o, w in zip(out, want))
    st = g.stats()
    assert st["replays"] >= 3
    # each replay: one batch of the three moved inputs, one of the two outputs
    assert host_batches.calls.count(3) == st["replays"] and host_batches.calls.count(2) == st["replays"]
    # the outputs are fresh tensors: the next replay does not overwrite them
    first = g(*_inputs(10), 0.5)
    kept = [t.clone() for t in first]
    g(*_inputs(11), 0.5)
    assert all(torch.equal(a, b) for a, b in zip(first, kept))


def test_a_strided_input_and_an_input_in_place_go_the_framework_way(host_batches):
    g = graphjit.graphed(_step)
    for seed in range(3):
        g(*_inputs(seed), 2.0)
    before = host_batches.calls.count(3)
    a, b, c = _inputs(20)
    wide = torch.randn(7, 14)
    b_strided = wide[:, ::2]  # same shape and dtype, not dense: the framework copies it
    out = g(a, b_strided, c, 2.0)
    assert all(torch.equal(o, w) for o, w in zip(out, _step(a, b_strided, c, 2.0)))
    assert host_batches.calls.count(3) == before
    (sa, sb, _sc, _scale), _ = g.static_inputs(*_inputs(21), 2.0)
    sa.copy_(a)
    sb.copy_(b)
    out = g(sa, sb, c, 2.0)  # one moved input: a framework copy is one launch already
    assert all(torch.equal(o, w) for o, w in zip(out, _step(a, b, c, 2.0)))
    assert host_batches.calls.count(3) == before and 1 not in host_batches.calls


def test_one_tensor_passed_twice_is_copied_once(host_batches):
    def f(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return a * 2 + b, c - a

    g = graphjit.graphed(f)
    for seed in range(4):
        a, _b, c = _inputs(seed)
        out = g(a, a, c)
        assert all(torch.equal(o, w) for o, w in zip(out, f(a, a, c)))
    assert 2 in host_batches.calls and 3 not in host_batches.calls  # a (for both) and c


def test_a_failing_library_is_left_for_the_framework_copies_and_said_once(emu, monkeypatch, caplog):
    lib = _HostLibrary(fail=True)
    monkeypatch.setattr(type(emu), "batch_operands", lambda self: _CpuOperands(), raising=False)
    monkeypatch.setattr(batch_copy, "library", lambda arch, device: lib)
    monkeypatch.setattr(batch_copy, "_failed", {})
    g = graphjit.graphed(_step)
    with caplog.at_level(logging.INFO, logger="graphjit"):
        for seed in range(6):
            args = _inputs(seed)
            out = g(*args, 0.5)
            assert all(torch.equal(o, w) for o, w in zip(out, _step(*args, 0.5)))
    assert g.stats()["replays"] >= 3 and lib.calls == []
    said = [r for r in caplog.records if "no batch copies" in r.getMessage()]
    assert len(said) == 1 and "the stand-in refused" in said[0].getMessage()
    assert "sm_test" in batch_copy.status()["failed"]


def test_no_library_means_framework_copies(emu, monkeypatch):
    monkeypatch.setattr(type(emu), "batch_operands", lambda self: _CpuOperands(), raising=False)
    monkeypatch.setattr(batch_copy, "library", lambda arch, device: None)
    g = graphjit.graphed(_step)
    for seed in range(5):
        args = _inputs(seed)
        out = g(*args, 3.0)
        assert all(torch.equal(o, w) for o, w in zip(out, _step(*args, 3.0)))
    assert g.stats()["replays"] >= 2


def test_plan_takes_only_dense_tensors_of_one_device():
    ops = _CpuOperands()
    dense = [torch.zeros(3), torch.zeros(4)]
    assert batch_copy.Batch.plan(ops, dense) is not None
    assert batch_copy.Batch.plan(ops, dense[:1]) is None  # one copy: the framework's
    assert batch_copy.Batch.plan(None, dense) is None  # a framework without batch copies
    mixed = [*dense, torch.zeros(4, 4).t()]
    plan = batch_copy.Batch.plan(ops, mixed)
    assert plan is not None and plan.usable == [True, True, False]
    assert batch_copy.Batch.plan(ops, mixed, every=True) is None  # outputs: all or none
    assert batch_copy.Batch.plan(ops, [*dense, torch.zeros(2, dtype=torch.complex64)], every=True) is None
    assert batch_copy.Batch.plan(ops, [None, None, torch.zeros(2)]) is None  # buffers it never copies


def test_the_library_says_none_when_switched_off(monkeypatch):
    from graphjit import env

    monkeypatch.setenv("GRAPHJIT_BATCH_COPY", "off")
    env.refresh()
    try:
        assert batch_copy.library("sm_90", 0) is None
        assert batch_copy.status()["building"] == []  # off: nothing was built either
        monkeypatch.setenv("GRAPHJIT_BATCH_COPY", "sometimes")
        with pytest.raises(graphjit.ConfigError, match="GRAPHJIT_BATCH_COPY"):
            env.refresh()
    finally:
        monkeypatch.delenv("GRAPHJIT_BATCH_COPY")
        env.refresh()
