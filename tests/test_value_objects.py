"""An argument object whose class defines its own ``__eq__`` and ``__hash__`` is walked like any other object: its
attributes are the key.  Before, it was keyed by its value alone, and an ``__eq__`` that compares less than the
function reads (a name, not the scale), or an attribute changed in place, replayed the graph of another value:
silently wrong.  (A dataclass was walked already, its fields left out of ``__eq__`` included: its test guards
that.)  CPU lifecycle through tests/graph_emulator.py."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")

import graphjit  # noqa: E402

pytestmark = pytest.mark.torch


class Cfg:
    """Equal by name only, as a user's registry entry might be."""

    def __init__(self, name: str, scale: float) -> None:
        self.name, self.scale = name, scale

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Cfg) and self.name == other.name

    def __hash__(self) -> int:
        return hash(self.name)


@dataclasses.dataclass(frozen=True)
class Frozen:
    scale: float
    note: float = dataclasses.field(default=0.0, compare=False)  # left out of __eq__ and __hash__


def _scaled(x: torch.Tensor, cfg) -> torch.Tensor:
    return x * cfg.scale + getattr(cfg, "note", 0.0)


def test_an_equal_object_with_other_attributes_is_another_key(emu, scan) -> None:
    g = graphjit.graphed(_scaled)
    x = torch.ones(3)
    first = Cfg("a", 2.0)
    for _ in range(4):
        assert torch.equal(g(x, first), x * 2)
    other = Cfg("a", 5.0)
    assert other == first
    for _ in range(4):
        assert torch.equal(g(x, other), x * 5)
    first.scale = 7.0  # changed in place
    for _ in range(4):
        assert torch.equal(g(x, first), x * 7)
    assert torch.equal(g(x, Cfg("a", 2.0)), x * 2)
    assert g.stats()["replays"] >= 6


def test_a_frozen_dataclass_field_left_out_of_its_eq_is_keyed(emu) -> None:
    g = graphjit.graphed(_scaled)
    x = torch.ones(3)
    for note in (0.0, 1.0, 0.0, 1.0):
        for _ in range(3):
            assert torch.equal(g(x, Frozen(2.0, note)), x * 2 + note)
    assert g.stats()["graphs"] == 2


class Mode(str):
    """A str subclass: its value is no attribute (its __dict__ is empty)."""


def _moded(x: torch.Tensor, mode: str, scale: float) -> torch.Tensor:
    return x * scale if mode == "mul" else x + scale


def test_subclasses_of_c_types_and_standard_value_types_stay_values(emu) -> None:
    import fractions
    import pathlib

    g = graphjit.graphed(_moded)
    x = torch.ones(3)
    for _ in range(3):
        g(x, Mode("mul"), 2.0)
    assert torch.equal(g(x, Mode("add"), 5.0), x + 5)
    h = graphjit.graphed(lambda x, p, f: x * len(str(p)) * float(f))
    for _ in range(6):  # a new Path each call, its caches filled by str(): one key
        assert torch.equal(h(x, pathlib.Path("/tmp/a"), fractions.Fraction(1, 2)), x * 3)
    assert h.stats()["replays"] >= 3 and not h.stats()["fallbacks"], h.stats()
