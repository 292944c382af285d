"""graphjit doctor: the custom all-reduce in a 2-process Paddle group, one process per GPU, against the exact sum.

The Paddle twin of :mod:`graphjit.backends.torch_doctor_ar`, for machines without torch.  Run as ranks 0 and 1
by :func:`graphjit.doctor.allreduce.run_ar_pair`::

    python -m graphjit.backends.paddle_doctor_ar RANK PORTS OUT DEVICE(cuda|shared|cpu) TIMEOUT

PORTS: three free ports, comma-separated (rank 0's and rank 1's endpoints, then the master's).  "shared":
both ranks on GPU 0 in a gloo group (GRAPHJIT_AR_SHARED_GPU=1, a test mode), against gloo.  "cpu" (tests of
this script) runs the same steps in a gloo group on the CPU, where collectives.init turns the custom
all-reduce off and every call runs Paddle's own.

Only copies and the all-reduce run on the device, and every result is compared in numpy with the correctly
rounded sum of both ranks' inputs (each rank regenerates the other's from its seed): what the custom kernel
computes, and what NCCL computes for 2 ranks.  Paddle builds without kernels for the GPU (paddlepaddle-gpu 2.6
on Hopper) compute elementwise operations wrong but copies right, so the check stays meaningful there, and
no framework collective serves as the reference (Paddle's gloo, in the shared mode, reads host memory only).

Eager cases: float32 and float16 (numpy has no bfloat16), one-shot and two-shot, the sizes of
:data:`graphjit.doctor.allreduce.AR_SIZES`; graphed steps (``y = assign(x); all_reduce(y)``, Paddle's default
tracer) for :data:`AR_GRAPHED` (the bfloat16 step of the torch probe becomes float16).  On the CPU ("cpu")
float32 only: Paddle's gloo sums float16 on the CPU to inf (3.3.1).  The JSON result has the torch probe's
fields.  It ends with ``os._exit``: no interpreter teardown.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import Any, NoReturn, cast

import numpy as np

from ..doctor.allreduce import AR_GRAPHED, AR_MAX_BYTES, AR_SIZES

DTYPES = ("float32", "float16")


def _endpoints(rank: int, ports: list[int], backend: str) -> dict[str, str]:
    env = {"PADDLE_TRAINER_ID": str(rank), "PADDLE_TRAINERS_NUM": "2", "PADDLE_RANK_IN_NODE": str(rank),
           "PADDLE_LOCAL_SIZE": "2", "PADDLE_TRAINER_ENDPOINTS": f"127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}",
           "PADDLE_CURRENT_ENDPOINT": f"127.0.0.1:{ports[rank]}", "PADDLE_MASTER": f"127.0.0.1:{ports[2]}"}
    if backend == "gloo":
        env["PADDLE_DISTRI_BACKEND"] = "gloo"
    return env


def main(argv: list[str]) -> NoReturn:
    """Run rank ``argv[0]`` of the check (RANK PORTS OUT DEVICE TIMEOUT); never returns."""
    rank, ports, out, kind, timeout = (int(argv[0]), [int(p) for p in argv[1].split(",")], argv[2], argv[3],
                                       float(argv[4]))
    result: dict[str, Any] = {"rank": rank, "stage": "import paddle", "cases": [], "done": False}

    def save() -> None:
        with open(out + ".tmp", "w") as f:
            json.dump(result, f, default=str)
        os.replace(out + ".tmp", out)

    def finish(code: int) -> NoReturn:
        save()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # no interpreter teardown: NCCL and the IPC mappings go with the process

    try:
        gpu = kind in ("cuda", "shared")
        backend = "nccl" if kind == "cuda" else "gloo"
        index = 0 if kind == "shared" else rank
        os.environ.update(_endpoints(rank, ports, backend))
        if gpu:
            os.environ["FLAGS_selected_gpus"] = str(index)
        import paddle
        import paddle.distributed as dist

        where = f"gpu:{index}" if gpu else "cpu"
        paddle.set_device(where)
        place = paddle.CUDAPlace(index) if gpu else paddle.CPUPlace()
        result["stage"] = f"{backend.upper() if backend == 'nccl' else backend} group"
        save()
        dist.init_parallel_env()
        paddle.set_device(where)  # a gloo group leaves the expected place on the CPU
        import graphjit
        from graphjit import collectives, scope

        result["stage"] = "collectives.init"
        save()
        t0 = time.perf_counter()
        report = collectives.init(max_bytes=AR_MAX_BYTES, timeout_s=min(60.0, timeout), backend="paddle")
        result["init_s"] = round(time.perf_counter() - t0, 2)
        result["report"] = report.as_dict()
        save()
        if gpu and not report.enabled:
            result["done"] = True
            finish(0)
        user_algo = graphjit.env.settings().ar_algo  # GRAPHJIT_AR_ALGO, restored after the eager cases

        def tensor(a: np.ndarray) -> Any:
            return paddle.to_tensor(np.ascontiguousarray(a), place=place)

        def set_algo(algo: str) -> None:
            os.environ.update(GRAPHJIT_AR_ALGO=algo)
            graphjit.refresh_env()

        def compare(case: dict[str, Any], got: np.ndarray, ref: np.ndarray) -> None:
            diff = float(np.abs(got.astype(np.float64) - ref.astype(np.float64)).max())
            scale = float(np.abs(ref.astype(np.float64)).max())
            case["max_abs_diff"] = max(case.get("max_abs_diff", 0.0), diff)
            case["max_abs"] = max(case.get("max_abs", 0.0), scale)
            case["tol"] = float(np.finfo(got.dtype).eps) * case["max_abs"]  # one ulp of the largest value

        def custom_count(what: str) -> int:
            return cast(int, collectives.stats()["custom"][what])

        def sample(seed: int, numel: int, dtype: str) -> np.ndarray:
            return np.random.default_rng(seed).standard_normal(numel).astype(dtype)

        def exact_sum(parts: list[np.ndarray]) -> np.ndarray:
            """Summed in float32 in rank order, rounded once (float16 values add exactly in float32)."""
            acc = parts[0].astype(np.float32)
            for part in parts[1:]:
                acc = acc + part.astype(np.float32)
            return acc.astype(parts[0].dtype)

        dtypes = DTYPES if gpu else ("float32",)  # Paddle's gloo returns inf for float16 on the CPU
        result["stage"] = "eager all-reduces"
        for name in dtypes:
            size = np.dtype(name).itemsize
            for algo in ("1shot", "2shot"):
                set_algo(algo)
                for nbytes in AR_SIZES:
                    xs = [sample(1000 * r + nbytes, nbytes // size, name) for r in range(2)]
                    got = tensor(xs[rank])
                    before = custom_count("eager")
                    with scope.graphed_call("warmup"):  # inside a graphed call: the custom kernel's eager path
                        dist.all_reduce(got)
                    case: dict[str, Any] = {"mode": "eager", "dtype": name, "algo": algo, "bytes": nbytes,
                                            "calls": 1, "custom": custom_count("eager") - before == 1}
                    compare(case, got.numpy(), exact_sum(xs))
                    result["cases"].append(case)
        set_algo(user_algo)
        result["stage"] = "graphed steps"
        save()

        def step(x: Any) -> Any:
            y = paddle.assign(x)  # a copy: right even where Paddle lacks this GPU's elementwise kernels
            dist.all_reduce(y)
            return y

        for wanted, numel in AR_GRAPHED:
            name = wanted if wanted in dtypes else dtypes[-1]
            fn = cast(graphjit.GraphedFunction, graphjit.graphed(step))
            before = custom_count("captured")
            case = {"mode": "graphed", "dtype": name, "algo": user_algo, "bytes": numel * np.dtype(name).itemsize,
                    "calls": 4}
            with paddle.no_grad():
                for i in range(case["calls"]):
                    xs = [sample(7 + 10 * r + i, numel, name) for r in range(2)]
                    got = fn(tensor(xs[rank])).numpy()
                    compare(case, got, exact_sum(xs))
            st = fn.stats()
            case.update(graphs=st.get("graphs"), replays=st.get("replays"), fallbacks=st.get("fallbacks") or {},
                        captured=custom_count("captured") - before)
            case["custom"] = bool(case["captured"] >= 1 and case["replays"] and not case["fallbacks"])
            result["cases"].append(case)
        stats = collectives.stats()
        result["fallbacks"], result["reasons"] = stats["fallbacks"], stats["reasons"]
        result["stage"], result["done"] = "done", True
        finish(0)
    except BaseException as exc:
        lines = [line for line in str(exc).strip().splitlines() if line.strip()]
        result["error"] = (type(exc).__name__ + ": " + (lines[-1] if lines else ""))[:400]
        result["traceback"] = traceback.format_exc()[-3000:]
        finish(1)


if __name__ == "__main__":
    main(sys.argv[1:])
