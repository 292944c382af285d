"""Every graphed call acts like exactly one eager call: the lifecycle on CPU, through the emulated
CUDA graph of tests/graph_emulator.py (capture runs no write, replay redoes the tensor work and no
Python).  The same promises on a real GPU: tests/test_gpu_exactly_once.py."""

from __future__ import annotations

import dataclasses
import logging

import pytest

torch = pytest.importorskip("torch")


import graphjit  # noqa: E402

pytestmark = pytest.mark.torch


def _counter_step():
    """A step that advances a tensor it closes over and writes a cache at it (transformers' StaticCache
    does this with its cumulative_length)."""
    counter = torch.zeros((), dtype=torch.long)
    cache = torch.zeros(32, 4)
    w = torch.randn(4, 4)

    def step(x):
        counter.add_(1)
        cache.index_copy_(0, counter.view(1) - 1, x @ w)
        return cache.sum(0) * 2

    return step, counter, cache


def _eager_reference(n_calls, xs):
    torch.manual_seed(0)
    step, counter, cache = _counter_step()
    return [step(x) for x in xs[:n_calls]], counter.clone(), cache.clone()


def _graphed_run(xs, **options):
    torch.manual_seed(0)
    step, counter, cache = _counter_step()
    g = graphjit.graphed(step, **options)
    return g, [g(x) for x in xs], counter, cache


def _inputs(n=20):
    gen = torch.Generator().manual_seed(1)
    return [torch.randn(1, 4, generator=gen) for _ in range(n)]


def _same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b)) and len(a) == len(b)


def test_closed_over_counter_advances_once_per_call(emu):
    xs = _inputs()
    want, want_counter, want_cache = _eager_reference(20, xs)
    g, got, counter, cache = _graphed_run(xs)
    assert int(counter) == 20 == int(want_counter)
    assert torch.equal(cache, want_cache)
    assert _same(got, want)
    s = g.stats()
    assert s["graphs"] == 1 and s["replays"] == 18 and s["keys"][0]["warmups"] == 2
    assert s["keys"][0]["verify"] == "passed"
    assert s["fallbacks"] == {}


def test_inside_capture_scope_one_call_does_everything_once(emu):
    xs = _inputs()
    want, _want_counter, want_cache = _eager_reference(20, xs)
    torch.manual_seed(0)
    step, counter, cache = _counter_step()
    g = graphjit.graphed(step, warmup=3)
    with graphjit.capture_scope(progress=False):
        first = g(xs[0])
    assert int(counter) == 1  # the scope's call ran once, its extra warmups were undone
    rest = [g(x) for x in xs[1:]]
    assert int(counter) == 20
    assert torch.equal(cache, want_cache)
    assert _same([first, *rest], want)
    assert g.stats()["replays"] == 19


def test_a_scope_runs_the_function_as_often_as_a_capture_by_hand_and_still_verifies(emu):
    """In a scope the last undone warmup run is verify's eager reference: warmup=2 costs the call's own run, one
    undone run and the capture (as by hand), and verify still compares a replay with an eager run."""
    import random

    from unseen import Unseen

    runs = Unseen()  # counts the Python runs of the function, invisible to graphjit's guards
    counter = torch.zeros(())

    def step(x):
        next(runs)
        counter.add_(1)
        return x * 2 + counter

    g = graphjit.graphed(step)
    with graphjit.capture_scope(progress=False):
        first = g(torch.ones(3))
    assert next(runs) == 3 and int(counter) == 1 and torch.equal(first, torch.full((3,), 3.0))
    assert g.stats()["keys"][0]["verify"] == "passed"
    assert torch.equal(g(torch.ones(3)), torch.full((3,), 4.0)) and int(counter) == 2

    rng = random.Random(0)

    def frozen(x):  # a generator of the user's own on the host: frozen by a capture, seen by no guard
        counter.add_(1)
        return x * rng.random() + counter

    g = graphjit.graphed(frozen)
    with graphjit.capture_scope(progress=False):
        g(torch.ones(3))
    k = g.stats()["keys"][0]
    assert k["verify"] == "failed" and k["state"] == "fallback" and int(counter) == 3, k


def _counted_python_states(monkeypatch) -> list[int]:
    """A list that gets an entry for every ``PyState`` (a Python-state snapshot) made from now on in the test."""
    from graphjit import pystate

    states: list[int] = []
    real_init = pystate.PyState.__init__

    def init(self, *a, **k):
        states.append(1)
        real_init(self, *a, **k)

    monkeypatch.setattr(pystate.PyState, "__init__", init)
    return states


def test_a_scopes_runs_start_from_the_walk_the_run_before_them_ended_with(emu, monkeypatch):
    """In a scope nothing runs between the call's own run, its extra run and the capture: each starts from the walk of
    the function's state the one before ended with (four walks a key: before and after the own run, after the extra
    run, after the capture), and the capture from the Python state taken before the extra run (one a key), unless
    putting the extra run's Python state back changed something."""
    from graphjit import capture, reach, warmup

    walks = []
    real = reach.walk

    def counted(*a, **k):
        walks.append(1)
        return real(*a, **k)

    monkeypatch.setattr(warmup, "walk", counted)
    monkeypatch.setattr(capture, "walk", counted)
    states = _counted_python_states(monkeypatch)
    counter = torch.zeros(())
    weights = {"w": torch.ones(3)}

    def step(x):
        counter.add_(1)
        return x * weights["w"] + counter

    g = graphjit.graphed(step)
    with graphjit.capture_scope(progress=False):
        first = g(torch.ones(3))
    assert len(walks) == 4 and len(states) == 1, (len(walks), len(states))
    assert torch.equal(first, torch.full((3,), 2.0)) and int(counter) == 1
    assert torch.equal(g(torch.ones(3)), torch.full((3,), 3.0)) and int(counter) == 2
    assert g.stats()["graphs"] == 1 and g.stats()["keys"][0]["verify"] == "passed"


_LAZY = None


def _lazy_step(x):
    global _LAZY
    if _LAZY is None:  # a global the first call sets
        _LAZY = torch.arange(3.0)
    return x * 2 + _LAZY


@pytest.mark.parametrize("where", ["global", "closure"])
def test_a_scopes_run_that_rebinds_a_root_makes_the_next_walk_anew(emu, where):
    """A run that binds a global or closure variable (lazily, at its first call) changes the roots themselves: the
    walk after it is of the roots it started with, so the next run and the capture walk the new roots again (reusing
    it, the extra run saw a tensor added and the key fell back)."""
    global _LAZY
    _LAZY = None
    box = None

    def closure_step(x):
        nonlocal box
        if box is None:
            box = torch.arange(3.0)
        return x * 2 + box

    g = graphjit.graphed(_lazy_step if where == "global" else closure_step, warmup=2 if where == "global" else 1)
    with torch.no_grad(), graphjit.capture_scope(progress=False):
        first = g(torch.ones(3))
    assert torch.equal(first, torch.tensor([2.0, 3.0, 4.0]))
    assert g.stats()["graphs"] == 1 and g.stats()["fallbacks"] == {}, g.stats()["keys"]
    with torch.no_grad():
        assert torch.equal(g(torch.zeros(3)), torch.arange(3.0)) and g.stats()["replays"] == 1


_LATE: dict | None = None


def test_a_root_bound_by_an_extra_run_before_the_last_makes_the_capture_take_the_python_state_anew(emu, monkeypatch):
    """warmup=3 in a scope: two extra runs. The first binds a global (a root) the call's own run did not have: the
    Python state taken before the extra runs does not cover it, so the capture takes its own (two snapshots a key, not
    one) while the last run's walk, of unchanged roots, still serves."""
    from unseen import Unseen

    global _LATE
    _LATE = None
    runs = Unseen()  # the runs, invisible to graphjit's guards
    states = _counted_python_states(monkeypatch)

    def step(x):
        global _LATE
        if next(runs) == 1:
            _LATE = {"unused": 1}
        return x * 2

    g = graphjit.graphed(step, warmup=3)
    with torch.no_grad(), graphjit.capture_scope(progress=False):
        first = g(torch.ones(3))
    assert torch.equal(first, torch.full((3,), 2.0))
    assert g.stats()["graphs"] == 1 and g.stats()["fallbacks"] == {}, g.stats()["keys"]
    assert len(states) == 2, len(states)


def test_taking_the_capture_lock_says_whether_it_waited_for_another_thread():
    import threading

    from graphjit.capture import _taken

    lock = threading.RLock()
    with _taken(lock) as waited:
        assert not waited
        with _taken(lock) as again:  # held by this thread already: taken at once
            assert not again
    held, release = threading.Event(), threading.Event()

    def hold():
        with lock:
            held.set()
            release.wait(5)

    t = threading.Thread(target=hold)
    t.start()
    held.wait(5)
    threading.Timer(0.05, release.set).start()
    with _taken(lock) as waited:
        assert waited
    t.join(5)
    with _taken(lock) as waited:
        assert not waited


def test_a_scopes_extra_run_that_writes_an_input_the_call_left_alone_is_undone(emu):
    """A scope's extra warmup run may write what the call's own run did not (a flag flips the branch): an input the
    call passes is copied before it and put back, so the state after the call is one eager call's; the key is not
    captured (its calls write different tensors)."""
    from unseen import Unseen

    def make():
        runs = Unseen(1)  # Python state invisible to the guards: each run takes the other branch

        def step(x, y):
            if next(runs) % 2:
                x.add_(1)
            else:
                y.add_(1)
            return x * 2

        return step

    x, y = torch.ones(4), torch.ones(4)
    want = make()(x, y)
    g = graphjit.graphed(make(), warmup=2)
    gx, gy = torch.ones(4), torch.ones(4)
    with graphjit.capture_scope(progress=False):
        got = g(gx, gy)
    assert torch.equal(got, want) and torch.equal(gx, x) and torch.equal(gy, y), (gx, gy)
    k = g.stats()["keys"][0]
    assert k["reason"] == "writes different tensors on different calls" and g.stats()["graphs"] == 0, k


@pytest.mark.parametrize("kind", ["expanded", "inference", "saved_for_backward"])
def test_a_scopes_extra_runs_never_write_an_input_they_only_read(emu, kind):
    """The inputs copied before a scope's extra runs are put back only where a run wrote them: an expanded or an
    inference tensor refuses a write, and a tensor autograd saved must keep its version."""
    g = graphjit.graphed(lambda x, y: x * 2 + y)
    y = torch.randn(4, 8)
    if kind == "expanded":
        x = torch.ones(1).expand(4, 8)
    elif kind == "inference":
        with torch.inference_mode():
            x = torch.randn(4, 8)
    else:
        leaf = torch.randn(4, 8, requires_grad=True)
        x = torch.tanh(leaf)  # tanh saves its output for backward
    with torch.no_grad(), graphjit.capture_scope(progress=False):
        out = g(x, y)
    assert torch.equal(out, x * 2 + y) and g.stats()["captures"] == 1
    if kind == "saved_for_backward":
        x.sum().backward()  # before: "modified by an inplace operation"
        assert leaf.grad is not None


@pytest.mark.parametrize("held", ["closure", "parameter"])
def test_a_scopes_extra_run_that_writes_a_reached_tensor_the_call_left_alone_is_said(emu, gj_log, held):
    """What no copy covers (a tensor the function reaches, not one it is passed: copying every reachable tensor before
    each scope call would copy a model's weights): the write stays, and graphjit says so at WARNING level, naming it;
    the key is not captured."""
    from unseen import Unseen

    runs = Unseen(1)
    w = torch.ones(4) if held == "closure" else torch.nn.Parameter(torch.ones(4))

    def step(x):
        if next(runs) % 2 == 0:
            with torch.no_grad():
                w.add_(1)
        return x * 2

    g = graphjit.graphed(step, warmup=2)
    with graphjit.capture_scope(progress=False):
        g(torch.ones(4))
    said = [r.getMessage() for r in gj_log.records if r.levelno == logging.WARNING and "that write stays" in
            r.getMessage()]
    assert len(said) == 1 and "'w'" in said[0], said
    assert int(w[0]) == 2  # (the write that stays)
    assert g.stats()["keys"][0]["reason"] == "writes different tensors on different calls"


def test_a_python_counter_the_function_advances_runs_uncaptured_once_per_call(emu):
    """A Python value the function changes on every call: a replay would not change it, so the key runs
    uncaptured with that reason, every call once, the capture's extra Python run included (none)."""
    xs = _inputs(8)

    def make():
        box = {"n": 0}
        counter = torch.zeros(())

        def step(x):
            box["n"] += 1
            counter.add_(1)
            return x * box["n"] + counter

        return step, counter, box

    step, _counter, _box = make()
    want = [step(x) for x in xs]
    step, counter, box = make()
    g = graphjit.graphed(step)
    got = [g(x) for x in xs]
    assert float(counter) == 8 and box["n"] == 8
    assert _same(got, want)
    s = g.stats()
    assert s["graphs"] == 0 and s["keys"][0]["reason"] == "writes a Python value on every call"
    assert "closure variable 'box'['n'] (1 -> 2)" in s["keys"][0]["detail"]
    assert s["fallbacks"] == {"writes a Python value on every call": 7}


def test_a_failed_verify_leaves_one_execution(emu):
    """A value the graph freezes and no guard sees (a random generator of the user's own on the host; the global ones
    are seen by the warmup: tests/test_host_random.py): verify fails, the key falls back, and the state is still that
    of one eager call per call."""
    import random

    xs = _inputs(8)
    counter = torch.zeros(())
    rng = random.Random(0)

    def step(x):
        counter.add_(1)
        return x * rng.random() + counter

    g = graphjit.graphed(step)
    got = [g(x) for x in xs]
    assert float(counter) == 8
    assert all(a.shape == x.shape for a, x in zip(got, xs))
    s = g.stats()
    assert s["graphs"] == 0 and s["keys"][0]["verify"] == "failed"
    assert s["fallbacks"]["verify failed"] == 6


def test_a_failed_capture_leaves_one_execution(emu):
    xs = _inputs(6)
    counter = torch.zeros(())

    def step(x):
        counter.add_(1)
        if graphjit.scope.phase() == "capture":
            float(x.sum())  # a sync only the capture sees
        return x + counter

    g = graphjit.graphed(step)
    got = [g(x) for x in xs]
    assert float(counter) == 6
    assert _same(got, [x + float(i + 1) for i, x in enumerate(xs)])
    s = g.stats()
    assert s["graphs"] == 0 and any(r.startswith("capture failed") for r in s["fallbacks"])


def test_strict_mode_raises_after_exactly_one_execution(emu):
    counter = torch.zeros(())

    def step(x):
        counter.add_(1)
        return x * float(x.sum())  # a sync: found by the warmup watch

    g = graphjit.graphed(step, strict=True)
    x = torch.ones(3)
    assert torch.equal(g(x), x * 3)  # the first of 2 warmup calls is not watched (tracers translate there)
    with pytest.raises(graphjit.CaptureError) as info:
        g(x)
    assert info.value.executed and info.value.reason == "CPU-GPU sync inside the function"
    assert torch.equal(info.value.result, x * 3)
    assert float(counter) == 2
    assert "test_exactly_once.py" in str(info.value)  # the line of the sync


@dataclasses.dataclass
class Cache:
    keys: torch.Tensor
    length: torch.Tensor
    note: str = "kv"


def test_an_argument_object_holding_tensors_is_walked_like_a_container(emu):
    def step(x, cache):
        cache.keys.index_copy_(0, cache.length.view(1), x)
        cache.length.add_(1)
        return cache.keys.sum(0)

    g = graphjit.graphed(step)
    a = Cache(torch.zeros(16, 4), torch.zeros((), dtype=torch.long))
    ref = Cache(torch.zeros(16, 4), torch.zeros((), dtype=torch.long))
    xs = _inputs(10)
    for x in xs:
        assert torch.equal(g(x, a), step(x, ref))
    assert torch.equal(a.keys, ref.keys) and int(a.length) == 10
    s = g.stats()
    assert s["graphs"] == 1 and s["replays"] == 8
    assert "cache.keys[16, 4]" in s["keys"][0]["key"]
    # Another object of the same shapes is the same key: its tensors are inputs, copied in and back.
    b = Cache(torch.zeros(16, 4), torch.zeros((), dtype=torch.long))
    ref_b = Cache(torch.zeros(16, 4), torch.zeros((), dtype=torch.long))
    for x in xs[:5]:
        assert torch.equal(g(x, b), step(x, ref_b))
    assert torch.equal(b.keys, ref_b.keys) and int(b.length) == 5
    assert torch.equal(a.keys, ref.keys)  # the first object is not written any more
    # A different non-tensor attribute is a different key.
    c = Cache(torch.zeros(16, 4), torch.zeros((), dtype=torch.long), note="other")
    g(xs[0], c)
    assert len(g.stats()["keys"]) == 2


class GrowingCache:
    """transformers' DynamicCache in miniature: concatenation rebinds the tensor every call."""

    def __init__(self):
        self.keys = torch.zeros(0, 4)


def test_a_rebound_tensor_runs_uncaptured_and_says_where(emu):
    def step(x, cache):
        cache.keys = torch.cat([cache.keys, x])
        return cache.keys.sum(0)

    g = graphjit.graphed(step)
    c, ref = GrowingCache(), GrowingCache()
    for x in _inputs(6):
        assert torch.equal(g(x, c), step(x, ref))
    assert torch.equal(c.keys, ref.keys)
    s = g.stats()
    assert s["graphs"] == 0
    assert s["fallbacks"] == {"rebinds a tensor held by an object": 6}  # the call that found it ran eagerly too
    assert "argument 'cache'.keys" in g.report()


def test_a_closed_over_object_that_rebinds_is_found_too(emu):
    holder = GrowingCache()

    def step(x):
        holder.keys = torch.cat([holder.keys, x])
        return holder.keys.sum(0)

    g = graphjit.graphed(step)
    for x in _inputs(4):
        g(x)
    assert holder.keys.shape == (4, 4)
    assert "closure variable 'holder'.keys" in g.report()


def test_grad_mode_is_part_of_the_key(emu):
    lin = torch.nn.Linear(4, 4)
    g = graphjit.graphed(lambda x: lin(x))
    x = torch.randn(2, 4)
    with torch.no_grad():
        for _ in range(4):
            g(x)
    out = g(x)  # grad enabled: another key, eager, with a grad_fn
    assert out.grad_fn is not None
    keys = {k["key"]: k for k in g.stats()["keys"]}
    assert any("no_grad" in k for k in keys)
    assert len(keys) == 2


def test_autocast_is_part_of_the_key(emu):
    w = torch.randn(4, 4)
    g = graphjit.graphed(lambda x: x @ w)
    x = torch.randn(2, 4)
    with torch.no_grad():
        for _ in range(3):
            assert g(x).dtype == torch.float32
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert g(x).dtype == torch.bfloat16
    labels = [k["key"] for k in g.stats()["keys"]]
    assert any("autocast(cpu, bfloat16)" in k for k in labels)


def test_random_numbers_are_drawn_anew_on_every_replay_as_eager_draws_them(emu):
    def step(x):
        return torch.nn.functional.dropout(x, 0.5, training=True) + torch.rand_like(x)

    x = torch.ones(64)
    torch.manual_seed(7)
    want = [step(x) for _ in range(12)]
    after_eager = torch.rand(3)
    g = graphjit.graphed(step)
    torch.manual_seed(7)
    got = [g(x) for _ in range(12)]
    assert torch.equal(torch.rand(3), after_eager)  # the generator advanced exactly as eager's
    assert _same(got, want)
    assert len({tuple(t.tolist()) for t in got}) == 12
    assert g.stats()["replays"] == 10
    torch.manual_seed(7)  # seeding between calls acts as in eager
    assert torch.equal(g(x), want[0])


@pytest.mark.parametrize("how", ["closed", "passed"])
def test_a_users_own_generator_draws_as_in_eager(emu, how):
    """A ``torch.Generator`` of the user's own (torch's capture refuses one not registered with the graph, as the
    emulator does): every call's numbers and the generator afterwards are eager's, and the reason is counted."""
    own = torch.Generator()

    def closed(x):
        return x + torch.rand(x.shape, generator=own)

    def passed(x, gen):
        return x * torch.randn(x.shape, generator=gen)

    fn = closed if how == "closed" else passed
    x = torch.ones(64)

    def run(f):
        own.manual_seed(5)
        outs = [f(x) if how == "closed" else f(x, own) for _ in range(12)]
        return outs, own.get_state(), torch.rand(3, generator=own)

    want, want_state, want_next = run(fn)
    g = graphjit.graphed(fn)
    got, state, after = run(g)
    assert _same(got, want)
    assert torch.equal(state, want_state) and torch.equal(after, want_next)
    s = g.stats()
    assert s["replays"] == 0 and sum(s["fallbacks"].values()) == 10, s
    assert any("generator" in r for r in s["fallbacks"]), s


def test_verify_over_its_memory_budget_is_skipped_and_counted(emu, monkeypatch):
    monkeypatch.setenv("GRAPHJIT_VERIFY_MAX_BYTES", "16")
    graphjit.refresh_env()
    xs = _inputs(6)
    want, _want_counter, want_cache = _eager_reference(6, xs)
    g, got, counter, cache = _graphed_run(xs)
    assert int(counter) == 6 and torch.equal(cache, want_cache) and _same(got, want)
    s = g.stats()
    assert s["graphs"] == 1 and s["keys"][0]["verify"].startswith("skipped")
    assert sum(s["verify_skipped"].values()) == 1
    assert "captured without verify" in g.report()


def test_a_python_counter_the_output_depends_on_never_replays_frozen(emu):
    class Step:
        def __init__(self):
            self.n = 0

        def __call__(self, x):
            self.n += 1
            return x + self.n

    s = Step()
    g = graphjit.graphed(s)
    x = torch.zeros(2)
    outs = [float(g(x)[0]) for _ in range(6)]
    assert outs[:2] == [1.0, 2.0]
    assert len(set(outs)) == len(outs)  # never a frozen value twice
    assert g.stats()["graphs"] == 0


def test_a_padded_capturing_call_is_verified_on_its_real_rows(emu):
    """Verify compares the replay's result with padding sliced off against the eager call on the caller's
    unpadded tensors (it compared the padded buffer, failed, and left every padded key uncaptured)."""
    w = torch.randn(2, 2)
    g = graphjit.graphed(lambda x: torch.tanh(x @ w) * 2, buckets={0: {0: [4]}})
    xs = [torch.randn(1 + i % 3, 2) for i in range(8)]
    for x in xs:
        assert torch.allclose(g(x), torch.tanh(x @ w) * 2)
    s = g.stats()
    # and once more on the first call padded otherwise (tests/test_buckets.py)
    assert s["graphs"] == 1 and s["keys"][0]["verify"] == "passed (and on a call padded otherwise)"
    assert s["fallbacks"] == {}


SHARED = {"acc": None}  # state the model's file keeps in a global, written by a submodule's forward


class _Accumulates(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x):
        y = self.lin(x)
        SHARED["acc"].add_(y.sum(0))  # a global of this file, not of the graphed Sequential's code
        return y


def test_a_tensor_a_submodule_writes_through_its_files_global_is_written_once_a_call(emu):
    """The warmups walk the graphed function's own roots, which do not hold ``SHARED``: the write was not known state,
    and the capturing call's verify (its eager reference, then the replay) added twice.  The capture now finds it by
    its version counter (in-place ops move it while capturing too) and verify copies it."""

    def run(graph):
        torch.manual_seed(0)
        m = torch.nn.Sequential(_Accumulates()).eval()
        SHARED["acc"] = torch.zeros(3)
        f = graphjit.graphed(m) if graph else m
        with torch.no_grad():
            outs = [f(torch.ones(2, 3) * i) for i in range(8)]
        return torch.stack(outs), SHARED["acc"].clone(), f

    want, acc_want, _ = run(False)
    got, acc_got, f = run(True)
    assert torch.allclose(got, want) and torch.allclose(acc_got, acc_want), (acc_got, acc_want, f.report())
    assert f.stats()["replays"] >= 5, f.report()
