"""Checks of several tensors' metadata in one call, for signing a call and for the replay lane: Dynamo's
``TensorGuards`` (C++), with each tensor's layout class (:mod:`graphjit.layouts`) as its key holds it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ... import layouts

# Dynamo's C++ check of tensors' metadata (None on a torch without it)
_TensorGuards: Any = getattr(getattr(getattr(torch._C, "_dynamo", None), "guards", None), "TensorGuards", None)


def layout(t: Any) -> layouts.Layout:
    """``t``'s layout class: None where contiguous, and for a tensor without strides (sparse, nested: the caller's
    check of unstrided inputs runs those uncaptured)."""
    try:
        return None if t.is_contiguous() else layouts.of(t.shape, t.stride())
    except RuntimeError:  # no strides (sparse COO), no is_contiguous (sparse CSR)
        return None


def meta_check(tensors: Sequence[Any]) -> Callable[..., bool] | None:
    """A check that tensors passed positionally have the Python type, dispatch keys, dtype, device, sizes,
    requires_grad and layout class of ``tensors``: ``TensorGuards`` with the strides of each tensor's dims of size > 1
    fixed (for a dense tensor, contiguous, transposed or channels-last, those strides are its layout class); a tensor of
    another layout (``("strided", ...)``: a slice, an expansion) has its strides free there and its class compared in
    Python after.  Never looser than the keys.  None on a torch without ``TensorGuards`` or where it refuses them."""
    if _TensorGuards is None:
        return None
    try:
        strides: list[list[int | None]] = []
        loose: list[tuple[int, layouts.Layout]] = []
        for i, t in enumerate(tensors):
            shaped = layout(t)
            if shaped is not None and shaped[0] == "strided":
                loose.append((i, shaped))
                strides.append([None] * t.dim())
            else:
                strides.append([None if n == 1 else s for n, s in zip(t.shape, t.stride())])
    except Exception:  # a tensor without strides: each meta_key is read instead
        return None
    check = _guards(tensors, strides)
    if check is None or not loose:
        return check

    def checked(*ts: Any) -> bool:
        return check(*ts) and all(layout(ts[i]) == want for i, want in loose)
    return checked


def fixed_check(tensors: Sequence[Any], strides: Sequence[Sequence[int]]) -> Callable[..., bool] | None:
    """``TensorGuards`` of ``tensors`` with every stride fixed to ``strides`` (the replay lane's: a handoff's buffers'
    or an adopted input's own); None on a torch without it or where it refuses them."""
    if _TensorGuards is None or len(strides) != len(tensors):
        return None
    return _guards(tensors, [list(s) for s in strides])


def _guards(tensors: Sequence[Any], strides: Sequence[Sequence[int | None]]) -> Callable[..., bool] | None:
    """``TensorGuards(...).check`` of ``tensors`` with their sizes and ``strides`` (None: free); None where this
    torch does not take that signature."""
    try:
        guards = _TensorGuards(*tensors, dynamic_dims_sizes=[list(t.shape) for t in tensors],
                               dynamic_dims_strides=[list(s) for s in strides])
    except Exception:
        return None
    return guards.check  # type: ignore[no-any-return]
