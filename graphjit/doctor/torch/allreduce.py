"""graphjit doctor: the custom all-reduce in a 2-process group, one process per GPU, against NCCL.

Run as ranks 0 and 1 by :func:`graphjit.doctor.allreduce.run_ar_pair`::

    python -m graphjit.doctor.torch.allreduce RANK PORT OUT DEVICE(cuda|shared|cpu) TIMEOUT

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

import sys
from collections.abc import Callable
from datetime import timedelta
from typing import Any, NoReturn, cast

from ..allreduce import AR_GRAPHED, AR_SIZES
from ..ar_probe import ProbeRun, close_graphed_case, custom_calls, placement, record_diff, set_algo


def main(argv: list[str]) -> NoReturn:
    """Run rank ``argv[0]`` of the check (RANK PORT OUT DEVICE TIMEOUT); never returns."""
    rank, port, out, kind, timeout = int(argv[0]), int(argv[1]), argv[2], argv[3], float(argv[4])
    ProbeRun(rank, out, "import torch").run(lambda probe: _check(probe, rank, port, kind, timeout))


def _check(probe: ProbeRun, rank: int, port: int, kind: str, timeout: float) -> None:
    import torch
    import torch.distributed as dist

    result = probe.result
    gpu, index, backend = placement(kind, rank)
    if gpu:
        torch.cuda.set_device(index)
    dev = torch.device("cuda", index) if gpu else torch.device("cpu")
    sync: Callable[[], None] = torch.cuda.synchronize if gpu else (lambda: None)
    probe.stage_group(backend)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2, timeout=timedelta(seconds=timeout))
    import graphjit
    from graphjit import collectives, scope
    from graphjit.collectives import swap

    probe.init_collectives(collectives, "torch", timeout, gpu)
    nccl = swap.original("torch")  # the framework's own all_reduce (NCCL; gloo in the shared mode), unwrapped
    user_algo = graphjit.env.settings().ar_algo  # GRAPHJIT_AR_ALGO, restored after the eager cases

    def compare(case: dict[str, Any], got: Any, ref: Any) -> None:
        record_diff(case, float((got.double() - ref.double()).abs().max()), float(ref.double().abs().max()),
                    float(torch.finfo(got.dtype).eps))

    probe.stage("eager all-reduces")
    for name in ("float32", "float16", "bfloat16"):
        dtype = getattr(torch, name)
        size = torch.empty((), dtype=dtype).element_size()
        for algo in ("1shot", "2shot"):
            set_algo(algo)
            for nbytes in AR_SIZES:
                g = torch.Generator(device=dev)
                g.manual_seed(1000 * rank + nbytes)
                x = torch.randn(nbytes // size, generator=g, device=dev).to(dtype)
                ref = x.clone()
                nccl(ref)
                got = x.clone()
                before = custom_calls(collectives, "eager")
                with scope.graphed_call("warmup"):  # inside a graphed call: the custom kernel's eager path
                    dist.all_reduce(got)
                sync()
                case: dict[str, Any] = {"mode": "eager", "dtype": name, "algo": algo, "bytes": nbytes,
                                        "calls": 1, "custom": custom_calls(collectives, "eager") - before == 1}
                compare(case, got, ref)
                result["cases"].append(case)
    set_algo(user_algo)
    probe.stage("graphed steps")

    def step(x: Any) -> Any:
        y = x * 2.0
        dist.all_reduce(y)
        return y + 1.0

    for name, numel in AR_GRAPHED:
        dtype = getattr(torch, name)
        fn = cast(graphjit.GraphedFunction, graphjit.graphed(step))
        before = custom_calls(collectives, "captured")
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
        result["cases"].append(close_graphed_case(case, fn.stats(), custom_calls(collectives, "captured") - before))
    probe.done(collectives.stats())


if __name__ == "__main__":
    main(sys.argv[1:])
