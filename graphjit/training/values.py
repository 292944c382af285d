"""The Python values a graphed layer's forward reads without receiving them (a residual scale ``self.alpha``, a
Dropout's ``p``, a flag that picks a branch, a global): found once per key when its first slot is recorded, checked
before every call of that key, as ``@graphed`` checks them (:mod:`graphjit.guards`,
:class:`~graphjit.guard_set.GuardSet`).

A key's graphs were captured with the values of its recording; a call where one of them changed since is a call of
the key of the current values (warmed up and recorded like any key; the old key's graphs replay again once the values
are back), or runs eagerly with the change in its reason where the values cannot key a graph (an unhashable one).
The names the recording's first side-warmup pass used (:class:`~graphjit.names.NameRecorder`) choose which attributes
count, as a ``@graphed`` warmup's do; where they are not known (a profiler in the way) every name the code of the
reached classes uses counts."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import guards, py_writes
from ..guard_set import GuardSet
from ..guard_sources import argument_pairs
from ..guards import READ_VALUES
from ..names import NO_PROBES, NameRecorder

if TYPE_CHECKING:
    from ..backends.base import Backend

__all__ = ["MAX_VARIANTS", "READ_VALUES", "changed_key", "layer_guard", "layer_scan", "layer_sources", "python_writes"]

MAX_VARIANTS = 8
"""Keys of other values one key of the arguments makes in a row, each within a key's warmup of the one before, before
a change runs eagerly (the values drift)."""

_HOPS = 4
"""How many value keys a call follows from its arguments' key (each key's graphs may read values the last did not)."""


def layer_sources(layer: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> guards.Sources | None:
    """Where the layer's forward finds the values it reads (its closure cells and globals, the layer and the Modules
    among its arguments to walk: :func:`graphjit.guards.sources`); None where the layer has no Python forward."""
    forward = getattr(layer, "forward", None)
    fn = getattr(forward, "__func__", forward)
    return None if fn is None else guards.sources(fn, layer, argument_pairs(args, kwargs))


def layer_scan(backend: Backend, src: guards.Sources, names: NameRecorder | None = None) -> guards.Scan:
    """The values ``src`` holds, read now.  ``names``: the recorder of a run of the layer (its names choose the
    attributes that count), or None (every name of the reached classes' code)."""
    types = backend.tensor_types()
    ran = names if names is not None and names.complete else None
    return guards.scan(src, lambda x: isinstance(x, types), ran.names if ran else None, backend.tensor_holders,
                       ran.by_object if ran else None, backend.module_holders, backend.renewed_attributes,
                       backend.hook_holders, backend.watch_loads, ran.probes if ran else NO_PROBES,
                       ran.probed_by_object if ran else None, list(ran.read_globals.values()) if ran else ())


def layer_guard(backend: Backend, layer: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                names: NameRecorder | None) -> GuardSet | None:
    """The guard of the values the layer's forward reads, read now; None where there is nothing to guard."""
    src = layer_sources(layer, args, kwargs)
    if src is None:
        return None
    guard = GuardSet(layer_scan(backend, src, names))
    return guard if len(guard) else None


def python_writes(backend: Backend, layer: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                  run: Callable[[], Any]) -> tuple[Any, str | None]:
    """``run()`` (one eager call of the layer), and the Python value it changed of those the forward reads (an
    attribute counter ``self.calls += 1``), as ``path (old -> new)``, or None.  A layer that writes one on every
    call cannot be graphed: its recording's extra passes would write it again and a replay would not write it.
    The sources are found once, before the call, and read again after it (as a ``@graphed`` warmup's watch does)."""
    src = layer_sources(layer, args, kwargs)
    if src is None:
        return run(), None
    before = layer_scan(backend, src)
    out = run()
    changed = py_writes.writes(before, lambda: layer_scan(backend, src))
    if not changed:
        return out, None
    path, old, new = changed[0]
    return out, f"{path} ({old} -> {new})" + (f" and {len(changed) - 1} more" if len(changed) > 1 else "")


def changed_key(key: tuple[Any, ...], guard: GuardSet, hops: int,
                variants: int) -> tuple[tuple[Any, ...], str] | str:
    """The key of a call whose values differ from ``guard``'s (its key ``key``), with the label of what changed; or
    the reason it runs eagerly: values that cannot key a graph, ``hops`` keys followed already, or values that
    change from call to call (``variants`` keys made for other values of the same arguments, each within a key's
    warmup of the one before: a counter would make a key per call; a value changed once an epoch never gets here)."""
    path, old, new = guard.change() or ("a value", "?", "?")
    if variants >= MAX_VARIANTS:
        return (f"a value it reads changes from call to call: {path} was {old}, now {new} (a graph per value would "
                f"be recorded for every call; {MAX_VARIANTS} were made): pass it as an argument (a tensor) instead")
    values = guard.values() if hops < _HOPS else None
    if values is None:
        return f"a value it reads changed and cannot key a graph: {path} was {old}, now {new}"
    shown = ", ".join(f"{p}={now}" for p, (_was, now) in guard.shown().items())
    return (*key, (READ_VALUES, values)), shown
