"""The dtype of the product that primes torch's cuBLASLt workspace of graphjit's capture stream
(``backends/torch/workspaces.py``): the dtype the function computes in, so that the first capture of a process loads no
kernels of a dtype the function never uses (85 ms for fp32 against 4 ms in bf16 on an H100, where the function computes
in bf16).  The priming itself runs on a GPU only (``test_the_first_capture_of_a_process_leaves_no_blas_workspace_in_
its_pool`` in the GPU tests)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import graphjit  # noqa: E402
from graphjit.backends.torch.workspaces import product_dtype  # noqa: E402

pytestmark = pytest.mark.torch


def test_the_dtype_holding_the_most_bytes_is_chosen():
    weights = [torch.zeros(64, 64, dtype=torch.bfloat16) for _ in range(3)]
    buffers = [torch.zeros(64, dtype=torch.float32), torch.zeros(1000, dtype=torch.int64)]  # ints are no operand
    assert product_dtype(lambda: [*buffers, *weights], "cpu") is torch.bfloat16
    assert product_dtype(lambda: [torch.zeros(10, dtype=torch.float16), torch.zeros(100)], "cpu") is torch.float32


def test_no_choice_without_operands_of_a_product_dtype_or_when_asking_fails():
    """None: the priming computes in fp32 and a later capture of the device may still choose."""
    assert product_dtype(None, "cpu") is None
    assert product_dtype(lambda: [torch.zeros(8, dtype=torch.float64), torch.zeros(8, dtype=torch.int32)],
                         "cpu") is None

    def fails():
        yield torch.zeros(4, dtype=torch.bfloat16)
        raise RuntimeError("no size")

    assert product_dtype(fails, "cpu") is None


def test_autocast_decides_where_it_is_on():
    """Under autocast fp32 weights multiply in autocast's dtype: that is the product to prime with."""
    weights = [torch.zeros(64, 64)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert product_dtype(lambda: weights, "cpu") is torch.bfloat16
        assert product_dtype(None, "cpu") is torch.bfloat16
    assert product_dtype(lambda: weights, "cpu") is torch.float32


def test_tensors_on_another_device_do_not_count():
    meta = torch.empty(1 << 20, dtype=torch.float16, device="meta")
    assert product_dtype(lambda: [meta, torch.zeros(4, dtype=torch.bfloat16)], "cpu") is torch.bfloat16


def test_the_capture_is_given_the_functions_inputs_and_reachable_state(emu, monkeypatch):
    """What the backend is asked for before the capture: the static inputs and what the function reaches (a closure's
    bf16 weights here), so the priming computes in bf16 although the rmsnorm part computes in fp32."""
    seen: list[list[object]] = []
    real = type(emu).capture_graph

    def capture_graph(self, fn, device, pool, debug, feed=False, operands=None):
        assert operands is not None
        seen.append(list(operands()))
        return real(self, fn, device, pool, debug, feed=feed, operands=operands)

    monkeypatch.setattr(type(emu), "capture_graph", capture_graph)
    weights = [torch.randn(32, 32).to(torch.bfloat16) for _ in range(2)]
    scale = torch.ones(32)  # an fp32 buffer, fewer bytes than the weights

    def step(x):
        for w in weights:
            x = (x.float() * scale).to(torch.bfloat16) @ w
        return x

    f = graphjit.graphed(step)
    x = torch.randn(4, 32).to(torch.bfloat16)
    with torch.no_grad():
        for _ in range(3):
            out = f(x)
    assert f.stats()["graphs"] == 1
    assert torch.equal(out, step(x))
    ids = {id(t) for t in seen[0]}
    assert all(id(w) in ids for w in weights) and id(scale) in ids
    assert any(t.shape == x.shape and t.dtype == x.dtype for t in seen[0])  # the static input buffer
    assert product_dtype(lambda: seen[0], "cpu") is torch.bfloat16


def test_a_graphed_layers_captures_are_given_its_inputs_and_parameters(monkeypatch):
    """The training path too: a bf16 layer's captures are asked with its static inputs and its trainable parameters,
    so its first capture primes in bf16 (on a CPU the simulated capture stands in for the backend's: what it is given
    is what ``Backend.capture`` gets on a GPU)."""
    from graphjit.training.record import SlotRecorder

    seen: list[list[object]] = []
    real = SlotRecorder.capture_fn

    def capture_fn(self, device, debug, operands=None):
        assert operands is not None
        seen.append(list(operands()))
        return real(self, device, debug, operands)

    monkeypatch.setattr(SlotRecorder, "capture_fn", capture_fn)
    torch.manual_seed(0)
    layer = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.SiLU(), torch.nn.Linear(32, 8)).to(torch.bfloat16)
    g = graphjit.graphed_layer(layer, warmup=1, _simulate=True)
    x = torch.randn(4, 16).to(torch.bfloat16)
    for _ in range(3):
        g(x).float().sum().backward()
    assert g.stats()["graphs"] >= 1, g.report()
    assert len(seen) == 1  # one slot: its forward's and backward's captures share the call
    ids = {id(t) for t in seen[0]}
    assert all(id(p) in ids for p in layer.parameters())
    assert any(t.shape == x.shape and t.dtype == x.dtype for t in seen[0])  # the static input buffer
    assert product_dtype(lambda: seen[0], "cpu") is torch.bfloat16
