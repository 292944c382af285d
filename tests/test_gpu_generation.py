"""GPU tests, torch + transformers: ``graphjit.graph_generation(model)`` then ``model.generate()`` with its defaults
(issue 29), for every family of ``hf_families`` (random weights from configs, fp32, 4 layers, hidden 256), batch
1 and 8: greedy tokens equal eager ``generate()``'s in each of two calls, transformers compiles nothing, and the
decode step is captured once per batch size and replayed by both calls (the static cache kept across them).
Gemma 2 and 3 count their sliding window's length in a Python int that every step advances: one key per position,
the positions of one class sharing their warmups and one graph (graphjit/families.py), captured in the first call,
each replay advancing the int as the call would (graphjit/advances.py)."""

from __future__ import annotations

import re

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.torch]

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import graphjit  # noqa: E402
from graphjit.bench.torch import hf_families  # noqa: E402

GREEDY = {"max_new_tokens": 16, "do_sample": False, "pad_token_id": 0}
FAMILIES = list(hf_families.FAMILIES)


WINDOW = 16  # hf_families' sliding window for the tests: 8 prompt tokens and 16 new ones fill it half-way


def _check_positions(keys, fn):
    """Gemma's decode keys, one per position (its cache's ``cumulative_length_int``): the positions before the window
    is full share their warmups and one graph (graphjit/families.py), warmed up on the first two (8, the prompt's
    length, and 9) and captured on the third (after one undone run of its own) in the first call, verified on the
    fourth, replayed by the others, each
    replay advancing the count; their rows are the captured one's ``members``.  Once the window is full, the layer's
    rolling branch copies an index made from a Python list to the GPU (``torch.tensor([-1], device=...)``), a CPU-GPU
    sync under the eager tracer: such a key runs uncaptured, saying so, unless it was captured (then its class shares
    its graph too)."""
    rows = {int(re.search(r"cumulative_length_int=(\d+)", k["key"]).group(1)): k for k in keys}
    first = rows[min(rows)]
    assert min(rows) == 10 and first["state"] == "replay" and first["captures"] == 1, fn.report()
    # the warmups of 8 and 9, and one run of its own value before its capture (families.py)
    assert first["members"] == WINDOW - 8 - 1 and first["advances"] and first["warmups"] == 3, first
    assert first["verify"] == "passed (and on another value of its counters)", first
    assert not any(8 <= n < WINDOW and n != 10 for n in rows), fn.report()  # served by the captured one's graph
    for n, k in rows.items():
        if n >= WINDOW:
            assert (k["state"] == "replay" and k["captures"] == 1) or \
                (k["state"] == "fallback" and k["reason"].startswith("CPU-GPU sync")), (n, k)


@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("family", FAMILIES)
def test_one_line_generate_equals_eager_and_decodes_from_one_graph(family, batch):
    model = hf_families.build(torch, transformers, family, layers=4, hidden=256, device="cuda")
    prompt = torch.randint(3, 256, (batch, 8), generator=torch.Generator().manual_seed(batch)).cuda()
    with torch.no_grad():
        want = model.generate(prompt, cache_implementation="static", disable_compile=True, **GREEDY)
    graphjit.graph_generation(model)
    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    counters.clear()
    sliding = family in hf_families.SLIDING
    calls = 4 if sliding else 2
    with torch.no_grad():
        for _ in range(calls):
            got = model.generate(prompt, **GREEDY)  # transformers' defaults: it would compile the decode step
            assert torch.equal(got, want), (family, got, want)
    assert not counters["stats"]["unique_graphs"], dict(counters["stats"])  # nothing compiled
    fn = model.forward
    s = fn.stats()
    decode = [k for k in s["keys"] if k["state"] == "replay" and f"input_ids[{batch}, 1]" in k["key"]]
    assert model._prepare_static_cache.__self__.reused == calls - 1
    if sliding:  # one key per position: the first call warms up, captures and proves the family's graph
        _check_positions([k for k in s["keys"] if f"input_ids[{batch}, 1]" in k["key"]], fn)
        return
    # transformers before 5.20 returns the model's rope_deltas tensor, which every generate() makes anew, in each
    # step's output, and the decode step reads it off the model: from the second call on its graph reads graphjit's
    # copy, filled before each step (graphjit/renewals.py), so the key is captured a second time, once
    captures = 2 if _returns_rope_deltas(model) else 1
    assert len(decode) == 1 and decode[0]["captures"] == captures, fn.report()
    assert decode[0]["replays"] >= 2 * (GREEDY["max_new_tokens"] - 1) - 2, fn.report()


def _returns_rope_deltas(model) -> bool:
    """The model's step output holds its ``rope_deltas`` tensor (Qwen2-VL in transformers before 5.20)."""
    module = __import__(type(model).__module__, fromlist=["*"])
    output = getattr(module, type(model).__name__.replace("ForConditionalGeneration", "CausalLMOutputWithPast"), None)
    return output is not None and "rope_deltas" in getattr(output, "__dataclass_fields__", {})


def test_the_compile_tracer_compiles_the_decode_step_once_and_never_the_prefill():
    """``graph_generation(model, tracer="compile")``: Inductor compiles the decode step in the first ``generate()``;
    the prefill runs the eager tracer, so later calls compile nothing (before, the prefill went through the compiled
    function and the second call recompiled it for the cache's counters, now on the GPU: 3.5-24 s on an H200)."""
    model = hf_families.build(torch, transformers, "llama", layers=4, hidden=256, device="cuda")
    prompt = torch.randint(3, 256, (1, 8), generator=torch.Generator().manual_seed(1)).cuda()
    graphjit.graph_generation(model, tracer="compile")
    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    counters.clear()
    with torch.no_grad():
        first = model.generate(prompt, **GREEDY)
        compiled = dict(counters["stats"])
        assert compiled.get("unique_graphs"), compiled  # the decode step, compiled
        for _ in range(2):
            assert torch.equal(model.generate(prompt, **GREEDY), first)
    assert dict(counters["stats"]) == compiled  # nothing compiled after the first call
    s = model.forward.stats()
    assert s["phases"]["decode"]["graphs"] == 1 and s["phases"]["decode"]["replays"] >= 3 * (16 - 1) - 2, \
        model.forward.report()
    assert s["phases"]["prefill"]["calls"] == 3, model.forward.report()


@pytest.mark.parametrize("family", ["t5", "gemma3_text"])
def test_the_compile_tracer_compiles_once_and_decodes_right_where_steps_change_their_own_key(family):
    """``tracer="compile"`` on the two families whose steps advance Python state: T5's first decoder step (it sets
    the cross-attention cache's ``is_updated``) goes to the prefill phase and nothing is compiled after the first
    ``generate()`` (its second took 9-10 s on an H200); Gemma 3's sliding layers advance a Python int on every step,
    so each position is a key, the positions of one class sharing their warmups and a graph captured in the first
    call, whose replays advance the int (before graphjit set it, a replay froze it: a device-side assert on an H200),
    and four calls give eager's tokens."""
    model = hf_families.build(torch, transformers, family, layers=4, hidden=256, device="cuda")
    prompt = torch.randint(3, 256, (1, 8), generator=torch.Generator().manual_seed(1)).cuda()
    with torch.no_grad():
        want = model.generate(prompt, cache_implementation="static", disable_compile=True, **GREEDY)
    graphjit.graph_generation(model, tracer="compile")
    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    counters.clear()
    with torch.no_grad():
        assert torch.equal(model.generate(prompt, **GREEDY), want), family
        compiled = dict(counters["stats"])
        for _ in range(3):
            assert torch.equal(model.generate(prompt, **GREEDY), want), family
    fn = model.forward
    decode = fn.stats()["phases"]["decode"]
    if family == "t5":
        assert dict(counters["stats"]) == compiled, (compiled, dict(counters["stats"]))
        assert decode["graphs"] == 1 and decode["replays"] >= 3 * (16 - 1), fn.report()
    else:
        _check_positions([k for k in decode["keys"] if "input_ids[1, 1]" in k["key"]], fn)
        # the sliding layers' count symbolic from the first compilation: one per branch (the window filling, then
        # full), where Dynamo's automatic dynamic compiled the first count on its own too (3, 12 s each on an H100)
        assert compiled.get("unique_graphs", 0) <= 2, compiled


@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2"])
def test_prompts_in_buckets_graph_the_prefill_and_give_eagers_tokens(family):
    """``prefill_buckets``: prompts of 5-7 tokens padded on the left to 8; greedy tokens equal eager's for each
    unpadded prompt (fp32), and the prefill of all lengths is one key, captured once it repeats."""
    model = hf_families.build(torch, transformers, family, layers=4, hidden=256, device="cuda")
    lengths = (5, 6, 7, 5, 7, 6, 5)
    prompts = [torch.randint(3, 256, (2, n), generator=torch.Generator().manual_seed(n)).cuda() for n in lengths]
    with torch.no_grad():
        want = [model.generate(p, cache_implementation="static", disable_compile=True, **GREEDY) for p in prompts]
    graphjit.graph_generation(model, prefill_buckets=(8, 16))
    with torch.no_grad():
        for p, w in zip(prompts, want):
            assert torch.equal(model.generate(p, **GREEDY), w), family
    fn = model.forward
    prefill = [k for k in fn.stats()["keys"] if "input_ids[2, 8]" in k["key"] and k["state"] == "replay"]
    assert len(prefill) == 1 and prefill[0]["replays"] >= 1, fn.report()


@pytest.mark.parametrize("keyword", ["cache", "past_key_values"])
@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_a_hand_written_decode_loop_gets_its_own_cache_back_by_either_keyword(family, keyword):
    """A decode loop written by hand around a graphed forward, the static cache passed by its name or by its deprecated
    one (``past_key_values=``, which transformers' wrapper renames: graphjit passes such a call as written): greedy
    tokens equal the eager loop's, and every step returns the caller's own cache object with its own layers (their
    Python counts where eager leaves them), replays included.  Llama replays every decode step from then on; Gemma 2
    one graph per position before its window fills, and uncaptured past it (below)."""
    model = hf_families.build(torch, transformers, family, layers=4, hidden=256, device="cuda")
    prompt = torch.randint(3, 256, (1, 8), generator=torch.Generator().manual_seed(3)).cuda()
    cache = transformers.StaticCache(config=model.config, max_cache_len=64)

    def decode(forward):
        cache.reset()
        out = forward(input_ids=prompt, cache_position=torch.arange(8, device="cuda"), use_cache=True,
                      **{keyword: cache})
        steps = []
        for step in range(20):
            token = out.logits[:, -1:].argmax(-1)
            out = forward(input_ids=token, cache_position=torch.tensor([8 + step], device="cuda"), use_cache=True,
                          position_ids=torch.tensor([[8 + step]], device="cuda"), **{keyword: cache})
            back = out.past_key_values
            steps.append((int(token), back is cache, all(a is b for a, b in zip(back.layers, cache.layers)),
                          [getattr(layer, "cumulative_length_int", None) for layer in back.layers]))
        return steps

    with torch.no_grad():
        want = decode(model.forward)
        if keyword == "cache" and not all(same for _t, same, _l, _n in want):  # before transformers named it cache=
            pytest.skip(f"transformers {transformers.__version__}: forward(cache=...) does not take the caller's cache")
        model.forward = graphjit.graphed(model.forward)
        for _ in range(4):
            assert decode(model.forward) == want, model.forward.report()
    assert all(same and layers for _t, same, layers, _n in want)
    stats = model.forward.stats()
    if family not in hf_families.SLIDING:
        assert stats["replays"] >= 20, model.forward.report()
        return
    # Gemma without an attention mask: forward builds its mask inside, from its layers' counts, so the family's proof
    # on a second position differs from eager (graphjit/families.py) and each position is a key of its own (2 warmup
    # runs, captured in the third); once the window is full the rolling branch's torch.tensor([-1], device=...) is a
    # CPU-GPU sync: those positions run uncaptured, saying so.
    assert stats["replays"] >= WINDOW - 8, model.forward.report()
    for k in stats["keys"]:
        if k["state"] == "fallback":
            assert k["reason"].startswith(("CPU-GPU sync", "changes its own signature")), k
        position = re.search(r"cumulative_length_int=(\d+)", k["key"])
        if position is not None and int(position.group(1)) >= WINDOW:
            assert k["state"] == "fallback" and k["reason"].startswith("CPU-GPU sync"), k


@pytest.mark.parametrize("family", ["llama", "t5"])
def test_decode_steps_signed_by_the_lanes_walk_check_give_eagers_tokens(family, lane_on):
    """With the replay lane loaded, the decode step's keyword call (the cache object, its layers; T5's
    ``encoder_outputs``, a ``ModelOutput``) is signed by the lane's C walk check once its key repeats
    (graphjit/walk_spec.py): the second ``generate()`` walks at most its prefill and none of its decode steps, and both
    calls give eager's tokens from real CUDA graphs (run on the CPU emulator before the GPU: 3 walks, tokens equal)."""
    model = hf_families.build(torch, transformers, family, layers=4, hidden=256, device="cuda")
    prompt = torch.randint(3, 256, (1, 8), generator=torch.Generator().manual_seed(1)).cuda()
    with torch.no_grad():
        want = model.generate(prompt, cache_implementation="static", disable_compile=True, **GREEDY)
    graphjit.graph_generation(model)
    with torch.no_grad():
        assert torch.equal(model.generate(prompt, **GREEDY), want)
    signers = {id(s): s for s in _signers(model.forward)}
    walks: list[int] = []
    for signer in signers.values():
        walk = signer._sign

        def counted(*a, walk=walk):
            walks.append(1)
            return walk(*a)

        signer._sign = counted
    with torch.no_grad():
        assert torch.equal(model.generate(prompt, **GREEDY), want)
    assert any(s._walked for s in signers.values()), "the decode key's walk check was made"
    # at most the prefill (its cache reused, so another key than the first call's prefill: walked, signed again after
    # its warmup run, and once more where its check is made); no decode step
    assert len(walks) <= 3, len(walks)
    assert model.forward.stats()["replays"] >= 2 * (GREEDY["max_new_tokens"] - 1) - 2, model.forward.report()


def _signers(fn):
    """The signers of a graphed function, or of each phase of graph_generation's forward."""
    found = []
    for obj in (fn, *(getattr(fn, name, None) for name in ("decode", "prefill", "graphed", "eager"))):
        state = getattr(obj, "_self_state", None)
        if state is not None and getattr(state, "signer", None) is not None:
            found.append(state.signer)
    assert found, f"no graphed function found in {fn!r}"
    return found
