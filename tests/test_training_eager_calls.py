"""graphed_layer calls that must run eagerly, with a reason that says why, and act exactly like eager: under torch's
non-reentrant activation checkpointing or other saved-tensors hooks, inside another layer's recording.

Each runs the same loop eagerly and graphed, under the graph emulator (``emu``) and with simulated graphs
(``_simulate=True``), and compares parameters and gradients step by step."""

from __future__ import annotations

import pytest

import graphjit

torch = pytest.importorskip("torch")
checkpoint = pytest.importorskip("torch.utils.checkpoint")

nn = torch.nn


def block(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 8))


def train(step, model: nn.Module, steps: int = 6) -> list[dict[str, torch.Tensor]]:
    """``steps`` SGD steps of ``step(x)``'s sum; the parameters and gradients after each."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1)
    seen = []
    for _ in range(steps):
        x = torch.randn(4, 8, generator=gen, requires_grad=True)
        step(x).sum().backward()
        seen.append({"grad." + n: p.grad.clone() for n, p in model.named_parameters()})
        opt.step()
        opt.zero_grad()
        seen.append({n: p.detach().clone() for n, p in model.named_parameters()})
    return seen


def assert_same(eager: list[dict[str, torch.Tensor]], graphed: list[dict[str, torch.Tensor]]) -> None:
    assert len(eager) == len(graphed)
    for i, (a, b) in enumerate(zip(eager, graphed)):
        assert a.keys() == b.keys(), i
        for name in a:
            assert torch.equal(a[name], b[name]), (i, name)


@pytest.fixture(params=["emulator", "simulate"])
def graphs(request):
    """How graphed_layer records here: under the graph emulator, or with its own simulated graphs."""
    if request.param == "simulate":
        yield True
        return
    from graph_emulator import emulated_torch

    with emulated_torch():
        yield False


def test_non_reentrant_checkpointing_runs_the_layer_eagerly(graphs):
    m = block()
    eager = train(lambda x: checkpoint.checkpoint(m, x, use_reentrant=False), m)
    m2 = block()
    g = graphjit.graphed_layer(m2, warmup=2, _simulate=graphs)
    got = train(lambda x: checkpoint.checkpoint(g, x, use_reentrant=False), m2)
    assert_same(eager, got)
    s = g.stats()
    # every call (forward and the backward's recomputation) ran eagerly, for that reason only
    assert s["fallbacks"] == {"inside activation checkpointing (torch.utils.checkpoint, use_reentrant=False)": 12}
    assert s["captures"] == 0 and s["keys"] == []
    assert "inside another capture" not in g.report()


def test_checkpointing_after_graphs_were_recorded(graphs):
    """A layer graphed without checkpointing, then called under it (gradient checkpointing switched on)."""
    m = block()

    plain = train(m, m, steps=4)
    eager = plain + train(lambda x: checkpoint.checkpoint(m, x, use_reentrant=False), m, steps=3)
    m2 = block()
    g = graphjit.graphed_layer(m2, warmup=1, _simulate=graphs)
    got = train(g, m2, steps=4) + train(lambda x: checkpoint.checkpoint(g, x, use_reentrant=False), m2, steps=3)
    assert_same(eager, got)
    s = g.stats()
    assert s["replays"] == 3 and s["fallbacks"] == {
        "inside activation checkpointing (torch.utils.checkpoint, use_reentrant=False)": 6}


def test_other_saved_tensors_hooks_are_named(graphs):
    m = block()

    def under_hooks(fn):
        def step(x):
            with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
                return fn(x)
        return step

    eager = train(under_hooks(m), m, steps=3)
    m2 = block()
    g = graphjit.graphed_layer(m2, warmup=1, _simulate=graphs)
    assert_same(eager, train(under_hooks(g), m2, steps=3))
    (reason,) = g.stats()["fallbacks"]
    assert reason.startswith("inside saved-tensors hooks (") and "saved_tensors_hooks" in reason


def test_inside_another_capture_names_the_outer_recording():
    """A graphed layer inside another graphed layer: the outer recording's calls of the inner one run eagerly (the
    outer graph records them), with a reason naming the outer layer."""

    class Outer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = graphjit.graphed_layer(block(), warmup=1, _simulate=True)
            self.head = nn.Linear(8, 8)

        def forward(self, x):
            return self.head(self.inner(x))

    torch.manual_seed(0)
    outer = Outer()
    g = graphjit.graphed_layer(outer, warmup=1, _simulate=True)
    for _ in range(3):
        g(torch.randn(4, 8, requires_grad=True)).sum().backward()
    reasons = outer.inner.stats()["fallbacks"]
    assert reasons and all(r == f"inside another capture (the recording of {g._graphjit_core.name})"
                           for r in reasons)


# -- calls that write state their arguments hold ---------------------------------------------------------------------
class Cache:
    """A cache that grows per call, as transformers' DynamicCache does: each layer's first call creates its entry,
    later calls concatenate."""

    def __init__(self) -> None:
        self.keys: list[torch.Tensor | None] = [None]


class CachingBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = block()

    def forward(self, x, cache=None, acc=None):
        h = self.body(x)
        if cache is not None:
            k = h.detach()
            cache.keys[0] = k if cache.keys[0] is None else torch.cat([cache.keys[0], k])
        if acc is not None:
            acc.add_(1)
        return h


def test_a_call_that_stores_in_an_argument_runs_eagerly(graphs):
    def run(graph: bool):
        torch.manual_seed(0)
        m = CachingBlock()
        g = graphjit.graphed_layer(m, warmup=1, _simulate=graphs) if graph else m
        caches: list[Cache] = []

        def step(x):
            caches.append(Cache())
            return g(g(x, cache=caches[-1]), cache=caches[-1])  # the second call finds an entry: concatenates

        return train(step, m, steps=4), caches, g

    eager, eager_caches, _ = run(False)
    got, caches, g = run(True)
    assert_same(eager, got)
    for a, b in zip(eager_caches, caches):
        assert a.keys[0] is not None and b.keys[0] is not None and torch.equal(a.keys[0], b.keys[0])
    s = g.stats()
    assert s["captures"] == 0 and s["fallbacks"] == {"stores tensors in its argument 'cache'": 8}
    key1, _second = s["keys"]  # the first call's key (an empty cache), the second's (a tensor in it)
    assert "argument 'cache'.keys[0]" in key1["detail"] and "DynamicCache" in key1["detail"]


def test_a_call_that_writes_a_tensor_argument_in_place_runs_eagerly(graphs):
    def run(graph: bool):
        torch.manual_seed(0)
        m = CachingBlock()
        g = graphjit.graphed_layer(m, warmup=1, _simulate=graphs) if graph else m
        acc = torch.zeros(3)
        return train(lambda x: g(x, acc=acc), m, steps=4), acc, g

    eager, eager_acc, _ = run(False)
    got, acc, g = run(True)
    assert_same(eager, got)
    assert torch.equal(acc, eager_acc) and acc.tolist() == [4.0, 4.0, 4.0]  # graphed: stayed at 1 (a static copy)
    assert g.stats()["fallbacks"] == {"writes its argument 'acc' in place": 4}


def test_hf_decoder_layers_with_the_default_cache_train_as_eager(emu):
    """transformers passes a DynamicCache to every decoder layer in training (use_cache left at its default): the
    recording's extra passes appended to it again and the capturing call crashed."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)

    def run(graph: bool, **kw):
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(cfg).train()
        if graph:
            for i in range(len(model.model.layers)):
                model.model.layers[i] = graphjit.graphed_layer(model.model.layers[i], warmup=1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        gen = torch.Generator().manual_seed(1)
        losses = []
        for _ in range(4):
            ids = torch.randint(0, 64, (2, 12), generator=gen)
            loss = model(input_ids=ids, labels=ids, **kw).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        return losses, model

    eager, _ = run(False)
    got, model = run(True)
    assert got == eager
    (reason,) = model.model.layers[0].stats()["fallbacks"]
    assert reason.startswith("stores tensors in its argument")
    graphed, model = run(True, use_cache=False)  # without the cache: graphed
    assert graphed == eager and model.model.layers[0].stats()["replays"] == 3
