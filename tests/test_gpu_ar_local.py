"""The all-reduce kernels on ONE GPU: every rank of a world of 2, 4, 6 or 8 in this process.

What this proves and what it does not.  Each rank gets its own context (``gj_ar_create_local``),
its own signal/scratch and staging buffers and its own CUDA stream; the ranks' kernels run
concurrently on the one GPU and synchronize through the same device-memory flags they use across
GPUs.  So the kernels' arithmetic, the pack/partition/block mapping, the barrier protocol and its
counters, one-shot and two-shot, in place and out of place, eager (staging) and captured
(pointer-table slots registered after the capture), over many graph replays interleaved with
eager calls, are all checked for real, at every world size the kernels support.  What one GPU
cannot show: NVLink/IPC mappings between processes, the P2P probe, cross-GPU memory ordering
(all ranks share one L2 here) and any timing.  tests/test_gpu_collectives.py (2 processes,
2 GPUs) covers those.

Reference: the inputs of all ranks summed in float32 in rank order, rounded once to the dtype,
which is exactly what the kernels compute, so every comparison is bitwise, for float16 and
bfloat16 too (and float32 inputs are integer-valued, so NCCL's order would give the same bits).

Run on the GPU machine: ``PYTHONPATH=. python3 -m pytest -q tests/test_gpu_ar_local.py`` (with
``AR_LOCAL_OUT=DIR`` the counts land in ``DIR/ar_local.json``).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.torch]

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("no CUDA GPU", allow_module_level=True)

from graphjit.collectives import csrc_build, library  # noqa: E402

ONE_SHOT, TWO_SHOT, AUTO = 1, 2, 0
DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
MAX_BYTES = 8 << 20
WORLDS = (2, 4, 6, 8)
RESULTS: dict[str, Any] = {}


@pytest.fixture(scope="module")
def lib() -> Any:
    major, minor = torch.cuda.get_device_capability()
    try:
        return library.load(f"sm_{major}{minor}")
    except csrc_build.BuildError as exc:  # no nvcc and nothing built ahead of time
        pytest.skip(str(exc))


class LocalWorld:
    """Every rank of one world in this process, on one GPU, one stream per rank.

    One rule: launch every rank's all-reduce (or graph) of a call before launching anything else.
    With lazy module loading (CUDA's default) the first launch of any other kernel may load its
    module, and loading waits for the kernels already running: with rank 0's all-reduce running
    and rank 1's not yet launched, that wait never ends (rank 0's watchdog traps after 30 s).
    Separate processes, as in real use, have no such coupling.
    """

    def __init__(self, lib: Any, world: int, max_bytes: int = MAX_BYTES, slots: int = 64) -> None:
        self.lib, self.world, self.device = lib, world, torch.cuda.current_device()
        sms = torch.cuda.get_device_properties(self.device).multi_processor_count
        # every rank's blocks must be resident together (they wait for each other): at most one
        # 512-thread block per SM is guaranteed by the kernels' launch bounds
        self.max_blocks = max(1, min(36, sms // world))
        header = lib.limits()["header_bytes"]
        self.signal_bytes = header + max_bytes
        self.signals = [lib.alloc(self.device, self.signal_bytes)[0] for _ in range(world)]
        self.stagings = [lib.alloc(self.device, max_bytes)[0] for _ in range(world)]
        self.ctxs = [lib.create_local(r, world, self.device, self.signals, self.stagings, self.signal_bytes,
                                      max_bytes, slots, self.max_blocks, 30.0) for r in range(world)]
        self.streams = [torch.cuda.Stream() for _ in range(world)]

    def all_reduce(self, ins: list[Any], outs: list[Any], algo: int) -> None:
        """Launch rank r's all-reduce of ins[r] into outs[r] on stream r, after the current stream's work."""
        here = torch.cuda.current_stream()
        for r in range(self.world):
            s = self.streams[r]
            s.wait_stream(here)
            self.lib.all_reduce(self.ctxs[r], ins[r].data_ptr(), outs[r].data_ptr(), ins[r].numel(),
                                DTYPES[ins[r].dtype], algo, s.cuda_stream)
        for s in self.streams:
            here.wait_stream(s)

    def close(self) -> None:
        torch.cuda.synchronize()
        for ctx in self.ctxs:
            self.lib.destroy(ctx)
        for ptr in self.signals + self.stagings:
            self.lib.free(self.device, ptr)


@pytest.fixture(params=WORLDS, ids=lambda w: f"world{w}")
def world(request: pytest.FixtureRequest, lib: Any) -> Iterator[LocalWorld]:
    w = LocalWorld(lib, request.param)
    yield w
    w.close()


def reference(ins: list[Any]) -> Any:
    acc = ins[0].float()
    for x in ins[1:]:
        acc = acc + x.float()
    return acc.to(ins[0].dtype)


def inputs(world: int, numel: int, dtype: Any, seed: int) -> list[Any]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    if dtype == torch.float32:  # integer-valued: exact in any summation order
        return [torch.randint(-1000, 1000, (numel,), generator=g, device="cuda").float() for _ in range(world)]
    return [torch.randn(numel, generator=g, device="cuda").to(dtype) for _ in range(world)]


def sizes() -> list[int]:
    """16 B .. MAX_BYTES: powers of two, odd multiples of 16, and sizes that do not split evenly."""
    out = {1 << k for k in range(4, MAX_BYTES.bit_length())}
    out |= {16 * m for m in (3, 5, 7, 63, 1001, 4097, 65537, 131071)}
    out |= {MAX_BYTES - 16}
    return sorted(n for n in out if n <= MAX_BYTES)


def record(key: str, value: Any) -> None:
    RESULTS[key] = value
    out = os.environ.get("AR_LOCAL_OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "ar_local.json").write_text(json.dumps(RESULTS, indent=1, sort_keys=True))


@pytest.mark.parametrize("dtype", list(DTYPES), ids=lambda d: str(d).split(".")[-1])
def test_eager_sizes_dtypes_algorithms(world: LocalWorld, dtype: Any) -> None:
    """Every size, every algorithm, out of place and in place: bitwise the reference on every rank."""
    bad: list[str] = []
    checked = 0
    esize = torch.empty((), dtype=dtype).element_size()
    for nbytes in sizes():
        numel = nbytes // esize
        ins = inputs(world.world, numel, dtype, seed=nbytes)
        want = reference(ins)
        for algo in (ONE_SHOT, TWO_SHOT, AUTO):
            outs = [torch.full_like(x, float("nan")) for x in ins]
            world.all_reduce(ins, outs, algo)
            inplace = [x.clone() for x in ins]
            world.all_reduce(inplace, inplace, algo)
            for r in range(world.world):
                for name, got in (("out", outs[r]), ("inplace", inplace[r])):
                    if not torch.equal(got, want):
                        wrong = int((got != want).sum())
                        bad.append(f"{nbytes} B algo {algo} rank {r} {name}: {wrong} of {numel} wrong")
                    checked += 1
    torch.cuda.synchronize()
    record(f"eager/world{world.world}/{str(dtype).split('.')[-1]}", {"checked": checked, "wrong": len(bad)})
    assert not bad, bad[:10]


def capture(world: LocalWorld, bufs: list[list[Any]], algos: list[int]) -> list[Any]:
    """One graph per rank holding all-reduces (in place) of bufs[r][i] with algos[i]; registered."""
    graphs = []
    for r in range(world.world):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=world.streams[r]):
            s = torch.cuda.current_stream().cuda_stream
            for buf, algo in zip(bufs[r], algos):
                world.lib.all_reduce(world.ctxs[r], buf.data_ptr(), buf.data_ptr(), buf.numel(), DTYPES[buf.dtype],
                                     algo, s)
        graphs.append(g)
    ptrs = [[b.data_ptr() for b in bufs[r]] for r in range(world.world)]
    for r in range(world.world):
        assert world.lib.pending(world.ctxs[r]) == len(algos)
        world.lib.register_local(world.ctxs[r], ptrs, world.streams[r].cuda_stream)
        assert world.lib.pending(world.ctxs[r]) == 0
    return graphs


def test_graph_replays_with_changing_inputs_interleaved_with_eager_calls(world: LocalWorld) -> None:
    """10,000 replays of a captured one-shot float32 + two-shot float16 + one-shot bfloat16 all-reduce
    (in place), new inputs before every replay, an eager call every 97 replays: all exact."""
    n = world.world
    shapes = [(torch.float32, 4096 + 4), (torch.float16, 65536 * 4 + 8), (torch.bfloat16, 8)]
    algos = [ONE_SHOT, TWO_SHOT, ONE_SHOT]
    bank_size = 8
    # integer-valued inputs, small enough that every sum is exact in float16 and bfloat16
    g = torch.Generator(device="cuda").manual_seed(7)
    banks = [[[torch.randint(-3, 4, (numel,), generator=g, device="cuda").to(dt) for _ in range(n)]
              for _ in range(bank_size)] for dt, numel in shapes]
    refs = [[reference(bank[k]) for k in range(bank_size)] for bank in banks]
    bufs = [[torch.zeros(numel, dtype=dt, device="cuda") for dt, numel in shapes] for _ in range(n)]
    torch.cuda.synchronize()
    graphs = capture(world, bufs, algos)
    eager_in = [torch.full((1024,), float(r + 1), device="cuda") for r in range(n)]
    eager_out = [torch.empty(1024, device="cuda") for _ in range(n)]
    wrong = [torch.zeros((), dtype=torch.int64, device="cuda") for _ in range(n)]
    replays = 10_000
    t0 = time.perf_counter()
    here = torch.cuda.current_stream()
    for it in range(replays):
        k = it % bank_size
        shift = it % 5 - 2  # inputs change every replay: bank k plus a per-replay shift
        for r in range(n):
            with torch.cuda.stream(world.streams[r]):
                for j, buf in enumerate(bufs[r]):
                    torch.add(banks[j][k][r], shift, out=buf)
        for r in range(n):  # every rank's replay is launched before anything else (see LocalWorld)
            with torch.cuda.stream(world.streams[r]):
                graphs[r].replay()
        for r in range(n):
            with torch.cuda.stream(world.streams[r]):
                for j, buf in enumerate(bufs[r]):
                    wrong[r] += (buf != refs[j][k] + n * shift).sum()
        if it % 97 == 96:
            world.all_reduce(eager_in, eager_out, AUTO)
            for r in range(n):
                wrong[r] += (eager_out[r] != n * (n + 1) / 2).sum()
            for s in world.streams:
                s.wait_stream(here)
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    counts = [int(w) for w in wrong]
    record(f"replays/world{n}", {"replays": replays, "wrong_elements_per_rank": counts, "seconds": round(elapsed, 2)})
    assert counts == [0] * n


def test_reset_frees_slots_and_a_second_capture_works(world: LocalWorld) -> None:
    n = world.world
    for _ in range(2):
        bufs = [[torch.full((256,), float(r), device="cuda")] for r in range(n)]
        torch.cuda.synchronize()
        used_before = world.lib.slots(world.ctxs[0])[0]
        graphs = capture(world, bufs, [AUTO])
        assert world.lib.slots(world.ctxs[0])[0] == used_before + 1
        for r in range(n):
            with torch.cuda.stream(world.streams[r]):
                graphs[r].replay()
        torch.cuda.synchronize()
        for r in range(n):
            assert torch.equal(bufs[r][0], torch.full((256,), float(sum(range(n))), device="cuda"))
        for ctx in world.ctxs:
            world.lib.reset(ctx)
        assert world.lib.slots(world.ctxs[0]) == (1, 64)


def test_register_local_refuses_a_different_capture_order(world: LocalWorld) -> None:
    n = world.world
    a = [torch.zeros(64, device="cuda") for _ in range(n)]
    b = [torch.zeros(64, device="cuda") for _ in range(n)]
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=world.streams[0]):
        s = torch.cuda.current_stream().cuda_stream
        world.lib.all_reduce(world.ctxs[0], a[0].data_ptr(), a[0].data_ptr(), 64, 0, AUTO, s)
        world.lib.all_reduce(world.ctxs[0], b[0].data_ptr(), b[0].data_ptr(), 64, 0, AUTO, s)
    swapped = [[b[r].data_ptr(), a[r].data_ptr()] for r in range(n)]
    with pytest.raises(library.CollectiveError, match="its capture recorded") as info:
        world.lib.register_local(world.ctxs[0], swapped, world.streams[0].cuda_stream)
    assert info.value.code == library.ERR_STATE
    with pytest.raises(library.CollectiveError, match="1 entries given, 2 pending") as info:
        world.lib.register_local(world.ctxs[0], [[a[r].data_ptr()] for r in range(n)], world.streams[0].cuda_stream)
    assert info.value.code == library.ERR_STATE
    with pytest.raises(library.CollectiveError, match="rows for 1 ranks") as info:
        world.lib.register_local(world.ctxs[0], [[a[0].data_ptr(), b[0].data_ptr()]], world.streams[0].cuda_stream)
    assert info.value.code == library.ERR_ARGUMENT
    with pytest.raises(library.CollectiveError, match="registers with gj_ar_register_local") as info:
        world.lib.register_pending(world.ctxs[0], 2, [[b"h" * 64] * 2] * n, [[0, 0]] * n, world.streams[0].cuda_stream)
    assert info.value.code == library.ERR_STATE
    world.lib.reset(world.ctxs[0])  # the graph is never replayed: its slots were never filled
    del g


def test_oversize_and_misaligned_calls_are_refused_in_c(world: LocalWorld) -> None:
    x = torch.zeros(MAX_BYTES // 4 + 4, device="cuda")
    with pytest.raises(library.CollectiveError, match="exceed the scratch buffer") as info:
        world.lib.all_reduce(world.ctxs[0], x.data_ptr(), x.data_ptr(), x.numel(), 0, AUTO, 0)
    assert info.value.code == library.ERR_BOUNDS
    with pytest.raises(library.CollectiveError, match="not 16-byte aligned") as info:
        world.lib.all_reduce(world.ctxs[0], x.data_ptr() + 4, x.data_ptr() + 4, 16, 0, AUTO, 0)
    assert info.value.code == library.ERR_UNSUPPORTED
    torch.cuda.synchronize()  # nothing was launched: the context is still healthy
