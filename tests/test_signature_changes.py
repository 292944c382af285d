"""Keys that never capture say why, and labels tell keys apart (issue 20): a key still warming up when the
next call comes with another signature names the path that changed and both values, in stats() and
report() (its calls stay warmup calls, not fallbacks: keys called in turn capture in the
end); keys that differ only in values their labels would not show get
those values in their labels.  Lifecycle tests run on the CPU through tests/graph_emulator.py."""

from __future__ import annotations

import dataclasses
import logging

import pytest

torch = pytest.importorskip("torch")


import graphjit  # noqa: E402
from graphjit.history import SIGNATURE_CHANGES  # noqa: E402

pytestmark = pytest.mark.torch


class Counter:
    """A cache-like object with a Python counter the function advances (transformers' sliding-window layers
    hold their length as a Python int): every call's key differs there, and nowhere a label shows."""

    def __init__(self) -> None:
        self.buf = torch.zeros(8)
        self.n = 0


def _counting_step():
    def step(x, state):
        state.buf[state.n] = x.sum()
        state.n += 1
        return state.buf * 2

    return step


def _writing_step():
    def step(x, state):  # reads the counter; the caller advances it
        state.buf[state.n] = x.sum()
        return state.buf * 2

    return step


def _call_and_advance(g, x, state):
    out = g(x, state)
    state.n += 1
    return out


def test_a_key_whose_signature_changes_every_call_says_where_within_warmup_plus_one_calls(emu):
    g = graphjit.graphed(_writing_step(), warmup=2)
    state = Counter()
    x = torch.ones(3)
    _call_and_advance(g, x, state)
    _call_and_advance(g, x, state)  # 2 calls <= warmup + 1: the first key already says why
    first = g.stats()["keys"][0]
    reason = f"{SIGNATURE_CHANGES}: argument 'state'.n"
    assert first["state"] == "warmup" and first["reason"] == reason, first
    assert "0 in this key's call, 1 in the next" in first["detail"], first["detail"]
    for _ in range(4):
        _call_and_advance(g, x, state)
    s = g.stats()
    assert s["graphs"] == 0 and s["fallbacks"] == {}, s  # warmup calls, each its one eager call
    assert [k["reason"] for k in s["keys"]] == [reason] * 5 + [None]  # the last has no successor yet
    assert sum(k["warmups"] for k in s["keys"]) == 6
    report = g.report()
    assert f"still warming up x5 key(s): {reason}" in report and "in this key's call" in report, report
    labels = [k["key"] for k in s["keys"]]
    assert len(set(labels)) == 6 and all(f"state.n={i}" in label for i, label in enumerate(labels)), labels
    torch.testing.assert_close(state.buf, torch.tensor([3.0] * 6 + [0.0] * 2))  # and every call ran once


def test_a_call_that_advances_a_counter_of_its_own_key_is_replayed_and_the_replay_advances_it(emu):
    """A step that advances a Python counter inside an object it is passed (as transformers' sliding-window cache
    layers do) changes its own key.  Each value of the counter is a key of its own, captured once it repeats (loops
    that reset the counter, as each generate() call does), and each replay sets the counter as the call would: the
    emulator freezes what a capture read, so a replay that left the counter behind would write the same slot again
    and the outputs would differ from eager's."""

    def run(fn):
        state, outs = Counter(), []
        for _loop in range(4):
            state.buf.zero_()
            state.n = 0
            for _ in range(4):
                outs.append(fn(torch.ones(3), state).clone())
                assert state.n == len(outs) - 4 * _loop
        return outs, state

    want, eager_state = run(_counting_step())
    g = graphjit.graphed(_counting_step(), warmup=1)
    got, state = run(g)
    assert all(torch.equal(a, b) for a, b in zip(got, want)) and state.n == eager_state.n == 4
    s = g.stats()
    assert s["graphs"] == 4 and s["fallbacks"] == {} and s["replays"] == 12, s  # loop 2 captures, 3 and 4 replay
    assert all(k["advances"] == ["argument 'state'.n"] and k["reason"] is None for k in s["keys"]), s["keys"]


def test_the_reason_names_a_tensors_metadata_and_goes_away_when_the_key_comes_back(emu):
    g = graphjit.graphed(lambda x, scale: x * scale, warmup=2)
    a, b = torch.ones(2, 3), torch.ones(4, 3)
    g(a, 1.0)
    g(b, 1.0)
    first = g.stats()["keys"][0]
    first_reason = f"{SIGNATURE_CHANGES}: argument 'x'"
    assert first["reason"] == first_reason, first
    assert "[2, 3] float32 cpu in this key's call, [4, 3] float32 cpu in the next" in first["detail"]
    g(a, 1.0)  # the first key again: warming up after all, no reason, its call no longer counted under one
    first, second = g.stats()["keys"]
    assert first["reason"] is None and first["uncaptured_calls"] == 0
    assert second["reason"] == first_reason and "[4, 3] float32 cpu in this key's call" in second["detail"]
    assert g.stats()["fallbacks"] == {}
    g(a, 1.0)
    g(a, 1.0)
    s = g.stats()
    assert s["graphs"] == 1 and s["keys"][0]["state"] == "replay" and s["keys"][0]["reason"] is None, s


def test_keys_called_in_turn_all_capture_and_count_nothing(emu):
    g = graphjit.graphed(lambda x: x + 1)
    for _ in range(4):
        for n in (1, 2, 3):
            g(torch.ones(n))
    s = g.stats()
    assert s["graphs"] == 3 and s["fallbacks"] == {} and all(k["reason"] is None for k in s["keys"]), s


def test_a_key_repeated_until_it_captures_gets_no_reason_and_no_count(emu):
    g = graphjit.graphed(lambda x: x + 1)
    for n in (2, 2, 2, 4, 4, 4, 2):
        g(torch.ones(n))
    s = g.stats()
    assert s["graphs"] == 2 and s["fallbacks"] == {} and all(k["reason"] is None for k in s["keys"]), s


def test_the_new_keys_warning_names_the_path_inside_the_argument(emu, gj_log):
    g = graphjit.graphed(_writing_step(), warmup=1)
    state = Counter()
    for _ in range(8):
        _call_and_advance(g, torch.ones(1), state)
    warned = [r.getMessage() for r in gj_log.records if r.levelno == logging.WARNING and "input signatures" in
              r.getMessage()]
    assert warned and "argument 'state'.n changes from call to call" in warned[0], warned


def test_keys_a_call_advances_itself_do_not_warn_of_new_keys(emu, gj_log):
    """A counter the function advances makes one key per value by design (graphjit/advances.py), captured once the
    values repeat: not the accident the new-keys warning is about."""
    g = graphjit.graphed(_counting_step(), warmup=1)
    state = Counter()
    for _ in range(8):
        g(torch.ones(1), state)
    assert not [r for r in gj_log.records if "input signatures" in r.getMessage()]


def test_inputs_on_several_devices_say_so_on_their_key(emu):
    g = graphjit.graphed(lambda x, y: x * 2)
    g(torch.ones(2), torch.ones(2, device="meta"))
    (key,) = g.stats()["keys"]
    assert key["state"] == "fallback" and key["reason"] == "inputs on several devices (cpu, meta:0)", key
    assert "argument 'x' is on cpu" in key["detail"] and "argument 'y' is on meta:0" in key["detail"], key
    assert key["uncaptured_calls"] == 1


def test_a_key_beyond_max_graphs_says_so_on_its_key(emu):
    g = graphjit.graphed(lambda x: x + 1, max_graphs=1, warmup=1)
    for n in (1, 1, 2):
        g(torch.ones(n))
    keys = g.stats()["keys"]
    assert keys[1]["reason"] == "max_graphs reached" and "max_graphs=1" in keys[1]["detail"], keys



def test_keys_warming_side_by_side_capture_no_more_than_max_graphs(emu):
    """Three shapes in turn each begin warming while no graph exists yet: only the first to finish captures; the
    others run uncaptured from the call that would have captured them (the third of each, after two warmups)."""
    g = graphjit.graphed(lambda x: x * 2 + 1, max_graphs=1, warmup=2)
    for _ in range(5):
        for n in (1, 2, 3):
            x = torch.arange(float(n))
            assert torch.equal(g(x), x * 2 + 1)
    st = g.stats()
    assert st["graphs"] == 1 and st["captures"] == 1, st
    assert st["fallbacks"] == {"max_graphs reached": 2 * 3}, st
    assert sorted(k["reason"] for k in st["keys"] if k["state"] == "fallback") == ["max_graphs reached"] * 2, st

# -- labels -------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Cfg:
    scale: float
    name: str = "c"


@dataclasses.dataclass
class Holder:
    x: object
    mode: int


FRAMEWORKS = ["torch", pytest.param("paddle", marks=pytest.mark.paddle)]


def _ones(framework: str, n: int):
    if framework == "paddle":
        paddle = pytest.importorskip("paddle")
        return paddle.ones([n])
    return torch.ones(n)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_labels_show_the_dataclass_field_that_tells_keys_apart(framework):
    g = graphjit.graphed(lambda x, cfg: x * cfg.scale, tracer="eager")
    for scale in (1.0, 2.0, 3.0):
        g(_ones(framework, 2), Cfg(scale))
    labels = [k["key"] for k in g.stats()["keys"]]
    assert labels == [f"x[2] float32@cpu cfg.scale={s}" for s in (1.0, 2.0, 3.0)], labels
    assert all(f"cfg.scale={s}" in g.report() for s in (1.0, 2.0, 3.0))


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_labels_show_a_field_of_an_object_that_holds_tensors(framework):
    g = graphjit.graphed(lambda h: h.x * h.mode, tracer="eager")
    x = _ones(framework, 3)
    g(Holder(x, 1))
    g(Holder(x, 2))
    g(Holder(x, 2))  # the same key again: no new label
    labels = [k["key"] for k in g.stats()["keys"]]
    assert labels == ["h.x[3] float32@cpu h.mode=1", "h.x[3] float32@cpu h.mode=2"], labels


def test_labels_stay_short_where_they_already_differ():
    g = graphjit.graphed(lambda x, cfg: x * cfg.scale)
    g(torch.ones(2), Cfg(1.0))
    g(torch.ones(3), Cfg(2.0))
    assert [k["key"] for k in g.stats()["keys"]] == ["x[2] float32@cpu", "x[3] float32@cpu"]


def test_labels_tell_apart_keys_that_differ_in_one_field_each():
    g = graphjit.graphed(lambda x, cfg: x * cfg.scale)
    for scale, name in ((1.0, "a"), (1.0, "b"), (2.0, "a"), (2.0, "b")):
        g(torch.ones(2), Cfg(scale, name))
    labels = [k["key"] for k in g.stats()["keys"]]
    assert len(set(labels)) == 4, labels


def test_under_a_compiling_tracer_a_keys_first_uncaptured_call_runs_the_python_function(emu, monkeypatch):
    """A key that cannot try to capture (inputs on several devices, past max_graphs) runs its first call through the
    Python function, not the compiler (a signature seen once is not worth seconds of compiling), and its later
    calls through the traced function; results are the same, every call counted under the key's reason."""
    from graph_emulator import record_compile_tracer

    traced_calls = record_compile_tracer(monkeypatch)
    g = graphjit.graphed(lambda x, y: x * 2, max_graphs=1, warmup=1, tracer="compile")
    for n in (1, 1):  # the one graph
        assert torch.equal(g(torch.ones(n), torch.ones(1)), torch.full((n,), 2.0))
    del traced_calls[:]
    for _ in range(3):  # past max_graphs: the first call untraced, the others traced
        assert torch.equal(g(torch.ones(2), torch.ones(1)), torch.full((2,), 2.0))
    assert [tuple(a[0].shape) for a, _kw in traced_calls] == [(2,), (2,)]
    del traced_calls[:]
    meta = torch.empty(1, device="meta")
    for _ in range(2):  # several devices
        assert torch.equal(g(torch.ones(3), meta), torch.full((3,), 2.0))
    assert [tuple(a[0].shape) for a, _kw in traced_calls] == [(3,)]
    st = g.stats()
    assert st["fallbacks"] == {"max_graphs reached": 3, "inputs on several devices (cpu, meta:0)": 2}, st
    assert [k["uncaptured_calls"] for k in st["keys"][1:]] == [3, 2]
    eager = graphjit.graphed(lambda x, y: x * 2, max_graphs=1, warmup=1)  # the eager tracer: nothing changes
    for n in (1, 1, 2):
        eager(torch.ones(n), torch.ones(1))
    assert eager.stats()["fallbacks"] == {"max_graphs reached": 1}


def test_the_value_a_call_changes_is_named_past_its_dynamic_arguments(emu):
    """A ``dynamic=`` argument before the value that moved is not what the reason names (from a review)."""

    class Cache:
        def __init__(self) -> None:
            self.n = 0
            self.buf = torch.zeros(3)

    def body(step, cache, x):
        cache.n += 1
        return x * step

    f = graphjit.graphed(body, dynamic=("step",))
    c = Cache()
    for i in range(3):
        c.n = 0
        assert torch.equal(f(torch.tensor(float(i)), c, torch.ones(3)), torch.full((3,), float(i)))
    (key,) = f.stats()["keys"]
    assert key["reason"] == "changes its own signature: argument 'cache'.n", key
    assert "(0 before the call, 1 after)" in key["detail"], key
