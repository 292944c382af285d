"""``python -m graphjit bench hf``: a Hugging Face ``LlamaForCausalLM`` decode step (StaticCache), eager against
a hand-made CUDA graph, ``@graphjit.graphed``, ``@graphjit.graphed(tracer="compile")`` and
``torch.compile(mode="reduce-overhead")``.

Per size (``--layers`` x ``--batch``) each variant runs the same greedy loop on its own freshly prefilled
cache: ``--warmup`` untimed steps (graphjit's warmup calls and capture, torch.compile's compilation, the
hand-made graph's two side-stream warmups and capture happen there; their tokens and logits are checked
against the eager loop's), then ``--repeats`` x ``--steps`` timed steps (CUDA events; microseconds per
step, median over the repeats).  Writes ``hf_llama_torch_<tag>.json`` and a PNG bar plot.

Targets (``summary``): ``@graphed`` within 1.10x of the hand-made graph; ``@graphed(tracer="compile")`` at
most 1.0x of reduce-overhead; the eager-kernel variants (``graphed``, ``cuda_graph``) produce the eager
tokens.  Needs transformers (``pip install "graphjit[hf]"``) and a CUDA GPU; ``--allow-cpu`` runs a tiny
smoke version (no graphs) for CI.

This module is framework-neutral; the model and the timed loop are in
:mod:`graphjit.bench.torch.hf`, imported when the benchmark starts.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from . import common
from .common import say

VARIANTS = ("eager", "cuda_graph", "graphed", "graphed_compile", "reduce_overhead")
EAGER_KERNELS = ("cuda_graph", "graphed")  # the same kernels as eager: their tokens must be eager's
TARGETS = {"graphed_vs_cuda_graph": 1.10, "graphed_compile_vs_reduce_overhead": 1.0}
GPU_DEFAULTS: dict[str, Any] = {"layers": [8], "batch": [1, 8], "hidden": 1024, "vocab": 32000, "steps": 50,
                                "repeats": 5, "warmup": 8}
CPU_DEFAULTS: dict[str, Any] = {"layers": [2], "batch": [1], "hidden": 64, "vocab": 256, "steps": 3, "repeats": 2,
                                "warmup": 4}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("hf")
    g.add_argument("--layers", type=common.int_list, default=None,
                   help=f"decoder layers, comma-separated (default {GPU_DEFAULTS['layers'][0]})")
    g.add_argument("--batch", type=common.int_list, default=None, help="batch sizes, comma-separated (default 1,8)")
    g.add_argument("--hidden", type=common.positive_int, default=None, help="hidden size (default 1024)")
    g.add_argument("--vocab", type=common.positive_int, default=None, help="vocabulary size (default 32000)")
    g.add_argument("--dtype", choices=("fp32", "bf16"), default="bf16", help="model dtype (default bf16)")
    g.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated subset of {', '.join(VARIANTS)}")
    g.add_argument("--steps", type=common.positive_int, default=None, help="timed steps per repeat (default 50)")
    g.add_argument("--repeats", type=common.positive_int, default=None, help="timed repeats (default 5)")
    g.add_argument("--warmup", type=common.positive_int, default=None,
                   help="untimed, checked steps per variant (default 8; at least 3, so that @graphed is timed "
                        "replaying)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--allow-cpu", action="store_true", help="without a CUDA GPU, a tiny smoke run (for CI)")


def run(args: argparse.Namespace) -> int:

    on_gpu, code = common.gpu_or_exit("hf", "torch", args.allow_cpu, needs="transformers")  # pip install 'graphjit[hf]'
    if code is not None:
        return code
    for key, value in (GPU_DEFAULTS if on_gpu else CPU_DEFAULTS).items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    variants = common.pick("hf", "variant(s)", args.variants, VARIANTS)
    if variants is None:
        return 2
    if args.warmup < 3:
        print(f"graphjit bench hf: --warmup {args.warmup}: expected at least 3 (@graphed captures on its third "
              "call, the hand-made graph after two warmup steps)", file=sys.stderr, flush=True)
        return 2
    tag = common.machine_tag(args)
    json_path, png_path = common.output_paths(args.out, f"hf_llama_torch_{tag}.json")
    data = common.header("hf", args, tag)
    data.update({"backend": "torch", "device": "cuda" if on_gpu else "cpu", "smoke": not on_gpu,
                 "config": {"layers": args.layers, "batch": args.batch, "hidden": args.hidden, "vocab": args.vocab,
                            "dtype": args.dtype, "variants": variants, "steps": args.steps, "repeats": args.repeats,
                            "warmup": args.warmup, "model": "transformers.LlamaForCausalLM (random weights), "
                            "StaticCache closed over; loop: logits = step(tok, pos); tok = logits.argmax(-1)",
                            "timer": "cuda_events" if on_gpu else "host"},
                 "env": common.environment(), "results": {}, "complete": False})
    say(f"hf [torch, {data['device']}, {args.dtype}]: layers={args.layers} batch={args.batch} hidden={args.hidden} "
        f"-> {json_path}")
    try:
        from .torch.hf import HfBench

        bench = HfBench(args, on_gpu)
        data["env"] = common.environment()
    except Exception as exc:
        data["error"] = common.error_text(exc)
        common.write_json(json_path, data)
        say(f"hf: could not start: {data['error']}")
        return 1
    groups = []
    for layers in args.layers:
        for batch in args.batch:
            name = f"L{layers} B{batch}"
            groups.append(name)
            entry: dict[str, Any] = {"layers": layers, "batch": batch, "variants": {}}
            data["results"][name] = entry
            for v in variants:
                say(f"hf: {name}: {v} ...")
                entry["variants"][v] = common.guarded(lambda v=v, layers=layers, batch=batch:
                                                      bench.run_variant(v, layers, batch))
                common.write_json(json_path, data)
            entry["ratios"] = _ratios(entry)
    data["summary"] = _summary(data, on_gpu)
    data["complete"] = True
    plot_note = None
    if not args.no_plot:
        plot_note = common.bar_plot(
            png_path, f"HF Llama decode step (torch {args.dtype}, hidden {args.hidden}, {data['device']}, {tag})",
            groups, {v: [_us(data["results"][g], v) for g in groups] for v in variants},
            "microseconds per decode step (median)")
    data["plot"] = None if (args.no_plot or plot_note) else png_path.name
    if plot_note:
        data["plot_error"] = plot_note
    common.write_json(json_path, data)
    rows = [[g, *[_us(data["results"][g], v) for v in variants],
             data["results"][g]["ratios"].get("graphed_vs_cuda_graph"),
             data["results"][g]["ratios"].get("graphed_compile_vs_reduce_overhead")] for g in groups]
    say(common.format_table(["size", *[f"{v} us" for v in variants], "graphed/cuda_graph",
                             "graphed_compile/reduce_overhead"], rows))
    for problem in data["summary"]["problems"]:
        say(f"hf: {problem}")
    say(f"wrote {json_path}" + (f" and {png_path}" if data["plot"] else ""))
    return 0 if data["summary"]["ok"] else 1


def _us(entry: dict[str, Any], variant: str) -> float | None:
    v = entry.get("variants", {}).get(variant) or {}
    return v.get("us_per_step") if v.get("status") == "ok" else None


def _ratios(entry: dict[str, Any]) -> dict[str, float]:
    out = {}
    for name, (a, b) in {"graphed_vs_cuda_graph": ("graphed", "cuda_graph"),
                         "graphed_compile_vs_reduce_overhead": ("graphed_compile", "reduce_overhead"),
                         "eager_vs_graphed": ("eager", "graphed")}.items():
        x, y = _us(entry, a), _us(entry, b)
        if x and y:
            out[name] = x / y
    return out


def _summary(data: dict[str, Any], on_gpu: bool) -> dict[str, Any]:
    problems: list[str] = []
    targets: dict[str, Any] = {}
    for name, entry in data["results"].items():
        for v, res in entry["variants"].items():
            if res.get("status") not in ("ok", "skipped"):
                problems.append(f"{name}/{v}: {res.get('status')}: {res.get('error') or res.get('stats')}")
            elif v in EAGER_KERNELS and res.get("status") == "ok" and not res.get("tokens_equal_eager"):
                problems.append(f"{name}/{v}: tokens differ from the eager loop's")
        if on_gpu:
            for ratio, limit in TARGETS.items():
                got = entry["ratios"].get(ratio)
                targets[f"{name} {ratio}"] = {"ratio": got, "target": limit, "met": got is not None and got <= limit}
    return {"ok": not problems, "problems": problems, "targets": targets}
