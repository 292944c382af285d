"""graphjit doctor: the custom all-reduce in a 2-process group, one process per GPU, against NCCL.

Run as ranks 0 and 1 by :func:`graphjit.doctor.allreduce.run_ar_pair`::

    python -m graphjit.backends.torch_doctor_ar RANK PORT OUT DEVICE(cuda|shared|cpu) TIMEOUT

"shared": both ranks on GPU 0 in a gloo group (GRAPHJIT_AR_SHARED_GPU=1, a test mode), against gloo.  "cpu"
(tests of this script) runs the same steps in a gloo group, where collectives.init turns the custom
all-reduce off and every call runs the framework's own.

Each rank writes its result as JSON to OUT (atomically, after every stage, so that a hang or a crash still
leaves where it stopped): ``stage``, ``done``, ``init_s``, ``report`` (:func:`graphjit.collectives.init`'s),
``cases`` (one per eager size, dtype and algorithm, and per graphed step: max abs diff against the
framework's own all-reduce, the tolerance, whether the custom kernel ran), ``fallbacks``, ``reasons``; or
``error`` and ``traceback``.  It ends with ``os._exit``: no interpreter teardown.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any, NoReturn, cast

from ..doctor.allreduce import AR_GRAPHED, AR_MAX_BYTES, AR_SIZES

SIZES, GRAPHED, MAX_BYTES = AR_SIZES, AR_GRAPHED, AR_MAX_BYTES


def main(argv: list[str]) -> NoReturn:
    """Run rank ``argv[0]`` of the check (RANK PORT OUT DEVICE TIMEOUT); never returns."""
    rank, port, out, kind, timeout = int(argv[0]), int(argv[1]), argv[2], argv[3], float(argv[4])
    result: dict[str, Any] = {"rank": rank, "stage": "import torch", "cases": [], "done": False}

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
        import torch
        import torch.distributed as dist

        gpu = kind in ("cuda", "shared")
        index = 0 if kind == "shared" else rank
        if gpu:
            torch.cuda.set_device(index)
        dev = torch.device("cuda", index) if gpu else torch.device("cpu")
        sync: Callable[[], None] = torch.cuda.synchronize if gpu else (lambda: None)
        backend = "nccl" if kind == "cuda" else "gloo"
        result["stage"] = f"{backend.upper() if backend == 'nccl' else backend} group"
        save()
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=2, timeout=timedelta(seconds=timeout))
        import graphjit
        from graphjit import collectives, scope
        from graphjit.collectives import swap

        result["stage"] = "collectives.init"
        save()
        t0 = time.perf_counter()
        report = collectives.init(max_bytes=MAX_BYTES, timeout_s=min(60.0, timeout), backend="torch")
        result["init_s"] = round(time.perf_counter() - t0, 2)
        result["report"] = report.as_dict()
        save()
        if gpu and not report.enabled:
            result["done"] = True
            finish(0)
        nccl = swap.original("torch")  # the framework's own all_reduce (NCCL; gloo in the shared mode), unwrapped
        user_algo = graphjit.env.settings().ar_algo  # GRAPHJIT_AR_ALGO, restored after the eager cases

        def set_algo(algo: str) -> None:
            os.environ.update(GRAPHJIT_AR_ALGO=algo)
            graphjit.refresh_env()

        def compare(case: dict[str, Any], got: Any, ref: Any) -> None:
            diff = float((got.double() - ref.double()).abs().max())
            scale = float(ref.double().abs().max())
            case["max_abs_diff"] = max(case.get("max_abs_diff", 0.0), diff)
            case["max_abs"] = max(case.get("max_abs", 0.0), scale)
            case["tol"] = float(torch.finfo(got.dtype).eps) * case["max_abs"]  # one ulp of the largest value

        def custom_count(what: str) -> int:
            return collectives.stats()["custom"][what]

        result["stage"] = "eager all-reduces"
        for name in ("float32", "float16", "bfloat16"):
            dtype = getattr(torch, name)
            size = torch.empty((), dtype=dtype).element_size()
            for algo in ("1shot", "2shot"):
                set_algo(algo)
                for nbytes in SIZES:
                    g = torch.Generator(device=dev)
                    g.manual_seed(1000 * rank + nbytes)
                    x = torch.randn(nbytes // size, generator=g, device=dev).to(dtype)
                    ref = x.clone()
                    nccl(ref)
                    got = x.clone()
                    before = custom_count("eager")
                    with scope.graphed_call("warmup"):  # inside a graphed call: the custom kernel's eager path
                        dist.all_reduce(got)
                    sync()
                    case: dict[str, Any] = {"mode": "eager", "dtype": name, "algo": algo, "bytes": nbytes,
                                            "calls": 1, "custom": custom_count("eager") - before == 1}
                    compare(case, got, ref)
                    result["cases"].append(case)
        set_algo(user_algo)
        result["stage"] = "graphed steps"
        save()

        def step(x: Any) -> Any:
            y = x * 2.0
            dist.all_reduce(y)
            return y + 1.0

        for name, numel in GRAPHED:
            dtype = getattr(torch, name)
            fn = cast(graphjit.GraphedFunction, graphjit.graphed(step))
            before = custom_count("captured")
            g = torch.Generator(device=dev)
            g.manual_seed(7 + rank)
            case = {"mode": "graphed", "dtype": name, "algo": user_algo,
                    "bytes": numel * torch.empty((), dtype=dtype).element_size(), "calls": 4}
            with torch.no_grad():
                for _ in range(case["calls"]):
                    x = torch.randn(numel, generator=g, device=dev).to(dtype)
                    got = fn(x).clone()
                    ref = x * 2.0
                    nccl(ref)
                    ref = ref + 1.0
                    sync()
                    compare(case, got, ref)
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
