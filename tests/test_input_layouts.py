"""A tensor at a static buffer's address is that input only in the buffer's layout: a view of it at the same
address with other strides (``x.t()`` of a square ``x``) is another tensor of the same key, which a replay must
read as such.  Before, graphjit compared addresses alone, and the graph read the buffer in its captured layout:
a silently wrong result.  CPU lifecycle through tests/graph_emulator.py."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import graphjit  # noqa: E402

pytestmark = pytest.mark.torch


def _rows(a: torch.Tensor) -> torch.Tensor:
    """Layout-sensitive (rows differ from columns), and it writes nothing."""
    return a @ torch.arange(16.0).reshape(4, 4) + a.sum(0)


def test_a_transposed_view_of_a_static_input_is_copied_in_as_itself(emu):
    g = graphjit.graphed(_rows, outputs="alias")
    x = torch.randn(4, 4)
    for _ in range(3):
        g(x)
    (static,), _ = g.static_inputs(x)
    static.copy_(torch.randn(4, 4))
    assert torch.equal(g(static), _rows(static))  # the zero-copy path still replays in place
    expected = _rows(static.t().clone())
    out = g(static.t())
    assert torch.allclose(out, expected), (out - expected).abs().max()
    assert g.stats()["replays"] >= 2 and g.stats()["captures"] == 1


def _scale_rows(cache: torch.Tensor) -> torch.Tensor:
    cache.mul_(torch.arange(1.0, 5.0).reshape(4, 1))  # in place (adopted), layout-sensitive
    return cache.sum(1)


def test_an_adopted_input_passed_in_another_layout_moved(emu):
    g = graphjit.graphed(_scale_rows)
    cache = torch.ones(4, 4)
    for _ in range(3):
        g(cache)
    view = cache.t()
    expected_cache = view.clone()
    expected_out = _scale_rows(expected_cache)
    out = g(view)
    assert torch.equal(out, expected_out)
    assert torch.equal(view, expected_cache)  # written through the caller's view, as eagerly
    assert g(view) is not None and torch.equal(view, expected_cache * torch.arange(1.0, 5.0).reshape(4, 1))
