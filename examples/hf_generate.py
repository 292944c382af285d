"""transformers' ``generate()`` with graphed decoding, in one line: ``graphjit.graph_generation(model)``.

Builds a model of any family from its config (random weights, nothing downloaded), runs ``generate()`` eagerly,
then the same ``generate()`` after ``graphjit.graph_generation(model)`` (transformers' defaults otherwise), four
times, compares the tokens and prints one line of timing per run and graphjit's report.  On a CPU the graphed calls
run the model eagerly (one log line says why there are no graphs); on a GPU the decode step is captured once per
batch size and replayed for every later token, in this ``generate()`` and the next.  Gemma 2 and 3, whose caches
count their length in a Python int, share one graph across the positions before their sliding window fills
(``graphjit/families.py``), each replay advancing that int (``graphjit/advances.py``).

    python examples/hf_generate.py [--family llama] [--batch 1] [--new-tokens 32] [--layers 4] [--hidden 256]
                                   [--dtype fp32|bf16] [--hf-compiled]

Families: llama qwen2 mistral qwen3 phi3 qwen2_moe mixtral gpt2 gemma2 gemma3_text qwen2_vl t5
(``graphjit.bench.torch.hf_families`` builds them, for the tests and ``bench generate`` too).
"""

from __future__ import annotations

import argparse
import logging
import time

import torch
import transformers

import graphjit
from graphjit.bench.torch import hf_families


def timed_generate(model, prompt: torch.Tensor, new_tokens: int, **extra) -> tuple[torch.Tensor, float]:
    sync = torch.cuda.synchronize if prompt.is_cuda else (lambda: None)
    sync()
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=new_tokens, do_sample=False, pad_token_id=0, **extra)
    sync()
    return out, time.perf_counter() - t0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--family", default="llama", choices=hf_families.FAMILIES)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--hf-compiled", action="store_true",
                   help="also time transformers' own path on a copy of the model: generate() with a static cache "
                        "and its defaults, which compile the decode step (on a GPU)")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    model = hf_families.build(torch, transformers, args.family, args.layers, args.hidden, device, dtype)
    prompt = torch.randint(3, 256, (args.batch, 8), generator=torch.Generator().manual_seed(0)).to(device)

    # eager: a static cache and transformers' compilation off, so that both runs do the same work
    want, t_eager = timed_generate(model, prompt, args.new_tokens, cache_implementation="static",
                                   disable_compile=True)
    print(f"eager    generate(): {t_eager * 1e3:8.1f} ms")

    if args.hf_compiled:
        import copy

        compiled = copy.deepcopy(model)
        for run in ("first", "second"):
            got, t = timed_generate(compiled, prompt, args.new_tokens, cache_implementation="static")
            print(f"HF compiled generate() ({run}): {t * 1e3:8.1f} ms, tokens "
                  f"{'equal to' if torch.equal(got, want) else 'differ from'} eager")
        del compiled

    graphjit.graph_generation(model)  # the one line
    ok = True
    for run in ("first", "second", "third", "fourth"):
        got, t = timed_generate(model, prompt, args.new_tokens)  # generate()'s defaults
        same = torch.equal(got, want)
        ok = ok and same
        print(f"graphed  generate() ({run}): {t * 1e3:8.1f} ms, tokens {'equal to' if same else 'DIFFER from'} eager")
    print(model.forward.report())
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
