"""A function that returns the cache it writes in place (transformers' models return their cache object,
and generate() passes that object back in the next call) is captured once (issue 20, GPT-2): the returned
cache is the caller's own, never a copy, so the next call finds every tensor where the graph has it.  Before,
"copy" outputs handed back a copy of the cache with copies of its tensors, and every later call recaptured
one "moved" tensor at a time (1 + 3 x layers captures).  CPU lifecycle through tests/graph_emulator.py."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")


import graphjit  # noqa: E402

pytestmark = pytest.mark.torch


class Layer:
    """transformers' StaticLayer in miniature: a length tensor made at construction, the buffers made (and
    the length moved to their device) at the first update, then everything written in place."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.length = torch.tensor(0)
        self.keys: torch.Tensor | None = None

    def update(self, k: torch.Tensor) -> torch.Tensor:
        if self.keys is None:  # lazy initialisation
            self.keys = torch.zeros(self.size, k.shape[-1], device=k.device)
            self.length = self.length.to(k.device)
        pos = torch.arange(k.shape[0]) + self.length
        self.keys.index_copy_(0, pos, k)
        self.length.add_(k.shape[0])
        return self.keys


class Cache:
    def __init__(self, layers: int, size: int) -> None:
        self.layers = [Layer(size) for _ in range(layers)]


def _model(layers: int = 3, dim: int = 4):
    gen = torch.Generator().manual_seed(0)
    ws = [torch.randn(dim, dim, generator=gen) for _ in range(layers)]

    def forward(x, cache):
        h = x
        for w, layer in zip(ws, cache.layers):
            keys = layer.update(h @ w)
            h = h + keys.sum(0, keepdim=True) * 0.01
        return {"logits": h.sum(-1), "cache": cache}  # a model output: the cache object itself, like ModelOutput

    return forward


def _generate(forward, prompt: torch.Tensor, steps: int, layers: int = 3):
    """generate()'s loop: the next call gets the cache the previous call returned."""
    out = forward(prompt, Cache(layers, 32))
    logits, caches = [out["logits"]], [out["cache"]]
    x = prompt[-1:]
    for _ in range(steps):
        out = forward(x + out["logits"][-1:].unsqueeze(-1), out["cache"])
        logits.append(out["logits"])
        caches.append(out["cache"])
    return logits, caches


def test_a_returned_cache_is_the_callers_own_and_the_key_captures_once(emu):
    forward = _model()
    prompt = torch.randn(5, 4, generator=torch.Generator().manual_seed(1))
    want, _ = _generate(forward, prompt, 12)
    g = graphjit.graphed(forward)
    got, caches = _generate(g, prompt, 12)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(got, want))
    assert all(c is caches[0] for c in caches), "the returned cache is the one passed in, as eager returns it"
    s = g.stats()
    decode = next(k for k in s["keys"] if k["state"] == "replay")
    assert decode["captures"] == 1 and decode["reason"] is None, g.report()
    assert decode["replays"] == 12 - 2 and decode["input_copies"] <= 10, decode  # 2 warmups, then the capture
    assert s["graphs"] == 1 and not [r for r in s["fallbacks"] if "moved" in r], s


def test_a_returned_input_tensor_is_the_callers_tensor_and_is_not_poisoned_as_an_alias(emu, monkeypatch):
    monkeypatch.setenv("GRAPHJIT_CHECK_OUTPUTS", "1")
    graphjit.refresh_env()

    def step(x, cache):
        cache.add_(x)
        return cache, cache.sum()

    for outputs in ("copy", "alias"):
        g = graphjit.graphed(step, outputs=outputs)
        cache = torch.zeros(3)
        for i in range(6):
            back, total = g(torch.ones(3), cache)
            assert back is cache and float(total) == 3.0 * (i + 1), (outputs, i)
        assert torch.equal(cache, torch.full((3,), 6.0)), outputs  # the alias poisoning skipped the caller's cache
        assert g.stats()["graphs"] == 1


def test_a_cache_passed_anew_with_every_tensor_moved_recaptures_once(emu):
    forward = _model()
    g = graphjit.graphed(forward)
    x = torch.randn(1, 4, generator=torch.Generator().manual_seed(2))
    cache = Cache(3, 32)
    forward(torch.randn(2, 4), cache)  # initialised outside
    for _ in range(4):
        g(x, cache)
    moved = copy.deepcopy(cache)  # every tensor at a new address
    ref = copy.deepcopy(cache)
    want = forward(x, ref)["logits"]
    got = g(x, moved)["logits"]
    assert torch.allclose(got, want, atol=1e-6)
    assert all(torch.equal(a.keys, b.keys) and torch.equal(a.length, b.length)
               for a, b in zip(moved.layers, ref.layers))
    for _ in range(3):
        g(x, moved)
    (key,) = g.stats()["keys"]
    assert key["captures"] == 2, key  # one recapture for the six tensors that moved together, not six
    assert key["reason"] == "recaptured: argument 'cache'.layers[0].length moved", key
    assert g(x, moved)["cache"] is moved  # its buffers are graphjit's now: the caller's object all the same


class Window:
    """A layer with a tensor the step only reads (Gemma's sliding-window length once the window is full): the graph
    reads a copy of it in its own buffer."""

    def __init__(self, size: int) -> None:
        self.keys = torch.zeros(size, 4)
        self.start = torch.tensor(2)


def _windowed(dim: int = 4):
    w = torch.randn(dim, dim, generator=torch.Generator().manual_seed(3))

    def forward(x, cache):
        layer = cache.layers[0]
        layer.keys.copy_(layer.keys.roll(-1, 0))
        layer.keys[-1] = (x @ w)[0]
        return {"logits": layer.keys.sum(0) * layer.start, "cache": cache}

    return forward


def _window_cache() -> Cache:
    cache = Cache(0, 0)
    cache.layers = [Window(6)]
    return cache


def test_a_returned_cache_with_a_tensor_copied_in_is_the_callers_own_object(emu):
    """An output object that is an argument comes back as the caller's object even where the graph reads one of
    its tensors from graphjit's buffer (copied in, not adopted): before, the replay handed back a copy of the
    layer holding a copy of that tensor (and a count the replay advanced on the caller's layer, not on the copy)."""
    forward = _windowed()
    g = graphjit.graphed(forward)
    x = torch.randn(1, 4, generator=torch.Generator().manual_seed(4))
    want, mine = _window_cache(), _window_cache()
    for i in range(8):
        ref = forward(x * i, want)
        out = g(x * i, mine)
        assert out["cache"] is mine and out["cache"].layers[0] is mine.layers[0], i
        assert torch.equal(out["logits"], ref["logits"]) and torch.equal(mine.layers[0].keys, want.layers[0].keys)
    (key,) = g.stats()["keys"]
    assert key["state"] == "replay" and key["replays"] >= 5, g.report()


def test_another_cache_object_of_the_same_layout_comes_back_as_itself(emu):
    """Two caches of one layout whose tensors the graph copies in (they alternate, so none is adopted): each call
    gets back the cache it passed, never the one the key was captured with."""

    def forward(x, cache):
        return {"logits": x * cache.layers[0].start, "cache": cache}

    g = graphjit.graphed(forward)
    caches = [_window_cache(), _window_cache()]
    caches[1].layers[0].start.fill_(5)
    x = torch.ones(2)
    for i in range(8):
        c = caches[i % 2]
        out = g(x, c)
        assert out["cache"] is c and torch.equal(out["logits"], x * c.layers[0].start), i
    assert g.stats()["graphs"] == 1


def test_a_returned_cache_comes_back_as_itself_beside_dynamic_arguments_holding_tensors(emu):
    """``dynamic=`` arguments are not among the graph's inputs: the places of the other arguments' objects are counted
    without them (before, their tensors shifted every later argument's place: an IndexError at the capture, or the
    cache handed back as a copy)."""

    def step(x, meta, cache, y):
        cache.layers[0].keys.add_(x + y)
        return x * 2, cache

    g = graphjit.graphed(step, dynamic=("meta",))
    cache = Cache(0, 0)
    cache.layers = [Window(2)]
    for i in range(6):
        out = g(torch.ones(4), [torch.tensor([i, 1])], cache, torch.ones(4))
        assert out[1] is cache and torch.equal(cache.layers[0].keys, torch.full((2, 4), 2.0 * (i + 1))), i
    assert g.stats()["replays"] >= 3, g.report()


@pytest.mark.parametrize("outputs", ["copy", "alias"])
def test_a_tensor_returned_twice_comes_back_as_one_tensor_twice(emu, outputs):
    """``return h, {"last": h}``: eager returns one tensor at both places (a model's last hidden state is also the last
    of its hidden states), so writing one writes the other.  Before, copied outputs came back as two copies."""
    w = torch.randn(4, 4, generator=torch.Generator().manual_seed(0))

    def step(x):
        h = x @ w
        return h, {"last": h, "sum": h.sum()}

    g = graphjit.graphed(step, outputs=outputs)
    for i in range(5):
        x = torch.full((2, 4), float(i))
        with torch.no_grad():
            h, rest = g(x)
        assert rest["last"] is h and torch.equal(h, x @ w), (i, g.report())
        assert torch.equal(rest["sum"], (x @ w).sum())
    assert g.stats()["replays"] >= 2, g.report()


def test_an_output_that_is_a_view_of_an_input_is_that_view_of_the_callers_tensor(emu):
    """``return x[0]`` gives a view of the caller's ``x`` in eager: writing through it writes ``x``.  Every replay
    gives the same view of the call's own tensor (before: a copy), beside fresh outputs; a call whose tensor has
    another layout than the graph's buffer gets a copy of the right values."""
    g = graphjit.graphed(lambda x: (x[1], x.t(), x * 2))
    for v in range(5):
        x = torch.arange(6.0).reshape(2, 3) + v
        row, t, double = g(x)
        assert row._base is x and t._base is x and torch.equal(row, x[1]) and torch.equal(t, x.t())
        assert torch.equal(double, x * 2) and double.data_ptr() != x.data_ptr()
        row.add_(100)
        assert x[1, 0] == 103 + v  # written through, as eager's view writes x
    assert g.stats()["replays"] >= 2
    other = torch.arange(6.0).reshape(3, 2).t()  # same shape, another layout: the graph's buffer gets a copy
    row, t, _ = g(other)
    assert torch.equal(row, other[1]) and torch.equal(t, other.t())


def test_a_view_of_an_input_the_function_writes_shows_the_write(emu):
    def bump(x):
        x.add_(1)
        return x[0]

    g = graphjit.graphed(bump)
    for v in range(5):
        x = torch.full((2, 3), float(v))
        row = g(x)
        assert row._base is x and torch.equal(x, torch.full((2, 3), v + 1.0)) and torch.equal(row, x[0])
    assert g.stats()["replays"] >= 2


def test_only_an_output_inside_an_inputs_own_elements_is_a_view_of_it():
    """An output in an input buffer's storage but outside its extent (another slice of the tensor it was cut from) is
    no view of that input: a later call's tensor at that offset would be other memory."""
    import types

    from graphjit.backends.torch.graphs import TorchBackend
    from graphjit.buffers import StaticOutputs

    big = torch.arange(12.0).reshape(4, 3)
    x = big[:2]

    def views(out):
        return StaticOutputs(TorchBackend(), out, lambda t: isinstance(t, torch.Tensor), set(),
                             types.SimpleNamespace(statics=[x])).views  # type: ignore[arg-type]

    assert views([big[3]]) == [] and views([big[2:]]) == []
    assert views([x[1]]) == [(0, 0, 3, (3, 1))] and views([x.t()]) == [(0, 0, 0, (3, 1))]


def test_a_view_of_the_inputs_storage_outside_the_input_comes_back_right(emu):
    """``x`` a slice of a closed-over tensor, the output another slice of it: in ``x``'s storage but none of its
    elements.  It comes back as a copy of the right values, never as a view of the caller's tensor at that offset."""
    big = torch.arange(12.0).reshape(4, 3)
    g = graphjit.graphed(lambda x: (big[2:] * 1, big[3], x * 2))
    x = big[:2]
    for _ in range(5):
        before = g.stats()["replays"]
        _scaled, row, double = g(x)
        assert torch.equal(row, big[3]) and torch.equal(double, x * 2)
        if g.stats()["replays"] > before:  # a replay (the warmup calls are eager: big's own row)
            assert row._base is not x and row.data_ptr() != big[3].data_ptr()
    assert g.stats()["replays"] >= 2
