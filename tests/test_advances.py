"""Scalars a call advances inside the objects it is passed (graphjit/advances.py): a key whose call changes only
such scalars, the same way on every call, is captured, and each replay sets them as the call's Python code would;
everything else that changes a key runs uncaptured with its reason.  On the CPU through tests/graph_emulator.py,
which freezes what a capture read: a replay that did not advance the counter would give other results than eager."""

from __future__ import annotations

import collections
import contextlib
import dataclasses

import pytest

torch = pytest.importorskip("torch")

from unseen import Unseen  # noqa: E402

import graphjit  # noqa: E402
from graphjit.key_changes import ADVANCES_DIFFER, CHANGES_ITS_KEY  # noqa: E402

pytestmark = pytest.mark.torch


class Layer:
    def __init__(self) -> None:
        self.buf = torch.zeros(8)
        self.n = 0
        self.full = False
        self.scale = 1.0


class Cache:
    """Layers in a list and a dict of flags, as transformers' caches hold them."""

    def __init__(self, layers: int = 2) -> None:
        self.layers = [Layer() for _ in range(layers)]
        self.seen = {i: False for i in range(layers)}

    def reset(self) -> None:
        for i, layer in enumerate(self.layers):
            layer.buf.zero_()
            layer.n, layer.full, layer.scale = 0, False, 1.0
            self.seen[i] = False


def step(x, cache):
    """Every layer advances its int, may flip its bool, scales a float; the flags dict is set."""
    out = []
    for i, layer in enumerate(cache.layers):
        layer.buf[layer.n] = x.sum() * layer.scale
        layer.n += 1
        layer.full = layer.n >= 3
        layer.scale *= 0.5
        cache.seen[i] = True
        out.append(layer.buf * (2.0 if layer.full else 1.0))
    return torch.stack(out)


def _loops(fn, loops=4, steps=4, layers=2):
    cache, outs, counts = Cache(layers), [], []
    for _ in range(loops):
        cache.reset()
        for k in range(steps):
            outs.append(fn(torch.full((3,), float(k + 1)), cache).clone())
            counts.append((tuple((la.n, la.full, la.scale) for la in cache.layers), dict(cache.seen)))
    return outs, counts


def test_ints_bools_floats_and_dict_items_are_advanced_by_each_replay(emu):
    want, want_counts = _loops(step)
    g = graphjit.graphed(step, warmup=1)
    got, counts = _loops(g)
    assert all(torch.equal(a, b) for a, b in zip(got, want)), (got, want)
    assert counts == want_counts  # after every call, the Python state eager left
    s = g.stats()
    assert s["graphs"] == 4 and s["fallbacks"] == {} and s["replays"] == 12, g.report()
    first = s["keys"][0]["advances"]
    assert "argument 'cache'.layers[0].n" in first and "argument 'cache'.seen[1]" in first, first
    assert "argument 'cache'.layers[1].scale" in first and "argument 'cache'.layers[0].full" not in first, first
    assert "argument 'cache'.layers[0].full" in s["keys"][2]["advances"], s["keys"][2]  # only what the call changes


def test_a_counter_in_a_tuple_cannot_be_set_and_runs_uncaptured(emu):
    class Holder:
        def __init__(self) -> None:
            self.t = (0,)
            self.buf = torch.zeros(8)

    def f(x, h):
        h.buf[h.t[0]] = x.sum()
        h.t = (h.t[0] + 1,)
        return h.buf * 1

    g = graphjit.graphed(f, warmup=1)
    h, he = Holder(), Holder()
    for _ in range(3):
        h.t, he.t = (0,), (0,)
        for _ in range(3):
            assert torch.equal(g(torch.ones(2), h), f(torch.ones(2), he))
    s = g.stats()
    assert s["graphs"] == 0 and s["fallbacks"] == {f"{CHANGES_ITS_KEY}: argument 'h'.t[0]": 9}, s


def test_a_value_that_appears_is_not_an_advance(emu):
    class Lazy:
        def __init__(self) -> None:
            self.n = None

    def f(x, o):
        o.n = 1 if o.n is None else o.n
        return x + 1

    g = graphjit.graphed(f, warmup=1)
    for _ in range(3):
        o = Lazy()
        g(torch.ones(2), o)
        assert o.n == 1
    (first, *_rest) = g.stats()["keys"]
    assert first["state"] == "fallback" and first["reason"] == f"{CHANGES_ITS_KEY}: argument 'o'.n", first


def test_a_counter_advanced_by_another_amount_on_another_call_runs_uncaptured(emu):
    strides = Unseen(1)  # (an iterator the function advances is a reason of its own)

    def f(x, layer):
        layer.buf[layer.n % 8] = x.sum()
        layer.n += next(strides)
        return layer.buf * 1

    g = graphjit.graphed(f, warmup=2)
    layer = Layer()
    for _ in range(3):
        layer.n = 0
        g(torch.ones(2), layer)
        assert layer.n > 0
    s = g.stats()
    (key,) = [k for k in s["keys"] if "n=0" in k["key"] or len(s["keys"]) == 1]
    assert s["graphs"] == 0 and key["state"] == "fallback", s
    assert key["reason"] == f"{ADVANCES_DIFFER}: argument 'layer'.n", key
    assert "an earlier run of the key left 1, this one 2" in key["detail"], key["detail"]


def test_inside_a_capture_scope_a_key_that_advances_is_watched_and_captured_after_it(emu):
    """A scope captures a key on its first call after extra warmup runs that start where the call left the state:
    for a key whose call advances its own scalars that would be another key's run, so such a key is only watched
    there (its call counts as a warmup) and is captured on a later call outside the scope; the scope's summary says
    so (before, it said "nothing captured" and nothing more)."""
    want, want_counts = _loops(step, loops=3)
    g = graphjit.graphed(step, warmup=2)
    cache, got, counts = Cache(), [], []
    scope = graphjit.capture_scope(progress=False)
    for loop in range(3):
        cache.reset()
        with scope if loop == 0 else contextlib.nullcontext():
            for k in range(4):
                got.append(g(torch.full((3,), float(k + 1)), cache).clone())
                counts.append((tuple((la.n, la.full, la.scale) for la in cache.layers), dict(cache.seen)))
    assert all(torch.equal(a, b) for a, b in zip(got, want)) and counts == want_counts
    s = g.stats()
    assert s["graphs"] == 4 and s["captures"] == 4 and s["fallbacks"] == {}, g.report()
    assert all(k["warmups"] == 2 for k in s["keys"]), s["keys"]
    where = "argument 'cache'.layers[0].n and more"
    assert scope.stats()["deferred"] == {where: 4} and scope.stats()["captures"] == 0, str(scope.stats())
    assert scope.summary().startswith(f"nothing captured; 4 call(s) only warmed up their key: each advances {where} "
                                      "of its own key, so it is captured on a later call"), scope.summary()


def test_a_replay_sets_the_counter_in_the_objects_of_this_call(emu):
    """The key holds values, not objects: another cache with the same values replays the graph, and its own counter
    advances (the graph's tensor inputs are that call's, copied in)."""
    want, _ = _loops(step, loops=1)
    g = graphjit.graphed(step, warmup=1)
    _loops(g, loops=2)  # captured
    other = Cache()
    got = [g(torch.full((3,), float(k + 1)), other).clone() for k in range(4)]
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert [la.n for la in other.layers] == [4, 4] and other.seen == {0: True, 1: True}
    assert g.stats()["replays"] == 4 + 4


@pytest.mark.parametrize("warmup", [1, 2])
def test_a_call_that_replaces_the_object_holding_the_counter_runs_uncaptured(emu, warmup):
    """``holder.state = State(n + 1)``: the key's scalar moves, but in a new object; a replay would set it in the old
    one (which a caller may still hold), so the key is refused by its second watched run (warmup=2) or by its
    capturing call (warmup=1), whose own result is still right; the loops end as eager's do."""

    class State:
        def __init__(self, n: int) -> None:
            self.n = n

    class Holder:
        def __init__(self) -> None:
            self.buf = torch.zeros(8)
            self.state = State(0)

    def f(x, h):
        h.buf[h.state.n] = x.sum()
        h.state = State(h.state.n + 1)
        return h.buf * 1

    def loops(fn):
        h, outs, kept = Holder(), [], []
        for _ in range(3):
            h.buf.zero_()
            h.state = State(0)
            for _ in range(3):
                kept.append(h.state)
                outs.append(fn(torch.ones(2), h).clone())
        return outs, [s.n for s in kept], h.state.n

    want = loops(f)
    g = graphjit.graphed(f, warmup=warmup)
    got = loops(g)
    assert all(torch.equal(a, b) for a, b in zip(got[0], want[0])) and got[1:] == want[1:], (got, want)
    s = g.stats()
    assert s["graphs"] == 0, g.report()
    reasons = {k["reason"] for k in s["keys"]}
    assert reasons == {f"{ADVANCES_DIFFER}: argument 'h'.state.n"}, s["keys"]
    assert "replaced an object on the path" in s["keys"][0]["detail"], s["keys"][0]


class _Counted:
    def __init__(self) -> None:
        self.buf = torch.zeros(8)
        self.n = 0


def _advance_each(x, cache):
    for layer in cache.layers:
        layer.buf[layer.n] = x.sum()
        layer.n += 1
    return x * 2


def test_a_call_whose_counters_share_an_object_otherwise_than_at_capture_runs_uncaptured(emu):
    """Two layers that are one object advance it twice, eagerly; the graph of two distinct layers must not replay for
    them (nor the reverse): such a call runs uncaptured, counted under its reason, with eager's counts."""
    from graphjit.advances import LAYOUT

    class Cache:
        def __init__(self, layers) -> None:
            self.layers = layers

    def counts(fn, shared):
        out = []
        for _ in range(3):
            one = _Counted()
            c = Cache([one, one] if shared else [_Counted(), _Counted()])
            fn(torch.ones(3), c)
            out.append([la.n for la in c.layers])
        return out

    g = graphjit.graphed(_advance_each, warmup=1)
    assert counts(g, False) == counts(_advance_each, False) == [[1, 1]] * 3
    assert counts(g, True) == counts(_advance_each, True) == [[2, 2]] * 3
    s = g.stats()
    assert s["graphs"] == 1 and s["fallbacks"] == {LAYOUT: 3}, g.report()


@pytest.mark.parametrize("case", ["island", "deque", "type"])
def test_changes_a_replay_could_not_redo_keep_the_key_uncaptured(emu, case):
    """An island between segments would read the counter before the replay's end sets it; a deque is not among the
    containers graphjit puts back around its own runs; a value whose type changes with its text unchanged (a str
    subclass) is more than a scalar a replay can set.  Each key runs uncaptured, and the loops end as eager's."""

    class Tag(str):
        pass

    @graphjit.eager
    def island(y, c):
        return y + c.n

    def step(x, c):
        if case == "deque":
            c.buf[c.pos[0]] = x.sum()
            c.pos[0] += 1
            return c.buf * 1
        c.n += 1
        if case == "island":
            return island(x * 2, c)
        c.tag = Tag(c.tag)
        return x * c.n

    def run(fn):
        c, out = _Counted(), []
        c.pos, c.tag = collections.deque([0]), "plain"
        for _ in range(3):
            c.buf.zero_()
            c.n, c.pos[0], c.tag = 0, 0, "plain"
            for _ in range(2):
                out.append((fn(torch.ones(2), c).tolist(), c.n, c.pos[0], type(c.tag).__name__))
        return out

    g = graphjit.graphed(step, warmup=1)
    assert run(g) == run(step)
    first = g.stats()["keys"][0]
    assert first["state"] == "fallback" and first["reason"].startswith(CHANGES_ITS_KEY), first


def test_a_frozen_slotted_dataclass_field_is_set_as_the_call_set_it(emu):
    @dataclasses.dataclass(frozen=True, slots=True)
    class Pos:
        n: int

    def step(x, c):
        c.buf[c.pos.n] = x.sum()
        object.__setattr__(c.pos, "n", c.pos.n + 1)
        return c.buf * 1

    def run(fn):
        c, out = _Counted(), []
        c.pos = Pos(0)
        for _ in range(3):
            c.buf.zero_()
            object.__setattr__(c.pos, "n", 0)
            for _ in range(2):
                out.append((fn(torch.ones(2), c).tolist(), c.pos.n))
        return out

    g = graphjit.graphed(step, warmup=1)
    assert run(g) == run(step)
    assert g.stats()["replays"] == 4 and g.stats()["fallbacks"] == {}, g.report()


SCALE = 1.0


def test_a_key_made_for_other_read_values_advances_too(emu):
    """A graph for another value of a global the function reads (a variant key, checked by its guards) is a key whose
    call advances its counter like any other."""
    global SCALE

    def step(x, c):
        c.buf[c.n] = x.sum() * SCALE
        c.n += 1
        return c.buf * 1

    def run(fn):
        global SCALE
        c, out = _Counted(), []
        for loop in range(6):
            SCALE = 1.0 if loop < 3 else 2.0
            c.buf.zero_()
            c.n = 0
            for _ in range(2):
                out.append((fn(torch.ones(2), c).tolist(), c.n))
        return out

    try:
        g = graphjit.graphed(step, warmup=1)
        assert run(g) == run(step)
    finally:
        SCALE = 1.0
    s = g.stats()
    assert s["graphs"] == 4 and s["fallbacks"] == {}, g.report()
