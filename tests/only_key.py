"""The one key of a graphed function that was called with one signature: its entry and its stats."""

from __future__ import annotations

from typing import Any


def only_entry(g: Any) -> Any:
    """The function's only key entry (``KeyEntry``); fails where it has another number of keys."""
    (entry,) = g._self_state.entries.values()
    return entry


def only_key(g: Any) -> dict[str, Any]:
    """The function's only key in ``stats()``; fails where it has another number of keys."""
    (key,) = g.stats()["keys"]
    return key
