"""The options of ``@graphed``, checked when a function is decorated.

:func:`make_options` refuses, with a :class:`~graphjit.errors.ConfigError` naming the option and what it
accepts: an unknown option name (with the closest valid one), a value of the wrong kind, and
combinations that cannot work (a Paddle tracer for torch).  :func:`check_callable` refuses what
``@graphed`` cannot wrap: generator and async functions, classmethod and staticmethod objects (put
``@graphed`` under them), something already graphed.
"""

from __future__ import annotations

import difflib
import inspect
from dataclasses import dataclass, fields
from typing import Any

from .errors import ConfigError
from .keys import BucketsArg
from .policy import DEFAULT_MAX_GRAPHS, check_choice, check_count, check_flag, check_max_graphs

BACKENDS = ("auto", "paddle", "torch")
TRACERS = ("auto", "sot", "ast", "eager", "compile")
OUTPUTS = ("copy", "alias")
POOLS = ("shared", "private")
__all__ = ["DEFAULT_MAX_GRAPHS", "NAMES", "Options", "check_callable", "make_options"]


@dataclass(frozen=True)
class Options:
    """The validated options of one graphed function."""

    backend: str = "auto"
    tracer: str = "auto"
    buckets: BucketsArg = None
    warmup: int = 2
    max_graphs: int | None = None
    outputs: str = "copy"
    verify: bool | None = None
    pool: str = "shared"
    strict: bool | None = None
    dynamic: tuple[str, ...] = ()


NAMES = tuple(f.name for f in fields(Options))


def make_options(given: dict[str, Any]) -> Options:
    """:class:`Options` from the keyword arguments given to ``graphed()``, validated."""
    for name in given:
        if name not in NAMES:
            close = difflib.get_close_matches(name, NAMES, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"graphed() has no option {name!r}{hint} (its options are {', '.join(NAMES)})")
    dyn = given.get("dynamic", ())
    if isinstance(dyn, str):
        given = {**given, "dynamic": (dyn,)}
    elif isinstance(dyn, list):
        given = {**given, "dynamic": tuple(dyn)}
    o = Options(**given)
    if not isinstance(o.dynamic, tuple) or not all(isinstance(n, str) and n.isidentifier() for n in o.dynamic):
        raise ConfigError(f"graphed(dynamic={o.dynamic!r}): expected a tuple of parameter names, such as "
                          "dynamic=('meta',)")
    check_choice("backend", o.backend, BACKENDS)
    check_choice("tracer", o.tracer, TRACERS)
    check_choice("outputs", o.outputs, OUTPUTS)
    check_choice("pool", o.pool, POOLS)
    check_count("warmup", o.warmup, "graphjit needs one eager call to find what the function writes and to verify "
                "the capture")
    check_max_graphs(o.max_graphs)
    check_flag("verify", o.verify)
    check_flag("strict", o.strict)
    if o.backend == "paddle" and o.tracer == "compile":
        raise ConfigError("tracer='compile' is a torch tracer; paddle tracers are 'sot', 'ast' and 'eager'")
    if o.backend == "torch" and o.tracer in ("sot", "ast"):
        raise ConfigError(f"tracer={o.tracer!r} is a paddle tracer; torch tracers are 'eager' and 'compile'")
    return o


def check_callable(fn: Any, already_graphed: tuple[type, ...]) -> None:
    """Refuse what ``@graphed`` cannot wrap (see the module docstring)."""
    if isinstance(fn, (classmethod, staticmethod)):
        kind = type(fn).__name__
        raise ConfigError(f"graphed() got a {kind} object: put @graphjit.graphed under @{kind} (@{kind} on top, "
                          "then @graphjit.graphed, then def)")
    if not callable(fn):
        raise ConfigError(f"graphed() needs a function or callable, got {type(fn).__name__}")
    if isinstance(fn, already_graphed):
        raise ConfigError(f"{getattr(fn, '__qualname__', fn)!r} is already graphed")
    cls = type(fn)
    target = fn if inspect.isroutine(fn) else (getattr(cls, "forward", None) or cls.__call__)
    if inspect.isgeneratorfunction(target) or inspect.isasyncgenfunction(target):
        raise ConfigError(f"graphed() got a generator function ({getattr(target, '__qualname__', target)}): a CUDA "
                          "graph replays one call's work, and a generator's work happens as it is iterated; graph "
                          "the function that computes one item instead")
    if inspect.iscoroutinefunction(target):
        raise ConfigError(f"graphed() got an async function ({getattr(target, '__qualname__', target)}): graph a "
                          "plain function that runs the GPU work, and await around it")


GRAPHED_DOC = """Capture ``fn`` into CUDA graphs keyed on its input signature, and replay them.

    Usable bare (``@graphed``) or with options (``@graphed(buckets=...)``).  Options are validated
    here (``ConfigError`` naming the option, and the closest valid name for a misspelt one); nothing
    is traced or run until the first call.  Refused here too: generator and async functions, and
    classmethod / staticmethod objects (put ``@graphed`` under them).  See the module docstring for
    what a graph cannot capture.
    """
