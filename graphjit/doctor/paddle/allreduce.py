"""graphjit doctor: the custom all-reduce in a 2-process Paddle group, one process per GPU, against the exact sum.

The Paddle twin of :mod:`graphjit.doctor.torch.allreduce`, for machines without torch.  Run as ranks 0 and 1
by :func:`graphjit.doctor.allreduce.run_ar_pair`::

    python -m graphjit.doctor.paddle.allreduce RANK PORTS OUT DEVICE(cuda|shared|cpu) TIMEOUT

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

import os
import sys
from typing import Any, NoReturn, cast

import numpy as np

from ..allreduce import AR_GRAPHED, AR_SIZES
from ..ar_probe import ProbeRun, close_graphed_case, custom_calls, placement, record_diff, set_algo

DTYPES = ("float32", "float16")


def _endpoints(rank: int, ports: list[int], backend: str) -> dict[str, str]:
    env = {"PADDLE_TRAINER_ID": str(rank), "PADDLE_TRAINERS_NUM": "2", "PADDLE_RANK_IN_NODE": str(rank),
           "PADDLE_LOCAL_SIZE": "2", "PADDLE_TRAINER_ENDPOINTS": f"127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}",
           "PADDLE_CURRENT_ENDPOINT": f"127.0.0.1:{ports[rank]}", "PADDLE_MASTER": f"127.0.0.1:{ports[2]}"}
    if backend == "gloo":
        env["PADDLE_DISTRI_BACKEND"] = "gloo"
    return env


def _sample(seed: int, numel: int, dtype: str) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(numel).astype(dtype)


def _exact_sum(parts: list[np.ndarray]) -> np.ndarray:
    """Summed in float32 in rank order, rounded once (float16 values add exactly in float32)."""
    acc = parts[0].astype(np.float32)
    for part in parts[1:]:
        acc = acc + part.astype(np.float32)
    return acc.astype(parts[0].dtype)


def _compare(case: dict[str, Any], got: np.ndarray, want: np.ndarray) -> None:
    record_diff(case, float(np.abs(got.astype(np.float64) - want.astype(np.float64)).max()),
                float(np.abs(want.astype(np.float64)).max()), float(np.finfo(got.dtype).eps))


def main(argv: list[str]) -> NoReturn:
    """Run rank ``argv[0]`` of the check (RANK PORTS OUT DEVICE TIMEOUT); never returns."""
    rank, ports, out, kind, timeout = (int(argv[0]), [int(p) for p in argv[1].split(",")], argv[2], argv[3],
                                       float(argv[4]))
    ProbeRun(rank, out, "import paddle").run(lambda probe: _check(probe, rank, ports, kind, timeout))


def _check(probe: ProbeRun, rank: int, ports: list[int], kind: str, timeout: float) -> None:
    result = probe.result
    gpu, index, backend = placement(kind, rank)
    os.environ.update(_endpoints(rank, ports, backend))
    if gpu:
        os.environ["FLAGS_selected_gpus"] = str(index)
    import paddle
    import paddle.distributed as dist

    where = f"gpu:{index}" if gpu else "cpu"
    paddle.set_device(where)
    place = paddle.CUDAPlace(index) if gpu else paddle.CPUPlace()
    probe.stage_group(backend)
    dist.init_parallel_env()
    paddle.set_device(where)  # a gloo group leaves the expected place on the CPU
    import graphjit
    from graphjit import collectives, scope

    probe.init_collectives(collectives, "paddle", timeout, gpu)
    user_algo = graphjit.env.settings().ar_algo  # GRAPHJIT_AR_ALGO, restored after the eager cases

    def tensor(a: np.ndarray) -> Any:
        return paddle.to_tensor(np.ascontiguousarray(a), place=place)

    dtypes = DTYPES if gpu else ("float32",)  # Paddle's gloo returns inf for float16 on the CPU
    probe.stage("eager all-reduces")
    for name in dtypes:
        size = np.dtype(name).itemsize
        for algo in ("1shot", "2shot"):
            set_algo(algo)
            for nbytes in AR_SIZES:
                xs = [_sample(1000 * r + nbytes, nbytes // size, name) for r in range(2)]
                got = tensor(xs[rank])
                before = custom_calls(collectives, "eager")
                with scope.graphed_call("warmup"):  # inside a graphed call: the custom kernel's eager path
                    dist.all_reduce(got)
                case: dict[str, Any] = {"mode": "eager", "dtype": name, "algo": algo, "bytes": nbytes,
                                        "calls": 1, "custom": custom_calls(collectives, "eager") - before == 1}
                _compare(case, got.numpy(), _exact_sum(xs))
                result["cases"].append(case)
    set_algo(user_algo)
    probe.stage("graphed steps")

    def step(x: Any) -> Any:
        y = paddle.assign(x)  # a copy: right even where Paddle lacks this GPU's elementwise kernels
        dist.all_reduce(y)
        return y

    for wanted, numel in AR_GRAPHED:
        name = wanted if wanted in dtypes else dtypes[-1]
        fn = cast(graphjit.GraphedFunction, graphjit.graphed(step))
        before = custom_calls(collectives, "captured")
        case = {"mode": "graphed", "dtype": name, "algo": user_algo, "bytes": numel * np.dtype(name).itemsize,
                "calls": 4}
        with paddle.no_grad():
            for i in range(case["calls"]):
                xs = [_sample(7 + 10 * r + i, numel, name) for r in range(2)]
                _compare(case, fn(tensor(xs[rank])).numpy(), _exact_sum(xs))
        result["cases"].append(close_graphed_case(case, fn.stats(), custom_calls(collectives, "captured") - before))
    probe.done(collectives.stats())


if __name__ == "__main__":
    main(sys.argv[1:])
