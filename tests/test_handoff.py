"""A replay that hands the graph its call's tensors (graphjit/handoff.py), on the CPU emulator.

The emulator's feed nodes (tests/graph_emulator.py, ``EmulatedFeed``) copy the table's entries byte for byte with
``memmove`` before and after replaying the recorded ops, as the GPU's nodes copy before and after the graph's other
nodes: a wrong pointer, size or entry count gives wrong outputs here.  The GPU tests (tests/test_gpu_handoff.py)
run the real nodes."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from only_key import only_entry, only_key  # noqa: E402

import graphjit  # noqa: E402
from graphjit.handoff import NOT_SERVED  # noqa: E402

pytestmark = pytest.mark.torch


def _step(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    h = a @ b + c
    return h * 0.5, (h.sum(0) - a[0]).to(torch.float64)


def _inputs(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(5, 7, generator=g), torch.randn(7, 7, generator=g), torch.randn(5, 7, generator=g)


def _equal(got: Any, want: Any) -> bool:
    return all(torch.equal(o, w) for o, w in zip(got, want))


def test_fresh_inputs_each_call_are_copied_in_and_out_by_the_graph(emu):
    g = graphjit.graphed(_step)
    outs = []
    for seed in range(8):
        args = _inputs(seed)
        out = g(*args)
        assert _equal(out, _step(*args))
        outs.append(out)
    assert all(_equal(o, _step(*_inputs(s))) for s, o in enumerate(outs))  # later replays left earlier outputs alone
    entry = only_entry(g)
    key = only_key(g)
    # every replay but the capturing call's (its verify replays by copies) went through the feed nodes
    assert entry.handoff is not None and entry.graph.feed.launches == key["fed_replays"] == key["replays"] - 1 >= 4
    assert key["input_copies"] >= 3 * key["fed_replays"]
    assert key["feed"] == "library"


def test_static_inputs_and_alias_outputs_copy_nothing(emu):
    g = graphjit.graphed(_step, outputs="alias")
    args = _inputs(0)
    for _ in range(3):
        g(*args)
    static, _ = g.static_inputs(*args)
    before = only_key(g)["input_copies"]
    for seed in range(1, 5):
        for s, x in zip(static, _inputs(seed)):
            s.copy_(x)
        out = g(*static)
        assert _equal(out, _step(*_inputs(seed)))
        assert out[0] is only_entry(g).outputs.tensors[0]  # the static output itself
    key = only_key(g)
    assert key["input_copies"] == before and key["fed_replays"] >= 4


def test_a_call_it_cannot_serve_goes_the_copy_path_and_the_next_is_fed_again(emu):
    def f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a @ b + 1

    g = graphjit.graphed(f)
    a, b = torch.randn(6, 6), torch.randn(6, 6)
    for _ in range(3):
        g(a, b)
    fed = only_key(g)["fed_replays"]
    at = torch._neg_view(a)  # the same key, but its bytes are not its values (a lazy negation)
    assert torch.equal(g(at, b), f(at, b))
    assert only_key(g)["fed_replays"] == fed
    c = torch.randn(6, 6)
    assert torch.equal(g(c, b), f(c, b))
    assert only_key(g)["fed_replays"] == fed + 1


def test_swapped_static_inputs_are_read_before_they_are_written(emu):
    def f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a - 2 * b

    g = graphjit.graphed(f)
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    for _ in range(3):
        g(a, b)
    (sa, sb), _ = g.static_inputs(a, b)
    sa.copy_(a)
    sb.copy_(b)
    want = f(b.clone(), a.clone())
    assert torch.equal(g(sb, sa), want)  # each buffer passed as the other: the copy path clones one first


def test_an_adopted_input_that_moves_is_captured_again_and_stays_right(emu):
    def f(cache: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        cache.add_(x)
        return cache * 2

    g = graphjit.graphed(f)
    cache, ref = torch.zeros(3, 5), torch.zeros(3, 5)
    for seed in range(4):
        x = torch.randn(3, 5, generator=torch.Generator().manual_seed(seed))
        assert torch.equal(g(cache, x), f(ref, x))
        assert torch.equal(cache, ref)
    moved, ref2 = cache.clone(), ref.clone()
    for seed in range(4, 8):
        x = torch.randn(3, 5, generator=torch.Generator().manual_seed(seed))
        assert torch.equal(g(moved, x), f(ref2, x))
        assert torch.equal(moved, ref2)  # copied back to the caller's tensor after each replay
    st = g.stats()
    assert st["fallbacks"] == {} and st["captures"] >= 2


def test_one_tensor_passed_twice_then_two_tensors(emu):
    def f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a * b + a

    g = graphjit.graphed(f)
    x = torch.randn(4, 4)
    for _ in range(3):
        assert torch.equal(g(x, x), f(x, x))
    y, z = torch.randn(4, 4), torch.randn(4, 4)
    assert torch.equal(g(y, z), f(y, z))
    assert torch.equal(g(y, y), f(y, y))


def test_a_returned_module_buffer_comes_out_with_its_current_values(emu):
    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("b", torch.ones(3))

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return x + 1, self.b

    m = M()
    g = graphjit.graphed(m)
    for _ in range(3):
        g(torch.randn(3))
    m.b.fill_(7.0)
    out, b = g(torch.zeros(3))
    assert torch.equal(out, torch.ones(3)) and torch.equal(b, torch.full((3,), 7.0))
    assert b is m.b  # the buffer itself, as eager returns it


def test_a_library_that_refuses_leaves_the_key_to_the_copy_path(emu, monkeypatch):
    from graph_emulator import EmulatedFeed

    g = graphjit.graphed(_step)
    for seed in range(3):
        g(*_inputs(seed))
    feed = only_entry(g).graph.feed
    monkeypatch.setattr(EmulatedFeed, "launch", lambda self, n_in, n_out: 2)  # a CUDA error
    for seed in range(3, 6):
        assert _equal(g(*_inputs(seed)), _step(*_inputs(seed)))
    assert only_entry(g).handoff is None  # given up for this key after the first refusal
    assert isinstance(feed, EmulatedFeed)


def test_a_pending_error_of_earlier_work_leaves_only_that_call_to_the_copy_path(emu, monkeypatch):
    from graph_emulator import EmulatedFeed

    from graphjit.handoff import STATUS_PENDING_ERROR

    g = graphjit.graphed(_step)
    for seed in range(3):
        g(*_inputs(seed))
    real = EmulatedFeed.launch
    monkeypatch.setattr(EmulatedFeed, "launch", lambda self, n_in, n_out: STATUS_PENDING_ERROR)
    assert _equal(g(*_inputs(3)), _step(*_inputs(3)))
    monkeypatch.setattr(EmulatedFeed, "launch", real)
    fed = only_key(g)["fed_replays"]
    assert _equal(g(*_inputs(4)), _step(*_inputs(4)))
    assert only_entry(g).handoff is not None and only_key(g)["fed_replays"] == fed + 1


def test_handoff_replay_says_not_served_before_launching_anything(emu):
    g = graphjit.graphed(_step)
    for seed in range(3):
        g(*_inputs(seed))
    entry = only_entry(g)
    launches = entry.graph.feed.launches
    a, b, c = _inputs(5)
    assert _equal(entry.handoff.replay([a, b, c], True, ((a, b, c), {})), _step(a, b, c))
    assert entry.graph.feed.launches == launches + 1
    wide = torch.randn(5, 14)[:, ::2]  # the key's shape, not dense
    assert entry.handoff.replay([wide, b, c], True, ((wide, b, c), {})) is NOT_SERVED
    assert entry.handoff.replay([a, b, entry.inputs.statics[0]], True, None) is NOT_SERVED  # inside another buffer
    assert entry.graph.feed.launches == launches + 1


@pytest.mark.parametrize("feeds", [True, False])
def test_same_results_with_and_without_feed_nodes(emu, monkeypatch, feeds):
    monkeypatch.setattr(type(emu), "feeds", feeds)

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)
            self.norm = torch.nn.LayerNorm(8)
            self.register_buffer("steps", torch.zeros((), dtype=torch.int64))

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
            self.steps.add_(1)
            h = self.norm(self.lin(x) + y)
            return {"h": h, "s": h.sum(-1), "steps": self.steps}

    torch.manual_seed(0)
    m = Block()
    ref = Block()
    ref.load_state_dict(m.state_dict())
    g = graphjit.graphed(m)
    for seed in range(8):
        gen = torch.Generator().manual_seed(seed)
        x, y = torch.randn(2, 8, generator=gen), torch.randn(2, 8, generator=gen)
        with torch.no_grad():
            got, want = g(x, y), ref(x, y)
        assert all(torch.equal(got[k], want[k]) for k in want)
    assert torch.equal(m.steps, ref.steps)
    key = only_key(g)
    assert (key["fed_replays"] == key["replays"] - 1) if feeds else key["fed_replays"] == 0


def test_a_lazily_negated_view_is_copied_by_its_values(emu):
    def f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a * 2 + b

    g = graphjit.graphed(f)
    b = torch.randn(4, 4)
    for _ in range(3):
        g(torch.randn(4, 4), b)
    z = torch.randn(4, 4, dtype=torch.complex64)
    neg = z.conj().imag  # a real view whose bytes hold the values' negation (strided: a key of its own)
    assert neg.is_neg()
    fed = sum(k["fed_replays"] for k in g.stats()["keys"])
    for _ in range(4):
        assert torch.equal(g(neg, b), f(neg, b))
    dense_neg = torch._neg_view(torch.randn(4, 4))
    assert dense_neg.is_neg() and dense_neg.is_contiguous()
    assert torch.equal(g(dense_neg, b), f(dense_neg, b))
    assert sum(k["fed_replays"] for k in g.stats()["keys"]) == fed  # each went the copy path


def test_a_fed_graph_handle_is_freed_as_soon_as_it_is_dropped():
    """No reference cycle through the replay the feed installs: a dropped graph gives its memory pool back at once,
    not at the next cyclic collection (tests/test_gpu_torch.py checks the pool itself)."""
    import gc
    import weakref

    from graphjit.backends.torch import feed as feed_mod
    from graphjit.backends.torch.graphs import TorchGraph

    class Graph:
        def instantiate(self) -> None:
            pass

        def raw_cuda_graph_exec(self) -> int:
            return 1

        def replay(self) -> None:
            pass

        def reset(self) -> None:
            pass

    class Lib:
        def feed_layout(self) -> tuple[int, int, int]:
            return 8 + 6 * 64, 64, 8

        def feed_launch(self, table: int, stream: int) -> int:
            return 0

    graph = Graph()
    handle = TorchGraph(graph, 0)
    feed_mod.attach(handle, graph, Lib(), 1, 2, 0)
    assert handle.feed is not None and handle.replay == handle.feed.replay_by_torch
    gone = weakref.ref(handle)
    was = gc.isenabled()
    gc.disable()
    try:
        del handle
        assert gone() is None
    finally:
        if was:
            gc.enable()


def test_a_size_one_dim_with_another_stride_is_still_fed(emu):
    def f(ids: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return ids * w

    g = graphjit.graphed(f)
    w = torch.randn(1, 8)
    for _ in range(3):
        g(torch.randn(1, 8), w)
    fed = only_key(g)["fed_replays"]
    wide = torch.randn(3, 16)
    last = wide[1:2, 8:]  # shape (1, 8), strides (16, 1): dense all the same
    assert last.stride() != (8, 1)
    assert torch.equal(g(last, w), f(last, w))
    assert only_key(g)["fed_replays"] == fed + 1


class _Graph:
    """A stand-in of torch's CUDAGraph for the feed's bookkeeping (no GPU here)."""

    def __init__(self) -> None:
        self.instantiated = 0
        self.replays = 0
        self.was_reset = False

    def instantiate(self) -> None:
        self.instantiated += 1

    def raw_cuda_graph_exec(self) -> int:
        return 100 + self.instantiated

    def replay(self) -> None:
        self.replays += 1

    def reset(self) -> None:
        self.was_reset = True


class _Lib:
    def __init__(self, status: int = 0) -> None:
        self.status = status
        self.calls = 0

    def feed_layout(self) -> tuple[int, int, int]:
        return 8 + 12 * 64 + 2, 64, 8

    def feed_launch(self, table: int, stream: int) -> int:
        self.calls += 1
        return self.status

    def last_error(self) -> str:
        return "the stand-in refused"


def _fed_handle(lib: Any) -> tuple[Any, Any]:
    from graphjit.backends.torch import feed as feed_mod
    from graphjit.backends.torch.graphs import TorchGraph

    graph = _Graph()
    handle = TorchGraph(graph, 0)
    feed_mod.attach(handle, graph, lib, 1, 2, 0)
    handle.feed.stream = lambda: 0
    handle.feed.random = False
    return handle, graph


def test_a_reset_graph_no_longer_hands_its_table_to_the_library():
    handle, graph = _fed_handle(_Lib())
    feed = handle.feed
    feed.table[feed.dirty_word] = 1  # the nodes may hold a call's pointers
    assert feed.dirty
    handle.reset()
    assert handle.feed is None and feed.table[0] == 0 and not feed.dirty and graph.was_reset
    handle.replay()  # torch's own replay now (a real one raises its own error on a reset graph)
    assert graph.replays == 1


def test_a_refused_launch_leaves_the_nodes_counted_as_holding_a_calls_pointers():
    lib = _Lib()
    handle, graph = _fed_handle(lib)
    feed = handle.feed
    assert feed.launch(2, 1) == 0 and feed.dirty
    lib.status = 6  # a CUDA error of earlier work pending: the library refuses before setting anything
    assert feed.launch(0, 0) == 6 and feed.dirty  # the nodes still hold the first call's pointers
    lib.status = 0
    handle.replay()  # so torch's replay clears them first
    assert not feed.dirty and lib.calls == 3 and graph.replays == 1


def test_nodes_that_cannot_be_cleared_are_instantiated_again():
    lib = _Lib()
    handle, graph = _fed_handle(lib)
    feed = handle.feed
    assert feed.launch(2, 1) == 0 and feed.dirty
    start = feed.header + 6 * feed.entries
    feed.table[start] = 3  # what the library remembers of the nodes' last settings
    lib.status = 2  # the library cannot set them now
    handle.replay()
    assert graph.instantiated == 2 and feed.table[0] == 102 and not feed.dirty
    assert feed.table[start] == 0 and graph.replays == 1


def test_an_empty_input_is_served_and_a_null_address_never_is(emu):
    def f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a.sum() + b

    g = graphjit.graphed(f)
    b = torch.randn(3)
    for _ in range(3):
        g(torch.randn(0, 4), b)
    entry = only_entry(g)
    z = torch.zeros(0, 4)
    assert torch.equal(g(z, b), f(z, b))
    for _ in range(2):  # its address (null or not) is looked at each time it is new, never taken on trust
        assert entry.handoff.seen[0] != 0
