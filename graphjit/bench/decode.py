"""``python -m graphjit bench decode``: a decode step, eager against CUDA graphs, for torch or paddle.

The step is ``L`` layers of ``x = RMSNorm(x + silu(x @ W))`` at hidden size ``H`` and batch ``B``
(weights closed over, as in a model).  Per configuration, in one process, each variant is built,
checked once against eager on two inputs (relative errors recorded), then timed: CUDA events
around ``--iters`` back-to-back calls with fixed inputs, median of ``--repeats``, microseconds per
step.

torch variants:  ``eager``; ``raw_graph`` (``torch.cuda.CUDAGraph`` captured by hand as the torch
docs show: side-stream warmup, capture, then ``static_x.copy_(x); graph.replay()`` per step);
``graphed`` and ``graphed_alias`` (``@graphjit.graphed``, tracer eager, outputs copy / alias);
``compile_reduce_overhead`` (``torch.compile(mode="reduce-overhead")``, steady state);
``graphed_compile`` (``@graphjit.graphed(tracer="compile")``).

paddle variants: ``eager``; ``raw_graph`` (``paddle.device.cuda.graphs.CUDAGraph`` by hand);
``graphed`` (tracer eager), ``graphed_ast``, ``graphed_sot`` (last: capturing around SOT has crashed
Paddle 2.6.2).  On GPU, paddle results are marked ``numerics_unverified`` (paddlepaddle-gpu 2.6.2
computes elementwise ops wrong on Hopper) and timed with host clocks around a device synchronise.

Also measured once per run: the host cost of one call with 4 tensor inputs whose GPU work is tiny, for ``@graphed``
against a raw ``graph.replay()``: host clock around ``--host-iters`` (32) calls in a row, the device synchronised
(untimed) between such batches, median of 160, the variants taking turns batch by batch. The batches are short so
that the GPU keeps up: 500 calls in a row, as before, gave bimodal samples on the H200 (a raw replay 2.3-4.9 us); a
graph that takes the GPU longer than the host takes to launch it can fill the launch queue, and the host then waits
for the GPU. Every variant runs under try/except: a failure is recorded in the JSON (rewritten after every variant),
never fatal. Without a CUDA GPU the benchmark refuses to run unless ``--allow-cpu`` (a tiny smoke run for CI).

This module is framework-neutral: options, ratios, summary, JSON, table and plot; the runner template (the
variant loop and the host-cost measurement) is :mod:`graphjit.bench.decode_runner`, and the framework runners
that fill in its hooks are :mod:`graphjit.bench.torch.decode` and :mod:`graphjit.bench.paddle.decode`,
imported when the benchmark starts.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import sys
from pathlib import Path
from typing import Any, cast

from . import common
from .common import say
from .decode_runner import DecodeRunner

VARIANTS: dict[str, tuple[str, ...]] = {
    "torch": ("eager", "raw_graph", "graphed", "graphed_alias", "compile_reduce_overhead", "graphed_compile",
              "graphed_compile_alias"),
    "paddle": ("eager", "raw_graph", "graphed", "graphed_ast", "graphed_sot"),
}
# Variants that need torch.compile: skipped by default on CPU (Inductor's C++ build takes tens of seconds).
COMPILE_VARIANTS = ("compile_reduce_overhead", "graphed_compile", "graphed_compile_alias")

TARGETS = {
    "graphed_vs_raw": 1.10,  # @graphed step time / raw graph replay step time
    "graphed_compile_vs_reduce_overhead": 0.95,  # graphed(tracer="compile") / torch.compile reduce-overhead
    "host_graphed_us": 10.0,  # host cost of one @graphed call with 4 tensor inputs (copies in, fresh output)
    "host_graphed_static_alias_us": 5.0,  # the same with static_inputs() and outputs="alias" (nothing copied)
    "sign_us": 1.5,  # signing one such call (its key: shapes, dtypes, devices, modes)
    "guard_us": 1.0,  # what checking the Python values a 4-input step reads adds to a replay
}

GPU_DEFAULTS: dict[str, Any] = {"layers": [8, 32], "hidden": [1024], "batch": [1, 8], "iters": 200, "repeats": 5,
                                 "warmup": 5, "host_iters": 32, "host_repeats": 160}
CPU_DEFAULTS: dict[str, Any] = {"layers": [2], "hidden": [64], "batch": [2], "iters": 5, "repeats": 2, "warmup": 1,
                                 "host_iters": 50, "host_repeats": 3}

DTYPES = ("bf16", "fp16", "fp32")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("decode")
    g.add_argument("--backend", choices=tuple(VARIANTS), default="torch", help="framework (default torch)")
    g.add_argument("--layers", type=common.int_list, default=None,
                   help=f"layer counts, comma-separated (default {_csv(GPU_DEFAULTS['layers'])}; "
                        f"--allow-cpu on CPU: {_csv(CPU_DEFAULTS['layers'])})")
    g.add_argument("--hidden", type=common.int_list, default=None,
                   help=f"hidden sizes (default {_csv(GPU_DEFAULTS['hidden'])}; "
                        f"CPU smoke {_csv(CPU_DEFAULTS['hidden'])})")
    g.add_argument("--batch", type=common.int_list, default=None,
                   help=f"batch sizes (default {_csv(GPU_DEFAULTS['batch'])}; CPU smoke {_csv(CPU_DEFAULTS['batch'])})")
    g.add_argument("--dtype", choices=DTYPES, default=None, help="default bf16 for torch, fp32 for paddle")
    g.add_argument("--iters", type=common.positive_int, default=None,
                   help=f"back-to-back steps per timed repeat (default {GPU_DEFAULTS['iters']})")
    g.add_argument("--repeats", type=common.positive_int, default=None,
                   help=f"timed repeats, median reported (default {GPU_DEFAULTS['repeats']})")
    g.add_argument("--warmup", type=common.positive_int, default=None,
                   help=f"untimed steps per variant before timing (default {GPU_DEFAULTS['warmup']})")
    g.add_argument("--host-iters", type=common.positive_int, default=None,
                   help=f"calls per repeat for the host-cost measurement (default {GPU_DEFAULTS['host_iters']})")
    g.add_argument("--variants", default=None,
                   help="comma-separated subset of: " + "; ".join(f"{k}: {','.join(v)}" for k, v in VARIANTS.items()))
    g.add_argument("--no-host-cost", action="store_true", help="skip the host-cost measurement")
    g.add_argument("--host-only", action="store_true",
                   help="only the host-cost measurement (no decode steps: for Paddle 2.6.2 on Hopper, whose "
                        "elementwise kernels are wrong and slow there)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--allow-cpu", action="store_true",
                   help="without a CUDA GPU, run a tiny smoke version on the CPU (for CI) instead of refusing")


def _csv(values: list[int]) -> str:
    return ",".join(str(v) for v in values)


# -- helpers shared by the backends -------------------------------------------------------------
# -- the framework runners (graphjit.backends) ------------------------------------------------------
def _runner_class(backend: str) -> type[DecodeRunner]:
    """The :class:`DecodeRunner` of ``backend``, from its module in :mod:`graphjit.backends` (imported now; the
    framework itself is imported when the runner is created)."""
    if backend == "torch":
        from .torch.decode import TorchDecodeRunner

        return TorchDecodeRunner
    from .paddle.decode import PaddleDecodeRunner

    return PaddleDecodeRunner


# -- ratios and summary -----------------------------------------------------------------------------
def _us(variants: dict[str, Any], name: str) -> float | None:
    v = variants.get(name) or {}
    return v.get("us_per_step") if v.get("status") == "ok" else None


def _ratio(num: float | None, den: float | None, target: float | None = None) -> dict[str, Any] | None:
    if num is None or den is None or not den:
        return None
    value = num / den
    out: dict[str, Any] = {"value": value}
    if target is not None:
        out.update(target=target, met=bool(value <= target))
    return out


def config_ratios(backend: str, variants: dict[str, Any]) -> dict[str, Any]:
    raw = _us(variants, "raw_graph")
    eager = _us(variants, "eager")
    ratios: dict[str, Any] = {}
    graphed_names = [n for n in VARIANTS[backend] if n.startswith("graphed")]
    for n in graphed_names:
        if n.startswith("graphed_compile"):
            continue
        key = "graphed_vs_raw" if n == "graphed" else f"{n}_vs_raw"
        ratios[key] = _ratio(_us(variants, n), raw, TARGETS["graphed_vs_raw"])
    if backend == "torch":
        ratios["graphed_compile_vs_reduce_overhead"] = _ratio(
            _us(variants, "graphed_compile"), _us(variants, "compile_reduce_overhead"),
            TARGETS["graphed_compile_vs_reduce_overhead"])
        ratios["graphed_compile_alias_vs_reduce_overhead"] = _ratio(
            _us(variants, "graphed_compile_alias"), _us(variants, "compile_reduce_overhead"),
            TARGETS["graphed_compile_vs_reduce_overhead"])
    ratios["speedup_vs_eager"] = {n: eager / us for n in VARIANTS[backend]
                                  if n != "eager" and (us := _us(variants, n)) and eager}
    return {k: v for k, v in ratios.items() if v is not None}


def host_ratios(host: dict[str, Any], on_gpu: bool) -> dict[str, Any]:
    """Ratios of the host-cost measurement; targets are judged on a GPU only (on CPU the graphed
    call takes the no-CUDA path, which is not what the target is about)."""
    us = host.get("us", {})
    out: dict[str, Any] = {}
    if "graphed" in us and "raw_replay" in us:
        out["graphed_vs_raw_replay"] = _ratio(us["graphed"], us["raw_replay"])
    for label, name in (("graphed_static", "host_graphed_static_us"), ("graphed_static_alias",
                        "host_graphed_static_alias_us"), ("part_sign", "sign_us"), ("graphed", "host_graphed_us")):
        if label in us:  # (measured part, its name here: judged against TARGETS[name] where it has one)
            out[name] = {"value": us[label]}
            if on_gpu and name in TARGETS:
                out[name].update(target=TARGETS[name], met=bool(us[label] <= TARGETS[name]))
    for fast in ("graphed", "graphed_alias", "graphed_static", "graphed_static_alias"):
        if fast in us and f"{fast}_python" in us:  # the replay lane against graphjit's Python path, same run
            out[f"{fast}_lane_vs_python"] = _ratio(us[fast], us[f"{fast}_python"])
    if "graphed" in us:
        if "raw_replay" in us:
            out["graphed_minus_raw_replay_us"] = {"value": us["graphed"] - us["raw_replay"]}
        if "graphed_reads" in us:  # the same call reading four Python values: their guards' cost
            out["guard_us"] = {"value": us["graphed_reads"] - us["graphed"]}
            if on_gpu:
                out["guard_us"].update(target=TARGETS["guard_us"], met=bool(us["graphed_reads"] - us["graphed"]
                                                                              <= TARGETS["guard_us"]))
    return out


# -- the command ------------------------------------------------------------------------------------
def _resolve(args: argparse.Namespace, on_gpu: bool) -> None:
    defaults = GPU_DEFAULTS if on_gpu else CPU_DEFAULTS
    for key in ("layers", "hidden", "batch", "iters", "repeats", "warmup", "host_iters"):
        if getattr(args, key) is None:
            setattr(args, key, defaults[key])
    args.host_repeats = defaults["host_repeats"]
    if args.dtype is None:
        args.dtype = "bf16" if args.backend == "torch" else "fp32"


def _pick_variants(args: argparse.Namespace, on_gpu: bool) -> tuple[list[str], dict[str, str]]:
    known = VARIANTS[args.backend]
    skipped: dict[str, str] = {}
    if args.variants:
        wanted = [v.strip() for v in args.variants.split(",") if v.strip()]
        unknown = [v for v in wanted if v not in known]
        if unknown:
            raise ValueError(f"unknown {args.backend} variant(s) {', '.join(unknown)}; "
                             f"expected some of {', '.join(known)}")
        return [v for v in known if v in wanted], skipped
    chosen = []
    for v in known:
        if not on_gpu and v in COMPILE_VARIANTS:
            skipped[v] = "torch.compile on CPU takes tens of seconds; name it in --variants to include it"
        else:
            chosen.append(v)
    return chosen, skipped


def run(args: argparse.Namespace) -> int:
    if not faulthandler.is_enabled():  # a crash inside a framework prints where it happened
        with contextlib.suppress(Exception):
            faulthandler.enable(file=cast(Any, sys.__stderr__))  # None (no stderr) is accepted at runtime too

    on_gpu, code = common.gpu_or_exit("decode", args.backend, args.allow_cpu)
    if code is not None:
        return code
    _resolve(args, on_gpu)
    try:
        variants, skipped = _pick_variants(args, on_gpu)
    except ValueError as exc:
        print(f"graphjit bench decode: {exc}", file=sys.stderr, flush=True)
        return 2
    tag = common.machine_tag(args)
    json_path, png_path = common.output_paths(args.out, f"decode_{args.backend}_{tag}.json")
    numerics_unverified = args.backend == "paddle" and on_gpu

    data = common.header("decode", args, tag)
    data.update({
        "backend": args.backend,
        "device": "cuda" if on_gpu else "cpu",
        "smoke": not on_gpu,
        "numerics_unverified": numerics_unverified,
        "config": {
            "layers": args.layers, "hidden": args.hidden, "batch": args.batch, "dtype": args.dtype,
            "iters": args.iters, "repeats": args.repeats, "warmup": args.warmup, "variants": variants,
            "skipped_variants": skipped,
            "step": "L x [x = x + silu(x @ W); x = RMSNorm(x) * g] (RMSNorm in fp32), weights closed over "
                    "(torch on GPU: marked static with torch._dynamo.mark_static_address, as parameters are)",
            "timer": {"torch": "cuda_events" if on_gpu else "host",
                      "paddle": "host_sync" if on_gpu else "host"}[args.backend],
            "error_metrics": "rel_error = ||out - eager|| / ||eager|| (max over 2 inputs); "
                             "max_rel_error = max|out - eager| / max|eager|",
        },
        "targets": TARGETS,
        "env": common.environment(),
        "configs": [],
        "host_cost": None,
        "complete": False,
    })
    if numerics_unverified:
        data["numerics_note"] = ("paddlepaddle-gpu 2.6.2 has no sm_90 code for its elementwise kernels; on Hopper "
                                 "they return garbage, so the outputs compared here are not trustworthy: timings only")
    say(f"decode [{args.backend}, {data['device']}, {args.dtype}]: layers={_csv(args.layers)} "
        f"hidden={_csv(args.hidden)} batch={_csv(args.batch)} variants={','.join(variants)} -> {json_path}")

    runner: DecodeRunner | None = common.start("decode", data, json_path,
                                               lambda: _runner_class(args.backend)(args, on_gpu),
                                               f"the {args.backend} backend")
    if runner is None:
        return 1

    for layers in [] if args.host_only else args.layers:
        for hidden in args.hidden:
            for batch in args.batch:
                _run_config(runner, data, json_path, variants, layers, hidden, batch)

    dead = runner.unusable()
    if dead:
        data["host_cost"] = {"status": "skipped", "reason": f"not run: {dead}"}
    elif not args.no_host_cost:
        say("decode: host cost of one call (4 tensor inputs, tiny GPU work) ...")
        host = common.guarded(runner.host_cost)
        host["ratios"] = host_ratios(host, on_gpu)
        if host.get("us"):
            say("decode: host cost (us): " + ", ".join(f"{k} {v:.2f}" for k, v in host["us"].items()))
        data["host_cost"] = host
        common.write_json(json_path, data)
    try:
        runner.teardown()
    except Exception:  # nothing left to measure
        pass

    data["summary"] = _summary(data)
    data["complete"] = True
    plot_note = None if args.no_plot else _plot(data, png_path)
    data["plot"] = None if (args.no_plot or plot_note) else png_path.name
    if plot_note:
        data["plot_error"] = plot_note
    common.write_json(json_path, data)
    _print_table(data)
    say(f"wrote {json_path}" + (f" and {png_path}" if data["plot"] else ""))
    if plot_note:
        say(f"no plot: {plot_note}")
    if args.backend == "paddle" and on_gpu and not args.hard_exit:
        say("note: paddle keeps every captured graph alive; pass --hard-exit if the process hangs or crashes at exit")
    return 0 if data["summary"]["ok"] else 1


def _run_config(runner: DecodeRunner, data: dict[str, Any], json_path: Path, variants: list[str], layers: int,
                hidden: int, batch: int) -> None:
    label = f"L{layers} H{hidden} B{batch}"
    cfg: dict[str, Any] = {"label": label, "layers": layers, "hidden": hidden, "batch": batch,
                           "dtype": data["config"]["dtype"], "variants": {}}
    data["configs"].append(cfg)
    say(f"decode: {label}: building the step ...")

    def build() -> dict[str, Any]:
        runner.build(layers, hidden, batch)
        return {"status": "ok"}

    built = common.guarded(build)
    if built.get("status") != "ok":
        cfg["error"] = built.get("error")
        cfg["traceback"] = built.get("traceback")
        common.write_json(json_path, data)
        say(f"decode: {label}: build failed: {cfg['error']}")
        return
    for name in variants:
        dead = runner.unusable()
        if dead:
            cfg["variants"][name] = {"status": "skipped", "reason": f"not run: {dead}"}
            continue
        say(f"decode: {label}: {name} ...")
        result = common.guarded(lambda name=name: runner.variant(name))
        cfg["variants"][name] = result
        cfg["ratios"] = config_ratios(data["backend"], cfg["variants"])
        common.write_json(json_path, data)  # a crash later keeps what was measured so far
        if result.get("status") == "ok":
            say(f"decode: {label}: {name}: {result['us_per_step']:.1f} us/step, rel_error {result['rel_error']:.2g}"
                + ("" if result.get("correct", True) else " (ABOVE TOLERANCE)"))
        else:
            say(f"decode: {label}: {name}: {result.get('status')}: "
                f"{result.get('error') or result.get('reason') or result.get('fallback_reasons')}")


def _summary(data: dict[str, Any]) -> dict[str, Any]:
    problems: list[str] = []
    check_numerics = not data["numerics_unverified"]
    targets: dict[str, list[bool]] = {}
    for cfg in data["configs"]:
        if cfg.get("error"):
            problems.append(f"{cfg['label']}: {cfg['error']}")
        for name, v in cfg["variants"].items():
            status = v.get("status")
            if status in ("error", "fallback"):
                problems.append(f"{cfg['label']} {name}: {status}: {v.get('error') or v.get('fallback_reasons')}")
            elif check_numerics and v.get("correct") is False:
                problems.append(f"{cfg['label']} {name}: rel_error {v.get('rel_error')} above {v.get('tolerance')}")
        for key, r in cfg.get("ratios", {}).items():
            if isinstance(r, dict) and "met" in r:
                targets.setdefault(key, []).append(r["met"])
    host = data.get("host_cost") or {}
    if host.get("status") == "error":
        problems.append(f"host cost: {host.get('error')}")
    for key, r in (host.get("ratios") or {}).items():
        if "met" in r:
            targets.setdefault(key, []).append(r["met"])
    return {"ok": not problems, "problems": problems,
            "targets_met": {k: all(v) for k, v in targets.items()}}


def _plot(data: dict[str, Any], png_path: Path) -> str | None:
    configs = [c for c in data["configs"] if c.get("variants")]
    if not configs:
        return "nothing was measured"
    names = data["config"]["variants"]
    series = {n: [_us(c["variants"], n) for c in configs] for n in names}
    gpu = (data["env"].get(data["backend"]) or {}).get("gpu") or data["device"]
    title = f"decode step, {data['backend']} {data['config']['dtype']}, {gpu} ({data['tag']})"
    notes = []
    if data["numerics_unverified"]:
        notes.append("numerics unverified (timings only)")
    if data["smoke"]:
        notes.append("CPU smoke run: not a measurement")
    return common.bar_plot(png_path, title, [c["label"] for c in configs], series, "microseconds per step (median)",
                           notes)


def _print_table(data: dict[str, Any]) -> None:
    names = data["config"]["variants"]
    rows = []
    for cfg in data["configs"]:
        row: list[Any] = [cfg["label"]]
        for n in names:
            v = cfg["variants"].get(n) or {}
            row.append(v.get("us_per_step") if v.get("status") == "ok" else (v.get("status") or "-"))
        r = cfg.get("ratios", {})
        row.append((r.get("graphed_vs_raw") or {}).get("value"))
        if data["backend"] == "torch":
            row.append((r.get("graphed_compile_vs_reduce_overhead") or {}).get("value"))
        rows.append(row)
    headers = ["config", *names, "graphed/raw"]
    if data["backend"] == "torch":
        headers.append("gcompile/ro")
    say(f"\ndecode step, microseconds ({data['backend']}, {data['device']}, {data['config']['dtype']})")
    say(common.format_table(headers, rows))
    host = data.get("host_cost") or {}
    if host.get("us"):
        say("host cost per call (us): " + ", ".join(f"{k} {v:.2f}" for k, v in host["us"].items()))
    summary = data["summary"]
    if summary["targets_met"]:
        say("targets met: " + ", ".join(f"{k}={'yes' if v else 'NO'}" for k, v in summary["targets_met"].items()))
    for p in summary["problems"]:
        say(f"problem: {p}")
    if data["numerics_unverified"]:
        say("numerics unverified on this machine: timings only")
