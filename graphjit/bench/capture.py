"""``python -m graphjit bench capture``: ahead-of-time capture of many batch sizes, graphjit against by hand.

A serving engine captures its decode step once per batch size before it serves; vLLM's default list has 51
sizes (1, 2, 4, then 8 to 248 by 8, then 256 to 512 by 16).  The step here: ``--layers`` layers of RMSNorm, a
SiLU-gated MLP (hidden ``--hidden``, 2x up) and a residual add, ``--dtype`` (bf16), inference (``no_grad``).
Variants, each timed from a synchronised start to a synchronised end, largest size first (so that smaller graphs
reuse the pool memory of larger ones, as vLLM orders them):

* ``by_hand``: per size a static input, ``--warmup`` eager calls on a side stream, ``torch.cuda.graph`` into one
  shared pool (``torch.cuda.graph_pool_handle()``): what a careful engineer writes;
* ``graphjit``: ``graphjit.graphed(step)`` called once per size inside one ``graphjit.capture_scope()`` (which
  warms up, captures and verifies each key and shares one pool).

Recorded per variant: seconds, the growth of ``torch.cuda.memory_reserved()`` and of the allocated bytes (the
pool), graphs made; then, for the smallest, a middle and the largest size, one replay of each against the eager
step on the same input (``max_abs_diff``; bitwise equality reported).  Ratios graphjit / by_hand for time and
memory.  Targets (``summary``): time at most 2x, reserved memory at most 1x.  Before both variants every size runs
eagerly once (cuBLAS picks its kernels there, not inside either variant's time).  Without a CUDA GPU,
``--allow-cpu`` runs a tiny smoke version for CI (no graphs: both variants run the step eagerly).  Framework code:
:mod:`graphjit.bench.torch.capture`.
"""

from __future__ import annotations

import argparse
from typing import Any

from . import common
from .common import say

VARIANTS = ("by_hand", "graphjit")
TARGETS = {"time_ratio_max": 2.0, "reserved_ratio_max": 1.0}
VLLM_SIZES = [1, 2, 4, *range(8, 256, 8), *range(256, 513, 16)]
GPU_DEFAULTS: dict[str, Any] = {"layers": 8, "hidden": 1024, "warmup": 2}
CPU_DEFAULTS: dict[str, Any] = {"layers": 2, "hidden": 32, "warmup": 2}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("capture")
    g.add_argument("--sizes", type=common.int_list, default=None,
                   help="batch sizes, comma-separated (default vLLM's 51: 1,2,4,8..248 by 8,256..512 by 16; "
                        "CPU smoke 1,2,4)")
    g.add_argument("--layers", type=common.positive_int, default=None, help="layers (default 8)")
    g.add_argument("--hidden", type=common.positive_int, default=None, help="hidden size (default 1024)")
    g.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16", help="parameter and data type (default bf16)")
    g.add_argument("--warmup", type=common.positive_int, default=None,
                   help="eager calls per size before its capture, by hand and graphjit's warmup option (default 2, "
                        "graphjit's default)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--profile", action="store_true",
                   help="also run the graphjit variant again under cProfile and keep its 40 costliest functions (by "
                        "own time) in the JSON, the whole profile beside it (.pstats, for pstats): where graphjit's "
                        "time above by hand goes")
    g.add_argument("--allow-cpu", action="store_true", help="without a CUDA GPU, a tiny smoke run (for CI)")


def run(args: argparse.Namespace) -> int:
    on_gpu, code = common.gpu_or_exit("capture", "torch", args.allow_cpu)
    if code is not None:
        return code
    for key, value in (GPU_DEFAULTS if on_gpu else CPU_DEFAULTS).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.sizes is None:
        args.sizes = VLLM_SIZES if on_gpu else [1, 2, 4]
    tag = common.machine_tag(args)
    json_path, png_path = common.output_paths(args.out, f"capture_torch_{tag}.json")
    data = common.grid_header("capture", args, tag, on_gpu, {
        "sizes": args.sizes, "layers": args.layers, "hidden": args.hidden, "dtype": args.dtype, "warmup": args.warmup,
        "order": "largest first"}, timer="host clock, synchronised")
    say(f"capture [torch, {data['device']}]: {len(args.sizes)} sizes, {args.layers} layers, hidden {args.hidden} "
        f"-> {json_path}")
    bench = common.start("capture", data, json_path,
                         lambda: common.framework_half("torch.capture", "CaptureBench")(args, on_gpu))
    if bench is None:
        return 1
    for variant in VARIANTS:
        say(f"capture: {variant} ...")
        data["results"][variant] = common.guarded(lambda variant=variant: bench.measure(variant))
        common.write_json(json_path, data)
    if args.profile:
        say("capture: graphjit under cProfile ...")
        data["profile"] = common.guarded(lambda: bench.profile("graphjit", json_path.with_suffix(".pstats")))
    data["ratios"] = _ratios(data["results"])
    data["summary"] = _summary(data, on_gpu)
    data["complete"] = True
    if not args.no_plot:
        res = data["results"]
        note = common.bar_plot(
            png_path, f"capture {len(args.sizes)} batch sizes: by hand vs graphjit.capture_scope (torch, {tag})",
            ["seconds", "reserved GiB"],
            {v: [res[v].get("seconds"), _gib(res[v].get("reserved_bytes"))] for v in VARIANTS}, "value",
            notes=[f"{args.layers} layers, hidden {args.hidden}, {args.dtype}, warmup {args.warmup}"])
        data["plot"] = None if note else png_path.name
        if note:
            data["plot_error"] = note
    common.write_json(json_path, data)
    rows = [[v, r.get("seconds"), _gib(r.get("reserved_bytes")), _gib(r.get("allocated_bytes")), r.get("graphs"),
             r.get("equal_eager")] for v, r in data["results"].items()]
    say(common.format_table(["variant", "seconds", "reserved GiB", "allocated GiB", "graphs", "equal eager"], rows))
    say("capture: graphjit / by hand: " + ", ".join(f"{k} {v:.2f}" for k, v in data["ratios"].items()))
    say(f"wrote {json_path}")
    return 0 if data["summary"]["ok"] else 1


def _gib(n: float | None) -> float | None:
    return None if n is None else round(n / 2**30, 3)


def _ratios(results: dict[str, Any]) -> dict[str, float]:
    hand, ours = results.get("by_hand", {}), results.get("graphjit", {})
    out = {}
    for name, field in (("time", "seconds"), ("reserved", "reserved_bytes"), ("allocated", "allocated_bytes")):
        a, b = hand.get(field), ours.get(field)
        if a and b is not None:
            out[name] = b / a
    return out


def _summary(data: dict[str, Any], on_gpu: bool) -> dict[str, Any]:
    problems = [f"{v}: {r.get('status')}: {r.get('error')}" for v, r in data["results"].items()
                if r.get("status") != "ok"]
    problems += [f"{v}: a replay differs from eager by {r.get('max_abs_diff')}" for v, r in data["results"].items()
                 if r.get("status") == "ok" and not r.get("close_to_eager")]
    met = {}
    if on_gpu:
        r = data.get("ratios", {})
        met = {"time": r.get("time") is not None and r["time"] <= TARGETS["time_ratio_max"],
               "reserved": r.get("reserved") is not None and r["reserved"] <= TARGETS["reserved_ratio_max"]}
    return {"ok": not problems, "problems": problems, "targets": TARGETS, "met": met}
