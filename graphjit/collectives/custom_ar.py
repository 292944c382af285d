"""The custom all-reduce for one process group: init, eligibility, eager and captured calls.

``init(group)`` sets up, on every rank of the group at once (it is a collective):

1. local checks: ``GRAPHJIT_CUSTOM_AR``, world size (2, 4, 6, 8), CUDA, the GPU's architecture,
   the library (built with nvcc on first use, see :mod:`._lib`);
2. every rank's node and GPU (PCI bus id) are exchanged: one node only, no shared GPU, P2P between
   all pairs, NVLink between all pairs above 2 GPUs (:mod:`.topology`);
3. per rank a signal+scratch buffer (header + ``max_bytes``) and a staging buffer (``max_bytes``),
   both ``cudaMalloc`` memory, whose IPC handles are exchanged and opened by every other rank;
4. a write-and-verify probe: every rank writes a token into every rank's buffer through the
   mappings, and every rank checks that all tokens arrived (P2P that the driver reports but that
   drops writes is caught here);
5. a self-test: one one-shot and one two-shot all-reduce of integer-valued data, checked exactly.

After every step that can differ between ranks, the ranks exchange their verdicts and all of them
take the first failure (in rank order): either every rank uses the custom all-reduce or none does.
A failure is not an exception: ``init`` returns a :class:`Report` whose ``reason`` says why, and
every later call runs the framework's collective, counted under that reason.  Bad arguments raise
:class:`~graphjit.errors.ConfigError`, and so do settings that differ between the ranks (step 2
compares them: :data:`SHARED_OPTIONS`).

Calls (through the swap, :mod:`.swap`):

* **eager** (not capturing): the input is copied into this rank's staging buffer and the kernel
  reads the staging buffers of all ranks; the result is written into the caller's tensor (in
  place, as ``all_reduce`` does).  Warmup calls inside a graphed function or a capture scope take
  this path, so they return the right sum.
* **captured** (the current stream is capturing): zero copy.  The kernel reads the tensor itself
  on every rank; its address is recorded and the launch gets the next pointer-table slot.  Right
  after the capture (``graphjit.scope.AFTER_CAPTURE``, before the graph's first replay) the ranks
  exchange IPC handles of those addresses and fill the slots.  All ranks must capture the same
  all-reduces in the same order (as for NCCL).  Programs that capture graphs themselves (with
  ``scope="always"``) call :func:`register_graph_buffers` after each capture, on every rank.

One stream at a time: the kernels of one group synchronize through per-block counters in device
memory, so a rank must not run two custom all-reduces of the same group concurrently (on two
streams without ordering between them), as with NCCL communicators.  Eager calls, warmups and
graph replays on the framework's current stream, graphjit's normal use, satisfy this.

Fallback reasons (the keys of ``stats()["fallbacks"]``; see :data:`REASONS`): a call that is not
eligible runs the original ``all_reduce`` with its own arguments, return value and semantics.
Decisions per call are made on each rank from the call's arguments, so they agree across ranks
when the ranks run the same program with the same settings (``GRAPHJIT_*`` included).
"""

from __future__ import annotations

import contextlib
import logging
import random
import socket
import sys
import threading
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from .. import env
from .. import scope as scope_mod
from ..backends.dist_base import Call, DistBackend, TensorInfo, in_compiled_graph, load
from ..errors import CaptureError, ConfigError
from . import _lib, topology
from ._lib import BuildError, CollectiveError

log = logging.getLogger("graphjit")

SCOPES = ("graphed", "always")
BACKENDS = ("auto", "torch", "paddle")
DEFAULT_MAX_BYTES = 8 << 20
MAX_MAX_BYTES = 1 << 31
DEFAULT_SLOTS = 16384
DEFAULT_TIMEOUT_S = 600.0
DEFAULT_MAX_BLOCKS = 64
SUPPORTED_WORLD_SIZES = (2, 4, 6, 8)
DTYPE_CODES = {"float32": 0, "float16": 1, "bfloat16": 2}
ALGO_CODES = {"auto": 0, "1shot": 1, "2shot": 2}
HEADER_BYTES = 8192  # gjar::kHeaderBytes
# Eager calls with GRAPHJIT_AR_ALGO=auto above this size run the framework's collective: an eager call
# first copies its tensor into the staging buffer, and on 2 x H200 (bf16, NV18) that copy makes the
# custom path as slow as NCCL at 32 MiB (126-133 vs 135 us) and slower at 64 MiB in one of three runs
# (259 vs 246 us; benchmarks/results/allreduce_h200x2_*.json).  Captured calls are zero copy and stay
# faster than NCCL up to 64 MiB (222 vs 271 us), so they have no crossover below max_bytes.
EAGER_NCCL_ABOVE = 32 << 20

Reason = tuple[str, str]

REASONS: dict[str, str] = {
    "disabled": "GRAPHJIT_CUSTOM_AR=0 (or GRAPHJIT_DISABLE=1): the custom all-reduce is off",
    "nccl": "GRAPHJIT_AR_ALGO=nccl: always the framework's collective",
    "scope": "outside a graphed call or capture scope (init(scope='graphed'), the default)",
    "not initialized": "collectives.init() was not called for this call's process group",
    "static mode": "Paddle is building a static program (to_static AST): the call is recorded as Paddle's op",
    "arguments": "arguments the custom path does not take (not a tensor, unknown keywords)",
    "op": "the reduce op is not SUM",
    "dtype": "dtype other than float32, float16, bfloat16",
    "device": "the tensor is not on this rank's GPU",
    "contiguity": "the tensor is not contiguous",
    "empty": "the tensor has no elements",
    "misaligned": "the tensor's data pointer is not 16-byte aligned (a view at an odd offset)",
    "bytes % 16": "the tensor's size in bytes is not a multiple of 16",
    "bytes > max": "the tensor is larger than max_bytes (the staging and scratch buffers)",
    "world size": "the group's size is not 2, 4, 6 or 8",
    "multi-node": "the group spans more than one node",
    "topology": "no P2P between some pair of GPUs, no NVLink between all pairs above 2 GPUs, or the probe failed",
    "unavailable": "init could not set up the custom all-reduce here (no CUDA, no nvcc, a build or self-test failure)",
    "VMM memory": "captured tensor in VMM memory (e.g. PyTorch expandable_segments): CUDA IPC cannot share it",
    "pointer table full": "no free slot for another captured all-reduce (collectives.reset() frees them)",
    "stream": "the framework's current stream is not the stream being captured",
    "crossover": f"auto, eager call above {EAGER_NCCL_ABOVE >> 20} MiB: NCCL is as fast or faster there (the "
                 "copy through the staging buffer); captured calls have no such crossover",
    "foreign capture": "a compiled all-reduce captured into a CUDA graph graphjit did not capture (torch.compile "
                       "mode='reduce-overhead'): its buffers could not be registered, so the framework's collective "
                       "runs inside that graph",
}


# -- eligibility (pure: no framework, no GPU) ------------------------------------------------------
def check_settings(settings: env.Settings) -> Reason | None:
    if settings.disable:
        return "disabled", "GRAPHJIT_DISABLE=1"
    if not settings.custom_ar:
        return "disabled", "GRAPHJIT_CUSTOM_AR=0"
    if settings.ar_algo == "nccl":
        return "nccl", "GRAPHJIT_AR_ALGO=nccl"
    return None


def check_world(world: int) -> Reason | None:
    if world not in SUPPORTED_WORLD_SIZES:
        return "world size", f"world size {world} is not supported (2, 4, 6 or 8)"
    return None


def check_tensor(info: TensorInfo | None, *, device: str, max_bytes: int) -> Reason | None:
    """Why a tensor cannot take the custom path (None: it can).  The order is the order of the table."""
    if info is None:
        return "arguments", "the first argument is not a dense tensor"
    if info.dtype not in DTYPE_CODES:
        return "dtype", f"dtype {info.dtype} (the custom all-reduce sums float32, float16 and bfloat16)"
    if info.device != device:
        return "device", f"tensor on {info.device}, the custom all-reduce of this group runs on {device}"
    if not info.contiguous:
        return "contiguity", "the tensor is not contiguous"
    if info.numel == 0:
        return "empty", "the tensor has no elements"
    if info.ptr % 16:
        return "misaligned", f"data pointer {info.ptr:#x} is not 16-byte aligned"
    if info.nbytes % 16:
        return "bytes % 16", f"{info.nbytes} bytes is not a multiple of 16"
    if info.nbytes > max_bytes:
        return "bytes > max", f"{info.nbytes} bytes > max_bytes={max_bytes}"
    return None


OPTIONS = ("max_bytes", "scope", "pointer_slots", "timeout_s", "max_blocks")
"""``init``'s settings of a group (a second ``init`` of the group must repeat them), as :class:`Communicator`
attributes."""
SHARED_OPTIONS = ("max_bytes", "scope", "pointer_slots", "max_blocks")
"""``init`` arguments that must be equal on every rank: they size the buffers that each rank reads and writes in
the others' memory (offsets into them are computed from ``max_bytes``), set the kernels' block counts, the
pointer tables and which calls take the custom kernel."""


def check_same_options(per_rank: list[tuple[Any, ...]]) -> None:
    """Raise :class:`ConfigError` (on every rank alike: each sees all ranks' values) when the ranks passed
    different :data:`SHARED_OPTIONS` to ``init``."""
    for i, name in enumerate(SHARED_OPTIONS):
        values = [options[i] for options in per_rank]
        if len(set(values)) > 1:
            each = ", ".join(f"rank {r}: {v!r}" for r, v in enumerate(values))
            raise ConfigError(f"collectives.init: {name} differs between the ranks of the group ({each}); pass the "
                              f"same {', '.join(SHARED_OPTIONS)} on every rank (GRAPHJIT_AR_MAX_BYTES included)")


def validate(max_bytes: Any, scope_name: Any, pointer_slots: Any, timeout_s: Any, max_blocks: Any,
             backend: Any) -> None:
    """ConfigError for bad ``init`` arguments (names the argument and what it accepts)."""
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int):
        raise ConfigError(f"max_bytes={max_bytes!r}: expected an integer number of bytes, e.g. 8 << 20")
    if max_bytes < 16 or max_bytes % 16 or max_bytes > MAX_MAX_BYTES:
        raise ConfigError(f"max_bytes={max_bytes}: expected a multiple of 16 between 16 and {MAX_MAX_BYTES} (2 GiB); "
                          "it sizes the staging and scratch buffers, larger tensors use the framework's collective")
    if scope_name not in SCOPES:
        raise ConfigError(f"scope={scope_name!r}: expected 'graphed' (custom kernel inside graphed calls and capture "
                          "scopes only) or 'always'")
    if backend not in BACKENDS:
        raise ConfigError(f"backend={backend!r}: expected one of {', '.join(repr(b) for b in BACKENDS)}")
    if isinstance(pointer_slots, bool) or not isinstance(pointer_slots, int) or not 2 <= pointer_slots <= 1 << 24:
        raise ConfigError(f"pointer_slots={pointer_slots!r}: expected an integer from 2 to {1 << 24}")
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s >= 0:
        raise ConfigError(f"timeout_s={timeout_s!r}: expected seconds >= 0 (0: a stuck all-reduce waits forever)")
    if isinstance(max_blocks, bool) or not isinstance(max_blocks, int) or not 1 <= max_blocks <= 64:
        raise ConfigError(f"max_blocks={max_blocks!r}: expected an integer from 1 to 64")


def _guarded(fn: Any) -> Reason | None:
    """``fn()``, with an unexpected exception turned into a reason (so that the ranks still agree)."""
    try:
        return fn()  # type: ignore[no-any-return]
    except Exception as exc:
        log.debug("graphjit all-reduce: init step failed", exc_info=True)
        return "unavailable", f"{type(exc).__name__}: {exc}"


def node_id() -> str:
    """Identifies the machine (kernel boot id: equal for containers of one node), for the one-node check."""
    boot = ""
    with contextlib.suppress(OSError), open("/proc/sys/kernel/random/boot_id") as f:
        boot = f.read().strip()
    return boot or socket.gethostname()


# -- statistics ------------------------------------------------------------------------------------
class Stats:
    """Counters of every call the swap saw (process-wide)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.clear()

    def clear(self) -> None:
        self.eager = 0
        self.captured = 0
        self.fallbacks: Counter[str] = Counter()
        self.details: dict[str, str] = {}
        self.registered = 0
        self.registrations = 0
        self.said: set[str] = set()

    def fallback(self, key: str, detail: str) -> None:
        with self.lock:
            self.fallbacks[key] += 1
            first = key not in self.details
            if first:
                self.details[key] = detail
        if first:
            level = logging.DEBUG if key in ("scope", "static mode") else logging.INFO
            log.log(level, "graphjit all-reduce: the framework's collective runs (%s: %s)", key, detail)

    def as_dict(self) -> dict[str, Any]:
        with self.lock:
            return {"custom": {"eager": self.eager, "captured": self.captured},
                    "fallbacks": dict(self.fallbacks), "reasons": dict(self.details),
                    "registered": self.registered, "registrations": self.registrations}


STATS = Stats()


@dataclass(frozen=True)
class Report:
    """What ``init`` set up (``enabled``) or why not (``reason_key``, ``reason``)."""

    enabled: bool
    reason_key: str | None
    reason: str | None
    backend: str
    rank: int
    world_size: int
    max_bytes: int
    scope: str
    device: int | None = None
    arch: str | None = None
    library: str | None = None

    def __bool__(self) -> bool:
        return self.enabled

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# -- one process group -----------------------------------------------------------------------------
class Communicator:
    """The custom all-reduce of one process group on this rank."""

    def __init__(self, dist: DistBackend, group: Any, key: Any, max_bytes: int, scope_name: str, pointer_slots: int,
                 timeout_s: float, max_blocks: int, lib: _lib.Library | None = None) -> None:
        self.dist = dist
        self.group = group
        self.key = key
        self.rank = dist.rank(group)
        self.world = dist.world_size(group)
        self.max_bytes = max_bytes
        self.scope = scope_name
        self.pointer_slots = pointer_slots
        self.timeout_s = float(timeout_s)
        self.max_blocks = max_blocks
        self.lib: Any = lib
        self.device: int | None = None
        self.device_str = "cuda:?"
        self.arch: str | None = None
        self.pci = ""
        self.ctx = 0
        self.signal = 0
        self.staging = 0
        self.enabled = False
        self.reason: Reason | None = None
        self.pending_seq: list[int] = []
        self.lock = threading.RLock()

    # -- setup -------------------------------------------------------------------------------------
    def options(self, names: tuple[str, ...] = OPTIONS) -> tuple[Any, ...]:
        """This communicator's ``init`` settings ``names`` (default: all of :data:`OPTIONS`), in that order."""
        return tuple(getattr(self, name) for name in names)

    def report(self) -> Report:
        key, detail = self.reason if self.reason else (None, None)
        return Report(self.enabled, key, detail, self.dist.name, self.rank, self.world, self.max_bytes, self.scope,
                      self.device, self.arch, str(self.lib.path) if getattr(self.lib, "path", None) else None)

    def agree(self, local: Reason | None, payload: Any = None) -> tuple[Reason | None, list[Any]]:
        """All-gather ``(local, payload)``; the first failure in rank order becomes every rank's."""
        got = self.dist.all_gather_object((local, payload), self.group)
        for r, (reason, _payload) in enumerate(got):
            if reason is not None:
                return (reason[0], f"rank {r}: {reason[1]}"), [p for _r, p in got]
        return None, [p for _r, p in got]

    def setup(self) -> None:
        """The init protocol of the module docstring.  Leaves ``enabled`` or ``reason`` set.

        Every rank runs the same sequence of exchanges whatever happens locally: a local failure
        (even an unexpected exception) becomes a reason that the next exchange hands to every rank.
        """
        local = check_settings(env.settings()) or check_world(self.world) or _guarded(self._local_device)
        reason, infos = self.agree(local, {"node": node_id(), "host": socket.gethostname(), "pci": self.pci,
                                           "options": self.options(SHARED_OPTIONS)})
        check_same_options([i["options"] for i in infos])
        if reason is None:
            nodes = [i["node"] for i in infos]
            pcis = [i["pci"] for i in infos]
            local = topology.nodes_verdict(nodes, [i["host"] for i in infos]) or _guarded(lambda: self._topology(pcis))
            reason, _ = self.agree(local)
        if reason is not None:
            return self._disable(reason, release=False)
        try:
            self._setup_buffers()
        except BaseException:  # a bug or an interrupt on this rank: free what is ours without waiting for peers
            self._release(collective=False)
            raise

    def _local_device(self) -> Reason | None:
        why = self.dist.cuda_unavailable()
        if why is not None:
            return "unavailable", why
        self.device = self.dist.current_device()
        self.device_str = f"cuda:{self.device}"
        major, minor = self.dist.capability(self.device)
        if major < 7:
            return "unavailable", f"the GPU is sm_{major}{minor}; the custom all-reduce needs sm_70 or newer"
        self.arch = f"sm_{major}{minor}"
        if self.lib is None:
            try:
                self.lib = _lib.load(self.arch)
            except BuildError as exc:
                return "unavailable", f"the custom all-reduce library: {exc}"
        try:
            self.pci = self.lib.device_info(self.device)[0]
        except CollectiveError as exc:
            return "unavailable", str(exc)
        return None

    def _topology(self, pcis: list[str]) -> Reason | None:
        p2p, nvlink, problem = topology.nvml_matrices(pcis)
        p2p = topology.merge_cuda_peer(p2p, pcis, self.lib.can_access_peer)
        shared = env.settings().ar_shared_gpu
        if shared and len(set(pcis)) < len(pcis):
            log.warning("graphjit all-reduce: GRAPHJIT_AR_SHARED_GPU=1 and ranks share a GPU: the custom all-reduce "
                        "runs for testing only (the ranks' kernels take turns on the GPU)")
        return topology.verdict(pcis, p2p, nvlink, problem, allow_shared=shared)

    def _setup_buffers(self) -> None:
        lib, dev = self.lib, self.device
        assert dev is not None
        local: Reason | None = None
        handles: tuple[bytes, bytes] | None = None
        try:
            self.signal, signal_handle = lib.alloc(dev, HEADER_BYTES + self.max_bytes)
            self.staging, staging_handle = lib.alloc(dev, self.max_bytes)
            handles = (signal_handle, staging_handle)
        except CollectiveError as exc:
            local = ("unavailable", f"allocating the IPC buffers failed: {exc}")
            handles = None
        reason, all_handles = self.agree(local, handles)
        if reason is not None:
            return self._disable(reason, release=True)
        try:
            self.ctx = lib.create(self.rank, self.world, dev, [h[0] for h in all_handles], self.signal,
                                  HEADER_BYTES + self.max_bytes, [h[1] for h in all_handles], self.staging,
                                  self.max_bytes, self.pointer_slots, self.max_blocks, self.timeout_s)
        except CollectiveError as exc:
            local = ("topology" if "IpcOpenMemHandle" in str(exc) else "unavailable", str(exc))
        reason, tokens = self.agree(local, random.getrandbits(31) | 1)
        if reason is not None:
            return self._disable(reason, release=True)
        token = int(tokens[0])
        stream = self.dist.current_stream(dev)
        try:
            lib.probe_write(self.ctx, token, stream)
        except CollectiveError as exc:
            local = ("topology", f"the P2P write probe failed: {exc}")
        reason, _ = self.agree(local)  # also the barrier between every rank's writes and the reads
        if reason is not None:
            return self._disable(reason, release=True)
        try:
            mask = lib.probe_check(self.ctx, token, stream)
            missing = [r for r in range(self.world) if not (mask >> r) & 1]
            if missing:
                local = ("topology", f"the P2P write-and-verify probe failed: the writes of rank(s) "
                         f"{', '.join(map(str, missing))} did not arrive (P2P reported but not working)")
        except CollectiveError as exc:
            local = ("topology", f"the P2P read probe failed: {exc}")
        reason, _ = self.agree(local)
        if reason is not None:
            return self._disable(reason, release=True)
        reason, _ = self.agree(_guarded(self._self_test))
        if reason is not None:
            return self._disable(reason, release=True)
        self.enabled = True
        log.info("graphjit all-reduce: custom all-reduce on for %s group of %d ranks (rank %d, %s, %s, max_bytes=%d, "
                 "scope=%s)", self.dist.name, self.world, self.rank, self.device_str, self.arch, self.max_bytes,
                 self.scope)
        return None

    def _self_test(self) -> Reason | None:
        """One eager one-shot and two-shot all-reduce of integer-valued float32 data, checked exactly."""
        dev = self.device
        assert dev is not None
        n = 4096 + 16 * self.world  # not a multiple of world * 512: exercises the last partition
        base = (np.arange(n) % 251 + 1).astype(np.float32)
        want = base * np.float32(self.world * (self.world + 1) // 2)
        for algo, name in ((1, "one-shot"), (2, "two-shot")):
            try:
                x = self.dist.from_numpy(base * np.float32(self.rank + 1), dev)
                info = self.dist.tensor_info(x)
                assert info is not None
                self.lib.all_reduce(self.ctx, info.ptr, info.ptr, n, 0, algo, self.dist.current_stream(dev))
                self.dist.synchronize(dev)
                got = np.asarray(self.dist.to_numpy(x)).reshape(-1)
            except CollectiveError as exc:
                return "unavailable", f"the {name} self-test failed: {exc}"
            if not np.array_equal(got, want):
                bad = int(np.flatnonzero(got != want)[0])
                return "unavailable", (f"the {name} self-test returned a wrong sum at element {bad} "
                                       f"({got[bad]} instead of {want[bad]})")
        return None

    def _disable(self, reason: Reason, release: bool) -> None:
        """Turn the custom all-reduce off with ``reason`` (the same on every rank).  ``release``: the
        buffer stage was reached (on every rank alike), so release collectively."""
        self.reason = reason
        self.enabled = False
        if release:
            self._release()
        level = logging.WARNING if reason[0] in ("unavailable", "topology") and "CPU build" not in reason[1] \
            and "no CUDA device" not in reason[1] else logging.INFO
        log.log(level, "graphjit all-reduce: the custom all-reduce is off for this %s group (%s: %s); "
                "the framework's collective runs", self.dist.name, reason[0], reason[1])

    def _release(self, collective: bool = True) -> None:
        """Free this rank's buffers once every rank stopped using them (``collective``: wait for them)."""
        dev = self.device if self.device is not None else 0
        with contextlib.suppress(Exception):
            self.dist.synchronize(dev)
        if collective:
            self.agree(None)
        if self.ctx:
            try:
                self.lib.destroy(self.ctx)
            except CollectiveError as exc:
                log.warning("graphjit all-reduce: %s", exc)
            self.ctx = 0
        if collective:
            self.agree(None)  # every rank closed its mappings of our buffers
        for attr in ("signal", "staging"):
            ptr = getattr(self, attr)
            if ptr:
                try:
                    self.lib.free(dev, ptr)
                except CollectiveError as exc:
                    log.warning("graphjit all-reduce: %s", exc)
                setattr(self, attr, 0)

    def shutdown(self) -> None:
        with self.lock:
            was_enabled = self.enabled  # the same on every rank
            self.enabled = False
            self.pending_seq.clear()
            if was_enabled:
                self._release()
            self.reason = ("not initialized", "collectives.shutdown() was called")

    # -- calls -------------------------------------------------------------------------------------
    def passthrough(self, key: str, detail: str, original: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        STATS.fallback(key, detail)
        return original(*args, **kwargs)

    def call(self, call: Call, original: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if not self.enabled:  # first: the reason it is off says more than where the call ran
            key, detail = self.reason or ("unavailable", "collectives.init() did not finish")
            return self.passthrough(key, detail, original, args, kwargs)
        if self.scope == "graphed" and scope_mod.collective_mode() is None:
            return self.passthrough("scope", REASONS["scope"], original, args, kwargs)
        settings = env.settings()
        problem = check_settings(settings)
        if problem is not None:
            return self.passthrough(*problem, original, args, kwargs)
        dist = self.dist
        if not dist.is_sum(call.op):
            return self.passthrough("op", f"op {call.op!r} is not SUM", original, args, kwargs)
        info = dist.tensor_info(call.tensor)
        problem = check_tensor(info, device=self.device_str, max_bytes=self.max_bytes)
        if problem is not None:
            return self.passthrough(*problem, original, args, kwargs)
        assert info is not None
        lib, ctx = self.lib, self.ctx
        stream = dist.current_stream(self.device)  # type: ignore[arg-type]
        dtype = DTYPE_CODES[info.dtype]
        algo = ALGO_CODES[settings.ar_algo]
        if dist.capturing():
            if in_compiled_graph() and scope_mod.phase() != "capture":
                return self.passthrough("foreign capture", REASONS["foreign capture"], original, args, kwargs)
            with self.lock:
                if lib.stream_capturing(stream) != 1:
                    return self.passthrough("stream", f"the {dist.name} current stream {stream:#x} is not capturing",
                                            original, args, kwargs)
                if not lib.ipc_capable(info.ptr):
                    return self.passthrough("VMM memory", REASONS["VMM memory"], original, args, kwargs)
                used, capacity = lib.slots(ctx)
                if used >= capacity:
                    return self.passthrough("pointer table full", f"all {capacity - 1} slots are used by captured "
                                            "all-reduces; collectives.reset() frees them (after dropping the graphs)",
                                            original, args, kwargs)
                lib.all_reduce(ctx, info.ptr, info.ptr, info.numel, dtype, algo, stream)
                self.pending_seq.append(scope_mod.last_capture() if scope_mod.phase() == "capture" else -1)
            with STATS.lock:
                STATS.captured += 1
        else:
            if settings.ar_algo == "auto" and info.nbytes > EAGER_NCCL_ABOVE:
                return self.passthrough("crossover", f"{info.nbytes} bytes > {EAGER_NCCL_ABOVE} in an eager "
                                        "call: the framework's collective is as fast", original, args, kwargs)
            lib.all_reduce(ctx, info.ptr, info.ptr, info.numel, dtype, algo, stream)
            with STATS.lock:
                STATS.eager += 1
        return dist.result(call)

    # -- after a capture ---------------------------------------------------------------------------
    def register(self, current_capture: int | None) -> int:
        """Register the pending captured inputs on every rank (a collective).  Returns how many.

        ``current_capture``: graphjit's id of the capture that just ended; pending entries of
        earlier graphjit captures (captures that failed) are dropped first.  None: register all.
        """
        with self.lock:
            if not self.enabled:
                return 0
            lib, ctx = self.lib, self.ctx
            stale = 0
            if current_capture is not None:
                for seq in self.pending_seq:
                    if 0 < seq < current_capture:
                        stale += 1
                    else:
                        break
            if stale:
                lib.drop_pending(ctx, stale)
                del self.pending_seq[:stale]
            n = len(self.pending_seq)
            if n == 0:
                return 0
            error = None
            handles: list[bytes] = []
            offsets: list[int] = []
            try:
                handles, offsets = lib.pending_handles(ctx, n)
            except CollectiveError as exc:
                error = str(exc)
            got = self.dist.all_gather_object({"n": n, "handles": handles, "offsets": offsets, "error": error},
                                              self.group)
            problem = next((f"rank {r}: {g['error']}" for r, g in enumerate(got) if g["error"]), None)
            counts = [g["n"] for g in got]
            if problem is None and len(set(counts)) > 1:
                problem = ("the ranks captured different numbers of custom all-reduces "
                           f"({', '.join(f'rank {r}: {c}' for r, c in enumerate(counts))}); every rank must capture "
                           "the same all-reduces in the same order")
            if problem is None:
                try:
                    lib.register_pending(ctx, n, [g["handles"] for g in got], [g["offsets"] for g in got],
                                         self.dist.current_stream(self.device))  # type: ignore[arg-type]
                except CollectiveError as exc:
                    error = str(exc)
                verdicts = self.dist.all_gather_object(error, self.group)
                problem = next((f"rank {r}: {e}" for r, e in enumerate(verdicts) if e), None)
            if problem is not None:
                with contextlib.suppress(CollectiveError):
                    lib.drop_pending(ctx, lib.pending(ctx))
                self.pending_seq.clear()
                raise CaptureError("graphjit all-reduce: the all-reduces captured in this graph could not be "
                                   f"registered on every rank, so the graph is dropped: {problem}",
                                   reason="custom all-reduce registration failed")
            self.pending_seq.clear()
            with STATS.lock:
                STATS.registered += n
                STATS.registrations += 1
            return n

    def reset(self) -> None:
        with self.lock:
            if self.enabled and self.ctx:
                self.lib.reset(self.ctx)
            self.pending_seq.clear()


# -- the process-wide registry ---------------------------------------------------------------------
_COMMS: dict[Any, Communicator] = {}
_registry_lock = threading.RLock()


def dispatch(dist: DistBackend, original: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The swap's handler: run ``original(*args, **kwargs)`` or the custom kernel, counting why."""
    settings = env.settings()
    if settings.disable:
        STATS.fallback("disabled", "GRAPHJIT_DISABLE=1")
        return original(*args, **kwargs)
    if dist.static_mode():
        STATS.fallback("static mode", REASONS["static mode"])
        return original(*args, **kwargs)
    call = dist.parse_call(args, kwargs)
    if call is None:
        STATS.fallback("arguments", REASONS["arguments"])
        return original(*args, **kwargs)
    comm = None
    if _COMMS:
        try:
            comm = _COMMS.get(dist.group_key(call.group))
        except Exception:  # a group object the backend does not understand
            comm = None
    if comm is None:
        STATS.fallback("not initialized", REASONS["not initialized"])
        return original(*args, **kwargs)
    return comm.call(call, original, args, kwargs)


def after_capture() -> None:
    """``graphjit.scope.AFTER_CAPTURE`` hook: register what the capture that just ended recorded."""
    if not _COMMS:
        return
    current = scope_mod.last_capture()
    for comm in list(_COMMS.values()):
        if comm.pending_seq:
            comm.register(current)


def _pick_backend(backend: str, group: Any) -> DistBackend:
    if backend != "auto":
        return load(backend)
    if group is not None:
        module = type(group).__module__ or ""
        for name in ("torch", "paddle"):
            if module == name or module.startswith(name + "."):
                return load(name)
        raise ConfigError(f"group={group!r}: expected a torch.distributed or paddle.distributed process group, or None")
    present = [n for n in ("torch", "paddle") if n in sys.modules]
    if len(present) == 1:
        return load(present[0])
    if not present:
        raise ConfigError("collectives.init(): neither torch nor paddle is imported; initialise the framework's "
                          "process group first")
    initialized = [n for n in present if load(n).initialized()]
    if len(initialized) == 1:
        return load(initialized[0])
    raise ConfigError("collectives.init(): both torch and paddle are imported"
                      + (" and both have an initialised process group" if initialized else "")
                      + "; pass backend='torch' or backend='paddle'")


def init(group: Any = None, max_bytes: int | None = None, scope: str = "graphed", *, backend: str = "auto",
         pointer_slots: int = DEFAULT_SLOTS, timeout_s: float = DEFAULT_TIMEOUT_S,
         max_blocks: int = DEFAULT_MAX_BLOCKS) -> Report:
    """Set up the custom all-reduce for ``group`` (a collective: call it on every rank of the group).

    Args:
        group: the process group (torch or paddle); None: the default (world) group.
        max_bytes: the largest tensor the custom kernel takes (bytes, multiple of 16); sizes the
            staging and scratch buffers (device memory: about 2 x max_bytes per rank, each rank's
            mapped by every other).  Default ``GRAPHJIT_AR_MAX_BYTES`` or 8 MiB.
        scope: ``"graphed"``: the custom kernel runs inside graphed calls and capture scopes only;
            ``"always"``: for every eligible call.
        backend: ``"auto"`` (from ``group`` or the imported framework), ``"torch"``, ``"paddle"``.
        pointer_slots: capacity of the pointer table (one slot per captured all-reduce).
        timeout_s: a kernel waiting longer than this for another rank traps (0: waits forever).
        max_blocks: thread blocks per kernel (1..64; default 64, measured best on 2 x H200 from
            512 KiB up and no worse below; fewer leave SMs to kernels running alongside).

    Returns a :class:`Report`; ``report.enabled`` is False with ``report.reason`` when the custom
    all-reduce cannot run here (then the framework's collective runs).  With ``GRAPHJIT_AR_ALGO=auto``
    eager calls above 32 MiB also run the framework's collective (reason ``crossover``).  Wraps the framework's
    ``all_reduce`` (once) in any case, so that every call is counted in :func:`stats`.

    Raises :class:`~graphjit.errors.ConfigError` for a bad argument, and on every rank when the ranks passed
    different ``max_bytes``, ``scope``, ``pointer_slots`` or ``max_blocks`` (:data:`SHARED_OPTIONS`; with
    different buffer sizes the ranks would disagree on which calls fit).
    """
    if max_bytes is None:
        max_bytes = env.settings().ar_max_bytes or DEFAULT_MAX_BYTES
    validate(max_bytes, scope, pointer_slots, timeout_s, max_blocks, backend)
    dist = _pick_backend(backend, group)
    if not dist.initialized():
        raise ConfigError(f"{dist.name}.distributed is not initialised: call "
                          + ("torch.distributed.init_process_group()" if dist.name == "torch"
                             else "paddle.distributed.init_parallel_env()")
                          + " on every rank before graphjit.collectives.init()")
    try:
        resolved = dist.resolve_group(group)
        key = dist.group_key(resolved)
    except Exception as exc:
        raise ConfigError(f"group={group!r}: not a {dist.name} process group ({exc})") from exc
    from . import swap

    swap.install(dist)
    if after_capture not in scope_mod.AFTER_CAPTURE:
        scope_mod.AFTER_CAPTURE.append(after_capture)
    with _registry_lock:
        existing = _COMMS.get(key)
        options = (max_bytes, scope, pointer_slots, float(timeout_s), max_blocks)
        if existing is not None:
            if existing.options() != options:
                raise ConfigError("collectives.init() was already called for this group with other settings "
                                  f"({dict(zip(OPTIONS, existing.options()))}); call collectives.shutdown() first")
            return existing.report()
        comm = Communicator(dist, resolved, key, max_bytes, scope, pointer_slots, float(timeout_s), max_blocks)
        comm.setup()
        _COMMS[key] = comm
        if comm.enabled:
            swap.set_opaque(dist.name, True)
        return comm.report()


def communicators() -> list[Communicator]:
    return list(_COMMS.values())


def _targets(group: Any) -> list[Communicator]:
    if group is None:
        return list(_COMMS.values())
    found = []
    for comm in _COMMS.values():
        with contextlib.suppress(Exception):
            if comm.key == comm.dist.group_key(group):
                found.append(comm)
    return found


def register_graph_buffers(group: Any = None) -> int:
    """After capturing a graph yourself (``scope="always"``): register its all-reduces on every rank.

    A collective over each group with pending captured all-reduces.  graphjit's own captures do
    this automatically.  Returns the number of buffers registered.
    """
    return sum(comm.register(None) for comm in _targets(group) if comm.pending_seq)


def reset(group: Any = None) -> None:
    """Free the pointer-table slots of captured all-reduces (and the mappings of their buffers).

    Call it on every rank after dropping the graphs that used them (``fn.reset()``): replaying
    such a graph afterwards is an error the kernel reports (it never reads a stale slot).
    """
    for comm in _targets(group):
        comm.reset()


def shutdown(group: Any = None) -> None:
    """Free the buffers of the custom all-reduce (a collective).  The swap stays; calls pass through."""
    from . import swap

    with _registry_lock:
        for comm in _targets(group):
            comm.shutdown()
            _COMMS.pop(comm.key, None)
        for name in {c.dist.name for c in _targets(group)} | set(swap.installed()):
            if not any(c.enabled and c.dist.name == name for c in _COMMS.values()):
                swap.set_opaque(name, False)


def stats() -> dict[str, Any]:
    """Calls that ran the custom kernel (eager / captured), fallbacks by reason, registrations, groups."""
    out = STATS.as_dict()
    out["groups"] = [c.report().as_dict() for c in _COMMS.values()]
    return out


def reset_stats() -> None:
    with STATS.lock:
        STATS.clear()


def status() -> list[Report]:
    return [c.report() for c in _COMMS.values()]


__all__ = [
    "REASONS",
    "Communicator",
    "Report",
    "check_settings",
    "check_tensor",
    "check_world",
    "init",
    "register_graph_buffers",
    "reset",
    "shutdown",
    "stats",
]
