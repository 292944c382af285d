"""A CPU stand-in for Paddle's CUDA graphs, for CPU tests of graphjit's Paddle replay path (signing Paddle tensors,
static buffers, output copies and aliases, keys, guards, capture scopes) on Paddle 3.3 and 2.6.  Never proof of GPU
behaviour (tests/test_gpu_*paddle*.py are), and weaker than the torch emulator (tests/graph_emulator.py), which
records aten ops: Paddle has no dispatch hook to record its eager ops by.

What it keeps of a real capture and replay:

* Capture runs the function once and then puts back the contents of every Paddle tensor the function can reach
  (its closures and globals, followed as graphjit's own walk follows them) that the run changed: a capture leaves
  the state as it found it, as a CUDA capture, which launches nothing.  The tensors the run made are the graph's
  outputs, filled with NaN (or -1) after it: a capture computes no values, so nothing may read them before a replay.
* Replay runs the captured function again on the same static buffers and copies its results into the capture's
  outputs (an output that is the same tensor as at capture, a state tensor, is left as it is): what the graph would
  compute, where the function computes the same on every run.

What it does not keep: a replay runs Python, so Python values are read again instead of staying as the capture
saw them, and Python side effects (an attribute rebound, a counter advanced) happen again (test frozen values with
the torch emulator or on a GPU); a replay follows the tensor objects the function reaches now, where a graph reads
the memory it captured; graphs share no memory pool; random numbers are drawn anew; and an island cannot cut a
capture (a piecewise capture raises ``CaptureError``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import paddle
from backend_swap import swapped

from graphjit import reach
from graphjit.backends.base import GraphHandle, Segments, segments_open
from graphjit.backends.paddle.graphs import PaddleBackend
from graphjit.errors import CaptureError
from graphjit.tree import collect_tensors

__graphjit_skip_frames__ = True  # reasons name the test's line, not the emulator's


def _is_tensor(x: Any) -> bool:
    return isinstance(x, paddle.Tensor)


def _reachable(fn: Callable[[], Any]) -> list[Any]:
    """The Paddle tensors ``fn`` can reach through its closures and the globals its code names."""
    found = reach.walk(reach.roots(fn, None, []), _is_tensor)
    return [t for t, _path in found.tensors.values()]


class RerunGraph(GraphHandle):
    """A captured function; :meth:`replay` runs it again and leaves its results in the capture's outputs."""

    def __init__(self, fn: Callable[[], Any], outputs: list[Any]) -> None:
        self.fn = fn
        self.outputs = outputs
        self.replays = 0

    def replay(self) -> None:
        with paddle.no_grad():
            got = collect_tensors(self.fn(), _is_tensor)
            for dst, src in zip(self.outputs, got, strict=True):
                if dst is not src:
                    paddle.assign(src, output=dst)
        self.replays += 1

    def reset(self) -> None:
        self.outputs = []


class _WholeOnly(Segments):
    def cut(self) -> GraphHandle:
        raise CaptureError("the emulated Paddle graph cannot cut a capture at an island",
                           reason="capture failed: emulated Paddle graphs have no segments")

    def resume(self) -> None:  # pragma: no cover (cut raises first)
        pass


class EmulatedPaddleBackend(PaddleBackend):
    """The Paddle backend with :class:`RerunGraph` captures of CPU tensors."""

    def graphs_unavailable(self, device: str) -> str | None:
        return None if device == "cpu" else "the emulated Paddle backend captures CPU tensors only"

    def new_pool(self, device: str) -> Any:
        return None

    def synchronize(self, device: str) -> None:
        pass

    def capture_graph(self, fn: Callable[[], Any], device: str, pool: Any, debug: bool, feed: bool = False,
                      operands: Callable[[], Any] | None = None) -> tuple[GraphHandle, Any]:
        saved = [(t, np.array(t.numpy(), copy=True)) for t in _reachable(fn)]
        try:
            with segments_open(_WholeOnly()):
                out = fn()
        finally:
            for t, before in saved:  # what the run wrote, put back: a capture launches nothing
                if not np.array_equal(t.numpy(), before, equal_nan=True):
                    t.set_value(before)
        outputs = collect_tensors(out, _is_tensor)
        state = {id(t) for t, _before in saved}
        for t in outputs:
            if id(t) not in state:  # made by the capture: no values until a replay writes them
                filled = np.full(t.shape, np.nan if t.is_floating_point() else -1).astype(t.numpy().dtype)
                t.set_value(filled)
        return RerunGraph(fn, outputs), out


@contextlib.contextmanager
def emulated_paddle() -> Iterator[EmulatedPaddleBackend]:
    """graphjit's Paddle backend replaced by :class:`EmulatedPaddleBackend` for the block (CPU tensors)."""
    with swapped("paddle", EmulatedPaddleBackend()) as emulated:
        yield emulated
