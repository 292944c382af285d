"""torch half of ``python -m graphjit bench generate``: one family's model, its prompt, and one variant's timed
``generate()`` calls.  Options, the loop over families, summary, JSON and plot are in :mod:`graphjit.bench.generate`;
torch and transformers are imported when :class:`GenerateBench` is created."""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import os
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
        self.first_tokens: dict[tuple[str, int, str], Any] = {}  # (family, batch, variant) -> its first tokens
        self.compiler_started = False
        self.families_started: set[str] = set()

    def start_compiler(self, family: str | None = None) -> float:
        """Compile a small decode-like function (a matmul, a normalisation, a softmax, an activation, in the run's
        dtype) the way each compiled variant compiles (graphjit's compile tracer: Inductor without its own CUDA
        graphs; transformers: ``mode="reduce-overhead"``, called three times so that it records its graph) once per
        process, then a one-layer model of ``family`` through both compiled variants' ``generate()``, in a fresh
        cache, once per family, before the family's first compiled variant: what a process pays once for its first
        compilation of such code (Inductor's imports, code generators and first lowerings of the family's ops, its
        worker processes, Triton's start, the CUDA graph trees, Dynamo's first trace of the family's modeling code)
        then lands in no variant's first call, whichever compiled variant comes first.  At 1fddce7, with no start,
        the first family's batch-1 row paid it: GPT-2's compile tracer took 11.4 s against transformers' 9.0 s there,
        and less than transformers' in most later rows; at 4d787b5, with the small function alone, the first row
        (Mistral, batch 1, the compile tracer first) was the only one of 24 where the compile tracer's first call was
        the slower (6.10 against 5.87 s); at a5faf48, with the first family started and no other, the slower one of
        24 was Mixtral's batch-1 row, the first of a family not started (7.61 against 7.59 s).  Returns its
        seconds."""
        torch = self.torch
        t0 = time.perf_counter()

        def step(x: Any, w: Any) -> Any:
            h = x @ w
            h = h * torch.rsqrt(h.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(h.dtype)
            return torch.softmax(h.float(), -1).to(h.dtype) + torch.nn.functional.silu(h)

        with _fresh_compile_cache(torch):
            if not self.compiler_started:
                self.compiler_started = True
                x = torch.randn(4, 64, device=self.device, dtype=self.dtype)
                w = torch.randn(64, 64, device=self.device, dtype=self.dtype)
                for compiled in (torch.compile(step, options={"triton.cudagraphs": False}),
                                 torch.compile(step, mode="reduce-overhead")):
                    for _ in range(3):
                        compiled(x, w)
                    if self.on_gpu:
                        torch.cuda.synchronize()
                    torch._dynamo.reset()
            if family is not None and family not in self.families_started:
                self.families_started.add(family)
                self._start_family(family)
        return time.perf_counter() - t0

    def _start_family(self, family: str) -> None:
        """Two ``generate()`` calls of a one-layer model of ``family`` through each compiled variant (results
        discarded; see :meth:`start_compiler`), at the run's hidden size (until 310e829 at 128), so that a layer's
        shapes are not first met by the family's first compiled variant."""
        torch = self.torch
        tiny = hf_families.build(torch, self.transformers, family, 1, self.args.hidden, self.device, self.dtype,
                                 sliding_window=self.args.sliding_window)
        tiny.generation_config.eos_token_id = None
        prompt = self.prompt(1)
        for variant in COMPILED:
            torch._dynamo.reset()
            model = copy.deepcopy(tiny)
            extra = _set_up(model, variant)
            for _ in range(2):
                self._generate(model, prompt, **extra)
            del model
            gc.collect()
        torch._dynamo.reset()

    def model(self, family: str) -> Any:
        """The family's model (built once, seeded): every variant runs on its own deep copy.  Its generation config
        has no end-of-sequence token, so every ``generate()`` makes exactly ``--new-tokens`` tokens: with random
        weights, one variant's rounding may hit the end token early where another's does not (on the H200 Qwen3's
        graphed calls stopped after about 31 tokens where the compile tracer's made 64), and times of different
        lengths do not compare."""
        if family not in self.models:
            model = hf_families.build(self.torch, self.transformers, family, self.args.layers, self.args.hidden,
                                      self.device, self.dtype, sliding_window=self.args.sliding_window)
            model.generation_config.eos_token_id = None
            self.models = {family: model}
        return self.models[family]

    def prompt(self, batch: int) -> Any:
        gen = self.torch.Generator().manual_seed(batch)
        return self.torch.randint(3, 256, (batch, self.args.prompt_len), generator=gen).to(self.device)

    def _generate(self, model: Any, prompt: Any, *, collect: bool = True, **extra: Any) -> tuple[Any, float]:
        """One timed ``generate()``.  The collector runs first, outside the timer (as ``timeit`` keeps it out), so a
        collection of an earlier variant's garbage lands in no variant's time (``collect`` False: the caller ran it)."""
        torch = self.torch
        if collect:
            gc.collect()
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

    def _same_tokens(self, family: str, batch: int, variant: str, out: Any) -> dict[str, bool] | None:
        """Whether ``variant``'s first call made the tokens the other variant of its :data:`SAME_COMPILER` pair made
        in its first call on the same family and batch (``{other: equal}``), where that one ran before; None
        otherwise.  Kept per row: the compiled variants' bf16 tokens may differ from eager's (Inductor's kernels round
        otherwise), so the compile tracer's are checked against transformers' own compiled path's instead."""
        if variant not in SAME_COMPILER:
            return None
        self.first_tokens[(family, batch, variant)] = out
        other = SAME_COMPILER[1 - SAME_COMPILER.index(variant)]
        theirs = self.first_tokens.get((family, batch, other))
        if theirs is None:
            return None
        return {other: bool(self.torch.equal(theirs, out))}  # False where the lengths differ, as for eager's

    def measure(self, family: str, batch: int, variant: str) -> dict[str, Any]:
        """``variant`` on a fresh copy of ``family``'s model: its first ``generate()`` (compilation or capture
        included), its second (``second_s``: a recompilation shows there) and the median of the last half of the
        ``--repeats`` calls after the first (``--eager-repeats`` for ``eager``; ``steady_s``: :func:`steady_state`),
        in seconds; every call's tokens compared with eager's (``tokens_equal_eager``: all of them), and the first
        call's with those of the other compiled variant where it ran before (``tokens_vs``: :meth:`_same_tokens`).
        With ``--compile-cache fresh`` (the default) the variant runs in an empty Inductor and Triton cache
        (:func:`_fresh_compile_cache`): a compiled variant's first call compiles cold whichever variant compiled the
        same kernels before it.  Before each family's first compiled variant the compiler is started for it
        (:meth:`start_compiler`, its seconds in that variant's ``compiler_start_s``)."""
        start = None
        if variant in COMPILED and self.on_gpu and family not in self.families_started:
            start = self.start_compiler(family)
        with _fresh_compile_cache(self.torch) if self.args.compile_cache == "fresh" else contextlib.nullcontext():
            res = self._measure(family, batch, variant)
        if start is not None:
            res["compiler_start_s"] = start
        return res

    def _measure(self, family: str, batch: int, variant: str) -> dict[str, Any]:
        from torch._dynamo.utils import counters

        torch = self.torch
        torch._dynamo.reset()  # every variant compiles afresh
        counters.clear()
        want = self.reference_tokens(family, batch)
        model = copy.deepcopy(self.model(family))
        prompt = self.prompt(batch)
        extra = _set_up(model, variant)
        clock = _CompileClock()
        try:
            with clock:
                out, first = self._generate(model, prompt, **extra)
            first_capture_s = _capture_seconds(model) if variant.startswith("graphed") else None
            same_tokens = self._same_tokens(family, batch, variant, out)
            # new tokens per call (an encoder-decoder's output starts with its decoder start token)
            start = 1 if model.config.is_encoder_decoder else prompt.shape[-1]
            made = [out.shape[-1] - start]
            equal = [bool(torch.equal(out, want))]
            steady = []
            repeats = self.args.eager_repeats if variant == "eager" else self.args.repeats
            for _ in range(repeats):
                out, seconds = self._generate(model, prompt, **extra)
                steady.append(seconds)
                made.append(out.shape[-1] - start)
                equal.append(bool(torch.equal(out, want)))
            res: dict[str, Any] = {"status": "ok", "first_s": first, "second_s": steady[0],
                                   "steady_s": steady_state(steady),
                                   "samples_s": steady, "new_tokens": self.args.new_tokens, "tokens_made": made,
                                   "tokens_equal_eager": all(equal), "calls_equal_eager": equal}
            if same_tokens is not None:
                res["tokens_vs"] = same_tokens
            if variant in COMPILED:  # graphs Dynamo compiled (a recompile adds one)
                res["dynamo_graphs"] = int(counters["stats"]["unique_graphs"])
                res["first_compile_s"] = clock.seconds  # of first_s: inside Dynamo's compilations (None: unknown)
                res["first_compile_by_trigger_s"] = clock.by_trigger  # cudagraph trees' recording apart
            if variant.startswith("graphed"):
                st = model.forward.stats()
                res["stats"] = {k: st.get(k) for k in ("calls", "graphs", "captures", "replays", "fallbacks")}
                res["first_capture_s"] = first_capture_s  # of first_s: graphjit's captures
            return res
        finally:
            del model  # a graphed model refers to itself (its wrappers): freed by the collector, its graphs with it
            gc.collect()
            if self.on_gpu:
                torch.cuda.empty_cache()


def _set_up(model: Any, variant: str) -> dict[str, Any]:
    """``model`` set up for ``variant`` (``graph_generation`` for the graphed ones), and the extra arguments of its
    ``generate()`` calls."""
    if variant == "eager":
        return dict(_EAGER)
    if variant == "hf_compiled":
        return {"cache_implementation": "static"}  # transformers compiles the decode step itself
    if variant in ("graphed", "graphed_compile"):
        import graphjit

        graphjit.graph_generation(model, **({"tracer": "compile"} if variant == "graphed_compile" else {}))
        return {}
    raise ValueError(f"unknown variant {variant!r}")


class _CompileClock:
    """The wall time spent inside Dynamo's compilation callbacks while the block runs, by what started each
    (``by_trigger``: ``DYNAMO``, a frame's tracing and its backend's compilation, Inductor's; ``CUDAGRAPH_RECORDING``,
    cudagraph trees recording a graph; ``TRITON_AUTOTUNING``, ``LAZY_BACKWARD``), and ``seconds``, the ``DYNAMO``
    part; both None where this torch has no such callbacks.  Kernels Triton compiles or tunes on their first run outside
    a callback are in neither."""

    def __init__(self) -> None:
        self.by_trigger: dict[str, float] | None = None
        self._started: tuple[float, str] | None = None
        try:
            from torch._dynamo.callback import callback_handler

            self._handler: Any = callback_handler
        except Exception:
            self._handler = None

    @property
    def seconds(self) -> float | None:
        return None if self.by_trigger is None else self.by_trigger.get("DYNAMO", 0.0)

    def _start(self, *args: Any) -> None:
        trigger = getattr(getattr(args[0], "callback_trigger", None), "name", "DYNAMO") if args else "DYNAMO"
        self._started = (time.perf_counter(), trigger)

    def _end(self, *_args: Any) -> None:
        if self._started is not None and self.by_trigger is not None:
            t0, trigger = self._started
            self.by_trigger[trigger] = self.by_trigger.get(trigger, 0.0) + time.perf_counter() - t0
            self._started = None

    def __enter__(self) -> _CompileClock:
        if self._handler is not None:
            self.by_trigger = {}
            self._handler.register_start_callback(self._start)
            self._handler.register_end_callback(self._end)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._handler is not None:
            with contextlib.suppress(Exception):
                self._handler.remove_start_callback(self._start)
            with contextlib.suppress(Exception):
                self._handler.remove_end_callback(self._end)


def _capture_seconds(model: Any) -> float:
    """The seconds graphjit's captures of ``model.forward`` took so far (its keys' ``capture_ms``)."""
    st = model.forward.stats()
    return sum(k.get("capture_ms") or 0.0 for k in st.get("keys") or []) / 1e3


def steady_state(samples: list[float]) -> float:
    """The median of the last half of ``samples`` (the calls after the first; at least the last one).  A key that
    needs several calls before it replays (a prefill's prompt length: uncaptured on a fresh cache, then warmup calls,
    then its capture) makes the first few later calls slower on the H200 (0.16-0.19 s against 0.074 s from the
    fifth call on for Qwen3): those are not the steady state."""
    return statistics.median(samples[-max(1, len(samples) // 2):])


@contextlib.contextmanager
def _fresh_compile_cache(torch: Any) -> Any:
    """torch's own cold-start context (``torch._inductor.utils.fresh_cache``, ``fresh_inductor_cache`` before
    2.6): Inductor's and Triton's caches in a new temporary folder, its in-memory caches cleared, for the block.  The
    cache folders' environment variables are put back as they were before it (importing Inductor, or clearing its
    caches at the block's end, can set ``TORCHINDUCTOR_CACHE_DIR`` to its default folder)."""
    names = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
    before = {n: os.environ.get(n) for n in names}
    try:
        from torch._inductor import utils

        fresh = getattr(utils, "fresh_cache", None) or utils.fresh_inductor_cache
        with fresh():
            yield
    finally:
        for n, v in before.items():
            if v is None:
                os.environ.pop(n, None)
            else:
                os.environ[n] = v


COMPILED = ("graphed_compile", "hf_compiled")
"""The variants that compile (torch.compile, through graphjit's compile tracer or transformers' generate())."""

SAME_COMPILER = COMPILED
"""The two variants whose first calls' tokens are compared with each other (the one that runs second records it in
``tokens_vs``): both run Inductor's kernels of the same decode step."""

_EAGER: dict[str, Any] = {"cache_implementation": "static", "disable_compile": True}
"""The reference: transformers' static cache, no compilation, no graphjit."""
