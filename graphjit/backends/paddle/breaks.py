"""Paddle: making a function a graph break for SOT (it runs the call eagerly between two translated
subgraphs)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import paddle

from .sot import skip_graphjit_in_sot


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
    """A function that calls ``fn`` with SOT's frame hook off (``core.set_eval_frame(None)``, what SOT's own
    ``breakpoint`` does), registered as a SOT graph break, with graphjit's own files on SOT's skip list: SOT
    runs the call eagerly between two subgraphs, and nothing ``fn`` calls is translated."""
    skip_graphjit_in_sot()
    set_eval_frame = getattr(getattr(paddle, "framework", None), "core", None)
    set_eval_frame = getattr(set_eval_frame, "set_eval_frame", None)

    @functools.wraps(fn)
    def untraced(*args: Any, **kwargs: Any) -> Any:
        if set_eval_frame is None:
            return fn(*args, **kwargs)
        previous = set_eval_frame(None)
        try:
            return fn(*args, **kwargs)
        finally:
            set_eval_frame(previous)

    # Not a Paddle module: SOT must not take the function for a Paddle op.
    untraced.__module__ = getattr(fn, "__module__", None) or __name__
    not_to_static = getattr(paddle.jit, "not_to_static", None)
    if not_to_static is not None:  # the AST tracer calls it as it is (and the island refuses static mode)
        untraced = not_to_static(untraced)
    register(untraced)
    return untraced
