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
from typing import Any

from . import common
from .common import say

VARIANTS = ("eager", "cuda_graph", "graphed", "graphed_compile", "reduce_overhead")
EAGER_KERNELS = ("cuda_graph", "graphed")  # the same kernels as eager: their tokens must be eager's
TARGETS = {"graphed_vs_cuda_graph": 1.10, "graphed_compile_vs_reduce_overhead": 1.0}
RATIOS = {"graphed_vs_cuda_graph": ("graphed", "cuda_graph"),
          "graphed_compile_vs_reduce_overhead": ("graphed_compile", "reduce_overhead"),
          "eager_vs_graphed": ("eager", "graphed")}
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
    variants = common.grid_options("hf", args, on_gpu, GPU_DEFAULTS, CPU_DEFAULTS, VARIANTS,
                                   "@graphed captures on its third call, the hand-made graph after two warmup steps")
    if variants is None:
        return 2
    tag = common.machine_tag(args)
    json_path, png_path = common.output_paths(args.out, f"hf_llama_torch_{tag}.json")
    data = common.grid_header("hf", args, tag, on_gpu, {
        "layers": args.layers, "batch": args.batch, "hidden": args.hidden, "vocab": args.vocab, "dtype": args.dtype,
        "variants": variants, "steps": args.steps, "repeats": args.repeats, "warmup": args.warmup,
        "model": "transformers.LlamaForCausalLM (random weights), StaticCache closed over; loop: "
                 "logits = step(tok, pos); tok = logits.argmax(-1)"})
    say(f"hf [torch, {data['device']}, {args.dtype}]: layers={args.layers} batch={args.batch} hidden={args.hidden} "
        f"-> {json_path}")
    bench = common.start("hf", data, json_path, lambda: common.framework_half("torch.hf", "HfBench")(args, on_gpu))
    if bench is None:
        return 1
    groups = common.run_grid("hf", data, json_path, args.layers, args.batch, variants, bench.run_variant,
                             lambda entry: common.ratios(entry, RATIOS))
    data["summary"] = _summary(data, on_gpu)
    data["complete"] = True
    title = f"HF Llama decode step (torch {args.dtype}, hidden {args.hidden}, {data['device']}, {tag})"
    common.plot_grid(data, png_path, args.no_plot, title, groups, variants, "microseconds per decode step (median)")
    common.write_json(json_path, data)
    rows = [[g, *[common.us_per_step(data["results"][g], v) for v in variants],
             data["results"][g]["ratios"].get("graphed_vs_cuda_graph"),
             data["results"][g]["ratios"].get("graphed_compile_vs_reduce_overhead")] for g in groups]
    say(common.format_table(["size", *[f"{v} us" for v in variants], "graphed/cuda_graph",
                             "graphed_compile/reduce_overhead"], rows))
    return common.finish("hf", data, json_path, png_path)


def _summary(data: dict[str, Any], on_gpu: bool) -> dict[str, Any]:
    problems = common.grid_problems(data, lambda v, res: "tokens differ from the eager loop's"
                                    if v in EAGER_KERNELS and not res.get("tokens_equal_eager") else None)
    targets: dict[str, Any] = {}
    for name, entry in data["results"].items():
        if on_gpu:
            for ratio, limit in TARGETS.items():
                got = entry["ratios"].get(ratio)
                targets[f"{name} {ratio}"] = {"ratio": got, "target": limit, "met": got is not None and got <= limit}
    return {"ok": not problems, "problems": problems, "targets": targets}
