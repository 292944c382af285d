"""graphed_layer and what a forward reads from the host on every call without a tensor to show for it: the clock and
an iterator the layer holds (training/watch.py's :func:`host_reads`), on the graph emulator (a replay runs no Python:
a reading or an item frozen at the recording shows as a wrong output).  Such a key runs the layer eagerly, every call
as eager's, with its reason counted."""

from __future__ import annotations

import copy
import itertools
import time

import pytest

import graphjit

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch


class Clocked(torch.nn.Module):
    """A forward that scales by the time since the layer was made (a decay by wall time)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3, 3)
        self.start = time.perf_counter()

    def forward(self, x):
        return self.fc(x) * (time.perf_counter() - self.start)


class Cycling(torch.nn.Module):
    """A forward that takes its scale from an iterator it holds (``next(self.scales)``)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3, 3)
        self.scales = itertools.cycle([1.0, 2.0, 3.0, 5.0, 7.0])

    def forward(self, x):
        return self.fc(x) * next(self.scales)


def _steps(layer, steps: int = 6) -> list[torch.Tensor]:
    opt = torch.optim.SGD(layer.parameters(), lr=0.01)
    x = torch.linspace(-1, 1, 6).reshape(2, 3)
    outs = []
    for _ in range(steps):
        opt.zero_grad()
        out = layer(x)
        out.pow(2).sum().backward()
        opt.step()
        outs.append(out.detach().clone())
    return outs


@pytest.mark.parametrize("warmup", [1, 2])
def test_a_layer_that_reads_the_clock_runs_eagerly_and_reads_it_on_every_call(emu, warmup):
    torch.manual_seed(0)
    layer = graphjit.graphed_layer(Clocked(), warmup=warmup)
    outs = _steps(layer)
    # the reading moves on every call: no two outputs alike (a replay would hand back the recording's)
    assert all(not torch.equal(a, b) for a, b in itertools.pairwise(outs[warmup:])), layer.report()
    st = layer.stats()
    assert st["captures"] == 0 and st["fallbacks"] == {"reads the host clock": 6 - warmup + 1}, st
    k = st["keys"][0]
    assert k["reason"] == "reads the host clock" and "time.perf_counter()" in k["detail"], k
    assert "test_training_host_reads.py" in k["detail"], k


@pytest.mark.parametrize("warmup", [1, 2])
def test_a_layer_that_advances_an_iterator_it_holds_matches_eager(emu, warmup):
    torch.manual_seed(0)
    m = Cycling()
    twin = copy.deepcopy(m)
    layer = graphjit.graphed_layer(m, warmup=warmup)
    got, want = _steps(layer), _steps(twin)
    for step, (a, b) in enumerate(zip(got, want)):
        assert torch.equal(a, b), (step, layer.report())
    assert next(m.scales) == next(twin.scales)  # the same item next: no extra item taken by a recording pass
    st = layer.stats()
    assert st["captures"] == 0 and st["fallbacks"] == {"advances an iterator on every call": 6 - warmup + 1}, st
    k = st["keys"][0]
    assert "scales" in k["detail"], k


def test_a_layer_that_reads_neither_is_still_recorded(emu):
    """The watch itself changes nothing for a layer that reads no clock and holds no iterator."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU())
    twin = copy.deepcopy(m)
    layer = graphjit.graphed_layer(m, warmup=2)
    got, want = _steps(layer), _steps(twin)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    assert layer.stats()["captures"] == 1, layer.report()


def test_a_layer_that_prints_on_every_call_runs_eagerly_and_prints(emu, capsys):
    class Loud(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(3, 3)

        def forward(self, x):
            print("step")
            return self.fc(x)

    layer = graphjit.graphed_layer(Loud(), warmup=2)
    _steps(layer)
    assert capsys.readouterr().out.count("step") == 6  # a replay would print nothing
    k = layer.stats()["keys"][0]
    assert k["reason"] == "prints or logs on every call" and "print()" in k["detail"], k
