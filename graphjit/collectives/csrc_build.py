"""Build ``csrc/`` with nvcc into the cache directory.

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

The library is loaded with ctypes by :mod:`graphjit.collectives.library`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import re
import shlex
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .. import env
from ..errors import GraphjitError

log = logging.getLogger("graphjit")

ABI_VERSION = 4
SOURCES = ("batch_copy.cuh", "custom_all_reduce.cuh", "graphjit_ar.cu")
MAIN_SOURCE = "graphjit_ar.cu"
LIBRARY_PREFIX = "graphjit_ar"


class BuildError(GraphjitError, RuntimeError):
    """csrc could not be built or loaded (no nvcc, a compile error, a broken cached library)."""


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
        raise BuildError("the CUDA sources (" + ", ".join(f"graphjit/csrc/{n}" for n in SOURCES) + ") are "
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
def locate_nvcc(explicit: str | None = None,
                setting: str | None = None) -> tuple[str | None, str, list[str]]:
    """``(path, where it came from, the places looked at)`` of the nvcc to use, in this order: ``explicit``,
    ``setting`` (``GRAPHJIT_NVCC``), nvcc on PATH, ``$CUDA_HOME/bin/nvcc``, ``$CUDA_PATH/bin/nvcc``,
    ``/usr/local/cuda/bin/nvcc``.  An explicit or configured nvcc that is not an executable gives ``path`` None
    (the search stops there: the user asked for that one)."""
    tried: list[str] = []
    given = explicit or setting
    if given:
        tried.append(given if explicit else f"GRAPHJIT_NVCC={given}")
        path = shutil.which(given) or (given if os.access(given, os.X_OK) else None)
        return path, "argument" if explicit else "GRAPHJIT_NVCC", tried
    found = shutil.which("nvcc")
    tried.append("nvcc on PATH")
    if found:
        return found, "PATH", tried
    for var, root in (("CUDA_HOME", os.environ.get("CUDA_HOME")), ("CUDA_PATH", os.environ.get("CUDA_PATH")),
                      ("/usr/local/cuda", "/usr/local/cuda")):
        if root:
            candidate = os.path.join(root, "bin", "nvcc")
            tried.append(candidate)
            if os.access(candidate, os.X_OK):
                return candidate, var, tried
    return None, "", tried


def find_nvcc(explicit: str | None = None) -> tuple[str | None, list[str]]:
    """The nvcc to use and the places looked at (for the error message): :func:`locate_nvcc` with
    ``GRAPHJIT_NVCC``."""
    path, _where, tried = locate_nvcc(explicit, None if explicit else env.settings().nvcc)
    return path, tried


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
        # Only a holder of this lock writes a temporary file of this target: any one there now was left by a build
        # that did not finish (a process that exited while a background build ran, a killed one).
        for stale in target.parent.glob(f".{target.name}.*.tmp"):
            with contextlib.suppress(OSError):
                stale.unlink()
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
