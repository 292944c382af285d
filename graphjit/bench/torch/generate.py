"""torch half of ``python -m graphjit bench generate``: one family's model, its prompt, and one variant's timed
``generate()`` calls.  Options, the loop over families, summary, JSON and plot are in :mod:`graphjit.bench.generate`;
torch and transformers are imported when :class:`GenerateBench` is created."""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from typing import Any

from . import hf_families


class GenerateBench:
    """The run's device, dtype and sizes; :meth:`measure` builds a family's model and times one variant on it."""

    def __init__(self, args: argparse.Namespace, on_gpu: bool) -> None:
        import torch
        import transformers

        self.torch = torch
        self.transformers = transformers
        self.args = args
        self.on_gpu = on_gpu
        self.device = "cuda" if on_gpu else "cpu"
        self.dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
        self.models: dict[str, Any] = {}
        self.reference: dict[tuple[str, int], Any] = {}

    def model(self, family: str) -> Any:
        """The family's model (built once, seeded): every variant runs on its own deep copy."""
        if family not in self.models:
            self.models = {family: hf_families.build(self.torch, self.transformers, family, self.args.layers,
                                                     self.args.hidden, self.device, self.dtype)}
        return self.models[family]

    def prompt(self, batch: int) -> Any:
        gen = self.torch.Generator().manual_seed(batch)
        return self.torch.randint(3, 256, (batch, self.args.prompt_len), generator=gen).to(self.device)

    def _generate(self, model: Any, prompt: Any, **extra: Any) -> tuple[Any, float]:
        torch = self.torch
        if self.on_gpu:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(prompt, max_new_tokens=self.args.new_tokens, do_sample=False, pad_token_id=0,
                                 **extra)
        if self.on_gpu:
            torch.cuda.synchronize()
        return out, time.perf_counter() - t0

    def reference_tokens(self, family: str, batch: int) -> Any:
        """Eager ``generate()``'s tokens (static cache, no compilation) for ``family`` at ``batch``, made once."""
        key = (family, batch)
        if key not in self.reference:
            model = copy.deepcopy(self.model(family))
            self.reference[key] = self._generate(model, self.prompt(batch), **_EAGER)[0]
        return self.reference[key]

    def measure(self, family: str, batch: int, variant: str) -> dict[str, Any]:
        """``variant`` on a fresh copy of ``family``'s model: its first ``generate()`` (compilation or capture
        included), its second (``second_s``: a recompilation shows there) and the median of the later ones
        (``steady_s``; the second's where ``--repeats`` is 1), in seconds; every call's tokens compared with eager's
        (``tokens_equal_eager``: all of them)."""
        import gc

        import graphjit

        torch = self.torch
        torch._dynamo.reset()  # every variant compiles afresh (in memory; Inductor's caches on disk stay)
        want = self.reference_tokens(family, batch)
        model = copy.deepcopy(self.model(family))
        prompt = self.prompt(batch)
        extra: dict[str, Any] = {}
        if variant == "eager":
            extra = dict(_EAGER)
        elif variant == "hf_compiled":
            extra = {"cache_implementation": "static"}  # transformers compiles the decode step itself
        elif variant in ("graphed", "graphed_compile"):
            graphjit.graph_generation(model, **({"tracer": "compile"} if variant == "graphed_compile" else {}))
        else:
            raise ValueError(f"unknown variant {variant!r}")
        try:
            out, first = self._generate(model, prompt, **extra)
            equal = [bool(torch.equal(out, want))]
            steady = []
            for _ in range(self.args.repeats):
                out, seconds = self._generate(model, prompt, **extra)
                steady.append(seconds)
                equal.append(bool(torch.equal(out, want)))
            res: dict[str, Any] = {"status": "ok", "first_s": first, "second_s": steady[0],
                                   "steady_s": statistics.median(steady[1:] or steady),
                                   "samples_s": steady, "new_tokens": self.args.new_tokens,
                                   "tokens_equal_eager": all(equal), "calls_equal_eager": equal}
            if variant.startswith("graphed"):
                st = model.forward.stats()
                res["stats"] = {k: st.get(k) for k in ("calls", "graphs", "captures", "replays", "fallbacks")}
            return res
        finally:
            del model  # a graphed model refers to itself (its wrappers): freed by the collector, its graphs with it
            gc.collect()
            if self.on_gpu:
                torch.cuda.empty_cache()


_EAGER = {"cache_implementation": "static", "disable_compile": True}
"""The reference: transformers' static cache, no compilation, no graphjit."""
