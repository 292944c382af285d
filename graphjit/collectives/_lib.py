"""Build ``csrc/`` with nvcc into the cache directory, and load it with ctypes.

* **Where**: ``GRAPHJIT_CACHE_DIR`` (default ``~/.cache/graphjit``), one shared library per GPU
  architecture: ``graphjit_ar-sm_90-<key>.so``.  ``key`` is the sha256 of the ABI version, the
  architecture, the nvcc flags and the bytes of every source file, so an edited source or another
  architecture builds a new library and never loads a stale one.  nvcc's version is not part of
  the key: a library built ahead of time (``python -m graphjit build``) loads on machines without
  nvcc.
* **Concurrency**: all ranks of a job start at once and find the library missing together.  The
  build runs under an exclusive ``fcntl`` lock on ``<library>.lock``; whoever gets the lock second
  finds the library built and loads it.  nvcc writes to a temporary name and the result is renamed
  into place, so a reader never sees half a library.
* **nvcc**: ``GRAPHJIT_NVCC``, else ``nvcc`` on ``PATH``, else ``$CUDA_HOME/bin/nvcc``, else
  ``/usr/local/cuda/bin/nvcc``.  None found: :class:`BuildError` with that list; callers turn it
  into a fallback reason (the framework's collective runs).
* **Errors**: the C API returns status codes and keeps a thread-local message;
  :class:`CollectiveError` carries both.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import hashlib
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .. import env
from ..errors import GraphjitError

log = logging.getLogger("graphjit")

ABI_VERSION = 2
SOURCES = ("custom_all_reduce.cuh", "graphjit_ar.cu")
MAIN_SOURCE = "graphjit_ar.cu"
LIBRARY_PREFIX = "graphjit_ar"
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


class BuildError(GraphjitError, RuntimeError):
    """csrc could not be built or loaded (no nvcc, a compile error, a broken cached library)."""


class CollectiveError(GraphjitError, RuntimeError):
    """A call into the custom all-reduce library failed; ``code`` is its status code."""

    def __init__(self, message: str, code: int = ERR_CUDA) -> None:
        super().__init__(message)
        self.code = code


# -- architectures, sources, keys -------------------------------------------------------------
def normalize_arch(arch: Any) -> str:
    """``"sm_90"`` from ``"sm_90"``, ``"90"``, ``"9.0"``, ``"compute_90"``, ``(9, 0)`` or ``90``."""
    text = arch
    if isinstance(arch, tuple) and len(arch) == 2:
        text = f"{arch[0]}{arch[1]}"
    text = str(text).strip().lower()
    m = re.fullmatch(r"(?:sm_|compute_)?(\d+)(?:\.(\d))?([a-z]?)", text)
    if m is None:
        raise BuildError(f"architecture {arch!r}: expected e.g. sm_80, sm_90, 90 or 9.0")
    number = int(m.group(1) + (m.group(2) or ""))
    if number < 70:
        raise BuildError(f"architecture {arch!r}: the custom all-reduce needs sm_70 or newer")
    return f"sm_{number}{m.group(3)}"


def nvcc_flags(arch: str) -> list[str]:
    """The flags of a build for ``arch`` (part of the cache key)."""
    digits = arch.split("_", 1)[1]
    return ["-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", "-Xcompiler", "-fvisibility=hidden",
            "-lineinfo", f"-gencode=arch=compute_{digits},code=[sm_{digits},compute_{digits}]"]


def csrc_dir() -> Path | None:
    """The CUDA sources: ``csrc/`` beside the package (source checkouts) or ``graphjit/csrc`` (wheels)."""
    here = Path(__file__).resolve().parent
    for candidate in (here.parents[1] / "csrc", here.parent / "csrc"):
        if all((candidate / name).is_file() for name in SOURCES):
            return candidate
    return None


def read_sources(folder: Path | None = None) -> dict[str, bytes]:
    folder = folder if folder is not None else csrc_dir()
    if folder is None:
        raise BuildError("the CUDA sources (graphjit/csrc/custom_all_reduce.cuh, graphjit/csrc/graphjit_ar.cu) are "
                         "missing from this graphjit installation; reinstall graphjit (wheels and source checkouts "
                         "carry them), or run `python -m graphjit build` where they exist and share "
                         "GRAPHJIT_CACHE_DIR")
    return {name: (folder / name).read_bytes() for name in SOURCES}


def cache_key(sources: Mapping[str, bytes], arch: str, flags: Sequence[str] | None = None) -> str:
    """sha256 over the ABI version, the architecture, the flags and every source (name and bytes)."""
    arch = normalize_arch(arch)
    h = hashlib.sha256()
    h.update(f"graphjit-ar abi={ABI_VERSION} arch={arch}\n".encode())
    h.update(("\0".join(flags if flags is not None else nvcc_flags(arch)) + "\n").encode())
    for name in sorted(sources):
        h.update(f"{name}\0{len(sources[name])}\0".encode())
        h.update(sources[name])
    return h.hexdigest()


def cache_dir(override: str | os.PathLike[str] | None = None) -> Path:
    return Path(override).expanduser() if override is not None else env.settings().cache_dir


def library_path(arch: Any, cache: str | os.PathLike[str] | None = None,
                 sources: Mapping[str, bytes] | None = None) -> Path:
    """Where the library for ``arch`` and the current sources is (or will be) cached."""
    arch = normalize_arch(arch)
    key = cache_key(sources if sources is not None else read_sources(), arch)
    return cache_dir(cache) / f"{LIBRARY_PREFIX}-{arch}-{key[:16]}.so"


# -- nvcc ------------------------------------------------------------------------------------
def find_nvcc(explicit: str | None = None) -> tuple[str | None, list[str]]:
    """The nvcc to use and the places looked at (for the error message)."""
    tried: list[str] = []
    setting = explicit or env.settings().nvcc
    if setting:
        tried.append(f"GRAPHJIT_NVCC={setting}" if not explicit else setting)
        path = shutil.which(setting) or (setting if os.access(setting, os.X_OK) else None)
        return path, tried
    found = shutil.which("nvcc")
    tried.append("nvcc on PATH")
    if found:
        return found, tried
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root:
            candidate = os.path.join(root, "bin", "nvcc")
            tried.append(candidate)
            if os.access(candidate, os.X_OK):
                return candidate, tried
    return None, tried


_versions: dict[str, str] = {}


def nvcc_version(nvcc: str) -> str:
    if nvcc not in _versions:
        try:
            out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
        except (OSError, subprocess.SubprocessError) as exc:
            out = f"unknown ({exc})"
        lines = [ln for ln in out.strip().splitlines() if ln.strip()]
        _versions[nvcc] = lines[-1] if lines else "unknown"
    return _versions[nvcc]


# -- the lock -------------------------------------------------------------------------------
class FileLock:
    """An exclusive ``fcntl.flock`` on ``path`` (created if needed), polled until ``timeout``.

    The kernel drops the lock when its holder exits, so a crashed build never blocks the next one.
    """

    def __init__(self, path: str | os.PathLike[str], timeout: float = 900.0, poll: float = 0.05) -> None:
        self.path = Path(path)
        self.timeout = timeout
        self.poll = poll
        self._fd: int | None = None

    def __enter__(self) -> FileLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + self.timeout
        said = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    os.close(fd)
                    raise BuildError(f"cannot lock {self.path}: {exc}") from exc
            if time.monotonic() > deadline:
                os.close(fd)
                raise BuildError(f"waited {self.timeout:.0f} s for the lock {self.path}: another process is still "
                                 "building the custom all-reduce library (or hangs); try again, or build ahead of time "
                                 "with `python -m graphjit build`")
            if not said:
                log.info("graphjit: waiting for another process to finish building (%s)", self.path)
                said = True
            time.sleep(self.poll)
        self._fd = fd
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        return self

    def __exit__(self, *exc: object) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


# -- build -----------------------------------------------------------------------------------
def build(arch: Any, *, cache: str | os.PathLike[str] | None = None, nvcc: str | None = None, force: bool = False,
          timeout: float = 900.0, lock_timeout: float = 900.0, extra_flags: Sequence[str] = ()) -> Path:
    """Compile csrc for ``arch`` into the cache (unless it is there already) and return the path."""
    arch = normalize_arch(arch)
    folder = csrc_dir()
    sources = read_sources(folder)
    assert folder is not None
    target = library_path(arch, cache, sources)
    if target.is_file() and not force:
        return target
    compiler, tried = find_nvcc(nvcc)
    if compiler is None:
        raise BuildError("nvcc was not found (looked at " + ", ".join(tried) + "); set GRAPHJIT_NVCC or CUDA_HOME, or "
                         "build ahead of time with `python -m graphjit build --arch ...` on a machine with the CUDA "
                         "toolkit and share GRAPHJIT_CACHE_DIR")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BuildError(f"cannot create the cache directory {target.parent}: {exc} (set GRAPHJIT_CACHE_DIR)") from exc
    with FileLock(target.with_name(target.name + ".lock"), timeout=lock_timeout):
        if target.is_file() and not force:
            return target  # another process built it while we waited
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        cmd = [compiler, *nvcc_flags(arch), *extra_flags, "-I", str(folder), "-o", str(tmp),
               str(folder / MAIN_SOURCE), "-ldl"]
        log.info("graphjit: building the custom all-reduce for %s: %s", arch, shlex.join(cmd))
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise BuildError(f"nvcc did not finish in {timeout:.0f} s: $ {shlex.join(cmd)}") from exc
        except OSError as exc:
            raise BuildError(f"cannot run nvcc ({compiler}): {exc}") from exc
        if proc.returncode != 0 or not tmp.is_file():
            with contextlib.suppress(OSError):
                tmp.unlink()
            output = (proc.stderr or "") + (proc.stdout or "")
            tail = "\n".join(output.strip().splitlines()[-25:])
            raise BuildError(f"nvcc failed (exit status {proc.returncode}) building the custom all-reduce for {arch}:\n"
                             f"$ {shlex.join(cmd)}\n{tail}")
        os.replace(tmp, target)
        with contextlib.suppress(OSError):
            target.with_suffix(".txt").write_text(
                f"built {time.strftime('%Y-%m-%d %H:%M:%S')} in {time.perf_counter() - t0:.1f} s by "
                f"{nvcc_version(compiler)}\n$ {shlex.join(cmd)}\n")
    return target


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


# -- `python -m graphjit build` -------------------------------------------------------------------
def detect_archs() -> list[str]:
    """Architectures of the GPUs of this machine (nvidia-smi), or [] when none are found."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        out = subprocess.run([smi, "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    archs: list[str] = []
    for line in out.split():
        with contextlib.suppress(BuildError):
            a = normalize_arch(line)
            if a not in archs:
                archs.append(a)
    return archs


def add_build_arguments(p: Any) -> None:
    p.add_argument("--arch", default=None,
                   help="comma-separated GPU architectures, e.g. sm_80,sm_90 (default: the GPUs of this machine)")
    p.add_argument("--cache-dir", default=None, help="where to put the libraries (default: GRAPHJIT_CACHE_DIR)")
    p.add_argument("--nvcc", default=None, help="the nvcc to use (default: GRAPHJIT_NVCC, PATH, CUDA_HOME)")
    p.add_argument("--force", action="store_true", help="rebuild even if the cached library exists")


def run_build(args: Any) -> int:
    """The ``build`` command: compile csrc for each architecture; prints one line per library."""
    try:
        archs = [normalize_arch(a) for a in args.arch.split(",") if a.strip()] if args.arch else detect_archs()
        if not archs:
            raise BuildError("no GPU found on this machine (nvidia-smi); pass --arch, e.g. --arch sm_80,sm_90")
        for arch in archs:
            t0 = time.perf_counter()
            existed = (not args.force) and library_path(arch, args.cache_dir).is_file()
            if not existed:
                sys.stderr.write(f"graphjit build: compiling csrc for {arch} with nvcc (about 10 s) ...\n")
                sys.stderr.flush()
            path = build(arch, cache=args.cache_dir, nvcc=args.nvcc, force=args.force)
            state = "cached" if existed else f"built in {time.perf_counter() - t0:.1f} s"
            sys.stdout.write(f"{arch}: {path} ({state})\n")
            sys.stdout.flush()
    except BuildError as exc:
        sys.stdout.write(f"graphjit build: {exc}\n")
        sys.stdout.flush()
        return 1
    return 0
