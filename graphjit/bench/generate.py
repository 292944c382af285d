"""``python -m graphjit bench generate``: transformers' ``generate()`` per model family, eager against the one line
``graphjit.graph_generation(model)`` (eager and compile tracers) and against transformers' own compiled path.

Per family (``--families``; models from :mod:`graphjit.bench.torch.hf_families`, random weights from configs,
``--layers`` x ``--hidden``, ``--dtype``) and batch size (``--batch``), each variant runs on its own copy of the model:
one first ``generate()`` of ``--new-tokens`` greedy tokens after a ``--prompt-len`` prompt (compilation or capture
happen there), then ``--repeats`` more (10; the eager variant ``--eager-repeats``, 4, so its steady state is the
median of two: no target compares it): the second reported alone (a recompilation shows there), the median of the
last half of them as the steady state (seconds per whole ``generate()``; a prefill's key warms up and captures in the
calls before).  At 310e829 on one H100, with 6 repeats, one call in three of the same variant took 1.3-1.6x its
neighbours (the compile tracer's Llama at batch 1: 0.083-0.129 s; transformers' compiled path alike), so a median of
three put single rows at 1.15-1.30x that the calls around them did not show; the median of five outlasts two such
calls.  Every call's tokens are compared with an eager reference made once per family and batch.

Fair timing:

* the models have no end-of-sequence token, so every call makes exactly ``--new-tokens`` tokens (a variant that made
  another number is a problem in the summary: times of other lengths do not compare);
* the collector runs before each timed call, outside the timer;
* each variant runs in a fresh Inductor and Triton cache (``--compile-cache fresh``, the default: torch's own
  cold-start context), so both compiled variants' first calls compile cold; otherwise the one that runs second finds
  the kernels the first compiled (``--compile-cache kept`` measures that warm start);
* on a GPU the compiler is started once, on a small decode-like function compiled both ways the variants compile,
  and once per family, on a one-layer model of the family through both compiled ``generate()`` paths, before the
  family's first compiled variant (its seconds in that variant's ``compiler_start_s``), so what a process pays once
  for its first compilation of a family's code (Dynamo's first trace of its modeling file among it) lands in
  neither;
* the two compiled variants take turns going first (``order`` in each row), so whatever one compilation leaves warm
  in the process for the next one of the same model favours neither: in the 34a2aeb run, where ``graphed_compile``
  always went first, its first call was the slower in 10 of 20 rows, by at most 1.34x, with the time outside the
  compiler within 0.3-0.8 s either way.  They swap from one batch size to the next and from one family to the next
  (until 310e829 row by row, so that with two batch sizes the compile tracer went first in every batch-1 row and
  transformers' in every batch-8 row: over the 94 kept runs of the 20 rows other than Gemma's the compile tracer's
  first call averaged 0.944x transformers' where it went first and 0.926x where it went second, which the batch size
  alone could also explain).

Variants:

* ``eager``: a static cache, transformers' compilation off: the reference tokens;
* ``graphed``: ``graph_generation(model)``, ``generate()`` with its defaults;
* ``graphed_compile``: ``graph_generation(model, tracer="compile")``;
* ``hf_compiled``: ``generate(cache_implementation="static")``, which compiles the decode step itself
  (``torch.compile(mode="reduce-overhead")``; Dynamo reset before each).

Targets (``summary``, judged on a GPU): ``graphed`` tokens equal eager's; ``graphed_compile`` steady state at most
1.0x ``hf_compiled``'s and its first call no slower; ``graphed``'s first call at most 1/10 of ``hf_compiled``'s.
Writes ``generate_torch_<tag>.json`` and a PNG of the steady-state times.  Needs transformers and a CUDA GPU;
``--allow-cpu`` runs a tiny smoke version (no graphs, no compilation) for CI.  Framework code:
:mod:`graphjit.bench.torch.generate`.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from . import common
from .common import say

VARIANTS = ("eager", "graphed", "graphed_compile", "hf_compiled")
FAMILIES = ("llama", "qwen2", "mistral", "qwen3", "phi3", "qwen2_moe", "mixtral", "gpt2", "gemma2", "gemma3_text",
            "qwen2_vl", "t5")
TARGETS = {"graphed_compile_vs_hf_compiled_steady": 1.0, "graphed_compile_vs_hf_compiled_first": 1.0,
           "graphed_vs_hf_compiled_first": 0.1}
RATIOS = {"graphed_compile_vs_hf_compiled_steady": ("graphed_compile", "hf_compiled", "steady_s"),
          "graphed_compile_vs_hf_compiled_first": ("graphed_compile", "hf_compiled", "first_s"),
          "graphed_vs_hf_compiled_first": ("graphed", "hf_compiled", "first_s"),
          "graphed_vs_hf_compiled_steady": ("graphed", "hf_compiled", "steady_s"),
          "eager_vs_graphed_steady": ("eager", "graphed", "steady_s"),
          "graphed_compile_vs_hf_compiled_second": ("graphed_compile", "hf_compiled", "second_s")}
GPU_DEFAULTS: dict[str, Any] = {"families": ",".join(FAMILIES), "layers": 8, "hidden": 1024, "batch": [1, 8],
                                "new_tokens": 64, "prompt_len": 16, "repeats": 10, "eager_repeats": 4}
CPU_DEFAULTS: dict[str, Any] = {"families": "llama,gpt2", "layers": 2, "hidden": 64, "batch": [1], "new_tokens": 4,
                                "prompt_len": 5, "repeats": 1, "eager_repeats": 1}


def output_name(asked: str | None, families: list[str], tag: str) -> str:
    """The JSON's file name in ``--out``: ``generate_torch_<tag>.json`` for the default families, and with the
    families named where ``--families`` chose them (``generate_t5_torch_<tag>.json``), so that runs of other families
    into one folder do not overwrite each other."""
    return f"generate_torch_{tag}.json" if asked is None else f"generate_{'_'.join(families)}_torch_{tag}.json"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("generate")
    g.add_argument("--families", default=None, help=f"comma-separated subset of {', '.join(FAMILIES)} (default all)")
    g.add_argument("--layers", type=common.positive_int, default=None, help="layers (default 8)")
    g.add_argument("--hidden", type=common.positive_int, default=None, help="hidden size (default 1024)")
    g.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16", help="model dtype (default bf16)")
    g.add_argument("--batch", type=common.int_list, default=None, help="batch sizes, comma-separated (default 1,8)")
    g.add_argument("--new-tokens", type=common.positive_int, default=None, help="greedy tokens per call (default 64)")
    g.add_argument("--prompt-len", type=common.positive_int, default=None, help="prompt tokens (default 16)")
    g.add_argument("--repeats", type=common.positive_int, default=None,
                   help="generate() calls after the first: the second alone, the median of the last half (default 10)")
    g.add_argument("--eager-repeats", type=common.positive_int, default=None,
                   help="the same for the eager variant, whose steady state no target compares (default 4: the "
                        "median of the last two)")
    g.add_argument("--compile-cache", choices=("fresh", "kept"), default="fresh",
                   help="fresh (default): each variant in empty Inductor and Triton caches, a cold first call; "
                        "kept: the caches on disk as earlier variants and runs left them")
    g.add_argument("--sliding-window", type=common.positive_int, default=None,
                   help="Gemma 2 and 3's sliding window (default: the config's own, 4096, which a generation this "
                        "short never fills, as with the released models; the tests use 16)")
    g.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated subset of {', '.join(VARIANTS)}")
    g.add_argument("--allow-cpu", action="store_true", help="without a CUDA GPU, a tiny smoke run (for CI)")
    g.add_argument("--time-budget", type=common.positive_int, default=None,
                   help="seconds: a variant that would end past them, going by the longest one so far, is skipped "
                        "(status 'skipped' in the JSON; a skipped graphed variant is a problem: its tokens go "
                        "unchecked), so a run under a time limit still ends with its JSON and plot")


def run(args: argparse.Namespace) -> int:
    on_gpu, code = common.gpu_or_exit("generate", "torch", args.allow_cpu, needs="transformers")
    if code is not None:
        return code
    asked = args.families
    for key, value in (GPU_DEFAULTS if on_gpu else CPU_DEFAULTS).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    families = common.pick("generate", "family", args.families, FAMILIES)
    variants = common.pick("generate", "variant", args.variants, VARIANTS)
    if families is None or variants is None:
        return 2
    if not on_gpu:  # the smoke run: no compilation on a CPU
        dropped = [v for v in variants if v in ("graphed_compile", "hf_compiled")]
        variants = [v for v in variants if v not in dropped]
        if dropped:
            say(f"generate: on a CPU without {', '.join(dropped)} (they compile)")
        if not variants:
            print("graphjit bench generate: nothing left to run on a CPU (the compiled variants need a GPU)",
                  file=sys.stderr, flush=True)
            return 2
    tag = common.machine_tag(args)
    json_path, png_path = common.output_paths(args.out, output_name(asked, families, tag))
    data = common.grid_header("generate", args, tag, on_gpu, {
        "families": families, "variants": variants, "layers": args.layers, "hidden": args.hidden, "dtype": args.dtype,
        "batch": args.batch, "new_tokens": args.new_tokens, "prompt_len": args.prompt_len, "repeats": args.repeats,
        "eager_repeats": args.eager_repeats,
        "compile_cache": args.compile_cache, "sliding_window": args.sliding_window},
        timer="host clock, synchronised")
    say(f"generate [torch, {data['device']}]: {','.join(families)} x batch {args.batch}, {args.layers} layers, "
        f"hidden {args.hidden}, {args.dtype} -> {json_path}")
    bench = common.start("generate", data, json_path,
                         lambda: common.framework_half("torch.generate", "GenerateBench")(args, on_gpu))
    if bench is None:
        return 1
    rows = []
    budget = common.TimeBudget(args.time_budget)
    for fi, family in enumerate(families):
        for bi, batch in enumerate(args.batch):
            name = f"{family} B{batch}"
            order = _turn(variants, fi + bi)
            entry: dict[str, Any] = {"variants": {}, "order": order}
            data["results"][name] = entry
            for variant in order:
                if budget.spent():
                    entry["variants"][variant] = budget.skipped()
                    continue
                say(f"generate: {name}: {variant} ...")
                with budget.timed():
                    entry["variants"][variant] = common.guarded(
                        lambda family=family, batch=batch, variant=variant: bench.measure(family, batch, variant))
                common.write_json(json_path, data)
            entry["ratios"] = _ratios(entry)
            v = entry["variants"]
            rows.append([name, *(_s(v, x, "first_s") for x in variants), *(_s(v, x, "second_s") for x in variants),
                         *(_s(v, x, "steady_s") for x in variants), (v.get("graphed") or {}).get("tokens_equal_eager")])
    data["summary"] = _summary(data, on_gpu)
    data["complete"] = True
    if not args.no_plot:
        names = list(data["results"])
        note = common.bar_plot(png_path, f"generate(): steady state per call (torch {args.dtype}, {tag})", names,
                               {x: [_s(data["results"][n]["variants"], x, "steady_s") for n in names]
                                for x in variants}, "seconds per generate() (median)",
                               notes=[f"{args.layers} layers, hidden {args.hidden}, {args.new_tokens} new tokens"])
        data["plot"] = None if note else png_path.name
        if note:
            data["plot_error"] = note
    common.write_json(json_path, data)
    say(common.format_table(["model", *(f"{x} first s" for x in variants), *(f"{x} second s" for x in variants),
                             *(f"{x} steady s" for x in variants), "graphed tokens = eager"], rows))
    same = data["summary"]["compiled_tokens_equal"]
    if same:
        differ = [n for n, eq in same.items() if not eq]
        say(f"generate: the compile tracer's tokens equal transformers' compiled ones in {len(same) - len(differ)} "
            f"of {len(same)} rows{'; not in ' + ', '.join(differ) if differ else ''}")
    say(f"wrote {json_path}")
    return 0 if data["summary"]["ok"] else 1


def _s(variants: dict[str, Any], variant: str, field: str) -> float | None:
    res = variants.get(variant) or {}
    return res.get(field) if res.get("status") == "ok" else None


def _turn(variants: list[str], turn: int) -> list[str]:
    """``variants`` in the order a row runs them: where ``turn`` (the family's place in the run plus the batch size's
    in ``--batch``) is odd, the two compiled variants swap places, so that a batch size's rows alternate too."""
    out = list(variants)
    if turn % 2 and "graphed_compile" in out and "hf_compiled" in out:
        i, j = out.index("graphed_compile"), out.index("hf_compiled")
        out[i], out[j] = out[j], out[i]
    return out


def _ratios(entry: dict[str, Any]) -> dict[str, float]:
    out = {}
    for name, (a, b, field) in RATIOS.items():
        x, y = _s(entry["variants"], a, field), _s(entry["variants"], b, field)
        if x is not None and y:
            out[name] = x / y
    return out


def _wrong(variant: str, res: dict[str, Any]) -> str | None:
    if variant == "graphed" and res.get("tokens_equal_eager") is not True:
        return f"tokens differ from eager's in calls {res.get('calls_equal_eager')}"
    made = res.get("tokens_made")
    if made is not None and any(n != res.get("new_tokens") for n in made):  # times of other lengths do not compare
        return f"made {made} new tokens per call, not {res.get('new_tokens')}"
    return None


def _summary(data: dict[str, Any], on_gpu: bool) -> dict[str, Any]:
    problems = common.grid_problems(data, _wrong)
    problems += [f"{name}/graphed: skipped by --time-budget: its tokens were not compared with eager's"
                 for name, entry in data["results"].items()
                 if (entry["variants"].get("graphed") or {}).get("status") == "skipped"]
    met = {name: {k: entry["ratios"][k] <= t for k, t in TARGETS.items() if k in entry["ratios"]}
           for name, entry in data["results"].items()} if on_gpu else {}
    return {"ok": not problems, "problems": problems, "targets": TARGETS, "met": met,
            "compiled_tokens_equal": compiled_tokens_equal(data["results"])}


def compiled_tokens_equal(results: dict[str, Any]) -> dict[str, bool]:
    """Per row where both compiled variants ran: whether the compile tracer's first ``generate()`` made the tokens
    transformers' compiled one made (``tokens_vs``, recorded by the one that ran second).  Information, not a
    problem: both run Inductor's kernels of the same step, but each tunes its kernels by timing them, and a
    differently tuned reduction may round otherwise in bf16."""
    out = {}
    for name, entry in results.items():
        for res in (entry.get("variants") or {}).values():
            vs = (res or {}).get("tokens_vs") or {}
            if vs and res.get("status") == "ok":
                out[name] = all(vs.values())
    return out
