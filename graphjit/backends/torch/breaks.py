"""torch: making a function a graph break for ``torch.compile`` (Dynamo runs it eagerly between two
compiled graphs, with Dynamo off inside it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


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
