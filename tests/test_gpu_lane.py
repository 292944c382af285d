"""GPU tests, torch: the replay lane (graphjit/lane.py, csrc/lane.c) launching real graphs through their feed nodes
(``gj_feed_launch`` called from C), against eager on the same GPU and against graphjit's Python path (make test-gpu).
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from only_key import only_entry, only_key

import graphjit

pytestmark = [pytest.mark.gpu, pytest.mark.torch]

torch = pytest.importorskip("torch")


@pytest.fixture
def dev() -> Any:
    return torch.device("cuda", 0)


def test_queued_calls_served_in_c_read_and_write_their_own_tensors(dev, lane_on, python_replays):
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
    assert type(g._self_wrapper).__name__ == "Front"  # decorated with the lane loaded: entered from C
    with torch.no_grad():
        got = [g(x, y) for x, y in zip(xs, ys)]
        want = [step(x, y) for x, y in zip(xs, ys)]
    torch.cuda.synchronize()
    for i, (a, b) in enumerate(zip(got, want)):
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]), i
    key = only_key(g)
    assert only_entry(g).graph.feed.random is False  # the lane launches it through the library's address
    assert key["fed_replays"] == key["replays"] - 1 >= 190, key
    assert python_replays[0] <= 4  # the rest were served in C


def test_static_inputs_and_alias_outputs_in_c(dev, lane_on, python_replays):
    def f(a: Any, b: Any) -> Any:
        return a @ b + 1

    g = graphjit.graphed(f, outputs="alias")
    a, b = torch.randn(128, 128, device=dev), torch.randn(128, 128, device=dev)
    with torch.no_grad():
        for _ in range(3):
            g(a, b)
        (sa, sb), _ = g.static_inputs(a, b)
        for i in range(20):
            sa.copy_(torch.full_like(a, float(i)))
            out = g(sa, sb)
            assert out is only_entry(g).outputs.tensors[0]
            assert torch.equal(out, f(sa, sb)), i
    key = only_key(g)
    assert key["input_copies"] <= 2 and python_replays[0] <= 4, key


def test_a_graph_that_draws_random_numbers_is_launched_by_torch_and_advances_the_generator(dev, lane_on):
    def f(x: Any) -> Any:
        return x + torch.rand_like(x)

    x = torch.zeros(1000, device=dev)
    g = graphjit.graphed(f)
    torch.manual_seed(5)
    with torch.no_grad():
        got = [g(x).clone() for _ in range(12)]
    torch.manual_seed(5)
    want = [f(x) for _ in range(12)]
    for i, (a, b) in enumerate(zip(got, want)):
        assert torch.equal(a, b), i
    assert only_entry(g).graph.feed.random is True and only_key(g)["feed"] == "torch"


def test_threads_on_one_function_in_c(dev, lane_on):
    def f(a: Any, b: Any) -> Any:
        return a * b + a

    g = graphjit.graphed(f)
    a, b = torch.randn(64, 64, device=dev), torch.randn(64, 64, device=dev)
    with torch.no_grad():
        for _ in range(6):
            g(a, b)
    errors: list[str] = []

    def worker(seed: int) -> None:
        gen = torch.Generator(device="cpu").manual_seed(seed)
        with torch.no_grad():
            for i in range(50):
                x, y = torch.randn(64, 64, generator=gen).to(dev), torch.randn(64, 64, generator=gen).to(dev)
                if not torch.equal(g(x, y), f(x, y)):
                    errors.append(f"thread {seed} call {i}")

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    torch.cuda.synchronize()
    assert not errors and g.stats()["calls"] == 206
