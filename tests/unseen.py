"""A counter graphjit's walks and guards do not see, for tests that count a function's Python runs (or make its runs
differ) without that state being a value of the function: its count sits in an ``io.StringIO``, an object of a module
the walks skip (``graphjit.reach.FOREIGN_MODULES``).  ``itertools.count()`` was that counter until graphjit learned
to see iterators a function advances (graphjit/iterators.py)."""

from __future__ import annotations

import io


class Unseen:
    """``next(counter)`` gives ``start``, ``start + step``, ... as ``itertools.count(start, step)`` does."""

    __slots__ = ("_start", "_step", "_ticks")

    def __init__(self, start: int = 0, step: int = 1) -> None:
        self._ticks = io.StringIO()
        self._start, self._step = start, step

    def __iter__(self) -> Unseen:
        return self

    def __next__(self) -> int:
        n = self._start + self._step * self._ticks.tell()
        self._ticks.write(".")
        return n
