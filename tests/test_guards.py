"""Guarded values on the CPU, through the emulated CUDA graph (tests/graph_emulator.py: a replay runs the recorded
tensor work and no Python, so it freezes Python values as a real graph does): every case of tests/guard_cases.py
graphed equals the same loop run eagerly, call by call, outputs and state; graphs serve the calls once the value
settles; a value that changes on every call runs uncaptured with its path and both values.  The same cases on a
GPU, both torch tracers and Paddle: tests/test_gpu_guards.py."""

from __future__ import annotations

import re

import pytest

torch = pytest.importorskip("torch")

import guard_cases as cases  # noqa: E402

import graphjit  # noqa: E402
from graphjit import guardable, guards, py_writes, renewals, variants  # noqa: E402

pytestmark = pytest.mark.torch


def _check(make, emu_device="cpu", **options):
    want_out, want_state, _ = cases.run(make, emu_device, graph=False)
    got_out, got_state, g = cases.run(make, emu_device, graph=True, **options)
    assert cases.max_diff(got_out, want_out) <= 1e-6, g.report()
    for i, (a, b) in enumerate(zip(got_state, want_state)):
        assert cases.max_diff(a, b) <= 1e-6, (i, g.report())
    return g.stats(), g


@pytest.mark.parametrize("name", sorted(cases.VALUES))
def test_a_changed_value_never_replays_a_stale_graph(emu, name, scan):
    make = cases.VALUES[name]
    st, g = _check(make)
    reasons = [k["reason"] or "" for k in st["keys"]] + list(st["fallbacks"])
    if make("cpu").keeps_graph:  # a graph per value, or one graph fed the tensors rebound (graphjit/renewals.py)
        assert (st["graphs"] >= 2 or _renewed(st)) and st["replays"] >= 3, g.report()
    else:
        changed = [r for r in st["fallbacks"] if r.startswith(guards.REASON)]
        assert changed and st["fallbacks"][changed[0]] >= 3, g.report()
        detail = next(k["detail"] for k in st["keys"] if (k["reason"] or "").startswith(guards.REASON))
        assert "when the graph was captured and is" in detail and "tensor" in detail
    assert not any("verify failed" in r for r in reasons), g.report()


def _renewed(st) -> bool:
    return any((k["reason"] or "").startswith(renewals.REASON) and k["captures"] == 2 for k in st["keys"])


def test_the_reason_names_the_path_and_both_values(emu):
    st, _g = _check(cases.list_item)
    assert "value read by the function changed: closure variable 'scales'[0]" in st["fallbacks"], st["fallbacks"]
    key = next(k for k in st["keys"] if k["reason"] == "value read by the function changed: closure variable "
               "'scales'[0]")
    assert "closure variable 'scales'[0] was 2.0 when the graph was captured and is" in key["detail"]


def test_a_shape_deciding_value_never_returns_the_old_shape(emu):
    st, _g = _check(cases.slice_bound)
    labels = [k["key"] for k in st["keys"] if k["state"] == "replay"]
    assert any("self.k=4" in label for label in labels) and any("self.k=8" in label for label in labels), labels


@pytest.mark.parametrize("name", sorted(cases.TRAINING))
def test_training_loops_equal_eager_after_every_call(emu, name):
    make = cases.TRAINING[name]
    st, g = _check(make)
    if make("cpu").extra.get("cpu_sync"):
        return  # on the CPU this optimizer reads its lr tensor with .item(): uncaptured there, equal all the same
    if make("cpu").keeps_graph:
        assert st["replays"] >= 4, g.report()
    else:
        assert any(r.startswith(guards.REASON) for r in st["fallbacks"]), g.report()


@pytest.mark.parametrize("make", [cases.batchnorm_no_grad, cases.batchnorm_functional])
def test_batchnorm_running_statistics_equal_eager_after_the_capture_call(emu, make):
    st, g = _check(make)
    assert st["replays"] >= 5, g.report()


def test_a_value_only_the_loop_names_is_not_guarded(emu):
    """An attribute the function's code never names (a step counter the training loop keeps on the model) does
    not end the graph when it changes."""
    torch.manual_seed(0)
    m = torch.nn.Linear(8, 8)
    m.loop_step_count = 0
    g = graphjit.graphed(m)
    x = torch.randn(2, 8)
    with torch.no_grad():
        for i in range(8):
            m.loop_step_count = i
            assert torch.equal(g(x), m(x))
    assert g.stats()["replays"] == 6 and not g.stats()["fallbacks"]


def test_guards_are_decided_at_capture_and_counted(emu):
    st, _g = _check(cases.attribute)
    captured = [k for k in st["keys"] if k["state"] == "replay"]
    assert captured and all(k["guarded_values"] >= 1 for k in captured)


def test_strict_mode_raises_after_the_uncaptured_call(emu):
    make = cases.list_item
    case = make("cpu")
    g = graphjit.graphed(case.fn, strict=True)
    with torch.no_grad(), pytest.raises(graphjit.CaptureError, match="value read by the function changed") as info:
        for i in range(case.calls):
            case.before(i)
            g(*case.inputs(i))
    assert info.value.executed


def test_a_function_that_writes_a_python_value_runs_uncaptured(emu):
    class Counter(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)
            self.calls = 0

        def forward(self, x):
            self.calls += 1
            return self.lin(x) * self.calls

    m = Counter()
    g = graphjit.graphed(m)
    x = torch.randn(2, 4)
    with torch.no_grad():
        outs = [g(x) for _ in range(5)]
    assert m.calls == 5
    assert all(torch.allclose(o, m.lin(x) * (i + 1)) for i, o in enumerate(outs))
    assert g.stats()["keys"][0]["reason"] == guards.WRITES
    assert "self.calls (1 -> 2)" in g.stats()["keys"][0]["detail"]


def test_a_set_is_guarded_by_its_contents_and_a_growing_one_runs_uncaptured(emu):
    """A set the function reads is compared by contents (the reason shows both), and a function that adds to it
    on every call runs uncaptured: a replay would leave it as it was."""
    st, _g = _check(cases.set_attribute)
    labels = sorted(k["key"] for k in st["keys"] if k["state"] == "replay")
    assert len(labels) == 2 and "'m'.active={'a'}" in labels[0] and "'m'.active={'b'}" in labels[1], labels

    seen: set[int] = set()
    w = torch.randn(4, 4)

    def step(x):
        seen.add(len(seen))
        return (x @ w) * len(seen)

    g = graphjit.graphed(step)
    x = torch.randn(2, 4)
    with torch.no_grad():
        outs = [g(x) for _ in range(6)]
    assert seen == set(range(6))
    assert all(torch.allclose(o, (x @ w) * (i + 1)) for i, o in enumerate(outs))
    assert g.stats()["replays"] == 0, g.report()


def test_a_failed_capture_leaves_no_python_trace(emu):
    """The capture's Python run changed an object's state, created state holding tensors, then failed: the call's
    eager run starts from the state before the capture (a GradScaler's per-optimizer record, an optimizer's
    found_inf), and every later call equals eager."""

    class Book:
        def __init__(self):
            self.stage = "ready"
            self.found = {}

    def make():
        book = Book()
        w = torch.ones(4)

        def step(x):
            if book.stage != "ready":
                raise RuntimeError("step() called twice without update()")
            book.stage = "stepped"
            book.found["inf"] = x.sum() * 0  # a tensor the run made (the graph's memory in a real capture)
            if graphjit.scope.phase() == "capture":
                raise RuntimeError("not capturable")  # what AdamW(capturable=False) raises under capture
            w.add_(x)
            book.stage, book.found = "ready", {}  # update(): a fresh record for the next step
            return w * 2

        return step, book, w

    step, _book, w_eager = make()
    xs = [torch.full((4,), float(i)) for i in range(6)]
    want = [step(x).clone() for x in xs]
    step, book, w = make()
    g = graphjit.graphed(step)
    got = [g(x).clone() for x in xs]
    assert all(torch.equal(a, b) for a, b in zip(got, want)) and torch.equal(w, w_eager)
    assert book.stage == "ready" and g.stats()["graphs"] == 0
    assert any("capturable" in r for r in g.stats()["fallbacks"]), g.stats()["fallbacks"]


def test_module_buffers_and_optimizer_state_are_compared_by_contents():
    """Kernels that move no version counter (BatchNorm's running statistics; on CUDA, torch 2.11's
    _foreach_lerp_ on Adam's exp_avg) still count as writes: those tensors are compared by contents in warmup."""
    from graphjit.backends.torch.graphs import TorchBackend

    b = TorchBackend()
    buffer = ("self", (".", "_modules"), ("[]", "bn"), (".", "_buffers"), ("[]", "running_mean"))
    state = ("closure variable 'opt'", (".", "state"), ("[]", "p"), ("[]", "exp_avg"))
    param = ("self", (".", "_modules"), ("[]", "lin"), (".", "_parameters"), ("[]", "weight"))
    assert b.version_blind(buffer) and b.version_blind(state) and not b.version_blind(param)


def test_guard_sources_skip_islands_and_follow_functions():
    island_flags = {"island_reads": 1}
    flags = {"step_reads": 2.0}

    @graphjit.eager
    def island(x):
        return x * island_flags["island_reads"]  # read on every call, by the island itself

    def helper(x):
        return x * flags["step_reads"]

    def step(x):
        return island(helper(x))

    src = guards.sources(step, None)
    found = guards.scan(src, lambda x: isinstance(x, torch.Tensor))
    paths = {"".join(map(str, p[1:])) for _v, p in found.values().values()}
    assert any("step_reads" in p for p in paths)
    assert not any("island_reads" in p for p in paths), paths  # only the island names it


def test_a_graphed_bound_method_guards_its_object_through_decorators(emu):
    """``model.forward = graphed(model.forward)`` (transformers' forward is decorated with functools.wraps)."""
    import functools

    def decorated(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            return fn(*args, **kwargs)

        return wrapper

    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)
            self.scale = 1.0

        @decorated
        def forward(self, x):
            return self.lin(x) * self.scale

    m = Scaled()
    m.forward = graphjit.graphed(m.forward)
    x = torch.randn(2, 4)
    with torch.no_grad():
        for i in range(6):
            m.scale = 1.0 if i < 3 else 2.0
            assert torch.allclose(m(x), m.lin(x) * m.scale)
    st = m.forward.stats()
    assert max(k["guarded_values"] for k in st["keys"]) >= 1 and st["graphs"] == 2, m.forward.report()


def test_a_lookup_table_is_not_guarded_item_by_item():
    table = [float(i) for i in range(1000)]
    small = [1.0, 2.0]

    def step(x):
        return x * table[3] * small[0]

    found = guards.scan(guards.sources(step, None), lambda x: isinstance(x, torch.Tensor))
    paths = {guards.describe(p) for _v, p in found.values().values()}
    assert "closure variable 'small'[0]" in paths and not any("'table'" in p for p in paths), paths


def test_a_rebound_object_or_function_and_a_class_default_are_guarded(emu):
    """Rebinding what the function uses (a config object, a global function) or changing a class attribute
    the instance reads never replays the old graph; a dict read with a key held in a variable is guarded."""

    class Cfg:
        def __init__(self, k):
            self.k = k

    class Temp(torch.nn.Module):
        temp = 1.0  # a class default, not shadowed by the instance

        def __init__(self):
            super().__init__()
            self.cfg = Cfg(1.0)

        def forward(self, x, mode):
            return x * self.temp * self.cfg.k * TABLE[mode] * ACT(x)

    m = Temp()
    g = graphjit.graphed(m)
    x = torch.randn(4)
    changes = [lambda: None, lambda: setattr(m, "cfg", Cfg(2.0)), lambda: setattr(Temp, "temp", 3.0),
               lambda: TABLE.__setitem__("a", 5.0), lambda: globals().__setitem__("ACT", torch.tanh)]
    with torch.no_grad():
        for change in changes:
            change()
            for _ in range(4):
                assert torch.allclose(g(x, "a"), m(x, "a")), g.report()
    assert g.stats()["graphs"] >= 3


TABLE = {"a": 1.0}
ACT = torch.sigmoid


def test_guard_failures_never_raise_when_a_value_becomes_an_array(emu):
    import numpy as np

    box = {"scale": 2.0}
    g = graphjit.graphed(lambda x: x * float(np.asarray(box["scale"]).sum()))
    x = torch.ones(3)
    with torch.no_grad():
        for i in range(8):
            box["scale"] = np.array([1.0, float(i)]) if i >= 4 else 2.0
            assert torch.allclose(g(x), x * float(np.asarray(box["scale"]).sum()))


def test_a_slowly_drifting_value_stops_making_graphs(emu):
    state = {"epoch": 0}
    g = graphjit.graphed(lambda x: x * (1.0 + state["epoch"]))
    x = torch.ones(3)
    with torch.no_grad():
        for i in range(120):
            state["epoch"] = i // 4
            assert torch.allclose(g(x), x * (1.0 + state["epoch"]))
    st = g.stats()
    assert st["graphs"] <= variants.Drift.MAX_VALUES + 1, g.report()
    assert any(r.startswith(guards.REASON) for r in st["fallbacks"]), g.report()


def test_an_attribute_counts_when_code_reads_it_off_that_object(emu):
    """Per object: a value the code of the call reads off that very object is guarded (a layer in a ModuleList,
    reached by iteration), a value nothing reads off it is not (a Linear's training flag: Linear.forward never
    looks at it), so the guards of a deep model stay few."""

    class Scale(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)
            self.k = 1.0

        def forward(self, x):
            return self.lin(x) * self.k

    class Stack(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList(Scale() for _ in range(3))

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

    m = Stack().eval()
    g = graphjit.graphed(m)
    x = torch.randn(2, 4)
    with torch.no_grad():
        for i in range(10):
            m.layers[1].lin.training = bool(i % 2)  # read by no code of the call: no new graph
            m.layers[2].k = 1.0 if i < 6 else 2.0  # read by Scale.forward off that layer: guarded
            assert torch.allclose(g(x), m(x)), g.report()
    st = g.stats()
    assert st["graphs"] == 2 and not st["fallbacks"], g.report()
    paths = [k["guarded_values"] for k in st["keys"] if k["state"] == "replay"]
    # and the 3 Linears' weight and bias, held by identity, and the methods the call runs on its 4 classes (forward of
    # Stack, Scale and Linear; ModuleList's append): one entry a class and name, however deep the model
    assert paths and max(paths) <= 12 + 6 + 5, g.report()


def test_held_tensors_are_compared_only_after_a_module_rebound_one(emu, monkeypatch):
    """A Module's parameters and buffers are held by identity, and compared before a replay only after torch's
    registration hooks said some module rebound one: an in-place update costs no comparison."""
    m = cases._Buffered()
    g = graphjit.graphed(m)
    xs = [torch.randn(4, 16) for _ in range(8)]
    compared: list[int] = []
    real = guards.GuardSet._held_same
    monkeypatch.setattr(guards.GuardSet, "_held_same", lambda self: compared.append(1) or real(self))
    with torch.no_grad():
        for i, x in enumerate(xs):
            m.gain.mul_(1.5)  # in place: the same tensor, no rebinding
            assert torch.equal(g(x), m(x)), i
        assert not compared and g.stats()["graphs"] == 1
        m.gain = m.gain * 2  # rebound: the graph of the old tensor no longer serves
        assert torch.equal(g(xs[0]), m(xs[0]))
        assert compared
    assert g.stats()["keys"][0]["guarded_values"] >= 3  # lin.weight, lin.bias and gain


def test_held_tensors_are_compared_on_every_call_where_rebinding_is_not_counted(emu, monkeypatch):
    monkeypatch.setattr(type(emu), "counts_rebinds", False)  # as Paddle: no registration hooks
    st, g = _check(cases.rebound_buffer)
    assert st["graphs"] >= 2 or _renewed(st), g.report()


@pytest.mark.parametrize("kind", ["same", "other_dtype"])
def test_a_buffer_rebound_on_every_call(emu, kind):
    """``m.gain = new`` before every call: a tensor of the same kind is fed to one graph (graphjit/renewals.py); one
    of another dtype each time (so never fed) runs uncaptured, naming it."""
    m = cases._Buffered()
    g = graphjit.graphed(m)
    kept = []  # each gain stays alive: a freed one's id, reused by the next, would read as a value seen before
    with torch.no_grad():
        for i in range(12):
            dtype = torch.float32 if kind == "same" or i < 3 else (torch.float64 if i % 2 else torch.float16)
            m.gain = torch.full((16,), float(i), dtype=dtype)
            kept.append(m.gain)
            x = torch.randn(4, 16)
            assert torch.equal(g(x), m(x)), i
    st = g.stats()
    if kind == "same":
        assert _renewed(st) and st["graphs"] == 1 and not st["fallbacks"], g.report()
    else:
        assert any(r == f"{guards.REASON}: self.gain" for r in st["fallbacks"]), g.report()


class _Slotted:
    __slots__ = ("n",)

    def __init__(self) -> None:
        self.n = 1


class _Holder:
    level = 3  # a class default the instances read


def _write_sources(with_counts: bool):
    """Sources reaching a closure cell, an object's dict, a slot, a class default, a list and a dict (and a
    defaultdict: a dict subclass always takes the walk)."""
    import collections

    box = _Holder()
    box.scale, box.table, box.flags, box.slot = 2.0, [1, 2, 3], {"on": True}, _Slotted()
    box.key, box.counts = b"ab", collections.defaultdict(int, a=0, b=1) if with_counts else {"a": 0}
    counter = 5

    def fn():
        return counter, box.scale, box.table, box.flags, box.slot.n, box.level, box.missing, box.key, box.counts

    src = guards.sources(fn, None)
    return src, box, fn


_WRITES = {
    "nothing": lambda box, fn: None,
    "an attribute": lambda box, fn: setattr(box, "scale", 3.0),
    "a list item": lambda box, fn: box.table.__setitem__(0, 9),
    "a list that shrank": lambda box, fn: box.table.pop(),
    "a list grown past what a scan reads": lambda box, fn: box.table.extend(range(guards.MAX_ITEMS)),
    "a dict entry deleted": lambda box, fn: box.flags.pop("on"),
    "a slot": lambda box, fn: setattr(box.slot, "n", 2),
    "a class default": lambda box, fn: setattr(_Holder, "level", 4),
    "a closure cell": lambda box, fn: fn.__closure__[0].__setattr__("cell_contents", 6),
    "an attribute added": lambda box, fn: setattr(box, "missing", 1),
    "a value that becomes a list": lambda box, fn: setattr(box, "scale", [1.0]),
    "an equal value of a type the walk does not store": lambda box, fn: setattr(box, "key", bytearray(b"ab")),
    "an entry of a dict with __missing__ deleted": lambda box, fn: box.counts.pop("a"),
}


@pytest.mark.parametrize("name", sorted(_WRITES))
def test_writes_reads_again_before_walking_and_answers_as_the_walk(name, monkeypatch):
    """``py_writes.writes`` first reads every compared value again and walks only where one may have changed; its
    answer is the walk's (``py_writes.written`` of two scans) in every case, and no walk is made where nothing was
    written."""
    monkeypatch.setattr(_Holder, "level", 3)
    src, box, fn = _write_sources(with_counts="__missing__" in name)

    def scan():
        return guards.scan(src, lambda x: isinstance(x, torch.Tensor))

    before = scan()
    _WRITES[name](box, fn)
    walks = []

    def rescan():
        walks.append(1)
        return scan()

    got = py_writes.writes(before, rescan)
    assert got == py_writes.written(before, scan()), name
    # an added value is not one the walk compares; an emptied dict or a list grown past MAX_ITEMS is a container the
    # walk no longer reads item by item, so it reports nothing there either (after walking)
    assert bool(walks) == (name not in ("nothing", "an attribute added")), name
    assert "a" in box.counts or name == "an entry of a dict with __missing__ deleted", "the re-read added an entry"
    assert bool(got) == (name not in ("nothing", "an attribute added", "a dict entry deleted",
                                      "a list grown past what a scan reads")), (name, got)


def test_writes_does_not_walk_for_a_large_namespace_that_did_not_change():
    """A module's globals or an object's attributes are read entry by entry whatever their number: only a list or
    dict the walk walks item by item makes a re-read walk once it holds more than MAX_ITEMS."""
    space = {f"v{i}": i for i in range(guards.MAX_ITEMS + 10)}
    code = compile("def fn():\n    return v0 + v1\n", "<space>", "exec")
    exec(code, space)
    src = guards.sources(space["fn"], None)
    before = guards.scan(src, lambda x: isinstance(x, torch.Tensor))
    walks = []
    assert py_writes.writes(before, lambda: walks.append(1) or guards.scan(src, lambda x: False)) == [] and not walks
    space["v1"] = 5
    assert py_writes.writes(before, lambda: guards.scan(src, lambda x: False)) == [("global 'v1'", "1", "5")]


def test_a_value_a_partials_bound_argument_holds_is_guarded(emu):
    """``graphed(functools.partial(f, cfg))``: the partial's bound arguments are state the call reads (they were not
    walked, so a changed ``cfg.scale`` replayed the old graph)."""
    import functools

    class Cfg:
        def __init__(self) -> None:
            self.scale = 1.0

    cfg = Cfg()
    part = functools.partial(lambda c, x: x * c.scale, cfg)
    f = graphjit.graphed(part)
    x = torch.ones(3)
    for i in range(8):
        if i == 4:
            cfg.scale = 3.0
        assert torch.equal(f(x), x * cfg.scale), (i, f.report())
    assert f.stats()["graphs"] == 2, f.report()


class _Stack(torch.nn.Module):
    """Iterates a ModuleList and a list of factors: what it runs depends on their lengths."""

    def __init__(self, n_layers: int, factors: list[float]) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = torch.nn.ModuleList([torch.nn.Linear(4, 4) for _ in range(n_layers)])
        self.factors = factors

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        for v in self.factors:
            x = x * v
        return x


@pytest.mark.parametrize("grow", ["Sequential.append", "ModuleList.append", "empty ModuleList", "list of values",
                                  "empty list"])
def test_an_item_appended_after_the_capture_to_what_the_function_iterates_is_run(emu, grow):
    """A list, or a container module, that the function iterates: the graph holds the items of its capture, so an
    appended one is a changed value (its length is guarded), never skipped by a replay."""
    if grow == "Sequential.append":
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    else:
        m = _Stack(0 if grow == "empty ModuleList" else 1, [] if grow == "empty list" else [2.0])
    f, x = graphjit.graphed(m), torch.randn(2, 4)
    with torch.no_grad():
        for i in range(8):
            if i == 4:
                if grow == "Sequential.append":
                    m.append(torch.nn.Tanh())
                elif grow in ("ModuleList.append", "empty ModuleList"):
                    m.layers.append(torch.nn.Linear(4, 4))
                else:
                    m.factors.append(3.0)
            got, want = f(x), m(x)
            assert torch.allclose(got, want), (i, f.report())
    assert f.stats()["graphs"] == 2, f.report()
    assert "len(" in f.report(), f.report()



def test_a_value_only_a_later_graph_reads_is_checked_before_that_graph_replays(emu):
    """The graph of a list of one factor guards ``factors[0]`` and the length; after an append, the graph of two
    factors guards ``factors[1]`` too.  A call whose ``factors[1]`` changed finds that graph's key from the first
    graph's values (unchanged but for the length) and must not replay it: it gets a graph of its own."""
    m = _Stack(1, [2.0])
    f, x = graphjit.graphed(m), torch.randn(2, 4)
    with torch.no_grad():
        for i in range(12):
            if i == 4:
                m.factors.append(3.0)
            if i == 8:
                m.factors[1] = 5.0
            assert torch.allclose(f(x), m(x)), (i, f.report())
    assert f.stats()["graphs"] == 3, f.report()


def test_a_class_level_list_the_function_reads_is_guarded(emu):
    class Scaled(torch.nn.Module):
        FACTORS = [2.0]

        def forward(self, x):
            return x * self.FACTORS[-1] * len(self.FACTORS)

    m, x = Scaled(), torch.ones(3)
    f = graphjit.graphed(m)
    try:
        with torch.no_grad():
            for i in range(12):
                if i == 4:
                    Scaled.FACTORS.append(3.0)
                if i == 8:
                    Scaled.FACTORS[1] = 5.0
                assert torch.equal(f(x), m(x)), (i, f.report())
    finally:
        Scaled.FACTORS[:] = [2.0]


def test_a_value_only_a_later_graph_reads_that_changes_on_every_call_runs_uncaptured(emu):
    """Its changes count toward the key's drift (they did not: a graph per call, until max_graphs)."""
    m = _Stack(1, [2.0])
    f, x = graphjit.graphed(m), torch.randn(2, 4)
    with torch.no_grad():
        for i in range(40):
            if i == 4:
                m.factors.append(3.0)
            if i >= 8:
                m.factors[1] = float(i)
            assert torch.allclose(f(x), m(x)), (i, f.report())
    st = f.stats()
    assert st["graphs"] <= variants.Drift.MAX_VALUES + 2 and st["fallbacks"], f.report()


def test_a_cache_filled_by_key_keeps_the_other_graphs_and_settings_keys_are_guarded(emu):
    """A dict the function fills by key (one entry per shape, tensors as values) has no key guard: a new shape's entry
    leaves the graphs of the others replaying.  A dict of settings (string keys, plain values) has its keys guarded
    in order, and not a closed-over cache of tensors (guardable.settings)."""
    w = torch.randn(8, 8)
    ones: dict[int, torch.Tensor] = {}

    def step(x):
        n = x.shape[0]
        if n not in ones:
            ones[n] = torch.ones(n, 8)
        return x @ w + ones[n]

    g = graphjit.graphed(step)
    for n in (2, 2, 2, 2, 4, 4, 4, 4, 2, 4, 2, 4):
        x = torch.full((n, 8), float(n))
        assert torch.equal(g(x), x @ w + 1)
    st = g.stats()
    assert st["graphs"] == 2 and st["fallbacks"] == {}, g.report()
    assert all(k["captures"] == 1 for k in st["keys"]), g.report()
    assert guardable.settings({"a": 1.0, "b": (1, "x"), "c": {"d": [1]}})
    assert not guardable.settings({"a": torch.ones(1)}) and not guardable.settings({1: 2.0})
    assert not guardable.settings({"len8": (torch.ones(1), torch.ones(1))})  # a table of tensors by a string key
    assert not guardable.settings({"a": [{"b": object()}]})


class _Meter:
    """A helper class the step names for one method; the loop ticks a counter on the class the step never reads."""

    step = 0
    factor = 2.0

    @staticmethod
    def scale(x):
        return x * 2

    @classmethod
    def tick(cls):
        cls.step += 1


def test_a_class_reached_by_name_guards_only_what_the_function_reads_off_it(emu):
    """Guarded: ``_Meter.factor`` (the step names it).  Not guarded: ``_Meter.step``, which only the loop's
    ``_Meter.tick()`` changes (before this narrowing, every call after a tick ran uncaptured)."""

    def f(x):
        return _Meter.scale(x) * _Meter.factor

    g = graphjit.graphed(f)
    x = torch.ones(3)
    try:
        for i in range(12):
            _Meter.tick()
            if i == 8:
                _Meter.factor = 3.0
            assert torch.equal(g(x), f(x)), (i, g.report())
        st = g.stats()
        assert st["fallbacks"] == {} and st["graphs"] == 2, g.report()
    finally:
        _Meter.factor, _Meter.step = 2.0, 0


def test_a_string_keyed_cache_the_function_fills_keeps_one_graph_per_shape(emu):
    """A module-level table filled by shape under string keys with int values (an autotuner's): looked up, never
    iterated, so its keys are not guarded and a new shape's entry leaves the other graphs replaying."""
    tuned = {"default": 1}

    def f(x):
        k = f"n{x.shape[0]}"
        if k not in tuned:
            tuned[k] = 2
        return x * tuned[k]

    g = graphjit.graphed(f)
    sizes = list(range(2, 7))
    for j in range(len(sizes)):
        for n in sizes[: j + 1]:
            for _ in range(3):
                assert torch.equal(g(torch.ones(n)), torch.full((n,), 2.0))
    st = g.stats()
    assert st["graphs"] == len(sizes) and all(k["captures"] == 1 for k in st["keys"]), g.report()


def test_a_key_of_a_deleted_entry_says_so_in_its_label(emu):
    """A list item the function reads is gone after a few calls: the key of the new values names it ``(deleted)``, so
    the two keys' labels tell them apart (before, the deleted entry was left out of the label)."""
    scales = [2.0, 3.0]

    def f(x):
        for v in scales:
            x = x * v
        return x

    g = graphjit.graphed(f)
    x = torch.ones(2)
    for i in range(10):
        if i == 4:
            scales.pop()
        assert torch.equal(g(x), f(x)), i
    labels = [k["key"] for k in g.stats()["keys"]]
    assert len(labels) == 2 and any("'scales'[1]=(deleted)" in label for label in labels), labels



def test_the_compile_tracer_keeps_each_float_a_constant_of_its_compiled_code(monkeypatch):
    """``tracer="compile"``: a float the function reads that changes makes Dynamo recompile with that float as a
    constant, never as a 0-d CPU tensor input (its automatic dynamic), which a CUDA graph would replay stale (the
    host memory it is read from is that one call's) or fail to capture beside CUDA tensors.  The compiled programs are
    counted with an eager backend, so a float input shows as a 0-d placeholder.  (Run without the emulator: its sync
    watch is a dispatch mode, under which Dynamo does not recompile.)"""
    from torch._dynamo.testing import CompileCounterWithBackend

    from graphjit import backends

    counter = CompileCounterWithBackend("eager")
    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **_kw: real(fn, backend=counter))
    torch.manual_seed(0)
    w = torch.randn(16, 16)

    knob = {"scale": 1.0}  # a dict, not a class attribute: Dynamo 2.10-2.11 does not guard those at all

    def step(x):
        return (x @ w) * knob["scale"]

    traced = backends.get("torch").trace(step, "compile")
    x = torch.randn(4, 16)
    for scale in (1.0, 2.0, 1.0, 3.0):
        knob["scale"] = scale
        torch.testing.assert_close(traced(x), (x @ w) * scale)
    scalars = [n for fx in counter.graphs for n in fx.graph.nodes
               if n.op == "placeholder" and getattr(n.meta.get("example_value"), "dim", lambda: 1)() == 0]
    assert counter.frame_count == 3 and not scalars, (counter.frame_count, scalars)


def _stale_trace(w, read):
    """A stand-in tracer whose program (any tracer but ``eager``) computes ``(x @ w) * read()`` with the value
    ``read()`` gave on its first run, as a compiled program that keeps what it read when it was made."""

    def trace(fn, tracer):
        if tracer == "eager":
            return fn
        first: list[float] = []

        def program(x):
            if not first:
                first.append(read())
            return (x @ w) * first[0]

        return program

    return trace


def test_a_compiled_program_that_keeps_an_old_class_value_is_not_captured(emu, monkeypatch):
    """A torch whose Dynamo installs no guard on a number read off a class (pytorch#176851, torch 2.10-2.11) keeps
    running code compiled for the old value.  Where the backend says its tracer may miss such a value, a change of a
    value read off a class makes the function traced with "eager" from then on: every call equals eager.  The stale
    program is made here by a stand-in tracer that reads the attribute once; before, its graph for the new value
    replayed the old one."""
    torch.manual_seed(0)
    w = torch.randn(16, 16)
    xs = [torch.randn(4, 16) for _ in range(12)]

    class Knob:
        scale = 1.0

    def step(x):
        return (x @ w) * Knob.scale

    monkeypatch.setattr(emu, "trace", _stale_trace(w, lambda: Knob.scale))
    monkeypatch.setattr(emu, "tracer_misses_values", lambda tracer: "a stand-in" if tracer == "compile" else None)
    monkeypatch.setattr(emu, "tracers", ("eager", "compile"))
    g = graphjit.graphed(step, tracer="compile")
    for i, x in enumerate(xs):
        Knob.scale = 2.0 if (i // 3) % 2 else 1.0
        with torch.no_grad():
            torch.testing.assert_close(g(x), (x @ w) * Knob.scale, rtol=0, atol=1e-6)
    st = g.stats()
    assert st["tracer"] and re.search(r'replaced by "eager": class \S*Knob.scale changed', st["tracer"]), g.report()
    assert st["graphs"] >= 2 and st["replays"] >= 3, g.report()
    # a value that changes on every call: those calls run the Python function, not the stale program
    Knob.scale = 1.0
    g = graphjit.graphed(step, tracer="compile")
    for i, x in enumerate(xs):
        Knob.scale = 1.0 if i < 3 else float(i)
        with torch.no_grad():
            torch.testing.assert_close(g(x), (x @ w) * Knob.scale, rtol=0, atol=1e-6)
    assert any(r.startswith(guards.REASON) for r in g.stats()["fallbacks"]), g.report()


class _Scaled:
    """A plain object whose method reads a class default (``temp``) through ``self``."""

    temp = 1.0

    def __init__(self) -> None:
        self.w = torch.randn(4, 4)

    def step(self, x):
        return (x @ self.w) * self.temp


class _ScaledModule(torch.nn.Module):
    temp = 1.0

    def forward(self, x):
        return x * self.temp


@pytest.mark.parametrize("kind", ["module", "method"])
def test_an_instance_attribute_that_shadows_a_class_default_after_the_capture_is_seen(emu, kind):
    """``obj.temp = 5.0`` after the capture, where only the class had ``temp``: the graph froze the class's value, so
    the object's ``__dict__`` is guarded to stay without the name (``own(self.temp)``).  Before, the graph replayed
    the class's 1.0 (the class attribute itself had not changed)."""
    torch.manual_seed(0)
    obj = _ScaledModule() if kind == "module" else _Scaled()
    eager = obj if kind == "module" else obj.step
    g = graphjit.graphed(eager)
    x = torch.randn(4, 4)
    with torch.no_grad():
        for i in range(12):
            if i == 5:
                obj.temp = 5.0  # an instance attribute now shadows the class's
            if i == 9:
                obj.temp = 6.0  # and changes: the new graph guards it as the object's own
            torch.testing.assert_close(g(x), eager(x), rtol=0, atol=0)
    labels = [k["key"] for k in g.stats()["keys"] if k["state"] == "replay"]
    assert any("own(self.temp)=True" in label for label in labels), g.report()


def test_a_pinned_tensor_whose_entry_is_deleted_is_another_graphs(emu):
    """A list the function reads a tensor from shrinks (``hist.pop()``), a dict entry it reads is deleted: the entry is
    gone, not an error: the next calls warm up and capture for what is there now (a key of read values with the entry
    deleted), as a deleted plain value is."""
    hist = [torch.full((4,), 1.0), torch.full((4,), 2.0), torch.full((4,), 3.0)]
    cfg = {"w": torch.ones(4), "b": torch.ones(4)}

    def last(x):
        return x + hist[-1]

    def scaled(x):
        return x * cfg["w"] + cfg.get("b", 0)

    for fn, change in ((last, hist.pop), (scaled, lambda: cfg.pop("b"))):
        g = graphjit.graphed(fn)
        for i in range(20):
            if i == 6:
                change()
            assert torch.equal(g(torch.ones(4)), fn(torch.ones(4))), (fn.__name__, i)
        st = g.stats()
        assert st["graphs"] == 2 and st["replays"] >= 14 and not st["fallbacks"], g.report()


@pytest.mark.parametrize("name", ["rebuilt_attribute_dict", "rebuilt_global_dict", "rebuilt_dict_of_tensors"])
def test_a_container_rebuilt_equal_before_every_call_keeps_its_graph(emu, name):
    """A dict made anew before every call with equal values replays the graph of those values (one graph per
    distinct value set: two here), rather than a graph per call or an uncaptured call."""
    st, g = _check(cases.VALUES[name])
    assert st["graphs"] == 2 and st["replays"] == 10 and not st["fallbacks"], g.report()


def test_a_function_that_rebinds_the_dict_it_reads_acts_as_eager(emu):
    """``h.state = {"n": n + 1}`` inside the function: a replay would not run it; each call equals eager's output and
    leaves the same state (before, the guards read the first dict and replayed a frozen count); the warmup calls find
    the write (at the dict's path, though the dict is a new one each call): the key runs uncaptured, saying so."""
    holder = type("Holder", (), {})()

    def step(x):
        n = holder.state["n"]
        holder.state = {"n": n + 1}
        return x * n

    got = []
    for graph in (False, True):
        holder.state = {"n": 0}
        f = graphjit.graphed(step) if graph else step
        with torch.no_grad():
            got.append([float(f(torch.ones(2))[0]) for _ in range(8)])
        assert holder.state == {"n": 8}, f.report() if graph else holder.state
    assert got[0] == got[1] == [float(i) for i in range(8)], f.report()
    assert f.stats()["graphs"] == 0 and guards.WRITES in f.stats()["fallbacks"], f.report()  # said so at warmup


def test_a_guard_reads_a_rebound_container_where_the_code_finds_it():
    """The GuardSet follows a rebound list or dict through its parents (an attribute, a dict entry), names the
    path of a changed value, and holds again once an equal one is bound."""
    holder = type("Holder", (), {})()
    holder.cfg = {"inner": {"scale": 1.0}, "order": [1, 2]}

    def step(x):
        return x * holder.cfg["inner"]["scale"] + holder.cfg["order"][1]

    found = guards.scan(guards.sources(step, None), lambda v: isinstance(v, torch.Tensor))
    guard = guards.GuardSet(found)
    assert guard.holds() and len(guard.links) == 3
    holder.cfg = {"inner": {"scale": 1.0}, "order": [1, 2]}
    assert guard.holds()
    holder.cfg["inner"] = {"scale": 2.0}
    assert not guard.holds()
    assert guard.change() == ("closure variable 'holder'.cfg['inner']['scale']", "1.0", "2.0")
    holder.cfg["inner"] = {"scale": 1.0}
    holder.cfg["order"] = (1, 3)  # another type there: compared as the code reads it
    assert not guard.holds() and guard.change()[2] == "3"
    del holder.cfg["order"]
    assert not guard.holds() and guard.values() is not None and guard.change()[2] == "(deleted)"


class _Shifted(torch.nn.Module):
    """A model that keeps a tensor it makes anew on itself (Qwen2-VL's ``rope_deltas``, set by every ``generate()``)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(4, 4)
        self.delta = None

    def forward(self, x):
        return self.lin(x) + self.delta


@pytest.mark.parametrize("held", ["nobody", "old", "new"])
def test_a_tensor_made_anew_on_the_model_is_fed_to_one_graph_and_never_written(emu, held):
    """``m.delta = torch.full(...)`` before every five calls: from the first new tensor on, the key's graph reads
    graphjit's own tensor, filled from the model's before each call (graphjit/renewals.py; before, each new tensor was
    another graph's), whether or not the caller keeps either; a tensor the caller keeps is never written.  Every
    call equals eager."""
    m = _Shifted()
    g = graphjit.graphed(m)
    kept = []
    for gen in range(4):
        new = torch.full((1, 4), float(gen))
        if held == "old" and m.delta is not None:
            kept.append((m.delta, m.delta.clone()))
        if held == "new":
            kept.append((new, new.clone()))
        m.delta = new
        del new
        for step in range(5):
            x = torch.ones(2, 4) * step
            with torch.no_grad():
                assert torch.equal(g(x), m.lin(x) + m.delta), (held, gen, step, g.report())
    for t, was in kept:
        assert torch.equal(t, was), held
    assert g.stats()["graphs"] == 1 and _renewed(g.stats()), g.report()


def test_rebound_containers_are_read_from_their_roots_down_never_by_a_stand_in(emu):
    """Two chains whose parents were both None for a while, then rebound to dicts of other values: each guard reads its
    own chain again from its root (before, the containers were matched by the old parent's identity, and None stood
    for both: the graph read the second dict for the first)."""
    h = type("Holder", (), {})()
    h.a, h.b = {"cfg": {"s": 2.0}}, {"cfg": {"s": 2.0}}

    def step(x):
        a = h.a["cfg"]["s"] if h.a is not None else 0.0
        b = h.b["cfg"]["s"] if h.b is not None else 0.0
        return x * a + b

    g = graphjit.graphed(step)
    x = torch.ones(2)
    with torch.no_grad():
        for phase in range(3):
            if phase == 1:
                h.a = h.b = None
            if phase == 2:
                h.a, h.b = {"cfg": {"s": 1.0}}, {"cfg": {"s": 2.0}}
            for _ in range(4):
                assert torch.equal(g(x), step(x)), (phase, g.report())


def test_a_dict_of_tensors_rebound_to_none_runs_as_eager(emu):
    """``h.cache = None`` after the capture, where the function reads a tensor of the dict when there is one: no error,
    the call equals eager."""
    h = type("Holder", (), {})()
    h.cache = {"k": torch.ones(4)}

    def step(x):
        c = h.cache
        return x + c["k"] if c is not None else x * 2

    g = graphjit.graphed(step)
    x = torch.ones(4)
    with torch.no_grad():
        for _ in range(4):
            g(x)
        h.cache = None
        for _ in range(4):
            assert torch.equal(g(x), x * 2), g.report()


def test_a_container_at_two_places_rebound_at_one_is_never_read_at_the_other(emu):
    """``self.scale = self.bias = [1.0]`` then ``m.bias = [5.0]``: the graph's guards, which read the list at its first
    place, cannot tell which place the function reads, so the values of the call name the place that moved and the
    call is another key's (a graph captured now finds the two lists apart); once they agree again, the first serves."""
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = self.bias = [1.0]

        def forward(self, x):
            return x * self.scale[0] + self.bias[0]

    m = M()
    g = graphjit.graphed(m)
    x = torch.ones(2)
    with torch.no_grad():
        for _ in range(4):
            g(x)
        m.bias = [5.0]
        for _ in range(3):
            assert torch.equal(g(x), m(x)), g.report()
        m.bias = m.scale
        for _ in range(3):
            assert torch.equal(g(x), m(x)), g.report()
    st = g.stats()
    assert st["graphs"] == 2 and not st["fallbacks"] and any("self.bias" in k["key"] for k in st["keys"]), g.report()
    assert st["replays"] >= 4, g.report()


def test_guards_never_change_what_they_read_nor_raise_where_it_is_gone(emu):
    """A ``defaultdict`` reset after the capture: the guards read its entries without its ``__missing__`` (which would
    insert the key and change the user's program); a closure variable deleted: no error, the call runs as eager."""
    from collections import defaultdict

    h = type("Holder", (), {})()
    h.cache = defaultdict(dict)
    h.cache["a"] = {"s": 2.0}

    def step(x):
        return x * (h.cache["a"]["s"] if "a" in h.cache else 1.0)

    def make():
        t = torch.full((4,), 2.0)

        def plus(x):
            try:
                return x + t
            except NameError:
                return x * 3

        def drop():
            nonlocal t
            del t

        return plus, drop

    plus, drop = make()
    g, gp = graphjit.graphed(step), graphjit.graphed(plus)
    x = torch.ones(4)
    with torch.no_grad():
        for _ in range(3):
            g(x), gp(x)
        h.cache = defaultdict(dict)
        drop()
        for _ in range(3):
            assert torch.equal(g(x), x) and torch.equal(gp(x), x * 3), (g.report(), gp.report())
    assert dict(h.cache) == {}, h.cache


def test_an_objects_dict_held_as_a_dict_too_is_read_in_place(emu):
    """``self.opts = vars(args)``: rebinding ``opts`` leaves ``args``' own ``__dict__`` the one its guards read, so a
    changed ``args.scale`` is seen (before, the guards followed ``opts`` to the new dict)."""
    import argparse

    args = argparse.Namespace(scale=2.0)

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.args, self.opts = args, vars(args)

        def forward(self, x):
            return x * self.args.scale + len(self.opts)

    m = M()
    g = graphjit.graphed(m)
    x = torch.ones(2)
    with torch.no_grad():
        for phase in range(3):
            if phase == 1:
                m.opts = {"scale": 2.0}
            if phase == 2:
                args.scale = 5.0
            for _ in range(3):
                assert torch.equal(g(x), m(x)), (phase, g.report())


def test_a_tuple_of_tensors_rebound_to_equal_clones_is_another_graphs(emu):
    """``h.kv = [(k, v)]`` rebound to clones of one element each: a tuple is compared by ``==``, which for such tensors
    compares their values; its tensors are held by identity now (the graph reads the old ones at their addresses)."""
    def make():
        h = type("Holder", (), {})()
        h.kv = [(torch.ones(1), torch.full((1,), 2.0))]

        def step(x):
            k, v = h.kv[0]
            v.add_(1)
            return x * k + v

        return h, step

    (h, step), (want_h, eager) = make(), make()
    g = graphjit.graphed(step)
    x = torch.ones(3)
    with torch.no_grad():
        for i in range(8):
            if i in (3, 6):
                h.kv = [tuple(t.clone() for t in h.kv[0])]
                want_h.kv = [tuple(t.clone() for t in want_h.kv[0])]
            assert torch.equal(g(x), eager(x)), (i, g.report())


def test_a_function_that_swaps_two_dicts_on_every_call_runs_uncaptured(emu):
    """``h.cur, h.nxt = h.nxt, h.cur`` inside the function: the value at each path changes on every call, though no
    container does; a replay would not swap them."""
    h = type("Holder", (), {})()
    h.cur, h.nxt = {"s": 1.0}, {"s": 2.0}

    def step(x):
        s = h.cur["s"]
        h.cur, h.nxt = h.nxt, h.cur
        return x * s

    g = graphjit.graphed(step)
    with torch.no_grad():
        got = [float(g(torch.ones(1))[0]) for _ in range(6)]
    assert got == [1.0, 2.0] * 3 and guards.WRITES in g.stats()["fallbacks"], g.report()


def test_two_globals_of_one_name_in_two_modules_are_not_a_write(emu):
    """``SCALE`` in two modules (and an OrderedDict that makes the warmup compare its scans in full): the two paths read
    ``global 'SCALE'`` both, so values are matched by path only where a path names one place; before, the two were
    compared with each other and the function ran uncaptured as one that writes a Python value on every call."""
    import collections

    first: dict = {"SCALE": 2.0}
    exec("def helper(x):\n    return x * SCALE\n", first)
    second: dict = {"SCALE": 3.0, "OPTS": collections.OrderedDict(bias=1.0), "helper": first["helper"]}
    exec("def step(x):\n    return helper(x) * SCALE + OPTS['bias']\n", second)
    g = graphjit.graphed(second["step"])
    with torch.no_grad():
        for _ in range(6):
            assert torch.equal(g(torch.ones(3)), torch.full((3,), 7.0)), g.report()
    assert g.stats()["graphs"] == 1 and not g.stats()["fallbacks"], g.report()


def test_a_tuple_of_new_tensors_set_before_every_call_runs_as_eager(emu):
    """``h.kv = (new, new)`` before every call: the key of its values holds the tensors by identity (their ``==``
    compares values: the keys' comparison raised); the calls run right, uncaptured once the values change on every
    call."""
    h = type("Holder", (), {})()

    def step(x):
        k, v = h.kv
        return x * k + v

    g = graphjit.graphed(step)
    with torch.no_grad():
        for i in range(8):
            h.kv = (torch.full((4,), float(i)), torch.ones(4))
            assert torch.equal(g(torch.ones(4)), torch.full((4,), float(i) + 1)), (i, g.report())
    assert "Tensor [4] at" in g.report() and "tensor(" not in g.report()  # shown without reading their values


def test_a_compiled_program_that_keeps_an_environment_variable_is_replaced_by_eager(emu, monkeypatch):
    """``os.environ.get(FLAG)`` under a tracer whose program keeps what it read when it was made (Dynamo on torch 2.11
    keeps the environment): once the variable changes, the function is traced with ``eager`` (said in ``stats()``), so
    the new value's graph runs the Python function's kernels; the old value's graph stays right."""
    import os

    flag = "GRAPHJIT_TEST_STALE_ENV_FLAG"
    monkeypatch.delenv(flag, raising=False)
    w = torch.randn(8, 8)
    xs = [torch.randn(2, 8) for _ in range(12)]

    def step(x):
        return (x @ w) * (3.0 if os.environ.get(flag) else 1.0)

    monkeypatch.setattr(emu, "trace", _stale_trace(w, lambda: 3.0 if os.environ.get(flag) else 1.0))
    monkeypatch.setattr(emu, "tracers", ("eager", "compile"))
    g = graphjit.graphed(step, tracer="compile")
    for i, x in enumerate(xs):
        if i == 5:
            os.environ[flag] = "1"
        if i == 9:
            del os.environ[flag]
        with torch.no_grad():
            torch.testing.assert_close(g(x), step(x), rtol=0, atol=1e-6)
    st = g.stats()
    assert st["tracer"] and "os.environ['GRAPHJIT_TEST_STALE_ENV_FLAG']" in st["tracer"], g.report()
    assert st["graphs"] >= 2 and st["replays"] >= 3, g.report()


def test_a_module_the_first_call_imports_adds_no_names_to_guard(emu, tmp_path, monkeypatch):
    """A call that imports a module on its first run (a lazy import) runs that module's body under the names recorder:
    the names it defines are not values the call reads, and guarding them made a first capture that imported Dynamo
    guard 6,000 attributes of other modules.  An object the function holds keeps only what its code reads guarded;
    once imported, a later change to an attribute the code does read still misses the graph."""
    import importlib
    import sys

    names = [f"knob{i}" for i in range(200)]
    (tmp_path / "gj_lazy_defs.py").write_text("".join(f"{n} = {i}\n" for i, n in enumerate(names)))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "gj_lazy_defs", raising=False)

    class Knobs:
        pass

    knobs = Knobs()
    for n in names:
        setattr(knobs, n, 1.0)
    knobs.scale = 2.0

    def step(x: torch.Tensor) -> torch.Tensor:
        importlib.import_module("gj_lazy_defs")  # the first run imports it, later runs find it in sys.modules
        return x * knobs.scale

    g = graphjit.graphed(step)
    x = torch.ones(3)
    for _ in range(5):
        assert torch.equal(g(x), x * 2.0)
    key = g.stats()["keys"][0]
    assert key["state"] == "replay" and key["guarded_values"] < 20, key
    knobs.scale = 3.0
    assert torch.equal(g(x), x * 3.0)


def test_two_modules_with_the_same_code_each_have_their_globals_guarded(emu, tmp_path, monkeypatch):
    """Code objects compare by their contents, not by their module: two modules whose functions are written alike
    have equal codes.  The name recorder keeps each one apart (by identity), so the globals each reads, in its own
    module, are both guarded."""
    import importlib
    import sys

    text = "SCALE = 2.0\n\n\ndef scaled(x):\n    return x * SCALE\n"
    for name in ("gj_twin_a", "gj_twin_b"):
        (tmp_path / f"{name}.py").write_text(text)
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    a, b = importlib.import_module("gj_twin_a"), importlib.import_module("gj_twin_b")
    assert a.scaled.__code__ == b.scaled.__code__ and a.scaled.__code__ is not b.scaled.__code__

    def step(x):
        return a.scaled(x) + b.scaled(x)

    g = graphjit.graphed(step)
    x = torch.ones(3)
    for _ in range(4):
        assert torch.equal(g(x), x * 4.0)
    assert g.stats()["replays"] >= 1, g.report()
    b.SCALE = 5.0
    assert torch.equal(g(x), x * 7.0), g.report()
    a.SCALE = 3.0
    assert torch.equal(g(x), x * 8.0), g.report()


def _block_class() -> type:
    """A new Module class (each test patches its own) whose forward calls a method of its own, ``extra``."""

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 3)

        def forward(self, x):
            return self.lin(x) + self.extra(x)

        def extra(self, x):
            return x

    return Block


def test_a_method_patched_on_its_class_after_the_capture_is_run(emu):
    """``Block.extra = f`` or ``Block.forward = f`` after the capture (how patches that swap a model's attention are
    applied): the graph ran the old method, so it must not replay; a graph of the new one is captured, and the old
    graph serves again once the method is put back."""
    Block = _block_class()
    m = Block().eval()
    g = graphjit.graphed(m)
    x = torch.randn(2, 3)
    original_extra, original_forward = Block.extra, Block.forward
    try:
        with torch.no_grad():
            for i in range(12):
                if i == 4:
                    Block.extra = lambda self, x: x * 3
                if i == 7:
                    Block.forward = lambda self, x: self.lin(x) * 2
                if i == 10:
                    Block.extra, Block.forward = original_extra, original_forward
                assert torch.allclose(g(x), m(x)), (i, g.report())
    finally:
        Block.extra, Block.forward = original_extra, original_forward
    st = g.stats()
    assert st["graphs"] == 3 and st["replays"] >= 5, g.report()


def test_an_inherited_method_patched_on_the_subclass_is_a_changed_value(emu):
    """``Child.extra = f`` where ``extra`` is defined on ``Base``: the method is guarded as read off the instances'
    class, so a patch on it or on any base is seen."""

    class Child(_block_class()):
        pass

    m = Child().eval()
    g = graphjit.graphed(m)
    x = torch.randn(2, 3)
    with torch.no_grad():
        for i in range(8):
            if i == 4:
                Child.extra = lambda self, x: x * 3
            assert torch.allclose(g(x), m(x)), (i, g.report())
