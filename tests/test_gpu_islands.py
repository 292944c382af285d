"""GPU tests, torch: piecewise capture with real CUDA graphs (make test-gpu).  A decode step whose attention
reads per-sequence lengths that change every call (no whole graph can hold it): attention an island,
everything else graphed, equal to eager over 200 calls with changing lengths and batch sizes in buckets;
an island with a ``.item()``; exactly-once state; ``capture_scope``.  The all-reduce inside an island is in
tests/test_gpu_collectives.py (section "islands")."""

from __future__ import annotations

import dataclasses

import pytest

import graphjit

pytestmark = [pytest.mark.gpu, pytest.mark.torch]

torch = pytest.importorskip("torch")


@pytest.fixture
def dev():
    return torch.device("cuda", 0)


def rel(a, b) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


@dataclasses.dataclass
class Meta:
    lens: torch.Tensor  # per-sequence positions (device)
    max_len: int  # a host int that changes every call


def decoder(dev, layers=8, dim=64, max_batch=8, max_len=128, seed=0):
    gen = torch.Generator().manual_seed(seed)
    ws = [(torch.randn(dim, dim, generator=gen) / dim**0.5).to(dev) for _ in range(layers)]
    caches = [torch.zeros(max_batch, max_len, dim, device=dev) for _ in range(layers)]

    @graphjit.eager
    def attention(q, cache, meta):
        b = meta.lens.shape[0]
        rows = torch.arange(b, device=q.device)
        cache[rows, meta.lens] = q[:b]
        k = cache[:b, : meta.max_len]  # a shape that changes every call
        mask = torch.arange(meta.max_len, device=q.device)[None, :] <= meta.lens[:, None]
        scores = torch.einsum("bd,btd->bt", q[:b], k).masked_fill(~mask, float("-inf"))
        out = torch.zeros_like(q)
        out[:b] = torch.einsum("bt,btd->bd", torch.softmax(scores, -1), k)
        return out

    def step(x, meta):
        h = x
        for w, cache in zip(ws, caches):
            q = torch.tanh(h @ w)
            h = h + attention(q, cache, meta)
        return h * 2

    return step, caches


def calls(dev, n, dim=64, seed=1):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        b = [1, 3, 4, 6, 8][i % 5]
        lens = torch.randint(0, 120, (b,), generator=gen)
        out.append((torch.randn(b, dim, generator=gen).to(dev), Meta(lens.to(dev), int(lens.max()) + 1)))
    return out


def test_decode_step_with_attention_islands_equals_eager_over_200_calls(dev):
    cs = calls(dev, 200)
    ref_step, ref_caches = decoder(dev)
    step, caches = decoder(dev)
    g = graphjit.graphed(step, dynamic=("meta",), buckets={"x": {0: [2, 4, 8]}})
    with torch.no_grad():
        want = [ref_step(x, m) for x, m in cs]
        got = [g(x, m) for x, m in cs]
    for i, (a, b) in enumerate(zip(got, want)):
        assert a.shape == b.shape and rel(a, b) < 1e-5, i
    for c, r in zip(caches, ref_caches):
        assert rel(c, r) < 1e-6
    s = g.stats()
    assert s["graphs"] == 3 and s["fallbacks"] == {}, s["fallbacks"]
    for k in s["keys"]:
        assert k["segments"] == 9 and k["islands"] == 8 and k["verify"].startswith("passed"), k
    assert s["replays"] == 200 - 3 * 2


def test_island_with_item_inside(dev):
    counter = torch.zeros(1, device=dev)

    @graphjit.eager
    def normalise(h):
        return h / h.abs().max().item()

    def step(x):
        counter.add_(1)
        return normalise(x * 3) + counter

    g = graphjit.graphed(step)
    xs = [torch.randn(256, device=dev) for _ in range(10)]
    with torch.no_grad():
        got = [g(x) for x in xs]
    for i, (x, y) in enumerate(zip(xs, got)):
        want = x * 3 / (x * 3).abs().max() + (i + 1)
        assert rel(y, want) < 1e-6, i
    assert float(counter) == 10
    s = g.stats()
    assert s["graphs"] == 1 and s["keys"][0]["islands"] == 1 and s["replays"] == 8


def test_exactly_once_state_in_segments_and_islands(dev):
    seg = torch.zeros(1, device=dev)
    isl = torch.zeros(1, device=dev)

    runs: list[int] = []

    @graphjit.eager
    def bump(h):
        isl.add_(1)
        runs.append(1)  # a Python effect: once a call too (the capturing call's verify replay undoes its own)
        return h + isl

    def step(x):
        seg.add_(1)
        return bump(x * seg)

    g = graphjit.graphed(step)
    with torch.no_grad():
        out = [g(torch.ones(4, device=dev)) for _ in range(12)]
    assert float(seg) == 12 and float(isl) == 12 and len(runs) == 12
    assert [float(o[0]) for o in out] == [2.0 * n for n in range(1, 13)]


@pytest.mark.parametrize("scope", [False, True], ids=["calls", "scope"])
def test_an_island_that_draws_host_random_numbers_draws_once_a_call(dev, scope):
    """An island sampling on the host (``random.random()``): the key is captured, each call draws one number as
    eagerly (verify's runs and a scope's extra run put the generator back), results and the generator's state equal to
    eager's."""
    import random

    @graphjit.eager
    def jitter(h):
        return h + random.random()

    def step(x):
        return jitter(x * 3) * 2

    def run(f):
        random.seed(11)
        xs = [torch.full((64,), float(i), device=dev) for i in range(10)]
        outs = []
        with torch.no_grad():
            for i, x in enumerate(xs):
                if scope and i == 0:
                    with graphjit.capture_scope(progress=False):
                        outs.append(f(x).clone())
                else:
                    outs.append(f(x).clone())
        return outs, random.getstate()

    g = graphjit.graphed(step)
    (got, got_state), (want, want_state) = run(g), run(step)
    for i, (a, b) in enumerate(zip(got, want)):
        assert torch.equal(a, b), i
    assert got_state == want_state
    s = g.stats()
    assert s["graphs"] == 1 and s["keys"][0]["islands"] == 1 and not s["fallbacks"], s


def test_capture_scope_piecewise(dev):
    counter = torch.zeros(1, device=dev)

    @graphjit.eager
    def island(h):
        return h * (1.0 if h.sum().item() >= 0 else -1.0)

    def step(x):
        counter.add_(1)
        return island(x + counter)

    g = graphjit.graphed(step)
    with torch.no_grad():
        with graphjit.capture_scope(progress=False):
            first = g(torch.ones(8, device=dev))
        assert float(counter) == 1 and float(first[0]) == 2.0
        rest = [g(torch.ones(8, device=dev)) for _ in range(5)]
    assert float(counter) == 6 and float(rest[-1][0]) == 7.0
    s = g.stats()
    assert s["graphs"] == 1 and s["replays"] == 5 and s["keys"][0]["islands"] == 1


def test_a_sync_outside_an_island_names_its_line(dev):
    def step(x):
        y = x * 2
        scale = y.max().item()
        return y / scale

    g = graphjit.graphed(step)
    with torch.no_grad():
        for _ in range(3):
            g(torch.randn(16, device=dev))
    detail = g.stats()["keys"][0]["detail"]
    assert "test_gpu_islands.py" in detail and "in step()" in detail and "@graphjit.eager" in detail


def test_compile_tracer_breaks_at_the_island(dev):
    """tracer="compile": Dynamo breaks its graph at the island; the compiled pieces are captured as segments."""
    w = (torch.randn(64, 64, generator=torch.Generator().manual_seed(3)) / 8).to(dev)

    @graphjit.eager
    def island(h):
        return h / h.abs().max().item()

    def step(x):
        return island(torch.tanh(x @ w)) @ w

    g = graphjit.graphed(step, tracer="compile")
    xs = [torch.randn(8, 64, device=dev) for _ in range(6)]
    with torch.no_grad():
        got = [g(x) for x in xs]
        want = [step(x) for x in xs]
    for i, (a, b) in enumerate(zip(got, want)):
        assert rel(a, b) < 1e-5, i
    s = g.stats()
    assert s["graphs"] == 1 and s["keys"][0]["islands"] == 1 and s["replays"] == 4, s
