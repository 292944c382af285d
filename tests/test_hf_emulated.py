"""transformers' generate() with a static cache through ``model.forward = graphjit.graphed(model.forward)``
(issue 20, as measured on an H200), on the CPU through tests/graph_emulator.py with tiny random-weight
models (2 layers, hidden 64, vocab 128; nothing downloaded): greedy tokens equal eager generate().

* GPT-2: the decode key is captured once and replayed (before, each call got back a copy of the cache and
  recaptured one "moved" tensor after another);
* Gemma2: its sliding-window layers count their length in a Python int, so every decode call is a new key
  that never captures; each says so, naming that int and both values, and the labels tell the keys apart.
"""

from __future__ import annotations

import re

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from graph_emulator import emulated_torch  # noqa: E402

import graphjit  # noqa: E402

pytestmark = pytest.mark.torch

STEPS = 12
GENERATE = {"max_new_tokens": STEPS, "do_sample": False, "cache_implementation": "static", "disable_compile": True,
            "pad_token_id": 0}


def _gpt2():
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=128,
                                     bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config).eval()


def _gemma2():
    config = transformers.Gemma2Config(num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=128,
                                       max_position_embeddings=128, sliding_window=32, bos_token_id=1,
                                       eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    return transformers.Gemma2ForCausalLM(config).eval()


def _tokens_eager_and_graphed(model):
    prompt = torch.randint(3, 128, (1, 5), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model.generate(prompt, **GENERATE)
    with emulated_torch():
        model.forward = graphjit.graphed(model.forward)
        with torch.no_grad():
            got = model.generate(prompt, **GENERATE)
    return want, got, model.forward


def test_gpt2_static_cache_generate_captures_the_decode_key_once():
    want, got, fn = _tokens_eager_and_graphed(_gpt2())
    assert torch.equal(got, want), (got, want)
    s = fn.stats()
    decode = [k for k in s["keys"] if k["state"] == "replay"]
    assert len(decode) == 1 and decode[0]["captures"] == 1 and decode[0]["reason"] is None, fn.report()
    assert decode[0]["replays"] == STEPS - 1 - 2, fn.report()  # the prefill, 2 warmups, the capturing call's replay
    assert s["graphs"] == 1 and not any("moved" in r for r in s["fallbacks"]), fn.report()
    (prefill,) = [k for k in s["keys"] if k["state"] == "fallback"]  # it fills the cache's layers: never replayable
    assert re.fullmatch(r"changes its own signature: argument '(cache|past_key_values)'\.layers\[0\]\.keys",
                        prefill["reason"]), prefill
    assert "(None before the call, [1, 4, 16, 16] float32 cpu after)" in prefill["detail"], prefill


def test_gemma2_static_cache_generate_names_the_counter_that_keeps_every_key_apart():
    """transformers' sliding-window layer advances a Python int on every call (its length): each decode step changes
    its own key, so no key is ever captured (a replay would leave the count where the capture left it), and each says
    which value moved, from what to what."""
    want, got, fn = _tokens_eager_and_graphed(_gemma2())
    assert torch.equal(got, want), (got, want)
    s = fn.stats()
    assert s["graphs"] == 0 and s["replays"] == 0
    decode = [k for k in s["keys"] if "input_ids[1, 1]" in k["key"]]
    assert len(decode) == STEPS - 1
    path = r"argument '(cache|past_key_values)'\.layers\[0\]\.cumulative_length_int"
    for k in decode:
        assert k["state"] == "fallback" and re.fullmatch(r"changes its own signature: " + path, k["reason"]), k
        n = int(re.search(r"cumulative_length_int=(\d+)", k["key"]).group(1))
        assert f"({n} before the call, {n + 1} after)" in k["detail"], k
    assert len({k["key"] for k in decode}) == len(decode), [k["key"] for k in decode]
    assert f"fallback x{STEPS - 1}: {decode[0]['reason']}" in fn.report(), fn.report()
