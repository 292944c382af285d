"""torch: what graphjit asks of Dynamo for ``tracer="compile"``: the guards of the cache entry a capture ran
(:func:`cache_entry_guard`), the settings its compiled code runs under (:func:`for_capture`: floats constants,
counters symbolic), whether this Dynamo guards numbers read off a class (:func:`class_attribute_guards_missing`),
and calls where its compilations start and end (:func:`compiles_unwatched`)."""

from __future__ import annotations

import contextlib
import functools
import re
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch

__all__ = [
    "cache_entry_guard", "class_attribute_guards_missing", "compiles_unwatched", "counter_sources", "for_capture",
]


@contextlib.contextmanager
def compiles_unwatched(pause: Callable[[], None], resume: Callable[[], None]) -> Iterator[None]:
    """In the block, ``pause()`` where Dynamo starts compiling a frame and ``resume()`` where it ends (its
    ``callback_handler``: counted across threads, so the start runs on the thread of the first of overlapping
    compilations and the end on that of the last).  A torch without the handler calls neither, and neither does a
    process that has not imported Dynamo yet: nothing compiles there (``torch.compile`` imports it where it is called,
    outside such a block in any code that compiles a function once and calls it many times), and importing it for the
    block cost the process's first capture 2.5-3 s on an H100's host (``bench capture``'s first scope: 3.6 s at
    4d787b5 against 0.40 s before this watch)."""
    if "torch._dynamo" not in sys.modules:
        yield
        return
    try:
        from torch._dynamo.callback import callback_handler
    except Exception:  # a torch without Dynamo or without compile callbacks
        yield
        return

    def start(*_args: Any) -> None:
        pause()

    def end(*_args: Any) -> None:
        resume()

    callback_handler.register_start_callback(start)
    callback_handler.register_end_callback(end)
    try:
        yield
    finally:
        for registered, remove in ((start, callback_handler.remove_start_callback),
                                   (end, callback_handler.remove_end_callback)):
            with contextlib.suppress(ValueError):
                remove(registered)


def cache_entry_guard(target: Any, f_locals: dict[str, Any]) -> Callable[[], str | None] | None:
    code = getattr(getattr(target, "__func__", target), "__code__", None)
    if code is None:
        return None
    try:
        from torch._dynamo.eval_frame import _debug_get_cache_entry_list

        entries = _debug_get_cache_entry_list(code)
    except Exception:  # a torch without this API: graphjit's own guards still hold
        return None
    for entry in entries:
        manager = getattr(entry, "guard_manager", None)
        check = getattr(manager, "check", None)
        if check is None:
            continue
        try:
            if not check(f_locals):
                continue
        except Exception:
            continue

        def failed(manager: Any = manager, check: Any = check) -> str | None:
            try:
                if check(f_locals):
                    return None
                verbose = manager.check_verbose(f_locals)
                parts = getattr(verbose, "verbose_code_parts", None) or ["a guard"]
                return str(parts[0])[:200]
            except Exception as exc:  # a guard that cannot be evaluated does not hold
                return f"{type(exc).__name__}: {exc}"[:200]

        return failed
    return None


_DYNAMO_CLASS_GUARDS: list[str | None] = [None]
"""What :func:`_probe_class_attribute_guards` found ("" where Dynamo guards class attributes); None before it ran."""


_PROBE = """
class Knob:
    value = 1.0

def read(x):
    return x * Knob.value
"""
"""The probe's source, compiled under a file name of its own: Dynamo skips graphjit's files (backends/torch/breaks.py),
so a probe defined here would never be compiled."""


def _probe_class_attribute_guards() -> str:
    """"" where Dynamo recompiles a function after a number it read off a class changed, else why not."""
    space: dict[str, Any] = {}
    exec(compile(_PROBE, "<graphjit: Dynamo class-attribute probe>", "exec"), space)
    knob = space["Knob"]
    try:
        compiled = torch.compile(space["read"], backend="eager")
        x = torch.ones(1, device="cpu")  # not the default device: no GPU work, no sync
        compiled(x)
        knob.value = 2.0
        stale = float(compiled(x)[0]) != 2.0
    except Exception as exc:  # Dynamo cannot even compile the probe: it is not trusted with read values either
        return f"torch {torch.__version__}'s Dynamo failed a probe ({type(exc).__name__}: {exc})"[:300]
    if stale:
        return (f"torch {torch.__version__}'s Dynamo installs no guard on a number read off a class (pytorch#176851): "
                "its compiled code keeps the old value")
    return ""


def for_capture(compiled: Callable[..., Any]) -> Callable[..., Any]:
    """``compiled`` run with the Dynamo settings a graph captured from its code needs, set while it runs:

    * ``specialize_float`` on, so that each Python float the function reads is a constant of its compiled code, as
      graphjit keys its graphs on it (Dynamo guards it where it guards the place it was read from: not a class
      attribute on torch 2.10-2.11, :func:`class_attribute_guards_missing`).  Refused otherwise: when such a float
      changes, Dynamo recompiles with the float as a 0-d CPU tensor input (its automatic dynamic).  On a GPU the
      compiled code then reads the float from host memory made for that one call, or puts kernels on the CPU
      beside CUDA tensors (an ``addmm`` with a CPU bias): a graph captured from it replays a stale value or the
      capture fails.  inductor's own CUDA graphs skip such code for its CPU input; specializing keeps it
      graphable.  The price: each new value of such a float is a new compilation, up to Dynamo's recompile limit
      (after which Dynamo runs that code uncompiled).
    * the counters graphjit keys by class (:data:`graphjit.families.COUNTERS`: transformers' sliding-window cache
      length, which only picks branches) symbolic from their first compilation (``torch.compiler.config.
      dynamic_sources``, matched by attribute name, beside any sources the user named).  Without it Dynamo compiles
      the decode step once for the first count and again, with the count symbolic, for the second (its automatic
      dynamic): a Gemma 2 ``generate()`` compiled twice, 12 s each on an H100.  The code the second compilation
      made, and the guards Dynamo puts on the count's branches, are what every later call runs either way.

    Only uncaptured calls run through here (a replay never does).  The settings are process-wide (Dynamo's config
    has no per-thread value): set while any such call runs, counted under a lock, and put back when the last one
    returns, so another thread's own ``torch.compile`` compiling meanwhile gets them too.  A torch whose Dynamo has
    neither setting gets ``compiled`` itself."""
    try:
        from torch._dynamo import config as dynamo_config
    except ImportError:  # a torch without Dynamo
        return compiled
    if not hasattr(dynamo_config, "specialize_float") and _compiler_config() is None:
        return compiled

    @functools.wraps(compiled)
    def run(*args: Any, **kwargs: Any) -> Any:
        with _SETTINGS:
            return compiled(*args, **kwargs)

    return run


def counter_sources() -> str:
    """``dynamic_sources`` entries (regular expressions, matched from the start of a Dynamo source name) for every
    attribute :data:`graphjit.families.COUNTERS` names, wherever it is read: ``.*\\.cumulative_length_int$``."""
    from ...families import COUNTERS

    return ",".join(sorted({rf".*\.{re.escape(attr)}$" for _cls, attr in COUNTERS}))


def _compiler_config() -> Any:
    """``torch.compiler.config`` where it has ``dynamic_sources`` (torch 2.7 and later; regular expressions from
    2.8), else None."""
    config = getattr(getattr(torch, "compiler", None), "config", None)
    return config if isinstance(getattr(config, "dynamic_sources", None), str) else None


class _Settings:
    """The count of calls running :func:`for_capture` code: the first sets the settings, the last puts back what
    was there (re-entered by recursion and by threads alike)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.count = 0
        self.saved_float: Any = None
        self.saved_sources: str | None = None

    def __enter__(self) -> None:
        from torch._dynamo import config as dynamo_config

        with self.lock:
            if self.count == 0:
                if hasattr(dynamo_config, "specialize_float"):
                    self.saved_float = dynamo_config.specialize_float
                    dynamo_config.specialize_float = True
                compiler = _compiler_config()
                if compiler is not None:
                    self.saved_sources = compiler.dynamic_sources
                    ours = counter_sources()
                    compiler.dynamic_sources = f"{self.saved_sources},{ours}" if self.saved_sources else ours
            self.count += 1

    def __exit__(self, *exc: object) -> None:
        from torch._dynamo import config as dynamo_config

        with self.lock:
            self.count -= 1
            if self.count == 0:
                if hasattr(dynamo_config, "specialize_float"):
                    dynamo_config.specialize_float = self.saved_float
                compiler = _compiler_config()
                if compiler is not None and self.saved_sources is not None:
                    compiler.dynamic_sources = self.saved_sources
                    self.saved_sources = None


_SETTINGS = _Settings()


def class_attribute_guards_missing() -> str | None:
    """Why this Dynamo's compiled code may keep a number read off a class after it changed (pytorch#176851, torch
    2.10-2.11), or None; probed once per process."""
    if _DYNAMO_CLASS_GUARDS[0] is None:
        _DYNAMO_CLASS_GUARDS[0] = _probe_class_attribute_guards()
    return _DYNAMO_CLASS_GUARDS[0] or None
