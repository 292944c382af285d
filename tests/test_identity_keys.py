"""An unhashable value inside an argument object (a numpy array a config object holds) is part of the key by identity.
Before, the key held its ``id()`` alone: a new array Python put at a dead one's address was taken for it, and the call
replayed the dead one's graph, with the value the function had read from it (a silently wrong result).  CPU lifecycle
through tests/graph_emulator.py."""

from __future__ import annotations

import gc

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

import graphjit  # noqa: E402

pytestmark = pytest.mark.torch


class Box:
    def __init__(self, t: torch.Tensor, scales: np.ndarray) -> None:
        self.t = t
        self.scales = scales


def _scaled(box: Box) -> torch.Tensor:
    return box.t * float(box.scales.sum())  # read on the host: frozen into the graph of this key


def test_a_new_array_at_a_dead_arrays_address_is_another_key(emu):
    g = graphjit.graphed(_scaled)
    seen: set[int] = set()
    reused = 0
    for v in range(30):
        box = Box(torch.ones(3), np.full(3, float(v)))
        reused += id(box.scales) in seen
        seen.add(id(box.scales))
        for _ in range(4):
            assert torch.equal(g(box), torch.full((3,), 3.0 * v)), (v, reused)
        del box
        gc.collect()
    if not reused:
        pytest.skip("Python put no array at a dead one's address")
    assert len(g.stats()["keys"]) == 30, g.report()
