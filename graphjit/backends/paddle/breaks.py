"""Paddle: making a function a graph break for SOT (it runs the call eagerly between two translated
subgraphs)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .graphs import skip_graphjit_in_sot


def register(fn: Any) -> str | None:
    """Register ``fn`` with SOT as a graph break; returns what was done (None: this Paddle has no SOT)."""
    try:
        from paddle.jit.sot.utils import paddle_api_config as config
    except ImportError:
        return None
    add_function = getattr(config, "add_break_graph_function", None)
    if add_function is not None:  # Paddle 3.x: any function can break the graph
        add_function(fn)
        return "registered with SOT as a graph break"
    add_apis = getattr(config, "add_break_graph_apis", None)
    apis = getattr(config, "paddle_api_list", None)
    if add_apis is not None and isinstance(apis, list):
        # Paddle 2.6: only a function SOT takes for a Paddle API is checked against the break list;
        # anything else would be inlined (SOT would trace the function's body).
        if not any(a is fn for a in apis):
            apis.append(fn)
        add_apis([fn])
        return "registered with SOT as a Paddle API that breaks the graph"
    return None


def graph_break(fn: Callable[..., Any], reason: str) -> Callable[..., Any]:
    """``fn``, registered as a SOT graph break, with graphjit's own files on SOT's skip list (the call runs
    eagerly after the break, and SOT's frame hook must not translate graphjit's code then)."""
    skip_graphjit_in_sot()
    register(fn)
    return fn
