"""A function that advances an iterator it reaches without receiving it (``next(batches)``) runs uncaptured from its
first watched call on (graphjit/iterators.py), every item taken once, as eager takes them.  Before, the capture's run
took one item more, verify failed, and the function ran uncaptured one item ahead for good (1, 2, 4, 5 ... against
eager's 1, 2, 3, 4): silently wrong.  CPU lifecycle through tests/graph_emulator.py."""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import graphjit  # noqa: E402
from graphjit import iterators  # noqa: E402

pytestmark = pytest.mark.torch


class _Feed:
    def __init__(self, source: Iterator[Any]) -> None:
        self.source = source


def _sources() -> dict[str, Callable[[], Iterator[Any]]]:
    """Iterators a step may hold; ``itertools``' own left out from Python 3.14 on, which no longer pickles them (their
    place cannot be read there: not seen, as iterators.py says)."""
    data = [float(i) for i in range(40)]
    found = {
        "list iterator": lambda: iter(data),
        "generator": lambda: (d for d in data),
        "generator function": lambda: _numbers(data),
        "itertools.count": lambda: itertools.count(0.0),
        "dict iterator": lambda: iter(dict.fromkeys(data)),
        "range iterator": lambda: iter(range(40)),
        # iterators over another: each by the place of the one it holds (iterators.MAX_NESTING)
        "map over a list": lambda: map(float, data),
        "map over a zip of two": lambda: map(sum, zip(iter(data), iter(data))),
        "itertools.cycle past its first pass": lambda: _cycled(data[:3]),
        "itertools.chain": lambda: itertools.chain(data[:2], data[2:]),
        "itertools.islice of a count": lambda: itertools.islice(itertools.count(0.0), 0, None),
    }
    if sys.version_info >= (3, 14):
        found = {k: v for k, v in found.items() if "itertools" not in k}
    return found


def _cycled(data: list[float]) -> Iterator[float]:
    cycle = itertools.cycle(data)
    for _ in range(len(data)):  # past the first pass: the place is an index into the saved items
        next(cycle)
    return cycle


def _numbers(data: list[float]) -> Iterator[float]:
    yield from data  # (the place is the inner iterator's)


@pytest.mark.parametrize("name", sorted(_sources()))
@pytest.mark.parametrize("where", ["closure", "object"])
def test_every_item_is_taken_once_as_eager_takes_them(emu, name: str, where: str) -> None:
    make = _sources()[name]

    def build() -> Callable[[Any], Any]:
        source = make()
        if where == "object":
            feed = _Feed(source)
            return lambda x: x + float(next(feed.source))
        return lambda x: x + float(next(source))

    fn, eager = build(), build()
    g = graphjit.graphed(fn)
    got = [float(g(torch.zeros(1))[0]) for _ in range(8)]
    want = [float(eager(torch.zeros(1))[0]) for _ in range(8)]
    assert got == want
    st = g.stats()
    assert st["replays"] == 0 and st["fallbacks"] == {iterators.REASON: 8}, st


def test_in_a_capture_scope_no_extra_run_takes_an_item(emu) -> None:
    source = iter([float(i) for i in range(10)])
    g = graphjit.graphed(lambda x: x + next(source))
    with graphjit.capture_scope(progress=False):
        assert float(g(torch.zeros(1))[0]) == 0.0
    assert float(g(torch.zeros(1))[0]) == 1.0  # the next item: the scope took only the call's own
    assert next(source) == 2.0


@pytest.mark.parametrize("kind", ["list iterator", "range iterator", "generator over a range", "map over a range",
                                  "zip over ranges"])
def test_an_iterator_held_and_not_advanced_keeps_the_graph(emu, kind: str) -> None:
    """Held, never advanced: its place reads the same on every watched call (a range iterator's pickle makes a new
    range object each time: compared by its bounds)."""
    source = {"list iterator": lambda: iter([1.0, 2.0, 3.0]), "range iterator": lambda: iter(range(1, 4)),
              "generator over a range": lambda: (float(i) for i in range(1, 4)),
              "map over a range": lambda: map(float, range(1, 4)),
              "zip over ranges": lambda: (a for a, _b in zip(range(1, 4), range(3)))}[kind]()
    w = torch.ones(3)

    def step(x: torch.Tensor) -> torch.Tensor:
        return x * w if source is not None else x

    g = graphjit.graphed(step)
    for _ in range(6):
        g(torch.ones(3))
    assert g.stats()["replays"] >= 3, g.stats()
    assert next(source) == 1.0


_ISLAND_SOURCE = iter(range(1000))


@graphjit.eager
def _island_item() -> torch.Tensor:
    return torch.full((1,), float(next(_ISLAND_SOURCE)))


def test_an_island_that_advances_one_is_not_this_reason(emu) -> None:
    g = graphjit.graphed(lambda x: x * 2 + _island_item())
    for _ in range(6):
        g(torch.ones(1))
    assert iterators.REASON not in g.stats()["fallbacks"], g.stats()


def test_positions_of_range_iterators_are_stable() -> None:
    for make in (lambda: iter(range(5)), lambda: reversed(range(5)), lambda: iter(range(1 << 70, (1 << 70) + 5)),
                 lambda: (i for i in range(5)), lambda: map(abs, range(5))):
        it = make()
        was = iterators.position(it)
        junk = [object() for _ in range(100)]  # allocations between the reads
        assert iterators.position(it) == was, it
        next(it)
        assert iterators.position(it) != was, it
        del junk


def test_positions() -> None:
    it = iter([1, 2, 3])
    was = iterators.position(it)
    assert iterators.position(it) == was
    next(it)
    assert iterators.position(it) != was
    gen = (i for i in range(3))
    was = iterators.position(gen)
    next(gen)
    assert iterators.position(gen) != was
    assert iterators.kind(type(it)) == "reduce" and iterators.kind(type(gen)) == "generator"
    assert iterators.kind(list) is None and iterators.kind(_Feed) is None
