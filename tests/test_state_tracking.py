"""What a call writes, rebinds and draws, found by graphjit.reach / writes / warmup, for both frameworks;
and the framework modes that are part of every key."""

from __future__ import annotations

import collections
import dataclasses

import pytest

import graphjit
from graphjit import backends, reach
from graphjit.warmup import Warmup, watched_call
from graphjit.writes import Snapshot, WriteProbe

BUDGET = 1 << 30


def _fw(name):
    return pytest.importorskip(name)


def _tensor_fns(name):
    if name == "torch":
        torch = _fw("torch")
        return torch, (lambda *s: torch.zeros(*s)), (lambda t: t.add_(1)), (lambda d, s: d.copy_(s))
    paddle = _fw("paddle")
    return paddle, (lambda *s: paddle.zeros(list(s))), (lambda t: t.add_(paddle.ones_like(t))), \
        (lambda d, s: d.copy_(s, False))


FRAMEWORKS = [pytest.param("torch", marks=pytest.mark.torch), pytest.param("paddle", marks=pytest.mark.paddle)]


@dataclasses.dataclass
class Holder:
    a: object
    b: object
    label: str = "h"


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_walk_finds_tensors_in_closures_globals_objects_and_names_their_paths(name):
    _fw_mod, zeros, _inc, _copy = _tensor_fns(name)
    cache = Holder(zeros(2), [zeros(3), {"k": zeros(4)}])
    state = zeros(1)

    def helper():
        return GLOBAL_STATE  # noqa: F821 - set below, for the walk to find

    def fn(x):
        helper()
        return x + state + cache.a

    globals()["GLOBAL_STATE"] = zeros(5)
    try:
        b = backends.get(name)
        roots = reach.roots(fn, None, [("argument 'x'", zeros(6))])
        found = reach.walk(roots, lambda t: isinstance(t, b.tensor_types()))
        paths = sorted(reach.describe(p) for _t, p in found.tensors.values())
        assert paths == sorted(["argument 'x'", "closure variable 'cache'.a", "closure variable 'cache'.b[0]",
                                "closure variable 'cache'.b[1]['k']", "closure variable 'state'",
                                "global 'GLOBAL_STATE'"])
        assert not found.truncated
    finally:
        del globals()["GLOBAL_STATE"]


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_tensors_put_into_containers_that_were_empty_are_found_as_added(name):
    """The walk skips empty containers (a module's hook dicts): one the call fills with a tensor is walked after it,
    so the tensor is found as state the call added, under the container's path."""
    _fw_mod, zeros, _inc, _copy = _tensor_fns(name)
    b = backends.get(name)
    h = Holder({}, [])
    h.c = ((), {"inner": []})

    def fill():
        h.a["k"] = zeros(1)
        h.b.append(zeros(2))
        h.c[1]["inner"].append(zeros(3))
        return zeros(1)

    _out, obs = watched_call(b, fill, [("argument 'h'", h)], "cpu", BUDGET, sync_watch=False)
    assert sorted(reach.describe(p) for p in obs.added) == ["argument 'h'.a['k']", "argument 'h'.b[0]",
                                                            "argument 'h'.c[1]['inner'][0]"]
    assert sorted(reach.describe(p) for _t, p in obs.created) == sorted(reach.describe(p) for p in obs.added)


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_write_probe_finds_in_place_writes_and_copies(name):
    _fw_mod, zeros, inc, copy = _tensor_fns(name)
    t1, t2, t3 = zeros(3), zeros(3), zeros(3)
    b = backends.get(name)
    r = reach.walk([("a", t1), ("b", t2), ("c", t3)], lambda t: isinstance(t, b.tensor_types()))
    probe = WriteProbe(b, r, BUDGET)
    inc(t1)
    copy(t2, t1)  # Paddle's copy_ moves no version counter: found by contents
    written = sorted(reach.describe(p) for _t, p in probe.written())
    assert written == ["a", "b"]


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_snapshot_restores_tensors_and_the_generator(name):
    fw, zeros, inc, _copy = _tensor_fns(name)
    b = backends.get(name)
    t = zeros(3)
    snap = Snapshot(b, [t], "cpu")
    inc(t)
    first = fw.rand([4])
    assert snap.rng_differs()
    snap.restore()
    assert not snap.rng_differs()
    assert b.equal(t, zeros(3))
    assert b.equal(fw.rand([4]), first)  # the same numbers again: the generator was put back


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_watched_call_reports_rebinds_additions_and_random_draws(name):
    fw, zeros, _inc, _copy = _tensor_fns(name)
    b = backends.get(name)
    h = Holder(zeros(2), None)

    def grow():
        h.a = fw.concat([h.a, zeros(1)]) if name == "paddle" else fw.cat([h.a, zeros(1)])
        h.b = zeros(1)
        return fw.rand([2])

    out, obs = watched_call(b, grow, [("argument 'h'", h)], "cpu", BUDGET, sync_watch=False)
    assert [reach.describe(p) for p in obs.rebound] == ["argument 'h'.a"]
    assert [reach.describe(p) for p in obs.added] == ["argument 'h'.b"]
    assert obs.drew_random
    warm = Warmup()
    warm.note(obs, b, out, [])
    assert warm.blocked is not None and warm.blocked.reason == "rebinds a tensor held by an object"
    assert "argument 'h'.a" in warm.blocked.message


def test_paddle_random_draws_block_the_key_with_paddles_reason():
    paddle = _fw("paddle")
    b = backends.get("paddle")
    out, obs = watched_call(b, lambda: paddle.rand([3]), [], "cpu", BUDGET, sync_watch=False)
    warm = Warmup()
    warm.note(obs, b, out, [])
    assert warm.blocked is not None and warm.blocked.reason == "draws random numbers"
    assert "seed and offset" in warm.blocked.message


def test_torch_random_draws_do_not_block():
    torch = _fw("torch")
    b = backends.get("torch")
    out, obs = watched_call(b, lambda: torch.rand(3), [], "cpu", BUDGET, sync_watch=False)
    warm = Warmup()
    warm.note(obs, b, out, [])
    assert obs.drew_random and warm.blocked is None


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_writes_to_inputs_are_mutated_leaves_and_others_are_state(name):
    _fw_mod, zeros, inc, _copy = _tensor_fns(name)
    b = backends.get(name)
    x, state = zeros(2), zeros(2)

    def run():
        inc(x)
        inc(state)

    _out, obs = watched_call(b, run, [("argument 'x'", x), ("global 'state'", state)], "cpu", BUDGET, False)
    warm = Warmup()
    warm.note(obs, b, None, [x])
    assert warm.mutated_leaves == {0}
    assert [reach.describe(p) for _t, p in warm.written_tensors()] == ["global 'state'"]


def test_paddle_content_probe_respects_the_budget():
    paddle = _fw("paddle")
    b = backends.get("paddle")
    t = paddle.zeros([1024])
    probe = WriteProbe(b, reach.walk([("big", t)], lambda x: isinstance(x, paddle.Tensor)), budget=16)
    assert probe.incomplete is not None and "GRAPHJIT_VERIFY_MAX_BYTES" in probe.incomplete


def test_torch_modes_are_part_of_the_key_and_shown_in_labels():
    torch = _fw("torch")
    g = graphjit.graphed(lambda x: x * 2)
    x = torch.ones(2)
    g(x)
    with torch.no_grad():
        g(x)
    with torch.inference_mode():
        g(x)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        g(x)
    labels = sorted(k["key"] for k in g.stats()["keys"])
    assert len(labels) == 4
    assert any(label.endswith("float32@cpu") for label in labels)  # the default mode shows nothing
    assert any("inference_mode" in label for label in labels)
    assert any("no_grad autocast(cpu, bfloat16)" in label for label in labels)


def test_paddle_modes_are_part_of_the_key_and_shown_in_labels():
    paddle = _fw("paddle")
    g = graphjit.graphed(lambda x: x * 2, tracer="eager")
    x = paddle.ones([2])
    g(x)
    with paddle.no_grad():
        g(x)
    labels = sorted(k["key"] for k in g.stats()["keys"])
    assert len(labels) == 2 and any("no_grad" in label for label in labels)
    b = backends.get("paddle")
    tracer = paddle.base.framework._dygraph_tracer()
    saved = (tracer._amp_level, tracer._amp_dtype)
    try:  # AMP has no effect on a CPU place; set the tracer's state as auto_cast would on a GPU
        tracer._amp_level = paddle.base.core.AmpLevel.O1
        tracer._amp_dtype = "bfloat16"
        amp = b.modes()
    finally:
        tracer._amp_level, tracer._amp_dtype = saved
    assert amp != b.modes()
    assert b.describe_modes(amp) == "amp(O1, bfloat16)"


def test_paddle_default_place_is_part_of_the_key_and_shown_in_labels(monkeypatch):
    """Paddle's default place (paddle.set_device) decides where the tensors a function makes without a place go: a
    graph froze it, so it is part of the key (as torch's default device is).  Read once per new place object."""
    paddle = _fw("paddle")
    from graphjit.backends.paddle import modes

    if modes._expected_place_of is None:
        pytest.skip("this Paddle has no _current_expected_place_")
    real = modes._expected_place_of

    class Elsewhere:
        def __str__(self):
            return "Place(gpu:7)"

    g = graphjit.graphed(lambda x: x * 2, tracer="eager")
    x = paddle.ones([2])
    g(x)
    other = Elsewhere()
    monkeypatch.setattr(modes, "_expected_place_of", lambda: other)
    g(x)
    monkeypatch.setattr(modes, "_expected_place_of", real)
    g(x)
    labels = [k["key"] for k in g.stats()["keys"]]
    assert len(labels) == 2 and sum("default place Place(gpu:7)" in label for label in labels) == 1, labels


def test_an_object_argument_is_keyed_by_its_tensors_and_attributes():
    torch = _fw("torch")
    from graphjit.keys import Signer

    def f(x, h):
        return x

    s = Signer(f, None, "auto", "f")
    a = s.sign(None, (torch.ones(2), Holder(torch.ones(3), 1)), {})
    b = s.sign(None, (torch.ones(2), Holder(torch.zeros(3), 1)), {})
    c = s.sign(None, (torch.ones(2), Holder(torch.ones(4), 1)), {})
    d = s.sign(None, (torch.ones(2), Holder(torch.ones(3), 2)), {})
    assert a.key == b.key and a.key != c.key and a.key != d.key
    assert len(a.tensors) == 2 and a.paths[1] == "argument 'h'.a"


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_a_tensor_written_on_another_device_than_the_keys_blocks_from_the_second_call(name):
    """An optimizer's state on the CPU written by a step graphed on a GPU (Paddle's AdamW beta powers, torch's
    Adam step counts before it is made capturable): a replay would not write it, so the key runs uncaptured.  The
    first call may still write it (torch's Adam is prepared after its first call).  The key's device here is
    ``meta:0``, standing for a GPU the CPU tensors are not on."""
    _fw, zeros, inc, _copy = _tensor_fns(name)
    b = backends.get(name)
    h = Holder(zeros(2), None)
    warm = Warmup()
    for call in range(2):
        out, obs = watched_call(b, lambda: inc(h.a), [("argument 'opt'", h)], "meta:0", BUDGET, sync_watch=False)
        assert [reach.describe(p) for p in obs.elsewhere] == ["argument 'opt'.a"]
        warm.note(obs, b, out, [])
        assert (warm.blocked is None) == (call == 0)
    assert warm.blocked.reason == "writes a tensor on another device"
    assert "argument 'opt'.a" in warm.blocked.message and "Momentum" in warm.blocked.message
    _out, same = watched_call(b, lambda: inc(h.a), [("argument 'opt'", h)], "cpu", BUDGET, sync_watch=False)
    assert same.elsewhere == []


OFF_DEVICE = {}


@pytest.mark.torch
@pytest.mark.parametrize("warmup", [1, 2])
def test_a_function_writing_off_the_graphs_device_runs_uncaptured_saying_so(emu, warmup):
    """A graphed function that writes a tensor on another device than its graph's on every call (here the graph is
    on the CPU and the tensor on ``meta``) runs uncaptured under that reason, also with one warmup call, where
    the first call is the only one watched before the capture."""
    torch = _fw("torch")
    OFF_DEVICE["count"] = torch.zeros(1, device="meta")

    def f(x):
        OFF_DEVICE["count"].add_(1)
        return x * 2

    g = graphjit.graphed(f, warmup=warmup)
    x = torch.ones(3)
    for _ in range(4):
        assert torch.equal(g(x), x * 2)
    st = g.stats()
    assert st["graphs"] == 0 and "writes a tensor on another device" in st["fallbacks"], g.report()


def test_type_decided_checks_answer_as_isinstance_does():
    """reach.ByType and guards.guardable decide by type once what isinstance would answer per value, and still ask
    a value whose class says another class is its own (a wrapt proxy: a graphed function stands for a function, and
    a walk must not enter graphjit's own state behind it)."""
    import enum
    import types

    import wrapt

    from graphjit import guardable as guards

    class Slow:
        """A class with its own __getattribute__ (as transformers' configurations): still decided by its type."""

        def __getattribute__(self, name):
            return object.__getattribute__(self, name)

    class Color(enum.Enum):
        RED = 1

    class Slotted:
        __slots__ = ("a",)

    def fn():
        return 1

    proxy = wrapt.FunctionWrapper(fn, lambda wrapped, instance, args, kwargs: wrapped(*args, **kwargs))
    values = [1, 2.0, "s", None, (1, 2), (1, [2]), frozenset({1}), {1, 2}, [1], {"a": 1}, bytearray(b"a"), Color.RED,
              Slow(), Slotted(), fn, proxy, types, int, wrapt.ObjectProxy((1, 2)), wrapt.ObjectProxy([1]), range(3)]
    for v in values:
        assert reach.skipped(v) == (type(v) in reach.ATOMS or isinstance(v, reach.OPAQUE)), v
        assert reach.skipped(v) == reach.skipped(v)  # the second answer comes from what the first decided
    assert reach.skipped(proxy) and not reach.skipped(wrapt.ObjectProxy([1]))
    got = {repr(v): guards.guardable(v) for v in values}
    assert got["1"] and got["(1, 2)"] and not got["(1, [2])"] and got["{1, 2}"] and got[repr(Color.RED)], got
    assert not any(got[repr(v)] for v in ([1], {"a": 1}, values[12], values[13], fn, types, int)), got
    assert guards.guardable(wrapt.ObjectProxy((1, 2))) and not guards.guardable(wrapt.ObjectProxy([1]))


class _Output(collections.OrderedDict):
    """Like transformers' ModelOutput: an OrderedDict subclass that forbids its own update and pop."""

    def update(self, *a, **k):
        raise RuntimeError("no update on an output")

    def pop(self, *a, **k):
        raise RuntimeError("no pop on an output")


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_python_state_put_back_leaves_ordered_dicts_whole_and_in_their_order(name):
    """PyState puts an OrderedDict (and a subclass that forbids update, as transformers' outputs do) back through
    OrderedDict's own methods: the same items in the same order, and it still iterates.  Before, dict.clear and
    dict.update left an OrderedDict whose order named keys it no longer had: every later iteration raised KeyError
    (seen as a KeyError 'forward' in the next capture of a Paddle function, from an OrderedDict a traced run had
    added to)."""
    from graphjit.pystate import PyState

    _fw, zeros, _add, _copy = _tensor_fns(name)
    b = backends.get(name)
    t = zeros(2)
    hooks = collections.OrderedDict(first=1, second=2)
    out = _Output(logits=t, extra=3)
    empty: collections.OrderedDict = collections.OrderedDict()
    state = PyState(b, [("hooks", hooks), ("out", out), ("empty", empty)])
    hooks["forward"] = 3
    hooks.move_to_end("first")
    del hooks["second"]
    collections.OrderedDict.__setitem__(out, "added", 4)
    collections.OrderedDict.__delitem__(out, "extra")
    empty["forward"] = 5
    assert state.restore() == 3
    assert list(hooks.items()) == [("first", 1), ("second", 2)]
    assert list(out.items()) == [("logits", t), ("extra", 3)] and list(out) == ["logits", "extra"]
    assert list(empty) == [] and dict(empty) == {}
    empty["again"] = 1  # still an OrderedDict that works
    assert list(empty) == ["again"]
    # a run that only reorders is put back in order; a key something put in by dict's own methods before the copy
    # (missing from the OrderedDict's order) is kept, not taken for one the run added
    order = collections.OrderedDict(a=1, b=2)
    odd = collections.OrderedDict(a=1)
    dict.__setitem__(odd, "c", 3)
    state = PyState(b, [("order", order), ("odd", odd)])
    order.move_to_end("a")
    assert state.restore() == 1 and list(order) == ["a", "b"]
    assert dict.__len__(odd) == 2 and dict.get(odd, "c") == 3
