"""Probe (GPU): transformers' generate() with a static cache through ``model.forward = graphjit.graphed(model.forward)``
(issue 20): tiny random-weight GPT-2 and Gemma2 (2 layers, hidden 64, vocab 128; nothing downloaded), greedy.

Prints one JSON object per model: whether the tokens equal eager generate(), the graphs, captures and replays,
the fallback reasons with their counts, and each key's state, calls and reason.  What it found before the fix
(H200, torch 2.11, transformers 5.17): GPT-2 1 + 3 x layers captures (each call got back a copy of its cache
and recaptured one "moved" tensor), Gemma2 0 graphs with no reason on any key.  The CPU tests of the same
claims (through the emulator) are tests/test_hf_emulated.py."""

from __future__ import annotations

import json
import sys

import torch
import transformers

import graphjit


def build(kind: str, layers: int, device: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "gpt2":
        config = transformers.GPT2Config(n_layer=layers, n_embd=64, n_head=4, vocab_size=128, n_positions=128,
                                         bos_token_id=1, eos_token_id=2)
        model = transformers.GPT2LMHeadModel(config)
    else:
        config = transformers.Gemma2Config(num_hidden_layers=layers, hidden_size=64, intermediate_size=128,
                                           num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=128,
                                           max_position_embeddings=128, sliding_window=32, bos_token_id=1,
                                           eos_token_id=2, pad_token_id=0)
        model = transformers.Gemma2ForCausalLM(config)
    return model.eval().to(device)


def run(kind: str, layers: int, steps: int, device: str) -> dict[str, object]:
    model = build(kind, layers, device)
    prompt = torch.randint(3, 128, (1, 5), generator=torch.Generator().manual_seed(1)).to(device)
    kw = {"max_new_tokens": steps, "do_sample": False, "cache_implementation": "static", "disable_compile": True,
          "pad_token_id": 0}
    with torch.no_grad():
        want = model.generate(prompt, **kw)
    model.forward = graphjit.graphed(model.forward)
    with torch.no_grad():
        got = model.generate(prompt, **kw)
    s = model.forward.stats()
    return {"model": kind, "layers": layers, "steps": steps, "tokens_equal": bool(torch.equal(want, got)),
            "graphs": s["graphs"], "captures": s["captures"], "replays": s["replays"], "fallbacks": s["fallbacks"],
            "keys": [{"state": k["state"], "warmups": k["warmups"], "captures": k["captures"], "replays": k["replays"],
                      "reason": k["reason"]} for k in s["keys"]],
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__}}


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 32
    for kind, layers in (("gpt2", 2), ("gpt2", 12), ("gemma2", 2)):
        print(json.dumps(run(kind, layers, steps, device)))


if __name__ == "__main__":
    main()
