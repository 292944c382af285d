"""How a key is shown in ``report()``, logs and ``stats()``, and which argument keeps changing when a
function makes a new key on most calls.

A label lists each tensor leaf with its shape (``x[8, 1024]``, ``cache.keys[1, 8, 128, 64]``, padding as
``->0:8``), then one dtype and device when all tensors share the dtype (else a dtype after each tensor),
then the non-tensor arguments by value (``scale=2.0``), then, where two keys of the function would
otherwise have the same label, the values inside their arguments that tell them apart (``cfg.scale=2.0``,
``cache.layers[0].n=7``), then the framework modes when they are not the defaults (``no_grad``,
``autocast(cuda, bfloat16)``).
"""

from __future__ import annotations

from typing import Any

from . import layouts
from .backends.base import Backend
from .keys import CallSignature, Signer

_SHOWN = (int, float, bool, str, bytes, type(None), complex, slice, range)


def key_label(signer: Signer, backend: Backend, sig: CallSignature, method: bool, args: tuple[Any, ...],
              kwargs: dict[str, Any]) -> str:
    """The label of ``sig`` (see the module docstring)."""
    head, modes = label_parts(signer, backend, sig, method, args, kwargs)
    return render(head, [], modes)


def label_parts(signer: Signer, backend: Backend, sig: CallSignature, method: bool, args: tuple[Any, ...],
                kwargs: dict[str, Any]) -> tuple[str, str]:
    """A label's two halves: the arguments (tensors, then plain values), and the modes when not the defaults."""
    dtypes = [_dtype(backend, t) for t in sig.tensors]
    uniform = len(set(dtypes)) <= 1
    parts = []
    pads = {p.leaf: p for p in sig.pads}
    for i, (label, t) in enumerate(zip(sig.labels, sig.tensors)):
        text = f"{signer.short(label)}{list(backend.shape(t))}{layouts.note(backend, t)}"
        if i in pads:
            text += f"->{pads[i].dim}:{pads[i].padded}"
        parts.append(text if uniform else f"{text} {dtypes[i]}")
    if sig.tensors:
        where = backend.device_str(sig.tensors[0])
        parts.append(f"{dtypes[0]}@{where}" if uniform else f"@{where}")
    named = [(signer.short((method, i)), a) for i, a in enumerate(args)] + list(kwargs.items())
    for name, value in named:
        if isinstance(value, _SHOWN):
            text = repr(value)
            parts.append(f"{name}={text if len(text) <= 24 else text[:21] + '...'}")
    modes = backend.describe_modes(sig.key[-1][1]) if sig.backend is not None else ""
    return " ".join(parts), modes


def render(head: str, extras: list[str], modes: str) -> str:
    """A label from its halves and the values (``cfg.scale=2.0``) that tell it apart from keys whose halves are
    the same (:mod:`graphjit.history`)."""
    text = " ".join(p for p in (head, *extras, modes) if p)
    return text or "()"


def key_order(backend: Backend, sig: CallSignature) -> tuple[Any, ...]:
    """What report rows sort by: the tensors' shapes (numerically), then the rest of the key as text."""
    return (tuple(tuple(backend.shape(t)) for t in sig.tensors), str(sig.key))


def changed_argument(signer: Signer, method: bool, before: tuple[Any, ...], after: tuple[Any, ...]) -> str | None:
    """The argument whose part of the key differs between two keys of one function (the first one found)."""
    if before[0] != after[0]:
        return "the number of positional arguments"
    n = before[0]
    for i in range(1, min(len(before), len(after))):
        if before[i] == after[i]:
            continue
        if i <= n:
            return f"argument {signer.short((method, i - 1))!r}"
        part = after[i]
        if isinstance(part, tuple) and part and part[0] == "modes":
            return "the framework mode (grad, autocast, AMP)"
        if isinstance(part, tuple) and part and part[0] == "values the function reads":
            return "a value the function reads (not an argument)"
        if isinstance(part, tuple) and part and part[0] == "self":
            return "the bound object or its training flag"
        if isinstance(part, tuple) and part and isinstance(part[0], str):
            return f"argument {part[0]!r}"
    return None


def _dtype(backend: Backend, t: Any) -> str:
    return str(backend.meta_key(t)[1]).replace("paddle.", "").replace("torch.", "")
