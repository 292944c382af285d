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

    def __init__(self, fail: int = 0) -> None:
        self.fail = fail  # the status to refuse with (0: copy)
        self.calls: list[int] = []
        self.attempts = 0

    def copy_batch(self, n: int, dsts: int, srcs: int, sizes: int, device: int, stream: int) -> int:
        """The C function's contract: three arrays of n entries, given by address."""
        self.attempts += 1
        if self.fail:
            return self.fail
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
    monkeypatch.setattr(type(emu), "feeds", False)  # the copies around a replay, not the graph's own (test_handoff)
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
    lib = _HostLibrary(fail=2)
    monkeypatch.setattr(type(emu), "batch_operands", lambda self: _CpuOperands(), raising=False)
    monkeypatch.setattr(batch_copy, "library", lambda arch, device: lib)
    monkeypatch.setattr(batch_copy, "_failed", {})
    g = graphjit.graphed(_step)
    with caplog.at_level(logging.INFO, logger="graphjit"):
        for seed in range(6):
            args = _inputs(seed)
            out = g(*args, 0.5)
            assert all(torch.equal(o, w) for o, w in zip(out, _step(*args, 0.5)))
    assert g.stats()["replays"] >= 3 and lib.attempts == 2  # refused once for the inputs, once for the outputs

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


def test_plan_takes_only_dense_tensors_of_one_device(monkeypatch):
    monkeypatch.setattr(batch_copy, "library", lambda arch, device: _HostLibrary())
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


def test_a_pending_cuda_error_leaves_that_call_to_the_framework_only(emu, monkeypatch):
    from graphjit.collectives.library import ERR_STATE

    lib = _HostLibrary(fail=ERR_STATE)
    monkeypatch.setattr(type(emu), "batch_operands", lambda self: _CpuOperands(), raising=False)
    monkeypatch.setattr(type(emu), "feeds", False)
    monkeypatch.setattr(batch_copy, "library", lambda arch, device: lib)
    g = graphjit.graphed(_step)
    for seed in range(5):
        args = _inputs(seed)
        assert all(torch.equal(o, w) for o, w in zip(g(*args, 0.5), _step(*args, 0.5)))
    tried = lib.attempts
    assert tried >= 2 * (g.stats()["replays"] - 1)  # asked again on every call: not switched off
    lib.fail = 0
    args = _inputs(9)
    assert all(torch.equal(o, w) for o, w in zip(g(*args, 0.5), _step(*args, 0.5)))
    assert lib.calls == [3, 2]


class _Table(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("table", torch.arange(4.0))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.table, x * 2


def test_a_returned_module_buffer_is_the_buffer_even_after_its_storage_moves(host_batches):
    """A module buffer returned as it is comes back as the buffer itself, as eager returns it (never copied, so
    never from the address the capture saw): rebinding its storage shows in the next call's result."""
    m = _Table()
    g = graphjit.graphed(m.forward)
    for _ in range(4):
        table, doubled = g(torch.ones(4))
        assert table is m.table and torch.equal(table, torch.arange(4.0))
        assert torch.equal(doubled, torch.full((4,), 2.0))
    m.table.data = torch.full((4,), 5.0)
    table, _ = g(torch.ones(4))
    assert table is m.table and torch.equal(table, torch.full((4,), 5.0))  # eager returns the buffer's new contents


def _head(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x[:2] * 10 + y


def test_a_view_into_another_inputs_buffer_is_read_before_that_buffer_is_written(host_batches):
    g = graphjit.graphed(_head)
    for _ in range(4):
        g(torch.randn(4), torch.randn(2))
    (sx, _sy), _ = g.static_inputs(torch.randn(4), torch.randn(2))
    sx.copy_(torch.tensor([0.0, 1.0, 2.0, 3.0]))
    y = sx[2:]  # inside x's buffer, which this call's new x overwrites
    x = torch.tensor([7.0, 8.0, 9.0, 9.0])
    want = _head(x, y.clone())
    got = g(x, y)
    assert torch.equal(got, want), (got, want)


def test_plain_bytes_refuses_lazy_bits_and_other_layouts():
    from graphjit.backends.torch.copies import OPERANDS, _plain_bytes

    z = torch.tensor([1 + 2j, 3 - 4j])
    assert _plain_bytes(torch.zeros(3)) and not _plain_bytes(z)
    assert not _plain_bytes(z.conj().imag)  # float32, contiguous, with the negative bit
    assert not _plain_bytes(torch.zeros(4, 4).t())
    assert not _plain_bytes(torch.eye(3).to_sparse())
    assert not _plain_bytes(torch._efficientzerotensor(3))
    assert OPERANDS.target(torch.zeros(3)) is None  # a CPU tensor: never a batch copy
    column = torch.zeros(100, 1)
    assert OPERANDS.empty_like(column).stride() == column.clone(memory_format=torch.contiguous_format).stride()


class _FakeLoaded:
    def __init__(self) -> None:
        self.preloaded: list[int] = []
        self.copy_batch = lambda *a: 0
        self.path = "fake"

    def copy_preload(self, device: int) -> None:
        self.preloaded.append(device)


@pytest.fixture
def fresh_loader(monkeypatch, tmp_path):
    """batch_copy's loader with an empty state, a library path under tmp_path and stand-ins for build and load."""
    from graphjit import env
    from graphjit.collectives import csrc_build
    from graphjit.collectives import library as csrc_library

    monkeypatch.setattr(batch_copy, "_ready", {})
    monkeypatch.setattr(batch_copy, "_building", set())
    monkeypatch.setattr(batch_copy, "_failed", {})
    path = tmp_path / "lib.so"
    built = _FakeLoaded()
    state = {"builds": 0, "fail": False}

    def build(arch: str, **_: Any) -> Any:
        state["builds"] += 1
        if state["fail"]:
            raise csrc_build.BuildError("nvcc was not found")
        path.write_text("built")
        return path

    monkeypatch.setattr(csrc_library, "library_path", lambda arch, cache=None, sources=None: path)
    monkeypatch.setattr(csrc_build, "build", build)
    monkeypatch.setattr(csrc_library, "load", lambda arch, **_: built)
    yield state, built, path
    monkeypatch.delenv("GRAPHJIT_BATCH_COPY", raising=False)
    env.refresh()


def test_auto_builds_in_the_background_and_a_later_capture_loads(fresh_loader, monkeypatch):
    from graphjit import env

    state, built, path = fresh_loader
    monkeypatch.setenv("GRAPHJIT_BATCH_COPY", "auto")
    env.refresh()
    assert batch_copy.library("sm_x", 0) is None  # not built: a build starts, the call goes on without it
    for _ in range(200):
        if not batch_copy.status()["building"]:
            break
        import time

        time.sleep(0.01)
    assert state["builds"] == 1 and path.is_file() and batch_copy.loaded("sm_x", 0) is None  # replays load nothing
    assert batch_copy.library("sm_x", 0) is built and built.preloaded == [0]
    assert batch_copy.loaded("sm_x", 0) is built and batch_copy.status()["ready"] == ["sm_x/cuda:0"]


def test_on_builds_at_once_and_a_failed_build_is_said_and_never_tried_again(fresh_loader, monkeypatch):
    from graphjit import env

    state, built, _path = fresh_loader
    monkeypatch.setenv("GRAPHJIT_BATCH_COPY", "on")
    env.refresh()
    state["fail"] = True
    assert batch_copy.library("sm_y", 0) is None and batch_copy.never("sm_y")
    assert "nvcc was not found" in batch_copy.status()["failed"]["sm_y"]
    assert batch_copy.library("sm_y", 0) is None and state["builds"] == 1
    assert batch_copy.Batch.plan(_CpuOperands(), [torch.zeros(2), torch.zeros(2)]) is None  # sm_test fails too
    state["fail"] = False
    assert batch_copy.library("sm_z", 1) is built and built.preloaded == [1] and state["builds"] == 3
