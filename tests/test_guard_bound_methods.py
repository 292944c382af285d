"""A bound method held where the function finds it (a Module attribute, a list entry, a ``functools.partial``'s
function) reads its object's state when called: what it reads off its ``self`` is a guarded value of the call, as
for a bound method in a closure cell or a global (guards._follow_method).  Emulated graphs: a replay runs no Python,
so a value frozen at the capture shows as a stale output."""

from __future__ import annotations

import functools

import pytest

import graphjit

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch


class Postprocessor:
    def __init__(self) -> None:
        self.temperature = 1.0

    def scale(self, logits):
        return logits / self.temperature


class Head(torch.nn.Module):
    def __init__(self, post, how: str) -> None:
        super().__init__()
        self.how = how
        self.post = post if how == "attribute" else [post] if how == "list" else functools.partial(post)

    def forward(self, x):
        return self.post[0](x) if self.how == "list" else self.post(x)


@pytest.mark.parametrize("how", ["attribute", "list", "partial"])
def test_what_a_held_bound_method_reads_off_its_object_is_guarded(emu, how):
    pp = Postprocessor()
    head = Head(pp.scale, how)
    f = graphjit.graphed(head)
    x = torch.ones(3)
    with torch.no_grad():
        for i in range(8):
            if i == 5:
                pp.temperature = 2.0  # the sampling temperature changed between calls
            assert torch.equal(f(x), head(x)), (i, f.report())
    assert f.stats()["graphs"] == 2 and "temperature=2.0" in f.report(), f.report()
