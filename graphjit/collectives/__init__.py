"""graphjit's capture-safe custom all-reduce, and the swap of the frameworks' ``all_reduce``.

>>> import graphjit.collectives
>>> report = graphjit.collectives.init(group=None, max_bytes=8 << 20)   # on every rank
>>> report.enabled, report.reason
(True, None)

From then on ``torch.distributed.all_reduce`` / ``paddle.distributed.all_reduce`` run graphjit's
one-shot/two-shot CUDA kernel for eligible calls inside graphed calls and capture scopes (or for
every call with ``scope="always"``), and the framework's collective for everything else;
:func:`stats` counts both and says why.  See :mod:`.custom_ar` for the protocol and the fallback
reasons (:mod:`.reasons`), :mod:`.communicator` for one group, :mod:`.swap` for the wrapping,
:mod:`.csrc_build` for the build and :mod:`.library` for the ctypes library, ``csrc/`` for the kernels.

Importing this package imports no framework and builds nothing; its names load their modules at first use (a
capture that only needs the csrc loader, :mod:`.library`, does not import the all-reduce).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .csrc_build import BuildError, build
    from .custom_ar import (
        REASONS,
        Report,
        init,
        register_graph_buffers,
        reset,
        reset_stats,
        shutdown,
        stats,
        status,
    )
    from .library import CollectiveError

_HOMES = {"BuildError": "csrc_build", "build": "csrc_build", "CollectiveError": "library",
          **dict.fromkeys(("REASONS", "Report", "init", "register_graph_buffers", "reset", "reset_stats", "shutdown",
                           "stats", "status"), "custom_ar")}

__all__ = [
    "REASONS",
    "BuildError",
    "CollectiveError",
    "Report",
    "build",
    "init",
    "register_graph_buffers",
    "reset",
    "reset_stats",
    "shutdown",
    "stats",
    "status",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{home}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
