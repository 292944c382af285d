"""Paddle's modes as graphjit keys calls on them (:meth:`PaddleBackend.modes`, read on every call): grad mode, the
default dtype and the default place (what ``paddle.ones([3])`` makes, and where: a graph froze both), then the AMP
level and dtype in dygraph mode.  Each is read without Paddle's Python wrappers where this Paddle allows it."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import paddle


def _default_dtype_reader() -> Callable[[], Any]:
    """A reader of Paddle's default dtype: the class attribute ``paddle.get_default_dtype()`` returns, without its two
    Python calls, where this Paddle keeps it there."""
    try:
        from paddle.base.layer_helper_base import LayerHelperBase
    except ImportError:
        return paddle.get_default_dtype
    if not hasattr(LayerHelperBase, "_LayerHelperBase__dtype"):
        return paddle.get_default_dtype
    return functools.partial(getattr, LayerHelperBase, "_LayerHelperBase__dtype")


_default_dtype = _default_dtype_reader()
_framework: Any = getattr(getattr(paddle, "base", None), "framework", None)
_GLOBALS: Any = getattr(_framework, "global_var", None)
"""Paddle's thread-local framework state; its ``_dygraph_tracer_`` holds the AMP level and dtype (None
outside dygraph mode)."""
_has_grad: Callable[[], bool] | None = getattr(getattr(getattr(paddle, "base", None), "core", None), "_has_grad", None)
"""What ``paddle.is_grad_enabled()`` returns, as the C function it calls in 3.x (2.6 has none: :func:`read` then reads
the tracer's ``_has_grad``, as 2.6 does)."""
_expected_place_of: Callable[[], Any] | None = getattr(_framework, "_current_expected_place_", None)
"""Paddle's default place (what ``paddle.set_device`` sets), read without ``paddle.get_device``'s string building."""
_place_seen: tuple[Any, str | None] = (None, None)


def expected_place() -> str | None:
    """The default place as a key part: its text (Paddle 2.6's Places hash by identity, and ``==`` on them costs 0.5
    us), made again only where the place object changed since the last read (``paddle.set_device`` makes a new one; a
    GPU build returns the same one until then).  None where this Paddle has no such reader."""
    global _place_seen
    if _expected_place_of is None:
        return None
    place = _expected_place_of()
    seen = _place_seen
    if seen[0] is not place:
        seen = _place_seen = (place, str(place))
    return seen[1]


def _place_at_import() -> str | None:
    try:
        return expected_place()  # Paddle's import set it already: a read (3.x turns a plain Place into its device's)
    except Exception:
        return None


_first_place = _place_at_import()
"""The default place when graphjit's Paddle backend was imported: labels name another one."""


def grad_enabled() -> bool:
    """``paddle.is_grad_enabled()`` without its Python call (3.x's C function, or what 2.6's reads)."""
    if _has_grad is not None:
        return bool(_has_grad())
    tracer = _GLOBALS._dygraph_tracer_ if _GLOBALS is not None else None
    return bool(tracer._has_grad) if tracer is not None else False


def read() -> tuple[Any, ...]:
    """The modes a call is keyed on (see the module docstring)."""
    tracer = _GLOBALS._dygraph_tracer_ if _GLOBALS is not None else None  # thread-local, as Paddle keeps it
    # paddle.is_grad_enabled() without its Python call: 3.x's C function, or what 2.6's reads
    grad = _has_grad() if _has_grad is not None else (tracer._has_grad if tracer is not None else False)
    if tracer is None:
        return (grad, _default_dtype(), expected_place())
    return (grad, _default_dtype(), expected_place(), tracer._amp_level, tracer._amp_dtype)


def describe(modes: tuple[Any, ...]) -> str:
    """The modes of a key's label, where they are not the defaults: ``no_grad``, ``amp(O1, bfloat16)``, ``default
    dtype float16``, ``default place Place(cpu)``."""
    parts = [] if modes[0] else ["no_grad"]
    if len(modes) == 5 and not str(modes[3]).endswith("O0"):
        parts.append(f"amp({str(modes[3]).rsplit('.', 1)[-1]}, {modes[4]})")
    if str(modes[1]) not in ("float32", "paddle.float32"):
        parts.append(f"default dtype {str(modes[1]).replace('paddle.', '')}")
    if modes[2] is not None and modes[2] != _first_place:
        parts.append(f"default place {modes[2]}")
    return " ".join(parts)
