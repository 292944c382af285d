"""What a graphed layer's warmup call does to the state its arguments hold (:func:`watched_call`).

A graphed layer records its graphs with extra eager passes of the layer (the side warmup, the capture, verify's
replay) that start from a snapshot of the layer's own buffers and RNG, on graphjit's copies of the tensor arguments;
its replays run kernels, no Python.  So a call that stores tensors in an object it receives (transformers'
``DynamicCache`` passed to each decoder layer: ``past_key_values.layers[0].keys``), replaces or moves them, or
writes a tensor argument (or one an argument holds) in place cannot be graphed: the recording passes would store
again into the same object, and a replay would store nothing and write graphjit's copy of an argument instead of
the caller's tensor.  Each warmup call of a key is watched; a key whose call does any of that runs the layer
eagerly from then on, with a reason naming the argument (:class:`ArgumentWrites`).

What it sees: tensors reachable from the arguments through containers and object attributes
(:func:`graphjit.reach.walk`), written in place by version counter (contents for small ones), rebound, added or
moved; and a draw from the host's global random generators (Python's ``random``, numpy's: :mod:`graphjit.host_random`).
The last warmup call of a key (:func:`host_reads`) is also watched for what it reads from the host on every call that
no tensor shows: the clock (:mod:`graphjit.host_clock`), an item of an iterator the layer or an argument holds
(:mod:`graphjit.iterators`), a print or log line (the key's first call excepted).  Not seen here: plain Python
values (an int counter) changed in such an object (:func:`graphjit.training.values.python_writes` sees those the
forward reads), and a write only some calls make (a key whose warmup calls did not make it is recorded).  Runs during
warmup only, never on a replay.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import host_clock, host_random, iterators
from ..backends.base import Backend
from ..names import NameRecorder
from ..reach import ATOMS, Path, addresses, describe, moved, rebinds, walk
from ..warmup import PRINTS
from ..writes import WriteProbe


@dataclass(frozen=True)
class ArgumentWrites:
    """Why a key's calls run the layer eagerly: ``reason`` (counted in stats, names the argument) and ``message``."""

    reason: str
    message: str


def named_arguments(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[tuple[str, Any]]:
    """``(root name, value)`` of each argument of a call worth walking (not a plain number or string), named as
    ``fn``'s parameters (``argument 'past_key_values'``), by position where the call does not bind."""
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs).arguments
        items = list(bound.items())
    except (TypeError, ValueError):
        items = [(str(i), a) for i, a in enumerate(args)] + list(kwargs.items())
    return [(f"argument {name!r}", value) for name, value in items if type(value) not in ATOMS]


def watched_call(backend: Backend, run: Callable[[], Any], roots: list[tuple[str, Any]],
                 budget: int, first: bool = False, device: str | None = None) -> tuple[Any, ArgumentWrites | None]:
    """Run ``run()`` (the layer's eager call) once; return its result and what, if anything, it did to the
    tensors ``roots`` hold that a graphed call could not do (``first``: the key's first call, whose draws from the
    host's random generators may be a lazy initialisation's; ``device``: the key's, whose framework's host generators
    count too, ``Backend.host_generators``).  Exceptions of ``run`` propagate unchanged."""
    host = None if first else host_random.Saved(backend.host_generators(device) if device is not None else ())
    if not roots:
        out = run()
        return out, _drew(host)
    b = backend
    types = b.tensor_types()

    def is_tensor(x: Any) -> bool:
        return isinstance(x, types)

    before = walk(roots, is_tensor)
    where = addresses(before, b.data_ptr)
    probe = WriteProbe(b, before, budget)
    out = run()
    drew = _drew(host)
    after = walk(roots, is_tensor)
    rebound, added = rebinds(before, after)
    stored = rebound + added + moved(before, where, b.data_ptr)
    if stored:
        return out, _stored(stored)
    written = [p for _t, p in probe.written()]
    return out, _written(written) if written else drew


def host_reads(backend: Backend, layer: Any, roots: list[tuple[str, Any]], run: Callable[[], Any],
               first: bool) -> tuple[Any, ArgumentWrites | None]:
    """Run ``run()`` (the key's last warmup call) under graphjit's name recorder, with the positions of the iterators
    ``layer`` and the arguments ``roots`` hold read before and after it; return its result and why the key must run
    eagerly, or None.  A replay runs no Python: a clock reading would stay the recording's, an iterator would not
    advance (and the recording's extra passes would each take an item the calls never see), a print would not print.
    ``first``: the key's first call (a lazy initialisation may print once).  Where a profiler of the user's is set the
    recorder cannot run: the clock and prints are then not seen (the iterators still are)."""
    types = backend.tensor_types()
    found = walk([("self", layer), *roots], lambda x: isinstance(x, types)).iterators
    places = iterators.positions(found)
    recorder = NameRecorder()
    with backend.compiles_unwatched(recorder.pause, recorder.resume), recorder:  # (a compile: off the hook)
        out = run()
    advanced = iterators.advanced(found, places)
    if recorder.emitted and not first:  # (the order of @graphed's reasons: warmup.py)
        return out, ArgumentWrites(PRINTS, f"the layer prints or logs on every call ({'; '.join(recorder.emitted)}); "
                                   "a replay runs no Python, so it would not: calls of this input signature run the "
                                   "layer eagerly (print or log outside the layer)")
    if advanced:
        return out, ArgumentWrites(iterators.REASON, f"the layer advances an iterator on every call "
                                   f"({', '.join(advanced)}); graphed_layer records its graphs with extra eager "
                                   "passes, each of which would take an item the calls never see, and a replay runs "
                                   "no Python, so it would take none: calls of this input signature run the layer "
                                   "eagerly (pass the item in as an argument)")
    if recorder.clocked:
        return out, ArgumentWrites(host_clock.REASON, f"the layer reads the host clock ({'; '.join(recorder.clocked)});"
                                   " a replay runs no Python and would hand back the recording's reading every time: "
                                   "calls of this input signature run the layer eagerly (read it outside the layer "
                                   "and pass what it decides)")
    return out, None


def _drew(before: host_random.Saved | None) -> ArgumentWrites | None:
    """Why a key whose call drew from the host's random generators runs eagerly (the replays would hand back the
    recording's numbers), or None (:mod:`graphjit.host_random`; ``before`` None: not watched)."""
    which = before.moved() if before is not None else None
    if which is None:
        return None
    return ArgumentWrites(host_random.REASON,
                          f"the layer draws numbers from {which} on the CPU; a replay runs no Python and would hand "
                          "back the recording's numbers: calls of this input signature run the layer eagerly (draw "
                          "them on the device, torch.rand, or pass them in)")


def _where(paths: list[Path]) -> str:
    return ", ".join(describe(p) for p in paths[:3]) + (" ..." if len(paths) > 3 else "")


def _stored(paths: list[Path]) -> ArgumentWrites:
    return ArgumentWrites(
        f"stores tensors in its {paths[0][0]}",
        f"the layer's call stores, replaces or moves tensors held by objects it receives ({_where(paths)}); "
        "graphed_layer records its graphs with extra eager passes, which would store them again, and a replay runs "
        "no Python, so it would store nothing: calls of this input signature run the layer eagerly. A cache that "
        "grows per call does this (transformers' DynamicCache: pass use_cache=False in training)")


def _written(paths: list[Path]) -> ArgumentWrites:
    return ArgumentWrites(
        f"writes its {paths[0][0]} in place",
        f"the layer's call writes tensors it receives in place ({_where(paths)}); a replay would write graphjit's "
        "copy of them instead of the caller's tensors: calls of this input signature run the layer eagerly (return "
        "the new value instead, and write it outside the layer)")
