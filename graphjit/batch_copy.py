"""Several tensors copied in one kernel launch around a replay (``csrc/batch_copy.cuh``): the caller's inputs into a
key's static inputs (Paddle), and a key's static outputs into the fresh tensors a call returns (torch and Paddle).

A framework copies tensor by tensor, one launch each (``torch._foreach_copy_`` groups them, Paddle has no such op),
and on a virtualised host a launch costs microseconds of host time.  A :class:`Batch` is planned once per key, at
capture: the side of every copy that is fixed (the static buffers: their addresses and sizes) goes into arrays
then; a call fills in only the other side and makes one call into the library.

Guarantees: a batch copy writes the same bytes as the framework's copy it replaces, on the same stream (the current
one, which the replay runs on), so nothing ordered before or after it changes.  It is used only where every operand
is dense memory of one GPU and is its bytes (no torch conjugate or negative bit, not complex, quantized, sparse or a
zero tensor): checked per call for the caller's tensors, once for the static ones, whose addresses are compared on
every call (a buffer rebound since the capture goes the framework's way).  A source inside a destination is cloned
by the caller first (``StaticInputs.load``).  Anything else goes the framework's way, as does every call while the
library is missing, after it failed once (logged once), or while a CUDA error of earlier work is pending:
:class:`Batch` says no and its caller copies as before, so a result never depends on it.

Refuses nothing: it is an optimisation with a fallback.  The library is the csrc one of the custom all-reduce
(``python -m graphjit build`` builds it ahead of time), loaded where a key is planned, never on a replay.
``GRAPHJIT_BATCH_COPY``: ``auto`` (default) uses it where it is built and otherwise builds it once per process in a
background thread (nvcc, a few seconds): keys planned in the meantime copy the framework's way until a later capture
loaded it; ``on`` builds it at the first capture that needs it; ``off`` never uses it.
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
    outputs: bool
    """Whether several fresh outputs come out by a batch copy."""

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
    background, where ``GRAPHJIT_BATCH_COPY=off``, or where it cannot be built or loaded (logged once).

    Loads (and, with ``on``, builds) only when called where no capture runs: :meth:`Batch.plan`, at a key's
    capture; a replay only reads what is loaded.  The build runs outside the lock: other threads' calls do not
    wait for nvcc."""
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
            from .collectives import library as csrc_library
            built = csrc_library.library_path(arch).is_file()
        except Exception as exc:  # the sources are missing
            _fail(arch, str(exc))
            return None
        if not built:
            _building.add(arch)
            if mode == "auto":
                threading.Thread(target=_build, args=(arch,), name="graphjit-batch-copy-build", daemon=True).start()
                return None
    if not built:  # on: build here, outside the lock
        _build(arch)
    with _lock:
        if arch in _failed:
            return None
        try:
            lib = csrc_library.load(arch, build_if_missing=False)
            lib.copy_preload(device)
        except Exception as exc:  # BuildError, CollectiveError, OSError: the framework's copies serve
            _fail(arch, str(exc))
            return None
        _ready[(arch, device)] = lib
    log.debug("graphjit: batch copies on cuda:%d use %s", device, lib.path)
    return lib


def loaded(arch: str, device: int) -> Library | None:
    """The library :func:`library` loaded for ``arch`` on ``device``, if it did (a replay's read: loads nothing)."""
    return _ready.get((arch, device))


def never(arch: str) -> bool:
    """True where :func:`library` will not give a library for ``arch`` in this process (switched off, or it failed)."""
    return env.settings().batch_copy == "off" or arch in _failed


def _build(arch: str) -> None:
    """Build the library (``auto``: in a background thread); a later :func:`library` call loads it."""
    log.info("graphjit: building the batch copy kernel for %s (nvcc, a few seconds; copies go the framework's way "
             "until it is ready; `python -m graphjit build` builds it ahead of time)", arch)
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
    serve this call (fewer than :data:`MIN_TENSORS` copies, a call tensor that is not dense, a fixed tensor no longer
    at its address, no library, a CUDA error pending from earlier work): the caller then copies the framework's
    way.  The caller guarantees that no source lies inside a destination (``StaticInputs.load`` clones such a
    source first)."""

    __slots__ = ("arch", "at", "calls", "dense", "device", "dst", "fixed", "fixed_ptrs", "fn", "lib", "nbytes", "ops",
                 "ptr", "sizes", "src", "stream", "usable")

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
        self.lib: Any = None  # the loaded library; False where there will be none
        self.fn: Any = None  # its copy_batch
        self.calls = 0  # calls it served

    @classmethod
    def plan(cls, ops: Operands | None, fixed: Sequence[Any], every: bool = False) -> Batch | None:
        """A batch for the fixed buffers that are dense tensors of one GPU without lazy bits (the first such
        tensor's; None stands for a buffer it never copies), where at least :data:`MIN_TENSORS` are (``every``:
        where all are), else None.  Called at a key's capture, outside it: loads the library here (never on a
        replay), and plans nothing where there will be none (``off``, or it failed)."""
        if ops is None or len(fixed) < MIN_TENSORS:
            return None
        where = [ops.target(t) if t is not None else None for t in fixed]
        first = next((w for w in where if w is not None), None)
        if first is None:
            return None
        usable = [w == first for w in where]
        if sum(usable) < MIN_TENSORS or (every and not all(usable)):
            return None
        arch, device = first
        lib = library(arch, device)
        if lib is None and never(arch):
            return None
        batch = cls(ops, fixed, usable, arch, device)
        if lib is not None:
            batch.lib, batch.fn = lib, lib.copy_batch
        return batch

    def _function(self) -> Any:
        """The library's ``copy_batch`` once :func:`library` loaded it (built in the background meanwhile); None
        until then, and for good where there will be none."""
        if self.lib is None:
            lib = loaded(self.arch, self.device)
            if lib is None:
                if never(self.arch):
                    self.lib = False
                return None
            self.lib, self.fn = lib, lib.copy_batch
        return self.fn if self.lib else None

    def into(self, which: Sequence[int], tensors: Sequence[Any]) -> bool:
        """Copy ``tensors[k]`` into fixed buffer ``which[k]`` for every k (the key's shapes and dtypes)."""
        n = len(which)
        if n < MIN_TENSORS:
            return False
        fn = self.fn if self.lib else self._function()
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
        rc = fn(n, d, s, b, self.device, self.stream())
        if rc:
            return self._failed(rc)
        self.calls += 1
        return True

    def out_of(self) -> list[Any] | None:
        """New tensors holding a copy of every fixed buffer, in order; None where the batch cannot serve (a fixed
        tensor that is no longer at its address, say a module buffer returned as it is and rebound since)."""
        fn = self.fn if self.lib else self._function()
        if fn is None:
            return None
        ptr = self.ptr
        src = self.src
        for k, (t, p) in enumerate(zip(self.fixed, self.fixed_ptrs)):
            if ptr(t) != p:
                return None
            src[k] = p
        empty = self.ops.empty_like
        outs = [empty(t) for t in self.fixed]
        dst = self.dst
        for k, o in enumerate(outs):
            dst[k] = ptr(o)
        d, s, b = self.at
        rc = fn(len(outs), d, s, b, self.device, self.stream())
        if rc:
            self._failed(rc)
            return None
        self.calls += 1
        return outs

    def _failed(self, rc: int) -> bool:
        """After a call the library refused (nothing enqueued that the caller relies on): a CUDA error pending from
        earlier work leaves it to the framework (this call only); anything else ends batch copies for this GPU's
        architecture (logged once).  Always False."""
        from .collectives.library import ERR_STATE  # a CUDA error of earlier work pending: left for its owner

        if rc == ERR_STATE:
            return False
        why = self.lib.last_error() or f"status {rc}"
        self.lib, self.fn = False, None
        with _lock:
            _ready.pop((self.arch, self.device), None)
            _fail(self.arch, f"the batch copy failed: {why}")
        return False
