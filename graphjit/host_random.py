"""Whether a call drew numbers from the host's global random generators: Python's ``random`` module and, where
numpy is imported, numpy's legacy global generator (``np.random.rand``).  A replay runs no Python, so it would hand
back the capture's numbers every time (verify compares once and may pass by chance): such a key runs uncaptured.

Framework-free, read around warmup calls only (a state is a few microseconds to read and compare), never on a
replay.  A generator of the user's own (``random.Random()``, ``np.random.default_rng()``) is not seen here: verify
is what checks it.
"""

from __future__ import annotations

import random
import sys
from typing import Any

REASON = "draws host random numbers"
"""The reason a key whose warmup call drew runs uncaptured (``@graphed``) or eagerly (``graphed_layer``)."""


def state() -> tuple[Any, ...]:
    """The states of the global generators now (numpy's only where numpy is imported)."""
    np = sys.modules.get("numpy")
    if np is None:
        return (random.getstate(), None)
    try:
        kind, keys, pos, has_gauss, cached = np.random.get_state()
        return (random.getstate(), (kind, keys.tobytes(), pos, has_gauss, cached))
    except Exception:  # a numpy without the legacy global generator
        return (random.getstate(), None)


def drew(before: tuple[Any, ...]) -> str | None:
    """Which global generator moved since ``before`` (:func:`state`), or None.  The states cannot tell the call's draws
    from another thread's made meanwhile: such a draw runs the key uncaptured too, under the same reason (``reset()``
    tries it again)."""
    after = state()
    if after[0] != before[0]:
        return "Python's random module"
    if after[1] != before[1] and before[1] is not None:
        return "numpy's global random generator"
    return None
