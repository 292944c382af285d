"""``python -m graphjit bench train``: one training step, eager against ``graphjit.graphed_layer`` (torch).

A step is ``zero_grad(set_to_none=True)``, forward, MSE loss, backward and ``SGD.step()``.  Models:

* ``mlp``:   ``--layers`` x [Linear(H, 4H), GELU, Linear(4H, H)] at batch ``--batch``;
* ``block``: ``--layers`` pre-LayerNorm transformer blocks (causal attention written with matmuls,
  4 heads, GELU MLP) at hidden ``H`` on ``--batch`` sequences of ``--seq`` tokens.

Variants: ``eager``; ``graphed`` (the whole model wrapped by ``graphed_layer``, outputs copied) and
``graphed_alias`` (``outputs="alias"``).  Per model, first a correctness check: eager and graphed
copies of one initial model train side by side for ``--check-steps`` steps on the same data, and the
largest relative difference of the losses and of the final parameters is recorded.  Then each variant
is timed on its own: ``--warmup`` untimed steps (graphed_layer's warmup and capture happen there), then
CUDA events around ``--steps`` back-to-back steps, median over ``--repeats`` (microseconds per step);
the host time per step is recorded too.  Writes ``train_torch_<tag>.json`` and a PNG bar plot.

Without a CUDA GPU the benchmark refuses to run unless ``--allow-cpu`` (a tiny smoke run for CI, in
which graphed_layer takes its no-CUDA path: the model runs eagerly).  Paddle is not measured: the
GPU kit's paddlepaddle-gpu 2.6.2 computes elementwise kernels wrong on Hopper, so no Paddle training
step there means anything.

This module is framework-neutral (options, the loop, summary, JSON, table, plot); the models and the torch
step are in :mod:`graphjit.bench.torch.train`, imported when the benchmark starts.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from . import common
from .common import say

MODELS = ("mlp", "block")
VARIANTS = {"layer": ("eager", "graphed", "graphed_alias"), "step": ("eager", "graphed", "compiled")}
DTYPES = ("fp32", "bf16")
GPU_DEFAULTS = {"batch": 32, "hidden": 512, "layers": 4, "seq": 128, "steps": 100, "repeats": 5, "warmup": 10,
                "check_steps": 20}
CPU_DEFAULTS = {"batch": 4, "hidden": 16, "layers": 2, "seq": 8, "steps": 3, "repeats": 2, "warmup": 5,
                "check_steps": 6}
GRAPHED_WARMUP = 3  # graphed_layer's own eager steps before it records the graphs
TOLERANCE = {"fp32": 1e-4, "bf16": 5e-2}  # largest relative loss/parameter difference counted as correct


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("train")
    g.add_argument("--models", default=",".join(MODELS), help=f"comma-separated subset of {', '.join(MODELS)}")
    g.add_argument("--mode", choices=tuple(VARIANTS), default="layer",
                   help="layer: the model under graphed_layer, SGD in the loop (default); step: the whole step "
                        "(zero_grad, forward, backward, clipping, AdamW with its defaults; LambdaLR after each call) "
                        "in one function, eager vs @graphed vs torch.compile(mode='reduce-overhead')")
    g.add_argument("--batch", type=common.positive_int, default=None,
                   help=f"batch size (default {GPU_DEFAULTS['batch']}; CPU smoke {CPU_DEFAULTS['batch']})")
    g.add_argument("--hidden", type=common.positive_int, default=None,
                   help=f"hidden size H (default {GPU_DEFAULTS['hidden']}; CPU smoke {CPU_DEFAULTS['hidden']}); "
                        "block: a multiple of 4")
    g.add_argument("--layers", type=common.positive_int, default=None,
                   help=f"MLP layers / transformer blocks (default {GPU_DEFAULTS['layers']})")
    g.add_argument("--seq", type=common.positive_int, default=None,
                   help=f"tokens per sequence for the block (default {GPU_DEFAULTS['seq']})")
    g.add_argument("--dtype", choices=DTYPES, default="fp32", help="parameter and data type (default fp32)")
    g.add_argument("--steps", type=common.positive_int, default=None,
                   help=f"timed steps per repeat (default {GPU_DEFAULTS['steps']})")
    g.add_argument("--repeats", type=common.positive_int, default=None,
                   help=f"timed repeats, median reported (default {GPU_DEFAULTS['repeats']})")
    g.add_argument("--warmup", type=common.positive_int, default=None,
                   help=f"untimed steps per variant before timing (default {GPU_DEFAULTS['warmup']}; at least "
                        f"{GRAPHED_WARMUP + 1} so that graphed variants are timed replaying)")
    g.add_argument("--check-steps", type=common.positive_int, default=None,
                   help=f"steps of the eager-vs-graphed correctness check (default {GPU_DEFAULTS['check_steps']})")
    g.add_argument("--lr", type=float, default=None,
                   help="learning rate (default 0.01 for the layer mode's SGD, 1e-4 for the step mode's AdamW)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--allow-cpu", action="store_true",
                   help="without a CUDA GPU, run a tiny smoke version on the CPU (for CI) instead of refusing")


def _resolve(args: argparse.Namespace, on_gpu: bool) -> None:
    if args.lr is None:
        args.lr = 0.01 if args.mode == "layer" else 1e-4
    defaults = GPU_DEFAULTS if on_gpu else CPU_DEFAULTS
    for key, value in defaults.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)


def run(args: argparse.Namespace) -> int:

    on_gpu, code = common.gpu_or_exit("train", "torch", args.allow_cpu)
    if code is not None:
        return code
    models = common.pick("train", "model(s)", args.models, MODELS)
    if models is None:
        return 2
    _resolve(args, on_gpu)
    if args.warmup <= GRAPHED_WARMUP:
        print(f"graphjit bench train: --warmup {args.warmup} must exceed graphed_layer's warmup "
              f"({GRAPHED_WARMUP}), or the graphed variants are timed before their capture", file=sys.stderr,
              flush=True)
        return 2
    tag = common.machine_tag(args)
    variants = VARIANTS[args.mode]
    name = "train" if args.mode == "layer" else "train_step"
    json_path, png_path = common.output_paths(args.out, f"{name}_torch_{tag}.json")
    data = common.header("train", args, tag)
    data.update({
        "backend": "torch",
        "device": "cuda" if on_gpu else "cpu",
        "smoke": not on_gpu,
        "config": {"models": models, "mode": args.mode, "variants": list(variants), "batch": args.batch,
                   "hidden": args.hidden, "layers": args.layers, "seq": args.seq, "dtype": args.dtype,
                   "steps": args.steps, "repeats": args.repeats, "warmup": args.warmup,
                   "check_steps": args.check_steps, "lr": args.lr,
                   "graphed_warmup": GRAPHED_WARMUP,
                   "step": ("zero_grad(set_to_none=True); loss = mse(model(x), y); loss.backward(); SGD.step()"
                            if args.mode == "layer" else "zero_grad(); loss = mse(model(x), y); loss.backward(); "
                            "clip_grad_norm_(1.0); AdamW.step() (default flags); LambdaLR.step() after the call"),
                   "timer": "cuda_events" if on_gpu else "host"},
        "env": common.environment(),
        "results": {},
        "complete": False,
    })
    say(f"train [torch, {data['device']}, {args.dtype}]: models={','.join(models)} batch={args.batch} "
        f"hidden={args.hidden} layers={args.layers} seq={args.seq} -> {json_path}")
    bench = common.start("train", data, json_path, lambda: common.framework_half("torch.train", "TrainBench")(
        args, on_gpu, GRAPHED_WARMUP, TOLERANCE))
    if bench is None:
        return 1
    for kind in models:
        entry: dict[str, Any] = {"variants": {}}
        data["results"][kind] = entry
        say(f"train: {kind}: correctness check ({args.check_steps} steps eager vs graphed) ...")
        entry["check"] = common.guarded(lambda kind=kind: bench.check(kind))
        for variant in variants:
            say(f"train: {kind}: {variant} ...")
            entry["variants"][variant] = common.guarded(lambda kind=kind, variant=variant:
                                                        bench.time_variant(kind, variant))
            common.write_json(json_path, data)
        eager = _us(entry, "eager")
        entry["speedup_vs_eager"] = {v: eager / us for v in variants[1:] if (us := _us(entry, v)) and eager}
        if args.mode == "step" and (g := _us(entry, "graphed")) and (c := _us(entry, "compiled")):
            entry["graphed_vs_compiled"] = g / c
    data["summary"] = _summary(data, on_gpu)
    data["complete"] = True
    plot_note = None
    if not args.no_plot:
        plot_note = common.bar_plot(
            png_path, (f"training step, eager vs graphed_layer (torch {args.dtype}, {data['device']}, {tag})"
                       if args.mode == "layer" else
                       f"whole training step: eager, @graphed, reduce-overhead (torch {args.dtype}, {tag})"), models,
            {v: [_us(data["results"][m], v) for m in models] for v in variants}, "microseconds per step (median)",
            notes=[f"batch {args.batch}, hidden {args.hidden}, layers {args.layers}, seq {args.seq}"])
    data["plot"] = None if (args.no_plot or plot_note) else png_path.name
    if plot_note:
        data["plot_error"] = plot_note
    common.write_json(json_path, data)

    rows = []
    for kind in models:
        r = data["results"][kind]
        chk = r.get("check", {})
        rows.append([kind, *(_us(r, v) for v in variants), r["speedup_vs_eager"].get("graphed"),
                     r.get("graphed_vs_compiled"), chk.get("max_loss_rel_diff"), chk.get("correct")])
    say(common.format_table(["model", *(f"{v} us" for v in variants), "speedup", "graphed/compiled",
                             "loss rel diff", "correct"], rows))
    say(f"wrote {json_path}" + (f" and {png_path}" if data["plot"] else ""))
    if plot_note:
        say(f"no plot: {plot_note}")
    return 0 if data["summary"]["ok"] else 1


def _us(entry: dict[str, Any], variant: str) -> float | None:
    v = entry.get("variants", {}).get(variant) or {}
    return v.get("us_per_step") if v.get("status") == "ok" else None


def _summary(data: dict[str, Any], on_gpu: bool) -> dict[str, Any]:
    problems = []
    for kind, r in data["results"].items():
        chk = r.get("check", {})
        if chk.get("status") == "error":
            problems.append(f"{kind}: check failed to run: {chk.get('error')}")
        elif not chk.get("correct"):
            problems.append(f"{kind}: graphed differs from eager (loss {chk.get('max_loss_rel_diff')}, "
                            f"parameters {chk.get('max_param_rel_diff')})")
        for v, res in r.get("variants", {}).items():
            if res.get("status") not in ("ok", "skipped"):
                problems.append(f"{kind}/{v}: {res.get('status')}: {res.get('error') or res.get('stats')}")
    return {"ok": not problems, "problems": problems}
