"""torch: making a function a graph break for ``torch.compile`` (Dynamo runs it eagerly between two
compiled graphs, with Dynamo off inside it), and keeping Dynamo out of graphjit's own code."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger("graphjit")
_shielded = False


_INLINED = frozenset(("dist.py",))
"""Files of this folder Dynamo must still inline: the all-reduce graphjit publishes in place of torch.distributed's
(``dist.py``) puts graphjit's custom op into the graph of compiled code that calls it."""


def shield() -> None:
    """Dynamo never compiles graphjit's own call path: graphjit's modules (its top level, ``backends/`` and this
    folder, but for :data:`_INLINED`) go on Dynamo's skip list, as torch's own folders are.  A graphed function called
    inside a compiled one is a graph break (``_torchdynamo_disable``); without this, Dynamo then compiled the frames of
    graphjit's call path one by one, guarding graphjit's module state (and failed building such guards).
    Idempotent; where this torch has no skip list, nothing."""
    global _shielded
    if _shielded:
        return
    _shielded = True
    here = Path(__file__).resolve().parent
    root = here.parents[1]  # graphjit/
    files = [*root.glob("*.py"), *(root / "backends").glob("*.py"),
             *(p for p in here.glob("*.py") if p.name not in _INLINED)]
    try:
        from torch._dynamo import trace_rules

        trace_rules.SKIP_DIRS.extend(p.as_posix() for p in files)
        trace_rules._recompile_re()
    except Exception as exc:  # a torch without the list: compiled code around graphed calls is rare
        log.debug("graphjit: could not put graphjit on Dynamo's skip list (%s)", exc)


@contextlib.contextmanager
def dynamo_off() -> Iterator[None]:
    """The block runs with Dynamo's frame hook off (as ``torch.compiler.disable`` runs a function), so the graphed
    function graphjit calls (a warmup, a capture, verify's reference) runs as written even when the graphed call
    was made from compiled code; a ``torch.compile``'d function inside still compiles (it sets its own hook)."""
    try:
        from torch._C._dynamo.eval_frame import set_eval_frame
    except ImportError:
        yield
        return
    prior = set_eval_frame(None)
    try:
        yield
    finally:
        set_eval_frame(prior)


def graph_break(fn: Callable[..., Any], reason: str) -> Callable[..., Any]:
    """``fn`` behind ``torch.compiler.disable`` (``reason`` shows in Dynamo's graph-break logs where this torch
    takes one); ``fn`` itself where this torch has no ``torch.compiler.disable`` (< 2.1: nothing to break)."""
    disable = getattr(getattr(torch, "compiler", None), "disable", None)
    if disable is None:
        return fn
    try:
        return disable(fn, reason=reason)  # type: ignore[no-any-return]
    except TypeError:  # torch < 2.7: no reason=
        return disable(fn)  # type: ignore[no-any-return]
