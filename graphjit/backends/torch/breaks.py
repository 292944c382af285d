"""torch: making a function a graph break for ``torch.compile`` (Dynamo runs it eagerly between two
compiled graphs, with Dynamo off inside it), and keeping Dynamo out of graphjit's own code."""

from __future__ import annotations

import contextlib
import functools
import importlib.abc
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger("graphjit")
_shielded = False
_lock = threading.Lock()


_INLINED = frozenset(("dist.py", "rebinds.py"))
"""Files of this folder Dynamo must still inline: the all-reduce graphjit publishes in place of torch.distributed's
(``dist.py``) puts graphjit's custom op into the graph of compiled code that calls it; the module registration hooks
(``rebinds.py``) trace to nothing inside compiled code instead of breaking its graph."""


def shield() -> None:
    """Dynamo never compiles graphjit's own call path: graphjit's modules (its top level, ``backends/`` and this
    folder, but for :data:`_INLINED`) go on Dynamo's skip list, as torch's own folders are.  A graphed function called
    inside a compiled one is a graph break (``_torchdynamo_disable``); without this, Dynamo then compiled the frames of
    graphjit's call path one by one, guarding graphjit's module state (and failed building such guards).

    Dynamo is not imported for this: it costs seconds (2 s on a CPU with cached bytecode, 4 to 5 s on a GPU host
    without), a program that never compiles never pays them, and code cannot be compiled before Dynamo is imported.
    Where ``torch._dynamo.trace_rules`` is imported already, the list is extended now; otherwise right after that
    module is first executed (an import hook on ``sys.meta_path``, inert once it fired).  Idempotent and thread-safe;
    where this torch has no skip list, nothing."""
    global _shielded
    with _lock:
        if _shielded:
            return
        _shielded = True
        rules = sys.modules.get(_RULES)
        if rules is None:
            sys.meta_path.insert(0, _AfterImport())
            return
    _extend_skip_list(rules)


_RULES = "torch._dynamo.trace_rules"


def _extend_skip_list(rules: Any) -> None:
    names: list[str] = []
    for here in (Path(__file__).resolve().parent, Path(os.path.abspath(__file__)).parent):  # a symlinked install too
        root = here.parents[1]  # graphjit/
        files = [*root.glob("*.py"), *(root / "backends").glob("*.py"),
                 *(p for p in here.glob("*.py") if p.name not in _INLINED)]
        names.extend(p.as_posix() for p in files if p.as_posix() not in names)
    try:
        rules.SKIP_DIRS.extend(names)
        rules._recompile_re()
    except Exception as exc:  # a torch without the list: compiled code around graphed calls is rare
        log.debug("graphjit: could not put graphjit on Dynamo's skip list (%s)", exc)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: where ``torch._dynamo.trace_rules`` is being imported, it asks the finders after it
    for the module's spec and wraps its loader so that :func:`_extend_skip_list` runs once the module has executed
    (and before the import returns to Dynamo, which reads the list when it compiles).  The module gets its own
    loader back.  Once the list is extended the hook finds nothing for any name; it stays in ``sys.meta_path``
    (removing it there could make another thread's import, walking that list, skip the finder after it).  Where
    the module's first execution fails, the next import of it is wrapped again."""

    def __init__(self) -> None:
        self.fired = False

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if self.fired or name != _RULES:
            return None
        spec = None
        for finder in list(sys.meta_path):
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec  # None: the import fails as it would have; an odd loader: no list (logged nowhere)
        spec.loader = _ThenExtend(spec.loader, self)
        return spec


class _ThenExtend(importlib.abc.Loader):
    """``loader`` as it is, then :func:`_extend_skip_list` on the module it executed."""

    def __init__(self, loader: Any, hook: _AfterImport) -> None:
        self.loader = loader
        self.hook = hook

    def create_module(self, spec: Any) -> Any:
        create = getattr(self.loader, "create_module", None)
        return create(spec) if create is not None else None  # None: the default module

    def exec_module(self, module: Any) -> None:
        module.__loader__ = self.loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        self.hook.fired = True
        _extend_skip_list(module)


@contextlib.contextmanager
def dynamo_off() -> Iterator[None]:
    """The block runs with Dynamo's frame hook off (as ``torch.compiler.disable`` runs a function), so the graphed
    function graphjit calls (a warmup, a capture, verify's reference) runs as written even when the graphed call
    was made from compiled code; a ``torch.compile``'d function inside still compiles (it sets its own hook)."""
    try:
        from torch._C._dynamo.eval_frame import set_eval_frame
    except ImportError:
        yield
        return
    prior = set_eval_frame(None)
    try:
        yield
    finally:
        set_eval_frame(prior)


def graph_break(fn: Callable[..., Any], reason: str) -> Callable[..., Any]:
    """``fn`` as a graph break for ``torch.compile``, as ``torch.compiler.disable`` makes one, without importing
    Dynamo (seconds, at an island's decoration): a wrapper that Dynamo does not inline (it carries the attributes
    ``torch.compiler.disable`` sets: ``_torchdynamo_disable``, ``reason`` as its message, the original callable), so
    compiled code ends its graph before the call and calls it, and that calls ``fn`` with Dynamo's frame hook off,
    so no frame inside it is compiled.  The wrapper's own frame is graphjit's (on Dynamo's skip list, :func:`shield`).
    ``fn`` itself where this torch has no Dynamo (nothing to break)."""
    try:
        from torch._C._dynamo.eval_frame import set_eval_frame  # noqa: F401  # a torch with Dynamo
    except ImportError:
        return fn
    shield()

    @functools.wraps(fn)
    def outside_compiled(*args: Any, **kwargs: Any) -> Any:
        with dynamo_off():
            return fn(*args, **kwargs)

    marked: Any = outside_compiled
    _never_compiled(marked.__code__)
    marked._torchdynamo_disable = True
    marked._torchdynamo_disable_msg = reason
    marked._torchdynamo_orig_callable = fn
    marked._torchdynamo_disable_recursive = True
    return marked


def _never_compiled(code: Any) -> None:
    """Dynamo skips frames of ``code`` whatever its skip list says (``dont_skip_tracing``, graphjit reached through
    a symlinked path), as it skips ``torch.compiler.disable``'s own wrapper, which lives in torch's files: marked in
    the C part of Dynamo (no Python Dynamo import).  Nothing where this torch has neither way."""
    try:
        from torch._C._dynamo.eval_frame import _FrameAction, _FrameExecStrategy, set_code_exec_strategy

        set_code_exec_strategy(code, _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.DEFAULT))
        return
    except (ImportError, AttributeError, TypeError):
        pass
    try:
        from torch._C._dynamo.eval_frame import skip_code  # type: ignore[attr-defined]  # older torch

        skip_code(code)
    except (ImportError, AttributeError, TypeError):
        pass


def compiler_disable(fn: Callable[..., Any], reason: str) -> Callable[..., Any]:
    """``fn`` behind ``torch.compiler.disable`` itself (which imports Dynamo; ``reason`` shows in Dynamo's graph-break
    logs where this torch takes one); ``fn`` itself where this torch has no ``torch.compiler.disable`` (< 2.1)."""
    disable = getattr(getattr(torch, "compiler", None), "disable", None)
    if disable is None:
        return fn
    try:
        return disable(fn, reason=reason)  # type: ignore[no-any-return]
    except TypeError:  # torch < 2.7: no reason=
        return disable(fn)  # type: ignore[no-any-return]
