"""What torch tells of a tensor's storage and version counter that graphjit feeds on (:mod:`graphjit.renewals`):
whether one tensor alone refers to its storage, and putting version counters back.

Both read private torch functions, probed once at import: where this torch lacks them (or they act otherwise),
:func:`sole_storage` says False and :data:`SETTABLE` is False, so nothing is fed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch


def _sole_count() -> tuple[Callable[[int], int] | None, int]:
    """torch's storage use count and what it reads for a storage one tensor alone refers to (the storage object the
    read makes counts too), or ``(None, 0)`` where this torch has no such count."""
    count = getattr(torch._C, "_storage_Use_Count", None)
    if count is None:
        return None, 0
    try:
        alone = torch.zeros(1)
        return count, int(count(alone.untyped_storage()._cdata))
    except Exception:
        return None, 0


def _version_setter() -> Callable[[tuple[Any, ...], tuple[Any, ...]], None] | None:
    """torch's way to put version counters back, as ``f(tensors, versions)`` (its signature took one tensor in older
    torch), or None where this torch has none that works."""
    raw = getattr(getattr(torch._C, "_autograd", None), "_unsafe_set_version_counter", None)
    if raw is None:
        return None

    def each(tensors: tuple[Any, ...], versions: tuple[Any, ...]) -> None:
        for t, v in zip(tensors, versions):
            raw(t, v)

    probe = torch.zeros(1)
    for setter in (raw, each):
        try:
            probe.add_(1)
            setter((probe,), (0,))
            if probe._version == 0:
                return setter  # type: ignore[no-any-return]
        except Exception:
            continue
    return None


_USE_COUNT, _SOLE = _sole_count()
_SET = _version_setter()
SETTABLE = _SET is not None


def sole_storage(t: Any) -> bool:
    """One tensor alone refers to ``t``'s storage (no view of it, nor it a view, is alive)."""
    if _USE_COUNT is None or t._base is not None:
        return False
    try:
        return bool(_USE_COUNT(t.untyped_storage()._cdata) == _SOLE)
    except Exception:
        return False


def set_versions(tensors: Sequence[Any], versions: Sequence[int | None]) -> None:
    """Put ``tensors``' version counters back to ``versions``."""
    assert _SET is not None
    _SET(tuple(tensors), tuple(versions))
