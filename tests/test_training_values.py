"""graphed_layer and the Python values its forward reads without receiving them (training/values.py), on the graph
emulator (a replay runs no Python: a value frozen at the recording shows as a wrong loss): a training loop that
changes one between steps (a residual scale, a Dropout's p, a flag, a global) matches the same loop run eagerly,
parameters and gradients compared at every step."""

from __future__ import annotations

import pytest

import graphjit

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

SCALE = {"value": 1.0}


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.drop = torch.nn.Dropout(0.0)
        self.alpha = 1.0
        self.gelu = False

    def forward(self, x):
        h = self.drop(self.fc(x))
        h = torch.nn.functional.gelu(h) if self.gelu else torch.relu(h)
        return x + self.alpha * h * SCALE["value"]


def _loop(graph: bool, change, steps: int = 10) -> tuple[list[float], dict[str, torch.Tensor], object]:
    torch.manual_seed(0)
    block = Block()
    layer = graphjit.graphed_layer(block, warmup=2) if graph else block
    opt = torch.optim.SGD(layer.parameters(), lr=0.02)
    x = torch.linspace(-1, 1, 8).reshape(2, 4)
    losses = []
    try:
        for step in range(steps):
            change(block, step)
            opt.zero_grad()
            loss = layer(x).pow(2).sum()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    finally:
        SCALE["value"] = 1.0
    return losses, {n: p.detach().clone() for n, p in block.named_parameters()}, layer


def _same_as_eager(emu, change):
    want, want_params, _ = _loop(False, change)
    got, got_params, layer = _loop(True, change)
    assert got == want, layer.report()
    for name, p in want_params.items():
        assert torch.equal(got_params[name], p), name
    return layer


def _alpha(block, step):
    if step == 4:
        block.alpha = 0.0
    if step == 7:
        block.alpha = 1.0  # back: the first key's graphs replay again


def _dropout_p(block, step):
    if step == 4:
        block.drop.p = 0.999


def _flag(block, step):
    if step == 4:
        block.gelu = True


def _global(block, step):
    if step == 4:
        SCALE["value"] = 0.5


@pytest.mark.parametrize("change", [_alpha, _dropout_p, _flag, _global], ids=["alpha", "dropout_p", "flag", "global"])
def test_a_value_the_forward_reads_changed_between_steps_trains_as_eager(emu, change):
    layer = _same_as_eager(emu, change)
    stats = layer.stats()
    assert stats["micro_batches"] >= 4, layer.report()  # replays happened on both sides of the change


def test_the_key_of_the_values_says_what_changed_and_the_first_key_replays_again(emu):
    layer = _same_as_eager(emu, _alpha)
    report = layer.report()
    assert "self.alpha=0.0" in report, report
    keys = layer.stats()["keys"]
    first = next(k for k in keys if "alpha" not in k["key"])
    assert first["replays"] >= 4, report  # steps 2-3 and again 7-9


def test_a_parameter_replaced_after_the_recording_is_another_key(emu):
    """The graphs read the parameters they were recorded with: one replaced (``block.fc.weight = Parameter(...)``)
    is a changed value, not a stale replay (before: :meth:`reset` was the only way)."""
    def replace(block, step):
        if step == 4:
            block.fc.weight = torch.nn.Parameter(block.fc.weight.detach() * 0.5)

    def loop(graph):
        torch.manual_seed(0)
        block = Block()
        layer = graphjit.graphed_layer(block, warmup=2) if graph else block
        x = torch.linspace(-1, 1, 8).reshape(2, 4)
        losses = []
        for step in range(8):
            replace(block, step)
            block.zero_grad()
            loss = layer(x).pow(2).sum()
            loss.backward()
            losses.append(loss.item())
        return losses, block.fc.weight.grad.clone(), layer

    want, want_grad, _ = loop(False)
    got, got_grad, layer = loop(True)
    assert got == want, layer.report()
    assert torch.equal(got_grad, want_grad)


def test_a_value_changed_once_an_epoch_keeps_getting_graphs(emu):
    """Values that settle for a while each (a schedule stepped per epoch) are not a drift: ten epochs of one value
    each, every epoch's later steps replay (only a change within a key's warmup of the last one counts toward
    the eager fallback)."""
    def per_epoch(block, step):
        block.alpha = 1.0 + (step // 6) * 0.1

    want, _, _ = _loop(False, per_epoch, steps=60)
    got, _, layer = _loop(True, per_epoch, steps=60)
    assert got == want, layer.report()
    keys = layer.stats()["keys"]
    assert len(keys) == 10 and all(k["replays"] == 4 for k in keys), layer.report()  # steps 2-5 of each epoch
    assert not layer.stats()["fallbacks"], layer.report()


def test_a_value_changed_on_every_step_runs_eagerly_with_its_reason(emu):
    def every_step(block, step):
        block.alpha = 1.0 + step * 0.01

    want, _, _ = _loop(False, every_step, steps=30)
    got, _, layer = _loop(True, every_step, steps=30)
    assert got == want, layer.report()
    fallbacks = layer.stats()["fallbacks"]
    assert any("changes from call to call: self.alpha" in r for r in fallbacks), layer.report()
