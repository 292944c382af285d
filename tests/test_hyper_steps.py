"""graphjit's own Adam, AdamW and SGD steps (graphjit/backends/torch/hyper.py), which read betas, momentum, weight
decay and lr from tensors, against torch's own step with the same numbers: every option of the algorithm, five
steps, parameters, gradients and state compared (float rounding apart: the first moment is not lerped)."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

from graphjit.backends.torch import hyper  # noqa: E402

pytestmark = pytest.mark.torch


def _params():
    g = torch.Generator().manual_seed(0)
    return [torch.nn.Parameter(torch.randn(5, 3, generator=g)), torch.nn.Parameter(torch.randn(7, generator=g))]


def _run(make, own: bool, tensors: bool):
    params = _params()
    opt = make(params)
    g = torch.Generator().manual_seed(1)
    for _ in range(5):
        for p in params:
            p.grad = torch.randn(p.shape, generator=g)
        if own:
            saved = [dict(group) for group in opt.param_groups]
            if tensors:
                for group in opt.param_groups:
                    for name in ("lr", "momentum", "weight_decay"):  # fed where it moves: never a constant 0
                        if group.get(name):
                            group[name] = torch.tensor(float(group[name]))
                    if "betas" in group:
                        group["betas"] = tuple(torch.tensor(float(b)) for b in group["betas"])
            (hyper.adam_step if isinstance(opt, torch.optim.Adam | torch.optim.AdamW) else hyper.sgd_step)(opt)
            for group, before in zip(opt.param_groups, saved):
                group.update(before)
        else:
            opt.step()
    state = [t for s in opt.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    return [p.detach() for p in params] + [p.grad for p in params] + state


ADAMS = {
    "adam": lambda ps: torch.optim.Adam(ps, lr=1e-2, foreach=True),
    "adam_wd": lambda ps: torch.optim.Adam(ps, lr=1e-2, weight_decay=0.1, foreach=True),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-2, betas=(0.8, 0.99), weight_decay=0.05, foreach=True),
    "amsgrad": lambda ps: torch.optim.AdamW(ps, lr=1e-2, amsgrad=True, foreach=True),
    "maximize": lambda ps: torch.optim.Adam(ps, lr=1e-2, maximize=True, weight_decay=0.01, foreach=True),
}
SGDS = {
    "plain": lambda ps: torch.optim.SGD(ps, lr=0.1, foreach=True),
    "momentum": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, foreach=True),
    "dampening_wd": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, dampening=0.3, weight_decay=0.01,
                                               foreach=True),
    "nesterov": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, foreach=True),
    "nesterov_fused": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, fused=True),  # grads kept
    "maximize": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.5, maximize=True, foreach=True),
}


@pytest.mark.parametrize("tensors", [False, True])
@pytest.mark.parametrize("name", list(ADAMS) + [f"sgd-{k}" for k in SGDS])
def test_graphjits_step_equals_torchs(name, tensors):
    make = SGDS[name[4:]] if name.startswith("sgd-") else ADAMS[name]
    want = _run(make, own=False, tensors=False)
    got = _run(make, own=True, tensors=tensors)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert torch.allclose(a.float(), b.float(), rtol=1e-5, atol=1e-6), (name, (a.float() - b.float()).abs().max())


def test_a_tensor_hyperparameter_is_read_from_the_tensor():
    """The step reads the tensor's current number: a change of the tensor alone changes the update."""
    params = _params()
    opt = torch.optim.SGD(params, lr=0.1, momentum=0.9)
    before = params[0].detach().clone()
    for p in params:
        p.grad = torch.ones_like(p)
    lr = torch.tensor(0.0)
    opt.param_groups[0]["lr"] = lr
    hyper.sgd_step(opt)
    assert torch.equal(params[0].detach(), before)
    lr.fill_(0.5)
    hyper.sgd_step(opt)
    assert not torch.equal(params[0].detach(), before)


def test_the_steps_copy_nothing_the_optimizer_does_not_hold():
    params = _params()
    opt = torch.optim.AdamW(params, lr=1e-2)
    for p in params:
        p.grad = torch.ones_like(p)
    hyper.adam_step(opt)
    assert set(copy.copy(opt.state[params[0]])) == {"step", "exp_avg", "exp_avg_sq"}
