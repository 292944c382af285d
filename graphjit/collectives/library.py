"""The csrc library (the custom all-reduce and the batch copy), loaded with ctypes: its C API (status codes with
a thread-local message, :class:`CollectiveError` carrying both) as :class:`Library` methods, and :func:`load`, which
builds it first when it is missing (:mod:`graphjit.collectives.csrc_build`)."""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import GraphjitError
from .csrc_build import ABI_VERSION, BuildError, build, library_path, normalize_arch

log = logging.getLogger("graphjit")

HANDLE_BYTES = 64

STATUS_NAMES = {
    0: "ok",
    1: "bad argument",
    2: "CUDA error",
    3: "out of bounds",
    4: "pointer table full",
    5: "unsupported",
    6: "wrong state",
}
ERR_ARGUMENT, ERR_CUDA, ERR_BOUNDS, ERR_TABLE_FULL, ERR_UNSUPPORTED, ERR_STATE = 1, 2, 3, 4, 5, 6


class CollectiveError(GraphjitError, RuntimeError):
    """A call into the custom all-reduce library failed; ``code`` is its status code."""

    def __init__(self, message: str, code: int = ERR_CUDA) -> None:
        super().__init__(message)
        self.code = code


# -- ctypes ----------------------------------------------------------------------------------
_c = ctypes
_P = _c.c_void_p
_SIGNATURES: dict[str, tuple[list[Any], Any]] = {
    "gj_ar_abi_version": ([], _c.c_int),
    "gj_ar_last_error": ([], _c.c_char_p),
    "gj_ar_limits": ([_c.POINTER(_c.c_int), _c.POINTER(_c.c_int), _c.POINTER(_c.c_int), _c.POINTER(_c.c_longlong),
                      _c.POINTER(_c.c_int)], _c.c_int),
    "gj_ar_choose_algo": ([_c.c_int, _c.c_longlong, _c.POINTER(_c.c_int)], _c.c_int),
    "gj_ar_device_info": ([_c.c_int, _c.c_char_p, _c.c_int, _c.POINTER(_c.c_int), _c.POINTER(_c.c_int)], _c.c_int),
    "gj_ar_can_access_peer": ([_c.c_char_p, _c.c_char_p, _c.POINTER(_c.c_int)], _c.c_int),
    "gj_ar_ipc_capable": ([_P, _c.POINTER(_c.c_int)], _c.c_int),
    "gj_ar_stream_capturing": ([_P, _c.POINTER(_c.c_int)], _c.c_int),
    "gj_ar_alloc": ([_c.c_int, _c.c_longlong, _c.POINTER(_P), _c.c_char_p], _c.c_int),
    "gj_ar_free": ([_c.c_int, _P], _c.c_int),
    "gj_ar_create": ([_c.c_int, _c.c_int, _c.c_int, _c.c_char_p, _P, _c.c_longlong, _c.c_char_p, _P, _c.c_longlong,
                      _c.c_int, _c.c_int, _c.c_double, _c.POINTER(_P)], _c.c_int),
    "gj_ar_create_local": ([_c.c_int, _c.c_int, _c.c_int, _c.POINTER(_P), _c.POINTER(_P), _c.c_longlong,
                            _c.c_longlong, _c.c_int, _c.c_int, _c.c_double, _c.POINTER(_P)], _c.c_int),
    "gj_ar_destroy": ([_P], _c.c_int),
    "gj_ar_all_reduce": ([_P, _P, _P, _c.c_longlong, _c.c_int, _c.c_int, _P], _c.c_int),
    "gj_ar_pending": ([_P, _c.POINTER(_c.c_int)], _c.c_int),
    "gj_ar_slots": ([_P, _c.POINTER(_c.c_int), _c.POINTER(_c.c_int)], _c.c_int),
    "gj_ar_drop_pending": ([_P, _c.c_int], _c.c_int),
    "gj_ar_pending_handles": ([_P, _c.c_int, _c.c_char_p, _c.POINTER(_c.c_longlong)], _c.c_int),
    "gj_ar_register_pending": ([_P, _c.c_int, _c.c_char_p, _c.POINTER(_c.c_longlong), _P], _c.c_int),
    "gj_ar_register_local": ([_P, _c.c_int, _c.c_int, _c.POINTER(_P), _P], _c.c_int),
    "gj_ar_reset": ([_P], _c.c_int),
    "gj_ar_probe_write": ([_P, _c.c_uint, _P], _c.c_int),
    "gj_ar_probe_check": ([_P, _c.c_uint, _P, _c.POINTER(_c.c_int)], _c.c_int),
    "gj_copy_preload": ([_c.c_int], _c.c_int),
    "gj_copy_batch": ([_c.c_int, _P, _P, _P, _c.c_int, _P], _c.c_int),  # the three arrays by address
    "gj_feed_node": ([_c.c_int, _P, _c.POINTER(_P)], _c.c_int),
    "gj_feed_launch": ([_P, _P], _c.c_int),  # the table by address
    "gj_feed_layout": ([_c.POINTER(_c.c_int), _c.POINTER(_c.c_int), _c.POINTER(_c.c_int)], _c.c_int),
}


class Library:
    """The loaded C API, one Python method per function; failures raise :class:`CollectiveError`."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        try:
            dll = ctypes.CDLL(str(self.path))
        except OSError as exc:
            raise BuildError(f"cannot load {self.path}: {exc} (delete it to rebuild, or run `python -m graphjit "
                             "build --force`)") from exc
        missing = [name for name in _SIGNATURES if not hasattr(dll, name)]
        if missing:
            raise BuildError(f"{self.path} lacks {', '.join(missing)}: not a graphjit all-reduce library of this "
                             "version (delete it to rebuild)")
        for name, (argtypes, restype) in _SIGNATURES.items():
            fn = getattr(dll, name)
            fn.argtypes = argtypes
            fn.restype = restype
        self._dll = dll
        abi = dll.gj_ar_abi_version()
        if abi != ABI_VERSION:
            raise BuildError(f"{self.path} has ABI version {abi}, graphjit expects {ABI_VERSION} "
                             "(delete it to rebuild)")
        self._all_reduce = dll.gj_ar_all_reduce
        # The copy a replay makes (graphjit.batch_copy) called as it is, holding the GIL (PyDLL: no release and
        # re-acquire around a call that only enqueues a kernel): copy_batch(n, dsts, srcs, bytes, device, stream),
        # the three arrays by address; a status code back, 0 for ok (else last_error() says why).
        fast = ctypes.PyDLL(str(self.path)).gj_copy_batch
        fast.argtypes, fast.restype = _SIGNATURES["gj_copy_batch"]
        self.copy_batch = fast
        # A replay that hands the graph its own copies' pointers (graphjit.handoff): feed_launch(table, stream).  Called
        # releasing the GIL, as torch's own replay does: a launch blocks while the launch queue is full, and the work
        # ahead of it may wait on another Python thread.
        self.feed_launch = dll.gj_feed_launch

    # -- errors --------------------------------------------------------------------------------
    def last_error(self) -> str:
        raw = self._dll.gj_ar_last_error()
        return raw.decode(errors="replace") if raw else ""

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            raise CollectiveError(f"{what}: {self.last_error() or STATUS_NAMES.get(rc, 'error')} "
                                  f"[{STATUS_NAMES.get(rc, f'status {rc}')}]", code=rc)

    # -- information ---------------------------------------------------------------------------
    def limits(self) -> dict[str, int]:
        vals = [ctypes.c_int(), ctypes.c_int(), ctypes.c_int(), ctypes.c_longlong(), ctypes.c_int()]
        self._check(self._dll.gj_ar_limits(*[ctypes.byref(v) for v in vals]), "gj_ar_limits")
        return dict(zip(("max_ranks", "max_blocks", "threads", "header_bytes", "handle_bytes"),
                        (int(v.value) for v in vals)))

    def choose_algo(self, world: int, nbytes: int) -> int:
        out = ctypes.c_int()
        self._check(self._dll.gj_ar_choose_algo(world, nbytes, ctypes.byref(out)), "gj_ar_choose_algo")
        return int(out.value)

    def device_info(self, device: int) -> tuple[str, int, int]:
        buf = ctypes.create_string_buffer(64)
        major, minor = ctypes.c_int(), ctypes.c_int()
        self._check(self._dll.gj_ar_device_info(device, buf, 64, ctypes.byref(major), ctypes.byref(minor)),
                    "gj_ar_device_info")
        return buf.value.decode(), int(major.value), int(minor.value)

    def can_access_peer(self, pci_a: str, pci_b: str) -> int:
        out = ctypes.c_int()
        self._check(self._dll.gj_ar_can_access_peer(pci_a.encode(), pci_b.encode(), ctypes.byref(out)),
                    "gj_ar_can_access_peer")
        return int(out.value)

    def ipc_capable(self, ptr: int) -> bool:
        out = ctypes.c_int()
        self._check(self._dll.gj_ar_ipc_capable(ptr, ctypes.byref(out)), "gj_ar_ipc_capable")
        return bool(out.value)

    def stream_capturing(self, stream: int) -> int:
        out = ctypes.c_int()
        self._check(self._dll.gj_ar_stream_capturing(stream or None, ctypes.byref(out)), "gj_ar_stream_capturing")
        return int(out.value)

    def copy_preload(self, device: int) -> None:
        """Load the batch copy kernel on ``device`` (before its first launch, outside any capture)."""
        self._check(self._dll.gj_copy_preload(device), "gj_copy_preload")

    def feed_node(self, device: int, stream: int) -> int:
        """While ``stream`` is being captured: add a feed node (a batch copy of nothing) and return its handle."""
        node = ctypes.c_void_p()
        self._check(self._dll.gj_feed_node(device, stream, ctypes.byref(node)), "gj_feed_node")
        return int(node.value or 0)

    def feed_layout(self) -> tuple[int, int, int]:
        """``(words, entries, header)``: a feed table's size in uint64 words, the entries each side holds, and
        where the six arrays begin."""
        words, entries, header = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        self._check(self._dll.gj_feed_layout(ctypes.byref(words), ctypes.byref(entries), ctypes.byref(header)),
                    "gj_feed_layout")
        return words.value, entries.value, header.value

    # -- buffers and contexts --------------------------------------------------------------------
    def alloc(self, device: int, nbytes: int) -> tuple[int, bytes]:
        ptr = ctypes.c_void_p()
        handle = ctypes.create_string_buffer(HANDLE_BYTES)
        self._check(self._dll.gj_ar_alloc(device, nbytes, ctypes.byref(ptr), handle), "gj_ar_alloc")
        return int(ptr.value or 0), handle.raw

    def free(self, device: int, ptr: int) -> None:
        self._check(self._dll.gj_ar_free(device, ptr), "gj_ar_free")

    def create(self, rank: int, world: int, device: int, signal_handles: Sequence[bytes], signal: int,
               signal_bytes: int, staging_handles: Sequence[bytes], staging: int, staging_bytes: int,
               slots: int, max_blocks: int, timeout_s: float) -> int:
        ctx = ctypes.c_void_p()
        rc = self._dll.gj_ar_create(rank, world, device, b"".join(signal_handles), signal, signal_bytes,
                                    b"".join(staging_handles), staging, staging_bytes, slots, max_blocks,
                                    float(timeout_s), ctypes.byref(ctx))
        self._check(rc, "gj_ar_create")
        return int(ctx.value or 0)

    def create_local(self, rank: int, world: int, device: int, signals: Sequence[int], stagings: Sequence[int],
                     signal_bytes: int, staging_bytes: int, slots: int, max_blocks: int, timeout_s: float) -> int:
        """A context for rank ``rank`` of a world whose ranks all live in this process.

        ``signals`` / ``stagings``: every rank's buffers from :meth:`alloc` (``world`` device
        pointers each).  Every rank's kernel of one call must be resident at once (they wait for
        each other): with all ranks on one GPU keep ``world * max_blocks`` below its SM count, and
        launch every rank's call before any other kernel (lazy module loading may otherwise wait
        for a running all-reduce that waits for a rank not launched yet).
        """
        if len(signals) != world or len(stagings) != world:
            raise CollectiveError(f"create_local: {len(signals)} signal and {len(stagings)} staging buffers for a "
                                  f"world of {world} [{STATUS_NAMES[ERR_ARGUMENT]}]", code=ERR_ARGUMENT)
        sig = (ctypes.c_void_p * world)(*signals)
        stg = (ctypes.c_void_p * world)(*stagings)
        ctx = ctypes.c_void_p()
        rc = self._dll.gj_ar_create_local(rank, world, device, sig, stg, signal_bytes, staging_bytes, slots,
                                          max_blocks, float(timeout_s), ctypes.byref(ctx))
        self._check(rc, "gj_ar_create_local")
        return int(ctx.value or 0)

    def destroy(self, ctx: int) -> None:
        self._check(self._dll.gj_ar_destroy(ctx), "gj_ar_destroy")

    # -- the all-reduce --------------------------------------------------------------------------
    def all_reduce(self, ctx: int, src: int, dst: int, numel: int, dtype: int, algo: int, stream: int) -> None:
        rc = self._all_reduce(ctx, src, dst, numel, dtype, algo, stream or None)
        if rc != 0:
            self._check(rc, "custom all-reduce")

    # -- captured buffers ------------------------------------------------------------------------
    def pending(self, ctx: int) -> int:
        out = ctypes.c_int()
        self._check(self._dll.gj_ar_pending(ctx, ctypes.byref(out)), "gj_ar_pending")
        return int(out.value)

    def slots(self, ctx: int) -> tuple[int, int]:
        used, capacity = ctypes.c_int(), ctypes.c_int()
        self._check(self._dll.gj_ar_slots(ctx, ctypes.byref(used), ctypes.byref(capacity)), "gj_ar_slots")
        return int(used.value), int(capacity.value)

    def drop_pending(self, ctx: int, count: int) -> None:
        self._check(self._dll.gj_ar_drop_pending(ctx, count), "gj_ar_drop_pending")

    def pending_handles(self, ctx: int, count: int) -> tuple[list[bytes], list[int]]:
        handles = ctypes.create_string_buffer(HANDLE_BYTES * max(count, 1))
        offsets = (ctypes.c_longlong * max(count, 1))()
        self._check(self._dll.gj_ar_pending_handles(ctx, count, handles, offsets), "registering captured all-reduces")
        raw = handles.raw
        chunks = [raw[i * HANDLE_BYTES:(i + 1) * HANDLE_BYTES] for i in range(count)]
        return chunks, [int(offsets[i]) for i in range(count)]

    def register_pending(self, ctx: int, count: int, handles: Sequence[Sequence[bytes]],
                         offsets: Sequence[Sequence[int]], stream: int) -> None:
        """``handles[r][i]`` / ``offsets[r][i]``: rank r's i-th pending buffer."""
        flat_handles = b"".join(h for per_rank in handles for h in per_rank)
        flat = [o for per_rank in offsets for o in per_rank]
        arr = (ctypes.c_longlong * max(len(flat), 1))(*flat)
        self._check(self._dll.gj_ar_register_pending(ctx, count, flat_handles, arr, stream or None),
                    "registering captured all-reduces")

    def register_local(self, ctx: int, ptrs: Sequence[Sequence[int]], stream: int) -> None:
        """``ptrs[r][i]``: rank r's i-th captured input, one row per rank (contexts of :meth:`create_local`)."""
        rows = [list(per_rank) for per_rank in ptrs]
        count = len(rows[0]) if rows else 0
        if not rows or any(len(r) != count for r in rows):
            raise CollectiveError(f"register_local: rows of {[len(r) for r in rows]} pointers; expected one row per "
                                  f"rank, all of the same length [{STATUS_NAMES[ERR_ARGUMENT]}]", code=ERR_ARGUMENT)
        flat = [p for per_rank in rows for p in per_rank]
        arr = (ctypes.c_void_p * max(len(flat), 1))(*flat)
        self._check(self._dll.gj_ar_register_local(ctx, len(rows), count, arr, stream or None),
                    "registering captured all-reduces (local world)")

    def reset(self, ctx: int) -> None:
        self._check(self._dll.gj_ar_reset(ctx), "gj_ar_reset")

    def probe_write(self, ctx: int, token: int, stream: int) -> None:
        self._check(self._dll.gj_ar_probe_write(ctx, token & 0xFFFFFFFF, stream or None), "P2P probe (write)")

    def probe_check(self, ctx: int, token: int, stream: int) -> int:
        mask = ctypes.c_int()
        self._check(self._dll.gj_ar_probe_check(ctx, token & 0xFFFFFFFF, stream or None, ctypes.byref(mask)),
                    "P2P probe (read)")
        return int(mask.value)


_loaded: dict[Path, Library] = {}
_load_lock = threading.Lock()


def load(arch: Any, *, cache: str | os.PathLike[str] | None = None, build_if_missing: bool = True,
         nvcc: str | None = None) -> Library:
    """The library for ``arch``: from the cache, built first if missing (and allowed)."""
    path = library_path(arch, cache)
    with _load_lock:
        lib = _loaded.get(path)
        if lib is not None:
            return lib
        if not path.is_file():
            if not build_if_missing:
                raise BuildError(f"{path} is not built (run `python -m graphjit build --arch {normalize_arch(arch)}`)")
            path = build(arch, cache=cache, nvcc=nvcc)
        lib = Library(path)
        _loaded[path] = lib
        return lib
