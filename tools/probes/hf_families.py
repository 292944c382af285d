"""Probe (GPU): transformers' generate() with a static cache and ``model.forward = graphjit.graphed(model.forward)``
(``disable_compile=True``) for the decoder families and T5: tokens against eager generate(), graphs, replays,
fallbacks and the number of guarded values of the decode step's graph (graphjit.guards).  Tiny random-weight
models from their configs (2 layers, hidden 64; nothing downloaded), greedy, batch 1 and 2.
Usage: ``python3 tools/probes/hf_families.py [steps]``; prints one JSON line per model and batch."""

from __future__ import annotations

import json
import sys

import torch
import transformers

import graphjit

SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 128, "max_position_embeddings": 128, "bos_token_id": 1,
         "eos_token_id": 2, "pad_token_id": 0}
FAMILIES = {
    "llama": {}, "qwen2": {}, "mistral": {}, "qwen3": {"head_dim": 16}, "phi3": {},
    "gpt2": {"n_layer": 2, "n_embd": 64, "n_head": 4, "n_positions": 128},
    "qwen2_moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
                  "shared_expert_intermediate_size": 64},
    "mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2},
    "t5": {"d_model": 64, "d_ff": 128, "num_layers": 2, "num_heads": 4, "d_kv": 16, "decoder_start_token_id": 0},
}


def build(kind: str, device: str) -> torch.nn.Module:
    torch.manual_seed(0)
    extra = FAMILIES[kind]
    base = {} if kind in ("gpt2", "t5") else dict(SMALL)
    if kind in ("gpt2", "t5"):
        base = {"vocab_size": 128, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
    config = transformers.AutoConfig.for_model(kind, **base, **extra)
    cls = transformers.AutoModelForSeq2SeqLM if kind == "t5" else transformers.AutoModelForCausalLM
    return cls.from_config(config).eval().to(device)


def run(kind: str, batch: int, steps: int, device: str) -> dict[str, object]:
    try:
        model = build(kind, device)
    except Exception as exc:  # a family this transformers cannot build from these values
        return {"model": kind, "error": f"{type(exc).__name__}: {exc}"[:300]}
    prompt = torch.randint(3, 128, (batch, 5), generator=torch.Generator().manual_seed(1)).to(device)
    kw = {"max_new_tokens": steps, "do_sample": False, "cache_implementation": "static", "disable_compile": True,
          "pad_token_id": 0}
    with torch.no_grad():
        want = model.generate(prompt, **kw)
        model.forward = graphjit.graphed(model.forward)
        got = model.generate(prompt, **kw)
    s = model.forward.stats()
    captured = [k for k in s["keys"] if k["state"] == "replay"]
    return {"model": kind, "batch": batch, "tokens_equal": bool(torch.equal(want, got)), "graphs": s["graphs"],
            "captures": s["captures"], "replays": s["replays"], "fallbacks": s["fallbacks"],
            "guarded_values": [k["guarded_values"] for k in captured]}


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 24
    print(json.dumps({"torch": torch.__version__, "transformers": transformers.__version__, "device": device}))
    for kind in FAMILIES:
        for batch in (1, 2):
            print(json.dumps(run(kind, batch, steps, device)), flush=True)


if __name__ == "__main__":
    main()
