"""The toolchain rows of the custom all-reduce: ``nvcc`` (where it is, its version against the driver's) and
``csrc build`` (compile-or-load :mod:`graphjit.collectives`' library for this machine's GPUs in
``GRAPHJIT_CACHE_DIR``; without a GPU, a skip, or with ``--collectives`` a test build for sm_90 in a
temporary directory).  Failures here block the exit status only with ``--collectives``."""

from __future__ import annotations

import contextlib
import re
import tempfile
import time
from typing import Any

from .children import run_command
from .context import Context
from .report import FAIL, PASS, SKIP
from .text import first_line


def find_nvcc() -> tuple[str | None, str, str | None]:
    """(path, where it came from, problem): GRAPHJIT_NVCC, then PATH, then $CUDA_HOME/bin/nvcc, then
    /usr/local/cuda/bin/nvcc (the order of :func:`graphjit.collectives.csrc_build.find_nvcc`)."""
    from .. import env
    from ..collectives import csrc_build
    from ..errors import ConfigError

    try:
        configured = env.settings().nvcc
    except ConfigError:  # another variable is malformed (its own row says so)
        configured = None
    path, where, _tried = csrc_build.locate_nvcc(setting=configured)
    if path is None and configured:
        return None, where, f"GRAPHJIT_NVCC={configured!r} is not an executable"
    return path, where, None


NVCC_FIX = ("install the CUDA toolkit (nvcc) or set GRAPHJIT_NVCC / CUDA_HOME; or run `python -m graphjit build "
            "--arch {arch}` where nvcc exists and share GRAPHJIT_CACHE_DIR")


def check_nvcc(ctx: Context) -> None:
    """The ``nvcc`` row: where it is and its CUDA version (a failure when it is newer than the driver's); sets
    ``ctx.nvcc`` and ``ctx.nvcc_version`` when it runs."""
    r = ctx.report
    blocking = ctx.collectives
    needed = "builds csrc (the custom all-reduce) once per GPU architecture"
    path, source, problem = find_nvcc()
    if problem:
        r.add("collectives", "nvcc", FAIL, problem, "point GRAPHJIT_NVCC at nvcc (e.g. /usr/local/cuda/bin/nvcc) "
              "or unset it", blocking=blocking)
        return
    if path is None:
        r.add("collectives", "nvcc", SKIP, f"not found (GRAPHJIT_NVCC, PATH, CUDA_HOME, /usr/local/cuda); {needed}: "
              "without it only libraries built ahead of time (python -m graphjit build) load",
              "install the CUDA toolkit, or set GRAPHJIT_NVCC / CUDA_HOME", path=None)
        return
    proc = run_command([path, "--version"], timeout=30)
    m = re.search(r"release (\d+)\.(\d+), V([\w.]+)", proc.stdout if proc else "")
    if not m:
        r.add("collectives", "nvcc", FAIL, f"{path} (from {source}) did not report a version",
              "check the CUDA toolkit installation (nvcc --version must work)", blocking=blocking, path=path)
        return
    version = (int(m.group(1)), int(m.group(2)))
    ctx.nvcc, ctx.nvcc_version = path, version
    drv = ctx.cuda_driver().version() if (ctx.smi or ctx.gpus) else None
    text = f"CUDA {version[0]}.{version[1]} (V{m.group(3)}) at {path} (from {source}); {needed}"
    data: dict[str, Any] = {"path": path, "source": source, "version": f"{version[0]}.{version[1]}", "full": m.group(3)}
    if drv and version[0] > drv[0]:
        r.add("collectives", "nvcc", FAIL, text + f"; newer than the driver's CUDA {drv[0]}.{drv[1]}: "
              "what it builds would not load", "use an nvcc that matches the driver (GRAPHJIT_NVCC) or update "
              "the driver", blocking=blocking, **data)
    else:
        r.add("collectives", "nvcc", PASS, text, **data)


def _gpu_archs(ctx: Context) -> list[str]:
    """The architectures (sm_XX) of this machine's GPUs: a framework's view, else nvidia-smi's."""
    from ..collectives import csrc_build

    caps = [d.get("capability") for devices in ctx.gpus.values() for d in devices]
    if not caps and ctx.smi:
        caps = [g.get("capability") for g in ctx.smi.get("gpus") or []]
    archs: list[str] = []
    for cap in caps:
        with contextlib.suppress(Exception):
            arch = csrc_build.normalize_arch(cap)
            if arch not in archs:
                archs.append(arch)
    return archs


def _cached_archs(sources: dict[str, bytes]) -> list[str]:
    """Architectures with a library for the current sources in GRAPHJIT_CACHE_DIR (nothing is built)."""
    from ..collectives import csrc_build

    found: list[str] = []
    with contextlib.suppress(Exception):
        for path in sorted(csrc_build.cache_dir().glob(f"{csrc_build.LIBRARY_PREFIX}-sm_*-*.so")):
            arch = path.name.split("-")[1]
            if arch not in found and csrc_build.library_path(arch, sources=sources) == path:
                found.append(arch)
    return found


def _build_fix(message: str, arch: str) -> str:
    """The fix for a build or load failure of csrc for ``arch``, from the error message."""
    if "nvcc was not found" in message:
        return NVCC_FIX.format(arch=arch)
    if "cache directory" in message or "lock" in message:
        return "set GRAPHJIT_CACHE_DIR to a writable directory (or wait for the other build to finish)"
    if "nvcc failed" in message or "did not finish" in message or "cannot run nvcc" in message:
        return (f"use a CUDA toolkit whose nvcc supports {arch} (GRAPHJIT_NVCC), then `python -m graphjit build "
                f"--arch {arch} --force`")
    if "sources" in message:
        return "reinstall graphjit (its wheel carries graphjit/csrc) or install it from a source checkout"
    return f"delete the cached library and rebuild it: `python -m graphjit build --arch {arch} --force`"


def _build_error_row(ctx: Context, exc: BaseException, arch: str, what: str, **data: Any) -> None:
    """Add the failed ``csrc build`` row for ``exc`` (first line as the result, the last lines under it) and set
    ``ctx.csrc_fix``."""
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    first = lines[0] if lines else type(exc).__name__
    ctx.csrc_fix = _build_fix(str(exc), arch)
    ctx.report.add("collectives", "csrc build", FAIL, f"{what}: {first}"[:400], ctx.csrc_fix,
                   blocking=ctx.collectives, lines=[line[:200] for line in lines[1:][-6:]], error=str(exc)[-4000:],
                   **data)


def check_csrc(ctx: Context) -> None:
    """Compile-or-load the library for this machine's GPUs; without a GPU, say so (and, with --collectives,
    compile it once into a temporary directory: a toolchain check)."""
    r = ctx.report
    ctx.csrc = FAIL
    from ..collectives import csrc_build, library

    folder = csrc_build.csrc_dir()
    if folder is None:
        ctx.csrc_fix = _build_fix("sources", "sm_90")
        r.add("collectives", "csrc build", FAIL, "the CUDA sources (csrc/graphjit_ar.cu, csrc/custom_all_reduce.cuh) "
              "are not next to the graphjit package", ctx.csrc_fix, blocking=ctx.collectives)
        return
    sources = csrc_build.read_sources(folder)
    cached = _cached_archs(sources)
    archs = _gpu_archs(ctx)
    facts: dict[str, Any] = {"sources": str(folder), "cached": cached, "nvcc": ctx.nvcc}
    with contextlib.suppress(Exception):
        facts["cache_dir"] = str(csrc_build.cache_dir())
    where = f"GRAPHJIT_CACHE_DIR={facts.get('cache_dir', '?')}"
    if not archs and ctx.system_gpus():
        ctx.csrc = SKIP
        r.add("collectives", "csrc build", SKIP, f"nvidia-smi lists {ctx.system_gpus()} GPU(s) but not their compute "
              "capability, and no framework sees them: the build needs a target architecture",
              "build for your GPUs explicitly: python -m graphjit build --arch sm_80 (or sm_90, ...)", **facts)
        return
    if not archs:
        _csrc_without_gpu(ctx, cached, where, facts)
        return
    built: list[str] = []
    t_all = time.perf_counter()
    lib = None
    for arch in archs:
        existed = False
        try:
            existed = csrc_build.library_path(arch, sources=sources).is_file()
            t0 = time.perf_counter()
            ctx.say(f"csrc build for {arch} (compiles on first use, about 10 s)")
            path = csrc_build.build(arch, nvcc=ctx.nvcc, timeout=ctx.timeout, lock_timeout=ctx.timeout)
            lib = library.Library(path)
        except Exception as exc:
            _build_error_row(ctx, exc, arch, f"{arch}: " + ("loading the cached library failed" if existed
                                                            else "building failed"), **facts)
            return
        built.append(f"{arch} {'cached' if existed else f'built in {time.perf_counter() - t0:.1f} s'} ({path.name})")
    facts["libraries"] = built
    assert lib is not None  # archs is not empty, and each pass of the loop set lib or returned
    try:
        pci, major, minor = lib.device_info(0)
    except Exception as exc:
        ctx.csrc_fix = ("update the NVIDIA driver to one that supports the CUDA version of nvcc, or set GRAPHJIT_NVCC "
                        f"to an nvcc that matches the driver and rerun `python -m graphjit build --arch {archs[0]} "
                        "--force`")
        r.add("collectives", "csrc build", FAIL, f"{', '.join(built)}; but the library cannot query GPU 0: "
              f"{first_line(exc)}", ctx.csrc_fix, blocking=ctx.collectives, **facts)
        return
    ctx.csrc = PASS
    r.add("collectives", "csrc build", PASS, f"{', '.join(built)} in {where}; loaded, GPU 0 is sm_{major}{minor} at "
          f"{pci}", seconds=time.perf_counter() - t_all, **facts)


def _csrc_without_gpu(ctx: Context, cached: list[str], where: str, facts: dict[str, Any]) -> None:
    """The ``csrc build`` row without a GPU: a skip; with ``--collectives`` a test build for sm_90 (sm_80 before
    CUDA 11.8) in a temporary directory, or, without nvcc, a load of the libraries built ahead of time."""
    r = ctx.report
    from ..collectives import csrc_build, library

    have = f"; libraries built ahead of time for these sources: {', '.join(cached)}" if cached else ""
    if not ctx.collectives:
        ctx.csrc = SKIP
        r.add("collectives", "csrc build", SKIP, f"no GPU: the build needs a target architecture, nothing compiled "
              f"(sources at {facts['sources']}){have}", "`python -m graphjit build --arch sm_90` compiles it ahead of "
              "time without a GPU; `python -m graphjit doctor --collectives` test-compiles it", **facts)
        return
    if ctx.nvcc is None:
        if cached:  # a library built ahead of time: check that it loads (nothing to compile it with here)
            try:
                for arch in cached:
                    library.Library(csrc_build.library_path(arch))
            except Exception as exc:
                _build_error_row(ctx, exc, arch, f"{arch}: loading the cached library failed", **facts)
                return
            ctx.csrc = PASS
            r.add("collectives", "csrc build", PASS, f"no GPU and no nvcc here; the libraries built ahead of time "
                  f"({', '.join(cached)}, {where}) load", **facts)
            return
        ctx.csrc_fix = NVCC_FIX.format(arch="sm_90")
        r.add("collectives", "csrc build", FAIL, "no nvcc and no library built ahead of time: csrc cannot be built "
              "here", ctx.csrc_fix, blocking=True, **facts)
        return
    arch = "sm_90" if (ctx.nvcc_version or (0, 0)) >= (11, 8) else "sm_80"
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="graphjit-doctor-csrc-") as tmp:
        try:
            ctx.say(f"a test build of csrc for {arch} (a few seconds)")
            path = csrc_build.build(arch, cache=tmp, nvcc=ctx.nvcc, timeout=ctx.timeout, lock_timeout=ctx.timeout)
            abi = library.Library(path)._dll.gj_ar_abi_version()
        except Exception as exc:
            _build_error_row(ctx, exc, arch, f"test build for {arch} failed", **facts)
            return
    ctx.csrc = PASS
    facts.update(test_arch=arch, seconds=time.perf_counter() - t0)
    r.add("collectives", "csrc build", PASS, f"no GPU: compiled csrc for {arch} as a toolchain check in "
          f"{facts['seconds']:.1f} s (temporary directory, deleted) and loaded it (ABI {abi}){have}", **facts)
