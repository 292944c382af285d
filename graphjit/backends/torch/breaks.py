"""torch: making a function a graph break for ``torch.compile`` (Dynamo runs it eagerly between two
compiled graphs, with Dynamo off inside it), and keeping Dynamo out of graphjit's own code."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

import torch

log = logging.getLogger("graphjit")
_shielded = False


def shield() -> None:
    """Dynamo never compiles graphjit's own frames: graphjit's folder goes on Dynamo's skip list (as torch's own
    folders are).  A graphed function called inside a compiled one is a graph break (``_torchdynamo_disable``);
    without this, Dynamo would then compile the frames of graphjit's call path one by one, guarding graphjit's
    module state (it failed building such guards).  Idempotent; where this torch has no skip list, nothing."""
    global _shielded
    if _shielded:
        return
    _shielded = True
    try:
        from torch._dynamo import trace_rules

        trace_rules.add("graphjit")
    except Exception as exc:  # a torch without the hook: compiled code around graphed calls is rare
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
