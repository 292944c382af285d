"""Whether a call read the host's clock: ``time.time()``, ``time.perf_counter()``, ``time.monotonic()`` (and their
``_ns`` forms), ``time.process_time()``, ``time.thread_time()``, ``time.clock_gettime()``, ``datetime.now()`` /
``utcnow()`` / ``today()``; ``time.localtime()``, ``gmtime()``, ``ctime()``, ``asctime()`` and ``strftime(format)``
where the call passes no time to convert (the caller's ``CALL`` instruction counts its arguments; a call it cannot
count, ``f(*args)``, is taken as a read; an explicit ``None`` is not seen).
A replay runs no Python, so it would hand back the capture's reading every time: a deadline, a timestamp or a decay
computed from it would stay frozen, and verify, which compares one replay right after the capture, may pass.  Such a
key runs uncaptured (:data:`REASON`).

Framework-free.  The reads are seen by the name recorder's profile hook (:class:`graphjit.names.NameRecorder`, the
``c_call`` events of the last warmup call, the only one where ``warmup=1``), in the user's code only (a script's, a
notebook's ``__main__``): a framework's, graphjit's or the standard library's own timing (a log record's timestamp:
printing is its own reason) is not the call's.  Under ``tracer="compile"`` the recorder watches the Python Dynamo
runs between its graphs (a clock read is a graph break), with ``names=False``; under Paddle's ``sot`` the code it
generates from the function's calls the clock through the tracer's own frames (``Backend.simulator_modules``), which
the recorder takes as the function's.  Not seen where no recorder runs: Paddle's ``ast`` program (no Python runs), a
profiler of the user's already set.  An island
(``@graphjit.eager``) runs on every call and may read it.
"""

from __future__ import annotations

import datetime
import dis
import time
import types
from typing import Any

REASON = "reads the host clock"
"""The reason a key whose warmup call read the clock runs uncaptured."""

_FUNCTIONS = frozenset(getattr(time, name) for name in (
    "time", "time_ns", "perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "process_time",
    "process_time_ns", "thread_time", "thread_time_ns", "clock_gettime", "clock_gettime_ns") if hasattr(time, name))
_METHODS = frozenset(("now", "utcnow", "today"))
_CLASSES = (datetime.datetime, datetime.date)
_CONVERSIONS = {getattr(time, name): most for name, most in (
    ("localtime", 0), ("gmtime", 0), ("ctime", 0), ("asctime", 0), ("strftime", 1)) if hasattr(time, name)}
"""The conversions that read the clock when called with at most this many arguments (no time of the caller's)."""
MODULE = time
"""The module whose functions :func:`read` names; its other clocks are classmethods (bound to a class)."""
_CALLS = frozenset(dis.opmap[name] for name in ("CALL", "CALL_KW", "CALL_FUNCTION", "CALL_METHOD")
                   if name in dis.opmap)


def read(fn: Any, frame: types.FrameType | None = None, arguments: int | None = None) -> str | None:
    """The name of the clock ``fn`` (a C function a ``c_call`` event names, called from ``frame``) reads, or None.
    Every clock it names is a function of the ``time`` module (:data:`MODULE`) or a classmethod of a class: a
    function bound to anything else (a tensor's method, most of what a step calls) is answered by that alone, before
    any set lookup.  ``arguments``: how many the call passes, where the caller knows (a simulating tracer's frame
    unpacks them: ``f(*args)``); else counted from ``frame``'s call instruction."""
    if type(fn) is not types.BuiltinFunctionType:
        return None
    owner: Any = fn.__self__
    if owner is time:
        if fn in _FUNCTIONS:
            return f"time.{fn.__name__}()"
        most = _CONVERSIONS.get(fn)
        if most is not None:
            n = arguments if arguments is not None else _arguments(frame)
            return f"time.{fn.__name__}() without a time" if n is None or n <= most else None
    elif issubclass(type(owner), type) and issubclass(owner, _CLASSES) and fn.__name__ in _METHODS:
        return f"{owner.__name__}.{fn.__name__}()"  # a classmethod of datetime bound to its class
    return None


def _arguments(frame: types.FrameType | None) -> int | None:
    """How many arguments the call ``frame`` is making passes (its ``CALL`` instruction's count), or None where the
    instruction does not say (``f(*args)``, no frame)."""
    if frame is None:
        return None
    try:
        code, at = frame.f_code.co_code, frame.f_lasti
        return code[at + 1] if code[at] in _CALLS else None
    except (IndexError, AttributeError):
        return None
