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


def test_a_graphed_partial_calls_with_its_keywords_as_they_are_now(emu):
    """``graphed(functools.partial(f, temperature=2.0))``: the partial's keywords changed after the capture are
    another key, and the call passes them as the partial holds them now (the signature's defaults were its keywords
    read once: the call passed the old temperature explicitly)."""
    def scale(x, temperature=1.0):
        return x / temperature

    p = functools.partial(scale, temperature=2.0)
    f = graphjit.graphed(p)
    x = torch.ones(2)
    with torch.no_grad():
        for i in range(8):
            if i == 5:
                p.keywords["temperature"] = 4.0
            assert torch.equal(f(x), p(x)), (i, f.report())
    assert f.stats()["graphs"] == 2, f.report()
