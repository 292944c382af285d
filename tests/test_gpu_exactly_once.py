"""GPU tests, torch: every @graphed call acts like exactly one eager call (state the function writes,
grad and autocast modes, random numbers), with real CUDA graphs (make test-gpu)."""

from __future__ import annotations

import pytest
from unseen import Unseen

import graphjit

pytestmark = [pytest.mark.gpu, pytest.mark.torch]

torch = pytest.importorskip("torch")


def rel(a, b) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def counter_step(dev):
    """A step that advances a GPU counter it closes over and writes a cache at it (transformers' StaticCache
    does this with its cumulative_length)."""
    g = torch.Generator(device="cpu").manual_seed(0)
    counter = torch.zeros(1, dtype=torch.long, device=dev)
    cache = torch.zeros(64, 32, device=dev)
    w = (torch.randn(32, 32, generator=g) / 6).to(dev)

    def step(x):
        counter.add_(1)
        cache.index_copy_(0, counter - 1, torch.tanh(x @ w))
        return cache.sum(0) + x.sum()

    return step, counter, cache


def inputs(dev, n=20):
    g = torch.Generator(device="cpu").manual_seed(1)
    return [torch.randn(1, 32, generator=g).to(dev) for _ in range(n)]


def eager_run(dev, xs):
    step, counter, cache = counter_step(dev)
    with torch.no_grad():
        outs = [step(x) for x in xs]
    return outs, counter, cache


def check(outs, counter, cache, want):
    want_outs, want_counter, want_cache = want
    assert int(counter) == int(want_counter) == len(want_outs)
    assert rel(cache, want_cache) < 1e-6
    for i, (a, b) in enumerate(zip(outs, want_outs)):
        assert rel(a, b) < 1e-6, i


@pytest.fixture
def dev():
    return torch.device("cuda", 0)


def test_closed_over_counter_and_cache_over_20_calls(dev):
    xs = inputs(dev)
    step, counter, cache = counter_step(dev)
    g = graphjit.graphed(step)
    with torch.no_grad():
        outs = [g(x) for x in xs]
    check(outs, counter, cache, eager_run(dev, xs))
    s = g.stats()
    assert s["graphs"] == 1 and s["replays"] == 18 and not s["fallbacks"], s
    assert s["keys"][0]["verify"] == "passed", s


def test_the_same_inside_capture_scope(dev):
    xs = inputs(dev)
    step, counter, cache = counter_step(dev)
    g = graphjit.graphed(step, warmup=3)
    with torch.no_grad():
        with graphjit.capture_scope(progress=False) as scope:
            outs = [g(xs[0])]
        assert int(counter) == 1 and scope.stats()["captures"] == 1
        outs += [g(x) for x in xs[1:]]
    check(outs, counter, cache, eager_run(dev, xs))
    assert g.stats()["replays"] == 19


def test_after_a_forced_verify_failure(dev):
    xs = inputs(dev, 10)
    step, counter, cache = counter_step(dev)
    turns = Unseen(1)  # a host value no guard sees: verify is what catches it

    def leaky(x):
        return step(x) * (1.0 if next(turns) != 4 else 2.0)  # the eager reference of the 3rd call sees 4

    g = graphjit.graphed(leaky)
    with torch.no_grad():
        outs = [g(x) for x in xs]
    assert g.stats()["keys"][0]["verify"] == "failed"
    want = eager_run(dev, xs)
    assert int(counter) == 10 and rel(cache, want[2]) < 1e-6
    assert rel(outs[2], want[0][2] * 2.0) < 1e-6  # the call returned its eager reference
    for i in (0, 1, *range(3, 10)):
        assert rel(outs[i], want[0][i]) < 1e-6, i


def test_after_a_failed_capture(dev):
    xs = inputs(dev, 8)
    step, counter, cache = counter_step(dev)

    def breaks_in_capture(x):
        out = step(x)
        if graphjit.scope.phase() == "capture":
            float(out.sum())  # a sync only the capture sees: the capture fails, no kernel of it ran
        return out

    g = graphjit.graphed(breaks_in_capture)
    with torch.no_grad():
        outs = [g(x) for x in xs]
    check(outs, counter, cache, eager_run(dev, xs))
    s = g.stats()
    assert s["graphs"] == 0 and any(r.startswith("capture failed") for r in s["fallbacks"]), s
    with torch.cuda.stream(torch.cuda.Stream()):
        assert not torch.cuda.is_current_stream_capturing()


def test_strict_mode_raises_after_one_execution(dev):
    step, counter, _cache = counter_step(dev)

    def syncs(x):
        out = step(x)
        return out * float(out.sum() != 0)

    g = graphjit.graphed(syncs, strict=True)
    x = inputs(dev, 1)[0]
    with torch.no_grad():
        g(x)  # the first of 2 warmup calls is not watched (tracers translate there)
        with pytest.raises(graphjit.CaptureError, match="synchronises") as info:
            g(x)
    assert info.value.executed and int(counter) == 2 and info.value.result is not None


def test_grad_mode_and_autocast_switch_between_calls(dev):
    lin = torch.nn.Linear(64, 64).to(dev)
    g = graphjit.graphed(lambda x: lin(x))
    x = torch.randn(8, 64, device=dev)
    for round_ in range(3):
        with torch.no_grad():
            for _ in range(3):
                out = g(x)
                assert out.grad_fn is None and rel(out, lin(x)) < 1e-5
        out = g(x)  # grad enabled: another key, run eagerly, with its autograd graph
        assert out.grad_fn is not None
        out.sum().backward()
        assert lin.weight.grad is not None
        lin.weight.grad = None
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            for _ in range(3):
                out = g(x)
                assert out.dtype == torch.bfloat16, round_
                assert rel(out, lin(x)) < 1e-2
    s = g.stats()
    labels = [k["key"] for k in s["keys"]]
    assert len(labels) == 3 and any("autocast(cuda, bfloat16)" in k for k in labels), labels
    assert s["graphs"] == 2 and s["fallbacks"] == {"outputs require grad": 3}, s


def test_random_numbers_are_new_on_every_replay_and_follow_the_generator(dev):
    def noisy(x):
        return torch.nn.functional.dropout(x, 0.5, training=True) + torch.rand_like(x)

    x = torch.ones(1 << 16, device=dev)
    torch.manual_seed(11)
    want = [noisy(x) for _ in range(30)]
    after = torch.rand(4, device=dev)
    g = graphjit.graphed(noisy)
    torch.manual_seed(11)
    with torch.no_grad():
        got = [g(x) for _ in range(30)]
    assert torch.equal(torch.rand(4, device=dev), after)  # the generator advanced as eager's did
    for i, (a, b) in enumerate(zip(got, want)):
        assert torch.equal(a, b), i
    assert len({float(t.sum()) for t in got}) == 30  # new numbers every call
    kept = torch.stack([(t >= 1).float().mean() for t in got])  # dropout keeps half (scaled by 2) plus U[0,1)
    assert abs(float(kept.mean()) - 0.5) < 0.01
    noise = torch.stack([t[t < 1].mean() for t in got])
    assert abs(float(noise.mean()) - 0.5) < 0.01
    s = g.stats()
    assert s["graphs"] == 1 and s["replays"] == 28 and not s["fallbacks"], s
    torch.manual_seed(11)  # seeding between calls acts as in eager
    with torch.no_grad():
        assert torch.equal(g(x), want[0])


def test_a_users_own_cuda_generator_draws_as_in_eager(dev):
    """A function drawing from a ``torch.Generator`` of its own (closed over, and passed as an argument): the numbers
    of every call and the generator's state afterwards are eager's, whether graphjit graphs it or runs it uncaptured
    (then with a reason)."""
    x = torch.ones(1 << 12, device=dev)

    def run(fn, gen):
        gen.manual_seed(5)
        with torch.no_grad():
            outs = [fn(x) for _ in range(12)]
        return outs, gen.get_state(), torch.rand(4, device=dev, generator=gen)

    own = torch.Generator(device=dev)

    def closed(x):
        return x + torch.rand(x.shape, device=x.device, generator=own)

    def passed(x, gen):
        return x * torch.randn(x.shape, device=x.device, generator=gen)

    for name, fn in (("closed", closed), ("passed", lambda x: passed(x, own))):
        want, want_state, want_next = run(fn, own)
        g = graphjit.graphed(closed) if name == "closed" else graphjit.graphed(passed)
        call = g if name == "closed" else (lambda x, g=g: g(x, own))
        got, state, after = run(call, own)
        for i, (a, b) in enumerate(zip(got, want)):
            assert torch.equal(a, b), (name, i)
        assert torch.equal(state, want_state), name
        assert torch.equal(after, want_next), name
        s = g.stats()
        if not s["replays"]:  # run uncaptured: it says why
            assert s["fallbacks"], (name, s)


@pytest.mark.parametrize("scope", [False, True], ids=["calls", "scope"])
@pytest.mark.parametrize("warmup", [1, 2])
@pytest.mark.parametrize("copy", ["pageable", "pinned"])
def test_a_draw_from_torchs_cpu_generator_acts_as_in_eager(dev, copy, warmup, scope):
    """A CUDA function that draws on the host from torch's CPU generator (``torch.rand(n)`` without a device) and
    copies the numbers over (a pageable copy synchronises; a pinned, non-blocking one can be captured): every call's
    numbers and the CPU generator's state afterwards are eager's, with the key run uncaptured under a reason.  Before,
    the capture's run (``warmup=1``) or a scope's extra run drew numbers no call saw, and every later call was a draw
    ahead of eager's."""

    def step(x):
        noise = torch.rand(x.shape[0])
        noise = noise.to(dev) if copy == "pageable" else noise.pin_memory().to(dev, non_blocking=True)
        return x * 2 + noise

    def run(fn):
        torch.manual_seed(3)
        outs = []
        with torch.no_grad():
            for i in range(8):
                x = torch.full((16,), float(i), device=dev)
                if scope and i == 0:
                    with graphjit.capture_scope(progress=False):
                        outs.append(fn(x).clone())
                else:
                    outs.append(fn(x).clone())
        torch.cuda.synchronize()
        return outs, torch.default_generator.get_state()

    g = graphjit.graphed(step, warmup=warmup)
    (got, got_state), (want, want_state) = run(g), run(step)
    for i, (a, b) in enumerate(zip(got, want)):
        assert torch.equal(a, b), i
    assert torch.equal(got_state, want_state)
    s = g.stats()
    assert not s["replays"] and s["fallbacks"], s


def test_dynamic_cache_style_rebinding_runs_uncaptured_and_right(dev):
    class Growing:
        def __init__(self):
            self.keys = torch.zeros(0, 16, device=dev)

    def step(x, cache):
        cache.keys = torch.cat([cache.keys, x])
        return cache.keys.sum(0)

    g = graphjit.graphed(step)
    a, b = Growing(), Growing()
    with torch.no_grad():
        for _ in range(10):
            x = torch.randn(1, 16, device=dev)
            assert torch.equal(g(x, a), step(x, b))
    assert torch.equal(a.keys, b.keys)
    s = g.stats()
    assert s["graphs"] == 0 and s["fallbacks"] == {"rebinds a tensor held by an object": 10}, s
    assert "argument 'cache'.keys" in g.report()


def test_a_written_input_passed_twice_or_overlapping_another_acts_as_eager(dev):
    """Captured with two tensors (the written one copied in and back), then called with one tensor twice and with
    overlapping views: the other input must see the write, as in eager (the feed nodes and the copy path alike)."""

    def step(a, b):
        a.mul_(2)
        return b @ b.T

    g = graphjit.graphed(step)
    with torch.no_grad():
        for i in range(4):
            g(torch.full((8, 8), float(i), device=dev), torch.ones(8, 8, device=dev))
        for i in range(3):
            x, x_eager = torch.full((8, 8), i + 1.0, device=dev), torch.full((8, 8), i + 1.0, device=dev)
            want = step(x_eager, x_eager)
            assert torch.equal(g(x, x), want) and torch.equal(x, x_eager)
        x, x_eager = torch.arange(128.0, device=dev).view(16, 8), torch.arange(128.0, device=dev).view(16, 8)
        want = step(x_eager[:8], x_eager[4:12])
        assert torch.equal(g(x[:8], x[4:12]), want) and torch.equal(x, x_eager)
        x, y = torch.ones(8, 8, device=dev), torch.full((8, 8), 3.0, device=dev)
        assert torch.equal(g(x, y), y @ y.T) and torch.equal(x, torch.full((8, 8), 2.0, device=dev))
    assert "a written input overlaps another input" in g.stats()["fallbacks"], g.report()


SHARED = {"acc": None}  # state the model's file keeps in a global, written by a submodule's forward


class _Accumulates(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(32, 32)

    def forward(self, x):
        y = self.lin(x)
        SHARED["acc"].add_(y.sum(0))  # a global of this file, not of the graphed Sequential's code
        return y


def test_a_tensor_a_submodule_writes_through_its_files_global_is_written_once_a_call(dev):
    """The capture finds the write by the tensor's version counter (in-place ops move it while capturing) and verify
    copies it: the capturing call writes it once, as every other call does."""

    def run(graph):
        torch.manual_seed(0)
        m = torch.nn.Sequential(_Accumulates()).to(dev).eval()
        SHARED["acc"] = torch.zeros(32, device=dev)
        f = graphjit.graphed(m) if graph else m
        with torch.no_grad():
            outs = [f(x) for x in inputs(dev, 8)]
        torch.cuda.synchronize()
        return torch.cat(outs), SHARED["acc"].clone(), f

    want, acc_want, _ = run(False)
    got, acc_got, f = run(True)
    assert rel(got, want) < 1e-5 and rel(acc_got, acc_want) < 1e-5, (rel(acc_got, acc_want), f.report())
    assert f.stats()["replays"] >= 5, f.report()
