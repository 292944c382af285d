"""What a graphed training step's graph assumed of the parameters it reaches (graphjit/backends/torch/grads.py,
``GradLayout`` and ``CallMark``), on the CPU through the emulated CUDA graph (a replay runs the recorded tensor work
and no Python, as a real graph does), each loop against the same loop run eagerly after every call:

* a parameter frozen (``requires_grad_(False)``) after the capture: the graph would keep computing and applying
  its gradient; the call runs uncaptured instead, and ``reset()`` captures the step again;
* a function that steps the optimizer while the backward runs outside it, with ``zero_grad()``'s default before
  each backward: every backward makes new gradient tensors, which the graph would not read; those calls run
  uncaptured (with ``set_to_none=False`` the gradients stay and the step replays);
* a step that ends with ``zero_grad()``: its gradients are None after every call, replays included, as eagerly."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import graphjit  # noqa: E402

pytestmark = pytest.mark.torch
FROZEN = "a parameter's requires_grad changed since the capture"
REPLACED = "a gradient it reads is another tensor than at the capture"


@pytest.fixture
def device() -> str:
    """Where the loops run (tests/test_gpu_grad_layout.py runs them on CUDA, through real graphs)."""
    return "cpu"


@pytest.fixture
def tol() -> float:
    return 1e-6


def _model(device: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to(device)


def _batches(n: int, device: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(8, 8, generator=g).to(device), torch.randn(8, 4, generator=g).to(device)) for _ in range(n)]


def _step(model, opt, x, y):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    return loss.detach()


def _reasons(g) -> str:
    return " | ".join(g.stats()["fallbacks"])


def _equal(a: torch.nn.Module, b: torch.nn.Module) -> float:
    return max(float((p - q).abs().max()) for p, q in zip(a.parameters(), b.parameters()))


def test_a_parameter_frozen_after_the_capture_runs_uncaptured_and_reset_graphs_again(emu, device, tol):
    eager_model, graphed_model = _model(device), _model(device)
    eager_opt = torch.optim.SGD(eager_model.parameters(), lr=0.1, momentum=0.9, fused=True)
    opt = torch.optim.SGD(graphed_model.parameters(), lr=0.1, momentum=0.9, fused=True)
    g = graphjit.graphed(_step)
    for i, (x, y) in enumerate(_batches(14, device)):
        if i == 5:
            for m in (eager_model, graphed_model):
                m[0].weight.requires_grad_(False)
            frozen = graphed_model[0].weight.detach().clone()
            replays = g.stats()["replays"]
        if i == 8:
            assert FROZEN in _reasons(g) and g.stats()["replays"] == replays, g.report()  # calls 5-7 uncaptured
            g.reset()
        assert torch.allclose(g(graphed_model, opt, x, y), _step(eager_model, eager_opt, x, y), atol=tol), i
        assert _equal(graphed_model, eager_model) <= tol, (i, g.report())
    st = g.stats()  # reset() keeps the function's counters: the three uncaptured calls, then the new key's replays
    assert replays >= 2 and list(st["fallbacks"].values()) == [3] and st["keys"][-1]["replays"] >= 3, g.report()
    assert torch.equal(graphed_model[0].weight, frozen) and graphed_model[0].weight.grad is None


def _only_step(opt, scale):
    opt.step()
    return scale * 2


@pytest.mark.parametrize("set_to_none", [True, False])
def test_a_step_whose_backward_runs_outside_never_reads_stale_gradients(emu, device, tol, set_to_none):
    eager_model, graphed_model = _model(device), _model(device)
    eager_opt = torch.optim.SGD(eager_model.parameters(), lr=0.1, momentum=0.9, fused=True)
    opt = torch.optim.SGD(graphed_model.parameters(), lr=0.1, momentum=0.9, fused=True)
    g = graphjit.graphed(_only_step)
    scale = torch.ones(2, device=device)
    for i, (x, y) in enumerate(_batches(8, device)):
        for m, o, step in ((eager_model, eager_opt, _only_step), (graphed_model, opt, g)):
            o.zero_grad(set_to_none=set_to_none)
            torch.nn.functional.mse_loss(m(x), y).backward()
            step(o, scale)
        assert _equal(graphed_model, eager_model) <= tol, (i, g.report())
    st = g.stats()
    if set_to_none:
        assert REPLACED in _reasons(g) and st["replays"] == 1, g.report()  # the capturing call's own replay
    else:
        assert not st["fallbacks"] and st["replays"] == 6, g.report()


def _step_then_zero(model, opt, x, y, do_step):
    loss = torch.nn.functional.mse_loss(model(x), y) / 2
    loss.backward()
    if do_step:
        opt.step()
        opt.zero_grad()
    return loss.detach()


def test_a_step_that_ends_with_zero_grad_leaves_no_gradient_as_eagerly(emu, device, tol):
    """Gradient accumulation over two calls, the second stepping and zeroing: after it every gradient is None, as
    eagerly, also after its replays; then eager steps that fine-tune the head alone leave the frozen layer as
    eagerly (a zeroed gradient there would let AdamW's weight decay move it)."""
    eager_model, graphed_model = _model(device), _model(device)
    eager_opt = torch.optim.AdamW(eager_model.parameters(), lr=1e-2, fused=True)
    opt = torch.optim.AdamW(graphed_model.parameters(), lr=1e-2, fused=True)
    g = graphjit.graphed(_step_then_zero)
    for i, (x, y) in enumerate(_batches(10, device)):
        g(graphed_model, opt, x, y, i % 2 == 1)
        _step_then_zero(eager_model, eager_opt, x, y, i % 2 == 1)
        grads = [p.grad is None for p in graphed_model.parameters()]
        assert grads == [p.grad is None for p in eager_model.parameters()] == [i % 2 == 1] * 4, (i, g.report())
        assert _equal(graphed_model, eager_model) <= tol, (i, g.report())
    assert g.stats()["replays"] >= 4 and not g.stats()["fallbacks"], g.report()
    for m, o in ((eager_model, eager_opt), (graphed_model, opt)):
        m[0].requires_grad_(False)
        for x, y in _batches(2, device):
            _step_then_zero(m, o, x, y, True)
    assert _equal(graphed_model, eager_model) <= tol


class _TwoHeads(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body, self.h0, self.h1 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4), torch.nn.Linear(16, 4)

    def forward(self, x, task):
        h = torch.relu(self.body(x))
        return self.h0(h) if task == 0 else self.h1(h)


def _task_step(model, opt, x, y, task):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x, task), y)
    loss.backward()
    opt.step()
    return loss.detach()


def test_the_head_a_task_leaves_unused_has_no_gradient_after_its_replays(emu, device, tol):
    """One head per task (a key per task), ``zero_grad()`` first in the step: eagerly the head a call does not use
    ends it without a gradient (AdamW skips it); after that task's replays too, not with a zeroed buffer."""
    eager_model, graphed_model = _TwoHeads().to(device), _TwoHeads().to(device)
    eager_opt = torch.optim.AdamW(eager_model.parameters(), lr=1e-2, weight_decay=0.1, fused=True)
    opt = torch.optim.AdamW(graphed_model.parameters(), lr=1e-2, weight_decay=0.1, fused=True)
    g = graphjit.graphed(_task_step)
    for i, (x, y) in enumerate(_batches(12, device)):
        g(graphed_model, opt, x, y, i % 2)
        _task_step(eager_model, eager_opt, x, y, i % 2)
        for head in ("h0", "h1"):
            mine, theirs = getattr(graphed_model, head).weight.grad, getattr(eager_model, head).weight.grad
            assert (mine is None) == (theirs is None), (i, head, g.report())
        assert _equal(graphed_model, eager_model) <= tol, (i, g.report())
    assert g.stats()["replays"] >= 6 and not g.stats()["fallbacks"], g.report()


class _WithAux(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body, self.head, self.aux = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4), torch.nn.Linear(16, 4)

    def forward(self, x, use_aux):
        h = torch.relu(self.body(x))
        return self.head(h) + self.aux(h) if use_aux else self.head(h)


def test_a_key_first_called_after_another_keys_calls_owns_the_gradients_it_writes(emu, device, tol):
    """Two keys of one step, the second first called after the first's were captured: every gradient it writes is
    the first key's buffer already.  It owns them too (a backward into them), so its replays are not refused for a
    gradient that another key's call left (review of GradLayout: only a step that runs no backward checks them)."""
    eager_model, graphed_model = _WithAux().to(device), _WithAux().to(device)
    eager_opt = torch.optim.SGD(eager_model.parameters(), lr=0.1, momentum=0.9, fused=True)
    opt = torch.optim.SGD(graphed_model.parameters(), lr=0.1, momentum=0.9, fused=True)
    g = graphjit.graphed(_task_step)
    for i, (x, y) in enumerate(_batches(16, device)):
        use_aux = i % 2 == 0 if i >= 4 else True
        assert torch.allclose(g(graphed_model, opt, x, y, use_aux), _task_step(eager_model, eager_opt, x, y, use_aux),
                              atol=tol)
        for p, q in zip(graphed_model.parameters(), eager_model.parameters()):
            assert (p.grad is None) == (q.grad is None), (i, g.report())
        assert _equal(graphed_model, eager_model) <= tol, (i, g.report())
    assert not g.stats()["fallbacks"] and all(k["replays"] >= 4 for k in g.stats()["keys"]), g.report()


def _micro(model, x, y):
    loss = torch.nn.functional.mse_loss(model(x), y) / 4
    loss.backward()
    return loss.detach()


def test_a_forward_and_backward_graphed_apart_from_an_eager_optimizer_accumulates_as_eagerly(emu, device, tol):
    """Gradient accumulation with the micro-batch's forward and backward graphed and the optimizer eager (no
    optimizer in the function's reach), ``zero_grad()``'s default after each update: the replays wrote the
    gradients into tensors no parameter held any more (each ``.grad`` stayed None, the update skipped every
    parameter); the key now keeps the gradient buffers as a training step does."""
    eager_model, graphed_model = _model(device), _model(device)
    eager_opt = torch.optim.AdamW(eager_model.parameters(), lr=1e-2, fused=True)
    opt = torch.optim.AdamW(graphed_model.parameters(), lr=1e-2, fused=True)
    g = graphjit.graphed(_micro)
    for i, (x, y) in enumerate(_batches(24, device)):
        assert torch.allclose(g(graphed_model, x, y), _micro(eager_model, x, y), atol=tol), i
        for p, q in zip(graphed_model.parameters(), eager_model.parameters()):
            assert (p.grad is None) == (q.grad is None), (i, g.report())
            assert torch.allclose(p.grad, q.grad, atol=tol / 10), (i, g.report())
        if i % 4 == 3:
            for o in (opt, eager_opt):
                o.step()
                o.zero_grad()
        assert _equal(graphed_model, eager_model) <= tol, (i, g.report())
    assert g.stats()["replays"] >= 18 and not g.stats()["fallbacks"], g.report()


def _update(opt, scale):
    opt.step()
    opt.zero_grad()


def test_an_update_graphed_apart_from_its_graphed_micro_batches_captures_and_equals_eager(emu, device, tol):
    """Both halves of gradient accumulation graphed apart: the micro-batch (forward, backward) and the update
    (``step()``, ``zero_grad()``).  The update's capture made its ``zero_grad()`` record of the capture's run count in
    verify's eager reference run, whose step then skipped every parameter: verify failed and the call left the
    parameters one step behind eager's.  A run's own ``zero_grad()`` counts in that run alone."""
    eager_model, graphed_model = _model(device), _model(device)
    eager_opt = torch.optim.AdamW(eager_model.parameters(), lr=1e-2, fused=True)
    opt = torch.optim.AdamW(graphed_model.parameters(), lr=1e-2, fused=True)
    micro, update = graphjit.graphed(_micro), graphjit.graphed(_update)
    scale = torch.ones(1, device=device)
    for i, (x, y) in enumerate(_batches(24, device)):
        micro(graphed_model, x, y)
        _micro(eager_model, x, y)
        if i % 4 == 3:
            update(opt, scale)
            _update(eager_opt, scale)
        assert _equal(graphed_model, eager_model) <= tol, (i, micro.report(), update.report())
    assert update.stats()["replays"] >= 3 and not update.stats()["fallbacks"], update.report()
    assert micro.stats()["replays"] >= 18 and not micro.stats()["fallbacks"], micro.report()
