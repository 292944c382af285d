"""One of graphjit's backends replaced by a stand-in for a block (the graph emulators' ``emulated_*``); no framework
imported here, so the Paddle emulator needs no torch."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, TypeVar

import graphjit.backends as registry

B = TypeVar("B")


@contextlib.contextmanager
def swapped(name: str, stand_in: B) -> Iterator[B]:
    """``stand_in`` serves every tensor of backend ``name`` in the block; the backend as it was afterwards."""
    registry.get(name)
    saved: Any = registry._instances[name]
    registry._instances[name] = stand_in  # type: ignore[assignment]
    registry._by_type.clear()
    try:
        yield stand_in
    finally:
        registry._instances[name] = saved
        registry._by_type.clear()
