"""Greedy decoding with a Hugging Face Llama and its StaticCache, the decode step under @graphjit.graphed.

The model is built from a ``LlamaConfig`` with random weights (nothing is downloaded).  The prompt is
prefilled eagerly; then every decode step (one token per sequence) goes through ``@graphjit.graphed``.
transformers' StaticCache writes each layer's keys and values in place at its own position counter
(a tensor advanced with ``add_``), so a decode step is not idempotent: graphjit runs each call's work
exactly once, and the tokens equal those of the same loop run eagerly.  With ``--cache dynamic`` the
cache grows by concatenation (transformers' DynamicCache, passed as an argument): a graph would freeze
the old tensors, so graphjit runs those steps uncaptured and its report says why.

On a CPU the graphed step runs the eager function (one log line says why there is no graph); on a GPU
the step is captured after its warmup calls and replayed.

    python examples/hf_llama_decode.py [--steps 32] [--batch 1] [--layers N] [--hidden H]
                                       [--tracer eager|compile] [--cache static|dynamic] [--dtype fp32|bf16]
"""

from __future__ import annotations

import argparse
import inspect
import logging
import sys
import time

import torch
import transformers

import graphjit


def build(layers: int, hidden: int, dtype: torch.dtype, device: str):
    heads = max(1, hidden // 64)
    config = transformers.LlamaConfig(vocab_size=512, hidden_size=hidden, intermediate_size=hidden * 3,
                                      num_hidden_layers=layers, num_attention_heads=heads,
                                      num_key_value_heads=max(1, heads // 2), max_position_embeddings=1024)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(device=device, dtype=dtype).eval()
    return model, config


def decode(model, config, prompt: torch.Tensor, steps: int, cache_kind: str, graphed_options: dict | None):
    """Prefill eagerly, then ``steps`` greedy decode steps; returns the tokens, every step's logits, the step
    function (graphed or not) and the microseconds per decode step."""
    cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    if cache_kind == "static":
        cache = transformers.StaticCache(config=config, max_cache_len=prompt.shape[1] + steps)
    else:
        cache = transformers.DynamicCache(config=config)
    with torch.no_grad():
        out = model(input_ids=prompt, use_cache=True, **{cache_arg: cache})
        tok = out.logits[:, -1].argmax(-1, keepdim=True)

        if cache_kind == "static":
            def step(tok, pos):  # the cache is closed over: its tensors are written in place
                return model(input_ids=tok, cache_position=pos, use_cache=True, **{cache_arg: cache}).logits[:, -1]
        else:
            def step(tok, pos, cache):  # the cache is an argument: graphjit walks it like a container
                return model(input_ids=tok, cache_position=pos, use_cache=True, **{cache_arg: cache}).logits[:, -1]

        fn = graphjit.graphed(step, **graphed_options) if graphed_options is not None else step
        extra = () if cache_kind == "static" else (cache,)
        tokens, logits = [tok], []
        start = time.perf_counter()
        for i in range(steps):
            pos = torch.tensor([prompt.shape[1] + i], device=prompt.device)
            step_logits = fn(tok, pos, *extra)
            tok = step_logits.argmax(-1, keepdim=True)
            tokens.append(tok)
            logits.append(step_logits.float())
        if prompt.is_cuda:
            torch.cuda.synchronize()
        us = (time.perf_counter() - start) / steps * 1e6
    return torch.cat(tokens, dim=1), logits, fn, us


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--layers", type=int, default=None, help="decoder layers (default: 8 on a GPU, 2 on a CPU)")
    p.add_argument("--hidden", type=int, default=None, help="hidden size (default: 1024 on a GPU, 64 on a CPU)")
    p.add_argument("--tracer", choices=("eager", "compile"), default="eager")
    p.add_argument("--cache", choices=("static", "dynamic"), default="static")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")  # graphjit names itself
    gpu = torch.cuda.is_available()
    device = "cuda" if gpu else "cpu"
    layers = args.layers or (8 if gpu else 2)
    hidden = args.hidden or (1024 if gpu else 64)
    dtype = torch.float32 if args.dtype == "fp32" else torch.bfloat16
    model, config = build(layers, hidden, dtype, device)
    prompt = torch.randint(0, config.vocab_size, (args.batch, 8), generator=torch.Generator().manual_seed(1))
    prompt = prompt.to(device)

    want, want_logits, _, eager_us = decode(model, config, prompt, args.steps, args.cache, None)
    got, got_logits, fn, graphed_us = decode(model, config, prompt, args.steps, args.cache, {"tracer": args.tracer})
    worst = max(float((g - w).norm() / w.norm()) for g, w in zip(got_logits, want_logits))
    same = torch.equal(got, want)
    print(fn.report())
    print(f"{layers} layers, hidden {hidden}, {args.dtype}, batch {args.batch}, {args.cache} cache, {device}: "
          f"eager {eager_us:.0f} us a step, @graphed(tracer={args.tracer!r}) {graphed_us:.0f} us a step "
          f"(this run's warmup and capture included); tokens equal eager's: {'yes' if same else 'NO'}; "
          f"largest relative logit difference {worst:.2e}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
