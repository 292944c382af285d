"""Finding CPU-GPU syncs in a warmup run with torch's sync debug mode.

``torch.cuda.set_sync_debug_mode("warn")`` makes every synchronising CUDA call (``.item()``, ``.cpu()``,
``nonzero``, a stream synchronize; see ``c10/cuda/CUDAFunctions.cpp``, ``warn_or_error_on_sync``) issue a
``UserWarning`` whose text is exactly :data:`SYNC_REPORT`, in the Python thread that made the call.  Only
that text counts as a sync.  torch's other warnings do not, in particular the one-time notice the first
switch to the debug mode prints in every process ("Synchronization debug mode is a prototype feature and
does not yet detect all synchronizing operations"), whose wording also contains "synchronizing": counting
it made the first watched key of every process run uncaptured.

The debug mode and Python's warning machinery are process-wide, while a watch belongs to one thread.
:class:`SyncWatcher` therefore installs itself once for all watching threads (counted, like
``collector_paused``) and sorts each warning by the thread that issued it:

* a watched thread's sync reports are recorded for that thread's watch (dropped inside an island, which
  may sync by contract, and while torch.compile compiles: the compiler's own syncs are not in its kernels);
* another thread's sync reports exist only because graphjit switched the mode on: they are dropped
  (passed on unchanged where the user had the debug mode on already);
* every other warning goes on to whatever displays warnings (the user's ``showwarning``, pytest's
  recorder), unchanged.

Guarantees: the watched block runs to its end (``warn`` never raises); the debug mode, ``showwarning``
and the warning filters are as before once the last watch ends.  Limits: a block that itself enters
``warnings.catch_warnings()`` hides its syncs from the watch (the capture then reports them), and syncs
torch's debug mode does not detect (``torch.cuda.synchronize()``, ``Event.synchronize()``) are found
only when the capture fails on them.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
import types
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

SYNC_REPORT = "called a synchronizing CUDA operation"
"""The whole text of torch's report of one synchronising call (``warn_or_error_on_sync``)."""

DEBUG_MODE_NOTICE = "Synchronization debug mode is a prototype feature"
"""The start of the notice torch prints once per process when the debug mode is first switched on."""

_ORIGINAL_SHOWWARNING = warnings.showwarning


def is_sync_report(text: str) -> bool:
    """True only for torch's report of a synchronising CUDA call (not for its notices about the mode)."""
    return text.strip().startswith(SYNC_REPORT)


@dataclass
class _Watch:
    hits: list[str]
    islands: int = 0


@dataclass
class _ThreadWatches:
    watches: list[_Watch] = field(default_factory=list)
    islands: int = 0


class SyncWatcher:
    """The process-wide half of ``TorchBackend.sync_watch`` (one instance per process)."""

    def __init__(self, get_mode: Callable[[], int], set_mode: Callable[[int], None]) -> None:
        self._get_mode = get_mode
        self._set_mode = set_mode
        self._lock = threading.Lock()
        self._depth = 0
        self._threads: dict[int, _ThreadWatches] = {}
        self._previous_mode = 0
        self._previous_show: Any = None
        self._filter: tuple[Any, ...] | None = None

    @contextlib.contextmanager
    def watch(self, hits: list[str]) -> Iterator[None]:
        """Append ``"<report> at <file>:<line>"`` to ``hits`` for every sync this thread makes in the block."""
        me = threading.get_ident()
        w = _Watch(hits)
        with self._lock:
            if self._depth == 0:
                self._install()
            self._depth += 1
            self._threads.setdefault(me, _ThreadWatches()).watches.append(w)
        try:
            yield
        finally:
            with self._lock:
                mine = self._threads[me]
                mine.watches.remove(w)
                if not mine.watches:
                    del self._threads[me]
                self._depth -= 1
                if self._depth == 0:
                    self._uninstall()

    @contextlib.contextmanager
    def island(self) -> Iterator[None]:
        """Inside :meth:`watch` on this thread: the block's syncs are allowed (not recorded)."""
        mine = self._threads.get(threading.get_ident())
        if mine is None:
            yield
            return
        mine.islands += 1
        try:
            yield
        finally:
            mine.islands -= 1

    # -- the process-wide part, under self._lock -------------------------------------------------------
    def _install(self) -> None:
        self._previous_mode = int(self._get_mode())
        current = warnings.showwarning
        if current is not self._show:  # a catch_warnings() that saved the hook may have put it back since
            self._previous_show = current
        # Every sync report reaches the hook: none is swallowed as "already shown at this line".
        warnings.filterwarnings("always", message=re.escape(SYNC_REPORT))
        self._filter = warnings.filters[0]
        warnings.showwarning = self._show
        if self._previous_mode == 0:
            self._set_mode(1)

    def _uninstall(self) -> None:
        if self._previous_mode == 0:
            self._set_mode(0)
        if warnings.showwarning is self._show:
            warnings.showwarning = self._previous_show
        with contextlib.suppress(ValueError):
            warnings.filters.remove(self._filter)  # type: ignore[attr-defined]  # a list at run time
        mutated = getattr(warnings, "_filters_mutated", None)
        if mutated is not None:
            mutated()
        self._filter = None

    def _show(self, message: Any, category: Any, filename: str, lineno: int, file: Any = None,
              line: Any = None) -> None:
        text = str(message)
        if self._depth == 0:  # put back after the watch by a catch_warnings() that had saved it
            _forward(self._previous_show, message, category, filename, lineno, file, line)
            return
        if is_sync_report(text):
            mine = self._threads.get(threading.get_ident())
            if mine is not None:
                if mine.islands == 0 and not _compiling():
                    hint = _hint()
                    for w in mine.watches:
                        w.hits.append(f"{SYNC_REPORT}{hint} at {filename}:{lineno}")
                return
            if self._previous_mode == 0:
                return  # another thread: reported only because graphjit switched the mode on
        elif self._previous_mode == 0 and text.strip().startswith(DEBUG_MODE_NOTICE):
            return  # about the mode graphjit switched on, not about the user's code
        _forward(self._previous_show, message, category, filename, lineno, file, line)


_SCALER = f"{os.sep}amp{os.sep}grad_scaler.py"
SCALER_HINT = (" (GradScaler.step() reads found_inf on the CPU unless the optimizer takes it on the GPU: make it "
               "fused, AdamW(..., fused=True) or Adam(..., fused=True), and graphjit makes it capturable)")


def _hint() -> str:
    """What to change for a sync torch's own code makes on a user's behalf (a GradScaler stepping a foreach
    optimizer)."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename.endswith(_SCALER):
            return SCALER_HINT
        frame = frame.f_back  # type: ignore[assignment]
    return ""


_COMPILER = (f"{os.sep}torch{os.sep}_dynamo{os.sep}", f"{os.sep}torch{os.sep}_inductor{os.sep}")


def _compiling() -> bool:
    """True while torch.compile translates or compiles (its frames are on the stack): a sync there is the
    compiler's own (a guard's value, a logged tensor), made once per compilation, never part of the kernels it
    produces; a replay does not run it."""
    frame: types.FrameType | None = sys._getframe(2)
    depth = 0
    while frame is not None and depth < 200:
        name = frame.f_code.co_filename
        if _COMPILER[0] in name or _COMPILER[1] in name:
            return True
        frame, depth = frame.f_back, depth + 1
    return False


def _forward(show: Any, message: Any, category: Any, filename: str, lineno: int, file: Any, line: Any) -> None:
    """Display a warning the way it would have been without the watch (a replaced ``showwarning``, or the
    default implementation that ``catch_warnings(record=True)`` redirects)."""
    hook = isinstance(getattr(show, "__self__", None), SyncWatcher)  # never back into a watcher: no loop
    if show is not None and show is not _ORIGINAL_SHOWWARNING and not hook:
        show(message, category, filename, lineno, file, line)
        return
    impl = getattr(warnings, "_showwarnmsg_impl", None)
    if impl is None:  # pragma: no cover - every CPython since 3.6 has it
        _ORIGINAL_SHOWWARNING(message, category, filename, lineno, file, line)
        return
    impl(warnings.WarningMessage(message, category, filename, lineno, file, line))
