"""graphed_layer on the CPU (CI): the state machine, FIFO order, errors, and gradients equal to eager.

Two paths run here.  The real no-CUDA path (the layer runs eagerly, one INFO line).  And the
simulated-graph path (``_simulate=True``): every static buffer, slot, copy, FIFO check and gradient
hand-over of the graphed path runs, but a "replay" re-runs the layer instead of a CUDA graph, so the
bookkeeping is tested against eager on a machine without a GPU.
"""

from __future__ import annotations

import copy
import gc
import logging
import random
import re

import numpy as np
import pytest

import graphjit
from graphjit import BackwardOrderError, CaptureError, ConfigError, UnsupportedOutputError

torch = pytest.importorskip("torch")


def torch_cuda() -> bool:
    return bool(torch.cuda.is_available())


# -- torch layers ------------------------------------------------------------------------------------
class Block(torch.nn.Module):
    """Two outputs that carry gradients (a tensor and a dict entry), an int output, an unused
    parameter and an optional second input."""

    def __init__(self, d: int = 6) -> None:
        super().__init__()
        self.a = torch.nn.Linear(d, 2 * d)
        self.b = torch.nn.Linear(2 * d, d)
        self.unused = torch.nn.Parameter(torch.ones(3))

    def forward(self, x, y=None, scale: float = 1.0):
        h = torch.nn.functional.gelu(self.a(x))
        out = self.b(h) * scale
        if y is not None:
            out = out + y
        return out, {"h": h, "n": torch.tensor(x.shape[0])}


def make_block(seed: int = 0, d: int = 6):
    torch.manual_seed(seed)
    return Block(d)


def loss_of(out) -> torch.Tensor:
    y, extra = out
    return (y * y).sum() + extra["h"].sum() * 0.5


def grads_of(m: torch.nn.Module) -> dict[str, torch.Tensor | None]:
    return {n: (None if p.grad is None else p.grad.clone()) for n, p in m.named_parameters()}


def assert_grads_equal(a: torch.nn.Module, b: torch.nn.Module, tol: float = 1e-6) -> None:
    ga, gb = grads_of(a), grads_of(b)
    assert ga.keys() == gb.keys()
    for name in ga:
        if gb[name] is None:
            assert ga[name] is None, name
        else:
            assert ga[name] is not None, name
            torch.testing.assert_close(ga[name], gb[name], rtol=tol, atol=tol, msg=name)


# -- arguments ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs", [{"warmup": 0}, {"warmup": -2}, {"warmup": True}, {"warmup": "3"},
                                    {"max_in_flight": 0}, {"outputs": "bogus"}, {"verify": "yes"},
                                    {"strict": 1}, {"max_graphs": 0}])
def test_bad_options(kwargs):
    with pytest.raises(ConfigError):
        graphjit.graphed_layer(make_block(), **kwargs)


def test_not_a_layer_and_double_wrapping():
    with pytest.raises(ConfigError, match=r"torch\.nn\.Module or a paddle\.nn\.Layer"):
        graphjit.graphed_layer(lambda x: x)
    with pytest.raises(ConfigError, match="needs a"):
        graphjit.graphed_layer(object())
    g = graphjit.graphed_layer(make_block())
    with pytest.raises(ConfigError, match="already a graphed layer"):
        graphjit.graphed_layer(g)


class Weird(torch.nn.Module):
    def __init__(self, what: str) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)
        self.what = what

    def forward(self, x):
        y = self.lin(x)
        if self.what == "object":
            return {"y": y, "obj": object()}
        if self.what == "none":
            return None
        return (y, [y * 2, {"k": y + 1}], 3, "label", None)


@pytest.mark.parametrize("simulate", [False, True])
def test_unsupported_outputs_are_refused_on_every_path(simulate):
    x = torch.randn(2, 3)
    with pytest.raises(UnsupportedOutputError, match=r"builtins.object at output\['obj'\]"):
        graphjit.graphed_layer(Weird("object"), _simulate=simulate)(x)
    with pytest.raises(UnsupportedOutputError, match="no torch tensor"):
        graphjit.graphed_layer(Weird("none"), _simulate=simulate)(x)
    ok = graphjit.graphed_layer(Weird("nested"), warmup=1, _simulate=simulate)
    for _ in range(3):
        out = ok(x)
        assert out[2:] == (3, "label", None) and isinstance(out[1][1], dict)
        sum(t.sum() for t in (out[0], out[1][0], out[1][1]["k"])).backward()


# -- the no-CUDA path and the environment ------------------------------------------------------------
@pytest.mark.skipif(torch_cuda(), reason="this machine has a CUDA GPU")
def test_without_cuda_runs_eagerly_with_one_info_line(gj_log):
    m, ref = make_block(), make_block()
    g = graphjit.graphed_layer(m)
    for step in range(3):  # three gradient-accumulation steps of two micro-batches each
        for n in (4, 5):
            x = torch.randn(n, 6)
            out, want = g(x), ref(x)
            assert torch.equal(out[0], want[0]) and torch.equal(out[1]["h"], want[1]["h"])
            loss_of(out).backward()
            loss_of(want).backward()
        assert_grads_equal(m, ref, tol=0)
        if step == 1:
            m.zero_grad()
            ref.zero_grad()
    lines = [r for r in gj_log.records if "no CUDA graph" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.INFO, [r.getMessage() for r in gj_log.records]
    assert re.search(r"graphed_layer\(Block(#\d+)?\)", lines[0].getMessage()) and "eagerly" in lines[0].getMessage()
    s = g.stats()
    assert s["calls"] == 6 and s["graphs"] == 0 and s["captures"] == 0
    (reason, count), = s["fallbacks"].items()
    assert reason.startswith("no CUDA graphs: ") and count == 6
    assert [k["state"] for k in s["keys"]] == ["eager", "eager"]
    assert [k["uncaptured_calls"] for k in s["keys"]] == [3, 3]
    assert m.unused.grad is None  # as eager


def test_disable_calls_the_layer(monkeypatch):
    monkeypatch.setenv("GRAPHJIT_DISABLE", "1")
    graphjit.refresh_env()
    m = make_block()
    g = graphjit.graphed_layer(m, _simulate=True)
    for _ in range(5):
        loss_of(g(torch.randn(3, 6, requires_grad=True))).backward()
    s = g.stats()
    assert s["disabled_calls"] == 5 and s["calls"] == 0 and s["keys"] == [] and s["micro_batches"] == 0


def test_grad_disabled_runs_eagerly():
    g = graphjit.graphed_layer(make_block(), warmup=1, _simulate=True)
    with torch.no_grad():
        for _ in range(3):
            g(torch.randn(2, 6))
    s = g.stats()
    assert s["keys"] == [] and sum(s["fallbacks"].values()) == 3
    assert any("grad disabled" in r for r in s["fallbacks"])


# -- the state machine (simulated graphs) ------------------------------------------------------------
def test_warmup_record_replay_per_key():
    g = graphjit.graphed_layer(make_block(), warmup=2, _simulate=True)
    x4 = torch.randn(4, 6)

    def step(x):
        loss_of(g(x)).backward()

    step(x4)
    k = g.stats()["keys"][0]
    assert (k["state"], k["warmups"], k["captures"], k["replays"]) == ("warmup", 1, 0, 0)
    step(x4)
    assert g.stats()["keys"][0]["warmups"] == 2 and g.stats()["keys"][0]["captures"] == 0
    step(x4)
    k = g.stats()["keys"][0]
    assert (k["state"], k["captures"], k["replays"], k["backward_replays"], k["slots"]) == ("replay", 1, 1, 1, 1)
    for _ in range(3):
        step(torch.randn(4, 6))
    k = g.stats()["keys"][0]
    assert (k["replays"], k["backward_replays"], k["slots"], k["input_copies"]) == (4, 4, 1, 4)
    step(torch.randn(7, 6))  # a new shape is a new key, with its own warmup
    s = g.stats()
    assert len(s["keys"]) == 2 and s["keys"][1]["state"] == "warmup" and s["keys"][1]["warmups"] == 1
    step(torch.randn(4, 6, requires_grad=True))  # requires_grad is part of the key
    g.layer.eval()
    step(torch.randn(4, 6))  # so is eval mode
    s = g.stats()
    assert len(s["keys"]) == 4 and s["keys"][3]["key"].endswith("eval")
    assert s["micro_batches"] == 4 and s["backward_replays"] == 4 and s["in_flight"] == 0 and s["simulated"]
    assert "micro-batches graphed 4" in g.report()


def test_non_tensor_arguments_are_keyed_by_value():
    m, ref = make_block(), make_block()
    g = graphjit.graphed_layer(m, warmup=1, _simulate=True)
    for scale in (1.0, 2.0, 1.0, 2.0, 2.0):
        x = torch.randn(3, 6)
        out, want = g(x, scale=scale), ref(x, scale=scale)
        torch.testing.assert_close(out[0], want[0])
        loss_of(out).backward()
        loss_of(want).backward()
    assert_grads_equal(m, ref)
    keys = g.stats()["keys"]
    assert len(keys) == 2 and [k["replays"] for k in keys] == [1, 2]


@pytest.mark.parametrize("outputs", ["copy", "alias"])
def test_gradients_equal_eager_across_accumulation_steps(outputs):
    """Three optimizer steps of three accumulated micro-batches; inputs with and without grad,
    several outputs with gradients, an unused parameter: .grad exactly as eager, step after step."""
    m, ref = make_block(1), make_block(1)
    g = graphjit.graphed_layer(m, warmup=2, outputs=outputs, _simulate=True)
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(3)
    for _step in range(3):
        for _micro in range(3):
            x = torch.randn(5, 6, generator=gen, requires_grad=True)
            y = torch.randn(5, 6, generator=gen)
            xr = x.detach().clone().requires_grad_(True)
            out, want = g(x, y), ref(xr, y)
            torch.testing.assert_close(out[0], want[0], rtol=1e-6, atol=1e-6)
            assert out[1]["n"].requires_grad is False and int(out[1]["n"]) == 5
            loss_of(out).backward()
            loss_of(want).backward()
            torch.testing.assert_close(x.grad, xr.grad, rtol=1e-6, atol=1e-6)
        assert_grads_equal(m, ref)
        assert m.unused.grad is None and ref.unused.grad is None
        opt.step()
        opt_ref.step()
        opt.zero_grad(set_to_none=_step % 2 == 0)  # None and zeroed grads both accumulate as eager
        opt_ref.zero_grad(set_to_none=_step % 2 == 0)
    for p, q in zip(m.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-6)
    s = g.stats()
    assert s["captures"] == 1 and s["replays"] == 7 and s["backward_replays"] == 7


def test_parameter_grads_are_never_aliases_of_graph_buffers():
    m = make_block()
    g = graphjit.graphed_layer(m, warmup=1, _simulate=True)
    loss_of(g(torch.randn(2, 6))).backward()
    m.zero_grad(set_to_none=True)
    loss_of(g(torch.randn(2, 6))).backward()  # replay: .grad is None, so it gets a fresh copy
    first = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
    x = torch.randn(2, 6)
    loss_of(g(x)).backward()  # a second replay must add, not overwrite through a shared buffer
    ref = make_block()
    ref.load_state_dict(m.state_dict())
    loss_of(ref(x)).backward()
    for n, p in m.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(p.grad, first[n] + dict(ref.named_parameters())[n].grad, rtol=1e-6, atol=1e-6)


def test_buffers_and_rng_as_eager():
    """BatchNorm running statistics and dropout masks: the extra warmup and verify passes of a capture
    are undone, so a graphed layer leaves the same state and draws the same masks as eager."""

    def make():
        torch.manual_seed(5)
        return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Dropout(0.3),
                                   torch.nn.Linear(8, 2))

    xs = [torch.randn(6, 4, generator=torch.Generator().manual_seed(i)) for i in range(6)]
    ref = make()
    torch.manual_seed(11)
    want = []
    for x in xs:
        out = ref(x)
        out.sum().backward()
        want.append(out.detach())
    m = make()
    g = graphjit.graphed_layer(m, warmup=2, _simulate=True)
    torch.manual_seed(11)
    for x, w in zip(xs, want):
        out = g(x)
        out.sum().backward()
        torch.testing.assert_close(out, w, rtol=1e-6, atol=1e-6)
    bn, bn_ref = m[1], ref[1]
    torch.testing.assert_close(bn.running_mean, bn_ref.running_mean)
    torch.testing.assert_close(bn.running_var, bn_ref.running_var)
    assert int(bn.num_batches_tracked) == int(bn_ref.num_batches_tracked) == 6
    assert_grads_equal(m, ref)
    assert g.stats()["replays"] == 4


# -- several micro-batches in flight -----------------------------------------------------------------
def one_f_one_b(layer, xs, losses):
    """Stage 0 of a 4-stage 1F1B schedule: F1 F2 F3 B1 F4 B2 B3 B4."""
    outs = {}

    def fwd(i):
        outs[i] = layer(xs[i])

    def bwd(i):
        loss = loss_of(outs.pop(i))
        losses.append(float(loss))
        loss.backward()

    for op in ("F0", "F1", "F2", "B0", "F3", "B1", "B2", "B3"):
        (fwd if op[0] == "F" else bwd)(int(op[1]))


def test_one_f_one_b_four_micro_batches_equals_eager():
    m, ref = make_block(2), make_block(2)
    g = graphjit.graphed_layer(m, warmup=3, _simulate=True)
    gen = torch.Generator().manual_seed(0)
    for _step in range(3):
        xs = [torch.randn(4, 6, generator=gen) for _ in range(4)]
        got, want = [], []
        one_f_one_b(g, xs, got)
        one_f_one_b(ref, xs, want)
        np.testing.assert_allclose(got, want, rtol=1e-6)
        assert_grads_equal(m, ref)
        for p, q in zip(m.parameters(), ref.parameters()):
            with torch.no_grad():
                if p.grad is not None:
                    p -= 0.1 * p.grad
                    q -= 0.1 * q.grad
        m.zero_grad()
        ref.zero_grad()
    s = g.stats()
    k = s["keys"][0]
    # step 1: three eager warmups, F4 records slot 0; step 2: F2 and F3 record slots 1 and 2; step 3: replays only
    assert k["slots"] == 3 and k["captures"] == 3 and k["replays"] == 9 and k["backward_replays"] == 9
    assert s["in_flight"] == 0


def test_backward_out_of_order_is_an_error_naming_the_expected_micro_batch():
    g = graphjit.graphed_layer(make_block(), warmup=1, _simulate=True)
    loss_of(g(torch.randn(2, 6))).backward()  # warmup (micro-batch 1)
    o2 = g(torch.randn(2, 6))
    o3 = g(torch.randn(2, 6))
    assert g.stats()["in_flight"] == 2
    with pytest.raises(BackwardOrderError, match="backward of micro-batch 3 ran before the backward of micro-batch 2"):
        loss_of(o3).backward(retain_graph=True)
    assert isinstance(BackwardOrderError("x"), RuntimeError)
    loss_of(o2).backward()  # in order, both still work
    loss_of(o3).backward()
    assert g.stats()["in_flight"] == 0 and g.stats()["backward_replays"] == 2


def test_dropped_micro_batch_frees_its_slot_and_leaves_the_queue():
    g = graphjit.graphed_layer(make_block(), warmup=1, _simulate=True)
    loss_of(g(torch.randn(2, 6))).backward()
    o2 = g(torch.randn(2, 6))
    o3 = g(torch.randn(2, 6))
    del o2  # never gets a backward
    gc.collect()
    loss_of(o3).backward()
    o4 = g(torch.randn(2, 6))
    loss_of(o4).backward()
    s = g.stats()
    assert s["in_flight"] == 0 and s["keys"][0]["slots"] == 2  # o4 reused a free slot


def test_second_backward_through_one_micro_batch_is_refused():
    g = graphjit.graphed_layer(make_block(), warmup=1, _simulate=True)
    loss_of(g(torch.randn(2, 6))).backward()
    loss = loss_of(g(torch.randn(2, 6)))
    loss.backward(retain_graph=True)
    with pytest.raises(graphjit.GraphjitError, match="second backward"):
        loss.backward()


def test_more_micro_batches_than_max_in_flight(gj_log):
    g = graphjit.graphed_layer(make_block(), warmup=1, max_in_flight=2, _simulate=True)
    loss_of(g(torch.randn(2, 6))).backward()
    outs = [g(torch.randn(2, 6)) for _ in range(3)]
    for o in outs:
        loss_of(o).backward()
    s = g.stats()
    assert s["keys"][0]["slots"] == 2 and s["fallbacks"] == {"too many micro-batches in flight": 1}
    assert sum("max_in_flight=2" in r.getMessage() for r in gj_log.records) == 1
    strict = graphjit.graphed_layer(make_block(), warmup=1, max_in_flight=1, strict=True, _simulate=True)
    loss_of(strict(torch.randn(2, 6))).backward()
    first = strict(torch.randn(2, 6))
    with pytest.raises(CaptureError, match="max_in_flight=1"):
        strict(torch.randn(2, 6))
    loss_of(first).backward()


def test_reset_refused_while_micro_batches_wait():
    g = graphjit.graphed_layer(make_block(), warmup=1, _simulate=True)
    loss_of(g(torch.randn(2, 6))).backward()
    out = g(torch.randn(2, 6))
    with pytest.raises(graphjit.GraphjitError, match="1 micro-batch"):
        g.reset()
    loss_of(out).backward()
    g.reset()
    assert g.stats()["keys"] == []
    loss_of(g(torch.randn(2, 6))).backward()
    assert g.stats()["keys"][0]["state"] == "warmup"


# -- fallbacks found at capture time -----------------------------------------------------------------
class _HostRandom(torch.nn.Module):
    """Scales by a number drawn on the host at each call: a value a CUDA graph freezes, which no guard reads (a
    ``random.Random`` of its own), so only verify can catch it; with ``global_rng``, Python's global generator, which
    the warmup sees."""

    def __init__(self, global_rng: bool = False) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)
        self.draw = random.random if global_rng else random.Random(0).random

    def forward(self, x):
        return self.lin(x) * (1.0 + self.draw())


def test_verify_catches_a_frozen_python_value():
    g = graphjit.graphed_layer(_HostRandom(), warmup=1, _simulate=True)
    for _ in range(3):
        g(torch.randn(2, 3)).sum().backward()
    k = g.stats()["keys"][0]
    assert k["state"] == "fallback" and "verify failed" in k["reason"], k
    assert g.stats()["fallbacks"] == {"verify failed": 2}


def test_a_layer_that_draws_from_the_global_random_generator_runs_eagerly():
    """Its numbers and the generator's state as eager's: the warmup sees the draw, nothing is recorded."""
    layer = _HostRandom(global_rng=True)
    twin = copy.deepcopy(layer)
    g = graphjit.graphed_layer(layer, warmup=1, _simulate=True)
    for step in range(4):
        x = torch.randn(2, 3)
        random.seed(step)
        got = g(x)
        random.seed(step)
        assert torch.equal(got, twin(x)), step
    st = g.stats()
    assert st["captures"] == 0 and st["fallbacks"] == {"draws host random numbers": 4}, st  # the watched call too


def test_a_layer_that_writes_a_python_value_it_reads_runs_eagerly_with_its_reason():
    """A counter the forward writes and reads (``self.calls += 1``): the recording's extra passes would write it
    again and a replay would not; the key runs the layer eagerly, every call as eager's."""

    class Counting(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(3, 3)
            self.calls = 0

        def forward(self, x):
            self.calls += 1
            return self.lin(x) * self.calls

    torch.manual_seed(0)
    m = Counting()
    twin = copy.deepcopy(m)
    g = graphjit.graphed_layer(m, warmup=2, _simulate=True)
    for _ in range(5):
        x = torch.randn(2, 3)
        assert torch.equal(g(x), twin(x))
    assert m.calls == twin.calls == 5
    k = g.stats()["keys"][0]
    assert k["state"] == "fallback" and k["reason"] == "writes a Python value on every call", k
    assert "self.calls (1 -> 2)" in k["detail"], k


def test_tensors_requiring_grad_outside_the_layer_fall_back():
    outside = torch.randn(3, requires_grad=True)

    class UsesOutside(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(3, 3)

        def forward(self, x):
            return self.lin(x) * outside

    g = graphjit.graphed_layer(UsesOutside(), warmup=1, _simulate=True)
    for _ in range(3):
        g(torch.randn(2, 3)).sum().backward()
    assert outside.grad is not None and outside.grad.abs().sum() > 0  # eager computed it
    k = g.stats()["keys"][0]
    assert k["state"] == "fallback" and "neither its parameters nor its inputs" in k["reason"]


def test_debug_logs_every_state_change(monkeypatch, gj_log):
    monkeypatch.setenv("GRAPHJIT_DEBUG", "1")
    graphjit.refresh_env()
    g = graphjit.graphed_layer(make_block(), warmup=1, _simulate=True)
    for _ in range(2):
        loss_of(g(torch.randn(2, 6))).backward()
    text = "\n".join(r.getMessage() for r in gj_log.records if r.levelno == logging.DEBUG)
    for needle in ("new key", "warmup 1/1", "recorded slot 0", "forward replay micro-batch 2 slot 0",
                   "backward replay micro-batch 2 slot 0"):
        assert needle in text, (needle, text)


# -- the torch module wrapper ------------------------------------------------------------------------
def test_module_wrapper_shares_parameters_and_mode():
    m = make_block()
    g = graphjit.graphed_layer(m, _simulate=True)
    assert isinstance(g, torch.nn.Module) and g.layer is m
    assert [id(p) for p in g.parameters()] == [id(p) for p in m.parameters()]
    assert set(g.state_dict()) == {f"layer.{k}" for k in m.state_dict()}
    g.eval()
    assert not m.training
    g.train()
    assert m.training
    assert "warmup=3" in repr(g)
    loss_of(g(torch.randn(2, 6))).backward()
    g.double()  # moves/casts the parameters: the graphs are dropped
    assert g.stats()["keys"] == []
    out = g(torch.randn(2, 6, dtype=torch.float64))
    assert out[0].dtype == torch.float64


def test_copy_of_the_module_keeps_working():
    g = graphjit.graphed_layer(make_block(), warmup=1, _simulate=True)
    loss_of(g(torch.randn(2, 6))).backward()
    c = copy.copy(g)
    assert c(torch.randn(2, 6))[0].shape == (2, 6)



def test_deepcopy_graphs_a_copy_of_the_layer():
    g = graphjit.graphed_layer(make_block(), warmup=1, max_in_flight=2, _simulate=True)
    loss_of(g(torch.randn(2, 6))).backward()
    c = copy.deepcopy(g)
    assert c.layer is not g.layer and c.stats()["keys"] == [] and c._graphjit_core.max_in_flight == 2
    for p, q in zip(c.parameters(), g.parameters()):
        assert torch.equal(p, q) and p.data_ptr() != q.data_ptr()
    for _ in range(2):
        loss_of(c(torch.randn(2, 6))).backward()
    assert c.stats()["replays"] == 1 and g.stats()["calls"] == 1


def test_strict_raises_instead_of_falling_back(monkeypatch):
    monkeypatch.setenv("GRAPHJIT_STRICT", "1")
    graphjit.refresh_env()
    g = graphjit.graphed_layer(_HostRandom(), warmup=1, _simulate=True)
    g(torch.randn(2, 3)).sum().backward()
    with pytest.raises(graphjit.VerifyError, match="verify failed"):
        g(torch.randn(2, 3))
    assert g.stats()["keys"][0]["state"] == "fallback"
    lenient = graphjit.graphed_layer(_HostRandom(), warmup=1, strict=False, verify=False, _simulate=True)
    for _ in range(3):
        lenient(torch.randn(2, 3)).sum().backward()
    assert lenient.stats()["replays"] == 2  # verify=False: nothing checks the host's number (as documented)


def test_max_graphs_limits_the_graphed_signatures(gj_log):
    g = graphjit.graphed_layer(make_block(), warmup=1, max_graphs=1, _simulate=True)
    for n in (2, 3, 2, 3):
        loss_of(g(torch.randn(n, 6))).backward()
    s = g.stats()
    assert len(s["keys"]) == 1 and s["fallbacks"] == {"max_graphs reached": 2}
    assert sum("max_graphs=1" in r.getMessage() for r in gj_log.records) == 1



def test_a_dropped_layer_frees_its_graphs_without_the_collector(freed_by_refcount):
    """No reference cycle holds the layer's core or a slot's graphs (and their memory pool) once the
    wrapper is dropped, also with an abandoned micro-batch (forward without backward): memory comes back
    at once, never from a collection that might run in the middle of another capture."""

    def use():
        g = graphjit.graphed_layer(make_block(), warmup=1, _simulate=True)
        for _ in range(3):
            loss_of(g(torch.randn(2, 6))).backward()
        g(torch.randn(2, 6))  # forward only: abandoned
        assert g.stats()["replays"] >= 2
        core = g._graphjit_core
        return [core, *(x for e in core.entries.values() for s in e.slots for x in (s.fwd, s.bwd))]

    assert freed_by_refcount(use)
