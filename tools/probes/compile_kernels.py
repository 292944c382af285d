"""What a call of ``graphed(tracer="compile")`` runs on the GPU against ``torch.compile(mode="reduce-overhead")``.

Builds ``bench decode``'s step (``graphjit.bench.torch.decode``) at one size, makes both variants as the bench does,
and for each: device microseconds per call (CUDA events over back-to-back calls: ``bench.torch.timing.timed``), then
a ``torch.profiler`` trace of a few calls: every GPU kernel and memcpy/memset with its count and microseconds per
call, and the CUDA runtime calls per call. The report lists what one variant runs that the other does not, and the
kernels whose time per call differs most. Diagnostic only (issue 28's "find what reduce-overhead does per call that
graphjit does too"): the claims are made by ``python -m graphjit bench decode``.

Usage (GPU machine, repo root): ``PYTHONPATH=. python3 tools/probes/compile_kernels.py --out DIR [--layers 32]``
"""

from __future__ import annotations

import argparse
import collections
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import graphjit
from graphjit.bench.torch.decode import TorchDecodeRunner
from graphjit.bench.torch.timing import timed


def profile(call: Callable[[], Any], calls: int = 20) -> dict[str, Any]:
    """Per call: GPU events by name (count, us) and CUDA runtime calls by name (count)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof

    for _ in range(5):
        call()
    torch.cuda.synchronize()
    with prof(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    gpu: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    runtime: collections.Counter[str] = collections.Counter()
    for ev in p.events():
        kind = str(getattr(ev, "device_type", ""))
        if kind.endswith("CUDA"):
            gpu[ev.name][0] += 1
            gpu[ev.name][1] += ev.time_range.elapsed_us()
        elif ev.name.startswith("cuda") or ev.name.startswith("cu"):
            runtime[ev.name] += 1
    return {"gpu": {k: {"count": round(c / calls, 2), "us": round(t / calls, 2)} for k, (c, t) in
                    sorted(gpu.items(), key=lambda kv: -kv[1][1])},
            "runtime": {k: round(v / calls, 2) for k, v in runtime.most_common()}}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--dtype", default="bf16")
    a = p.parse_args()
    args = argparse.Namespace(dtype=a.dtype, seed=0, warmup=3, iters=100, repeats=5, host_iters=100,
                              host_repeats=3)
    runner = TorchDecodeRunner(args, on_gpu=True)
    runner.build(a.layers, a.hidden, a.batch)
    step, x = runner.step, runner.x
    res: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                           "size": {"layers": a.layers, "hidden": a.hidden, "batch": a.batch, "dtype": a.dtype},
                           "variants": {}}

    def measure(name: str, call: Callable[[], Any]) -> None:
        for _ in range(5):
            call()
        entry = res["variants"].setdefault(name, {})
        entry["device_us"] = [round(u, 2) for u in timed(True, 5, 200, call)["samples_us"]]
        entry.update(profile(call))

    # each variant made, measured and profiled before the next resets Dynamo
    torch._dynamo.reset()
    ro = torch.compile(step, mode="reduce-overhead")

    def ro_call() -> Any:
        torch.compiler.cudagraph_mark_step_begin()
        return ro(x)

    measure("reduce_overhead", ro_call)
    for name, opts in (("graphed_compile", {"tracer": "compile"}),
                       ("graphed_compile_alias", {"tracer": "compile", "outputs": "alias"}),
                       ("graphed_eager", {"tracer": "eager"})):
        torch._dynamo.reset()
        fn = graphjit.graphed(step, **opts)
        for _ in range(4):
            fn(x)
        measure(name, (lambda f: lambda: f(x))(fn))
        res["variants"][name]["stats"] = {k: v for k, v in fn.stats().items() if k != "keys"}
        fn.reset()

    base, ours = res["variants"]["reduce_overhead"]["gpu"], res["variants"]["graphed_compile"]["gpu"]
    res["only_graphed_compile"] = {k: v for k, v in ours.items() if k not in base}
    res["only_reduce_overhead"] = {k: v for k, v in base.items() if k not in ours}
    diff = {k: round(ours.get(k, {"us": 0.0})["us"] - base.get(k, {"us": 0.0})["us"], 2)
            for k in set(base) | set(ours)}
    res["us_diff_top"] = dict(sorted(diff.items(), key=lambda kv: -abs(kv[1]))[:15])
    text = json.dumps(res, indent=1)
    print(json.dumps({k: res[k] for k in ("only_graphed_compile", "only_reduce_overhead", "us_diff_top")}, indent=1))
    for name, v in res["variants"].items():
        n = sum(g["count"] for g in v["gpu"].values())
        print(f"{name}: device_us {v['device_us']} gpu events/call {n:.1f} runtime {v['runtime']}")
    if a.out is not None:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / f"compile_kernels_L{a.layers}_B{a.batch}.json").write_text(text)


if __name__ == "__main__":
    main()
