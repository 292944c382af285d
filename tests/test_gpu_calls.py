"""GPU tests, torch: a graphed Module object's hooks are captured with it, and a graphed function called
from another is captured into the outer graph, inside a capture scope too (make test-gpu)."""

from __future__ import annotations

import pytest

import graphjit

pytestmark = [pytest.mark.gpu, pytest.mark.torch]

torch = pytest.importorskip("torch")


def rel(a, b) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def test_forward_hooks_of_a_graphed_module_are_in_its_graph():
    m = torch.nn.Linear(64, 64).cuda()
    m.register_forward_pre_hook(lambda mod, args: (args[0] * 2,))
    m.register_forward_hook(lambda mod, args, out: torch.tanh(out))
    g = graphjit.graphed(m)
    with torch.no_grad():
        for _ in range(6):
            x = torch.randn(8, 64, device="cuda")
            assert rel(g(x), torch.tanh(torch.nn.functional.linear(x * 2, m.weight, m.bias))) < 1e-5
    s = g.stats()
    assert s["graphs"] == 1 and s["replays"] == 4 and not s["fallbacks"], s


def test_a_nested_graphed_call_is_captured_into_the_outer_graph_inside_a_scope():
    w = torch.randn(64, 64, device="cuda") / 8

    @graphjit.graphed
    def inner(a):
        return torch.relu(a @ w)

    @graphjit.graphed(buckets={"a": {0: [4, 8]}})
    def outer(a):
        return inner(a) + inner(a * 2)

    with torch.no_grad():
        with graphjit.capture_scope(progress=False) as sc:
            for n in (8, 4):
                outer(torch.zeros(n, 64, device="cuda"))
        assert sc.stats()["captures"] == 2 and sc.stats()["failures"] == 0
        for n in (3, 8, 4, 7):
            a = torch.randn(n, 64, device="cuda")
            assert rel(outer(a), torch.relu(a @ w) + torch.relu((a * 2) @ w)) < 1e-5
    so, si = outer.stats(), inner.stats()
    assert so["graphs"] == 2 and so["replays"] == 4 and not so["fallbacks"], so
    assert si["calls"] == 0 and si["nested_calls"] >= 4 and si["graphs"] == 0, si  # only ever part of outer
    with torch.no_grad():
        a = torch.randn(4, 64, device="cuda")
        for _ in range(3):  # called on its own, inner has its own graph
            assert rel(inner(a), torch.relu(a @ w)) < 1e-5
    assert inner.stats()["graphs"] == 1


def test_an_input_in_another_layout_gets_its_own_graph_and_eagers_strides():
    """A transposed or channels-last input is a key of its own (graphjit/layouts.py): a branch on contiguity, a
    convolution's channels-last path and the outputs' strides follow the input, as in eager."""
    conv = torch.nn.Conv2d(8, 8, 3, padding=1).cuda()

    def f(x, m):
        y = x * 2 if x.is_contiguous() else x * 3
        return y @ m

    def c(x):
        return torch.relu(conv(x))

    g, gc = graphjit.graphed(f), graphjit.graphed(c)
    with torch.no_grad():
        for i in range(8):
            x, m = torch.randn(64, 64, device="cuda"), torch.randn(64, 64, device="cuda")
            arg = x.t() if i % 2 else x
            out = g(arg, m)
            assert rel(out, f(arg, m)) < 1e-6 and out.stride() == f(arg, m).stride(), i
            img = torch.randn(2, 8, 16, 16, device="cuda")
            img = img.to(memory_format=torch.channels_last) if i % 2 else img
            got, want = gc(img), c(img)
            assert rel(got, want) < 1e-5 and got.stride() == want.stride(), i
    for h in (g, gc):
        s = h.stats()
        assert s["graphs"] == 2 and s["replays"] >= 4 and not s["fallbacks"], s
