"""The custom all-reduce in 2 or more processes (torch): results against the framework's collective, graphs,
replays, fallbacks.

Run on the GPU machine: ``PYTHONPATH=. python3 -m pytest -q -m "gpu and not paddle" tests/test_gpu_collectives.py``.
nvcc (or a library built ahead of time with ``python -m graphjit build`` in ``GRAPHJIT_CACHE_DIR``)
is needed: without one the tests are skipped with init's reason.

Two modes, chosen by the GPUs visible:

* **2 GPUs or more**: one process per GPU (2, 4, 6 or 8 ranks: every visible GPU, rounded down),
  an NCCL group; the reference is NCCL.  This is the real
  configuration (IPC over NVLink/PCIe, P2P, NCCL inside graphs).
* **1 GPU** (shared mode): both processes on GPU 0 with ``GRAPHJIT_AR_SHARED_GPU=1`` and a gloo
  group (NCCL refuses two ranks on one GPU); the reference is gloo.  The custom all-reduce runs for
  real across the two processes (IPC mappings, probe, self-test, registration by IPC handle,
  replays), but its kernels take turns on the GPU (milliseconds per call), nothing about P2P
  between GPUs is shown, and the parts that need NCCL inside a captured graph (an ineligible call
  in a graph, the Python-level full-table fallback, the VMM mode) are skipped: gloo cannot run
  inside a capture.

Every check runs in one worker process per rank (this file run as a script, ``python
tests/test_gpu_collectives.py RANK PORT OUT MODE``, launched by tests/multiproc.py), in one group.
A session fixture runs each mode once; the tests read its results.  Each worker section records its own
failures, so one broken section does not hide the others (unless the CUDA context is lost: then
every later section reports the first error).  What is checked:

* ``init``: the custom all-reduce is enabled (P2P, probe and self-test passed).
* ``sizes``: 16 B to max_bytes, powers of two and odd multiples of 16, float32/float16/bfloat16,
  one-shot, two-shot and auto, eager (inside a graphed-call scope): every call ran the custom
  kernel; float32 (integer-valued) is bitwise equal to NCCL; float16/bfloat16 are within one ulp
  of the exact sum; both ranks hold bitwise identical results.
* ``graphed``: ``graphjit.graphed`` steps with all-reduces captured zero-copy, registered after the
  capture (automatically), replayed with new inputs, one-shot and two-shot.
* ``compile``: a ``tracer="compile"`` step with an all-reduce: torch.compile breaks its graph at
  the swapped call, the custom kernel is captured between the compiled parts.
* ``manual``: a graph captured with ``torch.cuda.graph`` on a second group with ``scope="always"``,
  registered with ``collectives.register_graph_buffers``.
* ``replays``: 10,000 replays of two graphs (one-shot float32, two-shot float16) with new inputs
  each time, interleaved with eager custom all-reduces: every result exact.
* ``fallbacks``: oversize, misaligned, float64/int32, non-contiguous, size not a multiple of 16,
  op=MAX, outside the scope: each goes to NCCL, is counted under its reason, and is right; an
  ineligible all-reduce inside a captured graph runs NCCL inside the graph, right on replay.
* ``c_api``: the C library refuses oversize, misaligned, overlapping, empty inputs and bad codes
  with its own status and message; a full pointer table is refused in C during a capture, and in
  Python the extra captured call falls back ("pointer table full") to NCCL inside the graph.
* ``mlp``: a tensor-parallel MLP step (column- then row-parallel) graphed equals eager.
* ``scope``: inside ``capture_scope`` an ordinary all-reduce (warmup-like) returns the right sum.
* ``reset``: ``collectives.reset()`` frees the pointer-table slots; capturing again works.
* mode ``vmm`` (a second run with ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``): captured
  all-reduces of VMM memory fall back with reason "VMM memory" and NCCL inside the graph is right.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import multiproc  # noqa: E402  (tests/multiproc.py: this file also runs as a worker script)

pytestmark = [pytest.mark.gpu, pytest.mark.torch]

MAX_BYTES = 8 << 20
WORKER_TIMEOUT_S = 240  # per launch; below the proof scripts' own timeouts, so the ranks' logs get printed


def _gpus() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _world() -> int:
    """Ranks: every visible GPU (rounded down to 2, 4, 6 or 8); 2 on a 1-GPU machine (shared mode)."""
    if os.environ.get("GJ_AR_TEST_WORLD"):  # the workers: what the launcher chose
        return int(os.environ["GJ_AR_TEST_WORLD"])
    return max([w for w in (2, 4, 6, 8) if w <= _gpus()] or [2])


WORLD = _world()
SHARED = _gpus() == 1  # both ranks on one GPU (see the module docstring)
needs_gpu = pytest.mark.skipif(_gpus() < 1, reason="needs a CUDA GPU (2 for the real configuration)")


# ================================================================================================
# the launcher and the session fixtures
# ================================================================================================
def _run(mode: str, out_dir: Path, extra_env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("GRAPHJIT_", "MASTER_", "PYTORCH_CUDA_ALLOC"))}
    environ["PYTHONPATH"] = str(ROOT) + os.pathsep + environ.get("PYTHONPATH", "")
    environ["GRAPHJIT_CACHE_DIR"] = os.environ.get("GRAPHJIT_CACHE_DIR", str(out_dir / "cache"))
    if os.environ.get("GRAPHJIT_NVCC"):
        environ["GRAPHJIT_NVCC"] = os.environ["GRAPHJIT_NVCC"]
    environ["GJ_AR_TEST_WORLD"] = str(WORLD)
    if SHARED:
        environ.update(GRAPHJIT_AR_SHARED_GPU="1", GJ_AR_TEST_SHARED="1")
    environ.update(extra_env or {})
    return multiproc.launch(Path(__file__), WORLD, mode, out_dir, environ, WORKER_TIMEOUT_S, extra_args=[mode])


@pytest.fixture(scope="session")
def main_run(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    if _gpus() < 1:
        pytest.skip("needs a CUDA GPU")
    results = _run("main", tmp_path_factory.mktemp("gpu-collectives"))
    _skip_if_unbuildable(results)
    return results


@pytest.fixture(scope="session")
def vmm_run(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    if _gpus() < 2:
        pytest.skip("needs 2 CUDA GPUs (the VMM fallback runs NCCL inside a captured graph; gloo cannot)")
    results = _run("vmm", tmp_path_factory.mktemp("gpu-collectives-vmm"),
                   {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    _skip_if_unbuildable(results)
    return results


def _skip_if_unbuildable(results: list[dict[str, Any]]) -> None:
    report = results[0].get("sections", {}).get("init", {}).get("report") or {}
    reason = report.get("reason") or ""
    if not report.get("enabled") and "nvcc was not found" in reason:
        pytest.skip(f"the custom all-reduce cannot be built here: {reason}")


_section = multiproc.section


# ================================================================================================
# the tests (each reads one section of the workers' results)
# ================================================================================================
@needs_gpu
def test_init_enables_the_custom_all_reduce(main_run: list[dict[str, Any]]) -> None:
    for r, sec in enumerate(_section(main_run, "init")):
        report = sec["report"]
        assert report["enabled"], f"rank {r}: the custom all-reduce is off: {report['reason']}"
        assert report["world_size"] == WORLD and report["rank"] == r and report["device"] == (0 if SHARED else r)
        assert report["library"] and report["arch"].startswith("sm_")


@needs_gpu
def test_sizes_dtypes_and_algorithms_match_nccl(main_run: list[dict[str, Any]]) -> None:
    for r, sec in enumerate(_section(main_run, "sizes")):
        assert sec["cases"] >= 3 * 3 * 25, sec["cases"]
        assert sec["failures"] == [], f"rank {r}: {len(sec['failures'])} failures, first: {sec['failures'][:5]}"
        assert sec["custom_calls"] == sec["cases"], "some calls did not run the custom kernel"


@needs_gpu
def test_graphed_steps_capture_register_and_replay(main_run: list[dict[str, Any]]) -> None:
    for r, sec in enumerate(_section(main_run, "graphed")):
        assert sec["failures"] == [], f"rank {r}: {sec['failures'][:5]}"
        assert sec["captured"] >= 2 and sec["registrations"] >= 2, sec
        assert sec["fn_fallbacks"] == {}, sec["fn_fallbacks"]


@needs_gpu
def test_all_reduce_in_a_segment_and_in_an_island(main_run: list[dict[str, Any]]) -> None:
    for r, sec in enumerate(_section(main_run, "islands")):
        assert sec["failures"] == [], f"rank {r}: {sec['failures'][:5]}"
        assert sec["graphs"] == 1 and sec["replays"] == 6 and sec["fallbacks"] == {}, sec
        assert sec["segments"] == 2 and sec["islands"] == 1, sec
        assert sec["captured"] >= 1, sec  # the segment's all-reduce is the custom kernel, captured
        assert sec["eager_custom"] >= 8, sec  # the island's ran eagerly on every call (and verify's reference)


@needs_gpu
def test_compiled_step_breaks_at_the_swapped_all_reduce(main_run: list[dict[str, Any]]) -> None:
    """tracer="compile": torch.compile cannot trace into the swap, breaks the graph there, and the
    custom kernel is captured between the compiled parts (not rewritten into a functional collective)."""
    for r, sec in enumerate(_section(main_run, "compile")):
        assert sec["failures"] == [], f"rank {r}: {sec['failures'][:5]}"
        assert sec["captured"] >= 1 and sec["fn_fallbacks"] == {} and sec["graphs"] == 1, sec


@needs_gpu
def test_manual_capture_with_scope_always(main_run: list[dict[str, Any]]) -> None:
    for r, sec in enumerate(_section(main_run, "manual")):
        assert sec["failures"] == [], f"rank {r}: {sec['failures'][:5]}"
        assert sec["registered"] == 2


@needs_gpu
def test_ten_thousand_replays_stay_right(main_run: list[dict[str, Any]]) -> None:
    for r, sec in enumerate(_section(main_run, "replays")):
        assert sec["replays"] == 10_000
        assert sec["wrong_elements"] == 0, f"rank {r}: {sec['wrong_elements']} wrong elements ({sec})"
        assert sec["eager_interleaved"] == 100


@needs_gpu
def test_ineligible_calls_fall_back_with_their_reason(main_run: list[dict[str, Any]]) -> None:
    for r, sec in enumerate(_section(main_run, "fallbacks")):
        assert sec["failures"] == [], f"rank {r}: {sec['failures']}"
        assert sec["reasons"] == {"oversize": "bytes > max", "misaligned": "misaligned", "float64": "dtype",
                                  "int32": "dtype", "transposed": "contiguity", "12 bytes": "bytes % 16",
                                  "max": "op", "outside": "scope"}
        if not SHARED:
            assert sec["in_graph_ok"], "an NCCL all-reduce inside a captured graph replayed wrong"


@needs_gpu
def test_c_library_bounds_checks_and_full_pointer_table(main_run: list[dict[str, Any]]) -> None:
    for r, sec in enumerate(_section(main_run, "c_api")):
        assert sec["failures"] == [], f"rank {r}: {sec['failures']}"
        assert sec["table_full_fallbacks"] == (None if SHARED else 1)


@needs_gpu
def test_tensor_parallel_mlp_graphed_equals_eager(main_run: list[dict[str, Any]]) -> None:
    for r, sec in enumerate(_section(main_run, "mlp")):
        assert sec["failures"] == [], f"rank {r}: {sec['failures']}"
        assert sec["captured"] >= 3 and sec["ranks_identical"]


@needs_gpu
def test_calls_inside_a_capture_scope_return_the_sum(main_run: list[dict[str, Any]]) -> None:
    for sec in _section(main_run, "scope"):
        assert sec["failures"] == [] and sec["eager_custom"] >= 1


@needs_gpu
def test_reset_frees_pointer_table_slots(main_run: list[dict[str, Any]]) -> None:
    for sec in _section(main_run, "reset"):
        assert sec["used_before"] > 1 and sec["used_after"] == 1
        assert sec["failures"] == []


@needs_gpu
def test_vmm_memory_falls_back_inside_graphs(vmm_run: list[dict[str, Any]]) -> None:
    for sec in _section(vmm_run, "vmm"):
        assert sec["enabled"], sec
        assert sec["failures"] == []
        assert sec["vmm_fallbacks"] >= 1 and sec["eager_custom"] >= 1


# ================================================================================================
# the worker
# ================================================================================================
class Worker:
    """One rank: NCCL group (gloo in shared mode), graphjit collectives, helpers shared by the sections."""

    def __init__(self, rank: int, port: int) -> None:
        import torch
        import torch.distributed as dist

        self.torch, self.dist, self.rank = torch, dist, rank
        self.shared = os.environ.get("GJ_AR_TEST_SHARED") == "1"
        device = 0 if self.shared else rank
        torch.cuda.set_device(device)
        self.device = torch.device("cuda", device)
        dist.init_process_group("gloo" if self.shared else "nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=WORLD)
        import graphjit
        from graphjit import collectives, scope
        from graphjit.collectives import swap

        self.graphjit, self.collectives, self.scope = graphjit, collectives, scope
        self.report = collectives.init(max_bytes=MAX_BYTES, timeout_s=120, backend="torch")
        self.nccl = swap.original("torch")  # the framework's own all_reduce, unwrapped (gloo in shared mode)
        self.sub: Any = None

    # -- helpers ---------------------------------------------------------------------------------
    def env(self, **values: str) -> None:
        for k, v in values.items():
            os.environ[k] = v
        self.graphjit.refresh_env()

    def stats(self) -> dict[str, Any]:
        return self.collectives.stats()

    def gather(self, t: Any) -> list[Any]:
        out = [self.torch.empty_like(t) for _ in range(WORLD)]
        self.dist.all_gather(out, t.contiguous())
        return out

    def same_bits(self, t: Any) -> bool:
        parts = self.gather(t)
        return all(self.torch.equal(parts[0].view(self.torch.uint8), p.view(self.torch.uint8)) for p in parts[1:])

    def custom(self, t: Any, group: Any = None) -> Any:
        """An all_reduce call inside a graphed-call scope: the custom kernel's eager path."""
        with self.scope.graphed_call("warmup"):
            return self.dist.all_reduce(t, group=group)

    def ulp(self, ref: Any, dtype: Any) -> Any:
        torch = self.torch
        mant, emin, tiny = (10, -14, 2.0 ** -24) if dtype == torch.float16 else (7, -126, 2.0 ** -133)
        a = ref.abs()
        e = torch.floor(torch.log2(torch.where(a > 0, a, torch.ones_like(a)))).clamp(min=emin)
        return torch.where(a > 0, torch.pow(2.0, e - mant), torch.full_like(a, tiny))

    # -- sections --------------------------------------------------------------------------------
    def section_init(self) -> dict[str, Any]:
        return {"report": self.report.as_dict(), "shared": self.shared}

    def sizes(self) -> list[int]:
        powers = [1 << k for k in range(4, MAX_BYTES.bit_length()) if (1 << k) <= MAX_BYTES]
        odd = [16 * m for m in (3, 7, 33, 1001, 4099, 65537, MAX_BYTES // 16 - 1)]
        return sorted(set(powers + odd))

    def section_sizes(self) -> dict[str, Any]:
        torch = self.torch
        failures: list[Any] = []
        cases = custom_calls = 0
        gen = torch.Generator(device=self.device)
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            es = torch.tensor([], dtype=dtype).element_size()
            for algo in ("1shot", "2shot", "auto"):
                self.env(GRAPHJIT_AR_ALGO=algo)
                for nbytes in self.sizes():
                    n = nbytes // es
                    if dtype == torch.float32:
                        x = ((torch.arange(n, device=self.device) * 7 + self.rank * 13) % 17 - 8).to(dtype)
                    else:
                        gen.manual_seed(1000 * self.rank + nbytes)
                        x = (torch.randn(n, device=self.device, generator=gen) * 4).to(dtype)
                    ref = x.clone()
                    self.nccl(ref)
                    got = x.clone()
                    before = self.stats()["custom"]["eager"]
                    ret = self.custom(got)
                    torch.cuda.synchronize()
                    cases += 1
                    ran = self.stats()["custom"]["eager"] - before
                    custom_calls += ran
                    case = f"{dtype} {algo} {nbytes} B"
                    if ret is not None:
                        failures.append(f"{case}: returned {ret!r}, the original returns None")
                    if dtype == torch.float32:
                        if not torch.equal(got, ref):
                            bad = int((got != ref).nonzero()[0])
                            failures.append(f"{case}: differs from NCCL at {bad}: {got[bad].item()} vs "
                                            f"{ref[bad].item()}")
                    else:
                        exact = sum(p.double() for p in self.gather(x))
                        err = (got.double() - exact).abs()
                        limit = self.ulp(exact.to(dtype).double(), dtype)
                        if bool((err > limit).any()):
                            bad = int((err > limit).nonzero()[0])
                            failures.append(f"{case}: more than 1 ulp from the exact sum at {bad}: {got[bad].item()} "
                                            f"vs {exact[bad].item()}")
                    if not self.same_bits(got):
                        failures.append(f"{case}: the ranks' results differ")
        self.env(GRAPHJIT_AR_ALGO="auto")
        return {"cases": cases, "custom_calls": custom_calls, "failures": failures[:50]}

    def section_graphed(self) -> dict[str, Any]:
        torch, dist = self.torch, self.dist
        failures: list[str] = []
        fn_fallbacks: dict[str, Any] = {}
        s0 = self.stats()

        def step(x: Any) -> Any:
            y = x * 2.0
            dist.all_reduce(y)
            return y + 1.0

        total = WORLD * (WORLD + 1) // 2
        for algo, n, dtype in (("auto", 4096, torch.float32), ("2shot", 1 << 20, torch.float32),
                               ("1shot", 1 << 18, torch.bfloat16)):
            self.env(GRAPHJIT_AR_ALGO=algo)  # read at capture: the graph keeps that algorithm
            g = self.graphjit.graphed(step)
            with torch.no_grad():
                for i in range(6):
                    x = torch.full((n,), float(self.rank + 1 + i), device=self.device, dtype=dtype)
                    out = g(x)
                    want = 2.0 * (total + WORLD * i) + 1.0
                    if not bool((out == want).all()):
                        failures.append(f"{algo} {dtype} n={n} call {i}: got {out[0].item()}, want {want}")
            fn_fallbacks.update(g.stats().get("fallbacks") or {})
        self.env(GRAPHJIT_AR_ALGO="auto")
        s1 = self.stats()
        return {"failures": failures, "captured": s1["custom"]["captured"] - s0["custom"]["captured"],
                "registrations": s1["registrations"] - s0["registrations"], "fn_fallbacks": fn_fallbacks}

    def section_islands(self) -> dict[str, Any]:
        """A piecewise step: an all-reduce captured in a segment and one inside an island (eager, every call)."""
        torch, dist = self.torch, self.dist
        failures: list[str] = []
        s0 = self.stats()

        @self.graphjit.eager
        def island(y: Any) -> Any:
            z = y * 1.0
            dist.all_reduce(z)  # eager, inside a graphed call: the custom kernel's eager path
            return z + float(z[0].item() * 0.0)  # a sync: fine in an island

        def step(x: Any) -> Any:
            y = x * 2.0
            dist.all_reduce(y)  # captured in the first segment
            return island(y) + 1.0

        total = WORLD * (WORLD + 1) // 2
        g = self.graphjit.graphed(step)
        with torch.no_grad():
            for i in range(8):
                x = torch.full((4096,), float(self.rank + 1 + i), device=self.device)
                out = g(x)
                want = WORLD * 2.0 * (total + WORLD * i) + 1.0
                if not bool((out == want).all()):
                    failures.append(f"call {i}: got {out[0].item()}, want {want}")
        st = g.stats()
        s1 = self.stats()
        key = (st.get("keys") or [{}])[0]
        return {"failures": failures, "graphs": st["graphs"], "replays": st["replays"], "fallbacks": st["fallbacks"],
                "segments": key.get("segments"), "islands": key.get("islands"),
                "captured": s1["custom"]["captured"] - s0["custom"]["captured"],
                "eager_custom": s1["custom"]["eager"] - s0["custom"]["eager"]}

    def section_compile(self) -> dict[str, Any]:
        torch, dist = self.torch, self.dist
        failures: list[str] = []
        s0 = self.stats()

        def step(x: Any) -> Any:
            y = torch.sin(x) * 2.0
            dist.all_reduce(y)
            return y + 1.0

        g = self.graphjit.graphed(step, tracer="compile")
        with torch.no_grad():
            for i in range(5):
                xs = [torch.full((4096,), 0.1 * (r + 1 + i), device=self.device) for r in range(WORLD)]
                want = sum(torch.sin(x) * 2.0 for x in xs) + 1.0
                out = g(xs[self.rank])
                err = float((out - want).abs().max())
                if not err <= 1e-5:
                    failures.append(f"call {i}: max abs error {err:.3g}")
        st = g.stats()
        s1 = self.stats()
        return {"failures": failures, "graphs": st.get("graphs"), "fn_fallbacks": st.get("fallbacks") or {},
                "captured": s1["custom"]["captured"] - s0["custom"]["captured"]}

    def _ensure_sub(self) -> Any:
        if self.sub is None:
            self.sub = self.dist.new_group(list(range(WORLD)))
            rep = self.collectives.init(group=self.sub, scope="always", max_bytes=MAX_BYTES, timeout_s=120,
                                        backend="torch")
            if not rep.enabled:
                raise RuntimeError(f"second group: {rep.reason}")
        return self.sub

    def _capture(self, fn: Callable[[], None]) -> Any:
        torch = self.torch
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()  # warmup (eager custom path: scope="always")
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        return graph

    def section_manual(self) -> dict[str, Any]:
        torch, dist = self.torch, self.dist
        sub = self._ensure_sub()
        failures: list[str] = []
        small = torch.zeros(1024, device=self.device)
        large = torch.zeros(1 << 19, device=self.device)
        g1 = self._capture(lambda: dist.all_reduce(small, group=sub))
        self.env(GRAPHJIT_AR_ALGO="2shot")
        g2 = self._capture(lambda: dist.all_reduce(large, group=sub))
        self.env(GRAPHJIT_AR_ALGO="auto")
        registered = self.collectives.register_graph_buffers(sub)
        for i in range(5):
            small.fill_(float(self.rank + 1 + i))
            large.fill_(float(10 * (self.rank + 1) + i))
            g1.replay()
            g2.replay()
            torch.cuda.synchronize()
            want_small = WORLD * (WORLD + 1) / 2 + WORLD * i
            want_large = 10 * WORLD * (WORLD + 1) / 2 + WORLD * i
            if not bool((small == want_small).all()):
                failures.append(f"one-shot replay {i}: {small[0].item()} != {want_small}")
            if not bool((large == want_large).all()):
                failures.append(f"two-shot replay {i}: {large[0].item()} != {want_large}")
        self.manual_graphs = (g1, g2)
        return {"failures": failures, "registered": registered}

    def section_replays(self) -> dict[str, Any]:
        torch, dist = self.torch, self.dist
        sub = self._ensure_sub()
        n1, n2 = 16384, 1 << 19
        base1 = (torch.arange(n1, device=self.device) % 5).float()
        base2 = (torch.arange(n2, device=self.device) % 3).half()
        x1 = torch.zeros(n1, device=self.device)
        x2 = torch.zeros(n2, device=self.device, dtype=torch.float16)
        g1 = self._capture(lambda: dist.all_reduce(x1, group=sub))
        self.env(GRAPHJIT_AR_ALGO="2shot")
        g2 = self._capture(lambda: dist.all_reduce(x2, group=sub))
        self.env(GRAPHJIT_AR_ALGO="auto")
        self.collectives.register_graph_buffers(sub)
        total = WORLD * (WORLD + 1) // 2
        wrong = torch.zeros((), dtype=torch.int64, device=self.device)
        z = torch.zeros(1024, device=self.device)
        eager = 0
        for i in range(10_000):
            c1, c2 = float(i % 97 + 1), float(i % 31 + 1)
            x1.copy_(base1).mul_(c1 * (self.rank + 1))
            x2.copy_(base2).mul_(c2 * (self.rank + 1))
            g1.replay()
            g2.replay()
            wrong += (x1 != base1 * (c1 * total)).sum() + (x2 != base2 * (c2 * total)).sum()
            if i % 100 == 0:
                z.fill_(float(self.rank + 1 + i))
                dist.all_reduce(z, group=sub)  # scope="always": the eager custom path between replays
                wrong += (z != float(total + WORLD * i)).sum()
                eager += 1
        torch.cuda.synchronize()
        return {"replays": 10_000, "wrong_elements": int(wrong.item()), "eager_interleaved": eager}

    def section_fallbacks(self) -> dict[str, Any]:
        torch, dist = self.torch, self.dist
        failures: list[str] = []
        reasons: dict[str, str] = {}
        total = WORLD * (WORLD + 1) // 2
        big = torch.full((1025,), float(self.rank + 1), device=self.device)
        cases = {
            "oversize": lambda: torch.full((MAX_BYTES // 4 + 4,), float(self.rank + 1), device=self.device),
            "misaligned": lambda: big[1:],
            "float64": lambda: torch.full((64,), float(self.rank + 1), device=self.device, dtype=torch.float64),
            "int32": lambda: torch.full((64,), self.rank + 1, device=self.device, dtype=torch.int32),
            "transposed": lambda: torch.full((64, 32), float(self.rank + 1), device=self.device).t(),  # NCCL refuses
            "12 bytes": lambda: torch.full((3,), float(self.rank + 1), device=self.device),
        }
        for name, make in [*cases.items(), ("max", None), ("outside", None)]:
            before = dict(self.stats()["fallbacks"])
            eager_before = self.stats()["custom"]["eager"]
            if name == "max":
                t = torch.full((64,), float(self.rank + 1), device=self.device)
                self.custom_op(t, dist.ReduceOp.MAX)
                want = float(WORLD)
            elif name == "outside":
                t = torch.full((64,), float(self.rank + 1), device=self.device)
                dist.all_reduce(t)  # no graphed call, default group (scope="graphed")
                want = float(total)
            else:
                t = make()
                want = float(total)
                try:
                    self.custom(t)
                except Exception as exc:  # the original's own error (NCCL refuses non-contiguous tensors)
                    try:
                        self.nccl(make())
                        failures.append(f"{name}: raised {exc!r}, the original did not")
                    except Exception as original_exc:
                        if type(original_exc) is not type(exc):
                            failures.append(f"{name}: raised {exc!r}, the original {original_exc!r}")
                    t = None
            torch.cuda.synchronize()
            after = self.stats()["fallbacks"]
            changed = [k for k in after if after[k] != before.get(k, 0)]
            reasons[name] = changed[0] if len(changed) == 1 else f"changed: {changed}"
            if self.stats()["custom"]["eager"] != eager_before:
                failures.append(f"{name}: ran the custom kernel")
            if t is not None and not bool((t == want).all()):
                failures.append(f"{name}: wrong result {t.flatten()[0].item()} (want {want})")
        if self.shared:  # gloo cannot run inside a captured graph
            return {"failures": failures, "reasons": reasons, "in_graph_ok": None}

        # an ineligible all-reduce inside a graphed step: NCCL is captured in the graph, replays are right
        def step(x: Any) -> Any:
            y = x.double() * 2.0
            dist.all_reduce(y)
            return y

        g = self.graphjit.graphed(step)
        in_graph_ok = True
        for i in range(4):
            out = g(torch.full((256,), float(self.rank + 1 + i), device=self.device))
            in_graph_ok &= bool((out == 2.0 * (total + WORLD * i)).all())
        in_graph_ok &= not g.stats().get("fallbacks")
        return {"failures": failures, "reasons": reasons, "in_graph_ok": in_graph_ok}

    def section_c_api(self) -> dict[str, Any]:
        """The C library's own checks (bypassing Python's), and a full pointer table."""
        torch, dist = self.torch, self.dist
        from graphjit.collectives import custom_ar, library

        failures: list[str] = []
        comm = next(c for c in custom_ar.communicators() if c.scope == "graphed")
        lib, ctx = comm.lib, comm.ctx
        stream = torch.cuda.current_stream().cuda_stream
        big = torch.zeros(MAX_BYTES // 4 + 8, device=self.device)
        p = big.data_ptr()
        checks = [
            ("larger than the buffers", (p, p, MAX_BYTES // 4 + 4, 0, 0), library.ERR_BOUNDS, "exceed"),
            ("misaligned", (p + 4, p + 4, 1024, 0, 0), library.ERR_UNSUPPORTED, "aligned"),
            ("dtype code 7", (p, p, 1024, 7, 0), library.ERR_UNSUPPORTED, "dtype code 7"),
            ("algorithm code 9", (p, p, 1024, 0, 9), library.ERR_ARGUMENT, "algorithm code 9"),
            ("overlap", (p, p + 16, 1024, 0, 0), library.ERR_ARGUMENT, "overlap"),
            ("no elements", (p, p, 0, 0, 0), library.ERR_ARGUMENT, "numel 0"),
            ("12 bytes", (p, p, 3, 0, 0), library.ERR_UNSUPPORTED, "multiple of 16"),
        ]
        for name, (src, dst, numel, dtype, algo), code, words in checks:
            try:
                lib.all_reduce(ctx, src, dst, numel, dtype, algo, stream)
                failures.append(f"{name}: accepted")
            except library.CollectiveError as exc:
                if exc.code != code or words not in str(exc):
                    failures.append(f"{name}: {exc} (code {exc.code}, want {code} and {words!r})")
        torch.cuda.synchronize()

        # a group whose pointer table has one slot for captured all-reduces
        tiny = dist.new_group(list(range(WORLD)))
        rep = self.collectives.init(group=tiny, scope="always", max_bytes=1 << 16, pointer_slots=2, timeout_s=120,
                                    backend="torch")
        if not rep.enabled:
            return {"failures": [f"third group: {rep.reason}"]}
        tcomm = next(c for c in custom_ar.communicators() if c.pointer_slots == 2)
        x = torch.zeros(1024, device=self.device)
        codes = []
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):  # C level: the second capture of a full table is refused
            s = torch.cuda.current_stream().cuda_stream
            for _ in range(2):
                try:
                    tcomm.lib.all_reduce(tcomm.ctx, x.data_ptr(), x.data_ptr(), 1024, 0, 0, s)
                    codes.append(0)
                except library.CollectiveError as exc:
                    codes.append(exc.code)
        del graph  # never replayed: its slot is never registered
        tcomm.lib.drop_pending(tcomm.ctx, tcomm.lib.pending(tcomm.ctx))
        tcomm.lib.reset(tcomm.ctx)
        if codes != [0, library.ERR_TABLE_FULL]:
            failures.append(f"full table: codes {codes}")
        if self.shared:  # the fallback below runs the framework's collective inside a graph: not gloo
            return {"failures": failures, "table_full_fallbacks": None}
        # Python level: the second captured call falls back to NCCL inside the graph, both are right
        a = torch.zeros(1024, device=self.device)
        b = torch.zeros(1024, device=self.device)
        before = self.stats()["fallbacks"].get("pointer table full", 0)

        def two() -> None:
            dist.all_reduce(a, group=tiny)
            dist.all_reduce(b, group=tiny)

        g = self._capture(two)
        self.collectives.register_graph_buffers(tiny)
        total = WORLD * (WORLD + 1) / 2
        for i in range(3):
            a.fill_(float(self.rank + 1 + i))
            b.fill_(float(self.rank + 2 + i))
            g.replay()
            torch.cuda.synchronize()
            if not (bool((a == total + WORLD * i).all()) and bool((b == total + WORLD * (i + 1)).all())):
                failures.append(f"full table, replay {i}: {a[0].item()}, {b[0].item()}")
        table_full = self.stats()["fallbacks"].get("pointer table full", 0) - before
        return {"failures": failures, "table_full_fallbacks": table_full}

    def custom_op(self, t: Any, op: Any) -> None:
        with self.scope.graphed_call("warmup"):
            self.dist.all_reduce(t, op=op)

    def section_mlp(self) -> dict[str, Any]:
        torch, dist = self.torch, self.dist
        failures: list[str] = []
        hidden, ffn = 1024, 6144  # ffn divides by 2, 4, 6 and 8
        gen = torch.Generator(device=self.device)
        gen.manual_seed(1234)
        w1 = torch.randn(hidden, ffn, device=self.device, generator=gen) / hidden ** 0.5
        w2 = torch.randn(ffn, hidden, device=self.device, generator=gen) / ffn ** 0.5
        shard = ffn // WORLD
        w1_r = w1[:, self.rank * shard:(self.rank + 1) * shard].contiguous()
        w2_r = w2[self.rank * shard:(self.rank + 1) * shard].contiguous()
        s0 = self.stats()["custom"]["captured"]
        identical = True
        def make_step(a: Any, b: Any) -> Callable[[Any], Any]:
            def step(x: Any) -> Any:  # column-parallel, then row-parallel, then the all-reduce
                y = torch.nn.functional.silu(x @ a) @ b
                dist.all_reduce(y)
                return y
            return step

        for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
            step = make_step(w1_r.to(dtype), w2_r.to(dtype))
            g = self.graphjit.graphed(step)
            with torch.no_grad():
                for batch in (1, 8, 64):
                    for k in range(3):
                        gen.manual_seed(100 * batch + k)
                        x = torch.randn(batch, hidden, device=self.device, generator=gen).to(dtype)
                        want = step(x)  # eager: NCCL (outside a graphed call)
                        got = g(x)
                        err = float((got.float() - want.float()).norm() / want.float().norm())
                        if not err <= tol:
                            failures.append(f"{dtype} batch {batch} call {k}: relative error {err:.3g}")
                        identical &= self.same_bits(got)
            if g.stats().get("fallbacks"):
                failures.append(f"{dtype}: fallbacks {g.stats()['fallbacks']}")
        return {"failures": failures, "captured": self.stats()["custom"]["captured"] - s0,
                "ranks_identical": identical}

    def section_scope(self) -> dict[str, Any]:
        torch, dist = self.torch, self.dist
        failures: list[str] = []
        total = WORLD * (WORLD + 1) // 2
        before = self.stats()["custom"]["eager"]
        with self.graphjit.capture_scope(progress=False):
            z = torch.full((4096,), float(self.rank + 1), device=self.device)
            dist.all_reduce(z)  # collective mode "graphed": the eager custom path, never stale memory
            torch.cuda.synchronize()
            if not bool((z == total).all()):
                failures.append(f"inside capture_scope: {z[0].item()} != {total}")
        return {"failures": failures, "eager_custom": self.stats()["custom"]["eager"] - before}

    def section_reset(self) -> dict[str, Any]:
        torch, dist = self.torch, self.dist
        from graphjit.collectives import custom_ar

        failures: list[str] = []
        sub = self._ensure_sub()
        comm = custom_ar._targets(sub)[0]
        used_before = comm.lib.slots(comm.ctx)[0]
        torch.cuda.synchronize()
        self.collectives.reset(sub)
        used_after = comm.lib.slots(comm.ctx)[0]
        x = torch.zeros(2048, device=self.device)
        g = self._capture(lambda: dist.all_reduce(x, group=sub))
        self.collectives.register_graph_buffers(sub)
        for i in range(3):
            x.fill_(float(self.rank + 1 + i))
            g.replay()
            torch.cuda.synchronize()
            want = WORLD * (WORLD + 1) / 2 + WORLD * i
            if not bool((x == want).all()):
                failures.append(f"after reset, replay {i}: {x[0].item()} != {want}")
        return {"used_before": used_before, "used_after": used_after, "failures": failures}

    def section_vmm(self) -> dict[str, Any]:
        torch, dist = self.torch, self.dist
        failures: list[str] = []
        total = WORLD * (WORLD + 1) // 2
        s0 = self.stats()
        z = torch.full((4096,), float(self.rank + 1), device=self.device)
        self.custom(z)  # eager: through the staging buffer (cudaMalloc memory), fine with VMM inputs
        torch.cuda.synchronize()
        if not bool((z == total).all()):
            failures.append(f"eager: {z[0].item()} != {total}")

        def step(x: Any) -> Any:
            y = x * 2.0
            dist.all_reduce(y)
            return y

        g = self.graphjit.graphed(step)
        for i in range(4):
            out = g(torch.full((1024,), float(self.rank + 1 + i), device=self.device))
            if not bool((out == 2.0 * (total + WORLD * i)).all()):
                failures.append(f"graphed call {i}: {out[0].item()}")
        s1 = self.stats()
        return {"enabled": self.report.enabled, "failures": failures,
                "vmm_fallbacks": s1["fallbacks"].get("VMM memory", 0) - s0["fallbacks"].get("VMM memory", 0),
                "eager_custom": s1["custom"]["eager"] - s0["custom"]["eager"]}


SECTIONS = {
    "main": ["init", "sizes", "graphed", "islands", "compile", "manual", "replays", "fallbacks", "c_api", "mlp",
             "scope", "reset"],
    "vmm": ["init", "vmm"],
}


def _worker(argv: list[str]) -> None:
    rank, port, out, mode = int(argv[0]), int(argv[1]), Path(argv[2]), argv[3]
    multiproc.run_worker(lambda: Worker(rank, port), SECTIONS[mode], out, enabled=lambda w: w.report.enabled)


if __name__ == "__main__":
    _worker(sys.argv[1:])
