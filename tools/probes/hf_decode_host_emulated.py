"""graphjit's own host cost of one Hugging Face decode step on the CPU: transformers' Llama (random weights from a
config, tiny hidden size) through ``model.forward = graphjit.graphed(model.forward)`` and ``generate()`` with a static
cache on the graph emulator (tests/graph_emulator.py), then the last decode call timed again with the launch stubbed,
so what is timed is graphjit's part (signing the keyword call and its cache object, the guards, the hand-off, the
output rebuilt as transformers' ``ModelOutput``).  Each with the signing checks of the replay lane and without them
(``Signer.layout_checks`` off: every call walked in Python).

Diagnostic only (a GPU host runs this Python about three times slower).  Usage (repo root, torch and transformers
installed): ``python tools/probes/hf_decode_host_emulated.py [--layers 8 32] [--out FILE]``
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import graph_emulator  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from host_cost_emulated import per_call_us  # noqa: E402  # the same timer (this folder is on the path)

import graphjit  # noqa: E402
from graphjit import lane  # noqa: E402
from graphjit.keys import Signer  # noqa: E402

GENERATE = {"max_new_tokens": 12, "do_sample": False, "cache_implementation": "static", "disable_compile": True,
            "pad_token_id": 0}


def measure(layers: int, checks: bool) -> dict[str, Any]:
    """One decode call's host microseconds (``call_us``) and its signing alone (``sign_us``), with every timed call
    checked to be a replay."""
    config = transformers.LlamaConfig(num_hidden_layers=layers, hidden_size=64, intermediate_size=128,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                      max_position_embeddings=128, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    prompt = torch.randint(3, 128, (1, 5), generator=torch.Generator().manual_seed(1))
    Signer.layout_checks = checks
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
    try:
        with graph_emulator.emulated_torch(), torch.no_grad():
            graphed = graphjit.graphed(model.forward)

            def spy(*args: Any, **kwargs: Any) -> Any:
                calls.append((args, kwargs))
                return graphed(*args, **kwargs)

            model.forward = spy
            model.generate(prompt, **GENERATE)
            args, kwargs = calls[-1]  # a decode step
            replay, launch = graph_emulator.EmulatedGraph.replay, graph_emulator.EmulatedFeed.launch
            graph_emulator.EmulatedGraph.replay = lambda self: None  # the launch stubbed: graphjit's part only
            graph_emulator.EmulatedFeed.launch = lambda self, n_in, n_out: 0
            try:
                before = graphed.stats()["replays"]
                call_us = per_call_us(lambda: graphed(*args, **kwargs), iters=1000, repeats=7)
                replayed = graphed.stats()["replays"] - before
                signer = graphed._self_state.signer
                bound, named = signer.binder.bind(False, args, kwargs)
                sign_us = per_call_us(lambda: signer.sign_walk(None, bound, named), iters=1000, repeats=7)
            finally:
                graph_emulator.EmulatedGraph.replay, graph_emulator.EmulatedFeed.launch = replay, launch
    finally:
        Signer.layout_checks = True
    if replayed != 7 * 1000:
        raise RuntimeError(f"expected every timed call replayed, got {replayed} replays of {7 * 1000} calls")
    return {"call_us": call_us, "sign_us": sign_us, "tensors": len(signer.sign_walk(None, bound, named).tensors)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, nargs="+", default=[8])
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    lane.build()
    lane.prepare()
    result: dict[str, Any] = {"model": "transformers Llama, hidden 64, static cache, batch 1", "lane": lane.status()}
    for layers in args.layers:
        result[f"L{layers}"] = {"checks": measure(layers, True), "walk_only": measure(layers, False)}
    print(json.dumps(result, indent=2))
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
