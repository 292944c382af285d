"""What ``graph_generation(model, tracer="compile")`` compiles, call by call of ``generate()`` (torch, one GPU).

For each family of ``graphjit.bench.torch.hf_families``: ``--calls`` greedy ``generate()`` calls after
``graph_generation(model, tracer="compile")``, and for each call its wall time, what Dynamo did meanwhile (frames
compiled, recompiles with their reasons, graph breaks) and what graphjit did (captures, replays, fallbacks by
reason).  A call that costs seconds after the first is a compile: this says which guard sent Dynamo back.

Diagnostic only (the speed claims are ``python -m graphjit bench generate``'s).  Writes one JSON to ``--out``.
Usage (GPU machine, repo root): ``PYTHONPATH=. python3 tools/probes/compile_recompiles.py --families t5,gemma3_text
--out DIR``.  ``--allow-cpu`` runs a tiny model on the CPU (a smoke run of the probe: no graphs, so compiles only).
``--spy`` records, per call, the cache layers' Python counters each time graphjit enters the compiled function
(``compiled_entries``): which calls hand Dynamo a new value of a counter it guards.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path
from typing import Any

import torch
import transformers

import graphjit
from graphjit.bench.torch import hf_families


class _Recompiles(logging.Handler):
    """Keeps the messages of Dynamo's ``recompiles`` log artifact."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "recompiles" in record.name:
            self.messages.append(record.getMessage()[:600])


def _dynamo_counts() -> dict[str, int]:
    from torch._dynamo.utils import counters

    return {"frames_compiled": int(counters["stats"].get("unique_graphs", 0)),
            "calls_captured": int(counters["stats"].get("calls_captured", 0)),
            "graph_breaks": int(sum(counters["graph_break"].values()))}


def _graphjit_counts(forward: Any) -> dict[str, Any]:
    st = forward.stats()
    return {k: st[k] for k in ("calls", "graphs", "captures", "replays")} | {"fallbacks": dict(st["fallbacks"])}


def _delta(after: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in after.items():
        if isinstance(v, dict):
            d = {r: n - before.get(k, {}).get(r, 0) for r, n in v.items()}
            out[k] = {r: n for r, n in d.items() if n}
        else:
            out[k] = v - before.get(k, 0)
    return out


class _Entries:
    """``--spy``: the Python ints of the call's cache layers (``cumulative_length_int``, the sliding window's counter)
    each time graphjit enters the compiled function, to tell which calls give Dynamo a new value to guard."""

    def __init__(self) -> None:
        self.seen: list[list[int | None]] = []

    def install(self) -> None:
        from graphjit.backends.torch import graphs

        trace = graphs.TorchBackend.trace
        seen = self.seen

        def spied(backend: Any, fn: Any, tracer: str) -> Any:
            out = trace(backend, fn, tracer)
            if tracer != "compile":
                return out

            def entered(*a: Any, **k: Any) -> Any:
                cache = k.get("past_key_values") or k.get("cache")
                layers = getattr(cache, "layers", None) or getattr(getattr(cache, "self_attention_cache", None),
                                                                    "layers", None) or []
                seen.append([getattr(layer, "cumulative_length_int", None) for layer in layers][:2])
                return out(*a, **k)

            return entered

        graphs.TorchBackend.trace = spied  # type: ignore[method-assign]


class _Compiles:
    """``--spy``: each compilation Dynamo runs (its start and end callbacks): seconds, trigger, graphjit's phase at its
    start (warmup, capture) and the cache counter of the compiled function's last entry; and Dynamo's own phase
    timings (``compilation_time_metrics``), summed per phase over the call."""

    def __init__(self, entries: _Entries) -> None:
        self.entries = entries
        self.events: list[dict[str, Any]] = []
        self._t0 = 0.0

    def install(self) -> None:
        from torch._dynamo.callback import callback_handler

        callback_handler.register_start_callback(self._start)
        callback_handler.register_end_callback(self._end)

    def _start(self, args: Any = None) -> None:
        import sys

        from graphjit import scope

        self._t0 = time.perf_counter()
        self.events.append({"trigger": str(getattr(args, "callback_trigger", "?")),
                            "phase": getattr(scope._tls, "phase", None),
                            "profiled": sys.getprofile() is not None,
                            "entry": self.entries.seen[-1] if self.entries.seen else None})

    def _end(self, args: Any = None) -> None:
        if self.events:
            self.events[-1]["seconds"] = round(time.perf_counter() - self._t0, 3)

    @staticmethod
    def metrics() -> dict[str, float]:
        from torch._dynamo.utils import compilation_time_metrics

        return {k: sum(v) for k, v in compilation_time_metrics.items()}


def probe(family: str, args: argparse.Namespace, device: str, handler: _Recompiles,
          entries: _Entries | None = None, compiles: _Compiles | None = None) -> dict[str, Any]:
    torch._dynamo.reset()  # (clears Dynamo's compile callbacks too)
    if compiles is not None:
        compiles.install()
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    model = hf_families.build(torch, transformers, family, layers=args.layers, hidden=args.hidden, device=device,
                              dtype=dtype)
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(3, 256, (args.batch, args.prompt_len), generator=gen).to(device)
    kwargs: dict[str, Any] = {"max_new_tokens": args.new_tokens, "do_sample": False, "pad_token_id": 0}
    if args.hf:
        kwargs["cache_implementation"] = "static"  # transformers compiles the decode step itself
    else:
        graphjit.graph_generation(model, tracer="compile")
    calls = []
    with torch.no_grad():
        for i in range(args.calls):
            d0, m0 = _dynamo_counts(), len(handler.messages)
            g0 = _graphjit_counts(model.forward) if not args.hf else {}
            e0 = len(entries.seen) if entries is not None else 0
            c0 = len(compiles.events) if compiles is not None else 0
            p0 = compiles.metrics() if compiles is not None else {}
            t0 = time.perf_counter()
            model.generate(prompt, **kwargs)
            if device != "cpu":
                torch.cuda.synchronize()
            seconds = time.perf_counter() - t0
            calls.append({"call": i + 1, "seconds": round(seconds, 4),
                          "dynamo": _delta(_dynamo_counts(), d0),
                          "graphjit": _delta(_graphjit_counts(model.forward), g0) if not args.hf else None,
                          "recompile_reasons": handler.messages[m0:m0 + 12],
                          "recompiles": len(handler.messages) - m0,
                          "compiled_entries": entries.seen[e0:] if entries is not None else None,
                          "compiles": compiles.events[c0:] if compiles is not None else None,
                          "compile_phases_s": (_top(_delta(compiles.metrics(), p0)) if compiles is not None
                                               else None)})
            print(f"{family} call {i + 1}: {seconds:.3f} s, {calls[-1]['recompiles']} recompiles, "
                  f"dynamo {calls[-1]['dynamo']}, graphjit {calls[-1]['graphjit']}", flush=True)
            for m in calls[-1]["recompile_reasons"][:3]:
                print("   ", m.replace("\n", " | ")[:300], flush=True)
            for c in calls[-1]["compiles"] or []:
                print("    compile:", c, flush=True)
            if calls[-1]["compile_phases_s"]:
                print("    phases:", calls[-1]["compile_phases_s"], flush=True)
    return {"calls": calls, "report": model.forward.report()[:4000] if not args.hf else None}


def _top(phases: dict[str, float], n: int = 15) -> dict[str, float]:
    return {k: round(v, 3) for k, v in sorted(phases.items(), key=lambda kv: -kv[1])[:n] if v > 0.01}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--families", default="t5,gemma3_text,llama")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--calls", type=int, default=5)
    p.add_argument("--allow-cpu", action="store_true", help="tiny model on the CPU (a smoke run)")
    p.add_argument("--spy", action="store_true",
                   help="record the cache layers' Python counters each time the compiled function is entered")
    p.add_argument("--hf", action="store_true",
                   help="transformers' own compiled generate() (static cache, its decode step compiled) instead")
    p.add_argument("--plain-floats", action="store_true",
                   help="the compile tracer without Dynamo's specialize_float (an experiment)")
    p.add_argument("--out", default=".")
    args = p.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        if not args.allow_cpu:
            p.error("needs a CUDA GPU (or --allow-cpu for a smoke run)")
        args.layers, args.hidden, args.new_tokens, args.calls = 1, 64, 4, 2
    import torch._dynamo.guards as _guards  # makes its artifact loggers
    del _guards

    torch._logging.set_logs(recompiles=True)
    handler = _Recompiles()
    for name in list(logging.root.manager.loggerDict):
        if name.endswith("__recompiles"):
            logging.getLogger(name).addHandler(handler)
    result: dict[str, Any] = {"probe": "compile_recompiles", "torch": torch.__version__,
                              "transformers": transformers.__version__, "device": device, "args": vars(args),
                              "families": {}}
    entries = _Entries() if args.spy else None
    compiles = _Compiles(entries) if entries is not None else None
    if entries is not None and compiles is not None:
        entries.install()
    if args.plain_floats:
        from graphjit.backends.torch import dynamo

        dynamo.for_capture = lambda compiled: compiled  # type: ignore[assignment]
    for family in args.families.split(","):
        try:
            result["families"][family] = probe(family, args, device, handler, entries, compiles)
        except Exception as exc:  # one family's failure is its result
            result["families"][family] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
            print(f"{family}: {type(exc).__name__}: {exc}"[:500], flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = "compile_recompiles" + ("_hf" if args.hf else "") + ("_plain_floats" if args.plain_floats else "")
    (out / f"{name}.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
