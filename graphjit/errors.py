"""Exception classes raised by graphjit.

Every error graphjit raises on purpose derives from :class:`GraphjitError`, so a caller can catch the
library's errors without catching unrelated ones.  Where an error is about a bad argument it also
derives from the matching builtin (``TypeError`` or ``ValueError``), so code written against the
builtins keeps working.  Messages name the argument (or the function) at fault, what was expected,
and what to do about it.
"""

from __future__ import annotations


class GraphjitError(Exception):
    """Base class of every exception graphjit raises on purpose."""


class ConfigError(GraphjitError, ValueError):
    """A decorator option, an environment variable or a bucket specification is invalid."""


class SignatureError(GraphjitError, TypeError):
    """An argument of a graphed call cannot be part of a graph key.

    Raised for unhashable non-tensor arguments, tensors of two frameworks in one call, and
    arguments a bucket names that are missing from the call.
    """


class BucketOverflowError(GraphjitError, ValueError):
    """A bucketed dimension is larger than every bucket size (raised in strict mode only)."""


class BackendError(GraphjitError, RuntimeError):
    """The requested framework backend is unknown, not installed, or cannot do what was asked."""


class CaptureError(GraphjitError, RuntimeError):
    """Warmup, capture or verification of a CUDA graph failed.

    Outside strict mode graphjit records the reason in ``stats()`` and runs the key uncaptured;
    in strict mode this error is raised instead.  The capture has always been ended (no stream is
    left capturing) by the time this is raised.

    Raised from a graphed call in strict mode, it says how far the call got: ``executed`` is True
    when the function ran once, eagerly, before the error was raised (the state it writes is then
    exactly what one eager call leaves, and ``result`` is that call's return value); False when it
    did not run at all (the state is as before the call).
    """

    def __init__(self, message: str, reason: str = "capture failed") -> None:
        super().__init__(message)
        self.reason = reason
        self.executed = False
        self.result: object = None

    def after_run(self, result: object) -> CaptureError:
        """Mark this error as raised after one eager execution that returned ``result``."""
        self.executed = True
        self.result = result
        return self


class VerifyError(CaptureError):
    """A freshly captured graph, replayed once, did not reproduce the eager result."""

    def __init__(self, message: str, reason: str = "verify failed") -> None:
        super().__init__(message, reason=reason)


class UnrecoverableCaptureError(CaptureError):
    """A capture failed in a way the framework cannot recover from in this process.

    paddlepaddle 2.6 stays in capture mode after a capture that a CPU-GPU sync invalidated: every
    later GPU call in the process fails.  graphjit raises this (also outside strict mode, since no
    fallback can run) and refuses further captures; restart the process after fixing the function.
    """

    def __init__(self, message: str, reason: str = "framework left in capture mode") -> None:
        super().__init__(message, reason=reason)


class BackwardOrderError(GraphjitError, RuntimeError):
    """A backward of a :func:`graphjit.graphed_layer` ran out of order.

    Graphed layers run the backwards of outstanding micro-batches in the order their forwards ran
    (first in, first out), as 1F1B and interleaved pipeline schedules do.  The message names the
    micro-batch whose backward was expected.
    """


class TracerError(GraphjitError, RuntimeError):
    """The framework's tracer failed inside itself on a function (not an error of the function's own
    code): e.g. an internal error of Paddle's SOT.  The message names the tracer to use instead."""


class UnsupportedOutputError(GraphjitError, TypeError):
    """A graphed layer returned something other than tensors in (nested) tuples, lists and dicts."""


__all__ = [
    "BackendError",
    "BackwardOrderError",
    "BucketOverflowError",
    "CaptureError",
    "ConfigError",
    "GraphjitError",
    "SignatureError",
    "TracerError",
    "UnrecoverableCaptureError",
    "UnsupportedOutputError",
    "VerifyError",
]


class IslandError(GraphjitError, RuntimeError):
    """An island (``@graphjit.eager``) broke its contract on a replay: it returned outputs of another
    structure, shape or dtype than when the key was captured, or a dynamic argument it read no longer
    resolves.  The segments before it have run (as the code before it would have, eagerly)."""

