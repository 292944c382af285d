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
    return list(g._self_state.fed.values())


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


def test_fed_checks_the_kind_and_feed_copies_in_and_back():
    """:class:`Fed` and :class:`Feed` alone, on plain tensors: a tensor of the kind is valid, copied in before the
    replay and back after (a write of the graph reaches the caller's); another kind, a view, or a tensor the graph
    holds otherwise is not valid and copies nothing; an argument the graph writes is refused; graphjit's tensor is
    bound only inside :meth:`Fed.bound`, and the caller's again inside :meth:`Fed.callers`."""
    from graphjit.backends.torch.graphs import TorchBackend
    from graphjit.warmup import Warmup

    b = TorchBackend()
    holder = type("H", (), {})()
    holder.t = torch.zeros(3)
    other = torch.ones(3)
    fed = renewals.Fed(b, [(renewals.Place(holder, "t", True, ("h", (".", "t"))), holder.t)], [other])
    (mine,) = fed.tensors
    taken = frozenset({id(other)})
    feed = renewals.Feed(fed, [0], taken, [other])
    theirs = holder.t = torch.full((3,), 2.0)
    assert fed.valid([0], taken) and feed.fill([torch.zeros(3)]) and torch.equal(mine, theirs)
    mine.add_(1.0)  # the replay writes graphjit's tensor
    feed.back()
    assert holder.t is theirs and torch.equal(theirs, torch.full((3,), 3.0))
    assert not feed.fill([theirs]) and feed.refused == renewals.ALIASED  # an argument the graph writes
    base = torch.zeros(6)
    for bad in (torch.zeros(4), torch.zeros(3, dtype=torch.float64), other, None, base[:3]):
        holder.t = bad
        mine.fill_(-1.0)
        assert not fed.valid([0], taken) and not feed.fill([torch.zeros(3)]) and feed.refused == renewals.CHANGED
        assert torch.equal(mine, torch.full((3,), -1.0))
    holder.t = theirs
    with fed.bound(Warmup(), True, []):
        assert holder.t is mine and torch.equal(mine, theirs)
        with fed.callers():
            assert holder.t is theirs
        assert holder.t is mine
    assert holder.t is theirs
    for unbound in (other, base[:3]):  # a tensor the graph holds otherwise, a view: never bound in its stead
        holder.t = unbound
        with fed.bound(Warmup(), True, []):
            assert holder.t is unbound


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


def _eager_equal(make, calls, before=lambda i, m: None):
    """``make()`` twice, one graphed: each call equal to eager (outputs and ``state(m)``), with ``before(i, m)`` run on
    both first; the graphed function."""
    m, r = make(), make()
    g = graphjit.graphed(m)
    with torch.no_grad():
        for i in range(calls):
            before(i, m)
            before(i, r)
            got, want = g(torch.ones(4)), r(torch.ones(4))
            for a, b in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
                assert torch.equal(a, b), (i, a, b, g.report())
            assert all(torch.equal(a, b) for a, b in zip(m.state(), r.state())), (i, g.report())
    return g, m


class _Counter(torch.nn.Module):
    """Counts its calls in a tensor it writes; reads ``delta``, which the caller may point at the counter."""

    def __init__(self):
        super().__init__()
        self.count = torch.zeros(4)
        self.delta = torch.zeros(4)

    def forward(self, x):
        self.count.add_(1)
        return x + self.delta

    def state(self):
        return [self.count, self.delta]


def test_a_tensor_rebound_to_state_the_graph_writes_is_not_fed(emu):
    """``m.delta = m.count`` (a tensor the call writes): graphjit's copy would miss the call's write, so it is not
    fed: every call equals eager (before the fix: off by one on every call)."""

    def before(i, m):
        if i == 3:
            m.delta = torch.full((4,), 5.0)
        if i == 6:
            m.delta = m.count

    g, _m = _eager_equal(_Counter, 10, before)
    assert g.stats()["replays"] >= 3, g.report()


class _Picky(torch.nn.Module):
    """Takes a fast path when its bias is its default tensor (compared by identity)."""

    def __init__(self):
        super().__init__()
        self.default = torch.zeros(4)
        self.bias = self.default
        self.pre = torch.full((4,), 100.0)

    def forward(self, x):
        if self.bias is self.default:
            return x + self.pre
        return x + self.bias

    def state(self):
        return []


@pytest.mark.parametrize("others", ["kept", "forgotten"])
def test_code_that_compares_the_tensor_by_identity_equals_eager(emu, monkeypatch, others):
    """``if self.bias is self.default`` after a custom bias was fed: the default (a tensor the graph holds otherwise)
    is never bound in the fed place's stead (``kept``); where graphjit did not know it (``forgotten``), verify's
    eager reference, run with the caller's tensor there, tells the graph apart and the key runs uncaptured."""
    if others == "forgotten":
        real = renewals.Fed.__init__

        def init(self, *args, **kwargs):
            real(self, *args, **kwargs)
            self.others = frozenset()

        monkeypatch.setattr(renewals.Fed, "__init__", init)

    def before(i, m):
        if i == 3:
            m.bias = torch.full((4,), 1.0)
        if i == 5:
            m.bias = torch.full((4,), 2.0)
        if i == 7:
            m.bias = m.default

    g, _m = _eager_equal(_Picky, 16, before)
    assert _renewed(g), g.report()
    if others == "forgotten":
        assert "verify failed" in g.stats()["fallbacks"], g.report()


class _Remembers(torch.nn.Module):
    """Keeps the tensor it read in an island (run eagerly on every replay), or returns it."""

    def __init__(self):
        super().__init__()
        self.delta = torch.zeros(4)
        self.seen = None
        self.scale = 1.0

    def forward(self, x):
        h = _remember(self, x + 1)
        return h * self.scale + self.delta, self.delta

    def state(self):
        return [self.delta]


@graphjit.eager
def _remember(m, h):
    m.seen = m.delta
    return h * 1.0


def test_python_that_runs_during_replays_or_warmups_only_finds_the_callers_tensor(emu):
    """An island that stores ``m.delta`` (Python on every replay), and a read value changed after the renewal (its
    warmups run eagerly): the tensor stored and the tensor returned are the caller's, never graphjit's."""

    def before(i, m):
        if i in (3, 6, 9):
            m.delta = torch.full((4,), float(i))
        if i == 7:
            m.scale = 2.0

    g, m = _eager_equal(_Remembers, 12, before)
    assert m.seen is m.delta
    _y, d = g(torch.ones(4))
    assert d is m.delta or torch.equal(d, m.delta)
    mine = {id(t) for f in _parts(g) for t in f.tensors}
    assert id(m.seen) not in mine and id(d) not in mine


class _Norm(torch.nn.Module):
    """batch_norm's running mean (written without a version bump) on a plain attribute, updated when ``update``; its
    running variance a buffer (where graphjit compares contents for such writes)."""

    def __init__(self):
        super().__init__()
        self.rm = torch.zeros(4)
        self.register_buffer("rv", torch.ones(4))
        self.update = False

    def forward(self, x):
        return torch.nn.functional.batch_norm(x.view(1, 4).expand(8, 4) * torch.arange(8.0).view(8, 1),
                                              self.rm, self.rv, training=self.update, momentum=0.5)

    def state(self):
        return [self.rm, self.rv]


def test_a_fed_tensor_a_later_value_makes_the_call_write_is_written_in_the_callers(emu):
    """``m.rm = loaded`` (fed), then ``m.update = True`` (a key of that value, whose calls write ``rm`` with a kernel
    that moves no version counter, seen by its contents): that key's graph reads the caller's tensor itself; every
    call's writes reach the caller's tensor, as eagerly."""

    def before(i, m):
        if i == 3:
            m.rm = torch.full((4,), 0.5)
        if i == 6:
            m.update = True

    g, _m = _eager_equal(_Norm, 12, before)
    assert _renewed(g) and not g.stats()["fallbacks"], g.report()


class _Bumps(torch.nn.Module):
    """Writes its argument in place, then reads ``delta``, which the caller may point at that argument."""

    def __init__(self):
        super().__init__()
        self.delta = torch.zeros(4)

    def forward(self, x):
        x.add_(1.0)
        return x + self.delta


def test_a_fed_tensor_that_is_an_argument_the_call_writes_runs_uncaptured(emu):
    """After ``delta`` was fed: ``m.delta = x`` where the call writes ``x`` in place (graphjit's copy, made before the
    replay, would miss the write) runs uncaptured with its reason; a view of ``x`` (sharing its memory) is not fed
    at all; a fresh tensor is fed again.  Each call equals eager, outputs and arguments."""
    m, r = _Bumps(), _Bumps()
    g = graphjit.graphed(m)
    with torch.no_grad():
        for i in range(14):
            x_m, x_r = torch.full((4,), float(i)), torch.full((4,), float(i))
            for net, x in ((m, x_m), (r, x_r)):
                net.delta = torch.full((4,), float(10 * i))
                if i in (8, 10):
                    net.delta = x
                if i == 12:
                    net.delta = x.view(4)  # a view of the argument
            got, want = g(x_m), r(x_r)
            assert torch.equal(got, want) and torch.equal(x_m, x_r), (i, got, want, g.report())
    st = g.stats()
    assert st["fallbacks"].get(renewals.ALIASED) == 2, g.report()
    assert any(k["captures"] >= 2 for k in st["keys"]) and st["replays"] >= 7, g.report()  # (x moved: recaptured)


class _Tied(torch.nn.Module):
    """Tells its two tensors apart by identity (tied weights), and compares one with its argument."""

    def __init__(self):
        super().__init__()
        self.a = torch.zeros(4)
        self.b = torch.zeros(4)

    def forward(self, x):
        if self.a is self.b:
            return x * self.a
        if self.a is x:
            return x * 0.0
        return x + self.a + self.b

    def state(self):
        return [self.a, self.b]


def test_code_that_tells_fed_tensors_and_arguments_apart_by_identity_equals_eager(emu):
    """After ``a`` and ``b`` were fed: ``m.a = m.b = t`` (one tensor at two places) and ``m.a = x`` (the call's
    argument) run uncaptured with their reason (the graph was captured with graphjit's two tensors there); each call
    equals eager."""
    m, r = _Tied(), _Tied()
    g = graphjit.graphed(m)
    with torch.no_grad():
        for i in range(14):
            x_m, x_r = torch.full((4,), 1.0 + i), torch.full((4,), 1.0 + i)
            for net, x in ((m, x_m), (r, x_r)):
                if 3 <= i < 8:
                    net.a, net.b = torch.full((4,), float(i)), torch.full((4,), -float(i))
                elif i in (8, 9):
                    net.a = net.b = torch.full((4,), float(i))
                elif i >= 10:
                    net.a = x
            assert torch.equal(g(x_m), r(x_r)), (i, g.report())
    st = g.stats()
    assert st["fallbacks"].get(renewals.ALIASED, 0) >= 4 and any(k["captures"] == 2 for k in st["keys"]), g.report()


def test_a_fed_tensor_over_the_memory_of_an_argument_the_call_writes_equals_eager(emu):
    """``x, m.delta = torch.from_numpy(a), torch.from_numpy(a)`` (two tensors over one memory, two storages as torch
    counts them) where the call writes ``x``: graphjit's copy would miss the write and the copy back would undo it;
    the call runs uncaptured, equal to eager."""
    np = pytest.importorskip("numpy")
    m, r = _Bumps(), _Bumps()
    g = graphjit.graphed(m)
    with torch.no_grad():
        for i in range(12):
            arrays = [np.full(4, 10.0 * i, dtype=np.float32) for _ in range(2)]
            xs = []
            for net, arr in zip((m, r), arrays):
                x = torch.from_numpy(arr)
                net.delta = torch.from_numpy(arr) if i >= 8 else torch.full((4,), float(i))
                xs.append(x)
            assert torch.equal(g(xs[0]), r(xs[1])) and torch.equal(xs[0], xs[1]), (i, g.report())
    assert g.stats()["fallbacks"].get(renewals.ALIASED) == 4, g.report()


def _fed_shifted():
    """A graphed :class:`_Shifted` whose ``delta`` was rebound three times, three calls each (so it is fed), and the
    input its calls take."""
    m = _Shifted()
    g = graphjit.graphed(m)
    x = torch.ones(2, 4)
    with torch.no_grad():
        for gen in range(3):
            m.delta = torch.full((1, 4), float(gen))
            for _ in range(3):
                g(x)
    return m, g, x


def test_a_replay_leaves_the_callers_version_counter_and_autograd_as_eager(emu):
    """A fed tensor the graph only reads, saved by autograd before the call: the copies around the replay move its
    version counter no more than an eager run would, so a backward through it still works."""
    m, g, x = _fed_shifted()
    assert _renewed(g)
    w = torch.ones(1, 4, requires_grad=True)
    m.delta = torch.full((1, 4), 5.0)
    saved = w * m.delta  # autograd saves m.delta
    version = m.delta._version
    with torch.no_grad():
        assert torch.equal(g(x), m.lin(x) + m.delta)
    assert m.delta._version == version
    saved.sum().backward()
    assert torch.equal(w.grad, torch.full((1, 4), 5.0))


def test_an_inference_tensor_put_at_a_fed_place_is_not_fed(emu):
    """After the renewal, a tensor made under ``torch.inference_mode()`` at the place (no version counter, takes no
    copy outside inference mode): not fed, each call equals eager."""
    m, g, x = _fed_shifted()
    for gen in range(3):
        with torch.inference_mode():
            m.delta = torch.full((1, 4), 7.0 + gen)
        with torch.no_grad():
            assert torch.equal(g(x), m.lin(x) + m.delta), g.report()


class _Halves(torch.nn.Module):
    """Reads ``delta``; once ``update`` is set, halves it in place first (an ordinary, counted write)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(4, 4)
        self.delta = torch.zeros(4)
        self.update = False

    def forward(self, x):
        if self.update:
            self.delta.mul_(0.5)
        return self.lin(x) + self.delta


def test_a_key_of_other_values_that_writes_the_fed_tensor_is_never_fed(emu):
    """``delta`` fed to the key of ``update=False``; then ``update=True`` (a key of that value whose calls halve
    ``delta``) with ``delta`` rebound before every call: that key's capture would write graphjit's tensor, so it runs
    uncaptured with its reason; outputs, state and version counters equal eager's, so a backward through a tensor
    autograd saved before the call fails as it does eagerly."""
    m, r = _Halves(), _Halves()
    g = graphjit.graphed(m)
    x = torch.ones(2, 4)
    for i in range(14):
        for net in (m, r):
            net.delta = torch.full((4,), float(i))
            net.update = net.update or i == 6
        with torch.no_grad():
            got, want = g(x), r(x)
        assert torch.equal(got, want) and torch.equal(m.delta, r.delta), (i, g.report())
        assert m.delta._version == r.delta._version, (i, g.report())
    assert _renewed(g) and g.stats()["fallbacks"].get(renewals.WRITTEN), g.report()


def test_an_argument_moved_under_the_same_object_is_still_seen_over_the_fed_tensor(emu):
    """The call writes its argument in place (fresh ones first, so graphjit copies it through a buffer of its own);
    then the caller passes one object ``X`` every call, and after ``delta`` is fed moves ``X`` onto memory ``delta``
    also lies over (``X.set_(torch.from_numpy(a))``, ``m.delta = torch.from_numpy(a)``): the overlap is seen on that
    call (not a span kept from an earlier one); equal to eager."""
    np = pytest.importorskip("numpy")
    m, r = _Bumps(), _Bumps()
    g = graphjit.graphed(m)
    kept = {m: torch.zeros(4), r: torch.zeros(4)}
    with torch.no_grad():
        for i in range(14):
            xs = []
            for net in (m, r):
                x = torch.full((4,), float(i)) if i < 7 else kept[net]
                net.delta = torch.full((4,), float(i))
                if i == 11:
                    arr = np.full(4, 3.0, dtype=np.float32)
                    x.set_(torch.from_numpy(arr))
                    net.delta = torch.from_numpy(arr)
                xs.append(x)
            assert torch.equal(g(xs[0]), r(xs[1])) and torch.equal(xs[0], xs[1]), (i, g.report())
    assert g.stats()["fallbacks"].get(renewals.ALIASED), g.report()


class _Scales(torch.nn.Module):
    """Once ``update`` is set, halves ``delta`` through ``.data`` (a write no counter tells); reads ``other``."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(4, 4)
        self.delta, self.other, self.update = torch.zeros(4), torch.zeros(4), False

    def forward(self, x):
        if self.update:
            self.delta.data.mul_(0.5)
        return self.lin(x) + self.other


def test_fed_tensors_over_one_memory_equal_eager(emu):
    """``delta`` and ``other`` fed, a key of ``update=True`` writing ``delta`` through ``.data``; then both set over one
    array (``torch.from_numpy`` twice): the graph's write to one would not show in the other's copy, so those calls
    run uncaptured; outputs and state equal eager's."""
    np = pytest.importorskip("numpy")
    m, r = _Scales(), _Scales()
    g = graphjit.graphed(m)
    x = torch.ones(2, 4)
    with torch.no_grad():
        for i in range(16):
            for net in (m, r):
                net.update = net.update or i == 6
                if i >= 11:
                    arr = np.full(4, float(i), dtype=np.float32)
                    net.delta, net.other = torch.from_numpy(arr), torch.from_numpy(arr)
                else:
                    net.delta, net.other = torch.full((4,), float(i)), torch.full((4,), float(i) + 0.5)
            assert torch.equal(g(x), r(x)) and torch.equal(m.other, r.other), (i, g.report())
    assert g.stats()["fallbacks"].get(renewals.ALIASED), g.report()
