"""The replay lane serving walked calls: keyword arguments and containers (a Hugging Face ``forward(**inputs)`` with
its cache object), signed in C by the signer's walk check (csrc/lane.c's plan with a WalkCheck), on the CPU emulator.

As in test_lane.py the Python path is the reference: each sequence of calls runs with ``GRAPHJIT_LANE=off`` and on,
and must give the same outputs and stats; the lane must have served the repeated calls (the Python path's
``Handoff.replay`` calls counted), and every call that differs from the planned one (another keyword, another value,
another attribute, another layout) must take the Python path and still be right."""

from __future__ import annotations

import functools
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import graph_emulator  # noqa: E402,F401  (the emulator the emu fixture installs)
from test_lane import _both, _in_threads, _same  # noqa: E402

import graphjit  # noqa: E402

pytestmark = pytest.mark.torch


class Cache:
    """A cache object as transformers passes one: tensors the step writes in place, and a Python flag it reads."""

    def __init__(self, rows: int) -> None:
        self.keys = torch.zeros(rows, 7)
        self.bias = torch.ones(7)
        self.scaled = True


def _step(x: torch.Tensor, **kwargs: Any) -> dict[str, torch.Tensor]:
    cache: Cache = kwargs["cache"]
    h = x @ kwargs["w"] + cache.bias
    if cache.scaled:
        h = h * kwargs.get("scale", 1.0)
    cache.keys.add_(h)  # written in place: the caller's own tensor
    return {"logits": h.relu(), "total": cache.keys.sum(0)}


def _wraps(fn: Any) -> Any:
    """``fn`` behind a decorator's wrapper, as transformers' ``forward`` is: its calls are passed as written."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    return wrapper


def _xs(n: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return [torch.randn(4, 7, generator=g) for _ in range(n)]


@pytest.mark.parametrize("wrapped", [False, True], ids=["plain", "wraps"])
def test_keyword_calls_are_served_by_the_lane_as_by_the_python_path(emu, lane_on, monkeypatch, python_replays,
                                                                   wrapped):
    w = torch.randn(7, 7, generator=torch.Generator().manual_seed(1))

    def calls(g: Any) -> list[Any]:
        cache = Cache(4)
        outs = [g(x, cache=cache, w=w, scale=0.5) for x in _xs(14)]
        return [t for o in outs for t in (o["logits"], o["total"])] + [cache.keys.clone()]

    fn = _wraps(_step) if wrapped else _step
    before = python_replays[0]
    outs, off, on, g = _both(monkeypatch, lambda: graphjit.graphed(fn), calls)
    assert on == off
    cache = Cache(4)  # eager, for the reference
    want = [_step(x, cache=cache, w=w, scale=0.5) for x in _xs(14)]
    assert _same(outs[:-1], [t for o in want for t in (o["logits"], o["total"])])
    assert torch.equal(outs[-1], cache.keys)
    python_on = python_replays[0] - before - off["keys"][0]["fed_replays"]
    served = on["keys"][0]["fed_replays"] - python_on
    assert on["keys"][0]["replays"] >= 10 and served >= 6, (on["keys"][0], python_on)
    assert g._self_state.lane is not None


def test_a_walked_call_that_differs_from_the_plan_takes_the_python_path(emu, lane_on, monkeypatch, python_replays):
    """Another keyword, a missing one, another value of a Python scalar, another attribute of the cache object, another
    layout of a tensor, another cache object: each right, outputs and stats as with the lane off."""
    w = torch.randn(7, 7, generator=torch.Generator().manual_seed(1))

    def calls(g: Any) -> list[Any]:
        cache = Cache(4)
        xs = _xs(40)
        outs = []

        def run(n: int, **kw: Any) -> None:
            for _ in range(n):
                args = {"cache": cache, "w": w, "scale": 0.5, **kw}
                outs.append(g(xs.pop(), **{k: v for k, v in args.items() if v is not None}))

        run(6)
        run(1, scale=0.25)  # another value: another key
        run(3)
        run(1, extra=True)  # another keyword
        run(3)
        run(1, scale=None)  # a keyword left out
        run(3)
        cache.scaled = False  # an attribute the step reads: another key
        run(2)
        cache.scaled = True
        run(3)
        run(1, w=torch.randn(7, 7).t().contiguous().t())  # strides
        run(3)
        other = Cache(4)
        outs.append(g(xs.pop(), cache=other, w=w, scale=0.5))  # another cache object
        run(3)
        return [o["logits"].clone() for o in outs] + [cache.keys.clone(), other.keys.clone()]

    before = python_replays[0]
    _outs, off, on, _g = _both(monkeypatch, lambda: graphjit.graphed(_wraps(_step)), calls)
    assert on == off
    fed_off = sum(k["fed_replays"] for k in off["keys"])
    fed_on = sum(k["fed_replays"] for k in on["keys"])
    assert fed_on == fed_off >= 10
    assert python_replays[0] - before - fed_off < fed_on - 5  # the lane served some, the Python path the others


def test_a_cache_tensor_moved_by_the_caller_is_not_served_from_the_old_address(emu, lane_on, monkeypatch):
    """The cache's tensor rebound to new memory (as a cache reallocated between calls): the next call sees the new
    tensor's values and writes it, with the lane on as off."""
    w = torch.randn(7, 7, generator=torch.Generator().manual_seed(1))

    def calls(g: Any) -> list[Any]:
        cache = Cache(4)
        outs = [g(x, cache=cache, w=w) for x in _xs(8)]
        cache.keys = torch.full((4, 7), 2.0)
        outs += [g(x, cache=cache, w=w) for x in _xs(4)]
        return [o["total"].clone() for o in outs] + [cache.keys.clone()]

    outs, off, on, _g = _both(monkeypatch, lambda: graphjit.graphed(_wraps(_step)), calls)
    assert on == off
    cache = Cache(4)
    want = [_step(x, cache=cache, w=w)["total"].clone() for x in _xs(8)]
    cache.keys = torch.full((4, 7), 2.0)
    want += [_step(x, cache=cache, w=w)["total"].clone() for x in _xs(4)]
    assert _same(outs[:-1], want)


def test_a_key_the_signer_has_no_walk_check_for_is_never_planned(emu, lane_on):
    """A tensor passed under two keywords: no C walk check signs such a call (the walk tells them apart by identity),
    so its key gets no plan (``entry.lane`` False, not tried again at every call) and the Python path replays it."""
    from only_key import only_entry

    def step(x: torch.Tensor, **kw: Any) -> torch.Tensor:
        return x * 2 + kw["a"] - kw["b"]

    g = graphjit.graphed(step)
    t = torch.randn(4, 7)
    xs = _xs(8)
    outs = [g(x, a=t, b=t) for x in xs]
    assert all(torch.equal(o, x * 2 + t - t) for o, x in zip(outs, xs))
    assert only_entry(g).lane is False and g.stats()["replays"] >= 4


def test_a_key_whose_plan_is_never_ready_is_asked_a_bounded_number_of_times(emu, lane_on, monkeypatch):
    """A key ``lane.plan`` answers "not now" for (a key a counter's walk check signs: its key objects change from call
    to call) is not planned again at every replay: after ``PLAN_TRIES`` replays the Python path serves it for good,
    its results unchanged."""
    from only_key import only_entry

    from graphjit import lane

    asked = []
    monkeypatch.setattr(lane, "plan", lambda state, entry, sig: asked.append(1))
    w = torch.randn(7, 7, generator=torch.Generator().manual_seed(1))
    g = graphjit.graphed(_wraps(_step))
    cache = Cache(4)
    xs = _xs(30)
    outs = [g(x, cache=cache, w=w)["logits"] for x in xs]
    eager_cache = Cache(4)
    assert _same(outs, [_step(x, cache=eager_cache, w=w)["logits"] for x in xs])
    assert len(asked) == lane.PLAN_TRIES and only_entry(g).lane is False
    assert g.stats()["replays"] >= 20


def test_a_call_the_check_refuses_at_the_arming_replay_leaves_the_key_plannable(emu, lane_on, python_replays):
    """The replay that arms the lane signed by the Python walk (its tensor a ``Parameter`` over the same memory: the
    same key, a type the C check refuses) gets a key equal to the check's, another object: the key keeps its plan,
    and the later calls are served."""
    from only_key import only_entry

    w = torch.randn(7, 7, generator=torch.Generator().manual_seed(1))
    g = graphjit.graphed(_wraps(_step))
    cache = Cache(4)
    xs = _xs(40)
    for _ in range(20):
        g(xs.pop(), cache=cache, w=w, scale=0.5)
        if g._self_state.entries and only_entry(g).stats.fed_replays:
            break
    g(xs.pop(), cache=cache, w=torch.nn.Parameter(w, requires_grad=False), scale=0.5)  # arms the lane
    before = python_replays[0]
    for _ in range(10):
        g(xs.pop(), cache=cache, w=w, scale=0.5)
    assert only_entry(g).lane and python_replays[0] - before <= 1


def test_threads_making_keyword_calls_get_their_own_results(emu, lane_on):
    """Four threads calling one graphed function with keywords and a container (no state written): each gets its own
    call's outputs, served by the walked plan or the Python path, and every call is counted."""
    w = torch.randn(7, 7, generator=torch.Generator().manual_seed(1))

    def step(x: torch.Tensor, **kw: Any) -> torch.Tensor:
        return (x @ kw["parts"]["w"]) * kw["scale"] + kw["parts"]["b"]

    b = torch.randn(7)
    g = graphjit.graphed(_wraps(step))
    for x in _xs(8):
        g(x, parts={"w": w, "b": b}, scale=0.5)
    assert g._self_state.lane is not None
    errors: list[str] = []

    def worker(seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        for i in range(40):
            x = torch.randn(4, 7, generator=gen)
            if not torch.equal(g(x, parts={"w": w, "b": b}, scale=0.5), step(x, parts={"w": w, "b": b}, scale=0.5)):
                errors.append(f"thread {seed} call {i}")

    _in_threads(worker, 4)
    assert not errors
    assert g.stats()["calls"] == 8 + 160


def test_a_call_the_binder_reshapes_gets_no_plan(emu, lane_on, python_replays):
    """A plan checks the call as written; the Python path signs it bound (defaults applied, keywords of plain
    parameters in their places). A call the binder reshapes would never meet a plan of its bound form: no plan is
    made for it (none made and missed at every call), and it replays by the Python path, right."""
    from only_key import only_entry

    def step(x: torch.Tensor, w: torch.Tensor, scale: float = 0.5) -> torch.Tensor:
        return (x @ w) * scale

    w = torch.randn(7, 7, generator=torch.Generator().manual_seed(1))
    g = graphjit.graphed(step)
    xs = _xs(12)
    outs = [g(x, w=w) for x in xs]  # bound to (x, w, 0.5)
    assert _same(outs, [step(x, w) for x in xs])
    assert only_entry(g).lane is None and g.stats()["replays"] >= 8
