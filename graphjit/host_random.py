"""Whether a call drew numbers from the host's global random generators: Python's ``random`` module and, where
numpy is imported, numpy's legacy global generator (``np.random.rand``).  A replay runs no Python, so it would hand
back the capture's numbers every time (verify compares once and may pass by chance): such a key runs uncaptured.

Framework-free, read around warmup calls only (a state is a few microseconds to read and compare), never on a
replay.  A framework's own host generator where the function runs on a device (torch's CPU generator, ``torch.rand(3)``
in a CUDA function) counts too: the backend names it (:class:`Generator`, ``Backend.host_generators``).  A generator of
the user's own (``random.Random()``, ``np.random.default_rng()``, a ``torch.Generator``) is not seen here: verify is
what checks it.

The runs graphjit adds to a call (a capture, verify's eager reference and its replay of the islands, a scope's extra
warmup runs) put the global generators back with the rest of the Python state (:class:`Saved`, kept by
:class:`graphjit.pystate.PyState`): numbers an island draws are drawn once per call, as eagerly, and a capture that
fails leaves them where the call found them.  A capture runs no island, so a capture that moved them drew outside
the islands (:func:`graphjit.capture.capture_graph`'s caller says so, under :data:`REASON`).  The generators are
process-wide: another thread's draws made while such a run goes on are put back with it (that thread then draws the
same numbers again), and during a watched call or a capture they count as the call's (the key runs uncaptured;
``reset()`` tries it again).
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

REASON = "draws host random numbers"
"""The reason a key whose warmup call drew runs uncaptured (``@graphed``) or eagerly (``graphed_layer``)."""


class Generator(NamedTuple):
    """A framework's host generator a backend names for a device (``Backend.host_generators``): how to read, set and
    compare its state."""

    name: str
    get: Callable[[], Any]
    set: Callable[[Any], Any]
    same: Callable[[Any, Any], bool]


class Saved:
    """The states of the global generators (numpy's where numpy is imported) and of ``extra``, taken now:
    :meth:`moved` says which one has moved since, :meth:`put_back` sets them back."""

    __slots__ = ("extra", "numpy", "python", "states")

    def __init__(self, extra: Sequence[Generator] = ()) -> None:
        self.python = random.getstate()
        self.numpy = _numpy_state()
        self.extra = tuple(extra)
        self.states = [g.get() for g in self.extra]

    def moved(self) -> str | None:
        """Which generator moved since this copy, or None (numpy's only where it was imported then).  The states
        cannot tell the call's draws from another thread's made meanwhile: such a draw runs the key uncaptured too,
        under the same reason (``reset()`` tries it again)."""
        if random.getstate() != self.python:
            return "Python's random module"
        if self.numpy is not None:
            now = _numpy_state()
            if now is None or not _same_numpy(now, self.numpy):
                return "numpy's global random generator"
        for g, was in zip(self.extra, self.states):
            if not g.same(was, g.get()):
                return g.name
        return None

    def put_back(self) -> bool:
        """Set each generator that moved since this copy back to its state then; True where one had moved (put back
        or not: a generator that refuses its own state is left as it is)."""
        moved = False
        if random.getstate() != self.python:
            random.setstate(self.python)
            moved = True
        np = sys.modules.get("numpy")
        if self.numpy is not None and np is not None:
            try:
                now = np.random.get_state()
                if not _same_numpy(now, self.numpy):
                    moved = True
                    np.random.set_state(self.numpy)
            except Exception:
                pass
        for g, was in zip(self.extra, self.states):
            try:
                if not g.same(g.get(), was):
                    moved = True
                    g.set(was)
            except Exception:
                pass
        return moved


def _numpy_state() -> Any:
    """numpy's legacy global generator's state (``np.random.get_state()``), or None where numpy is not imported or has
    no such generator."""
    np = sys.modules.get("numpy")
    if np is None:
        return None
    try:
        return np.random.get_state()
    except Exception:  # a numpy without the legacy global generator
        return None


def _same_numpy(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    """Two legacy numpy states (``np.random.get_state()``) are the same: kind, key words, position, the cached
    Gaussian."""
    return a[0] == b[0] and a[2:] == b[2:] and a[1].tobytes() == b[1].tobytes()
