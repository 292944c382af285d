"""Where the first ``capture_scope`` of a process spends its time (``bench capture``'s graphjit variant, run
several times in one process).

Question: ``bench capture`` measured graphjit's first capture of the 51 sizes at 4.1 s against 0.58 s for a second
run in the same process.  This runs the benchmark's by-hand variant, then graphjit's ``--runs`` times (with
``--profile`` the first under cProfile, the 45 costliest by cumulative time kept) and records the seconds of each.
With ``--preload`` the csrc library is loaded (``graphjit.batch_copy.library``) and timed before any run.  Run it once
per setting (``GRAPHJIT_BATCH_COPY=off``, ``--preload``, neither) in fresh processes.  With ``--time-calls`` every
``CUDAGraph.instantiate`` and ``raw_cuda_graph_exec`` call is timed (a second ``raw_cuda_graph_exec`` right after the
first too) and the process's threads are listed: a getter that releases the GIL costs a switch interval where another
thread holds it.  ``--switch-interval`` sets :func:`sys.setswitchinterval` first.  Writes JSON to ``--out``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import time


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--preload", action="store_true")
    p.add_argument("--profile", action="store_true", help="the first graphjit run under cProfile")
    p.add_argument("--sizes", default=None)
    p.add_argument("--time-calls", action="store_true", help="time CUDAGraph.instantiate and raw_cuda_graph_exec")
    p.add_argument("--switch-interval", type=float, default=None)
    p.add_argument("--old-prime", action="store_true", help="prime cuBLAS as graphjit did up to f4ff8e2 (fp32 and "
                   "bf16 products of each library per capture)")
    p.add_argument("--time-step", action="store_true", help="time each eager run of the step (both variants; the "
                   "timing list the step then appends to is Python state it writes on every call, so graphjit's "
                   "variant runs it uncaptured: graphs 0, its times are not a capture's)")
    p.add_argument("--time-fns", default="", help="comma-separated module:qualname of functions to time per run "
                   "(cumulative seconds and calls; nested calls count once per outermost call; a wrapper can change "
                   "what graphjit does: one run with 36 functions wrapped, torch.cuda.synchronize and "
                   "graphjit.invoke:Invoker.run among them, captured nothing, so check the runs' graphs)")
    a = p.parse_args()
    t_import = time.perf_counter()
    import torch

    import graphjit  # noqa: F401
    from graphjit.bench import capture as cap_cli
    from graphjit.bench.torch.capture import CaptureBench

    t_import = time.perf_counter() - t_import
    parser = argparse.ArgumentParser()
    cap_cli.add_arguments(parser)
    args = parser.parse_args([] if a.sizes is None else ["--sizes", a.sizes])
    for k, v in cap_cli.GPU_DEFAULTS.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.sizes is None:
        args.sizes = cap_cli.VLLM_SIZES
    res: dict = {"env": {k: v for k, v in os.environ.items() if k.startswith("GRAPHJIT_")},
                 "preload": a.preload, "import_s": t_import}
    if a.switch_interval is not None:
        sys.setswitchinterval(a.switch_interval)
    res["switch_interval"] = sys.getswitchinterval()
    timed: dict[str, list[float]] = {"instantiate": [], "exec": [], "exec_again": []}
    if a.time_calls:
        _time_graph_calls(torch.cuda.CUDAGraph, timed)
    if a.old_prime:
        from graphjit.backends.torch import workspaces

        workspaces.prime = _old_prime_blas
    res["old_prime"] = a.old_prime
    fn_times: dict[str, list[float]] = {}
    for spec in filter(None, a.time_fns.split(",")):
        _time_function(spec, fn_times)
    bench = CaptureBench(args, on_gpu=True)
    if a.preload:
        from graphjit import batch_copy
        from graphjit.backends.torch import device

        t0 = time.perf_counter()
        lib = batch_copy.library(device.arch(0), 0)
        res["preload_s"] = time.perf_counter() - t0
        res["preload_lib"] = None if lib is None else str(lib.path)
    if a.time_step:
        bench.step = _timed_step(bench.step, fn_times.setdefault("step", []))
    res["by_hand_s"] = bench.measure("by_hand")["seconds"]
    if a.time_step:
        res["by_hand_step_ms"] = _summary(fn_times["step"])
        fn_times["step"].clear()
    runs = []
    for i in range(a.runs):
        if i == 0 and a.profile:
            prof = cProfile.Profile()
            prof.enable()
            r = bench.measure("graphjit")
            prof.disable()
            text = io.StringIO()
            pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(45)
            res["first_profile"] = text.getvalue()
        else:
            r = bench.measure("graphjit")
        runs.append({k: r.get(k) for k in ("seconds", "graphs", "equal_eager", "reserved_bytes")})
        if a.time_calls:
            import threading

            runs[-1]["threads"] = [f"{t.name} daemon={t.daemon}" for t in threading.enumerate()]
            for name, ts in timed.items():
                runs[-1][f"{name}_ms"] = _summary(ts)
                ts.clear()
        for name, ts in fn_times.items():
            runs[-1].setdefault("functions_ms", {})[name] = _summary(ts)
            ts.clear()
    res["graphjit_runs"] = runs
    torch.cuda.synchronize()
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps({k: v for k, v in res.items() if k != "first_profile"}, indent=1))
    return 0


def _time_graph_calls(cls: type, timed: dict[str, list[float]]) -> None:
    """Wrap ``cls.instantiate`` and ``cls.raw_cuda_graph_exec`` to record each call's seconds in ``timed``."""
    inst, raw = cls.instantiate, cls.raw_cuda_graph_exec

    def instantiate(self: object) -> None:
        t = time.perf_counter()
        inst(self)
        timed["instantiate"].append(time.perf_counter() - t)

    def raw_cuda_graph_exec(self: object) -> int:
        t = time.perf_counter()
        h = raw(self)
        t2 = time.perf_counter()
        raw(self)
        timed["exec"].append(t2 - t)
        timed["exec_again"].append(time.perf_counter() - t2)
        return h

    cls.instantiate, cls.raw_cuda_graph_exec = instantiate, raw_cuda_graph_exec


def _time_function(spec: str, fn_times: dict[str, list[float]]) -> None:
    """Replace ``module:Class.attr`` (or ``module:function``) by a wrapper recording each outermost call's seconds."""
    import functools
    import importlib

    mod_name, qual = spec.split(":")
    owner: object = importlib.import_module(mod_name)
    *path, attr = qual.split(".")
    for part in path:
        owner = getattr(owner, part)
    orig = getattr(owner, attr)
    times = fn_times.setdefault(spec, [])
    depth = [0]

    @functools.wraps(orig)
    def timed(*args: object, **kwargs: object) -> object:
        depth[0] += 1
        t = time.perf_counter()
        try:
            return orig(*args, **kwargs)
        finally:
            depth[0] -= 1
            if not depth[0]:
                times.append(time.perf_counter() - t)

    setattr(owner, attr, timed)


def _old_prime_blas(stream: object, index: int) -> None:
    """graphjit's cuBLAS priming up to f4ff8e2: an fp32 and a bf16 product through each of cuBLAS and cuBLASLt."""
    import torch

    with torch.cuda.stream(stream), torch.no_grad():  # type: ignore[arg-type]
        for dtype in (torch.float32, torch.bfloat16):
            m = torch.ones(8, 8, device=f"cuda:{index}", dtype=dtype)
            torch.nn.functional.linear(m, m, m[0])
            torch.mm(m, m)


def _timed_step(step: object, times: list[float]) -> object:
    """``step`` recording each call's seconds (a plain closure: graphjit walks what it reaches, as it walks the
    step's own)."""

    def timed_step(x: object) -> object:
        t = time.perf_counter()
        try:
            return step(x)  # type: ignore[operator]
        finally:
            times.append(time.perf_counter() - t)

    return timed_step


def _summary(ts: list[float]) -> dict[str, float]:
    if not ts:
        return {}
    s = sorted(ts)
    return {"n": len(s), "sum": 1e3 * sum(s), "median": 1e3 * s[len(s) // 2], "max": 1e3 * s[-1]}


if __name__ == "__main__":
    sys.exit(main())
