"""GPU tests, torch + transformers: greedy decoding of a Hugging Face LlamaForCausalLM (random weights from
a LlamaConfig) through @graphjit.graphed, with the loop of examples/hf_llama_decode.py.

StaticCache (closed over): 64 decode steps, tokens equal to the eager loop's, logits within 1e-4, graphs
captured and replayed, for tracers eager and compile and batch 1 and 8.  DynamicCache (an argument):
tokens equal, every step uncaptured with the rebinding named in the report.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.torch]

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import hf_llama_decode as example  # noqa: E402

STEPS = 64


@pytest.fixture(scope="module")
def llama():
    return example.build(layers=8, hidden=1024, dtype=torch.float32, device="cuda")


def prompt(vocab: int, batch: int):
    return torch.randint(0, vocab, (batch, 8), generator=torch.Generator().manual_seed(batch)).cuda()


@pytest.mark.parametrize("tracer", ["eager", "compile"])
@pytest.mark.parametrize("batch", [1, 8])
def test_static_cache_decode_equals_eager(llama, tracer, batch):
    model, config = llama
    p = prompt(config.vocab_size, batch)
    want, want_logits, _, _ = example.decode(model, config, p, STEPS, "static", None)
    got, got_logits, fn, _ = example.decode(model, config, p, STEPS, "static", {"tracer": tracer})
    assert torch.equal(got, want), (got, want)
    worst = max(float((g - w).norm() / w.norm()) for g, w in zip(got_logits, want_logits))
    assert worst < 1e-4, worst
    s = fn.stats()
    assert s["graphs"] == 1 and s["replays"] >= 60 and not s["fallbacks"], fn.report()
    (key,) = s["keys"]
    assert key["fed_replays"] == key["replays"] - 1, key  # the graph copied each step's tensors in and out itself


def test_dynamic_cache_decode_equals_eager_and_says_why_it_is_uncaptured(llama):
    model, config = llama
    p = prompt(config.vocab_size, 1)
    want, _, _, _ = example.decode(model, config, p, 16, "dynamic", None)
    got, _, fn, _ = example.decode(model, config, p, 16, "dynamic", {})
    assert torch.equal(got, want)
    s = fn.stats()
    assert s["graphs"] == 0 and s["fallbacks"] == {"rebinds a tensor held by an object": 16}, fn.report()
    assert "argument 'cache'.layers[0].keys" in fn.report()
