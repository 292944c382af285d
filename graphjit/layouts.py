"""A tensor's memory layout as part of a key: what a function can see of it besides shape and dtype.

A function may branch on ``x.is_contiguous()``, call ``x.view(...)`` (which fails for some layouts), or hand back
results whose strides follow its inputs' (elementwise ops keep a transposed or channels-last input's order).  A
graph captured for one layout and replayed for another would copy the new input into the old layout and run the
old branch: a silently wrong result.  So a key holds each tensor's layout class:

* ``None``: contiguous (the strides of size-1 dims aside, as ``is_contiguous()`` ignores them);
* ``("dense", order)``: non-overlapping and dense in another order (transposed, channels-last, permuted), where
  ``order`` lists the dims of size > 1 from the outermost to the innermost: with the shape, it fixes every stride
  that matters, so a key's tensors have one layout each;
* ``("strided", order, zeros)``: anything else (a slice of a wider tensor, an expanded one; ``zeros``: the dims
  of size > 1 with stride 0).  Such inputs are copied into a contiguous buffer, as before; the class
  keeps them apart from dense inputs of any order, not from each other (the slice of a growing cache, whose outer
  stride changes every step, keeps its key).

Framework-free: backends pass shapes and strides.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

Layout = tuple[Any, ...] | None


def of(shape: Sequence[int], strides: Sequence[int]) -> Layout:
    """The layout class of a tensor of ``shape`` and ``strides`` (in elements): see the module docstring.  The
    caller may skip this for a tensor its framework says is contiguous (the answer is None)."""
    dims = [d for d, n in enumerate(shape) if n != 1]
    order = tuple(sorted(dims, key=lambda d: -strides[d]))  # stable: equal strides keep the dims' order
    expected = 1
    for d in reversed(order):
        if strides[d] != expected:
            zeros = tuple(d for d in dims if strides[d] == 0)
            return ("strided", order, zeros)
        expected *= shape[d]
    return None if order == tuple(dims) else ("dense", order)


def dense_strides(shape: Sequence[int], layout: Layout) -> tuple[int, ...]:
    """The strides of a new dense tensor of ``shape`` in ``layout``'s order of dims (contiguous for None).  ``shape``
    may be another than the one ``layout`` was read from (a bucket's padded size): dims outside its order come first
    (outermost), in their own order, and size-1 dims get what that order gives them."""
    order = list(layout[1]) if layout is not None else []
    placed = set(order)
    full = [d for d in range(len(shape)) if d not in placed] + order
    strides = [1] * len(shape)
    step = 1
    for d in reversed(full):
        strides[d] = step
        step *= max(shape[d], 1)
    return tuple(strides)


def note(backend: Any, t: Any) -> str:
    """The note a label adds after ``t``'s shape: :func:`describe` of its layout class (from ``backend.meta_key``) and
    its strides; empty where contiguous."""
    meta = backend.meta_key(t)
    return describe(meta[4], backend.strides(t)) if len(meta) > 4 and meta[4] is not None else ""


def describe(layout: Layout, strides: Sequence[int]) -> str:
    """A label's note of a layout (empty for contiguous): ``strides=(1, 4)`` for a dense one, ``strided(15, 3, 1)``
    for another."""
    if layout is None:
        return ""
    text = ", ".join(str(s) for s in strides)
    return f" strides=({text})" if layout[0] == "dense" else f" strided({text})"
