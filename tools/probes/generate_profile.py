"""Where the time of a graphed decode step goes inside transformers' ``generate()`` (torch, one GPU).

For one family of ``graphjit.bench.torch.hf_families``: ``graph_generation(model)`` (``--tracer``), ``generate()``
run warm (each compiled variant in fresh Inductor and Triton caches, as ``bench generate`` runs it, unless
``--compile-cache kept``), then

* per token over a whole ``generate()``: the host time spent in the forward calls and the rest (generate's own
  loop, and its waits for the GPU at each token's sync), against transformers' compiled ``generate()`` on a copy;
* one recorded decode call taken apart: binding, signing, the guards, the input loads, the graph's replay (host and
  GPU time, CUDA events) and the output's rebuild, against the whole call.  Between the replays the cache's length
  counters are put back (a replay advances them), untimed, with the Python values a replay advances (a
  sliding-window layer's ``cumulative_length_int``: Gemma's one graph per position).

Any family of ``hf_families`` (T5's decode step is its ``decoder_input_ids`` of one token).  The probe around
``model.forward`` is set once for the whole run: the guards read ``self.forward``, so wrappers swapped between phases
gave every key a second graph.

Diagnostic only: the speed claims are made by ``python -m graphjit bench generate``.  Writes JSON to ``--out``.
Usage (GPU machine, repo root): ``PYTHONPATH=. python3 tools/probes/generate_profile.py --family llama --layers 8
--hidden 1024 --dtype bf16 [--tracer compile] [--hf-compiled] --out DIR``.  ``--emulate`` runs it on a CPU
through tests/graph_emulator.py (a smoke run of the probe itself: its numbers mean nothing).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import transformers

import graphjit
from graphjit.bench.torch import generate as bench_generate
from graphjit.bench.torch import hf_families


def median_us(fn: Callable[[], Any], iters: int, repeats: int = 5, before: Callable[[], Any] | None = None) -> float:
    """Median host microseconds of ``fn`` (``before`` runs untimed ahead of each call)."""
    samples = []
    for _ in range(repeats):
        total = 0.0
        for _ in range(iters):
            if before is not None:
                before()
            t0 = time.perf_counter()
            fn()
            total += time.perf_counter() - t0
        samples.append(total / iters * 1e6)
    return round(statistics.median(samples), 2)


class Tap:
    """What the probe around ``model.forward`` saw: the calls while :attr:`recording` is a list, and the host time
    inside.  :meth:`install` sets the probe once for the whole run, as a plain function (the guards see
    ``self.forward``: wrappers swapped in and out between phases would give every key a second graph, and a callable
    object's changing attributes would be read values that change on every call)."""

    def __init__(self) -> None:
        self.recording: list[tuple[tuple[Any, ...], dict[str, Any]]] | None = None
        self.spent = 0.0
        self.calls = 0

    @classmethod
    def install(cls, model: Any) -> Tap:
        tap = cls()
        forward = model.forward

        def tapped(*args: Any, **kwargs: Any) -> Any:
            if tap.recording is not None:
                tap.recording.append((args, kwargs))
            t0 = time.perf_counter()
            out = forward(*args, **kwargs)
            tap.spent += time.perf_counter() - t0
            tap.calls += 1
            return out

        model.forward = tapped
        return tap


def per_token(model: Any, tap: Tap, prompt: Any, new_tokens: int, sync: Callable[[], None]) -> dict[str, float]:
    """Seconds of one whole ``generate()`` per token, and the host time inside ``model.forward`` per token (the best
    of three calls)."""
    best: tuple[float, float, int] | None = None
    for _ in range(3):
        tap.spent, tap.calls = 0.0, 0
        sync()
        t0 = time.perf_counter()
        model.generate(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
        sync()
        total = time.perf_counter() - t0
        if best is None or total < best[0]:
            best = (total, tap.spent, tap.calls)
    assert best is not None
    total, inside, calls = best
    return {"generate_us_per_token": round(total / new_tokens * 1e6, 1),
            "forward_host_us_per_token": round(inside / calls * 1e6, 1), "forward_calls": calls,
            "rest_us_per_token": round((total - inside) / new_tokens * 1e6, 1)}


def parts(fn: Any, call: tuple[tuple[Any, ...], dict[str, Any]], on_gpu: bool, iters: int) -> dict[str, Any]:
    """One recorded decode call of the graphed ``fn`` taken apart (see the module docstring)."""
    fn = getattr(fn, "decode", fn)  # graph_generation(tracer="compile") may route the decode step apart
    state = fn._self_state
    args, kwargs = call
    cache = kwargs.get("cache", kwargs.get("past_key_values"))
    counters = _tensors(cache)
    # what the recorded call started from: its replay advanced each counter by its one token (and a replay from
    # the state after it would write past the cache's end: an index error, on a GPU a device-side assert); the
    # Python values a replay advances (a sliding-window layer's cumulative_length_int, an encoder-decoder cache's
    # is_updated) are put back to the recorded call's as well
    saved = [(t - 1).clamp_(min=0) for t in counters]
    scalars = _scalars(cache, -1)

    def put_back() -> None:
        for t, s in zip(counters, saved):
            t.copy_(s)
        for holder, name, value in scalars:
            setattr(holder, name, value)

    put_back()  # the key of the recorded call is the one of the state it started from
    signer = state.signer
    bound_args, bound_kwargs = signer.binder.bind(False, args, kwargs)
    sig = signer.sign_walk(None, bound_args, bound_kwargs)
    entry = state.entries.get(sig.key)
    if entry is None:
        return {"error": "the recorded call has no graph: " + fn.report()[:2000]}
    out: dict[str, Any] = {"tensors": len(sig.tensors), "guarded_values": len(entry.guards or ())}
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    out["whole_call_us"] = median_us(lambda: fn(*args, **kwargs), iters, before=put_back)
    out["bind_us"] = median_us(lambda: signer.binder.bind(False, args, kwargs), iters)
    out["sign_us"] = median_us(lambda: signer.sign_walk(None, bound_args, bound_kwargs), iters)
    if entry.check is not None:
        out["guards_us"] = median_us(entry.check, iters)
    out["load_inputs_us"] = median_us(lambda: entry.inputs.load(sig.tensors), iters)
    out["replay_host_us"] = median_us(entry.graph.replay, iters, before=lambda: (put_back(), sync()))
    call = (bound_args, bound_kwargs)
    out["output_copy_us"] = median_us(lambda: entry.outputs.result(sig.pads, True, sig.tensors, call), iters)
    out["output_alias_us"] = median_us(lambda: entry.outputs.result(sig.pads, False, sig.tensors, call), iters)
    if on_gpu:
        spans = []
        for _ in range(iters):
            put_back()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            entry.graph.replay()
            end.record()
            end.synchronize()
            spans.append(start.elapsed_time(end) * 1e3)
        out["replay_gpu_us"] = round(statistics.median(spans), 2)
    put_back()
    return out


def _one_token(kwargs: dict[str, Any]) -> bool:
    """A decode step: one new token per sequence (``input_ids``, or an encoder-decoder's ``decoder_input_ids``)."""
    ids = kwargs.get("input_ids", kwargs.get("decoder_input_ids"))
    return ids is not None and ids.shape[-1] == 1


def _layers(cache: Any) -> list[Any]:
    """The layers of a transformers static cache, or of both caches of an encoder-decoder cache."""
    if cache is None:
        return []
    found = list(getattr(cache, "layers", None) or ())
    for part in ("self_attention_cache", "cross_attention_cache"):
        found.extend(_layers(getattr(cache, part, None)))
    return found


def _tensors(cache: Any) -> list[Any]:
    """The length counters of a transformers static cache's layers (what a replay advances)."""
    return [t for layer in _layers(cache) if isinstance(t := getattr(layer, "cumulative_length", None), torch.Tensor)]


def _scalars(cache: Any, step: int) -> list[tuple[Any, str, Any]]:
    """``(layer, name, value)`` of each int a layer counts its length in, ``step`` added (the value before the
    recorded call's one token), and the cache's own ``is_updated`` as it is (True after the first decoder step)."""
    found: list[tuple[Any, str, Any]] = []
    for layer in _layers(cache):
        for name, value in vars(layer).items():
            if type(value) is int and name.endswith("length_int"):
                found.append((layer, name, max(0, value + step)))
    if isinstance(getattr(cache, "is_updated", None), dict):
        found.append((cache, "is_updated", dict(cache.is_updated)))
    return found


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--family", default="llama", choices=hf_families.FAMILIES)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="bf16")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--tracer", choices=("eager", "compile"), default="eager")
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--hf-compiled", action="store_true", help="also transformers' compiled generate() on a copy")
    p.add_argument("--emulate", action="store_true", help="CPU smoke run through tests/graph_emulator.py")
    p.add_argument("--compile-cache", choices=("fresh", "kept"), default="fresh",
                   help="fresh: each compiled variant in new Inductor and Triton cache folders, as bench generate runs "
                        "it (kept: the second finds the kernels, and their tuned configs, the first compiled)")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    on_gpu = torch.cuda.is_available() and not args.emulate
    if not on_gpu and not args.emulate:
        print("generate_profile: needs a CUDA GPU (or --emulate for a CPU smoke run)", file=sys.stderr)
        return 2
    device = "cuda" if on_gpu else "cpu"
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    emulation: Any = contextlib.nullcontext()
    if args.emulate:
        sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
        from graph_emulator import emulated_torch

        emulation = emulated_torch()
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    model = hf_families.build(torch, transformers, args.family, args.layers, args.hidden, device, dtype)
    prompt = torch.randint(3, 256, (args.batch, 16), generator=torch.Generator().manual_seed(0)).to(device)
    result: dict[str, Any] = {"config": vars(args) | {"out": str(args.out)}, "torch": torch.__version__,
                              "transformers": transformers.__version__,
                              "device": torch.cuda.get_device_name() if on_gpu else "cpu (emulated graphs)"}
    cache = ((lambda: bench_generate._fresh_compile_cache(torch)) if args.compile_cache == "fresh"
             else contextlib.nullcontext)
    with torch.no_grad():
        if args.hf_compiled:
            compiled = copy.deepcopy(model)
            compiled.generation_config.cache_implementation = "static"
            tap = Tap.install(compiled)
            with cache():
                for _ in range(2):  # compiles in the first
                    compiled.generate(prompt, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                                      do_sample=False)
            result["hf_compiled"] = per_token(compiled, tap, prompt, args.new_tokens, sync)
            del compiled
        with emulation, cache():
            graphjit.graph_generation(model, **({"tracer": "compile"} if args.tracer == "compile" else {}))
            graphed = model.forward
            tap = Tap.install(model)
            tap.recording = []
            for _ in range(4):  # warmups, captures (one graph per position takes three calls), the kept cache reused
                model.generate(prompt, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                               do_sample=False)
            recorded, tap.recording = tap.recording, None
            result["graphed"] = per_token(model, tap, prompt, args.new_tokens, sync)
            decode = [c for c in recorded if _one_token(c[1])]
            result["decode_call"] = parts(graphed, decode[-1], on_gpu, args.iters) if decode else {"error": "no call"}
            result["report"] = graphed.report()
    text = json.dumps(result, indent=2, default=str)
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"generate_profile_{args.family}_{args.tracer}.json").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
