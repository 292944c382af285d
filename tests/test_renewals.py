"""Tensors the caller rebinds where the function reads them (graphjit/renewals.py), through the emulated CUDA graph
(a replay reads the tensors the capture recorded, as a real graph reads their addresses): after the first rebinding
the key reads graphjit's own tensor, filled from the caller's before each call; every call equals eager, the
caller's tensors are never written, and what graphjit cannot feed keeps a graph per tensor."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import graphjit  # noqa: E402
from graphjit import renewals  # noqa: E402

pytestmark = pytest.mark.torch


class _Shifted(torch.nn.Module):
    """Keeps a tensor it is given anew on itself (Qwen2-VL's ``rope_deltas`` before transformers 5.20)."""

    def __init__(self, write: bool = False, give: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(4, 4)
        self.delta = None
        self.write = write
        self.give = give

    def forward(self, x):
        if self.write:
            self.delta.mul_(0.5)
        y = self.lin(x) + (self.delta if self.delta is not None else 0.0)
        return (y, self.delta) if self.give else y


def _key(g):
    (key,) = [k for k in g.stats()["keys"] if k["state"] == "replay"]
    return key


def _renewed(g) -> bool:
    return any((k["reason"] or "").startswith(renewals.REASON) for k in g.stats()["keys"])


def test_a_tensor_rebound_before_every_few_calls_is_fed_to_one_graph(emu):
    """``m.delta = new`` before every five calls, twelve times (before: a graph per tensor, each keeping its tensor,
    and after eight of them the calls ran uncaptured): one graph, captured twice; between calls ``m.delta`` is the
    caller's own tensor, which is never written."""
    m = _Shifted()
    g = graphjit.graphed(m)
    kept = []
    for gen in range(12):
        m.delta = torch.full((1, 4), float(gen))
        kept.append((m.delta, m.delta.clone()))
        for step in range(5):
            x = torch.ones(2, 4) * step
            with torch.no_grad():
                assert torch.equal(g(x), m.lin(x) + m.delta), (gen, step, g.report())
            assert m.delta is kept[-1][0]
    for t, was in kept:
        assert torch.equal(t, was)
    key = _key(g)
    assert g.stats()["graphs"] == 1 and key["captures"] == 2 and not g.stats()["fallbacks"], g.report()
    assert key["replays"] == 60 - 2, g.report()  # all but the two warmup calls (a capture's result is its replay's)
    assert key["reason"] == f"{renewals.REASON}: self.delta", key


def test_a_fed_tensor_written_in_place_between_calls_is_read_anew(emu):
    """After the renewal, the caller fills its tensor in place: every call reads the values it has then."""
    m = _Shifted()
    g = graphjit.graphed(m)
    x = torch.ones(2, 4)
    with torch.no_grad():
        for gen in range(2):
            m.delta = torch.zeros(1, 4)
            for step in range(4):
                m.delta.fill_(float(step + gen))
                assert torch.equal(g(x), m.lin(x) + m.delta), (gen, step, g.report())
    assert _renewed(g) and g.stats()["replays"] >= 4, g.report()


def test_a_returned_fed_tensor_comes_back_as_the_callers_values(emu):
    """The function returns the tensor it read (Qwen2-VL returns ``rope_deltas``): the caller gets its values, never
    graphjit's tensor, which the next call fills again."""
    m = _Shifted(give=True)
    g = graphjit.graphed(m)
    x = torch.ones(2, 4)
    outs = []
    with torch.no_grad():
        for gen in range(3):
            m.delta = torch.full((1, 4), float(gen))
            for _ in range(3):
                y, d = g(x)
                assert torch.equal(y, m.lin(x) + m.delta) and torch.equal(d, m.delta)
                outs.append((d, float(gen)))
    assert all(torch.equal(d, torch.full((1, 4), v)) for d, v in outs)
    mine = {id(t) for p in _parts(g) for t in p.tensors}
    assert mine and not any(id(d) in mine for d, _v in outs)


def _parts(g):
    state = g._self_state
    return [p for step in state.step_feeds.values() if step is not None for p in step.parts
            if isinstance(p, renewals.Renewed)]


@pytest.mark.parametrize("where", ["closure", "global"])
def test_a_closure_or_global_tensor_rebound_is_fed(emu, where):
    """``nonlocal w; w = new`` and ``global W; W = new``: fed the same way, equal to eager on every call."""
    torch.manual_seed(0)
    w = torch.randn(4, 4)

    def by_closure(x):
        return torch.tanh(x @ w)

    def by_global(x):
        return torch.tanh(x @ GLOBAL_W)

    fn = by_closure if where == "closure" else by_global
    g = graphjit.graphed(fn)
    x = torch.randn(3, 4)
    for gen in range(6):
        new = torch.randn(4, 4)
        if where == "closure":
            w = new
        else:
            globals()["GLOBAL_W"] = new
        for _ in range(3):
            assert torch.allclose(g(x), torch.tanh(x @ new)), (gen, g.report())
    assert _renewed(g) and g.stats()["graphs"] == 1 and _key(g)["captures"] == 2, g.report()


GLOBAL_W = torch.randn(4, 4)


def test_a_tensor_the_function_writes_keeps_a_graph_per_tensor(emu):
    """``self.delta.mul_(0.5)`` in the function: never fed (the caller's tensor must take the write); each rebinding
    is another graph's, as before, and state equals eager's."""
    m, ref = _Shifted(write=True), _Shifted(write=True)
    g = graphjit.graphed(m)
    x = torch.ones(2, 4)
    with torch.no_grad():
        for gen in range(3):
            m.delta, ref.delta = torch.full((1, 4), float(gen)), torch.full((1, 4), float(gen))
            for _ in range(4):
                assert torch.equal(g(x), ref(x)) and torch.equal(m.delta, ref.delta), g.report()
    assert not _renewed(g) and g.stats()["graphs"] == 3, g.report()


@pytest.mark.parametrize("other", ["shape", "dtype", "requires_grad", "none"])
def test_a_tensor_of_another_kind_is_not_fed(emu, other):
    """Another shape, dtype, a tensor that requires grad, or None: a graph (or an uncaptured run) of its own, equal to
    eager; never a copy into graphjit's tensor."""
    m = _Shifted()
    g = graphjit.graphed(m)
    x = torch.ones(2, 4)
    with torch.no_grad():
        m.delta = torch.zeros(1, 4)
        for _ in range(3):
            g(x)
        m.delta = {"shape": torch.ones(2, 4), "dtype": torch.ones(1, 4, dtype=torch.float64),
                   "requires_grad": torch.ones(1, 4, requires_grad=True), "none": None}[other]
        for _ in range(4):
            want = m.lin(x) + (m.delta if m.delta is not None else 0)
            assert torch.allclose(g(x), want), (other, g.report())
    assert not _renewed(g), g.report()


def test_a_slot_and_a_dict_rebuilt_every_call_are_not_fed(emu):
    """A tensor in an object's ``__slots__`` (no ``__dict__`` entry graphjit could bind without the owner's code) and
    an entry of a dict rebound before every call (a place read again where its parent holds it): a graph per tensor,
    as before, equal to eager."""

    class Slotted:
        __slots__ = ("d",)

    p = Slotted()
    p.d = torch.zeros(4)
    box = type("Box", (), {})()
    box.cfg = {"w": torch.zeros(4)}
    g1 = graphjit.graphed(lambda x: x + p.d)
    g2 = graphjit.graphed(lambda x: x * box.cfg["w"])
    x = torch.ones(4)
    for gen in range(4):
        p.d = torch.full((4,), float(gen))
        for i in range(3):
            box.cfg = {"w": torch.full((4,), float(gen + i))}
            assert torch.equal(g1(x), x + p.d) and torch.equal(g2(x), x * box.cfg["w"])
    assert not _renewed(g1) and not _renewed(g2), (g1.report(), g2.report())
    assert g1.stats()["graphs"] >= 2, g1.report()


def test_a_call_that_writes_the_fed_tensor_writes_the_callers_too():
    """:class:`Renewed` alone, on plain tensors: a write inside the call (code its warmups did not run) reaches the
    caller's tensor at the call's end, and after every replay from then on."""
    from graphjit.backends.torch.graphs import TorchBackend

    b = TorchBackend()
    holder = type("H", (), {})()
    holder.t = torch.zeros(3)
    mine = torch.zeros(3)
    part = renewals.Renewed(b, [(renewals.Place(holder, "t", True, ("h", (".", "t"))), holder.t, mine)])
    theirs = holder.t = torch.full((3,), 2.0)
    part.enter()
    assert holder.t is mine and torch.equal(mine, theirs)
    holder.t.add_(1.0)  # the call writes what it finds there
    part.exit()
    assert holder.t is theirs and torch.equal(theirs, torch.full((3,), 3.0)) and part.writes
    part.enter()
    mine.add_(1.0)  # a replay's write: no version counter moves
    part.replayed()
    part.exit()
    assert torch.equal(theirs, torch.full((3,), 4.0))
    holder.t = None  # another kind of value: left in place
    part.enter()
    assert holder.t is None
    part.exit()
    assert holder.t is None


def test_writable_places():
    class Slots:
        __slots__ = ("t",)

    class Prop:
        t = property(lambda self: 1)

    plain = type("P", (), {})()
    plain.t = 1
    cell = (lambda: plain).__closure__[0]
    assert renewals.writable(plain, "t", True) and renewals.writable(cell, "cell_contents", True)
    assert renewals.writable({"t": 1}, "t", False) and renewals.writable([1], 0, False)
    s = Slots()
    s.t = 1
    assert not renewals.writable(s, "t", True) and not renewals.writable(Prop(), "t", True)
    assert not renewals.writable(type(plain), "t", True) and not renewals.writable((1,), 0, False)
    assert not renewals.writable(plain, "missing", True)

    class Proxy:
        def __getattribute__(self, name):
            return object.__getattribute__(self, name)

    proxy = Proxy()
    proxy.t = 1
    assert not renewals.writable(proxy, "t", True)


def test_a_buffer_rebound_is_fed_and_the_module_keeps_the_callers(emu):
    """``m.register_buffer("delta", ...)`` then ``m.delta = new`` between calls (held by identity: where Paddle keeps
    any tensor set on a Layer): fed the same way; between calls the buffer, and the state dict, are the caller's."""
    m = _Shifted()
    del m.delta
    m.register_buffer("delta", torch.zeros(1, 4))
    g = graphjit.graphed(m)
    x = torch.ones(2, 4)
    with torch.no_grad():
        for gen in range(10):
            mine = m.delta = torch.full((1, 4), float(gen))
            for _ in range(3):
                assert torch.equal(g(x), m.lin(x) + mine), (gen, g.report())
                assert m.delta is mine and m.state_dict(keep_vars=True)["delta"] is mine
    assert _renewed(g) and g.stats()["graphs"] == 1 and not g.stats()["fallbacks"], g.report()
