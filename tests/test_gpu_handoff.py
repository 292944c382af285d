"""GPU tests, torch: replays whose graph copies the call's tensors in and out itself (graphjit/handoff.py: feed
nodes set per launch), against eager on the same GPU (make test-gpu)."""

from __future__ import annotations

from typing import Any

import pytest
from only_key import only_entry, only_key

import graphjit

pytestmark = [pytest.mark.gpu, pytest.mark.torch]

torch = pytest.importorskip("torch")


@pytest.fixture
def dev() -> Any:
    return torch.device("cuda", 0)


def test_queued_replays_each_read_their_own_inputs_and_write_their_own_outputs(dev):
    gen = torch.Generator(device="cpu").manual_seed(0)
    w = (torch.randn(1024, 1024, generator=gen) / 32).to(dev)

    def step(x: Any, y: Any) -> tuple[Any, Any]:
        h = x
        for _ in range(6):  # GPU work enough that the host runs ahead and launches queue up
            h = torch.tanh(h @ w)
        return h + y, (h * y).sum(-1)

    xs = [torch.randn(64, 1024, generator=gen).to(dev) for _ in range(200)]
    ys = [torch.randn(64, 1024, generator=gen).to(dev) for _ in range(200)]
    g = graphjit.graphed(step)
    with torch.no_grad():
        got = [g(x, y) for x, y in zip(xs, ys)]  # no synchronisation in between
        want = [step(x, y) for x, y in zip(xs, ys)]
    torch.cuda.synchronize()
    for i, (a, b) in enumerate(zip(got, want)):
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]), i
    key = only_key(g)
    feed = only_entry(g).graph.feed
    assert feed is not None and feed.random is False  # launched by the library, not by torch
    assert key["fed_replays"] == key["replays"] - 1 >= 190, key


def test_calls_the_feed_cannot_serve_are_copied_and_the_nodes_are_cleared_first(dev):
    def f(a: Any, b: Any) -> Any:
        return a * b + 1

    g = graphjit.graphed(f)
    a = torch.randn(256, 256, device=dev)
    b = torch.randn(256, 256, device=dev)
    with torch.no_grad():
        for _ in range(3):
            g(a, b)
        for i in range(10):
            x = torch.randn(256, 256, device=dev)
            # every other call a lazily negated view (the same key; its bytes are not its values): the copy path
            arg = torch._neg_view(x) if i % 2 else x
            assert torch.equal(g(arg, b), f(arg, b)), i
    key = only_key(g)
    assert key["fed_replays"] == 5 and key["replays"] == 1 + 10, key  # the capturing call's, 5 fed, 5 copied


def test_random_ops_are_launched_by_torch_and_follow_the_generator(dev):
    def noisy(x: Any) -> Any:
        return torch.nn.functional.dropout(x, 0.5, training=True) + torch.rand_like(x)

    xs = [torch.ones(1 << 14, device=dev) * (i + 1) for i in range(20)]
    torch.manual_seed(3)
    want = [noisy(x) for x in xs]
    after = torch.rand(4, device=dev)
    g = graphjit.graphed(noisy)
    torch.manual_seed(3)
    with torch.no_grad():
        got = [g(x) for x in xs]
    assert torch.equal(torch.rand(4, device=dev), after)
    for i, (a, b) in enumerate(zip(got, want)):
        assert torch.equal(a, b), i
    feed = only_entry(g).graph.feed
    assert feed is not None and feed.random is True
    assert only_key(g)["fed_replays"] == only_key(g)["replays"] - 1


def test_static_inputs_alias_outputs_and_an_adopted_cache(dev):
    gen = torch.Generator(device="cpu").manual_seed(1)
    w = (torch.randn(128, 128, generator=gen) / 12).to(dev)

    def decode(x: Any, cache: Any, pos: Any) -> dict[str, Any]:
        cache.index_copy_(0, pos, torch.tanh(x @ w))
        return {"out": cache.sum(0, keepdim=True) + x, "cache": cache}

    cache, ref = torch.zeros(32, 128, device=dev), torch.zeros(32, 128, device=dev)
    g = graphjit.graphed(decode, outputs="alias")
    with torch.no_grad():
        for t in range(32):
            x = torch.randn(1, 128, generator=gen).to(dev)
            pos = torch.tensor([t], device=dev)
            out, want = g(x, cache, pos), decode(x, ref, pos)
            assert out["cache"] is cache and torch.equal(out["out"], want["out"]), t
            assert torch.equal(cache, ref), t
        key = only_key(g)
        assert key["fed_replays"] >= 28, key
        (sx, scache, spos), _ = g.static_inputs(x, cache, pos)
        sx.copy_(x)
        spos.fill_(3)
        before = key["input_copies"]
        out = g(sx, scache, spos)
        assert torch.equal(out["out"], decode(x, ref, spos)["out"])
        assert only_key(g)["input_copies"] == before
