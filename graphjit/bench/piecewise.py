"""``python -m graphjit bench piecewise``: a decode step whose attention reads per-call metadata (so no whole
CUDA graph can hold it), eager against piecewise capture (attention as an island, the rest graphed) and
against a whole graph of the same step with fixed-shape attention; plus the cost of one island boundary.

The step: ``--layers`` layers of RMSNorm, QKV projection, attention, output projection, RMSNorm and a SiLU
MLP, hidden ``--hidden``, bf16.  Attention writes each sequence's new key and value at its own position and
attends over the first ``max_len`` cache entries, ``max_len`` a Python int that changes every call (what a
varlen attention kernel takes), masked per sequence.  Variants:

* ``eager``: the step as written;
* ``piecewise``: ``@graphed(step, dynamic=("meta",))`` with attention an island (``@graphjit.eager``): the island
  holds only what reads ``max_len`` (the slices and the attention kernel); the cache write reads device tensors
  only (the positions, a plain argument) and is captured, as the README advises for islands;
* ``whole_fixed``: the fixed-shape variant (attention over the whole cache, masked; no host int) under
  ``@graphed``, one graph: the ceiling piecewise is measured against.

Per size (``--layers`` x ``--batch``) every variant is measured the same way (the variants' order does not
matter): ``--warmup`` untimed calls, each compared with an eager reference of the same function on the same
inputs and state (whole_fixed: the eager fixed-shape step, whose function is checked to equal the varlen
step's in float32); one untimed pass over the ``--steps`` metadata of the timed loop (so that every sequence
length is met warm: cuDNN attention builds a plan for each new length); ``--repeats`` timed passes over
them (CUDA events; median us per step); one more checked call.  ``equal_eager`` means exactly equal.  The
boundary cost: a graphed chain of ``max(--layers) + 1`` small layers with an identity island between each
two against the same chain graphed whole, each call timed alone on the host:
``(piecewise - whole) / islands``.

Targets (``summary``): piecewise at least 3x faster than eager at 8 layers batch 1; piecewise at most 1.15x
the whole fixed-shape graph at every size; one island boundary at most 2 us of host time.  Needs a CUDA GPU;
``--allow-cpu`` runs a tiny smoke version for CI (graphs emulated nowhere: the variants run eagerly and are only
checked).  Framework code:
:mod:`graphjit.bench.torch.piecewise`.
"""

from __future__ import annotations

import argparse
from typing import Any

from . import common
from .common import say

VARIANTS = ("eager", "piecewise", "whole_fixed")
TARGETS = {"eager_vs_piecewise_min": 3.0, "piecewise_vs_whole_fixed_max": 1.15, "boundary_us_max": 2.0}
RATIOS = {"eager_vs_piecewise": ("eager", "piecewise"), "piecewise_vs_whole_fixed": ("piecewise", "whole_fixed")}
ATTENTION = ("efficient", "cudnn", "math", "auto")
GPU_DEFAULTS: dict[str, Any] = {"layers": [8, 32], "batch": [1, 8], "hidden": 1024, "steps": 50, "repeats": 5,
                                "warmup": 6, "max_cache": 512}
CPU_DEFAULTS: dict[str, Any] = {"layers": [2], "batch": [1], "hidden": 64, "steps": 3, "repeats": 2, "warmup": 4,
                                "max_cache": 32}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("piecewise")
    g.add_argument("--layers", type=common.int_list, default=None, help="layers, comma-separated (default 8,32)")
    g.add_argument("--batch", type=common.int_list, default=None, help="batch sizes, comma-separated (default 1,8)")
    g.add_argument("--hidden", type=common.positive_int, default=None, help="hidden size (default 1024)")
    g.add_argument("--max-cache", type=common.positive_int, default=None,
                   help="KV cache length per sequence (default 512)")
    g.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated subset of {', '.join(VARIANTS)}")
    g.add_argument("--steps", type=common.positive_int, default=None, help="timed steps per repeat (default 50)")
    g.add_argument("--repeats", type=common.positive_int, default=None, help="timed repeats (default 5)")
    g.add_argument("--warmup", type=common.positive_int, default=None,
                   help="untimed, checked steps per variant (default 6; at least 3: @graphed captures on the third)")
    g.add_argument("--attention", choices=ATTENTION, default="efficient",
                   help="the scaled_dot_product_attention kernel every variant uses on a GPU (default efficient: "
                        "deterministic and without a per-length plan; auto: torch's pick, cuDNN on Hopper)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--allow-cpu", action="store_true", help="without a CUDA GPU, a tiny smoke run (for CI)")


def run(args: argparse.Namespace) -> int:
    on_gpu, code = common.gpu_or_exit("piecewise", "torch", args.allow_cpu)
    if code is not None:
        return code
    variants = common.grid_options("piecewise", args, on_gpu, GPU_DEFAULTS, CPU_DEFAULTS, VARIANTS,
                                   "@graphed captures on its third call")
    if variants is None:
        return 2
    tag = common.machine_tag(args)
    json_path, png_path = common.output_paths(args.out, f"piecewise_decode_torch_{tag}.json")
    data = common.grid_header("piecewise", args, tag, on_gpu, {
        "layers": args.layers, "batch": args.batch, "hidden": args.hidden, "max_cache": args.max_cache,
        "attention": args.attention if on_gpu else "auto",
        "variants": variants, "steps": args.steps, "repeats": args.repeats, "warmup": args.warmup,
        "dtype": "bf16" if on_gpu else "fp32"})
    say(f"piecewise [torch, {data['device']}]: layers={args.layers} batch={args.batch} hidden={args.hidden} "
        f"-> {json_path}")
    bench = common.start("piecewise", data, json_path,
                         lambda: common.framework_half("torch.piecewise", "PiecewiseBench")(args, on_gpu))
    if bench is None:
        return 1
    groups = common.run_grid("piecewise", data, json_path, args.layers, args.batch, variants, bench.run_variant,
                             lambda entry: common.ratios(entry, RATIOS))
    say("piecewise: island boundary cost ...")
    data["boundary"] = common.guarded(lambda: bench.boundary_cost(max(args.layers)))
    data["summary"] = _summary(data, on_gpu)
    data["complete"] = True
    title = f"decode step with per-call attention metadata ({data['device']}, {tag})"
    common.plot_grid(data, png_path, args.no_plot, title, groups, variants, "microseconds per step (median)")
    common.write_json(json_path, data)
    rows = [[g, *[common.us_per_step(data["results"][g], v) for v in variants],
             data["results"][g]["ratios"].get("eager_vs_piecewise"),
             data["results"][g]["ratios"].get("piecewise_vs_whole_fixed"),
             _island_share(data["results"][g])] for g in groups]
    say(common.format_table(["size", *[f"{v} us" for v in variants], "eager/piecewise", "piecewise/whole_fixed",
                             "islands' share of piecewise host time"], rows))
    b = data["boundary"]
    if b.get("status") == "ok":
        gpu = "" if b.get("gpu_us_per_boundary") is None else (
            f"; on the GPU {b['gpu_us_per_boundary']:.2f} us ({b['gpu_piecewise_us']:.1f} against "
            f"{b['gpu_whole_us']:.1f})")
        say(f"piecewise: one island boundary costs {b['us_per_boundary']:.2f} us on the host ({b['islands']} islands: "
            f"{b['piecewise_us']:.1f} us a call against {b['whole_us']:.1f} us without{gpu})")
        hand = b.get("by_hand") or {}
        if hand.get("status") == "ok":
            say(f"piecewise: by hand (torch.cuda.graph, one graph per segment) a boundary costs "
                f"{hand['us_per_boundary']:.2f} us on the host: graphjit's own part is "
                f"{b['graphjit_us_per_boundary']:.2f} us")
        elif hand:
            say(f"piecewise: the boundary by hand: {hand.get('status')}: {hand.get('error')}")
    return common.finish("piecewise", data, json_path, png_path)


def _island_share(entry: dict[str, Any]) -> float | None:
    """The part of a piecewise call's host time spent inside its islands (their own eager launches), from the
    graphed function's ``stats()``: the rest is graphjit's (signing, segment launches, copies at boundaries)."""
    st = (entry.get("variants", {}).get("piecewise") or {}).get("stats") or {}
    replay, island = st.get("replay_us"), st.get("island_us")
    return island / replay if replay and island is not None else None


def _wrong(variant: str, res: dict[str, Any]) -> str | None:
    """Why a variant that ran is not to be trusted: its outputs differ from its eager reference, the fixed-shape
    step is not the varlen step's function, or a captured segment was empty."""
    why = []
    if not res.get("equal_eager"):
        why.append(f"outputs differ from {res.get('reference', 'eager')} ({res.get('max_rel_diff')})")
    check = res.get("function_check")
    if check is not None and not check.get("equal"):
        why.append(f"the fixed-shape step differs from the varlen step in {check.get('dtype')} "
                   f"({check.get('max_rel_diff')}, tolerance {check.get('tolerance')})")
    if res.get("empty_graphs"):
        why.append(f"{res['empty_graphs']} captured segment(s) empty")
    return "; ".join(why) or None


def _summary(data: dict[str, Any], on_gpu: bool) -> dict[str, Any]:
    problems = common.grid_problems(data, _wrong)
    targets: dict[str, Any] = {}
    for name, entry in data["results"].items():
        if not on_gpu:
            continue
        ratios = entry["ratios"]
        if entry["layers"] == 8 and entry["batch"] == 1:
            got = ratios.get("eager_vs_piecewise")
            targets[f"{name} eager/piecewise"] = {"ratio": got, "target": f">= {TARGETS['eager_vs_piecewise_min']}",
                                                  "met": got is not None and got >= TARGETS["eager_vs_piecewise_min"]}
        got = ratios.get("piecewise_vs_whole_fixed")
        targets[f"{name} piecewise/whole_fixed"] = {
            "ratio": got, "target": f"<= {TARGETS['piecewise_vs_whole_fixed_max']}",
            "met": got is not None and got <= TARGETS["piecewise_vs_whole_fixed_max"]}
    b = data.get("boundary") or {}
    if on_gpu and b.get("us_per_boundary") is not None:
        targets["boundary host us"] = {"ratio": b["us_per_boundary"], "target": f"<= {TARGETS['boundary_us_max']}",
                                       "met": b["us_per_boundary"] <= TARGETS["boundary_us_max"]}
    if b.get("status") not in ("ok", "skipped"):
        problems.append(f"boundary: {b.get('status')}: {b.get('error')}")
    return {"ok": not problems, "problems": problems, "targets": targets}
