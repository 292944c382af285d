"""Where a compiled variant's first ``generate()`` spends its time outside Dynamo's compilation (torch, one GPU).

``bench generate`` splits each compiled variant's first call into ``first_compile_s`` (inside Dynamo's compilation
callbacks) and the rest.  At a5faf48 on one H100 graphjit's compile tracer compiled 0.2-1.1 s faster than transformers'
compiled path in 23 of 24 rows but spent more outside the compilation in some families (T5 0.61-0.78 s against
0.29-0.39 s, Qwen2-VL 0.62 against 0.35, Gemma at batch 1 about 1.0 against 0.24-0.35).  This probe runs one family the
way the bench does (an eager ``generate()`` at the batch size, the compiler started on the family's one-layer model,
each variant on its own copy in a fresh Inductor and Triton cache), then each compiled variant's first
``generate()`` under cProfile, and reports: the first call's seconds, the part inside Dynamo's compilation, the
garbage collector's seconds by generation (a collection starts wherever allocations pass its threshold), and the
functions with the most cumulative time outside the compilation (graphjit's and torch's) and by own time
(everything: the compilation's own functions among them).

Diagnostic only.  Usage (GPU machine, repo root): ``PYTHONPATH=. python3 tools/probes/first_call_profile.py --family t5
--layers 8 --hidden 1024 --dtype bf16 --out DIR``.  ``--emulate`` runs it on a CPU through tests/graph_emulator.py
with Dynamo's eager backend (a smoke run of the probe: its numbers mean little)."""

from __future__ import annotations

import argparse
import contextlib
import copy
import cProfile
import gc
import io
import json
import pstats
import sys
from pathlib import Path
from typing import Any

import torch

from graphjit.bench.common import GcClock
from graphjit.bench.torch import generate as bench_generate


def profile_first(bench: Any, family: str, batch: int, variant: str, top: int, no_gc: bool = False,
                  dump: Path | None = None) -> dict[str, Any]:
    """``variant``'s first ``generate()`` of ``family`` at ``batch`` as ``bench generate`` runs it, profiled
    (``no_gc``: with the cyclic collector off during the call, so that no collection's pause is counted in whichever
    function it interrupted; the call's time then leaves those pauses out).  ``dump``: also the whole profile there
    (``pstats`` format, ``VARIANT.pstats``), to be read with ``pstats.Stats(...).print_callees(...)``."""
    torch._dynamo.reset()
    model = copy.deepcopy(bench.model(family))
    prompt = bench.prompt(batch)
    extra = bench_generate._set_up(model, variant)
    collector = GcClock()
    clock = bench_generate._CompileClock()
    prof = cProfile.Profile()
    gc.collect()
    with collector:
        if no_gc:
            gc.disable()
        try:
            with clock:
                prof.enable()
                _out, seconds = bench._generate(model, prompt, collect=False, **extra)  # collected above, unwatched
                prof.disable()
        finally:
            if no_gc:
                gc.enable()
    if dump is not None:
        dump.mkdir(parents=True, exist_ok=True)
        prof.dump_stats(str(dump / f"{variant}.pstats"))
    text = io.StringIO()
    stats = pstats.Stats(prof, stream=text).sort_stats("cumulative")
    stats.print_stats(r"graphjit|torch/(cuda|_dynamo/(eval_frame|guards))|transformers/generation", top)
    own = io.StringIO()
    pstats.Stats(prof, stream=own).sort_stats("tottime").print_stats(top)
    res = {"first_s": seconds, "compile_s": clock.seconds, "by_trigger": clock.by_trigger,
           "gc_s_by_generation": collector.seconds, "gc_count_by_generation": collector.collections,
           "outside_compile_s": None if clock.seconds is None else seconds - clock.seconds,
           "top_cumulative": text.getvalue(), "top_own": own.getvalue()}
    if variant.startswith("graphed"):
        st = model.forward.stats()
        res["stats"] = {k: st.get(k) for k in ("calls", "graphs", "captures", "replays", "fallbacks")}
    del model
    gc.collect()
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--family", default="t5")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--top", type=int, default=40)
    p.add_argument("--emulate", action="store_true")
    p.add_argument("--no-gc", action="store_true",
                   help="the cyclic collector off during each profiled call: a collection's pause (0.5-0.8 s for one "
                        "of generation 2) is otherwise counted in whichever function it interrupted")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--dump", action="store_true", help="also each variant's whole profile under --out (pstats files)")
    a = p.parse_args()
    if a.dump and a.out is None:
        p.error("--dump writes its profiles under --out: give --out DIR")
    args = argparse.Namespace(dtype=a.dtype, compile_cache="fresh", sliding_window=None, layers=a.layers,
                              hidden=a.hidden, new_tokens=a.new_tokens, prompt_len=a.prompt_len, repeats=1,
                              eager_repeats=1)
    ctx: Any = contextlib.nullcontext()
    if a.emulate:
        sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
        from graph_emulator import EmulatedTorchBackend, emulated_torch

        from graphjit.backends.torch import dynamo as gj_dynamo

        EmulatedTorchBackend.trace = lambda self, fn, tracer: (  # type: ignore[method-assign]
            gj_dynamo.for_capture(torch.compile(fn, backend="eager")) if tracer == "compile" else fn)
        ctx = emulated_torch()
    on_gpu = torch.cuda.is_available() and not a.emulate
    with ctx:
        bench = bench_generate.GenerateBench(args, on_gpu=on_gpu)
        # the row's eager reference, then the compiler's start, as in the bench (its eager reference and variant run
        # before the compiled ones): at 310e829 the compile tracer, profiled first, spent 0.49 s in 64 eager attention
        # calls of its uncaptured prefill (the kernels' first use at this size in the process), transformers' 0.01 s
        bench.reference_tokens(a.family, a.batch)
        if on_gpu:
            bench.start_compiler(a.family)
        out: dict[str, Any] = {"family": a.family, "batch": a.batch, "layers": a.layers, "hidden": a.hidden,
                               "dtype": a.dtype, "emulated": a.emulate, "no_gc": a.no_gc, "variants": {}}
        for variant in bench_generate.COMPILED:
            if a.emulate and variant == "hf_compiled":
                continue  # transformers' reduce-overhead compiles with Inductor: minutes on a CPU
            with bench_generate._fresh_compile_cache(torch):
                out["variants"][variant] = profile_first(
                    bench, a.family, a.batch, variant, a.top, a.no_gc,
                    a.out / f"pstats_{a.family}_b{a.batch}" if a.dump else None)
    for variant, res in out["variants"].items():
        gcs = sum(res["gc_s_by_generation"])
        print(f"{variant}: first {res['first_s']:.3f} s, compile {res['compile_s']}, outside "
              f"{res['outside_compile_s']}, gc {gcs:.3f} s {res['gc_count_by_generation']}")
        print(res["top_cumulative"])
        print(res["top_own"])
    if a.out is not None:
        a.out.mkdir(parents=True, exist_ok=True)
        path = a.out / f"first_call_profile_{a.family}_b{a.batch}.json"
        path.write_text(json.dumps(out, indent=1, default=str))
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
