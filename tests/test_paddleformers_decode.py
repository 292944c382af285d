"""Greedy decoding of a PaddleFormers Llama (random weights, 2 layers, hidden 64) through ``graphjit.graphed``:
tokens equal eager's with both tracers, batch 1 and 2, and the reason in ``stats()``/``report()``.

PaddleFormers' Llama grows its ``DynamicCache`` by concatenation (it has no static cache), so no decode step is
captured: on a CPU the reason is that paddle is a CPU build, on a GPU that the step rebinds the cache's tensors
(found here on the CPU by letting graphjit's warmup run, :func:`test_the_reason_a_gpu_would_give`).

Two things PaddleFormers 1.2 needs with paddlepaddle 3.3 (see examples/paddleformers_decode.py):

* SOT: ``PretrainedConfig.get`` is marked ``paddle.jit.not_to_static`` (else SOT builds PaddleFormers' RMSNorm,
  marked ``unified``, with dy2static, which recurses through the config's ``__getattribute__``);
* ``import paddleformers`` hides torch from a first ``import transformers`` in the same process (it imports
  transformers with ``sys.modules["torch"] = None``): transformers is imported first here, so that the torch
  tests that run after this module still find torch.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import paddle_cuda

import graphjit

pytestmark = pytest.mark.paddle

paddle = pytest.importorskip("paddle")
if importlib.util.find_spec("transformers") is not None:
    importlib.import_module("transformers")  # before paddleformers (see the module docstring)
pft = pytest.importorskip("paddleformers.transformers")
cache_utils = pytest.importorskip("paddleformers.transformers.cache_utils")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import paddleformers_decode as example  # noqa: E402  (its model and decode loop)

STEPS = 4
REBINDS = "rebinds a tensor held by an object"


def expected_reason() -> str:
    return REBINDS if paddle_cuda() else f"no CUDA graphs: paddle {paddle.__version__} is a CPU build"


@pytest.fixture(scope="module")
def llama():
    paddle.set_device("gpu" if paddle_cuda() else "cpu")
    example.sot_workaround()
    model, _config = example.build(layers=2, hidden=64)
    return model


def prompt(batch: int):
    return paddle.to_tensor(np.random.default_rng(batch).integers(3, 128, (batch, 8)))


def decode(model, ids, graphed_options: dict | None = None, cache_as: str = "closure"):
    """The example's prefill and STEPS greedy steps (graphed when options are given): (tokens, step function)."""
    tokens, _logits, fn, _seconds = example.decode(model, ids, STEPS, cache_as, graphed_options)
    return tokens, fn


def test_the_cache_grows_by_concatenation(llama):
    """What makes every step uncapturable: the cache's tensors are new objects after each step."""
    with paddle.no_grad():
        cache = llama(prompt(1), use_cache=True, return_dict=True).past_key_values
        assert isinstance(cache, cache_utils.DynamicCache)
        keys = cache.layers[0].keys
        llama(paddle.to_tensor([[5]]), use_cache=True, past_key_values=cache, return_dict=True)
    assert cache.layers[0].keys is not keys and cache.layers[0].keys.shape[-2] == keys.shape[-2] + 1


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("tracer", ["sot", "eager"])
def test_graphed_decode_gives_eager_tokens(llama, tracer, batch, gj_log):
    want, _ = decode(llama, prompt(batch))
    got, fn = decode(llama, prompt(batch), {"tracer": tracer})
    np.testing.assert_array_equal(got, want)
    stats = fn.stats()
    assert stats["calls"] == STEPS and stats["graphs"] == 0 and stats["replays"] == 0, stats
    assert stats["fallbacks"] == {expected_reason(): STEPS}, stats["fallbacks"]
    assert len(stats["keys"]) == 1 and stats["keys"][0]["key"].startswith(f"tok[{batch}, 1] int64"), stats["keys"]
    assert expected_reason() in fn.report()
    if not paddle_cuda():
        assert any("no CUDA graph" in r.getMessage() and f"paddle {tracer} function" in r.getMessage()
                   for r in gj_log.records), [r.getMessage() for r in gj_log.records]


@pytest.mark.parametrize("batch", [1, 2])
def test_a_cache_passed_as_argument_is_a_new_signature_every_step(llama, batch):
    want, _ = decode(llama, prompt(batch))
    got, fn = decode(llama, prompt(batch), {"tracer": "eager"}, cache_as="argument")
    np.testing.assert_array_equal(got, want)
    stats = fn.stats()
    assert stats["fallbacks"] == {expected_reason(): STEPS}, stats["fallbacks"]
    keys = [k["key"] for k in stats["keys"]]
    assert len(keys) == STEPS, keys
    assert [f"cache.layers[0].keys[{batch}, 2, {8 + i}, 16]" in k for i, k in enumerate(keys)] == [True] * STEPS, keys


def test_the_reason_a_gpu_would_give(llama, monkeypatch):
    """On the CPU, with graphjit told that CUDA graphs exist, its first warmup call finds that the step replaces
    the cache's tensors, and the key runs uncaptured from then on (no capture is attempted, so the CPU does)."""
    if paddle_cuda():
        pytest.skip("a GPU is here: test_graphed_decode_gives_eager_tokens expects this reason itself")
    from graphjit.backends.paddle.graphs import PaddleBackend

    monkeypatch.setattr(PaddleBackend, "graphs_unavailable", lambda self, device: None)
    want, _ = decode(llama, prompt(2))
    got, fn = decode(llama, prompt(2), {"tracer": "eager"})
    np.testing.assert_array_equal(got, want)
    stats = fn.stats()
    assert stats["fallbacks"] == {REBINDS: STEPS} and stats["captures"] == 0, stats
    detail = stats["keys"][0]["detail"]
    assert "'cache'.layers[0].keys" in detail and "grows by concatenation" in detail, detail


@pytest.mark.parametrize("tracer", ["eager", "sot"])
def test_generate_with_a_graphed_forward(llama, tracer):
    """``model.forward = graphjit.graphed(model.forward)`` under PaddleFormers' ``generate()``: every call is a new
    signature (the cache and the attention mask grow).  With SOT the cache is made before ``generate()``: a
    ``DynamicCache`` created inside the SOT-translated forward (the prefill's) fails in SOT (HasNoAttributeError)."""
    ids = prompt(2)
    kwargs = {"max_new_tokens": STEPS, "decode_strategy": "greedy_search", "eos_token_id": None}
    with paddle.no_grad():
        want = llama.generate(ids, **kwargs)[0].numpy()
        llama.forward = graphjit.graphed(llama.forward, tracer=tracer)
        try:
            cache = cache_utils.DynamicCache(config=llama.config) if tracer == "sot" else None
            got = llama.generate(ids, past_key_values=cache, **kwargs)[0].numpy()
            fn = llama.forward
        finally:
            del llama.forward
    np.testing.assert_array_equal(got, want)
    stats = fn.stats()
    assert stats["calls"] == STEPS and stats["graphs"] == 0, stats  # the prefill and STEPS - 1 decode steps
    assert len(stats["keys"]) == STEPS, [k["key"] for k in stats["keys"]]
    if not paddle_cuda():
        assert stats["fallbacks"] == {expected_reason(): STEPS}, stats["fallbacks"]
