"""State a call creates or holds on a tensor: gradients and lazily created optimizer state (CPU, through the
emulated CUDA graph of tests/graph_emulator.py; the same cases on a GPU: tests/test_gpu_exactly_once.py).

A whole training step in one graphed call (forward, ``backward()``, ``optimizer.step()``) writes the
parameters' ``.grad`` and creates the optimizer's state on its first call.  graphjit must see both: a
gradient set to None between calls is created anew every call (the key runs uncaptured, saying so), a
gradient zeroed in place is state the graph writes (captured, equal to eager), and state the first call
created is put back with the rest whenever graphjit undoes a run of its own.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from graph_emulator import emulated_torch  # noqa: E402

import graphjit  # noqa: E402

pytestmark = pytest.mark.torch


def _train(graph: bool, zero: str, steps: int = 12):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)

    def step(x, y):
        if zero == "inside, in place":
            opt.zero_grad(set_to_none=False)
        elif zero == "inside, to None":
            opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    f = graphjit.graphed(step) if graph else step
    gen = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        x, y = torch.randn(8, 16, generator=gen), torch.randn(8, 4, generator=gen)
        if zero == "outside, to None":
            opt.zero_grad(set_to_none=True)
        losses.append(f(x, y))
    return model, opt, losses, (f.stats() if graph else None)


def _same_training(a, b) -> bool:
    ma, oa, la, _ = a
    mb, ob, lb, _ = b
    params = all(torch.equal(p, q) and torch.equal(p.grad, q.grad) for p, q in zip(ma.parameters(), mb.parameters()))
    momenta = all(torch.equal(oa.state[p]["momentum_buffer"], ob.state[q]["momentum_buffer"])
                  for p, q in zip(ma.parameters(), mb.parameters()))
    return params and momenta and all(torch.equal(x, y) for x, y in zip(la, lb))


def test_gradients_zeroed_in_place_are_state_the_graph_writes():
    ref = _train(False, "inside, in place")
    with emulated_torch():
        got = _train(True, "inside, in place")
    st = got[3]
    assert st["graphs"] == 1 and st["replays"] == 10 and not st["fallbacks"], st
    assert st["keys"][0]["verify"] == "passed"
    assert _same_training(got, ref)


@pytest.mark.parametrize("zero", ["outside, to None", "inside, to None"])
def test_gradients_set_to_none_are_owned_by_the_graph(zero):
    """zero_grad() with its default (set_to_none=True), before the call or inside it: the gradient the first call
    made stays the parameter's buffer (torch backend's OwnedGrads), so the step graphs and equals eager."""
    ref = _train(False, zero)
    with emulated_torch():
        got = _train(True, zero)
    st = got[3]
    assert st["graphs"] == 1 and st["replays"] == 10 and not st["fallbacks"], st
    assert st["keys"][0]["verify"] == "passed"
    assert _same_training(got, ref)


def test_state_the_first_call_creates_is_undone_with_the_extra_warmups_of_a_scope():
    """Inside a capture scope the key's first call runs once for itself and graphjit's extra warmups are
    undone; state the first call created (an optimizer's lazily made buffers) must be undone too."""
    def make():
        state: dict[str, torch.Tensor] = {}

        def step(x):
            if "m" not in state:
                state["m"] = torch.zeros(4)
            state["m"].mul_(0.5).add_(x)
            return state["m"] * 2

        return step, state

    xs = [torch.full((4,), float(i + 1)) for i in range(6)]
    ref_step, ref_state = make()
    want = [ref_step(x) for x in xs]
    with emulated_torch():
        step, state = make()
        g = graphjit.graphed(step, warmup=2)
        with graphjit.capture_scope(progress=False):
            got = [g(xs[0])]
        assert torch.equal(state["m"], want[0] / 2), (state["m"], want[0])  # the scope's call ran once
        got += [g(x) for x in xs[1:]]
    assert all(torch.equal(a, b) for a, b in zip(got, want)), (got, want)
    assert torch.equal(state["m"], ref_state["m"])
    st = g.stats()
    assert st["graphs"] == 1 and st["replays"] == 5, st
