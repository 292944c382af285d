"""transformers' generate() with a static cache through ``model.forward = graphjit.graphed(model.forward)``
(issue 20, as measured on an H200), on the CPU through tests/graph_emulator.py with tiny random-weight
models (2 layers, hidden 64, vocab 128; nothing downloaded): greedy tokens equal eager generate().

* GPT-2: the decode key is captured once and replayed (before, each call got back a copy of the cache and
  recaptured one "moved" tensor after another);
* Gemma2: its sliding-window layers count their length in a Python int, so every decode position is a key of its
  own, captured once it repeats, and each replay advances the int as the call would (graphjit/advances.py).
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


def _gemma2(sliding_window=32):
    config = transformers.Gemma2Config(num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=128,
                                       max_position_embeddings=128, sliding_window=sliding_window, bos_token_id=1,
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


def test_gemma2_decodes_past_a_full_sliding_window_from_one_graph_per_class():
    """transformers' sliding-window layer advances a Python int on every call (its length), which picks the update's
    branch (full or not): each position is a key of its own, and the positions of one class share a graph once it is
    proven on a second position (graphjit/families.py), each replay advancing the int as the call would.  The window
    (8) fills during decoding, so replays run the layer's rolling branch too: two graphs, one per class; the emulator
    freezes what a capture read, so equal tokens in every call show each replay left the right count."""
    model = _gemma2(sliding_window=8)
    prompt = torch.randint(3, 128, (1, 5), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model.generate(prompt, **GENERATE)
    with emulated_torch(), torch.no_grad():
        graphjit.graph_generation(model)
        for _ in range(4):
            assert torch.equal(model.generate(prompt, **GENERATE), want)
    fn = model.forward
    decode = [k for k in fn.stats()["keys"] if "input_ids[1, 1]" in k["key"] and k["state"] == "replay"]
    assert len(decode) == 2 and all(k["captures"] == 1 and k["members"] >= 1 for k in decode), fn.report()
    path = re.compile(r"argument '(cache|past_key_values)'\.layers\[0\]\.cumulative_length_int")
    assert all(any(path.fullmatch(p) for p in k["advances"]) for k in decode), decode


@pytest.mark.parametrize("keyword", ["cache", "past_key_values"])
def test_gemma2_decode_steps_hand_back_the_callers_cache_and_layers_past_a_full_window(keyword):
    """Once the window (8) is full, the layer's length tensor is only read (the graph reads a copy of it): each step
    still returns the caller's own cache, with its own layers, their counts where eager leaves them.  Before, the
    replays of the full class returned a copy of the layer each step, its count not advanced.  The cache passed by
    its deprecated name too (``past_key_values=``, which transformers' wrapper renames): before, graphjit bound the
    call with the defaults applied and the model got ``cache`` twice (TypeError)."""
    model = _gemma2(sliding_window=8)
    config = model.config
    prompt = torch.randint(3, 128, (1, 5), generator=torch.Generator().manual_seed(1))

    def decode(forward, cache):
        cache.reset()
        out = forward(input_ids=prompt, cache_position=torch.arange(5), use_cache=True, **{keyword: cache})
        steps = []
        for step in range(12):
            token = out.logits[:, -1:].argmax(-1)
            out = forward(input_ids=token, cache_position=torch.tensor([5 + step]), use_cache=True, **{keyword: cache})
            back = out.past_key_values
            steps.append((int(token), back is cache, back.layers[0] is cache.layers[0],
                          back.layers[0].cumulative_length_int))
        return steps

    with torch.no_grad():
        want = decode(model.forward, transformers.StaticCache(config=config, max_cache_len=32))
        cache = transformers.StaticCache(config=config, max_cache_len=32)
        with emulated_torch():
            graphjit.graph_generation(model)
            for _ in range(4):
                assert decode(model.forward, cache) == want
    assert all(same and own for _t, same, own, _n in want)
    assert model.forward.stats()["replays"] >= 12, model.forward.report()
