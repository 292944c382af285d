"""Module hooks registered or removed after a capture (graphjit/module_hooks.py): every call equals the same call
run eagerly, through the emulated CUDA graph (tests/graph_emulator.py: a replay runs no Python, so a stale graph
would skip a new hook, as a real one does).  The hooks' state is a read value: a graph of the new hooks is captured
once they settle, the old graph serves again once they are gone, and a hook registered elsewhere (a tensor's) costs
a comparison, not a graph."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import graphjit  # noqa: E402
from graphjit import guards  # noqa: E402
from graphjit.backends import get  # noqa: E402

pytestmark = pytest.mark.torch


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 4))


def _calls(m, f, x, n, change=None, at=None):
    """``n`` calls of ``f`` (graphed ``m``), ``change()`` before call ``at``; each checked against ``m(x)``."""
    with torch.no_grad():
        for i in range(n):
            if i == at:
                change()
            got, want = f(x), m(x)
            assert torch.allclose(got, want), (i, got, want, f.report())


@pytest.mark.parametrize("where", ["submodule", "graphed module", "pre-hook", "global"])
def test_a_hook_registered_after_the_capture_runs_and_gets_its_own_graph(emu, where):
    m, x = _model(), torch.randn(2, 4)
    f = graphjit.graphed(m)
    handles = []

    def hook(mod, a, out):
        return out * 0 + 5

    def register():
        if where == "submodule":
            handles.append(m[0].register_forward_hook(hook))
        elif where == "graphed module":
            handles.append(m.register_forward_hook(hook))
        elif where == "pre-hook":
            handles.append(m[2].register_forward_pre_hook(lambda mod, a: (a[0] * 0 + 1,)))
        else:
            handles.append(torch.nn.modules.module.register_module_forward_hook(hook))

    try:
        _calls(m, f, x, 4)
        assert f.stats()["graphs"] == 1 and f.stats()["replays"] >= 2
        _calls(m, f, x, 5, register, at=0)
        st = f.stats()
        assert st["graphs"] == 2 and st["replays"] >= 4, f.report()  # the hooked graph, captured and replayed
        replays = st["replays"]
        handles.pop().remove()
        _calls(m, f, x, 2)  # the first graph again
        assert f.stats()["graphs"] == 2 and f.stats()["replays"] == replays + 2, f.report()
    finally:
        for h in handles:
            h.remove()


def test_a_hook_present_at_capture_and_removed_is_not_replayed(emu):
    m, x = _model(), torch.randn(2, 4)
    h = m[0].register_forward_hook(lambda mod, a, out: out * 0 + 5)
    f = graphjit.graphed(m)
    _calls(m, f, x, 4)
    _calls(m, f, x, 4, h.remove, at=0)


def test_the_reason_names_the_hook_dict(emu):
    m, x = _model(), torch.randn(2, 4)
    f = graphjit.graphed(m)
    _calls(m, f, x, 4)
    handles = []
    try:
        for _ in range(4):  # a new hook on every call: its values never settle, so it runs uncaptured
            handles.append(m[2].register_forward_hook(lambda mod, a, out: out + 1))
            _calls(m, f, x, 1)
        reasons = [r for r in f.stats()["fallbacks"] if r.startswith(guards.REASON)]
        assert reasons and "_forward_hooks" in reasons[0], f.stats()["fallbacks"]
    finally:
        for h in handles:
            h.remove()


def test_a_hook_registered_elsewhere_costs_no_graph(emu):
    m, x = _model(), torch.randn(2, 4)
    f = graphjit.graphed(m)
    _calls(m, f, x, 3)
    replays = f.stats()["replays"]
    other = torch.ones(2, requires_grad=True)
    for _ in range(4):  # a tensor hook moves torch's count of hook registrations on every call
        other.register_hook(lambda g: g)
        _calls(m, f, x, 1)
    st = f.stats()
    assert st["graphs"] == 1 and st["replays"] == replays + 4 and not st["fallbacks"], f.report()


def test_the_compile_tracer_gets_a_graph_of_the_new_hook(emu):
    """Dynamo compiles the call again with the hook (its own guards), and graphjit captures that program."""
    m, x = _model(), torch.randn(2, 4)
    f = graphjit.graphed(m, tracer="compile")
    _calls(m, f, x, 4)
    h = m[0].register_forward_hook(lambda mod, a, out: out * 0 + 5)
    try:
        _calls(m, f, x, 4)
        assert f.stats()["graphs"] == 2 and "_forward_hooks=1 hook" in f.report(), f.report()
    finally:
        h.remove()


def test_the_watch_holds_until_a_hook_changes():
    from graphjit.module_hooks import HookWatch

    m = _model()
    b = get("torch")
    count = b.hook_count()
    assert count is not None
    found = [(getattr(m[0], n), ("m", (".", n))) for n in b.hook_holders] + b.global_hooks()
    w = HookWatch(found, count)
    assert w.holds() and not list(w.differences())
    torch.ones(1, requires_grad=True).register_hook(lambda g: g)  # elsewhere: the count moves, the dicts do not
    assert w.holds()
    h = m[0].register_forward_pre_hook(lambda mod, a: None)
    assert not w.holds()
    assert list(w.differences()) == [("m._forward_pre_hooks", "0 hooks", "1 hook")]
    h.remove()
    assert w.holds() and w.state() == w.expected


def test_paddle_layers_hooks_are_watched_too():
    """Paddle's side (its graphs need a GPU: tests/test_gpu_guards_paddle.py): the scan collects a Layer's hook dicts
    and Paddle counts hook registrations, so a post-hook registered after a capture fails the watch."""
    paddle = pytest.importorskip("paddle")
    from graphjit.module_hooks import watch

    b = get("paddle")
    layer = paddle.nn.Sequential(paddle.nn.Linear(4, 4), paddle.nn.ReLU())
    src = guards.Sources(objects=[("self", layer)], slots=[], names=frozenset())
    found = guards.scan(src, lambda v: isinstance(v, paddle.Tensor), None, b.tensor_holders, None, b.module_holders,
                        b.renewed_attributes, b.hook_holders).hooks
    assert len(found) == 3 * len(b.hook_holders), found  # the Sequential's and its two layers'
    w = watch(found, b)
    assert w is not None and w.holds()
    h = layer[0].register_forward_post_hook(lambda lay, inputs, out: out)
    assert not w.holds()
    assert any("_forward_post_hooks" in path for path, _old, _new in w.differences())
    h.remove()
    assert w.holds()


class _Named(torch.nn.Module):
    """Runs its layers by computed names and through ``children()``: no code names ``layer1`` or the Sequential."""

    def __init__(self):
        super().__init__()
        self.layer0, self.layer1 = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
        self.rest = torch.nn.Sequential(torch.nn.ReLU())

    def forward(self, x):
        for i in range(2):
            x = getattr(self, f"layer{i}")(x)
        for c in self.rest.children():
            x = c(x)
        return x


@pytest.mark.parametrize("target", ["layer1", "rest.0"])
def test_a_hook_on_a_submodule_the_code_does_not_name_is_watched(emu, target):
    torch.manual_seed(0)
    m, x = _Named(), torch.randn(2, 4)
    f = graphjit.graphed(m)
    _calls(m, f, x, 4)
    h = m.get_submodule(target).register_forward_hook(lambda mod, a, out: out * 0 + 5)
    try:
        _calls(m, f, x, 5)
        assert f.stats()["graphs"] == 2, f.report()
    finally:
        h.remove()


def test_removing_a_hook_present_at_capture_gets_a_graph_with_the_compile_tracer_too(emu):
    m, x = _model(), torch.randn(2, 4)
    h = m[0].register_forward_hook(lambda mod, a, out: out * 0 + 5)
    f = graphjit.graphed(m, tracer="compile")
    _calls(m, f, x, 4)
    _calls(m, f, x, 6, h.remove, at=0)
    st = f.stats()
    assert st["graphs"] == 2 and not st["fallbacks"], f.report()  # captured again, not uncaptured for good


def test_a_watch_that_failed_does_not_compare_every_dict_again_until_something_changes():
    from graphjit.module_hooks import HookWatch

    m = _model()
    b = get("torch")
    found = [(getattr(mod, n), (f"m[{i}]", (".", n))) for i, mod in enumerate(m) for n in b.hook_holders]
    w = HookWatch(found, b.hook_count())
    h = m[1].register_forward_hook(lambda mod, a, out: out)
    assert not w.holds()
    failed = w.failed
    assert failed is not None and [d for d, _n in failed[1]] == [m[1]._forward_hooks]
    assert not w.holds() and w.failed is failed  # the same failure, not compared again
    h.remove()
    assert w.holds() and w.failed is None


def test_a_graphed_forwards_own_module_hooks_run_outside_it_and_cost_no_graph(emu):
    """``@graphjit.graphed`` on ``forward``: ``Module.__call__`` runs the module's own hooks around the graphed
    ``forward``, so a hook there changes nothing in its graph; a submodule's hook does."""

    class Dec(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.a = torch.nn.Linear(4, 4)

        @graphjit.graphed
        def forward(self, x):
            return self.a(x)

    m, x = Dec(), torch.randn(2, 4)
    handles = []
    try:
        with torch.no_grad():
            for _ in range(4):
                m(x)
            handles.append(m.register_forward_hook(lambda mod, a, out: out + 1))
            want = m.a(x) + 1
            for _ in range(3):
                assert torch.allclose(m(x), want)
            st = Dec.forward.stats()
            assert st["graphs"] == 1 and not st["fallbacks"], st
            handles.append(m.a.register_forward_hook(lambda mod, a, out: out * 0))
            for _ in range(4):
                assert torch.allclose(m(x), torch.ones_like(want))
            assert Dec.forward.stats()["graphs"] == 2
    finally:
        for h in handles:
            h.remove()


def test_a_graphed_method_that_calls_its_module_watches_the_modules_hooks(emu):
    """``@graphed def step(self, x): return self(x)``: ``self``'s hooks run inside the graph (only ``forward``'s run
    around it), so one registered after the capture is watched."""

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.a = torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.a(x)

        @graphjit.graphed
        def step(self, x):
            return self(x) * 2

    m, x = Net(), torch.randn(2, 4)
    with torch.no_grad():
        for _ in range(4):
            m.step(x)
        h = m.register_forward_hook(lambda mod, a, out: out * 0 + 1)
        try:
            for i in range(5):
                assert torch.allclose(m.step(x), torch.full((2, 4), 2.0)), (i, Net.step.report())
            assert Net.step.stats()["graphs"] == 2
        finally:
            h.remove()


RECORDED: list = []  # a forward hook's store at module level (the hook's own global)
TALLY = {"n": 0}


def _global_hook(mod, inp, out):
    RECORDED.append(out.detach().clone())


def _counting_hook(mod, inp, out):
    TALLY["n"] += 1


@pytest.mark.parametrize("kind", ["closure list", "global list", "global counter"])
def test_a_hook_that_keeps_python_state_runs_once_per_call_and_is_never_replayed(emu, kind):
    """A forward hook recording activations (a list in its closure or its module's globals) or counting calls: a
    replay would skip it (a list 4 entries short after 6 calls, silently), and a capture that failed over it ran it a
    second time in the capture's call.  Each call now runs it exactly once: the capture copies what the hooks' code
    reached and fails with its reason; the key runs uncaptured."""
    m, x = _model(), torch.randn(2, 4)
    store: list = []
    RECORDED.clear()
    TALLY["n"] = 0
    if kind == "closure list":
        def make(into):
            def hook(mod, inp, out):
                into.append(out.detach().clone())
            return hook
        m[0].register_forward_hook(make(store))
    else:
        m[0].register_forward_hook(_global_hook if kind == "global list" else _counting_hook)
    f = graphjit.graphed(m, tracer="eager")
    with torch.no_grad():
        for i in range(6):
            got = f(x)
            n = {"closure list": len(store), "global list": len(RECORDED), "global counter": TALLY["n"]}[kind]
            assert n == i + 1, (i, n, f.report())
            assert torch.equal(got, m[2](m[1](m[0].forward(x))))
    st = f.stats()
    assert st["replays"] == 0 and sum(st["fallbacks"].values()) >= 3, st


def test_what_a_hook_reads_from_its_closure_is_guarded(emu):
    """A steering hook (``out * ctl.coef + box[0]``, both in its closure) changed between calls: the graph of the
    old values must not replay (it did, silently, before the hooks' closures were sources of the guards); a graph
    of the new values is captured once they settle."""

    class Steer:
        coef = 1.0

    m, x = _model(), torch.randn(2, 4)
    ctl, box = Steer(), [0.0]

    def make(c, b):
        def hook(mod, inp, out):
            return out * c.coef + b[0]
        return hook

    m[0].register_forward_hook(make(ctl, box))
    f = graphjit.graphed(m, tracer="eager")

    def change(i):
        if i == 4:
            ctl.coef = 3.0
        if i == 9:
            box[0] = 0.5

    with torch.no_grad():
        for i in range(14):
            change(i)
            got, want = f(x), m(x)
            assert torch.allclose(got, want), (i, got, want, f.report())
    st = f.stats()
    assert st["graphs"] >= 2 and st["replays"] >= 4, f.report()


def test_a_hook_of_the_graphed_forwards_own_module_keeps_its_state_outside_the_graph(emu):
    """``model.forward = graphed(model.forward)`` (how ``graph_generation`` graphs a model) with a hook on ``model``
    that records its outputs: ``Module.__call__`` runs that hook around the graphed forward, so its list is not a value
    the graph reads; the forward replays and the hook runs once per call."""
    m, x = _model(), torch.randn(2, 4)
    seen: list = []

    def make(store):
        def hook(mod, inp, out):
            store.append(out.detach().clone())
        return hook

    m.register_forward_hook(make(seen))
    m.forward = graphjit.graphed(m.forward)
    with torch.no_grad():
        for i in range(10):
            m(x)
            assert len(seen) == i + 1
    assert m.forward.stats()["replays"] >= 7, m.forward.report()


def test_what_a_global_module_hook_reads_from_its_closure_is_guarded(emu):
    """torch's ``register_module_forward_hook`` runs around every module's call: its closure is read by the graph as a
    module's own hook's is."""

    class Ctl:
        coef = 1.0

    ctl = Ctl()

    def make(c):
        def hook(mod, inp, out):
            return out * c.coef if isinstance(mod, torch.nn.Linear) else out
        return hook

    m, x = _model(), torch.randn(2, 4)
    handle = torch.nn.modules.module.register_module_forward_hook(make(ctl))
    try:
        _calls(m, graphjit.graphed(m), x, 12, change=lambda: setattr(ctl, "coef", 3.0), at=5)
    finally:
        handle.remove()
