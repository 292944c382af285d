"""The custom all-reduce of one process group on this rank (:class:`Communicator`): its setup on every rank
at once (the steps are in :mod:`graphjit.collectives.custom_ar`'s docstring), eager and captured calls, the
registration of captured buffers, reset and shutdown."""

from __future__ import annotations

import contextlib
import logging
import random
import socket
import threading
from typing import Any

import numpy as np

from .. import env
from .. import scope as scope_mod
from ..backends.dist_base import Call, DistBackend, in_compiled_graph
from ..errors import CaptureError
from . import library, topology
from .library import BuildError, CollectiveError
from .reasons import (
    ALGO_CODES,
    DTYPE_CODES,
    EAGER_NCCL_ABOVE,
    HEADER_BYTES,
    OPTIONS,
    REASONS,
    SHARED_OPTIONS,
    Reason,
    check_same_options,
    check_settings,
    check_tensor,
    check_world,
)
from .report import STATS, Report

log = logging.getLogger("graphjit")


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


class Communicator:
    """The custom all-reduce of one process group on this rank."""

    def __init__(self, dist: DistBackend, group: Any, key: Any, max_bytes: int, scope_name: str, pointer_slots: int,
                 timeout_s: float, max_blocks: int, lib: library.Library | None = None) -> None:
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
                self.lib = library.load(self.arch)
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
