"""Putting torch back the way it was after a capture that failed.

A capture that fails half-way leaves more behind than a capturing stream.  ``CUDAGraph::capture_end``
(``aten/src/ATen/cuda/CUDAGraph.cpp``) first calls ``cudaStreamEndCapture``; when the capture was
invalidated (a sync, an op that cannot be captured), that call fails and ``capture_end`` raises before it
has

* told the caching allocator that the capture stopped allocating into its pool
  (``endAllocateToPool``): the next capture into that pool then fails with "beginAllocateToPool: already
  recording to mempool_id", and the pool's use count never drops, so its memory is never returned;
* taken the default CUDA generator out of capture mode (``capture_epilogue``, torch <= 2.12): every later
  ``torch.randn`` on that device raises "Offset increment outside graph capture encountered
  unexpectedly", in graphjit's code and the user's alike;
* marked the graph captured, so destroying it does not release the pool either.

:func:`recover` undoes each of these, as far as the state of the failed graph tells, and then checks that
the generator draws numbers again; it raises :class:`UnrecoverableCaptureError` only if the process
really cannot go on.  Nothing here runs unless a capture failed.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from typing import Any

import torch

from ...errors import UnrecoverableCaptureError

log = logging.getLogger("graphjit")


def capture_ended(graph: Any) -> bool:
    """True if torch finished ``capture_end``'s bookkeeping for ``graph`` (``pool()`` refuses before)."""
    try:
        graph.pool()
    except RuntimeError:
        return False
    return True


def recover(graph: Any, still_open: bool, stream: Any, pool: Any, index: int) -> None:
    """After a failed capture of ``graph`` on ``stream`` into ``pool`` (a pool handle) on device ``index``.

    ``still_open``: graphjit had begun the capture and not seen ``capture_end`` return.  Ends the capture if
    the stream still captures, then, where ``capture_end`` did not complete, stops the allocator recording
    into the pool, drops the failed graph's hold on it, and takes the generator out of capture mode.

    Raises :class:`UnrecoverableCaptureError` if the stream cannot be ended or the generator stays broken."""
    if graph is None or not still_open:
        return
    with torch.cuda.stream(stream):
        if torch.cuda.is_current_stream_capturing():  # active or invalidated: end it
            try:
                graph.capture_end()
                still_open = False
            except Exception as exc:  # an invalidated capture cannot end cleanly; cleaned up below
                log.debug("graphjit: ending the failed capture: %s", exc)
        capturing = torch.cuda.is_current_stream_capturing()
    if capturing:  # pragma: no cover - would be a torch bug; never silently continue
        raise UnrecoverableCaptureError("the capture stream is still capturing after a failed capture; the process "
                                        "cannot use CUDA safely any more", reason="stream left capturing")
    if still_open and not capture_ended(graph):
        _release_pool(pool, index)
        _end_generator_capture(stream, index)
    with contextlib.suppress(Exception):
        torch.cuda.synchronize(index)
    problem = _generator_problem(index)
    if problem is not None:
        raise UnrecoverableCaptureError(
            f"after a failed capture the CUDA random generator of cuda:{index} cannot draw numbers any more "
            f"({problem}); restart the process, and report this with your torch version ({torch.__version__})",
            reason="random generator left in capture mode")


def _release_pool(pool: Any, index: int) -> None:
    """What ``capture_end`` and the graph's reset would have done for the pool."""
    end = getattr(torch._C, "_cuda_endAllocateToPool", None)
    release = getattr(torch._C, "_cuda_releasePool", None)
    if end is None or release is None:  # pragma: no cover - both exist from torch 2.1 on
        log.warning("graphjit: this torch has no _cuda_endAllocateToPool/_cuda_releasePool; the memory of a failed "
                    "capture stays reserved")
        return
    try:
        end(index, pool)
    except RuntimeError as exc:  # "not currently recording": capture_end got that far
        log.debug("graphjit: endAllocateToPool after a failed capture: %s", exc)
    try:
        release(index, pool)
    except RuntimeError as exc:  # pragma: no cover - the pool exists while the function holds it
        log.debug("graphjit: releasePool after a failed capture: %s", exc)


def _end_generator_capture(stream: Any, index: int) -> None:
    """Take the default generator out of capture mode: one empty capture runs its prologue and epilogue
    (into a pool of its own, freed with it).  Harmless where torch keeps capture state per capture."""
    graph = torch.cuda.CUDAGraph()
    with warnings.catch_warnings(), torch.cuda.device(index), torch.cuda.stream(stream):
        warnings.simplefilter("ignore")  # "The CUDA Graph is empty": on purpose
        graph.capture_begin(capture_error_mode="thread_local")
        graph.capture_end()
    graph.reset()


def _generator_problem(index: int) -> str | None:
    """None if the default generator of ``index`` draws numbers outside a capture (its state is put back)."""
    gen = torch.cuda.default_generators[index]
    state = gen.get_state()
    try:
        torch.empty(1, device=f"cuda:{index}").uniform_()
    except RuntimeError as exc:
        return str(exc).splitlines()[0]
    finally:
        gen.set_state(state)
    return None
