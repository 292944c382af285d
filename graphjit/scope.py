"""``capture_scope``: ahead-of-time capture with one memory pool, deferred warmup and progress.

Inside ``with graphjit.capture_scope():`` the first call of each key of every graphed function
traces, warms up and captures right there (as it would outside), but:

* all graphs captured in the scope share one memory pool per device (replaying them in any order is
  safe: graphjit keeps every graph's outputs alive, so no capture reuses another's outputs);
* collectives are in capture mode (:func:`collective_mode`), so that tracing and warmup see the same
  collective path as the captured graph will (the FastDeploy lesson: tracing before the scope froze
  the eager branch into the program);
* progress is logged, one line per capture (``progress=True``), with ``k/total`` when ``total`` is given.

Scopes nest; the outermost one owns the pool.  A scope belongs to the thread that entered it: other
threads do not see it (:func:`in_capture_scope` is per thread), and entering one scope object twice is
a :class:`~graphjit.errors.ConfigError` (nest a new ``capture_scope()`` instead).  Nothing is traced or
warmed up at decoration time.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

log = logging.getLogger("graphjit")

_lock = threading.Lock()


class _ThreadState(threading.local):
    """What a thread is doing with graphed calls; the class values are every new thread's (so that reading one is
    never a missing attribute: the replay lane reads ``phase`` on every call)."""

    phase: str | None = None
    capture: int = 0
    run: int = 0
    scopes: list[CaptureScope] | None = None


_tls = _ThreadState()
_capture_ids = itertools.count(1)

AFTER_CAPTURE: list[Callable[[], None]] = []
"""Called, in order, on the capturing thread right after each successful capture of a graphed call
(after the backend's capture returned, before the graph is replayed for the first time, verify's
replay included).  :mod:`graphjit.collectives` registers the buffers of the all-reduces captured
in that graph on every rank here.  A hook that raises fails the capture: the graph is dropped and
the key falls back as for any capture failure.  Hooks must be cheap when they have nothing to do."""


class CaptureScope:
    """One ``capture_scope`` block: its pools, its counters and its progress log."""

    def __init__(self, progress: bool = True, total: int | None = None, name: str = "capture_scope") -> None:
        if total is not None and (isinstance(total, bool) or not isinstance(total, int) or total < 0):
            from .errors import ConfigError

            raise ConfigError(f"capture_scope(total={total!r}): expected the number of captures to expect (int >= 0)")
        self.progress = progress
        self.total = total
        self.name = name
        self.captures = 0
        self.failures = 0
        self.uncaptured: dict[str, int] = {}  # calls that could not capture at all (no CUDA here), by reason
        self.deferred: dict[str, int] = {}  # calls of keys that advance their own scalars: warmed up only, by path
        self.capture_ms = 0.0
        self.started = 0.0
        self._pools: dict[tuple[str, str], Any] = {}
        self.parent: CaptureScope | None = None

    def pool_for(self, backend: Any, device: str) -> Any:
        """The shared memory pool of this scope (of its outermost parent) for ``backend`` on ``device``."""
        root = self
        while root.parent is not None:
            root = root.parent
        key = (backend.name, device)
        with _lock:
            if key not in root._pools:
                root._pools[key] = backend.new_pool(device)
            return root._pools[key]

    def note_capture(self, function: str, key: str, ms: float, ok: bool, reason: str | None = None) -> None:
        """Count one capture attempt and log a progress line."""
        self.captures += 1
        self.capture_ms += ms
        if not ok:
            self.failures += 1
        if self.progress:
            count = f"{self.captures}/{self.total}" if self.total else f"{self.captures}"
            elapsed = time.perf_counter() - self.started
            eta = ""
            if self.total and self.captures < self.total and self.captures:
                eta = f", about {elapsed / self.captures * (self.total - self.captures):.1f} s left"
            status = f"{ms:.1f} ms" if ok else f"not captured ({reason})"
            log.info("graphjit %s [%s] %s %s: %s%s", self.name, count, function, key, status, eta)

    def note_uncaptured(self, reason: str) -> None:
        """Count one call in the scope that could not try to capture (no CUDA graphs on this machine)."""
        self.uncaptured[reason] = self.uncaptured.get(reason, 0) + 1

    def note_deferred(self, paths: Sequence[str]) -> None:
        """Count one call in the scope that only warmed its key up: the call advances Python scalars of its own key
        (``paths``, :mod:`graphjit.advances`), so a run after it would be the next value's, not an extra warmup of
        this key; the key is captured on a later call (a later value of its counter's class, or outside the
        scope)."""
        where = paths[0] + (" and more" if len(paths) > 1 else "")  # (which others moved may vary from call to call)
        self.deferred[where] = self.deferred.get(where, 0) + 1

    def stats(self) -> dict[str, Any]:
        return {"captures": self.captures, "failures": self.failures, "capture_ms": round(self.capture_ms, 3),
                "uncaptured": dict(self.uncaptured), "deferred": dict(self.deferred),
                "seconds": round(time.perf_counter() - self.started, 3) if self.started else 0.0}

    def __enter__(self) -> CaptureScope:
        stack = _thread_stack()
        if self in stack:
            from .errors import ConfigError

            raise ConfigError(f"{self.name} is already active on this thread: a scope object is entered once; "
                              "nest a new graphjit.capture_scope() instead")
        self.parent = stack[-1] if stack else None
        stack.append(self)
        self.started = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        stack = _thread_stack()
        if self in stack:
            stack.remove(self)
        if self.progress:
            log.info("graphjit %s: %s", self.name, self.summary())

    def summary(self) -> str:
        """What the scope did, plainly: the graphs captured (and those that failed), the calls that only warmed up a
        key that advances its own scalars (:meth:`note_deferred`), and the calls that ran the traced function
        without a graph and why (``no CUDA graphs: ...`` on a machine without CUDA)."""
        s = self.stats()
        captured = self.captures - self.failures
        parts = []
        if self.captures:
            failed = f", {self.failures} key(s) not captured" if self.failures else ""
            parts.append(f"{captured} graph(s) captured{failed} ({s['capture_ms']:.1f} ms capturing)")
        elif not self.uncaptured:
            parts.append("nothing captured")
        for where, n in self.deferred.items():
            parts.append(f"{n} call(s) only warmed up their key: each advances {where} of its own key, so it is "
                         "captured on a later call (a later value of its counter's class, or the key's own after the "
                         "scope)")
        for reason, n in self.uncaptured.items():
            parts.append(f"{'no graphs: ' if not self.captures else ''}{n} call(s) ran the traced function "
                         f"uncaptured ({reason})")
        return "; ".join(parts) + f"; {s['seconds']:.2f} s"


def capture_scope(progress: bool = True, total: int | None = None) -> CaptureScope:
    """Capture graphs ahead of time: see the module docstring for what the scope changes."""
    return CaptureScope(progress=progress, total=total)


def _thread_stack() -> list[CaptureScope]:
    stack = _tls.scopes
    if stack is None:
        stack = _tls.scopes = []
    return stack


def current() -> CaptureScope | None:
    """The innermost capture scope active on this thread, or None."""
    stack = _tls.scopes
    return stack[-1] if stack else None


def in_capture_scope() -> bool:
    """True inside ``capture_scope()`` on this thread (user code may branch on it, e.g. to skip a debug
    print); other threads do not see this thread's scope."""
    return bool(_tls.scopes)


@contextlib.contextmanager
def graphed_call(phase: str) -> Iterator[None]:
    """Mark the calling thread as inside a graphed call (``phase``: "warmup", "capture" or "replay")."""
    previous = _tls.phase
    _tls.phase = phase
    _tls.run = next(_capture_ids)  # each run of the function its own number (run_id)
    if phase == "capture":
        _tls.capture = _tls.run
    try:
        yield
    finally:
        _tls.phase = previous


def enter_phase(phase: str) -> str | None:
    """:func:`graphed_call` without a context manager, for the replay path (a piecewise graph's islands): mark the
    thread as in ``phase`` ("replay" or "island" only) and return the phase to give :func:`leave_phase` after."""
    previous = _tls.phase
    _tls.phase = phase
    return previous


def leave_phase(previous: str | None) -> None:
    """Undo :func:`enter_phase` (call it in a ``finally``)."""
    _tls.phase = previous


def thread_state() -> threading.local:
    """The per-thread object whose ``phase`` :func:`phase` reads (the replay lane reads it in C)."""
    return _tls


def phase() -> str | None:
    """The graphed-call phase of this thread ("warmup", "capture", "replay", "island": a piecewise graph's replay
    loop, its islands' code), or None."""
    return _tls.phase


def run_id() -> int:
    """A number identifying the graphed-call run (a warmup, capture or reference run of the function) this thread is
    in or was in last (0: none yet)."""
    return _tls.run


def last_capture() -> int:
    """A number identifying the most recent graphed-call capture begun on this thread (0: none yet)."""
    return _tls.capture


def collective_mode() -> str | None:
    """How a collective called now should behave.

    ``"capture"`` while a graph is being captured on this thread, ``"graphed"`` inside a graphed
    call's warmup or inside a capture scope, ``None`` otherwise (plain eager code).
    """
    p = phase()
    if p == "capture":
        return "capture"
    if p is not None or _tls.scopes:
        return "graphed"
    return None
