"""``graphjit.graph_generation(model)``: the one line for transformers' ``generate()`` (issue 29), on the CPU through
tests/graph_emulator.py with tiny random-weight models (nothing downloaded): greedy tokens equal eager
``generate()``, the decode step captured once and replayed across ``generate()`` calls (the static cache kept and
reset in place), transformers' own compilation turned off, bad input refused."""

from __future__ import annotations

import contextlib

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from graph_emulator import emulated_torch, record_compile_tracer  # noqa: E402

import graphjit  # noqa: E402
from graphjit.bench.torch import hf_families  # noqa: E402

pytestmark = pytest.mark.torch

GREEDY = {"max_new_tokens": 8, "do_sample": False, "pad_token_id": 0}


def _llama():
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                      pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def _t5():
    config = transformers.T5Config(vocab_size=128, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
                                   decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    torch.manual_seed(0)
    return transformers.T5ForConditionalGeneration(config).eval()


def _prompt(batch: int, length: int = 5) -> torch.Tensor:
    return torch.randint(3, 128, (batch, length), generator=torch.Generator().manual_seed(batch))


def _decode_keys(fn):
    return [k for k in fn.stats()["keys"] if k["state"] == "replay"]


@pytest.mark.parametrize("batch", [1, 3])
def test_generate_with_its_defaults_decodes_from_one_graph_across_calls(batch):
    model = _llama()
    prompt = _prompt(batch)
    with torch.no_grad():
        want = model.generate(prompt, cache_implementation="static", **GREEDY)
    with emulated_torch():
        assert graphjit.graph_generation(model) is model
        assert model.generation_config.cache_implementation is None  # the model's config is left as it is
        for _ in range(3):
            with torch.no_grad():
                got = model.generate(prompt, **GREEDY)
            assert torch.equal(got, want), (got, want)
    (decode,) = _decode_keys(model.forward)
    assert decode["captures"] == 1 and decode["reason"] is None, model.forward.report()
    assert decode["replays"] == 3 * 7 - 2, model.forward.report()  # 7 decode calls a generate(); 2 warm up
    assert model._prepare_static_cache.__self__.reused == 2  # the second and third generate() got the first one's cache


def test_batch_sizes_in_turn_on_one_model_each_decode_from_their_own_graph():
    """Batch 1 and 8 in turn on one model: one decode graph per batch size, each captured once and replayed when its
    batch size comes back (its kept cache handed back), tokens eager's in every call."""
    model = _llama()
    prompts = {b: _prompt(b) for b in (1, 8)}
    with torch.no_grad():
        want = {b: model.generate(p, cache_implementation="static", **GREEDY) for b, p in prompts.items()}
    with emulated_torch(), torch.no_grad():
        graphjit.graph_generation(model)
        for b in (1, 8, 1, 8, 1, 8):
            assert torch.equal(model.generate(prompts[b], **GREEDY), want[b]), b
    decode = {b: [k for k in _decode_keys(model.forward) if f"input_ids[{b}, 1]" in k["key"]] for b in (1, 8)}
    for b, keys in decode.items():
        assert len(keys) == 1 and keys[0]["captures"] == 1, (b, model.forward.report())
        # every decode step of its three calls but the two warmups (the capture's call replays too)
        assert keys[0]["replays"] == 3 * (GREEDY["max_new_tokens"] - 1) - 2, (b, keys[0])


def test_a_longer_generation_gets_its_own_cache_and_graph_and_stays_right():
    model = _llama()
    prompt = _prompt(2)
    longer = {**GREEDY, "max_new_tokens": 12}
    with torch.no_grad():
        want_short = model.generate(prompt, cache_implementation="static", **GREEDY)
        want_long = model.generate(prompt, cache_implementation="static", **longer)
    model = _llama()  # a fresh model: transformers remembers the longest cache it made
    with emulated_torch(), torch.no_grad():
        graphjit.graph_generation(model)
        assert torch.equal(model.generate(prompt, **GREEDY), want_short)
        assert torch.equal(model.generate(prompt, **longer), want_long)
        assert torch.equal(model.generate(prompt, **longer), want_long)
    assert model._prepare_static_cache.__self__.reused == 1
    assert sum(k["captures"] for k in _decode_keys(model.forward)) == 2, model.forward.report()


def test_an_encoder_decoder_keeps_its_cross_attention_cache_too():
    model = _t5()
    prompt = _prompt(2, 6)
    with torch.no_grad():
        want = model.generate(prompt, cache_implementation="static", **GREEDY)
    with emulated_torch(), torch.no_grad():
        graphjit.graph_generation(model)
        for _ in range(2):
            assert torch.equal(model.generate(prompt, **GREEDY), want)
    assert model._prepare_static_cache.__self__.reused == 1
    assert sum(k["captures"] for k in _decode_keys(model.forward)) == 1, model.forward.report()


def test_twice_on_one_model_changes_nothing_more(gj_log):
    """It says once, in graphjit's log, what it did to the model (transformers' own compilation off among it);
    the second call changes nothing and says nothing."""
    model = _llama()
    graphjit.graph_generation(model)
    said = [r for r in gj_log.records if "graph_generation(" in r.getMessage()]
    assert len(said) == 1 and "disable_compile=True" in said[0].getMessage(), [r.getMessage() for r in said]
    forward, prepare = model.forward, model._prepare_static_cache
    assert graphjit.graph_generation(model) is model
    assert model.forward is forward and model._prepare_static_cache is prepare
    assert len([r for r in gj_log.records if "graph_generation(" in r.getMessage()]) == 1


def test_the_users_own_cache_choice_stays():
    model = _llama()
    model.generation_config.cache_implementation = "dynamic"
    graphjit.graph_generation(model)
    assert model.generation_config.cache_implementation == "dynamic"
    with torch.no_grad():
        model.generate(_prompt(1), **GREEDY)
    assert not model._prepare_static_cache.__self__.kept  # no static cache was asked for


def test_a_cache_the_caller_passes_or_gets_back_is_theirs():
    model = _llama()
    prompt = _prompt(2)
    with torch.no_grad():
        want = model.generate(prompt, cache_implementation="static", **GREEDY)
    with emulated_torch(), torch.no_grad():
        graphjit.graph_generation(model)
        own = transformers.StaticCache(config=model.config, max_cache_len=32)
        assert torch.equal(model.generate(prompt, past_key_values=own, **GREEDY), want)  # no "both given" error
        first = model.generate(prompt, return_dict_in_generate=True, **GREEDY)
        keys = first.past_key_values.layers[0].keys.clone()
        second = model.generate(prompt, return_dict_in_generate=True, **GREEDY)
        assert torch.equal(second.sequences, want)
    assert second.past_key_values is not first.past_key_values
    assert torch.equal(first.past_key_values.layers[0].keys, keys)  # the first caller's cache was left alone


def test_a_longer_cache_replaces_the_shorter_ones():
    model = _llama()
    with torch.no_grad():
        graphjit.graph_generation(model)
        for n in (4, 8, 12):
            model.generate(_prompt(1), **{**GREEDY, "max_new_tokens": n})
    assert len(model._prepare_static_cache.__self__.kept) == 1


def test_not_a_generating_model_is_refused_naming_the_argument():
    with pytest.raises(graphjit.ConfigError, match=r"graph_generation\(model=Linear\).*generation_config"):
        graphjit.graph_generation(torch.nn.Linear(2, 2))


def test_a_bad_option_is_refused_before_the_model_changes():
    model = _llama()
    with pytest.raises(graphjit.ConfigError):
        graphjit.graph_generation(model, warmup=0)
    assert not isinstance(model.forward, graphjit.GraphedFunction)
    assert "generate" not in vars(model)


FAMILIES = [f for f in hf_families.FAMILIES if f not in ("qwen2_moe", "mixtral")]
"""Every family of ``hf_families`` but the two mixtures of experts, whose routing the CPU stand-in for CUDA
graphs cannot capture (it raises inside; tests/test_gpu_generation.py runs them on a GPU)."""


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_decodes_right_and_from_one_graph_per_batch(family):
    """One decode graph, replayed for every later token; for a family whose cache advances a Python counter on every
    step (Gemma 2 and 3's sliding-window layers), the positions are keys of their own that share one graph once it is
    proven on a second one (graphjit/families.py), each replay advancing the counter as the call would: the emulator
    freezes what a capture read, so tokens equal to eager's across four generate() calls show every replay started
    from the right count."""
    model = hf_families.build(torch, transformers, family)
    prompt = _prompt(2)
    sliding = family in hf_families.SLIDING
    with torch.no_grad():
        want = model.generate(prompt, cache_implementation="static", disable_compile=True, **GREEDY)
    with emulated_torch(), torch.no_grad():
        graphjit.graph_generation(model)
        for _ in range(4 if sliding else 2):
            assert torch.equal(model.generate(prompt, **GREEDY), want)
    fn = model.forward
    decode = [k for k in _decode_keys(fn) if "input_ids[2, 1]" in k["key"]]
    if sliding:  # the first two positions warm up, the third captures and the fourth proves the graph; the
        (decode,) = decode  # window never fills: every position is in one class (graphjit/families.py)
        # positions share their warmups: every decode step replays from the first generate()'s third one on (before,
        # each position warmed up on its own, and the first two generate() calls replayed nothing)
        assert decode["captures"] == 1 and decode["members"] == 6 and decode["replays"] == 4 * 7 - 2, fn.report()
        assert decode["verify"] == "passed (and on another value of its counters)", decode
        assert any(p.endswith(".cumulative_length_int") for p in decode["advances"]), decode
        # the prefill of the reused cache (from 0 to the prompt's length) too; the first one fills the cache's layers
        assert fn.stats()["fallbacks"] == {"changes its own signature: argument 'cache'.layers[0].keys": 1}, \
            fn.report()
        return
    (decode,) = decode
    assert decode["captures"] == 1 and decode["replays"] == 2 * 7 - 2, fn.report()


def test_a_graphed_assistant_model_keeps_its_own_cache_across_rounds():
    """Assisted decoding: transformers gives the assistant its own cache, carried from round to round; graphjit
    leaves it alone (a static cache sized for the first round overflowed in the next one)."""
    main = _llama()
    config = main.config.__class__(**{**main.config.to_dict(), "num_hidden_layers": 1})
    torch.manual_seed(1)
    assistant = transformers.LlamaForCausalLM(config).eval()
    prompt = _prompt(1, 6)
    steps = {**GREEDY, "max_new_tokens": 24}
    with torch.no_grad():
        want = main.generate(prompt, assistant_model=assistant, **steps)
        graphjit.graph_generation(assistant)
        graphjit.graph_generation(main)
        with emulated_torch():
            assert torch.equal(main.generate(prompt, assistant_model=assistant, **steps), want)


def test_the_callers_generation_config_wins_positionally_too():
    model = _llama()
    graphjit.graph_generation(model)
    config = transformers.GenerationConfig(**{**GREEDY, "cache_implementation": "dynamic"})
    with torch.no_grad():
        model.generate(_prompt(1), config)
    assert not model._prepare_static_cache.__self__.kept  # it asked for a dynamic cache: no static one was made


def test_caches_transformers_will_not_ask_for_again_are_dropped():
    model = _llama()
    graphjit.graph_generation(model)
    with torch.no_grad():
        for batch, n in ((1, 4), (2, 4), (3, 12)):  # the last one longer: every later cache is at least that long
            model.generate(_prompt(batch), **{**GREEDY, "max_new_tokens": n})
    kept = model._prepare_static_cache.__self__.kept
    assert [k[:3] for k in kept] == [("static", 3, max(k[2] for k in kept))], list(kept)


def test_the_compile_tracer_compiles_the_decode_step_only(monkeypatch):
    """``tracer="compile"``: the decode step goes through the compile tracer; the prefill (several new tokens) runs
    the eager tracer, as transformers' compiled generate() compiles the decode step only.  Tokens equal eager's;
    ``stats()`` and ``report()`` cover both phases.  (The compile tracer is stood in for by a recorder here: on a
    CPU, Inductor would compile for a minute; tests/test_gpu_generation.py runs the real one.)"""
    compiled = record_compile_tracer(monkeypatch)
    model = _llama()
    prompt = _prompt(2)
    with torch.no_grad():
        want = model.generate(prompt, cache_implementation="static", **GREEDY)
    with emulated_torch(), torch.no_grad():
        graphjit.graph_generation(model, tracer="compile")
        for _ in range(3):
            assert torch.equal(model.generate(prompt, **GREEDY), want)
    seen = [tuple((args[0] if args else kwargs["input_ids"]).shape) for args, kwargs in compiled]
    assert seen and all(shape == (2, 1) for shape in seen), seen  # the prefill, (2, 5), never went through it
    st = model.forward.stats()
    decode, prefill = st["phases"]["decode"], st["phases"]["prefill"]
    assert prefill["calls"] == 3 and decode["calls"] == 3 * 7
    assert st["calls"] == 3 * 8 and st["replays"] == decode["replays"] + prefill["replays"] > 0
    assert decode["graphs"] == 1 and len(st["keys"]) == len(decode["keys"]) + len(prefill["keys"])
    report = model.forward.report()
    assert 'decode step (tracer="compile")' in report and 'prefill and other calls' in report
    model.forward.reset()
    assert model.forward.stats()["graphs"] == 0


def test_prompts_padded_into_buckets_share_one_prefill_graph_and_give_eagers_tokens():
    """``prefill_buckets``: prompts of 5, 6 and 7 tokens are padded on the left to 8 (attention mask zero there),
    the padding is taken off the result, and the tokens are eager's for each unpadded prompt (fp32); the prefill of
    all three is one key, captured once it repeats and replayed after."""
    model = _llama()
    prompts = [_prompt(2, n) for n in (5, 6, 7, 5, 7, 6, 5)]
    masks = [torch.ones_like(p) for p in prompts]
    masks[1][0, :2] = 0  # a caller's own left padding in one row stays hidden
    with torch.no_grad():
        want = [model.generate(p, attention_mask=m, cache_implementation="static", **GREEDY)
                for p, m in zip(prompts, masks)]
    with emulated_torch(), torch.no_grad():
        graphjit.graph_generation(model, prefill_buckets=(8, 16))
        for p, m, w in zip(prompts, masks, want):
            got = model.generate(p, attention_mask=m, **GREEDY)
            assert got.shape == w.shape and torch.equal(got, w), (got, w)
    # (the first prefill, on the fresh cache before transformers allocates its layers, is a key of its own)
    prefill = [k for k in model.forward.stats()["keys"] if "input_ids[2, 8]" in k["key"] and k["state"] == "replay"]
    assert len(prefill) == 1 and prefill[0]["captures"] == 1 and prefill[0]["replays"] >= 3, model.forward.report()


def test_calls_padding_could_change_are_left_as_they_are(gj_log):
    """A call bounded by ``max_length`` (it counts the prompt), one that returns a dict (its cache and hidden states
    would hold the padding), one with stopping criteria (they see the ids) or per-token ``position_ids`` runs
    unpadded, saying why once in graphjit's log (naming the argument); ``min_length`` with ``max_new_tokens`` is
    padded and still counts the caller's prompt.  Every result equals the unpadded call's."""
    model = _llama()
    prompt = _prompt(1, 6)

    class AtLength(transformers.StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return torch.full((input_ids.shape[0],), input_ids.shape[1] >= 9, dtype=torch.bool)

    calls = [
        ({"max_length": 11}, "max_new_tokens"),
        ({"max_new_tokens": 5, "return_dict_in_generate": True}, "return_dict_in_generate"),
        ({"max_new_tokens": 5, "stopping_criteria": transformers.StoppingCriteriaList([AtLength()])},
         "'stopping_criteria'"),
        ({"max_new_tokens": 5, "position_ids": torch.arange(6)[None]}, "'position_ids'"),
        ({"max_new_tokens": 5, "repetition_penalty": 1.3}, "'repetition_penalty'"),
        ({"max_new_tokens": 8, "min_length": 12}, None),
        ({"max_new_tokens": 5, "max_length": None}, None),
    ]
    base = {"do_sample": False, "pad_token_id": 0}
    with torch.no_grad():
        want = [model.generate(prompt, cache_implementation="static", **base, **kw) for kw, _ in calls]
    with emulated_torch(), torch.no_grad():
        graphjit.graph_generation(model, prefill_buckets=[16])
        bucketing = model._prepare_static_cache.__self__.bucketing
        for (kw, why), w in zip(calls, want):
            before = bucketing.padded
            got = model.generate(prompt, **base, **kw)
            got, w = getattr(got, "sequences", got), getattr(w, "sequences", w)
            assert torch.equal(got, w), (kw, got, w)
            assert bucketing.padded == before + (why is None), kw
            if why is not None:
                said = [r.getMessage() for r in gj_log.records if "is not padded into a bucket" in r.getMessage()]
                assert why in said[-1], (kw, said)
    assert len(bucketing.why_kept) == 5 and sum(bucketing.why_kept.values()) == bucketing.kept == 5
    said = [r for r in gj_log.records if "is not padded into a bucket" in r.getMessage()]
    assert len(said) == 5  # once per reason


@pytest.mark.parametrize("bad", ["16", [], [0, 8], [8, 8], [8.0], (True,)])
def test_bad_prefill_buckets_are_refused_naming_the_argument(bad):
    model = _llama()
    with pytest.raises(graphjit.ConfigError, match="prefill_buckets"):
        graphjit.graph_generation(model, prefill_buckets=bad)
    assert not getattr(model, "_graphjit_generation", False)  # nothing changed


def test_the_compile_tracer_leaves_an_encoder_decoders_first_decoder_step_to_the_prefill(monkeypatch):
    """T5 under ``tracer="compile"``: the first forward call of each generate() (its first decoder step: one token,
    the cross-attention cache still to fill) goes to the prefill phase, as transformers counts its prefill, so the
    compiler never sees that step (on the H200 it recompiled for it in every later generate(), seconds each)."""
    compiled_calls = record_compile_tracer(monkeypatch)
    model = _t5()
    prompt = _prompt(2)
    with torch.no_grad():
        want = model.generate(prompt, cache_implementation="static", **GREEDY)
    with emulated_torch(), torch.no_grad():
        graphjit.graph_generation(model, tracer="compile")
        for _ in range(3):
            assert torch.equal(model.generate(prompt, **GREEDY), want)
    st = model.forward.stats()
    decode, prefill = st["phases"]["decode"], st["phases"]["prefill"]
    assert prefill["calls"] == 3, prefill  # one per generate(): its first decoder step
    assert decode["calls"] == 3 * (want.shape[1] - 2), decode  # the decoder start token and the first step excluded
    assert len(compiled_calls) <= decode["calls"] and decode["graphs"] == 1
    model.forward(input_ids=prompt, decoder_input_ids=prompt[:, :1])  # outside generate(): by its length alone
    assert model.forward.stats()["phases"]["decode"]["calls"] == decode["calls"] + 1


def test_graph_generation_again_returns_the_model_or_refuses_other_options():
    """Called again on a model it prepared: the same options, or none, return it as it is; other options (which it
    cannot apply to a prepared model) are a ConfigError, not silently dropped."""

    class Generating:  # what graph_generation asks of a model
        generation_config = object()

        def forward(self, x):
            return x

        def generate(self, *args, **kwargs):
            return None

    model = Generating()
    assert graphjit.graph_generation(model, warmup=2) is model
    forward = model.forward
    assert graphjit.graph_generation(model, warmup=2) is model and model.forward is forward
    assert graphjit.graph_generation(model) is model and model.forward is forward
    for options in ({"warmup": 3}, {"bogus_option": 1}, {"prefill_buckets": (16,)}):
        with pytest.raises(graphjit.ConfigError, match="prepared with other options"):
            graphjit.graph_generation(model, **options)


@pytest.mark.parametrize("family", ["gemma2", "gemma3_text", "llama"])
def test_generate_inside_a_capture_scope_captures_there_and_replays_after_it_as_without(family):
    """generate() for batches 4, 2 and 1 inside a ``capture_scope``, then again after it: tokens equal eager's, every
    batch's decode graph is captured inside the scope (for Gemma, whose positions are keys of a counter's class, on
    the third position, as outside a scope), and the calls after the scope replay as often as the same calls
    without the scope.  Before, Gemma captured nothing inside the scope and the calls after it never replayed."""
    prompts = {b: _prompt(b) for b in (4, 2, 1)}

    def play(scoped: bool):
        model = hf_families.build(torch, transformers, family)
        with emulated_torch(), torch.no_grad():
            graphjit.graph_generation(model)
            with graphjit.capture_scope(progress=False) if scoped else contextlib.nullcontext() as sc:
                first = {b: model.generate(p, **GREEDY) for b, p in prompts.items()}
            inside = model.forward.stats()["captures"], model.forward.stats()["replays"]
            second = {b: model.generate(p, **GREEDY) for b, p in reversed(prompts.items())}
        return model, first, second, (*inside, model.forward.stats()["replays"] - inside[1]), sc

    with torch.no_grad():
        model = hf_families.build(torch, transformers, family)
        want = {b: model.generate(p, cache_implementation="static", disable_compile=True, **GREEDY)
                for b, p in prompts.items()}
    plain, scoped = play(False), play(True)
    for _model, first, second, _inside, _sc in (plain, scoped):
        assert all(torch.equal(first[b], want[b]) and torch.equal(second[b], want[b]) for b in prompts)
    fn, sc = scoped[0].forward, scoped[4]
    (captures, replays, after), (_c, plain_replays, plain_after) = scoped[3], plain[3]
    assert captures == 3 and sc.stats()["captures"] - sc.stats()["failures"] == 3, (sc.summary(), fn.report())
    # (Llama captures each batch on its first decode step there, without warmups: more replays inside the scope)
    assert after == plain_after and replays >= plain_replays, (scoped[3], plain[3], fn.report())
    assert len(_decode_keys(fn)) == 3, fn.report()
    if family != "llama":  # the positions that only warmed up their key before the class captured, said so
        assert "call(s) only warmed up their key" in sc.summary(), sc.summary()
