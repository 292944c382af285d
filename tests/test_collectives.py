"""The custom all-reduce without a GPU: csrc compiles, the build cache and its lock, the C API's
errors, the eligibility table, the Python protocol (two simulated ranks), and the swap passing calls
through unchanged in real 2-process gloo groups (torch, and Paddle with SOT).

This file is also the worker of its multi-process tests: ``python tests/test_collectives.py MODE
RANK PORT OUT`` (see ``_worker``).
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import importlib.util
import inspect
import itertools
import json
import os
import socket
import stat
import subprocess
import sys
import textwrap
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from graphjit import env, scope  # noqa: E402
from graphjit.backends.dist_base import Call, DistBackend, TensorInfo, from_compiled_graph  # noqa: E402
from graphjit.collectives import communicator, csrc_build, custom_ar, library, topology  # noqa: E402
from graphjit.collectives.csrc_build import BuildError  # noqa: E402
from graphjit.collectives.library import CollectiveError  # noqa: E402
from graphjit.errors import CaptureError, ConfigError  # noqa: E402

HAS_TORCH = importlib.util.find_spec("torch") is not None
HAS_PADDLE = importlib.util.find_spec("paddle") is not None
NVCC = csrc_build.find_nvcc()[0]
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc is not installed (set GRAPHJIT_NVCC or CUDA_HOME)")


# ================================================================================================
# csrc compiles (compile only: no GPU here), once per architecture, in parallel
# ================================================================================================
@pytest.fixture(scope="session")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """nvcc -c of csrc for sm_80 and sm_90, plus the real build path (a shared library for sm_80)."""
    if NVCC is None:
        pytest.skip("nvcc is not installed (set GRAPHJIT_NVCC or CUDA_HOME)")
    out = tmp_path_factory.mktemp("csrc")
    folder = csrc_build.csrc_dir()
    assert folder is not None, "csrc/ not found next to the graphjit package"

    def compile_only(arch: str) -> subprocess.CompletedProcess[str]:
        digits = arch.split("_")[1]
        cmd = [NVCC, "-c", "-O3", "-std=c++17", "-Werror", "all-warnings", "-Xcompiler", "-Wall",
               f"-gencode=arch=compute_{digits},code=sm_{digits}", "-I", str(folder), str(folder / "graphjit_ar.cu"),
               "-o", str(out / f"graphjit_ar_{arch}.o")]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=300)

    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(3) as pool:
        jobs = {arch: pool.submit(compile_only, arch) for arch in ("sm_80", "sm_90")}
        library = pool.submit(csrc_build.build, "sm_80", cache=out / "cache")
        results = {arch: job.result() for arch, job in jobs.items()}
        path = library.result()
    return {"dir": out, "results": results, "library": path, "seconds": time.perf_counter() - t0}


@needs_nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_csrc_compiles(compiled: dict[str, Any], arch: str) -> None:
    proc = compiled["results"][arch]
    assert proc.returncode == 0, f"nvcc failed for {arch}:\n{proc.stderr}\n{proc.stdout}"
    obj = (compiled["dir"] / f"graphjit_ar_{arch}.o").read_bytes()
    # every kernel instantiation is in the object: 3 dtypes x 4 world sizes x 2 algorithms
    for kernel in (b"one_shot_kernel", b"two_shot_kernel", b"probe_write_kernel", b"probe_read_kernel"):
        assert kernel in obj, f"{kernel!r} missing from the {arch} object"
    assert compiled["seconds"] < 120, f"compiling took {compiled['seconds']:.0f} s"


@needs_nvcc
def test_built_library_exports_the_c_api(compiled: dict[str, Any]) -> None:
    lib = library.Library(compiled["library"])
    assert lib.limits() == {"max_ranks": 8, "max_blocks": 64, "threads": 512,
                            "header_bytes": custom_ar.HEADER_BYTES, "handle_bytes": 64}
    # automatic algorithm: one-shot below 1 MiB for 2 ranks, below 512 KiB for 4, below 256 KiB above
    assert [lib.choose_algo(2, n) for n in (16, (1 << 20) - 16, 1 << 20, 8 << 20)] == [1, 1, 2, 2]
    assert [lib.choose_algo(4, n) for n in ((512 << 10) - 16, 512 << 10)] == [1, 2]
    assert [lib.choose_algo(8, n) for n in ((256 << 10) - 16, 256 << 10)] == [1, 2]


@needs_nvcc
@pytest.mark.parametrize(("call", "code", "words"), [
    (lambda lib: lib.all_reduce(0, 16, 16, 4, 0, 0, 0), library.ERR_ARGUMENT, "null context"),
    (lambda lib: lib.choose_algo(3, 64), library.ERR_UNSUPPORTED, "world size 3"),
    (lambda lib: lib.create(0, 5, 0, [b"h" * 64] * 5, 256, 8192 + 1024, [b"h" * 64] * 5, 512, 1024, 64, 36, 1.0),
     library.ERR_UNSUPPORTED, "world size 5"),
    (lambda lib: lib.create(2, 2, 0, [b"h" * 64] * 2, 256, 8192 + 1024, [b"h" * 64] * 2, 512, 1024, 64, 36, 1.0),
     library.ERR_ARGUMENT, "rank 2"),
    (lambda lib: lib.create(0, 2, 0, [b"h" * 64] * 2, 256, 8192, [b"h" * 64] * 2, 512, 1024, 64, 36, 1.0),
     library.ERR_ARGUMENT, "scratch"),
    (lambda lib: lib.create(0, 2, 0, [b"h" * 64] * 2, 256, 8192 + 1024, [b"h" * 64] * 2, 512, 1000, 64, 36, 1.0),
     library.ERR_ARGUMENT, "staging buffer of 1000 bytes"),
    (lambda lib: lib.create(0, 2, 0, [b"h" * 64] * 2, 256, 8192 + 1024, [b"h" * 64] * 2, 512, 1024, 1, 36, 1.0),
     library.ERR_ARGUMENT, "pointer table capacity 1"),
    (lambda lib: lib.create(0, 2, 0, [b"h" * 64] * 2, 256, 8192 + 1024, [b"h" * 64] * 2, 512, 1024, 64, 65, 1.0),
     library.ERR_ARGUMENT, "max_blocks 65"),
    (lambda lib: lib.alloc(0, 1000), library.ERR_ARGUMENT, "multiple of 16"),
    (lambda lib: lib.alloc(0, 1024), library.ERR_CUDA, "cuda"),  # no GPU/driver here: a CUDA error, with its name
    (lambda lib: lib.drop_pending(0, 1), library.ERR_ARGUMENT, "null context"),
    (lambda lib: lib.reset(0), library.ERR_ARGUMENT, "null context"),
    (lambda lib: lib.create_local(0, 5, 0, [256] * 5, [512] * 5, 8192 + 1024, 1024, 64, 36, 1.0),
     library.ERR_UNSUPPORTED, "world size 5"),
    (lambda lib: lib.create_local(0, 2, 0, [256, 272], [512, 768], 8192 + 1024, 1024, 64, 36, 1.0),
     library.ERR_ARGUMENT, "buffer of rank 1"),
    (lambda lib: lib.create_local(0, 2, 0, [256, 0], [512, 768], 8192 + 1024, 1024, 64, 36, 1.0),
     library.ERR_ARGUMENT, "buffer of rank 1"),
    (lambda lib: lib.create_local(0, 2, 0, [256], [512], 8192 + 1024, 1024, 64, 36, 1.0),
     library.ERR_ARGUMENT, "1 signal and 1 staging buffers for a world of 2"),
    (lambda lib: lib.create_local(0, 2, 0, [256, 512], [768, 1024], 8192 + 1024, 1024, 64, 0, 1.0),
     library.ERR_ARGUMENT, "max_blocks 0"),
    (lambda lib: lib.register_local(0, [[256], [512]], 0), library.ERR_ARGUMENT, "null argument"),
    (lambda lib: lib.register_local(0, [[256, 512], [768]], 0), library.ERR_ARGUMENT, "all of the same length"),
])
def test_c_api_errors_carry_a_code_and_a_message(compiled: dict[str, Any], call: Callable[[Any], Any], code: int,
                                                  words: str) -> None:
    lib = library.Library(compiled["library"])
    with pytest.raises(CollectiveError) as info:
        call(lib)
    assert info.value.code == code, str(info.value)
    assert words.lower() in str(info.value).lower()
    assert f"[{library.STATUS_NAMES[code]}]" in str(info.value)


def test_loading_a_broken_library_says_what_to_do(tmp_path: Path) -> None:
    bad = tmp_path / "graphjit_ar-sm_90-0000.so"
    bad.write_bytes(b"not an ELF file")
    with pytest.raises(BuildError, match="delete it to rebuild"):
        library.Library(bad)


# ================================================================================================
# build cache: key, lock, nvcc discovery, errors, the CLI
# ================================================================================================
def test_cache_key_changes_with_sources_and_arch() -> None:
    sources = csrc_build.read_sources()
    assert set(sources) == set(csrc_build.SOURCES)
    base = csrc_build.cache_key(sources, "sm_90")
    assert base == csrc_build.cache_key(dict(sources), "9.0") == csrc_build.cache_key(sources, (9, 0))
    assert len(base) == 64
    edited = dict(sources)
    edited["custom_all_reduce.cuh"] = sources["custom_all_reduce.cuh"] + b"\n// edited\n"
    assert csrc_build.cache_key(edited, "sm_90") != base
    edited = dict(sources)
    edited["graphjit_ar.cu"] = sources["graphjit_ar.cu"].replace(b"kAbiVersion = 4", b"kAbiVersion = 5")
    assert csrc_build.cache_key(edited, "sm_90") != base
    assert csrc_build.cache_key(sources, "sm_80") != base
    assert csrc_build.cache_key(sources, "sm_90", flags=["-O0"]) != base
    path = csrc_build.library_path("sm_90", "/cache", sources)
    assert path == Path("/cache") / f"graphjit_ar-sm_90-{base[:16]}.so"
    assert csrc_build.library_path("sm_80", "/cache", sources) != path


def test_cache_dir_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GRAPHJIT_CACHE_DIR", str(tmp_path / "c"))
    env.refresh()
    assert csrc_build.library_path("sm_90").parent == tmp_path / "c"


@pytest.mark.parametrize(("given", "want"), [("sm_90", "sm_90"), ("90", "sm_90"), ("9.0", "sm_90"), ((8, 0), "sm_80"),
                                             ("compute_86", "sm_86"), ("sm_90a", "sm_90a"), ("10.0", "sm_100")])
def test_normalize_arch(given: Any, want: str) -> None:
    assert csrc_build.normalize_arch(given) == want


@pytest.mark.parametrize("given", ["sm_61", "hopper", "", "sm_9x"])
def test_normalize_arch_rejects(given: str) -> None:
    with pytest.raises(BuildError, match="architecture"):
        csrc_build.normalize_arch(given)


_LOCK_CHILD = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {root!r})
    from graphjit.collectives.csrc_build import FileLock
    with FileLock({lock!r}, timeout=60):
        start = time.monotonic()
        time.sleep(0.4)
        end = time.monotonic()
    with open({out!r}, "a") as f:
        f.write(f"{{start}} {{end}}\\n")
""")


def test_file_lock_serialises_two_processes(tmp_path: Path) -> None:
    out = tmp_path / "intervals.txt"
    code = _LOCK_CHILD.format(root=str(ROOT), lock=str(tmp_path / "x.lock"), out=str(out))
    procs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(2)]
    for p in procs:
        assert p.wait(timeout=60) == 0
    intervals = sorted(tuple(map(float, line.split())) for line in out.read_text().splitlines())
    assert len(intervals) == 2
    (_s1, e1), (s2, _e2) = intervals
    assert e1 <= s2, f"the two critical sections overlapped: {intervals}"


def test_file_lock_times_out_with_a_clear_message(tmp_path: Path) -> None:
    lock = tmp_path / "y.lock"
    with csrc_build.FileLock(lock), pytest.raises(BuildError, match="waited 0 s for the lock"):
        csrc_build.FileLock(lock, timeout=0.2).__enter__()


def _fake_nvcc(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "fake-nvcc"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


_COUNTING_NVCC = """
if [ "$1" = "--version" ]; then echo "fake nvcc, release 0.0"; exit 0; fi
echo x >> "$(dirname "$0")/invocations"
sleep 1
out=""
while [ $# -gt 0 ]; do if [ "$1" = "-o" ]; then out="$2"; fi; shift; done
printf 'fake library' > "$out"
"""

_BUILD_CHILD = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    from graphjit.collectives import csrc_build, library
    print(csrc_build.build("sm_90", cache={cache!r}, nvcc={nvcc!r}))
""")


def test_concurrent_ranks_build_once(tmp_path: Path) -> None:
    nvcc = _fake_nvcc(tmp_path, _COUNTING_NVCC)
    cache = tmp_path / "cache"
    code = _BUILD_CHILD.format(root=str(ROOT), cache=str(cache), nvcc=str(nvcc))
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert outs[0] == outs[1] and Path(outs[0]).read_bytes() == b"fake library"
    assert (tmp_path / "invocations").read_text().count("x") == 1, "both processes ran nvcc"
    assert not list(cache.glob(".*.tmp")), "a temporary file was left behind"
    # a third build finds it cached and does not call nvcc
    assert csrc_build.build("sm_90", cache=cache, nvcc=str(nvcc)) == Path(outs[0])
    assert (tmp_path / "invocations").read_text().count("x") == 1


def test_a_build_removes_the_temporary_files_of_builds_that_did_not_finish(tmp_path: Path) -> None:
    nvcc = _fake_nvcc(tmp_path, _COUNTING_NVCC)
    cache = tmp_path / "cache"
    target = csrc_build.library_path("sm_90", cache)
    cache.mkdir()
    stale = [target.with_name(f".{target.name}.{pid}.tmp") for pid in (12345, 67890)]
    for path in stale:
        path.write_bytes(b"half a library")  # a process that exited while its background build ran
    other = cache / ".another-library.so.1.tmp"
    other.write_bytes(b"not ours")
    assert csrc_build.build("sm_90", cache=cache, nvcc=str(nvcc)) == target
    assert target.read_bytes() == b"fake library"
    assert not any(path.exists() for path in stale) and other.exists()  # another target's build is not touched


def test_missing_nvcc_is_a_clear_reason(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GRAPHJIT_NVCC", str(tmp_path / "no-such-nvcc"))
    env.refresh()
    with pytest.raises(BuildError) as info:
        csrc_build.build("sm_90", cache=tmp_path)
    text = str(info.value)
    assert "nvcc was not found" in text and "GRAPHJIT_NVCC" in text and "python -m graphjit build" in text


def test_compile_error_shows_the_command_and_nvcc_output(tmp_path: Path) -> None:
    nvcc = _fake_nvcc(tmp_path, 'echo "graphjit_ar.cu(12): error: boom" >&2\nexit 2\n')
    with pytest.raises(BuildError) as info:
        csrc_build.build("sm_80", cache=tmp_path / "cache", nvcc=str(nvcc))
    text = str(info.value)
    assert "nvcc failed (exit status 2)" in text and "boom" in text and "-gencode=arch=compute_80" in text
    assert not list((tmp_path / "cache").glob("*.so"))


def test_cli_build(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from graphjit.__main__ import main

    nvcc = _fake_nvcc(tmp_path, _COUNTING_NVCC.replace("sleep 1", ""))
    args = ["build", "--arch", "sm_80,9.0", "--cache-dir", str(tmp_path / "c"), "--nvcc", str(nvcc)]
    assert main(args) == 0
    got = capsys.readouterr()
    out = got.out
    assert "sm_80:" in out and "sm_90:" in out and "built in" in out
    assert got.err.count("graphjit build: compiling csrc for") == 2  # progress before each compile (stderr)
    assert main(args) == 0
    got = capsys.readouterr()
    assert "(cached)" in got.out and "compiling" not in got.err
    assert main(["build", "--arch", "sm_61", "--cache-dir", str(tmp_path / "c")]) == 1
    assert "sm_70 or newer" in capsys.readouterr().out


# ================================================================================================
# eligibility: every fallback reason
# ================================================================================================
def _info(**over: Any) -> TensorInfo:
    base = {"dtype": "float32", "numel": 1024, "nbytes": 4096, "ptr": 0x7F0000000000, "contiguous": True,
            "device": "cuda:0"}
    base.update(over)
    return TensorInfo(**base)


TENSOR_TABLE = [
    ("eligible float32", _info(), None),
    ("eligible float16", _info(dtype="float16", nbytes=2048), None),
    ("eligible bfloat16 of max_bytes", _info(dtype="bfloat16", numel=4096, nbytes=8192), None),
    ("not a tensor", None, "arguments"),
    ("float64", _info(dtype="float64", nbytes=8192), "dtype"),
    ("int32", _info(dtype="int32"), "dtype"),
    ("on the CPU", _info(device="cpu"), "device"),
    ("on another GPU", _info(device="cuda:1"), "device"),
    ("a transposed view", _info(contiguous=False), "contiguity"),
    ("empty", _info(numel=0, nbytes=0), "empty"),
    ("a view at element 1", _info(ptr=0x7F0000000004), "misaligned"),
    ("6 bytes", _info(dtype="float16", numel=3, nbytes=6), "bytes % 16"),
    ("max_bytes + 16", _info(numel=2052, nbytes=8208), "bytes > max"),
]


@pytest.mark.parametrize(("what", "info", "key"), TENSOR_TABLE, ids=[t[0] for t in TENSOR_TABLE])
def test_eligibility_of_tensors(what: str, info: TensorInfo | None, key: str | None) -> None:
    got = custom_ar.check_tensor(info, device="cuda:0", max_bytes=8192)
    assert (got[0] if got else None) == key, got
    if got:
        assert got[0] in custom_ar.REASONS and got[1]


@pytest.mark.parametrize(("world", "ok"), [(1, False), (2, True), (3, False), (4, True), (5, False), (6, True),
                                           (7, False), (8, True), (16, False)])
def test_eligibility_of_world_sizes(world: int, ok: bool) -> None:
    got = custom_ar.check_world(world)
    assert (got is None) == ok
    if got:
        assert got[0] == "world size" and str(world) in got[1]


PCI4 = ["0000:1a:00.0", "0000:1b:00.0", "0000:3d:00.0", "0000:3e:00.0"]


def _matrix(n: int, value: bool | None, **holes: bool | None) -> list[list[bool | None]]:
    m: list[list[bool | None]] = [[True if i == j else value for j in range(n)] for i in range(n)]
    for name, v in holes.items():
        i, j = int(name[1]), int(name[2])
        m[i][j] = m[j][i] = v
    return m


TOPOLOGY_TABLE = [
    ("2 GPUs, P2P, no NVLink (PCIe pair)", PCI4[:2], _matrix(2, True), _matrix(2, False), None),
    ("2 GPUs, status unknown (the probe decides)", PCI4[:2], _matrix(2, None), _matrix(2, None), None),
    ("2 GPUs, no P2P", PCI4[:2], _matrix(2, False), _matrix(2, False), "topology"),
    ("4 GPUs, NVLink everywhere", PCI4, _matrix(4, True), _matrix(4, True), None),
    ("4 GPUs, one pair without NVLink", PCI4, _matrix(4, True), _matrix(4, True, p13=False), "topology"),
    ("4 GPUs, NVLink unknown (no NVML)", PCI4, _matrix(4, True), _matrix(4, None), "topology"),
    ("4 GPUs, one pair without P2P", PCI4, _matrix(4, True, p02=False), _matrix(4, True), "topology"),
    ("two ranks on one GPU", [PCI4[0], "00000000:1A:00.0"], _matrix(2, True), _matrix(2, True), "topology"),
]


@pytest.mark.parametrize(("what", "pcis", "p2p", "nvlink", "key"), TOPOLOGY_TABLE, ids=[t[0] for t in TOPOLOGY_TABLE])
def test_eligibility_of_topologies(what: str, pcis: list[str], p2p: Any, nvlink: Any, key: str | None) -> None:
    got = topology.verdict(pcis, p2p, nvlink, "NVML is not available (test)")
    assert (got[0] if got else None) == key, got


def test_shared_gpu_is_allowed_only_when_asked() -> None:
    """GRAPHJIT_AR_SHARED_GPU=1 (tests on one GPU): ranks on one GPU need no P2P between them."""
    same = [PCI4[0], "00000000:1A:00.0"]
    refused = topology.verdict(same, _matrix(2, False), _matrix(2, False))
    assert refused is not None and "same GPU" in refused[1] and "GRAPHJIT_AR_SHARED_GPU" in refused[1]
    assert topology.verdict(same, _matrix(2, False), _matrix(2, False), allow_shared=True) is None
    # sharing does not excuse the other pairs: 4 ranks on 2 GPUs without P2P between the GPUs
    four = [PCI4[0], PCI4[0], PCI4[1], PCI4[1]]
    got = topology.verdict(four, _matrix(4, False), _matrix(4, True), allow_shared=True)
    assert got is not None and got[0] == "topology" and "peer-to-peer" in got[1]


def test_cuda_peer_access_fills_unknown_p2p() -> None:
    p2p = _matrix(2, None)
    filled = topology.merge_cuda_peer(p2p, PCI4[:2], lambda a, b: 0)
    assert filled[0][1] is False and topology.verdict(PCI4[:2], filled, _matrix(2, None))[0] == "topology"
    assert topology.merge_cuda_peer(p2p, PCI4[:2], lambda a, b: -1)[0][1] is None


def test_nvml_absent_or_present_never_raises() -> None:
    p2p, nvlink, problem = topology.nvml_matrices(PCI4[:2])
    assert p2p[0][0] is True and nvlink[1][1] is True
    assert problem is None or isinstance(problem, str)


def test_eligibility_of_nodes() -> None:
    assert topology.nodes_verdict(["boot-a", "boot-a"]) is None
    key, detail = topology.nodes_verdict(["boot-a", "boot-b"], ["host-a", "host-b"])
    assert key == "multi-node" and "host-a" in detail and "host-b" in detail


@pytest.mark.parametrize(("variables", "key"), [({}, None), ({"GRAPHJIT_CUSTOM_AR": "0"}, "disabled"),
                                                ({"GRAPHJIT_DISABLE": "1"}, "disabled"),
                                                ({"GRAPHJIT_AR_ALGO": "nccl"}, "nccl"),
                                                ({"GRAPHJIT_AR_ALGO": "2shot"}, None)])
def test_eligibility_of_settings(monkeypatch: pytest.MonkeyPatch, variables: dict[str, str], key: str | None) -> None:
    for k, v in variables.items():
        monkeypatch.setenv(k, v)
    got = custom_ar.check_settings(env.refresh())
    assert (got[0] if got else None) == key


# ================================================================================================
# two simulated ranks (threads) with a fake framework and a fake library: the Python protocol
# ================================================================================================
class FakeWorld:
    """Shared state of the simulated ranks: device memory, IPC handles, probe slots, a barrier."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.barrier = threading.Barrier(n, timeout=20)
        self.box: list[Any] = [None] * n
        self.memory: dict[int, np.ndarray] = {}
        self.handles: dict[bytes, int] = {}
        self.probes: dict[tuple[int, int], int] = {}
        self.drop_probe: set[tuple[int, int]] = set()
        self.vmm: set[int] = set()
        self._ptrs = itertools.count(1 << 20, 1 << 12)
        self.lock = threading.Lock()

    def gather(self, rank: int, obj: Any) -> list[Any]:
        self.box[rank] = obj
        self.barrier.wait()
        out = list(self.box)
        self.barrier.wait()
        return out

    def new(self, array: np.ndarray) -> int:
        with self.lock:
            ptr = next(self._ptrs)
            self.memory[ptr] = array
            return ptr


class FakeTensor:
    def __init__(self, world: FakeWorld, array: np.ndarray, device: str, dtype: str = "float32") -> None:
        self.arr = array
        self.ptr = world.new(array)
        self.device = device
        self.dtype = dtype


class FakeDist(DistBackend):
    name = "fake"

    def __init__(self, world: FakeWorld, rank: int) -> None:
        self.world, self.r = world, rank
        self.capture = False

    def wrap_target(self) -> tuple[Any, str]:
        raise NotImplementedError

    def initialized(self) -> bool:
        return True

    def resolve_group(self, group: Any) -> Any:
        return "WORLD" if group is None else group

    def group_key(self, group: Any) -> Any:
        return ("fake", self.r, self.resolve_group(group))

    def rank(self, group: Any) -> int:
        return self.r

    def world_size(self, group: Any) -> int:
        return self.world.n

    def all_gather_object(self, obj: Any, group: Any) -> list[Any]:
        return self.world.gather(self.r, obj)

    def parse_call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Call | None:
        if len(args) != 1 or set(kwargs) - {"op", "group", "async_op"}:
            return None
        return Call(args[0], kwargs.get("op", "sum"), kwargs.get("group"), not kwargs.get("async_op", False))

    def is_sum(self, op: Any) -> bool:
        return op == "sum"

    def tensor_info(self, t: Any) -> TensorInfo | None:
        if not isinstance(t, FakeTensor):
            return None
        return TensorInfo(t.dtype, t.arr.size, t.arr.nbytes, t.ptr, True, t.device)

    def result(self, call: Call) -> Any:
        return None if call.blocking else "work"

    def cuda_unavailable(self) -> str | None:
        return None

    def current_device(self) -> int:
        return self.r

    def capability(self, device: int) -> tuple[int, int]:
        return 9, 0

    def current_stream(self, device: int) -> int:
        return 7 if self.capture else 0

    def capturing(self) -> bool:
        return self.capture

    def synchronize(self, device: int) -> None:
        pass

    def from_numpy(self, array: Any, device: int) -> Any:
        return FakeTensor(self.world, np.array(array, dtype=np.float32), f"cuda:{device}")

    def to_numpy(self, t: Any) -> Any:
        return t.arr.copy()


class FakeLib:
    """The C API's contract, simulated: eager calls sum across the threads; captures reserve slots."""

    path = None

    def __init__(self, world: FakeWorld, rank: int) -> None:
        self.world, self.rank = world, rank
        self.table: dict[int, list[int]] = {}
        self.pending_list: list[tuple[int, int]] = []
        self.next_slot, self.capacity = 1, 0
        self.freed: list[int] = []
        self.eager_calls: list[int] = []

    def device_info(self, device: int) -> tuple[str, int, int]:
        return f"0000:{0x10 + self.rank:02x}:00.0", 9, 0

    def can_access_peer(self, a: str, b: str) -> int:
        return 1

    def alloc(self, device: int, nbytes: int) -> tuple[int, bytes]:
        ptr = self.world.new(np.zeros(nbytes // 4, np.float32))
        handle = f"alloc:{ptr}".encode().ljust(64, b"\0")
        self.world.handles[handle] = ptr
        return ptr, handle

    def free(self, device: int, ptr: int) -> None:
        self.freed.append(ptr)

    def create(self, rank: int, world: int, device: int, sig_h: list[bytes], sig: int, sig_bytes: int,
               stg_h: list[bytes], stg: int, stg_bytes: int, slots: int, blocks: int, timeout: float) -> int:
        assert [self.world.handles[h] for h in stg_h][rank] == stg
        self.capacity = slots
        return 1000 + rank

    def destroy(self, ctx: int) -> None:
        pass

    def probe_write(self, ctx: int, token: int, stream: int) -> None:
        for reader in range(self.world.n):
            if (self.rank, reader) not in self.world.drop_probe:
                self.world.probes[(self.rank, reader)] = token

    def probe_check(self, ctx: int, token: int, stream: int) -> int:
        return sum(1 << w for w in range(self.world.n) if self.world.probes.get((w, self.rank)) == token)

    def stream_capturing(self, stream: int) -> int:
        return 1 if stream == 7 else 0

    def ipc_capable(self, ptr: int) -> bool:
        return ptr not in self.world.vmm

    def slots(self, ctx: int) -> tuple[int, int]:
        return self.next_slot, self.capacity

    def all_reduce(self, ctx: int, src: int, dst: int, numel: int, dtype: int, algo: int, stream: int) -> None:
        if stream == 7:
            if self.next_slot >= self.capacity:
                raise CollectiveError("the pointer table is full", library.ERR_TABLE_FULL)
            self.pending_list.append((src, self.next_slot))
            self.next_slot += 1
            return
        values = self.world.gather(self.rank, self.world.memory[src][:numel].copy())
        self.world.memory[dst][:numel] = np.sum(values, axis=0)
        self.eager_calls.append(algo)

    def pending(self, ctx: int) -> int:
        return len(self.pending_list)

    def drop_pending(self, ctx: int, count: int) -> None:
        del self.pending_list[:count]

    def pending_handles(self, ctx: int, count: int) -> tuple[list[bytes], list[int]]:
        assert count == len(self.pending_list)
        handles = []
        for src, _slot in self.pending_list:
            h = f"buf:{src}".encode().ljust(64, b"\0")
            self.world.handles[h] = src
            handles.append(h)
        return handles, [0] * count

    def register_pending(self, ctx: int, count: int, handles: Any, offsets: Any, stream: int) -> None:
        assert count == len(self.pending_list)
        for i, (_src, slot) in enumerate(self.pending_list):
            self.table[slot] = [self.world.handles[handles[r][i]] + offsets[r][i] for r in range(self.world.n)]
        self.pending_list.clear()

    def replay(self, slot: int, numel: int) -> None:
        """What the captured kernel does at a replay: sum the registered buffers of all ranks."""
        ptrs = self.table[slot]
        self.world.barrier.wait()  # the start barrier: every rank's input is ready
        values = [self.world.memory[p][:numel].copy() for p in ptrs]
        self.world.barrier.wait()
        self.world.memory[ptrs[self.rank]][:numel] = np.sum(values, axis=0)
        self.world.barrier.wait()

    def reset(self, ctx: int) -> None:
        self.table.clear()
        self.pending_list.clear()
        self.next_slot = 1


def _ranks(n: int, body: Callable[[int, FakeWorld], Any], world: FakeWorld | None = None) -> list[Any]:
    world = world or FakeWorld(n)
    with cf.ThreadPoolExecutor(n) as pool:
        return [f.result(timeout=60) for f in [pool.submit(body, r, world) for r in range(n)]]


def _comm(rank: int, world: FakeWorld, **kw: Any) -> tuple[custom_ar.Communicator, FakeDist, FakeLib]:
    dist, lib = FakeDist(world, rank), FakeLib(world, rank)
    options = {"max_bytes": 1 << 12, "scope_name": "graphed", "pointer_slots": 4, "timeout_s": 5.0, "max_blocks": 36}
    options.update(kw)
    comm = custom_ar.Communicator(dist, None, dist.group_key(None), lib=lib, **options)
    return comm, dist, lib


def _original(calls: list[Any]) -> Callable[..., Any]:
    def original(*args: Any, **kwargs: Any) -> Any:
        calls.append((args, kwargs))
        return "original"
    return original


@pytest.fixture
def clean_stats() -> Any:
    custom_ar.reset_stats()
    yield custom_ar.STATS
    custom_ar.reset_stats()


def test_simulated_init_eager_and_captured_calls(clean_stats: custom_ar.Stats) -> None:
    def rank_body(rank: int, world: FakeWorld) -> dict[str, Any]:
        comm, dist, lib = _comm(rank, world)
        comm.setup()
        assert comm.enabled, comm.reason
        assert lib.eager_calls == [1, 2], "init's self-test runs one-shot and two-shot"
        original_calls: list[Any] = []
        original = _original(original_calls)
        x = FakeTensor(world, np.full(8, rank + 1.0, np.float32), f"cuda:{rank}")
        # outside any graphed call: the original, counted under "scope"
        assert comm.call(Call(x, "sum", None, True), original, (x,), {}) == "original"
        # inside a graphed call's warmup: the eager path returns the right sum in place
        with scope.graphed_call("warmup"):
            assert comm.call(Call(x, "sum", None, False), original, (x,), {"async_op": True}) == "work"
        np.testing.assert_array_equal(x.arr, np.full(8, 3.0))
        # a capture: zero copy, one slot per call, registered after the capture on every rank
        y = FakeTensor(world, np.full(8, rank + 1.0, np.float32), f"cuda:{rank}")
        with scope.graphed_call("capture"):
            dist.capture = True
            assert comm.call(Call(y, "sum", None, True), original, (y,), {}) is None
            assert comm.call(Call(y, "sum", None, True), original, (y,), {}) is None
            dist.capture = False
        assert lib.pending_list and comm.pending_seq == [scope.last_capture()] * 2
        assert comm.register(scope.last_capture()) == 2
        assert lib.pending_list == [] and comm.pending_seq == []
        lib.replay(1, 8)  # the graph replays with new data: the slot holds every rank's buffer
        np.testing.assert_array_equal(y.arr, np.full(8, 3.0))
        y.arr[:] = 10.0 * (rank + 1)
        lib.replay(2, 8)
        np.testing.assert_array_equal(y.arr, np.full(8, 30.0))
        return {"original": len(original_calls)}

    results = _ranks(2, rank_body)
    assert all(r["original"] == 1 for r in results)
    stats = clean_stats.as_dict()
    assert stats["custom"] == {"eager": 2, "captured": 4}
    assert stats["fallbacks"] == {"scope": 2} and stats["registered"] == 4 and stats["registrations"] == 2


def test_simulated_fallbacks_at_call_time(clean_stats: custom_ar.Stats, monkeypatch: pytest.MonkeyPatch) -> None:
    def rank_body(rank: int, world: FakeWorld) -> list[str]:
        comm, dist, _ = _comm(rank, world, pointer_slots=2, scope_name="always")
        comm.setup()
        assert comm.enabled
        seen: list[str] = []

        def run(t: Any, op: str = "sum", capture: bool = False, foreign: bool = False) -> None:
            before = dict(clean_stats.fallbacks)
            dist.capture = capture
            try:  # foreign: a compiled graph's all-reduce captured by someone else (reduce-overhead)
                with scope.graphed_call("capture" if capture and not foreign else "warmup"), \
                        (from_compiled_graph() if foreign else contextlib.nullcontext()):
                    comm.call(Call(t, op, None, True), _original([]), (t,), {})
            finally:
                dist.capture = False
            after = clean_stats.fallbacks
            seen.append(next((k for k in after if after[k] != before.get(k, 0)), "custom"))

        dev = f"cuda:{rank}"
        run(FakeTensor(world, np.ones(8, np.float32), dev), op="max")                      # op
        run(FakeTensor(world, np.ones(8, np.float32), dev, dtype="float64"))               # dtype
        run(FakeTensor(world, np.ones(8, np.float32), "cpu"))                              # device
        run(FakeTensor(world, np.ones(2048, np.float32), dev))                             # bytes > max (8 KiB)
        run(FakeTensor(world, np.ones(3, np.float32), dev))                                # bytes % 16
        run("not a tensor")                                                                # arguments
        vmm = FakeTensor(world, np.ones(8, np.float32), dev)
        world.vmm.add(vmm.ptr)
        run(vmm, capture=True)                                                             # VMM memory
        run(FakeTensor(world, np.ones(8, np.float32), dev), capture=True)                  # custom: slot 1
        run(FakeTensor(world, np.ones(8, np.float32), dev), capture=True)                  # pointer table full
        comm.register(None)
        comm.reset()                                                                       # frees the slots
        run(FakeTensor(world, np.ones(8, np.float32), dev), capture=True)                  # custom again
        run(FakeTensor(world, np.ones(8, np.float32), dev), capture=True, foreign=True)    # foreign capture
        monkeypatch.setattr(dist, "current_stream", lambda device: 5)
        run(FakeTensor(world, np.ones(8, np.float32), dev), capture=True)                  # stream
        return seen

    for seen in _ranks(2, rank_body):
        assert seen == ["op", "dtype", "device", "bytes > max", "bytes % 16", "arguments", "VMM memory", "custom",
                        "pointer table full", "custom", "foreign capture", "stream"]


def test_simulated_auto_sends_big_eager_calls_to_the_framework(clean_stats: custom_ar.Stats,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    assert custom_ar.EAGER_NCCL_ABOVE == 32 << 20 and "crossover" in custom_ar.REASONS
    monkeypatch.setattr(communicator, "EAGER_NCCL_ABOVE", 64)  # bytes: what 32 MiB is to a real max_bytes

    def rank_body(rank: int, world: FakeWorld) -> list[str]:
        comm, dist, _ = _comm(rank, world, scope_name="always")
        comm.setup()
        outcome = []
        for n, capture in ((16, False), (32, False), (32, True)):
            x = FakeTensor(world, np.full(n, rank + 1.0, np.float32), f"cuda:{rank}")
            dist.capture = capture
            with scope.graphed_call("capture" if capture else "warmup"):
                got = comm.call(Call(x, "sum", None, True), _original([]), (x,), {})
            dist.capture = False
            outcome.append("framework" if got == "original" else "custom")
        return outcome

    # 64 bytes: custom; 128 bytes eager: the framework ("crossover"); 128 bytes captured: custom (zero copy)
    assert _ranks(2, rank_body) == [["custom", "framework", "custom"]] * 2
    assert clean_stats.as_dict()["fallbacks"] == {"crossover": 2}
    custom_ar.reset_stats()
    monkeypatch.setenv("GRAPHJIT_AR_ALGO", "1shot")  # a forced algorithm is never redirected
    env.refresh()
    try:
        assert _ranks(2, rank_body) == [["custom", "custom", "custom"]] * 2
    finally:
        monkeypatch.delenv("GRAPHJIT_AR_ALGO")
        env.refresh()


def test_simulated_init_failures_agree_on_every_rank() -> None:
    world = FakeWorld(2)
    world.drop_probe.add((1, 0))  # rank 1's writes never reach rank 0

    def rank_body(rank: int, w: FakeWorld) -> tuple[Any, list[int]]:
        comm, _dist, lib = _comm(rank, w)
        comm.setup()
        return comm.reason, lib.freed

    results = _ranks(2, rank_body, world)
    assert results[0][0] == results[1][0], "the ranks disagree"
    key, detail = results[0][0]
    assert key == "topology" and "probe" in detail and "rank 0:" in detail
    assert all(len(freed) == 2 for _r, freed in results), "the IPC buffers were not freed"


def test_simulated_world_size_and_settings_reasons(monkeypatch: pytest.MonkeyPatch) -> None:
    def three(rank: int, world: FakeWorld) -> Any:
        comm, _d, _l = _comm(rank, world)
        comm.setup()
        return comm.reason

    assert all(r[0] == "world size" for r in _ranks(3, three))
    monkeypatch.setenv("GRAPHJIT_CUSTOM_AR", "0")
    env.refresh()
    assert all(r[0] == "disabled" for r in _ranks(2, three))


@pytest.mark.parametrize(("name", "values"), [("max_bytes", (1 << 12, 1 << 13)), ("scope_name", ("graphed", "always")),
                                             ("pointer_slots", (4, 8)), ("max_blocks", (36, 64))])
def test_simulated_init_refuses_settings_that_differ_between_ranks(name: str, values: tuple[Any, Any]) -> None:
    def rank_body(rank: int, world: FakeWorld) -> str:
        comm, _dist, lib = _comm(rank, world, **{name: values[rank]})
        with pytest.raises(ConfigError) as info:
            comm.setup()
        assert not comm.enabled and lib.freed == []  # nothing was allocated
        return str(info.value)

    messages = _ranks(2, rank_body)
    shown = name.replace("scope_name", "scope")
    assert messages[0] == messages[1], "the ranks raised different errors"
    assert f"{shown} differs between the ranks of the group (rank 0: {values[0]!r}, rank 1: {values[1]!r})" \
        in messages[0]
    assert "pass the same max_bytes, scope, pointer_slots, max_blocks on every rank" in messages[0]
    def own_timeouts(rank: int, world: FakeWorld) -> bool:  # timeout_s may differ: each rank's own watchdog
        comm = _comm(rank, world, timeout_s=5.0 + rank)[0]
        comm.setup()
        return comm.enabled

    assert _ranks(2, own_timeouts) == [True, True]


def test_simulated_registration_drops_failed_captures_and_checks_counts(clean_stats: custom_ar.Stats) -> None:
    def rank_body(rank: int, world: FakeWorld) -> str:
        comm, dist, lib = _comm(rank, world, pointer_slots=16, scope_name="always")
        comm.setup()
        t = FakeTensor(world, np.ones(8, np.float32), f"cuda:{rank}")

        def capture(calls: int) -> None:
            with scope.graphed_call("capture"):
                dist.capture = True
                for _ in range(calls):
                    comm.call(Call(t, "sum", None, True), _original([]), (t,), {})
                dist.capture = False

        capture(2)                      # a capture that failed afterwards: never registered
        capture(1)                      # the next one succeeds
        assert comm.register(scope.last_capture()) == 1, "the failed capture's entries were not dropped"
        assert lib.table.keys() == {3}
        capture(1 + rank)               # the ranks capture different all-reduces
        with pytest.raises(CaptureError) as info:
            comm.register(scope.last_capture())
        assert lib.pending_list == [] and comm.pending_seq == []
        return str(info.value)

    for message in _ranks(2, rank_body):
        assert "different numbers of custom all-reduces" in message and "rank 0: 1, rank 1: 2" in message


def test_after_capture_hook_and_dispatch_routing(clean_stats: custom_ar.Stats) -> None:
    world = FakeWorld(1)
    dist, lib = FakeDist(world, 0), FakeLib(world, 0)
    comm = custom_ar.Communicator(dist, None, dist.group_key(None), 4096, "graphed", 4, 1.0, 36, lib=lib)
    comm.enabled = True  # a one-rank group cannot pass setup; routing is what is tested here
    comm.device, comm.device_str, comm.ctx = 0, "cuda:0", 1
    lib.capacity = 4
    calls: list[Any] = []
    t = FakeTensor(world, np.ones(4, np.float32), "cuda:0")
    custom_ar._COMMS[comm.key] = comm
    try:
        assert custom_ar.dispatch(dist, _original(calls), (t,), {"group": "other"}) == "original"
        assert custom_ar.dispatch(dist, _original(calls), (t, "extra"), {}) == "original"
        with scope.graphed_call("capture"):
            dist.capture = True
            assert custom_ar.dispatch(dist, _original(calls), (t,), {}) is None
            dist.capture = False
        assert comm.pending_seq
        custom_ar.after_capture()  # what graphjit.capture runs after each successful capture
        assert not comm.pending_seq and lib.table
    finally:
        custom_ar._COMMS.pop(comm.key, None)
    assert clean_stats.fallbacks == {"not initialized": 1, "arguments": 1}
    assert clean_stats.captured == 1 and len(calls) == 2


def test_dispatch_reasons_outside_the_communicator(clean_stats: custom_ar.Stats,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    world = FakeWorld(1)
    dist = FakeDist(world, 0)
    t = FakeTensor(world, np.ones(4, np.float32), "cuda:0")
    calls: list[Any] = []
    monkeypatch.setenv("GRAPHJIT_DISABLE", "1")
    env.refresh()
    assert custom_ar.dispatch(dist, _original(calls), (t,), {}) == "original"
    monkeypatch.delenv("GRAPHJIT_DISABLE")
    env.refresh()
    monkeypatch.setattr(dist, "static_mode", lambda: True)
    assert custom_ar.dispatch(dist, _original(calls), (t,), {}) == "original"
    assert clean_stats.fallbacks == {"disabled": 1, "static mode": 1} and len(calls) == 2


COVERED_REASONS = {row[2] for row in TENSOR_TABLE} | {row[4] for row in TOPOLOGY_TABLE} | {
    "world size", "multi-node", "disabled", "nccl", "scope", "not initialized", "static mode", "op", "VMM memory",
    "pointer table full", "stream", "unavailable", "foreign capture", "crossover"}


def test_every_reason_is_in_the_table() -> None:
    assert set(custom_ar.REASONS) == COVERED_REASONS - {None}


def test_importing_collectives_imports_no_framework_and_builds_nothing(tmp_path: Path) -> None:
    code = ("import sys; import graphjit.collectives as c; "
            "print(sorted(m for m in ('torch', 'paddle') if m in sys.modules))")
    environ = dict(os.environ, PYTHONPATH=str(ROOT), GRAPHJIT_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=environ)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
    assert not (tmp_path / "cache").exists()


def test_init_failure_inside_a_step_still_agrees(monkeypatch: pytest.MonkeyPatch) -> None:
    """An unexpected exception on one rank becomes a reason every rank shares (no rank is left waiting)."""
    def rank_body(rank: int, world: FakeWorld) -> Any:
        comm, dist, _ = _comm(rank, world)
        if rank == 1:
            monkeypatch.setattr(dist, "capability", lambda device: (_ for _ in ()).throw(RuntimeError("driver gone")))
        comm.setup()
        return comm.reason

    reasons = _ranks(2, rank_body)
    assert reasons[0] == reasons[1] == ("unavailable", "rank 1: RuntimeError: driver gone")


# ================================================================================================
# init: argument errors
# ================================================================================================
@pytest.mark.parametrize(("kwargs", "words"), [
    ({"max_bytes": 15}, "max_bytes=15"),
    ({"max_bytes": 8 * 1024 * 1024 + 8}, "multiple of 16"),
    ({"max_bytes": "8M"}, "expected an integer"),
    ({"max_bytes": True}, "expected an integer"),
    ({"max_bytes": 1 << 40}, "2 GiB"),
    ({"scope": "sometimes"}, "scope='sometimes'"),
    ({"backend": "jax"}, "backend='jax'"),
    ({"pointer_slots": 1}, "pointer_slots=1"),
    ({"timeout_s": -1}, "timeout_s=-1"),
    ({"max_blocks": 0}, "max_blocks=0"),
    ({"group": "world"}, "group='world'"),
])
def test_init_rejects_bad_arguments(kwargs: dict[str, Any], words: str) -> None:
    from graphjit import collectives

    with pytest.raises(ConfigError) as info:
        collectives.init(**kwargs)
    assert words in str(info.value)
    assert isinstance(info.value, ValueError)


def test_ar_max_bytes_from_the_environment_is_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    from graphjit import collectives

    monkeypatch.setenv("GRAPHJIT_AR_MAX_BYTES", "1000")
    env.refresh()
    with pytest.raises(ConfigError, match="max_bytes=1000"):
        collectives.init()


@pytest.mark.torch
def test_init_needs_an_initialised_process_group() -> None:
    import torch.distributed as dist

    from graphjit import collectives

    assert not dist.is_initialized()
    with pytest.raises(ConfigError, match=r"init_process_group\(\)"):
        collectives.init(backend="torch")


# ================================================================================================
# the swap in real 2-process gloo groups (CPU): calls pass through unchanged, reasons are counted
# ================================================================================================
def _free_port(span: int = 1) -> int:
    for _ in range(50):
        base = 20000 + int.from_bytes(os.urandom(2), "little") % 30000
        socks = []
        try:
            for k in range(span):
                s = socket.socket()
                s.bind(("127.0.0.1", base + k))
                socks.append(s)
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free port")


def _run_workers(mode: str, tmp_path: Path, span: int = 1, timeout: float = 180) -> list[dict[str, Any]]:
    port = _free_port(span)
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("GRAPHJIT_", "PADDLE_", "MASTER_"))}
    environ["PYTHONPATH"] = str(ROOT) + os.pathsep + environ.get("PYTHONPATH", "")
    environ["GRAPHJIT_CACHE_DIR"] = str(tmp_path / "cache")
    outs = [tmp_path / f"{mode}-{r}.json" for r in range(2)]
    procs = [subprocess.Popen([sys.executable, __file__, mode, str(r), str(port), str(outs[r])], env=environ,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
    logs = []
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            logs.append(p.communicate(timeout=max(1.0, deadline - time.monotonic()))[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"{mode} workers did not finish in {timeout:.0f} s")
    results = []
    for r, (p, out) in enumerate(zip(procs, outs)):
        assert out.is_file(), f"rank {r} wrote no result (exit {p.returncode}):\n{logs[r][-4000:]}"
        data = json.loads(out.read_text())
        assert "error" not in data, f"rank {r} failed:\n{data['error']}\n{logs[r][-2000:]}"
        assert p.returncode == 0, logs[r][-4000:]
        results.append(data)
    return results


@pytest.mark.torch
@pytest.mark.slow
def test_torch_swap_passes_calls_through_in_a_gloo_group(tmp_path: Path) -> None:
    for rank, got in enumerate(_run_workers("torch-gloo", tmp_path)):
        assert got["report"]["enabled"] is False and got["report"]["reason_key"] == "unavailable"
        assert "CPU build" in got["report"]["reason"] or "no CUDA" in got["report"]["reason"]
        assert got["wrapped"] and got["name"] == "all_reduce" and got["doc_kept"] and got["signature_kept"]
        assert got["results"] == {"plain": [3.0] * 4, "async": [3.0] * 4, "max": [2.0] * 4, "scope": [3.0] * 4,
                                  "group": [3.0] * 4, "keywords": [3.0] * 4}
        assert got["returns"] == {"plain": "NoneType", "async": "Work", "scope": "NoneType"}
        assert got["fallbacks"] == {"unavailable": 5, "not initialized": 1}  # off: its reason, whatever the scope
        assert got["custom"] == {"eager": 0, "captured": 0}
        assert got["installed_twice"] is False and got["restored"] is True
        assert got["rank"] == rank
        # custom all-reduce off: Dynamo rewrites the call as it would the original (fullgraph works)
        assert got["plain_fullgraph"]["values"] == got["compiled_want"]
        # on: a default-group SUM is the custom op in the graph (no break, fullgraph works) and every call
        # reaches dispatch; another op breaks the graph, and fullgraph=True refuses it with graphjit's reason
        assert got["opaque_is_published"] and got["plain_again"]
        assert got["compile_breaks"] == [], got["compile_breaks"]
        assert got["compile_breaks_max"] == ["Skip calling `torch.compiler.disable()`d function"]
        for backend, res in got["compiled"].items():
            assert res["dispatched"] == 3, f"torch.compile ({backend}) bypassed the swap"
            assert res["values"] == got["compiled_want"], backend
        assert "graphjit.collectives.shutdown()" in (got["opaque_fullgraph_error"] or ""), got["opaque_fullgraph_error"]


@pytest.mark.paddle
@pytest.mark.slow
def test_paddle_swap_passes_calls_through_in_a_gloo_group_and_under_sot(tmp_path: Path) -> None:
    for got in _run_workers("paddle-gloo", tmp_path, span=8):
        assert got["report"]["enabled"] is False and got["report"]["reason_key"] == "unavailable"
        assert got["results"] == {"plain": [3.0] * 4, "sync_op": [3.0] * 4, "sot": [[10.0] * 4] * 3}
        assert got["sot_calls"] == 3, "SOT did not run the wrapped all_reduce eagerly (graph break)"
        assert got["fallbacks"].get("static mode", 0) == 0, got["fallbacks"]
        assert got["fallbacks"]["unavailable"] == 5 and "scope" not in got["fallbacks"]
        assert got["published_is_function"] and got["kept_after_shutdown"]
        assert got["gathered_ok"], "all_gather_object (broadcasts of uint8 tensors) lost or reordered objects"


# -- the workers -------------------------------------------------------------------------------------
def _torch_worker(rank: int, port: int) -> dict[str, Any]:

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    from graphjit import collectives
    from graphjit.backends.dist_base import load
    from graphjit.collectives import swap

    original = dist.all_reduce
    report = collectives.init(backend="torch")
    wrapped = dist.all_reduce is not original and swap.swapped(dist.all_reduce) is not None
    out: dict[str, Any] = {"rank": rank, "report": report.as_dict(), "wrapped": wrapped,
                           "name": dist.all_reduce.__name__, "doc_kept": dist.all_reduce.__doc__ == original.__doc__,
                           "signature_kept": inspect.signature(dist.all_reduce) == inspect.signature(original)}
    results: dict[str, Any] = {}
    returns: dict[str, str] = {}
    t = torch.full((4,), float(rank + 1))
    returns["plain"] = type(dist.all_reduce(t)).__name__
    results["plain"] = t.tolist()
    t = torch.full((4,), float(rank + 1))
    work = dist.all_reduce(t, async_op=True)
    returns["async"] = type(work).__name__
    work.wait()
    results["async"] = t.tolist()
    t = torch.full((4,), float(rank + 1))
    dist.all_reduce(t, dist.ReduceOp.MAX)
    results["max"] = t.tolist()
    t = torch.full((4,), float(rank + 1))
    with scope.graphed_call("warmup"):  # inside a graphed call: the custom path would apply; unavailable here
        returns["scope"] = type(dist.all_reduce(t)).__name__
    results["scope"] = t.tolist()
    sub = dist.new_group([0, 1])  # a group collectives.init was not called for
    t = torch.full((4,), float(rank + 1))
    with scope.graphed_call("warmup"):
        dist.all_reduce(t, group=sub)
    results["group"] = t.tolist()
    t = torch.full((4,), float(rank + 1))
    dist.all_reduce(tensor=t, op=dist.ReduceOp.SUM, group=None, async_op=False)
    results["keywords"] = t.tolist()
    out["results"], out["returns"] = results, returns
    stats = collectives.stats()
    out["fallbacks"], out["custom"] = stats["fallbacks"], stats["custom"]

    # torch.compile.  Custom all-reduce off (as here): the plain wrapper, which Dynamo rewrites like the
    # original.  On (set_opaque, as init does when it enables a group): Dynamo must not look through the
    # swap.  A default-group SUM becomes the custom op graphjit::all_reduce_ (fullgraph=True works, and
    # every call still reaches dispatch when the compiled code runs); any other call breaks the graph
    # (fullgraph=True then fails with a message naming graphjit).
    def step(x: Any) -> Any:
        y = torch.sin(x) * 2.0
        dist.all_reduce(y)
        return y + 1.0

    def step_max(x: Any) -> Any:
        y = torch.sin(x) * 2.0
        dist.all_reduce(y, op=dist.ReduceOp.MAX)
        return y + 1.0

    import torch._dynamo

    def want(i: int) -> float:
        return round(float(sum(torch.sin(torch.tensor(0.5 * (r + 1 + i))) * 2.0 for r in range(2))) + 1.0, 5)

    def run(fn: Any) -> dict[str, Any]:
        before = sum(collectives.stats()["fallbacks"].values())
        values = [round(float(fn(torch.full((4,), 0.5 * (rank + 1 + i)))[0]), 5) for i in range(3)]
        return {"dispatched": sum(collectives.stats()["fallbacks"].values()) - before, "values": values}

    def breaks(fn: Any) -> list[str]:
        torch._dynamo.reset()
        return [str(b.reason).splitlines()[0] for b in torch._dynamo.explain(fn)(torch.ones(4)).break_reasons]

    out["compiled_want"] = [want(i) for i in range(3)]
    torch._dynamo.reset()
    out["plain_fullgraph"] = run(torch.compile(step, backend="eager", fullgraph=True))
    swap.set_opaque("torch", True)
    out["opaque_is_published"] = dist.all_reduce is not swap.swapped(dist.all_reduce)
    out["compile_breaks"] = breaks(step)
    out["compile_breaks_max"] = breaks(step_max)
    out["compiled"] = {}
    for backend in ("eager", "aot_eager"):
        torch._dynamo.reset()
        out["compiled"][backend] = run(torch.compile(step, backend=backend, fullgraph=True))
    torch._dynamo.reset()
    try:
        torch.compile(step_max, backend="eager", fullgraph=True)(torch.ones(4))
        out["opaque_fullgraph_error"] = None
    except Exception as exc:
        out["opaque_fullgraph_error"] = str(exc)
    collectives.shutdown()  # no group has the custom all-reduce on any more: the plain wrapper again
    out["plain_again"] = swap.swapped(dist.all_reduce) is dist.all_reduce
    out["installed_twice"] = swap.install(load("torch"), custom_ar.dispatch)
    swap.uninstall("torch")
    out["restored"] = dist.all_reduce is original
    return out


def _paddle_worker(rank: int, port: int) -> dict[str, Any]:
    os.environ.update({
        "PADDLE_TRAINER_ID": str(rank), "PADDLE_TRAINERS_NUM": "2", "PADDLE_RANK_IN_NODE": str(rank),
        "PADDLE_TRAINER_ENDPOINTS": f"127.0.0.1:{port},127.0.0.1:{port + 1}",
        "PADDLE_CURRENT_ENDPOINT": f"127.0.0.1:{port + rank}", "PADDLE_DISTRI_BACKEND": "gloo",
        "PADDLE_MASTER": f"127.0.0.1:{port + 5}"})
    import paddle
    import paddle.distributed as dist

    paddle.set_device("cpu")
    dist.init_parallel_env()
    from graphjit import collectives

    report = collectives.init(backend="paddle")
    results: dict[str, Any] = {}
    t = paddle.full([4], float(rank + 1))
    dist.all_reduce(t)
    results["plain"] = t.numpy().tolist()
    t = paddle.full([4], float(rank + 1))
    task = dist.all_reduce(t, sync_op=False)
    task.wait()
    results["sync_op"] = t.numpy().tolist()
    sot_calls = []

    def step(x: Any) -> Any:
        y = x * 2
        dist.all_reduce(y)
        return y + 4

    traced = paddle.jit.to_static(step, full_graph=False)
    before = collectives.stats()["fallbacks"].get("unavailable", 0)
    outs = []
    for _ in range(3):
        with scope.graphed_call("warmup"):
            outs.append(traced(paddle.full([4], float(rank + 1))).numpy().tolist())
    sot_calls.append(collectives.stats()["fallbacks"].get("unavailable", 0) - before)
    results["sot"] = outs
    stats = collectives.stats()
    from graphjit.backends.dist_base import load
    from graphjit.collectives import swap

    gathered = load("paddle").all_gather_object({"rank": rank, "blob": b"\x00\xff" * (3000 * rank + 1)}, None)
    published = dist.all_reduce
    collectives.shutdown()  # Paddle keeps the SOT-visible function even with no group on
    return {"report": report.as_dict(), "results": results, "sot_calls": sot_calls[0],
            "fallbacks": stats["fallbacks"],
            "published_is_function": inspect.isfunction(published) and swap.swapped(published) is not None,
            "kept_after_shutdown": dist.all_reduce is published,
            "gathered_ok": gathered == [{"rank": r, "blob": b"\x00\xff" * (3000 * r + 1)} for r in range(2)]}


def _worker(argv: list[str]) -> None:
    mode, rank, port, out = argv[0], int(argv[1]), int(argv[2]), Path(argv[3])
    code = 0
    try:
        data = {"torch-gloo": _torch_worker, "paddle-gloo": _paddle_worker}[mode](rank, port)
    except BaseException:
        data, code = {"error": traceback.format_exc()}, 1
    out.write_text(json.dumps(data))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip interpreter teardown (process groups, Paddle's allocator)


if __name__ == "__main__":
    _worker(sys.argv[1:])



def test_torch_tensor_info_describes_what_eligibility_checks() -> None:
    torch = pytest.importorskip("torch")
    from graphjit.backends.dist_base import load

    d = load("torch")
    t = torch.ones(4, 6, dtype=torch.float16)
    assert d.tensor_info(t) == ("float16", 24, 48, t.data_ptr(), True, "cpu")
    assert d.tensor_info(t.t()).contiguous is False
    assert d.tensor_info(torch.ones(3, dtype=torch.float64)).dtype == "float64"
    assert d.tensor_info(t.to_sparse()) is None
    assert d.tensor_info("t") is None
    assert d.is_sum(torch.distributed.ReduceOp.SUM) and not d.is_sum(torch.distributed.ReduceOp.MAX)


@pytest.mark.parametrize("framework", ["torch", "paddle"])
def test_parse_call_binds_like_the_original_all_reduce(framework: str) -> None:
    """One binding for both frameworks: positional or keyword, the framework's SUM and flag defaults,
    and None for what the swap must pass through untouched (extra arguments, unknown or repeated keywords)."""
    pytest.importorskip(framework)
    from graphjit.backends.dist_base import load

    d = load(framework)
    flag, default = d.flag_name, d.flag_default
    assert d.parse_call(("t",), {}) == Call("t", d.default_op, None, True)  # both frameworks default to waiting
    assert d.parse_call(("t", "max", "g", not default), {}) == Call("t", "max", "g", False)
    assert d.parse_call((), {"tensor": "t", "group": "g", flag: not default}) == Call("t", d.default_op, "g", False)
    assert d.parse_call(("t",), {"op": "max"}) == Call("t", "max", None, True)
    assert d.parse_call(("t",), {"tensor": "u"}) is None  # repeated
    assert d.parse_call(("t",), {"bogus": 1}) is None
    assert d.parse_call(("t", 1, 2, 3, 4), {}) is None
    assert d.parse_call((), {"op": "max"}) is None  # no tensor
    assert d.parse_call((None,), {}) is None
