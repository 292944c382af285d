"""The custom all-reduce with Paddle on 2 GPUs (paddle.distributed, NCCL): the swap, SOT, graphs.

Run on the GPU machine through the Paddle GPU kit (Python 3.11, paddlepaddle-gpu 2.6.2):
``. /tmp/pdc/env.sh; PYTHONPATH=. $PY311 -m pytest -q tests/test_gpu_collectives_paddle.py``.

* **2 GPUs**: one process per GPU in one NCCL group; NCCL's result is the reference.
* **1 GPU** (shared mode): both processes on GPU 0 with ``GRAPHJIT_AR_SHARED_GPU=1`` and a gloo
  group (``PADDLE_DISTRI_BACKEND=gloo``; NCCL refuses two ranks on one GPU).  The custom kernel runs
  across the two processes through CUDA IPC exactly as across GPUs (its kernels time-sliced), so
  everything but the NCCL comparison is checked; the reference is numpy's exact sum (the float32
  inputs are small integers, so NCCL's result is that sum too).  ``fallbacks`` is skipped there:
  Paddle's gloo takes host tensors only, and a fallback hands it the caller's GPU tensor.

That Paddle has no Hopper code for most kernels (on an H200 only matmul, copies and NCCL compute
right), so the workers build every input with numpy, use only ``paddle.matmul``, copies and
all-reduces, and check every result with numpy.  float32 and float16 (numpy has no bfloat16).

Every check runs in two worker processes (this file run as a script); a session fixture runs them
once and the tests read their sections:

* ``init``: the custom all-reduce is enabled for the Paddle group.
* ``sizes``: 16 B to max_bytes (powers of two and odd multiples of 16), float32 and float16,
  one-shot, two-shot and auto, eager inside a graphed-call scope: every call ran the custom
  kernel, returned a completed task, float32 (integer-valued) is bitwise NCCL's result (numpy's
  exact sum in shared mode), float16
  is within one ulp of the exact sum, and both ranks hold the same bits.
* ``sot``: a ``graphjit.graphed`` step traced by SOT (matmul, ``paddle.distributed.all_reduce``,
  matmul): SOT breaks the graph at the all-reduce, graphjit captures the custom kernel, replays on
  new inputs equal numpy's result.
* ``replays``: 2,000 calls of a graphed copy + all-reduce step with new inputs, all exact.
* ``fallbacks``: float64, op MAX, a size not a multiple of 16 and a call outside any graphed
  call go to Paddle's collective, counted under their reasons, with the right results.
* ``mlp``: a tensor-parallel MLP (column- then row-parallel matmuls, one all-reduce) graphed
  equals numpy's full-weight result on every rank.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import multiproc  # noqa: E402  (tests/multiproc.py: this file also runs as a worker script)

pytestmark = [pytest.mark.gpu, pytest.mark.paddle]

WORLD = 2
MAX_BYTES = 8 << 20
WORKER_TIMEOUT_S = 420  # below the proof script's own timeout, so the ranks' logs get printed
TF32 = 5e-3  # cuBLAS may use TF32 for float32 matmul


def _gpus() -> int:
    try:
        import paddle
    except ImportError:
        return 0
    if not paddle.is_compiled_with_cuda():
        return 0
    return int(paddle.device.cuda.device_count())


SHARED = _gpus() == 1  # both ranks on GPU 0 (see the module docstring)
needs_gpus = pytest.mark.skipif(_gpus() < 1, reason="needs Paddle with a CUDA GPU")


@pytest.fixture(scope="session")
def paddle_run(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    if _gpus() < 1:
        pytest.skip("needs Paddle with a CUDA GPU")
    out_dir = Path(os.environ.get("GJ_PADDLE_AR_OUT") or tmp_path_factory.mktemp("gpu-collectives-paddle"))
    out_dir.mkdir(parents=True, exist_ok=True)
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("GRAPHJIT_", "PADDLE_", "FLAGS_selected"))}
    environ["PYTHONPATH"] = str(ROOT) + os.pathsep + environ.get("PYTHONPATH", "")
    environ["GRAPHJIT_CACHE_DIR"] = os.environ.get("GRAPHJIT_CACHE_DIR", str(out_dir / "cache"))
    environ.setdefault("MIN_GRAPH_SIZE", "0")
    if SHARED:
        environ.update(GRAPHJIT_AR_SHARED_GPU="1", GJ_AR_TEST_SHARED="1", PADDLE_DISTRI_BACKEND="gloo")
    environ["GJ_PADDLE_PORTS"] = ",".join(str(multiproc.free_port()) for _ in range(WORLD + 1))  # trainers, master
    return multiproc.launch(Path(__file__), WORLD, "paddle", out_dir, environ, WORKER_TIMEOUT_S)


_section = multiproc.section


@needs_gpus
def test_init_enables_the_custom_all_reduce(paddle_run: list[dict[str, Any]]) -> None:
    for r, sec in enumerate(_section(paddle_run, "init")):
        report = sec["report"]
        assert report["enabled"], f"rank {r}: {report['reason']}"
        assert report["backend"] == "paddle" and report["rank"] == r and report["device"] == (0 if SHARED else r)
        assert sec["shared"] == SHARED


@needs_gpus
def test_sizes_and_dtypes_match_nccl(paddle_run: list[dict[str, Any]]) -> None:
    for r, sec in enumerate(_section(paddle_run, "sizes")):
        assert sec["cases"] >= 2 * 3 * 20, sec["cases"]
        assert sec["failures"] == [], f"rank {r}: {sec['failures'][:5]}"
        assert sec["custom_calls"] == sec["cases"]


@needs_gpus
def test_sot_step_with_all_reduce_is_captured_and_replayed(paddle_run: list[dict[str, Any]]) -> None:
    for r, sec in enumerate(_section(paddle_run, "sot")):
        assert sec["failures"] == [], f"rank {r}: {sec['failures']}"
        assert sec["captured"] >= 1 and sec["registrations"] >= 1 and sec["graphs"] == 1, sec
        assert sec["fn_fallbacks"] == {}, sec["fn_fallbacks"]


@needs_gpus
def test_replays_stay_right(paddle_run: list[dict[str, Any]]) -> None:
    for r, sec in enumerate(_section(paddle_run, "replays")):
        assert sec["calls"] == 2000 and sec["wrong"] == 0, f"rank {r}: {sec}"
        assert sec["captured"] >= 1 and sec["fn_fallbacks"] == {}


@needs_gpus
def test_ineligible_calls_fall_back_with_their_reason(paddle_run: list[dict[str, Any]]) -> None:
    if SHARED:
        pytest.skip("shared mode: a fallback would hand Paddle's gloo (host tensors only) a GPU tensor")
    for r, sec in enumerate(_section(paddle_run, "fallbacks")):
        assert sec["failures"] == [], f"rank {r}: {sec['failures']}"
        assert sec["reasons"] == {"float64": "dtype", "max": "op", "12 bytes": "bytes % 16", "outside": "scope"}


@needs_gpus
def test_tensor_parallel_mlp_graphed_equals_numpy(paddle_run: list[dict[str, Any]]) -> None:
    for r, sec in enumerate(_section(paddle_run, "mlp")):
        assert sec["failures"] == [], f"rank {r}: {sec['failures']}"
        assert sec["captured"] >= 1 and sec["ranks_identical"]


# ================================================================================================
# the worker (Paddle 2.6 on Hopper: numpy in, matmul/copy/all-reduce only, numpy out)
# ================================================================================================
def _ulp16(x: np.ndarray) -> np.ndarray:
    a = np.abs(x.astype(np.float64))
    e = np.floor(np.log2(np.where(a > 0, a, 1.0))).clip(min=-14)
    return np.where(a > 0, 2.0 ** (e - 10), 2.0 ** -24)


class Worker:
    def __init__(self, rank: int, port: int) -> None:
        ports = [int(p) for p in os.environ["GJ_PADDLE_PORTS"].split(",")]  # one per trainer, then the master's
        os.environ.update({
            "PADDLE_TRAINER_ID": str(rank), "PADDLE_TRAINERS_NUM": str(WORLD), "PADDLE_RANK_IN_NODE": str(rank),
            "PADDLE_TRAINER_ENDPOINTS": ",".join(f"127.0.0.1:{ports[i]}" for i in range(WORLD)),
            "PADDLE_CURRENT_ENDPOINT": f"127.0.0.1:{ports[rank]}", "PADDLE_MASTER": f"127.0.0.1:{ports[WORLD]}",
            "PADDLE_LOCAL_SIZE": str(WORLD)})
        self.shared = os.environ.get("GJ_AR_TEST_SHARED") == "1"
        device = 0 if self.shared else rank
        os.environ["FLAGS_selected_gpus"] = str(device)
        import paddle
        import paddle.distributed as dist

        self.paddle, self.dist, self.rank = paddle, dist, rank
        paddle.set_device(f"gpu:{device}")
        self.place = paddle.CUDAPlace(device)
        dist.init_parallel_env()
        paddle.set_device(f"gpu:{device}")  # a gloo group leaves the expected place on the CPU
        import graphjit
        from graphjit import collectives, scope
        from graphjit.collectives import swap

        self.graphjit, self.collectives, self.scope = graphjit, collectives, scope
        self.report = collectives.init(max_bytes=MAX_BYTES, timeout_s=120, backend="paddle")
        self.nccl = swap.original("paddle")

    def T(self, a: np.ndarray) -> Any:
        return self.paddle.to_tensor(np.ascontiguousarray(a), place=self.place)

    def env(self, **values: str) -> None:
        os.environ.update(values)
        self.graphjit.refresh_env()

    def stats(self) -> dict[str, Any]:
        return self.collectives.stats()

    def digest(self, a: np.ndarray) -> str:
        return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()

    def same_on_all_ranks(self, a: np.ndarray) -> bool:
        # graphjit's exchange (broadcasts and copies only): Paddle 2.6's all_gather_object runs kernels that
        # 2.6.2 lacks for Hopper
        from graphjit.backends.dist_base import load

        return len(set(load("paddle").all_gather_object(self.digest(a), None))) == 1

    def section_init(self) -> dict[str, Any]:
        return {"report": self.report.as_dict(), "shared": self.shared}

    def section_sizes(self) -> dict[str, Any]:
        failures: list[str] = []
        cases = custom_calls = 0
        powers = [1 << k for k in range(4, MAX_BYTES.bit_length()) if (1 << k) <= MAX_BYTES]
        sizes = sorted(set(powers + [16 * m for m in (3, 7, 1001, 65537, MAX_BYTES // 16 - 1)]))
        for dtype in (np.float32, np.float16):
            es = np.dtype(dtype).itemsize
            for algo in ("1shot", "2shot", "auto"):
                self.env(GRAPHJIT_AR_ALGO=algo)
                for nbytes in sizes:
                    n = nbytes // es
                    per_rank = []
                    for r in range(WORLD):  # every rank can rebuild every rank's input
                        rng = np.random.default_rng(1000 * r + nbytes)
                        if dtype == np.float32:
                            per_rank.append(rng.integers(-8, 9, n).astype(np.float32))
                        else:
                            per_rank.append((rng.standard_normal(n) * 4).astype(np.float16))
                    mine = per_rank[self.rank]
                    if self.shared:  # small integers: the exact sum is NCCL's result too
                        r_np = np.sum(per_rank, axis=0, dtype=np.float64).astype(dtype)
                    else:
                        ref = self.T(mine)
                        self.nccl(ref)
                    got = self.T(mine)
                    before = self.stats()["custom"]["eager"]
                    with self.scope.graphed_call("warmup"):
                        task = self.dist.all_reduce(got)
                    self.paddle.device.cuda.synchronize()
                    cases += 1
                    custom_calls += self.stats()["custom"]["eager"] - before
                    case = f"{np.dtype(dtype).name} {algo} {nbytes} B"
                    if task is None or not task.wait():
                        failures.append(f"{case}: returned {task!r}, not a completed task")
                    g = got.numpy()
                    if dtype == np.float32:
                        if not self.shared:
                            r_np = ref.numpy()
                        if not np.array_equal(g, r_np):
                            bad = int(np.flatnonzero(g != r_np)[0])
                            failures.append(f"{case}: differs from NCCL at {bad}: {g[bad]} vs {r_np[bad]}")
                    else:
                        exact = np.sum([p.astype(np.float64) for p in per_rank], axis=0)
                        err = np.abs(g.astype(np.float64) - exact)
                        limit = _ulp16(exact.astype(np.float16))
                        if (err > limit).any():
                            bad = int(np.flatnonzero(err > limit)[0])
                            failures.append(f"{case}: more than 1 ulp from the exact sum at {bad}: {g[bad]} vs "
                                            f"{exact[bad]}")
                    if not self.same_on_all_ranks(g):
                        failures.append(f"{case}: the ranks' results differ")
        self.env(GRAPHJIT_AR_ALGO="auto")
        return {"cases": cases, "custom_calls": custom_calls, "failures": failures[:50]}

    def section_sot(self) -> dict[str, Any]:
        paddle, dist = self.paddle, self.dist
        failures: list[str] = []
        h = 256
        rng = np.random.default_rng(7)
        w1 = (rng.standard_normal((h, h)) / np.sqrt(h)).astype(np.float32)
        w2 = (rng.standard_normal((h, h)) / np.sqrt(h)).astype(np.float32)
        W1, W2 = self.T(w1), self.T(w2)

        def step(x: Any) -> Any:
            y = paddle.matmul(x, W1)
            dist.all_reduce(y)
            return paddle.matmul(y, W2)

        s0 = self.stats()
        g = self.graphjit.graphed(step)  # tracer: Paddle's default, SOT
        with paddle.no_grad():
            for i in range(6):
                xs = [np.random.default_rng(100 * i + r).standard_normal((8, h)).astype(np.float32)
                      for r in range(WORLD)]
                got = g(self.T(xs[self.rank])).numpy()
                want = sum(x.astype(np.float64) @ w1 for x in xs) @ w2
                err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
                if not err < TF32:
                    failures.append(f"call {i}: relative error {err:.3g}")
        st = g.stats()
        s1 = self.stats()
        return {"failures": failures, "graphs": st.get("graphs"), "fn_fallbacks": st.get("fallbacks") or {},
                "captured": s1["custom"]["captured"] - s0["custom"]["captured"],
                "registrations": s1["registrations"] - s0["registrations"]}

    def section_replays(self) -> dict[str, Any]:
        paddle, dist = self.paddle, self.dist
        n = 4096

        def step(x: Any) -> Any:
            y = paddle.assign(x)
            dist.all_reduce(y)
            return y

        s0 = self.stats()
        g = self.graphjit.graphed(step, tracer="eager")
        base = (np.arange(n) % 13 - 6).astype(np.float32)
        wrong = 0
        calls = 2000
        with paddle.no_grad():
            for i in range(calls):
                c = float(i % 97 + 1)
                got = g(self.T(base * (c * (self.rank + 1)))).numpy()
                wrong += int((got != base * (c * WORLD * (WORLD + 1) / 2)).sum())
        st = g.stats()
        return {"calls": calls, "wrong": wrong, "fn_fallbacks": st.get("fallbacks") or {},
                "captured": self.stats()["custom"]["captured"] - s0["custom"]["captured"]}

    def section_fallbacks(self) -> dict[str, Any]:
        if self.shared:  # a fallback runs Paddle's collective: gloo here, which reads host memory only
            return {"skipped": "shared mode"}
        dist = self.dist
        failures: list[str] = []
        reasons: dict[str, str] = {}
        total = WORLD * (WORLD + 1) / 2
        cases = [("float64", np.full(64, self.rank + 1, np.float64), None, total),
                 ("max", np.full(64, self.rank + 1, np.float32), dist.ReduceOp.MAX, float(WORLD)),
                 ("12 bytes", np.full(3, self.rank + 1, np.float32), None, total),
                 ("outside", np.full(64, self.rank + 1, np.float32), None, total)]
        for name, arr, op, want in cases:
            before = dict(self.stats()["fallbacks"])
            eager_before = self.stats()["custom"]["eager"]
            t = self.T(arr)
            kwargs = {} if op is None else {"op": op}
            if name == "outside":
                dist.all_reduce(t, **kwargs)
            else:
                with self.scope.graphed_call("warmup"):
                    dist.all_reduce(t, **kwargs)
            self.paddle.device.cuda.synchronize()
            after = self.stats()["fallbacks"]
            changed = [k for k in after if after[k] != before.get(k, 0)]
            reasons[name] = changed[0] if len(changed) == 1 else f"changed: {changed}"
            if self.stats()["custom"]["eager"] != eager_before:
                failures.append(f"{name}: ran the custom kernel")
            if not np.all(t.numpy() == want):
                failures.append(f"{name}: wrong result {t.numpy().ravel()[0]} (want {want})")
        return {"failures": failures, "reasons": reasons}

    def section_mlp(self) -> dict[str, Any]:
        paddle, dist = self.paddle, self.dist
        failures: list[str] = []
        hidden, ffn = 512, 2048
        rng = np.random.default_rng(1234)
        w1 = (rng.standard_normal((hidden, ffn)) / np.sqrt(hidden)).astype(np.float32)
        w2 = (rng.standard_normal((ffn, hidden)) / np.sqrt(ffn)).astype(np.float32)
        shard = ffn // WORLD
        W1 = self.T(w1[:, self.rank * shard:(self.rank + 1) * shard])
        W2 = self.T(w2[self.rank * shard:(self.rank + 1) * shard])

        def step(x: Any) -> Any:  # column-parallel, then row-parallel, then the all-reduce
            y = paddle.matmul(paddle.matmul(x, W1), W2)
            dist.all_reduce(y)
            return y

        s0 = self.stats()["custom"]["captured"]
        g = self.graphjit.graphed(step)
        identical = True
        with paddle.no_grad():
            for batch in (1, 8, 64):
                for k in range(3):
                    x = np.random.default_rng(100 * batch + k).standard_normal((batch, hidden)).astype(np.float32)
                    got = g(self.T(x)).numpy()
                    want = x.astype(np.float64) @ w1 @ w2
                    err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
                    if not err < TF32:
                        failures.append(f"batch {batch} call {k}: relative error {err:.3g}")
                    identical &= self.same_on_all_ranks(got)
        if g.stats().get("fallbacks"):
            failures.append(f"fallbacks {g.stats()['fallbacks']}")
        return {"failures": failures, "captured": self.stats()["custom"]["captured"] - s0,
                "ranks_identical": identical}


SECTIONS = ["init", "sizes", "sot", "replays", "fallbacks", "mlp"]


def _worker(argv: list[str]) -> None:
    rank, port, out = int(argv[0]), int(argv[1]), Path(argv[2])
    multiproc.run_worker(lambda: Worker(rank, port), SECTIONS, out, enabled=lambda w: w.report.enabled)


if __name__ == "__main__":
    _worker(sys.argv[1:])
