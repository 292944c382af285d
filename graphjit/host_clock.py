"""Whether a call read the host's clock: ``time.time()``, ``time.perf_counter()``, ``time.monotonic()`` (and their
``_ns`` forms), ``time.process_time()``, ``time.thread_time()``, ``time.clock_gettime()``, ``datetime.now()`` /
``utcnow()`` / ``today()``; not ``time.localtime()``, ``gmtime()``, ``ctime()`` or ``strftime()``, which read it only
without an argument (a conversion of a given time is no read).
A replay runs no Python, so it would hand back the capture's reading every time: a deadline, a timestamp or a decay
computed from it would stay frozen, and verify, which compares one replay right after the capture, may pass.  Such a
key runs uncaptured (:data:`REASON`).

Framework-free.  The reads are seen by the name recorder's profile hook (:class:`graphjit.names.NameRecorder`, the
``c_call`` events of the last warmup call, the only one where ``warmup=1``), in the user's code only (a script's, a
notebook's ``__main__``): a framework's, graphjit's or the standard library's own timing (a log record's timestamp:
printing is its own reason) is not the call's.  Not seen where no name recorder runs: a tracer that runs a compiled
program (``tracer="compile"``, Paddle's), a profiler of the user's already set.  An island
(``@graphjit.eager``) runs on every call and may read it.
"""

from __future__ import annotations

import datetime
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


def read(fn: Any) -> str | None:
    """The name of the clock ``fn`` (a C function a ``c_call`` event names) reads, or None."""
    if type(fn) is types.BuiltinFunctionType:
        if fn in _FUNCTIONS:
            return f"time.{fn.__name__}()"
        owner = getattr(fn, "__self__", None)  # a classmethod of datetime bound to its class: a builtin method
        if isinstance(owner, type) and issubclass(owner, _CLASSES) and fn.__name__ in _METHODS:
            return f"{owner.__name__}.{fn.__name__}()"
    return None
