"""Paddle's SOT tracer as graphjit runs it: :class:`SotFunction` (a function translated by SOT without
``to_static``'s argument handling), :func:`skip_graphjit_in_sot` (graphjit's own files are never translated) and
:func:`translations_unwatched` (a warmup's watch off while SOT translates)."""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import paddle

PACKAGE_DIR = str(Path(__file__).resolve().parents[2]) + os.sep  # the graphjit package


def skip_graphjit_in_sot() -> bool:
    """Add graphjit's package folder to the file prefixes SOT never translates (Paddle 2.6 and 3.x
    keep them in ``skip_files.skip_file_names`` and hand them to the frame hook).  False if this
    Paddle has no such list (then SOT may trace into graphjit; the swap's graph break still holds)."""
    try:
        from paddle.jit.sot.opcode_translator import skip_files
    except ImportError:
        return False
    names = getattr(skip_files, "skip_file_names", None)
    setter = getattr(paddle.framework.core, "eval_frame_skip_file_prefix", None)
    if not isinstance(names, set) or setter is None:
        return False
    names.add(PACKAGE_DIR)
    setter(tuple(names))
    return True


class SotFunction:
    """``fn`` run through SOT: ``paddle.jit.sot.symbolic_translate``, which is what
    ``to_static(full_graph=False)`` runs once its own argument handling is done (Paddle 2.6 and 3.x).
    Skipping that handling keeps what SOT itself translates and to_static refuses (``*args`` functions,
    methods of classes that are not Layers, ``range`` arguments, functions behind ``functools.wraps``, a
    first parameter named ``self``); a ``functools.partial`` is translated through its function.  Bound
    to a Layer (the descriptor protocol, as a method), it translates in the Layer's train/eval mode."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.func = fn.func if isinstance(fn, functools.partial) else fn
        self.bound_args = (fn.args, fn.keywords) if isinstance(fn, functools.partial) else ((), {})
        self._translated: dict[bool, Callable[..., Any]] = {}

    def __get__(self, instance: Any, owner: Any = None) -> Callable[..., Any]:
        if instance is None:
            return self
        return functools.partial(self.run, instance)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.run(None, *args, **kwargs)

    def run(self, instance: Any, *args: Any, **kwargs: Any) -> Any:
        from paddle.jit.sot import symbolic_translate

        training = bool(getattr(instance, "training", True))
        # One translated callable per mode, made at the first call, which runs under the trace lock
        # (PaddleBackend.traced_call_guard); so does putting graphjit on SOT's skip list (SOT must never translate
        # graphjit's own code: a nested graphed call runs it).  Done at backend creation instead, outside that
        # lock, Paddle 2.6 crashed now and then with several threads calling (tests/test_threads.py: 1 run in 8).
        traced = self._translated.get(training)
        if traced is None:
            skip_graphjit_in_sot()
            traced = self._translated[training] = symbolic_translate(self.func, training=training)
        pre, kw = self.bound_args
        if instance is not None:
            pre = (instance, *pre)
        return traced(*pre, *args, **{**kw, **kwargs})


_watch_lock = threading.Lock()
_watchers: dict[int, list[tuple[Callable[[], None], Callable[[], None]]]] = {}  # thread -> its open blocks' callbacks
_original: Callable[..., Any] | None = None  # SOT's start_translate, as found when the wrapper was first installed


def _unwatched_translate(*args: Any, **kwargs: Any) -> Any:
    """SOT's ``start_translate`` with the innermost open block of this thread paused around it (SOT's frame hook is
    off while its callback runs: translations do not nest on a thread)."""
    original = _original
    assert original is not None  # set before the wrapper is first installed, never unset
    blocks = _watchers.get(threading.get_ident())
    if not blocks:
        return original(*args, **kwargs)
    pause, resume = blocks[-1]
    pause()
    try:
        return original(*args, **kwargs)
    finally:
        resume()


@contextlib.contextmanager
def translations_unwatched(pause: Callable[[], None], resume: Callable[[], None]) -> Iterator[None]:
    """In the block, ``pause()`` where SOT starts translating a frame on this thread and ``resume()`` where it ends
    (its executor cache's ``start_translate``, Paddle 2.6 and 3.x): a warmup's profile hook made a translation two to
    three times slower, and the translating Python is SOT's own, not the function's (the code it generates runs after,
    watched).  One wrapper serves every thread's blocks, installed by the first to open and removed by the last to
    close.  A Paddle without that function is watched throughout."""
    global _original
    try:
        from paddle.jit.sot.opcode_translator.executor import executor_cache

        cache: Any = executor_cache
        found = cache.start_translate
    except (ImportError, AttributeError):
        yield
        return
    me = threading.get_ident()
    with _watch_lock:
        if not _watchers:  # the first open block installs the wrapper
            if _original is None:  # SOT's own, as first found: the wrapper always calls it (never another wrapper)
                _original = found
            cache.start_translate = _unwatched_translate
        _watchers.setdefault(me, []).append((pause, resume))
    try:
        yield
    finally:
        with _watch_lock:
            blocks = _watchers[me]
            blocks.pop()
            if not blocks:
                del _watchers[me]
            # the last one to close removes it (not where another library replaced it meanwhile)
            if not _watchers and cache.start_translate is _unwatched_translate:
                cache.start_translate = _original
