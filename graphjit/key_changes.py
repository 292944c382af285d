"""Why a key whose calls change what its own key is made of runs uncaptured: a replay runs no Python, so the next
call would find such a value as the capture left it (:meth:`graphjit.lifecycle.KeyLifecycle.own_key_change`)."""

from __future__ import annotations

from typing import Any

from .advances import Advances
from .warmup import Blocked

CHANGES_ITS_KEY = "changes its own signature"
"""The reason of a key whose warmup run changed a value its key is made of (:meth:`_State.own_key_change`)."""

ADVANCES_DIFFER = "changes its own signature differently between calls"
"""The reason of a key whose warmup runs left the scalars of its key (:mod:`graphjit.advances`) at other values."""


def changes_key(path: str, what: str) -> Blocked:
    """A run changed ``what`` (at ``path``), part of its own key, and not as scalars a replay can set."""
    return Blocked(f"{CHANGES_ITS_KEY}: {path}", f"the call changes {what}, which is part of its own key: a replay "
                   "runs no Python, so the next call would find it as the capture left it. A value that changes on "
                   "every call belongs in a tensor")


def holders_kept(found: Advances, before: tuple[int, ...], args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> Blocked | None:
    """None where the objects on the paths of a key's advanced scalars are the ones the run started with."""
    if found.holders(args, kwargs) == before:
        return None
    return advances_differ(found.paths[0], "the call replaced an object on the path by another; a replay would set "
                           "the value in the object it was passed")


def advances_differ(path: str, what: str) -> Blocked:
    """The runs of a key left the scalars of its key at ``path`` differently (``what``)."""
    return Blocked(f"{ADVANCES_DIFFER}: {path}", f"the call changes {path}, which is part of its own key, and not the "
                   f"same way on every call ({what}): a replay, which runs no Python, could not set it as the call "
                   "would. A value that changes on every call belongs in a tensor")
