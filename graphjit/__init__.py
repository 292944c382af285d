"""graphjit: safe, automatic CUDA graphs for PaddlePaddle (first) and PyTorch (second).

>>> import graphjit
>>> @graphjit.graphed
... def step(x, cache): ...

See README.md for the API, the semantics and the environment variables.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from .api import GraphedFunction, Options, graphed
from .env import refresh as refresh_env
from .errors import (
    BackendError,
    BackwardOrderError,
    BucketOverflowError,
    CaptureError,
    ConfigError,
    GraphjitError,
    IslandError,
    SignatureError,
    TracerError,
    UnrecoverableCaptureError,
    UnsupportedOutputError,
    VerifyError,
)
from .generation import graph_generation
from .islands import eager
from .scope import CaptureScope, capture_scope, in_capture_scope
from .training import graphed_layer

if TYPE_CHECKING:
    from . import collectives

__version__ = "0.1.0"

logging.getLogger("graphjit").addHandler(logging.NullHandler())

__all__ = [
    "BackendError",
    "BackwardOrderError",
    "BucketOverflowError",
    "CaptureError",
    "CaptureScope",
    "ConfigError",
    "GraphedFunction",
    "GraphjitError",
    "IslandError",
    "Options",
    "SignatureError",
    "TracerError",
    "UnrecoverableCaptureError",
    "UnsupportedOutputError",
    "VerifyError",
    "__version__",
    "capture_scope",
    "collectives",
    "eager",
    "graph_generation",
    "graphed",
    "graphed_layer",
    "in_capture_scope",
    "refresh_env",
]


def __getattr__(name: str) -> Any:
    """``graphjit.collectives`` is imported on first use: it needs numpy, ctypes and friends (about
    50 ms), which ``import graphjit`` does not pay for.  It imports no framework and builds nothing."""
    if name == "collectives":
        from importlib import import_module

        return import_module(".collectives", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
