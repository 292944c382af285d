"""Where the first ``generate()`` of the compile tracer spends its compilation, against transformers' compiled one,
and what Inductor's pointwise autotuning costs in it (torch, one GPU).

For each family of ``graphjit.bench.torch.hf_families`` at one batch size, in one process, after the compiler is
started for the family as ``bench generate`` starts it (``GenerateBench.start_compiler``): ``--rounds`` rounds of
three variants, each through ``GenerateBench.measure`` (a fresh model copy, fresh Inductor and Triton caches, Dynamo
reset, tokens compared with eager's): ``graphed_compile`` (graphjit's compile tracer as shipped), ``untuned`` (the
same with ``torch._inductor.config.triton.autotune_pointwise`` off while it runs: one Triton configuration per
pointwise kernel, nothing benchmarked at its first launch) and ``hf_compiled``; the order turns by one each round.
Per variant and round: the first and steady ``generate()`` seconds, the seconds inside Dynamo's compilations, the
seconds of Dynamo's timed phases (``torch._dynamo.utils.compilation_time_metrics``: Inductor's lowering, Triton's
compilation, the autotuner's benchmarks of each kernel's configurations), and the kernels Inductor generated.

Diagnostic only: the speed claims are made by ``python -m graphjit bench generate``.  Writes JSON to ``--out``.
Usage (GPU machine, repo root): ``PYTHONPATH=. python3 tools/probes/compile_first.py --families gpt2,qwen2
--batch 1 --rounds 2 --out DIR``.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import torch

from graphjit.bench.torch import generate as bench_generate

VARIANTS = ("graphed_compile", "untuned", "hf_compiled")
PHASES = 14  # Dynamo's timed phases kept per measurement, the longest first


def measure(bench: bench_generate.GenerateBench, family: str, batch: int, variant: str) -> dict[str, Any]:
    """One measurement of ``variant`` with Dynamo's phase timers and Inductor's kernel count cleared before it."""
    from torch._dynamo import utils as dynamo_utils
    from torch._inductor import metrics

    dynamo_utils.compilation_time_metrics.clear()
    metrics.reset()
    if variant == "untuned":
        with torch._inductor.config.patch({"triton.autotune_pointwise": False}):
            res = bench.measure(family, batch, "graphed_compile")
    else:
        res = bench.measure(family, batch, variant)
    phases = {k: (round(sum(v), 4), len(v)) for k, v in dynamo_utils.compilation_time_metrics.items()}
    longest = sorted(phases.items(), key=lambda kv: -kv[1][0])[:PHASES]
    keep = ("status", "first_s", "steady_s", "first_compile_s", "first_compile_by_trigger_s", "first_capture_s",
            "tokens_equal_eager", "dynamo_graphs", "compiler_start_s")
    out = {k: res.get(k) for k in keep if k in res}
    out["phases_s"] = {k: v[0] for k, v in longest}
    out["phase_calls"] = {k: v[1] for k, v in longest}
    out["autotune_s"] = phases.get("CachingAutotuner.benchmark_all_configs", (0.0, 0))[0]
    out["autotuned_kernels"] = phases.get("CachingAutotuner.benchmark_all_configs", (0.0, 0))[1]
    out["generated_kernels"] = int(getattr(metrics, "generated_kernel_count", 0))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--families", default="gpt2,qwen2,llama")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--out", default=".")
    a = p.parse_args()
    args = argparse.Namespace(dtype="bf16", hidden=a.hidden, layers=a.layers, sliding_window=None, prompt_len=16,
                              new_tokens=64, repeats=10, eager_repeats=4, compile_cache="fresh")
    bench = bench_generate.GenerateBench(args, on_gpu=torch.cuda.is_available())
    report: dict[str, Any] = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
                              "torch": torch.__version__, "batch": a.batch, "layers": a.layers, "hidden": a.hidden,
                              "families": {}}
    path = Path(a.out) / f"compile_first_b{a.batch}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    for family in a.families.split(","):
        bench.reference_tokens(family, a.batch)
        if bench.on_gpu:  # here, not inside the first variant's measure: its kernels would count in that variant's
            bench.start_compiler(family)
        runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
        for r in range(a.rounds):
            order = VARIANTS[r % 3:] + VARIANTS[:r % 3]
            for variant in order:
                res = measure(bench, family, a.batch, variant)
                runs[variant].append(res)
                print(f"{family} B{a.batch} round {r} {variant}: first {res.get('first_s', 0):.3f} s (compile "
                      f"{res.get('first_compile_s') or 0:.3f}, autotune {res['autotune_s']:.3f} s over "
                      f"{res['autotuned_kernels']} kernels, {res['generated_kernels']} generated), steady "
                      f"{res.get('steady_s', 0):.4f} s, tokens equal {res.get('tokens_equal_eager')}", flush=True)
        summary = {v: {"first_s_mean": statistics.mean(x["first_s"] for x in rs),
                       "steady_s_median": statistics.median(x["steady_s"] for x in rs),
                       "autotune_s_mean": statistics.mean(x["autotune_s"] for x in rs)}
                   for v, rs in runs.items() if rs and all("first_s" in x for x in rs)}
        print(f"{family} B{a.batch} summary: {json.dumps(summary)}", flush=True)
        report["families"][family] = {"runs": runs, "summary": summary}
        path.write_text(json.dumps(report, indent=1))  # after each family: a run cut by its timeout keeps the done ones
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
