"""The requires-grad flags of the tensors a graph holds (a model's parameters) where it was captured with grad mode
on (guard_set.GuardSet ``grad_flag``): a frozen model called with grad mode on is captured (its outputs require no
grad); unfrozen after the capture, eager's outputs require grad, so the call must not replay that graph."""

from __future__ import annotations

import pytest

import graphjit

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch


def _linear():
    torch.manual_seed(0)
    return torch.nn.Linear(4, 2)


def test_a_model_unfrozen_after_the_capture_gets_its_gradients_as_eager(emu):
    eager, model = _linear(), _linear()
    f = graphjit.graphed(model)
    x = torch.ones(3, 4)
    for m in (eager, model):
        m.requires_grad_(False)
    for _ in range(4):  # frozen, grad mode left on: captured and replayed
        assert torch.equal(f(x), eager(x))
    assert f.stats()["replays"] >= 1
    for m in (eager, model):
        m.requires_grad_(True)
    want, got = eager(x), f(x)
    assert got.requires_grad and want.requires_grad, f.report()
    got.sum().backward()
    want.sum().backward()
    assert model.weight.grad is not None and torch.equal(model.weight.grad, eager.weight.grad)
    assert "requires-grad flag of self.weight" in f.report(), f.report()
    for m in (eager, model):  # frozen again: the first graph replays
        m.requires_grad_(False)
    replays = f.stats()["replays"]
    assert torch.equal(f(x), eager(x)) and f.stats()["replays"] == replays + 1, f.report()


def test_under_no_grad_the_flags_are_not_guarded(emu):
    """Without grad mode the flags change nothing a graph returns: no per-replay read of them."""
    model = _linear()
    f = graphjit.graphed(model)
    x = torch.ones(3, 4)
    with torch.no_grad():
        for _ in range(4):
            f(x)
        guarded = f.stats()["keys"][0]["guarded_values"]
        model.requires_grad_(False)
        replays = f.stats()["replays"]
        f(x)
        assert f.stats()["replays"] == replays + 1
    with torch.enable_grad():
        model.requires_grad_(False)
        for _ in range(4):
            f(x)
    keys = f.stats()["keys"]
    assert keys[0]["guarded_values"] == guarded
    assert keys[-1]["guarded_values"] == guarded + 2, keys  # the weight's and the bias's flags
