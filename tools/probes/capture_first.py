"""Where the first ``capture_scope`` of a process spends its time (``bench capture``'s graphjit variant, run
several times in one process).

Question: ``bench capture`` measured graphjit's first capture of the 51 sizes at 4.1 s against 0.58 s for a second
run in the same process.  This runs the benchmark's by-hand variant, then graphjit's ``--runs`` times (with
``--profile`` the first under cProfile, the 45 costliest by cumulative time kept) and records the seconds of each.
With ``--preload`` the csrc library is loaded (``graphjit.batch_copy.library``) and timed before any run.  Run it once
per setting (``GRAPHJIT_BATCH_COPY=off``, ``--preload``, neither) in fresh processes.  Writes JSON to ``--out``.
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
    bench = CaptureBench(args, on_gpu=True)
    if a.preload:
        from graphjit import batch_copy
        from graphjit.backends.torch import device

        t0 = time.perf_counter()
        lib = batch_copy.library(device.arch(0), 0)
        res["preload_s"] = time.perf_counter() - t0
        res["preload_lib"] = None if lib is None else str(lib.path)
    res["by_hand_s"] = bench.measure("by_hand")["seconds"]
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
    res["graphjit_runs"] = runs
    torch.cuda.synchronize()
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps({k: v for k, v in res.items() if k != "first_profile"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
