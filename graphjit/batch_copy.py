"""Several tensors copied in one kernel launch around a replay (``csrc/batch_copy.cuh``): the caller's inputs into a
key's static inputs, and a key's static outputs into the fresh tensors a call returns.

A framework copies tensor by tensor, one launch each (``torch._foreach_copy_`` groups them, Paddle has no such op),
and on a virtualised host a launch costs microseconds of host time.  A :class:`Batch` is planned once per key, at
capture: the side of every copy that is fixed (the static buffers: their addresses and sizes) goes into ctypes
arrays then; a call fills in only the other side and makes one call into the library.

Guarantees: a batch copy writes the same bytes as the framework's copy it replaces, on the same stream (the current
one, which the replay runs on), so nothing ordered before or after it changes.  It is used only where every operand
is dense memory of one GPU (checked per call for the caller's tensors, once for the static ones) and of a dtype
without lazy bits (not complex: torch's conjugate and negative views); anything else goes the framework's way, as
does every call while the library is missing or after it failed once (logged once): :class:`Batch` says no
and its caller copies as before, so a result never depends on it.

Refuses nothing: it is an optimisation with a fallback.  The library is the csrc one of the custom all-reduce
(``python -m graphjit build`` builds it ahead of time).  ``GRAPHJIT_BATCH_COPY``: ``auto`` (default) uses it where it
is built and otherwise builds it once per process in a background thread (nvcc, a few seconds), the calls in the
meantime copying the framework's way; ``on`` builds it at the first call that needs it; ``off`` never uses it.
"""

from __future__ import annotations

import array
import logging
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from . import env

if TYPE_CHECKING:  # graphjit.collectives is imported where a batch first needs the library, not with graphjit
    from .collectives.library import Library

log = logging.getLogger("graphjit")

MIN_TENSORS = 2
"""Fewer copies than this go the framework's way: one framework copy is one launch already."""


class Operands(Protocol):
    """A framework's side of batch copies (``backends/<framework>/copies.py``)."""

    inputs: bool
    """Whether moved inputs go in by a batch copy (torch: no, its ``_foreach_copy_`` costs less host time)."""

    def target(self, t: Any) -> tuple[str, int] | None:
        """``(architecture, device index)`` of a dense, non-complex tensor on a GPU; None for anything else."""

    def stream(self, device: int) -> Callable[[], int]:
        """A function returning the current stream of ``device`` as a ``cudaStream_t`` integer."""

    def dense(self, t: Any) -> bool:
        """The tensor's bytes are one run of ``nbytes`` at its data pointer (per call, for the caller's tensors)."""

    def data_ptr(self, t: Any) -> int: ...

    def nbytes(self, t: Any) -> int: ...

    def empty_like(self, t: Any) -> Any:
        """A new dense tensor of ``t``'s shape, dtype and device that requires no grad."""


_lock = threading.Lock()
_ready: dict[tuple[str, int], Library] = {}  # (arch, device): loaded, kernel loaded on the device
_building: set[str] = set()
_failed: dict[str, str] = {}  # arch: why there is no library (said once in the log)


def library(arch: str, device: int) -> Library | None:
    """The csrc library for ``arch`` with its copy kernel loaded on ``device``; None while it is being built in the
    background, where ``GRAPHJIT_BATCH_COPY=off``, or where it cannot be built or loaded (logged once)."""
    lib = _ready.get((arch, device))
    if lib is not None:
        return lib
    mode = env.settings().batch_copy
    if mode == "off":
        return None
    with _lock:
        if arch in _failed or arch in _building:
            return None
        lib = _ready.get((arch, device))
        if lib is not None:
            return lib
        try:
            from .collectives import csrc_build
            from .collectives import library as csrc_library
            path = csrc_library.library_path(arch)
            if not path.is_file():
                if mode == "auto":
                    _building.add(arch)
                    threading.Thread(target=_build, args=(arch,), name="graphjit-batch-copy-build",
                                     daemon=True).start()
                    return None
                csrc_build.build(arch)
            lib = csrc_library.load(arch, build_if_missing=False)
            lib.copy_preload(device)
        except Exception as exc:  # BuildError, CollectiveError, OSError: the framework's copies serve
            _fail(arch, str(exc))
            return None
        _ready[(arch, device)] = lib
        log.debug("graphjit: batch copies on cuda:%d use %s", device, lib.path)
        return lib


def never(arch: str) -> bool:
    """True where :func:`library` will not give a library for ``arch`` in this process (switched off, or it failed)."""
    return env.settings().batch_copy == "off" or arch in _failed


def _build(arch: str) -> None:
    """The background build of ``auto`` mode; the next :func:`library` call loads what it built."""
    log.info("graphjit: building the batch copy kernel for %s in the background (nvcc; copies go the framework's "
             "way until it is ready; `python -m graphjit build` builds it ahead of time)", arch)
    try:
        from .collectives import csrc_build
        csrc_build.build(arch)
    except Exception as exc:
        with _lock:
            _fail(arch, str(exc))
    finally:
        with _lock:
            _building.discard(arch)


def _fail(arch: str, why: str) -> None:
    if arch not in _failed:
        _failed[arch] = why
        log.info("graphjit: no batch copies for %s (the framework's copies serve): %s", arch, why.splitlines()[0])


def status() -> dict[str, Any]:
    """What :func:`library` found so far: loaded (arch, device) pairs, architectures being built, failures."""
    with _lock:
        return {"ready": sorted(f"{a}/cuda:{d}" for a, d in _ready), "building": sorted(_building),
                "failed": dict(_failed)}


class Batch:
    """The copies between one key's static buffers (``fixed``, known at capture) and a call's tensors.

    :meth:`into` copies call tensors into fixed buffers (inputs), :meth:`out_of` fixed buffers into new tensors
    (outputs).  Either says no (False, None), having copied nothing the caller relies on, where the batch cannot
    serve this call (fewer than :data:`MIN_TENSORS` copies, a call tensor that is not dense, no library): the caller
    then copies the framework's way."""

    __slots__ = ("arch", "at", "calls", "dense", "device", "dst", "fixed", "fixed_ptrs", "fn", "nbytes", "ops", "ptr",
                 "sizes", "src", "stream", "usable")

    def __init__(self, ops: Operands, fixed: Sequence[Any], usable: Sequence[bool], arch: str, device: int) -> None:
        self.ops = ops
        self.arch = arch
        self.device = device
        self.stream = ops.stream(device)
        self.dense, self.ptr = ops.dense, ops.data_ptr
        n = len(fixed)
        self.fixed = list(fixed)
        self.usable = list(usable)  # fixed buffers a batch may copy (dense, non-complex, on this GPU)
        self.fixed_ptrs = [ops.data_ptr(t) if u else 0 for t, u in zip(fixed, usable)]
        self.nbytes = [ops.nbytes(t) if u else 0 for t, u in zip(fixed, usable)]
        # the library reads the entries from these three arrays, by address (they are never resized)
        self.dst = array.array("Q", [0] * n)
        self.src = array.array("Q", [0] * n)
        self.sizes = array.array("q", self.nbytes)
        self.at = (self.dst.buffer_info()[0], self.src.buffer_info()[0], self.sizes.buffer_info()[0])
        self.fn: Any = None  # the library's copy_batch once loaded; False where there will be none
        self.calls = 0  # calls it served

    @classmethod
    def plan(cls, ops: Operands | None, fixed: Sequence[Any], every: bool = False) -> Batch | None:
        """A batch for the fixed buffers that are dense non-complex tensors of one GPU (the first such tensor's;
        None stands for a buffer it never copies), where at least :data:`MIN_TENSORS` are (``every``: where all
        are), else None."""
        if ops is None or len(fixed) < MIN_TENSORS:
            return None
        where = [ops.target(t) if t is not None else None for t in fixed]
        first = next((w for w in where if w is not None), None)
        if first is None:
            return None
        usable = [w == first for w in where]
        if sum(usable) < MIN_TENSORS or (every and not all(usable)):
            return None
        return cls(ops, fixed, usable, first[0], first[1])

    def _function(self) -> Any:
        """The library's ``copy_batch``, loaded at the first call that needs it; None while there is none."""
        fn = self.fn
        if fn is None:
            lib = library(self.arch, self.device)
            if lib is None:
                if never(self.arch):  # off, or it cannot be built or loaded: stop asking on every call
                    self.fn = False
                return None
            fn = self.fn = lib.copy_batch
        return fn or None

    def into(self, which: Sequence[int], tensors: Sequence[Any]) -> bool:
        """Copy ``tensors[k]`` into fixed buffer ``which[k]`` for every k (the key's shapes and dtypes)."""
        n = len(which)
        if n < MIN_TENSORS:
            return False
        fn = self.fn or self._function()
        if fn is None:
            return False
        dense, ptr = self.dense, self.ptr
        dst, src, sizes, fixed = self.dst, self.src, self.sizes, self.fixed_ptrs
        nbytes, usable = self.nbytes, self.usable
        k = 0
        for i, t in zip(which, tensors):
            if not usable[i] or not dense(t):
                return False
            dst[k] = fixed[i]
            src[k] = ptr(t)
            sizes[k] = nbytes[i]
            k += 1
        d, s, b = self.at
        if fn(n, d, s, b, self.device, self.stream()):
            return self._failed()
        self.calls += 1
        return True

    def out_of(self) -> list[Any] | None:
        """New tensors holding a copy of every fixed buffer, in order; None where the batch cannot serve."""
        fn = self.fn or self._function()
        if fn is None:
            return None
        empty, ptr = self.ops.empty_like, self.ptr
        outs = [empty(t) for t in self.fixed]
        dst, src = self.dst, self.src
        for k, (o, p) in enumerate(zip(outs, self.fixed_ptrs)):
            dst[k] = ptr(o)
            src[k] = p
        d, s, b = self.at
        if fn(len(outs), d, s, b, self.device, self.stream()):
            self._failed()
            return None
        self.calls += 1
        return outs

    def _failed(self) -> bool:
        """After a failed call: no more batch copies for this GPU's architecture (logged once); always False."""
        lib = library(self.arch, self.device)
        why = (lib.last_error() if lib is not None else "") or "no message"
        self.fn = False
        with _lock:
            _ready.pop((self.arch, self.device), None)
            _fail(self.arch, f"the batch copy failed: {why}")
        return False
