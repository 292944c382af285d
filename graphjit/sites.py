"""Where in the user's code something happened: ``file:line in function`` for messages.

Frames of graphjit itself and of the frameworks (paddle, torch, and the tracers inside them) are
skipped, so that a reason names the line the user wrote: the ``.item()`` that synchronised, the op a
capture refused, the call of an island.  So are frames of modules that set ``__graphjit_skip_frames__ =
True`` (a wrapper library, a test double).  Nothing here imports a framework: their folders are read
from ``sys.modules``.
"""

from __future__ import annotations

import ast
import functools
import os
import re
import sys
import sysconfig
import types
from pathlib import Path

_OWN = str(Path(__file__).resolve().parent) + os.sep
_STDLIB = str(Path(sysconfig.get_paths()["stdlib"]).resolve()) + os.sep
_SITE = tuple({str(Path(sysconfig.get_paths()[k]).resolve()) + os.sep for k in ("purelib", "platlib")})
_FRAMEWORKS = ("torch", "paddle", "wrapt", "functorch")


def _library_dirs() -> tuple[str, ...]:
    dirs = [_OWN]
    for name in _FRAMEWORKS:
        mod = sys.modules.get(name)
        f = getattr(mod, "__file__", None)
        if f:
            dirs.append(str(Path(f).resolve().parent) + os.sep)
    return tuple(dirs)


def is_library(filename: str) -> bool:
    """True for a file of graphjit or of a framework (or Python's own ``<frozen ...>`` code)."""
    if filename.startswith("<"):
        return True
    try:
        resolved = str(Path(filename).resolve())
    except OSError:
        resolved = filename
    if resolved.startswith(_library_dirs()):
        return True
    # Python's own modules (contextlib's wrappers, threading, ...) are not the user's code; installed packages
    # other than the frameworks (transformers, the user's own) are, though site-packages may sit inside the stdlib.
    return resolved.startswith(_STDLIB) and not resolved.startswith(_SITE)


def caller(skip: int = 1) -> str:
    """``file:line in function`` of the innermost frame of the user's code above the caller's ``skip``
    frames; ``"?"`` if there is none."""
    frame: types.FrameType | None = sys._getframe(skip + 1)
    while frame is not None:
        code = frame.f_code
        if not is_library(code.co_filename) and not frame.f_globals.get("__graphjit_skip_frames__"):
            return f"{code.co_filename}:{frame.f_lineno} in {code.co_name}()"
        frame = frame.f_back
    return "?"


def in_traceback(exc: BaseException) -> str | None:
    """``file:line in function`` of the innermost frame of the user's code in ``exc``'s traceback."""
    found = None
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if not is_library(code.co_filename) and not tb.tb_frame.f_globals.get("__graphjit_skip_frames__"):
            found = f"{code.co_filename}:{tb.tb_lineno} in {code.co_name}()"
        tb = tb.tb_next
    return found


_AT = re.compile(r" at (?P<file>\S.*):(?P<line>\d+)$")


def with_function(text: str) -> str:
    """``"... at file:12"`` with `` in function()`` appended, when the file can be read and parsed."""
    m = _AT.search(text)
    if m is None:
        return text
    name = function_at(m.group("file"), int(m.group("line")))
    return f"{text} in {name}()" if name else text


def function_at(filename: str, line: int) -> str | None:
    """The innermost function of ``filename`` whose body holds ``line`` (None if unknown)."""
    return _functions(filename).get(line)


@functools.lru_cache(maxsize=64)
def _functions(filename: str) -> dict[int, str]:
    try:
        tree = ast.parse(Path(filename).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return {}
    lines: dict[int, str] = {}
    _mark(tree, lines)
    return lines


def _mark(node: ast.AST, lines: dict[int, str]) -> None:
    """Outer functions first, then their inner ones over them: each line ends with its innermost function."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) and child.end_lineno is not None:
            for n in range(child.lineno, child.end_lineno + 1):
                lines[n] = child.name
        _mark(child, lines)
