"""Piecewise capture on CPU: islands (``@graphjit.eager``) between captured segments, dynamic arguments,
and the reasons that point to a line, through the emulated CUDA graph of tests/graph_emulator.py (capture
records and writes nothing, replay redoes the tensor work and no Python).  The same on a GPU:
tests/test_gpu_islands.py."""

from __future__ import annotations

import dataclasses
import itertools
import logging

import pytest

torch = pytest.importorskip("torch")


import graphjit  # noqa: E402
from graphjit.islands import island_of  # noqa: E402
from graphjit.pieces import PiecewiseGraph  # noqa: E402

pytestmark = pytest.mark.torch


@dataclasses.dataclass
class Meta:
    """Per-call attention metadata: how many tokens each sequence has (a Python list: no graph can hold it)."""

    lens: list[int]


def _decoder(layers=8, dim=8, max_batch=8, max_len=64, seed=0):
    """A decode step of ``layers`` layers: projections graphed, attention an island that writes each sequence's
    key at its own length and attends over a length that differs per sequence and per call."""
    gen = torch.Generator().manual_seed(seed)
    ws = [torch.randn(dim, dim, generator=gen) / dim**0.5 for _ in range(layers)]
    caches = [torch.zeros(max_batch, max_len, dim) for _ in range(layers)]

    @graphjit.eager
    def attention(q, cache, meta):
        out = torch.zeros_like(q)
        for i, n in enumerate(meta.lens):
            cache[i, n] = q[i]
            k = cache[i, : n + 1]
            out[i] = torch.softmax(k @ q[i], 0) @ k
        return out

    def step(x, meta):
        h = x
        for w, cache in zip(ws, caches):
            q = torch.tanh(h @ w)
            h = h + attention(q, cache, meta)
        return h * 2

    return step, caches, attention


def _calls(n, dim=8, seed=1):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        b = [1, 3, 4, 6, 8][i % 5]
        lens = [int(v) for v in torch.randint(0, 60, (b,), generator=gen)]
        out.append((torch.randn(b, dim, generator=gen), Meta(lens)))
    return out


def test_decode_step_with_attention_islands_equals_eager_over_200_calls(emu):
    calls = _calls(200)
    ref_step, ref_caches, _ = _decoder()
    want = [ref_step(x, m) for x, m in calls]
    step, caches, attention = _decoder()
    g = graphjit.graphed(step, dynamic=("meta",), buckets={"x": {0: [2, 4, 8]}})
    got = [g(x, m) for x, m in calls]
    for a, b in zip(got, want):
        assert torch.allclose(a, b, atol=1e-5), (a - b).abs().max()
    for c, r in zip(caches, ref_caches):
        assert torch.equal(c, r)  # the islands wrote each cache once per call
    s = g.stats()
    assert s["graphs"] == 3 and s["fallbacks"] == {}
    for k in s["keys"]:
        assert k["segments"] == 9 and k["islands"] == 8
        assert k["verify"].startswith("passed")
        assert k["island_us"] > 0 and k["replay_us"] >= k["island_us"]
    assert sum(k["replays"] for k in s["keys"]) == 200 - 3 * 2  # every call but the warmup calls
    assert "segments=9 islands=8" in g.report()
    assert island_of(attention) is not None


def test_island_with_a_sync_inside_is_graphed_around(emu):
    counter = torch.zeros(())

    @graphjit.eager
    def scale_by_max(h):
        return h / float(h.abs().max())  # a sync: fine in an island

    def step(x):
        counter.add_(1)
        return scale_by_max(x * 3) + counter

    g = graphjit.graphed(step)
    xs = [torch.randn(4) for _ in range(6)]
    got = [g(x) for x in xs]
    for i, (x, y) in enumerate(zip(xs, got)):
        assert torch.allclose(y, x * 3 / float((x * 3).abs().max()) + (i + 1))
    assert float(counter) == 6
    s = g.stats()
    assert s["graphs"] == 1 and s["keys"][0]["islands"] == 1 and s["replays"] == 4


def test_a_sync_outside_islands_names_the_line_the_function_and_the_fix(emu):
    def step(x):
        y = x * 2
        n = float(y.sum())
        return y * n

    g = graphjit.graphed(step, warmup=1)
    g(torch.ones(3))
    detail = g.stats()["keys"][0]["detail"]
    assert "test_islands.py" in detail and "in step()" in detail
    assert "@graphjit.eager" in detail and "island" in detail


def test_a_capture_failure_names_the_users_line(emu):
    def step(x):
        if graphjit.scope.phase() == "capture":
            torch.nonzero(x)  # an op the capture refuses, which the warmup did not run
        return x + 1

    g = graphjit.graphed(step, warmup=1)
    assert torch.equal(g(torch.ones(3)), torch.full((3,), 2.0))
    assert torch.equal(g(torch.ones(3)), torch.full((3,), 2.0))  # the capture fails; the call runs eagerly
    detail = g.stats()["keys"][0]["detail"]
    assert detail.startswith("capture failed") and "test_islands.py" in detail and "in step()" in detail
    assert "@graphjit.eager" in detail


def test_a_segment_that_reads_a_dynamic_argument_is_caught_on_the_next_call_with_new_values(emu, caplog):
    w = torch.randn(4, 4)
    counter = torch.zeros(())

    @graphjit.eager
    def gather(h, idx):
        return h[idx]

    def step(x, idx):
        counter.add_(1)
        h = (x @ w) * idx.float().mean()  # a segment reads the dynamic tensor: frozen at capture
        return gather(h, idx) + counter

    g = graphjit.graphed(step, dynamic=("idx",))
    xs = [torch.randn(6, 4) for _ in range(8)]
    idxs = [torch.tensor([0, 1, 2])] * 3 + [torch.tensor([5, 4, 3])] * 5
    with caplog.at_level(logging.WARNING, logger="graphjit"):
        got = [g(x, i) for x, i in zip(xs, idxs)]
    for n, (x, i, y) in enumerate(zip(xs, idxs, got)):
        want = ((x @ w) * i.float().mean())[i] + (n + 1)
        assert torch.allclose(y, want, atol=1e-5)
    assert float(counter) == 8  # exactly once per call, the rejected check included
    s = g.stats()
    assert s["graphs"] == 0 and s["fallbacks"] == {"reads dynamic arguments outside islands": 5}
    assert s["keys"][0]["verify"] == "failed"
    assert "@graphjit.eager" in caplog.text


def test_dynamic_values_reach_the_island_by_path(emu):
    """The island receives meta.lens and meta.tables[1] (taken out of the dynamic argument in a segment):
    each replay gets the current call's objects."""

    @graphjit.eager
    def pick(h, lens, table):
        return h[: len(lens)].sum(0) * table.sum()

    @dataclasses.dataclass
    class M:
        lens: list[int]
        tables: list[torch.Tensor]

    def step(x, m):
        return pick(x + 1, m.lens, m.tables[1]) * 2

    g = graphjit.graphed(step, dynamic=("m",))
    for n in range(8):
        m = M(list(range(1 + n % 4)), [torch.ones(2), torch.full((3,), float(n))])
        x = torch.randn(5, 2)
        assert torch.allclose(g(x, m), step(x, m))
    assert g.stats()["graphs"] == 1 and g.stats()["replays"] == 6


def test_in_place_island_output_is_not_copied(emu):
    @graphjit.eager
    def fill(out, src):
        out.copy_(src * 3)
        return out

    def step(x):
        buf = torch.empty_like(x)
        return fill(buf, x + 1) - 1

    g = graphjit.graphed(step)
    for _ in range(5):
        x = torch.randn(3)
        assert torch.allclose(g(x), (x + 1) * 3 - 1)
    graph = next(iter(g._self_state.entries.values())).graph
    assert isinstance(graph, PiecewiseGraph)
    step_ = graph.islands[0]
    assert step_.buffers[0] is step_.template.args[0]  # the island's own input is its output buffer


def test_exactly_once_with_state_in_segments_and_islands(emu):
    seg_counter = torch.zeros(())
    isl_counter = torch.zeros(())
    log: list[int] = []

    @graphjit.eager
    def note(h):
        isl_counter.add_(1)
        log.append(1)  # Python effects of an island happen once on every call, replays included
        return h + isl_counter

    def step(x):
        seg_counter.add_(1)
        return note(x * seg_counter)

    g = graphjit.graphed(step)
    out = [g(torch.ones(2)) for _ in range(10)]
    assert float(seg_counter) == 10 and float(isl_counter) == 10
    assert [float(o[0]) for o in out] == [float(2 * i) for i in range(1, 11)]
    # once a call: the capturing call ran the island in verify's eager reference and again in verify's replay, whose
    # Python effects are undone as its tensor writes are (before, this list got one entry more)
    assert len(log) == 10


def test_capture_scope_captures_a_piecewise_key(emu):
    counter = torch.zeros(())

    @graphjit.eager
    def island(h):
        return h.clone() * float(h.sum() != 0)

    def step(x):
        counter.add_(1)
        return island(x + counter)

    g = graphjit.graphed(step)
    with graphjit.capture_scope(progress=False):
        first = g(torch.ones(2))
    assert float(counter) == 1 and torch.equal(first, torch.full((2,), 2.0))
    rest = [g(torch.ones(2)) for _ in range(4)]
    assert float(counter) == 5 and torch.equal(rest[-1], torch.full((2,), 6.0))
    s = g.stats()
    assert s["graphs"] == 1 and s["replays"] == 4 and s["keys"][0]["islands"] == 1


def test_island_output_shape_change_on_replay_is_a_clear_error(emu):
    @graphjit.eager
    def grow(h, n):
        return h.repeat(n[0])

    def step(x, n):
        return grow(x * 2, n) + 1

    g = graphjit.graphed(step, dynamic=("n",), verify=False)
    for _ in range(3):
        g(torch.ones(2), [1])
    with pytest.raises(graphjit.IslandError, match=r"grow.*shape"):
        g(torch.ones(2), [3])


def test_island_output_structure_change_on_replay_is_a_clear_error(emu):
    """An island captured returning one tensor that later returns it in a tuple is refused, not read as the
    tensor (the one-tensor fast path of the replay checks the type)."""

    @graphjit.eager
    def wrap(h, n):
        return (h * 1,) if n[0] == 2 else h * 1

    def step(x, n):
        out = wrap(x * 2, n)
        return (out[0] if isinstance(out, tuple) else out) + 1

    g = graphjit.graphed(step, dynamic=("n",), verify=False)
    for _ in range(3):
        g(torch.ones(2), [1])
    with pytest.raises(graphjit.IslandError, match=r"wrap.*another structure"):
        g(torch.ones(2), [2])


def test_island_output_shape_change_found_by_the_dynamic_check_falls_back(emu):
    counter = torch.zeros(())

    @graphjit.eager
    def grow(h, n):
        return h.repeat(n[0])

    def step(x, n):
        counter.add_(1)
        return grow(x * counter, n) + 1

    g = graphjit.graphed(step, dynamic=("n",))
    got = [g(torch.ones(2), [1]) for _ in range(3)] + [g(torch.ones(2), [3])]
    assert float(counter) == 4 and torch.equal(got[-1], torch.full((6,), 5.0))
    s = g.stats()
    assert s["graphs"] == 0 and s["fallbacks"] == {"reads dynamic arguments outside islands": 1}
    assert "shape" in s["keys"][0]["detail"]


def test_islands_that_differ_between_calls_block_the_key(emu):
    @graphjit.eager
    def a(h):
        return h + 1

    @graphjit.eager
    def b(h):
        return h - 1

    flip = {"n": 0}

    def step(x):
        flip["n"] += 1
        return a(x) if flip["n"] % 2 else b(x)

    g = graphjit.graphed(step)
    out = [g(torch.zeros(2)) for _ in range(4)]
    assert [float(o[0]) for o in out] == [1, -1, 1, -1]
    assert g.stats()["fallbacks"] == {"islands differ between calls": 3}


def test_disable_and_plain_calls(emu, monkeypatch):
    @graphjit.eager
    def island(h):
        return h * 2

    assert torch.equal(island(torch.ones(2)), torch.full((2,), 2.0))  # outside a graphed call: the function
    monkeypatch.setenv("GRAPHJIT_DISABLE", "1")
    graphjit.refresh_env()
    try:
        g = graphjit.graphed(lambda x: island(x) + 1)
        assert torch.equal(g(torch.ones(2)), torch.full((2,), 3.0))
        assert g.stats()["disabled_calls"] == 1
    finally:
        monkeypatch.delenv("GRAPHJIT_DISABLE")
        graphjit.refresh_env()


def test_strict_mode_with_islands_that_differ(emu):
    @graphjit.eager
    def a(h):
        return h + 1

    n = {"calls": 0}

    def step(x):
        n["calls"] += 1
        return a(x) if n["calls"] == 1 else x

    g = graphjit.graphed(step, strict=True)
    g(torch.zeros(2))
    with pytest.raises(graphjit.CaptureError) as info:
        g(torch.zeros(2))
    assert info.value.reason == "islands differ between calls" and info.value.executed


def test_eager_refuses_what_it_cannot_mark():
    with pytest.raises(graphjit.ConfigError, match="needs a function"):
        graphjit.eager(int)

    def gen():
        yield 1

    with pytest.raises(graphjit.ConfigError, match="generator"):
        graphjit.eager(gen)
    island = graphjit.eager(lambda x: x)
    with pytest.raises(graphjit.ConfigError, match="already an island"):
        graphjit.eager(island)
    with pytest.raises(graphjit.ConfigError, match="graphed"):
        graphjit.eager(graphjit.graphed(lambda x: x))


def test_eager_is_a_graph_break_for_torch_compile():
    import torch._dynamo as dynamo

    @graphjit.eager
    def island(x):
        return x * 3

    def f(x):
        return island(x + 1) * 2

    explained = dynamo.explain(f)(torch.ones(2))
    assert explained.graph_break_count == 1
    assert "graphjit island" in str(explained.break_reasons[0].reason)
    assert island_of(island) is not None


def test_islands_see_a_graphed_call_for_collectives(emu):
    """The custom all-reduce takes calls made inside graphed code: inside an island's replay too."""
    modes: list[str | None] = []

    @graphjit.eager
    def island(h):
        modes.append(graphjit.scope.collective_mode())
        return h + 1

    g = graphjit.graphed(lambda x: island(x * 2))
    for _ in range(5):
        g(torch.ones(2))
    assert g.stats()["replays"] == 3
    # 2 warmups, the capturing call's (verify's reference; its replay's append undone), 2 replays
    assert modes == ["graphed"] * len(modes) and len(modes) == 5


@pytest.mark.parametrize("dynamic, match", [
    (("nope",), "does not have"),
    (("args",), r"\*args"),
    (("x",), "both dynamic and buckets"),
    ((1,), "tuple of parameter names"),
    (("m", "m"), "twice"),
])
def test_dynamic_is_validated_at_decoration(dynamic, match):
    def step(x, m, *args):
        return x

    with pytest.raises(graphjit.ConfigError, match=match):
        graphjit.graphed(step, dynamic=dynamic, buckets={"x": {0: [2, 4]}})


def test_dynamic_argument_is_not_part_of_the_key(emu):
    @graphjit.eager
    def island(h, m):
        return h * len(m)

    def step(x, m):
        return island(x, m)

    g = graphjit.graphed(step, dynamic="m")
    for n in range(1, 7):
        assert torch.equal(g(torch.ones(2), list(range(n))), torch.full((2,), float(n)))
    s = g.stats()
    assert len(s["keys"]) == 1 and s["graphs"] == 1 and s["replays"] == 4


def test_static_inputs_hand_dynamic_arguments_back(emu):
    @graphjit.eager
    def island(h, m):
        return h * len(m)

    g = graphjit.graphed(lambda x, m: island(x + 1, m), dynamic=("m",))
    for _ in range(3):
        g(torch.ones(2), [1, 2])
    (sx, sm), _kw = g.static_inputs(torch.ones(2), [7, 7, 7])
    assert sm == [7, 7, 7] and isinstance(sx, torch.Tensor)
    sx.copy_(torch.full((2,), 2.0))
    assert torch.equal(g(sx, sm), torch.full((2,), 9.0))


def test_an_island_that_breaks_its_contract_in_verify_leaves_one_execution(emu):
    counter = torch.zeros(())
    # C state graphjit cannot put back (a Python dict's count would be: verify's replay would see the reference's
    # start, and the island break its contract on the next call's replay instead, with an IslandError)
    calls = itertools.count(1)

    @graphjit.eager
    def unstable(h):
        return h.repeat(2 if next(calls) >= 4 else 1)  # another shape from verify's replay on

    def step(x):
        counter.add_(1)
        return unstable(x * counter)

    g = graphjit.graphed(step)
    outs = [g(torch.ones(2)) for _ in range(4)]
    assert float(counter) == 4
    assert [o.shape[0] for o in outs] == [2, 2, 2, 4]  # the capturing call's result is verify's eager reference
    s = g.stats()
    assert s["graphs"] == 0 and s["keys"][0]["verify"] == "failed" and "replay failed" in s["keys"][0]["detail"]


def test_an_island_stays_a_graph_break_where_dynamo_traces_every_frame():
    """Under ``dont_skip_tracing`` Dynamo ignores its skip list (graphjit's files on it too): the island's wrapper is
    skipped all the same, as ``torch.compiler.disable``'s own wrapper is, and the island runs eagerly."""
    import torch._dynamo as dynamo
    from torch._C._dynamo.eval_frame import get_eval_frame_callback

    if not hasattr(dynamo, "dont_skip_tracing"):
        pytest.skip("this torch has no dont_skip_tracing")
    seen = []

    @graphjit.eager
    def island(x):
        seen.append(get_eval_frame_callback())
        return x * 3

    @dynamo.dont_skip_tracing
    def caller(x):
        return island(x + 1) * 2

    dynamo.reset()
    out = torch.compile(caller, backend="eager")(torch.ones(2))
    assert torch.equal(out, torch.full((2,), 12.0)) and seen == [None]


def test_an_islands_python_effects_happen_once_a_call_through_verify_and_the_dynamic_recheck(emu):
    """An island's Python effects happen once per call: the capturing call runs it in verify's eager reference and
    in verify's replay, the first call with other dynamic values in the recheck's eager run and its replay; each
    second run's Python effects are undone (its tensor writes were already).  Before, this list got an entry more
    for each of those two calls."""
    runs: list[float] = []

    @graphjit.eager
    def scale(h, meta):
        runs.append(meta["n"])
        return h * meta["n"]

    def step(x, meta):
        return scale(x + 1, meta) * 2

    g = graphjit.graphed(step, dynamic=("meta",))
    ns = [float(i % 3 + 1) for i in range(8)]
    outs = [g(torch.ones(2), {"n": n}) for n in ns]
    assert runs == ns, runs
    assert [float(o[0]) for o in outs] == [4.0 * n for n in ns]
    st = g.stats()
    assert st["graphs"] == 1 and st["replays"] >= 5 and not st["fallbacks"], st


def test_an_island_that_writes_its_dynamic_argument_or_reads_python_state_it_advances(emu):
    """Verify's and the recheck's replays start from the Python state their eager run started from (as their tensors
    do) and leave the one it left: an island that appends to its dynamic argument does so once per call, and one whose
    output reads a Python counter it advances is captured and gives eager's outputs.  Before, the dynamic argument
    got a second entry in two calls, and the counter island failed verify (its replay saw the counter one step
    ahead) and ran uncaptured for good."""

    @graphjit.eager
    def note(h, meta):
        meta["log"].append(meta["n"])
        return h * meta["n"]

    g = graphjit.graphed(lambda x, meta: note(x + 1, meta) * 2, dynamic=("meta",))
    metas = [{"n": float(i % 3 + 1), "log": []} for i in range(8)]
    outs = [g(torch.ones(2), m) for m in metas]
    assert [m["log"] for m in metas] == [[m["n"]] for m in metas]
    assert [float(o[0]) for o in outs] == [4.0 * m["n"] for m in metas]
    assert g.stats()["graphs"] == 1 and not g.stats()["fallbacks"], g.stats()

    state = {"k": 0}

    @graphjit.eager
    def count(h):
        state["k"] += 1
        return h * state["k"]

    def step(x):
        return count(x + 1) * 2

    want_state = {"k": 0}

    def eager_step(x):
        want_state["k"] += 1
        return (x + 1) * want_state["k"] * 2

    c = graphjit.graphed(step)
    for _ in range(6):
        assert torch.equal(c(torch.ones(2)), eager_step(torch.ones(2)))
    assert state == want_state
    st = c.stats()
    assert st["graphs"] == 1 and st["replays"] >= 3 and not st["fallbacks"], st
