"""graphjit: safe, automatic CUDA graphs for PaddlePaddle (first) and PyTorch (second).

>>> import graphjit
>>> @graphjit.graphed
... def step(x, cache): ...

See README.md for the API, the semantics and the environment variables.
"""

from __future__ import annotations

import logging

from .api import GraphedFunction, Options, graphed
from .env import refresh as refresh_env
from .errors import (
    BackendError,
    BucketOverflowError,
    CaptureError,
    ConfigError,
    GraphjitError,
    SignatureError,
    StaleOutputError,
    UnrecoverableCaptureError,
    VerifyError,
)
from .scope import CaptureScope, capture_scope, in_capture_scope

__version__ = "0.1.0"

logging.getLogger("graphjit").addHandler(logging.NullHandler())

__all__ = [
    "BackendError",
    "BucketOverflowError",
    "CaptureError",
    "CaptureScope",
    "ConfigError",
    "GraphedFunction",
    "GraphjitError",
    "Options",
    "SignatureError",
    "StaleOutputError",
    "UnrecoverableCaptureError",
    "VerifyError",
    "__version__",
    "capture_scope",
    "graphed",
    "in_capture_scope",
    "refresh_env",
]
