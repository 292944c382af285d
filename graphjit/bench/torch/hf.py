"""torch + transformers half of ``python -m graphjit bench hf``: a Hugging Face Llama decode step, timed
eager, as a hand-made CUDA graph, under ``@graphed`` (tracers eager and compile) and under
``torch.compile(mode="reduce-overhead")``.

The model is ``LlamaForCausalLM`` from a ``LlamaConfig`` (random weights, seeded; nothing downloaded) with
a ``StaticCache`` the step closes over.  Every variant runs the same greedy loop on its own freshly
prefilled cache: ``logits = step(tok, pos)``, ``tok = logits.argmax(-1)``, the positions a view of one
device tensor (no host copy in the loop).  transformers' StaticCache advances its position counters in
place, so the hand-made graph is correct as it is: each replay writes the next position.

The framework-neutral part (options, the loop over sizes, summary, JSON, table, plot) is
:mod:`graphjit.bench.hf`.
"""

from __future__ import annotations

import argparse
import inspect
from collections.abc import Callable
from typing import Any

from .timing import graphed_stats, timed

PROMPT = 8


class HfBench:
    """One run's torch side: device, dtype, model per size, and one variant's check and timing."""

    def __init__(self, args: argparse.Namespace, on_gpu: bool) -> None:
        import torch
        import transformers

        self.torch = torch
        self.tf: Any = transformers
        self.args = args
        self.on_gpu = on_gpu
        self.device = "cuda" if on_gpu else "cpu"
        self.dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
        self.models: dict[int, tuple[Any, Any]] = {}
        self.refs: dict[tuple[int, int], dict[str, Any]] = {}

    def model(self, layers: int) -> tuple[Any, Any]:
        if layers not in self.models:
            torch, a = self.torch, self.args
            heads = max(1, a.hidden // 64)
            config = self.tf.LlamaConfig(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.hidden * 3,
                                         num_hidden_layers=layers, num_attention_heads=heads,
                                         num_key_value_heads=max(1, heads // 2), max_position_embeddings=4096)
            torch.manual_seed(a.seed)
            m = self.tf.LlamaForCausalLM(config).to(device=self.device, dtype=self.dtype).eval()
            self.models[layers] = (m, config)
        return self.models[layers]

    def sync(self) -> None:
        if self.on_gpu:
            self.torch.cuda.synchronize()

    def _session(self, layers: int, batch: int, length: int) -> tuple[Callable[..., Any], Any, Any]:
        """A prefilled StaticCache, its decode step, the first token and the device positions."""
        torch = self.torch
        model, config = self.model(layers)
        arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        cache = self.tf.StaticCache(config=config, max_cache_len=PROMPT + length)
        prompt = torch.randint(0, config.vocab_size, (batch, PROMPT),
                               generator=torch.Generator().manual_seed(self.args.seed + batch)).to(self.device)
        with torch.no_grad():
            tok = model(input_ids=prompt, use_cache=True, **{arg: cache}).logits[:, -1].argmax(-1, keepdim=True)

        def step(tok: Any, pos: Any) -> Any:
            return model(input_ids=tok, cache_position=pos, use_cache=True, **{arg: cache}).logits[:, -1]

        positions = torch.arange(PROMPT, PROMPT + length, device=self.device)
        return step, tok, positions

    def _wrap(self, variant: str, step: Callable[..., Any]) -> Callable[..., Any] | None:
        torch = self.torch
        if variant == "eager":
            return step
        if variant == "reduce_overhead":
            return torch.compile(step, mode="reduce-overhead")  # type: ignore[no-any-return]
        if variant in ("graphed", "graphed_compile"):
            import graphjit

            return graphjit.graphed(step, tracer="compile" if variant == "graphed_compile" else "eager")
        if variant == "cuda_graph":
            return None  # captured by hand after its warmup steps (see run_variant)
        raise ValueError(f"unknown variant {variant!r}")

    def _on_side_stream(self, step: Callable[..., Any], tok: Any, pos: Any) -> Any:
        torch = self.torch
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            out = step(tok, pos)
        torch.cuda.current_stream().wait_stream(side)
        return out

    def _hand_made(self, step: Callable[..., Any], tok: Any, pos: Any) -> Callable[..., Any]:
        """A CUDA graph captured by hand around the eager step, with static token and position buffers
        (a capture runs nothing: the cache is not advanced by it)."""
        torch = self.torch
        static_tok, static_pos = tok.clone(), pos.clone()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = step(static_tok, static_pos)

        def replay(t: Any, p: Any) -> Any:
            static_tok.copy_(t)
            static_pos.copy_(p)
            graph.replay()
            return out

        replay.graph = graph  # type: ignore[attr-defined]  # kept alive with the function
        return replay

    def run_variant(self, variant: str, layers: int, batch: int) -> dict[str, Any]:
        """Check (tokens and logits against the eager loop over the warmup steps) and time one variant."""
        torch, a = self.torch, self.args
        if variant == "cuda_graph" and not self.on_gpu:
            return {"status": "skipped", "reason": "a hand-made CUDA graph needs a GPU"}
        step, tok, positions = self._session(layers, batch, a.warmup + a.repeats * a.steps)
        ref = self.reference(layers, batch)
        fn = self._wrap(variant, step)
        tokens, logits = [], []
        with torch.no_grad():
            for i in range(a.warmup):
                pos = positions[i:i + 1]
                if fn is None and i < 2:  # the hand-made graph's warmup: two eager steps on a side stream
                    out = self._on_side_stream(step, tok, pos)
                else:
                    if fn is None:
                        fn = self._hand_made(step, tok, pos)
                    out = fn(tok, pos)
                tok = out.argmax(-1, keepdim=True)
                logits.append(out.float().cpu())
                tokens.append(tok)
            assert fn is not None  # --warmup > 2 is checked by the command line
            self.sync()
            state = {"tok": tok, "i": a.warmup}

            def one() -> None:
                i = state["i"]
                state["tok"] = fn(state["tok"], positions[i:i + 1]).argmax(-1, keepdim=True)
                state["i"] = i + 1

            res = timed(self.on_gpu, a.repeats, a.steps, one)
        res.update({"tokens_equal_eager": bool(torch.equal(torch.cat(tokens, 1).cpu(), ref["tokens"])),
                    "max_logit_rel_diff": max(float((g - w).norm() / w.norm()) for g, w in zip(logits, ref["logits"]))})
        graphed_stats(fn, self.on_gpu, res)
        return res

    def reference(self, layers: int, batch: int) -> dict[str, Any]:
        """The eager loop's tokens and logits over the warmup steps (what every variant is checked against)."""
        torch, a = self.torch, self.args
        if (layers, batch) in self.refs:
            return self.refs[(layers, batch)]
        step, tok, positions = self._session(layers, batch, a.warmup)
        tokens, logits = [], []
        with torch.no_grad():
            for i in range(a.warmup):
                out = step(tok, positions[i:i + 1])
                tok = out.argmax(-1, keepdim=True)
                tokens.append(tok)
                logits.append(out.float().cpu())
        ref = self.refs[(layers, batch)] = {"tokens": torch.cat(tokens, 1).cpu(), "logits": logits}
        return ref
