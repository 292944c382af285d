"""A call's signature as named leaves (``past_key_values.layers[0].cumulative_length_int`` -> ``7``), and
what differs between the signatures of two calls.

A key (:mod:`graphjit.keys`) is a tuple built for speed, without names.  This module walks the same
arguments in the same order (containers, objects walked attribute by attribute, tensors by their
metadata, other values by value) and keeps each leaf's raw label and a text of what the key holds
there, so that graphjit can say which part of the signature tells two keys apart: in a key's label,
when the labels would otherwise look equal, and in the reason of a key that never captures because
the next call's signature differs.  It runs only for calls that make a new key, never on the replay
path.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from . import backends, layouts
from .backends.base import Backend
from .keys import CallSignature, Signer
from .tree import Attr, is_object, object_fields

Label = tuple[Any, ...]
"""A raw leaf label as in :class:`~graphjit.keys.CallSignature` (``(method, position-or-name, *subscripts)``),
or :data:`MODES` / :data:`BOUND` for the key's two parts that are not arguments."""

MODES: Label = ("<modes>",)
BOUND: Label = ("<bound>",)
Leaves = dict[Label, str]

_SCALARS = frozenset((int, float, bool, str, bytes, type(None), complex))
_LONGEST = 400


@dataclass(frozen=True)
class Change:
    """One leaf whose text differs between two signatures (``None``: the leaf is absent there)."""

    label: Label
    old: str | None
    new: str | None


def leaves(backend: Backend, sig: CallSignature, instance: Any, owner: Any, args: tuple[Any, ...],
           kwargs: Mapping[str, Any]) -> Leaves:
    """The named leaves of a signed call (its arguments as signed: dynamic ones left out), in key order.

    ``instance``: the object of a method call (None for a plain call); ``owner``: the object the key holds
    besides the arguments (the instance, or the graphed Layer/Module), if any."""
    walk = _Walk(backend, sig)
    method = instance is not None
    for i, a in enumerate(args):
        walk.leaf(a, (method, i))
    for name in sorted(kwargs):
        walk.leaf(kwargs[name], (method, name))
    if owner is not None:
        training = getattr(owner, "training", None)
        walk.out[BOUND] = f"{_at(owner)}" + ("" if training is None else f" training={training}")
    modes = sig.key[-1][1] if sig.key and isinstance(sig.key[-1], tuple) and sig.key[-1][:1] == ("modes",) else None
    described = backend.describe_modes(modes) if sig.backend is not None and modes is not None else ""
    walk.out[MODES] = f"{described} {modes!r}" if described else repr(modes)
    return walk.out


def changes(before: Leaves, after: Leaves) -> list[Change]:
    """The leaves whose text differs, in the order of ``after`` (then the leaves only ``before`` has)."""
    out = [Change(label, before.get(label), text) for label, text in after.items() if before.get(label) != text]
    out.extend(Change(label, text, None) for label, text in before.items() if label not in after)
    return out


def name(signer: Signer, label: Label, short: bool = False) -> str:
    """``argument 'cache'.layers[0].n`` (or, ``short``, ``cache.layers[0].n``) for a raw label."""
    if label == MODES:
        return "modes" if short else "the framework modes (grad, autocast, AMP)"
    if label == BOUND:
        return "self" if short else "the bound object (or its training flag)"
    return signer.short(label) if short else signer.describe(label)


def shown(text: str | None, longest: int = 24) -> str:
    """A leaf's text as a label (or, with a larger ``longest``, a message) shows it (``None``: absent)."""
    if text is None:
        return "absent"
    first = text.splitlines()[0] if text else text
    return first if first == text and len(first) <= longest else first[:longest - 3] + "..."


class _Walk:
    """One walk of a call's arguments (the rules of :meth:`keys._WalkState.leaf`, with names)."""

    def __init__(self, backend: Backend, sig: CallSignature) -> None:
        self.backend = backend
        self.sig = sig
        self.out: Leaves = {}
        self.tensor = 0  # the index of the next tensor leaf, in sig.tensors order
        self.padded: dict[int, dict[int, int]] = {}
        for leaf, dim, size in sig.bucketed:
            self.padded.setdefault(leaf, {})[dim] = size
        self.visiting: set[int] = set()

    def leaf(self, x: Any, label: Label) -> None:
        tp = type(x)
        out = self.out
        if tp in _SCALARS or tp is slice:
            out[label] = _capped(repr(x))
            return
        backend = backends.for_type(tp)
        if backend is not None:
            out[label] = self.tensor_text(backend, x)
            return
        if isinstance(x, (tuple, list, collections.deque)):
            out[label] = f"{tp.__qualname__} of {len(x)}"
            for i, e in enumerate(x):
                self.leaf(e, (*label, i))
            return
        if isinstance(x, dict):
            out[label] = f"{tp.__qualname__} of {len(x)}"
            for k, v in x.items():
                self.leaf(v, (*label, k))
            return
        if is_object(tp):
            if id(x) in self.visiting:
                out[label] = "(a reference back to an enclosing object)"
                return
            out[label] = tp.__qualname__
            self.visiting.add(id(x))
            try:
                for field, v in object_fields(x):
                    self.leaf(v, (*label, Attr(field)))
            finally:
                self.visiting.discard(id(x))
            return
        try:
            hash(x)
        except TypeError:
            out[label] = f"{_at(x)} (keyed by identity)"
            return
        out[label] = _at(x) if tp.__repr__ is object.__repr__ or backends.identity_keyed(tp) else _capped(repr(x))

    def tensor_text(self, backend: Backend, t: Any) -> str:
        i, self.tensor = self.tensor, self.tensor + 1
        shape = list(backend.shape(t))
        for dim, size in self.padded.get(i, {}).items():
            if 0 <= dim < len(shape):
                shape[dim] = size
        dtype = str(backend.meta_key(t)[1]).replace("paddle.", "").replace("torch.", "")
        grad = " requires_grad" if backend.requires_grad(t) else ""
        return f"{shape}{layouts.note(backend, t)} {dtype} {backend.device_str(t)}{grad}"


def _at(x: Any) -> str:
    return f"{type(x).__qualname__} object at {id(x):#x}"


def _capped(text: str) -> str:
    """A value's repr, long enough to tell values apart (the key holds the value itself)."""
    return text if len(text) <= _LONGEST else text[:_LONGEST] + f"... ({len(text)} characters)"
