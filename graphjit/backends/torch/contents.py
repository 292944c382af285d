"""torch: one copy of many small tensors' contents, and one comparison with it (``Backend.contents`` and
``Backend.changed``, which a warmup's write probe uses, :class:`graphjit.writes.WriteProbe`).

A warmup compares the small tensors it can reach (a normalisation's plain weights, running statistics) before and
after the run, twice a key.  Tensor by tensor that is a clone each, then six kernels and two waits for the host each
(``TorchBackend.equal``: NaN-tolerant): on an H100 about 2 ms a key for eight such tensors, most of what
``bench capture`` paid beyond a capture by hand.  Here the tensors of one device are copied as bytes into one buffer
(one ``torch.cat``) and compared as bytes with one ``torch.equal`` (one wait).  Equal bytes are equal contents as
``equal`` defines them (NaN equal to NaN), so an unchanged group is settled there; where the bytes differ (a write,
or only a zero's sign or a NaN's payload) each tensor of the group is compared by ``equal`` against its part of the
buffer, so what is reported is what ``equal`` reports, tensor by tensor."""

from __future__ import annotations

import itertools
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

BATCHED_BYTES = 1 << 20
"""Tensors up to this size are copied into a device's buffer; larger ones are cloned and compared one by one."""

GROUP_BYTES = 1 << 26
"""A device's buffer holds at most this many bytes (the comparison makes a second buffer of its size while it runs);
tensors past it are cloned and compared one by one."""


@dataclass
class Group:
    """The tensors of one device copied into one byte buffer: their positions, where each one's bytes start in
    ``buffer`` (one more entry: the end), and the dtype and shape each had."""

    positions: list[int]
    offsets: list[int]
    buffer: Any
    kinds: list[tuple[Any, tuple[int, ...]]]


@dataclass
class Contents:
    """What :func:`contents` copied: byte groups, and clones of the tensors not put in one (by position)."""

    groups: list[Group] = field(default_factory=list)
    clones: dict[int, Any] = field(default_factory=dict)


def _bytes(t: Any) -> Any:
    """``t``'s elements in order as one flat ``uint8`` tensor (a view where ``t`` is contiguous, else a copy)."""
    return t.detach().contiguous().view(-1).view(torch.uint8)


def contents(backend: Any, tensors: Sequence[Any]) -> Contents:
    """See the module docstring: a byte group per device for tensors up to :data:`BATCHED_BYTES`; a clone for any
    other, and for one torch will not read as bytes (a sparse or quantized tensor, a conjugate view)."""
    out = Contents()
    by_device: dict[Any, list[tuple[int, Any]]] = {}
    used: dict[Any, int] = {}
    for i, t in enumerate(tensors):
        n = backend.nbytes(t)
        part = _readable(t) if n <= BATCHED_BYTES and used.get(t.device, 0) + n <= GROUP_BYTES else None
        if part is None:
            out.clones[i] = backend.clone(t)
        else:
            by_device.setdefault(t.device, []).append((i, part))
            used[t.device] = used.get(t.device, 0) + n
    for found in by_device.values():
        positions, parts = [i for i, _p in found], [p for _i, p in found]
        try:
            buffer = torch.cat(parts) if len(parts) > 1 else parts[0].clone()
        except (RuntimeError, TypeError, NotImplementedError):  # parts torch will not join (tensor subclasses)
            out.clones.update((i, backend.clone(tensors[i])) for i in positions)
            continue
        offsets = list(itertools.accumulate((p.numel() for p in parts), initial=0))
        kinds = [(tensors[i].dtype, tuple(tensors[i].shape)) for i in positions]
        out.groups.append(Group(positions, offsets, buffer, kinds))
    return out


def _readable(t: Any) -> Any:
    """:func:`_bytes` of ``t``, or None where torch will not read it as bytes."""
    try:
        return _bytes(t)
    except (RuntimeError, TypeError, NotImplementedError):
        return None


def changed(backend: Any, tensors: Sequence[Any], copy: Contents, known: Collection[int] = ()) -> list[int]:
    """The positions of ``tensors`` whose contents ``backend.equal`` says differ from ``copy`` (made by
    :func:`contents` from the same tensors, in the same order), those in ``known`` left out (found written
    otherwise: never compared): one comparison and one wait per device group where nothing changed."""
    hit = [i for i, c in copy.clones.items() if i not in known and not backend.equal(tensors[i], c)]
    for g in copy.groups:
        todo = [k for k, i in enumerate(g.positions) if i not in known]
        if not todo or _same_bytes(tensors, g, todo):
            continue
        for k in todo:  # something differs: tensor by tensor, its own bytes first
            i = g.positions[k]
            if _same_bytes(tensors, g, [k]):
                continue
            dtype, shape = g.kinds[k]
            # a copy of its part: a view at the part's offset need not be aligned for the dtype
            before = g.buffer[g.offsets[k]:g.offsets[k + 1]].clone().view(dtype).view(shape)
            if not backend.equal(tensors[i], before):
                hit.append(i)
    return sorted(hit)


def _same_bytes(tensors: Sequence[Any], g: Group, todo: list[int]) -> bool:
    """True where the group's tensors at ``todo`` (indices into the group) hold, byte for byte, what was copied,
    with the dtype and shape each had (False where any has another, can no longer be read as bytes, or torch cannot
    compare them: then each is compared by ``equal``)."""
    if any((tensors[g.positions[k]].dtype, tuple(tensors[g.positions[k]].shape)) != g.kinds[k] for k in todo):
        return False
    parts = [_readable(tensors[g.positions[k]]) for k in todo]
    if any(p is None or p.numel() != g.offsets[k + 1] - g.offsets[k] for p, k in zip(parts, todo)):
        return False
    whole = len(todo) == len(g.positions)
    try:
        before = g.buffer if whole else torch.cat([g.buffer[g.offsets[k]:g.offsets[k + 1]] for k in todo])
        now = torch.cat(parts) if len(parts) > 1 else parts[0]
        return bool(torch.equal(now, before))
    except (RuntimeError, TypeError, NotImplementedError):  # parts torch will not join or compare (meta)
        return False
