"""Greedy decoding with a PaddleFormers Llama, its decode step under ``graphjit.graphed``; tokens compared with eager.

The model is built from a small ``LlamaConfig`` with random weights (nothing is downloaded).  The prompt is
prefilled eagerly; then ``--steps`` greedy decode steps (one token per sequence) run eagerly, and again, from the
same prefill, through ``graphjit.graphed(step, tracer=...)``.  The tokens must be equal (exit status 1 otherwise).

PaddleFormers (1.2) has no static cache: its Llama keeps keys and values in a ``DynamicCache`` whose layers grow by
concatenation (``self.keys = paddle.concat([self.keys, key_states], axis=-2)``), so every decode step replaces the
cache's tensors.  A CUDA graph would keep reading and writing the old ones, so on a GPU graphjit runs every step
uncaptured and its report says why: "rebinds a tensor held by an object" (the cache's ``layers[i].keys``/``values``,
reached through the closure, or through the argument with ``--cache argument``, where the growing cache also makes
every step a new input signature).  On a CPU there are no CUDA graphs at all: one log line ("no CUDA graph") says
so, every step runs the traced function uncaptured (SOT-translated with ``--tracer sot``), and the report's reason
is "no CUDA graphs: paddle ... is a CPU build".  Either way the graphed path must give eager's tokens.

``--tracer sot`` (Paddle's default) needs a workaround with paddlepaddle 3.3 and PaddleFormers 1.2: PaddleFormers
marks its ``RMSNorm`` ``@paddle.jit.marker.unified``, so SOT builds that layer with dy2static, which converts
``PretrainedConfig.get`` and its ``__getattribute__`` (a zero-argument ``super()``) and recurses until
``RecursionError``.  This script marks ``PretrainedConfig.get`` ``paddle.jit.not_to_static`` (the documented
Paddle marker; it changes nothing in eager code); ``--no-sot-workaround`` shows the failure (graphjit's
``TracerError``, exit status 2).  SOT's translation costs seconds in the first two steps (the second step
retranslates with a symbolic cache length); the later steps reuse it.  ``fuse_rms_norm=False``: the fused kernel
has no CPU implementation (kept off on a GPU too, so both run the same code).

    python examples/paddleformers_decode.py [--steps 16] [--batch 1] [--tracer sot|eager] [--cache closure|argument]
                                            [--layers 2] [--hidden 64] [--no-sot-workaround]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time

import numpy as np
import paddle
import paddleformers.transformers as pft
from paddleformers.transformers.configuration_utils import PretrainedConfig

import graphjit


def sot_workaround() -> None:
    """Keep dy2static from converting ``PretrainedConfig.get`` (see the module docstring)."""
    paddle.jit.not_to_static(PretrainedConfig.get)


def build(layers: int, hidden: int):
    heads = max(4, hidden // 64)
    config = pft.LlamaConfig(vocab_size=128, hidden_size=hidden, intermediate_size=hidden * 3,
                             num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads // 2,
                             max_position_embeddings=1024, fuse_rms_norm=False)
    paddle.seed(0)
    model = pft.LlamaForCausalLM(config)
    model.eval()
    return model, config


def decode(model, prompt, steps: int, cache_as: str, graphed_options: dict | None):
    """Prefill eagerly, then ``steps`` greedy decode steps; returns the tokens ([batch, steps + 1]: the prefill's
    token first), every step's logits, the step function (graphed or not) and the seconds of every step."""
    with paddle.no_grad():
        out = model(prompt, use_cache=True, return_dict=True)
        cache = out.past_key_values  # a DynamicCache, grown by concatenation in every step
        tok = out.logits[:, -1].argmax(-1, keepdim=True)

        if cache_as == "closure":
            def step(tok):
                return model(tok, use_cache=True, past_key_values=cache, return_dict=True).logits[:, -1]
            extra = ()
        else:
            def step(tok, cache):  # graphjit walks the cache like a container: its tensors are inputs
                return model(tok, use_cache=True, past_key_values=cache, return_dict=True).logits[:, -1]
            extra = (cache,)

        fn = graphjit.graphed(step, **graphed_options) if graphed_options is not None else step
        tokens, logits, seconds = [tok], [], []
        for _ in range(steps):
            t0 = time.perf_counter()
            step_logits = fn(tok, *extra)
            tok = step_logits.argmax(-1, keepdim=True)
            tok.numpy()  # waits for the step (a GPU runs asynchronously)
            seconds.append(time.perf_counter() - t0)
            tokens.append(tok)
            logits.append(step_logits.astype("float32").numpy())
    return paddle.concat(tokens, axis=1).numpy(), logits, fn, seconds


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--tracer", choices=("sot", "eager"), default="sot")
    p.add_argument("--cache", choices=("closure", "argument"), default="closure",
                   help="how the decode step reaches the DynamicCache")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--no-sot-workaround", action="store_true",
                   help="leave PretrainedConfig.get to dy2static (shows SOT's RecursionError)")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")  # graphjit names itself
    gpu = paddle.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0
    device = "gpu" if gpu else "cpu"
    paddle.set_device(device)
    if args.tracer == "sot" and not args.no_sot_workaround:
        sot_workaround()
    model, config = build(args.layers, args.hidden)
    prompt = paddle.to_tensor(np.random.default_rng(1).integers(3, config.vocab_size, (args.batch, 8)))

    want, want_logits, _, eager_s = decode(model, prompt, args.steps, args.cache, None)
    try:
        got, got_logits, fn, graphed_s = decode(model, prompt, args.steps, args.cache, {"tracer": args.tracer})
    except graphjit.TracerError as exc:
        print(f"graphjit.TracerError: {exc}")
        return 2
    same = bool(np.array_equal(got, want))
    worst = max(float(np.linalg.norm(g - w) / np.linalg.norm(w)) for g, w in zip(got_logits, want_logits))
    print(fn.report())
    print(f"PaddleFormers Llama, {args.layers} layers, hidden {args.hidden}, fp32, batch {args.batch}, "
          f"cache by {args.cache}, {device}, {args.steps} steps: eager {statistics.mean(eager_s) * 1e6:.0f} us a "
          f"step, @graphed(tracer={args.tracer!r}) {statistics.mean(graphed_s) * 1e6:.0f} us a step (median "
          f"{statistics.median(graphed_s) * 1e6:.0f} us; the first steps include the tracer's work); tokens equal "
          f"eager's: {'yes' if same else 'NO'}; largest relative logit difference {worst:.2e}")
    if not same:
        print(f"eager tokens:\n{want}\ngraphed tokens:\n{got}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
