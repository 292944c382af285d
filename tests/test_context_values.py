"""Values a call reads per thread or per context (graphjit/context_values.py): a ``contextvars.ContextVar``'s value
and a ``threading.local``'s attributes.  Before, the walk of objects saw nothing in either, and a replay after
``SCALE.set(5.0)`` or ``tls.k = 7.0`` returned the old value's result: silently wrong.  CPU lifecycle through
tests/graph_emulator.py, the guards compared both ways (``scan``: the Python expression and the lane's C scan)."""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import graphjit  # noqa: E402

pytestmark = pytest.mark.torch

SCALE: contextvars.ContextVar[float] = contextvars.ContextVar("SCALE", default=2.0)
UNSET: contextvars.ContextVar[float] = contextvars.ContextVar("UNSET")
CONFIG: contextvars.ContextVar[Any] = contextvars.ContextVar("CONFIG")


class _Config:
    def __init__(self, bias: float) -> None:
        self.bias = bias


class _Local(threading.local):
    def __init__(self) -> None:
        self.k = 2.0


TLS = threading.local()
TLS.k = 2.0
SUB = _Local()


def _scaled(x: torch.Tensor) -> torch.Tensor:
    return x * SCALE.get()


def _config(x: torch.Tensor) -> torch.Tensor:
    return x + CONFIG.get().bias


def _maybe(x: torch.Tensor) -> torch.Tensor:
    return x * UNSET.get(3.0)


def _tls(x: torch.Tensor) -> torch.Tensor:
    return x * TLS.k


def _sub(x: torch.Tensor) -> torch.Tensor:
    return x * SUB.k


@pytest.fixture
def scale() -> Any:
    """SCALE set to 2.0 in this context for the test, reset after."""
    token = SCALE.set(2.0)
    yield
    SCALE.reset(token)


def _calls(g: Any, fn: Callable[[Any], Any], n: int) -> None:
    for _ in range(n):
        x = torch.arange(4.0) + 1
        assert torch.equal(g(x), fn(x))


def test_a_context_variables_value_set_after_the_capture(emu, scan, scale) -> None:
    g = graphjit.graphed(_scaled)
    _calls(g, _scaled, 5)
    assert g.stats()["replays"] >= 2
    SCALE.set(5.0)
    _calls(g, _scaled, 5)  # its own graph, warmed up and captured
    SCALE.set(2.0)
    replays = g.stats()["replays"]
    _calls(g, _scaled, 2)  # the first value's graph again
    assert g.stats()["replays"] == replays + 2 and g.stats()["graphs"] == 2, g.stats()


def test_a_context_variable_in_another_context(emu, scan, scale) -> None:
    g = graphjit.graphed(_scaled)
    _calls(g, _scaled, 5)
    ctx = contextvars.copy_context()
    ctx.run(SCALE.set, 7.0)
    x = torch.arange(4.0) + 1
    assert torch.equal(ctx.run(g, x), x * 7.0)
    assert torch.equal(g(x), x * 2.0)


def test_an_unset_context_variable_set_later(emu, scan) -> None:
    g = graphjit.graphed(_maybe)
    _calls(g, _maybe, 5)
    token = UNSET.set(6.0)
    try:
        _calls(g, _maybe, 2)
    finally:
        UNSET.reset(token)
    _calls(g, _maybe, 2)


def test_the_object_a_context_variable_holds(emu, scan) -> None:
    g = graphjit.graphed(_config)
    cfg = _Config(1.0)
    token = CONFIG.set(cfg)
    try:
        _calls(g, _config, 5)
        cfg.bias = 4.0  # changed in place
        _calls(g, _config, 4)
        CONFIG.set(_Config(9.0))  # another object
        _calls(g, _config, 4)
        assert g.stats()["replays"] >= 2
    finally:
        CONFIG.reset(token)


@pytest.mark.parametrize("fn,holder", [(_tls, TLS), (_sub, SUB)], ids=["threading.local", "subclass"])
def test_a_thread_locals_attribute(emu, scan, fn: Callable[[Any], Any], holder: Any) -> None:
    g = graphjit.graphed(fn)
    holder.k = 2.0
    _calls(g, fn, 5)
    assert g.stats()["replays"] >= 2
    holder.k = 7.0
    _calls(g, fn, 4)
    got: dict[str, Any] = {}

    def other() -> None:  # another thread's own value: its graph, or none, never this thread's
        holder.k = 3.0
        x = torch.arange(4.0) + 1
        got["out"], got["want"] = g(x), x * 3.0

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert torch.equal(got["out"], got["want"])
    _calls(g, fn, 2)  # this thread's 7.0 again
    holder.k = 2.0


_COUNTER = threading.local()


def _counted(x: torch.Tensor) -> torch.Tensor:
    _COUNTER.n = getattr(_COUNTER, "n", 0) + 1
    return x * 2


def test_a_counter_in_a_thread_local_runs_eagerly_once_per_call(emu, scan) -> None:
    _COUNTER.n = 0
    g = graphjit.graphed(_counted)
    for i in range(6):
        g(torch.ones(3))
        assert _COUNTER.n == i + 1
    with graphjit.capture_scope(progress=False):
        g(torch.ones(5))
    assert _COUNTER.n == 7
    assert g.stats()["replays"] == 0
    assert any("writes a Python value" in str(k.get("reason")) for k in g.stats()["keys"]), g.stats()["keys"]


STEPS: contextvars.ContextVar[int] = contextvars.ContextVar("STEPS", default=0)


def _stepped(x: torch.Tensor) -> torch.Tensor:
    STEPS.set(STEPS.get() + 1)
    return x * 2


def test_a_counter_in_a_context_variable_runs_eagerly_once_per_call(emu, scan) -> None:
    token = STEPS.set(0)
    try:
        g = graphjit.graphed(_stepped)
        for i in range(6):
            g(torch.ones(3))
            assert STEPS.get() == i + 1
        with graphjit.capture_scope(progress=False):
            g(torch.ones(5))
        assert STEPS.get() == 7  # each call's own run, once: no replay skipped it, no extra run left it advanced
        keys = g.stats()["keys"]
        assert g.stats()["replays"] == 0 and all(k["reason"] == "writes a Python value on every call" for k in keys)
        assert all("value(global 'STEPS')" in str(k["detail"]) for k in keys), keys
    finally:
        STEPS.reset(token)


def test_a_changed_context_variable_is_named_in_the_keys_label(emu, scan, scale) -> None:
    g = graphjit.graphed(_scaled)
    _calls(g, _scaled, 4)
    SCALE.set(3.5)
    _calls(g, _scaled, 1)
    labels = [k["key"] for k in g.stats()["keys"]]
    assert any("value(global 'SCALE')" in label and "3.5" in label for label in labels), labels


class _SlottedLocal(threading.local):
    __slots__ = ("k", "n")


class _ClassValueLocal(threading.local):
    scale = 2.0


SLOTTED, CLASS_VALUED, BARE = _SlottedLocal(), _ClassValueLocal(), threading.local()
SLOTTED.k = 2.0


def _slotted(x: torch.Tensor) -> torch.Tensor:
    return x * SLOTTED.k


def _class_valued(x: torch.Tensor) -> torch.Tensor:
    return x * CLASS_VALUED.scale


def _absent(x: torch.Tensor) -> torch.Tensor:
    return x * getattr(BARE, "k", 2.0)


@pytest.mark.parametrize("fn,change", [
    (_slotted, lambda: setattr(SLOTTED, "k", 5.0)),
    (_class_valued, lambda: setattr(_ClassValueLocal, "scale", 5.0)),
    (_class_valued, lambda: setattr(CLASS_VALUED, "scale", 5.0)),  # this thread's attribute over the class's value
    (_absent, lambda: setattr(BARE, "k", 5.0)),  # absent at capture, set later
], ids=["slot", "class attribute", "shadowed", "absent"])
def test_a_thread_local_subclass_keeps_its_class_slot_and_absence_guards(emu, scan, fn: Callable[[Any], Any],
                                                                        change: Callable[[], None]) -> None:
    g = graphjit.graphed(fn)
    _calls(g, fn, 5)
    assert g.stats()["replays"] >= 2
    change()
    _calls(g, fn, 4)


def _slot_counted(x: torch.Tensor) -> torch.Tensor:
    SLOTTED.n += 1
    return x * 2


def test_a_slot_counter_of_a_thread_local_advances_once_per_call_in_a_scope(emu, scan) -> None:
    SLOTTED.n = 0
    g = graphjit.graphed(_slot_counted)
    with graphjit.capture_scope(progress=False):
        g(torch.ones(5))
    assert SLOTTED.n == 1  # the extra warmup run's increment undone
    for i in range(3):
        g(torch.ones(5))
        assert SLOTTED.n == i + 2
    assert g.stats()["replays"] == 0


MODE: contextvars.ContextVar[str] = contextvars.ContextVar("MODE", default="idle")


def _sets_mode(x: torch.Tensor) -> torch.Tensor:
    MODE.set("ran")
    return x * 2


def test_a_function_that_sets_a_context_variable_runs_it_on_every_call(emu, scan) -> None:
    g = graphjit.graphed(_sets_mode)
    for _ in range(6):
        MODE.set("idle")
        g(torch.ones(3))
        assert MODE.get() == "ran"
    assert g.stats()["replays"] == 0, g.stats()


class _Holder:
    def __init__(self, var: contextvars.ContextVar[float]) -> None:
        self.var = var


def _by_argument(x: torch.Tensor, var: contextvars.ContextVar[float]) -> torch.Tensor:
    return x * var.get()


def _by_holder(x: torch.Tensor, holder: _Holder) -> torch.Tensor:
    return x * holder.var.get()


def _by_local(x: torch.Tensor, tls: threading.local) -> torch.Tensor:
    return x * tls.k


@pytest.mark.parametrize("kind", ["ContextVar", "holder", "threading.local"])
def test_one_passed_as_an_argument_is_keyed_by_what_it_holds(emu, scan, kind: str) -> None:
    """An argument is keyed, not guarded: a ContextVar or threading.local there is keyed by its value in the calling
    context or thread (before, by identity: the old value's graph replayed)."""
    var: contextvars.ContextVar[float] = contextvars.ContextVar("arg", default=2.0)
    tls = threading.local()
    tls.k = 2.0
    fn, arg = {"ContextVar": (_by_argument, var), "holder": (_by_holder, _Holder(var)),
               "threading.local": (_by_local, tls)}[kind]
    g = graphjit.graphed(fn)
    for i in range(10):
        if i == 5:
            var.set(5.0)
            tls.k = 5.0
        x = torch.arange(4.0) + 1
        assert torch.equal(g(x, arg), fn(x, arg)), i
    assert g.stats()["replays"] >= 4 and g.stats()["graphs"] == 2, g.stats()


def _plus_held(x: torch.Tensor, var: contextvars.ContextVar[Any]) -> torch.Tensor:
    return x + var.get()


def test_a_tensor_in_a_context_variable_passed_as_an_argument(emu, scan) -> None:
    """Keyed by the tensor's identity (not an input the graph copies: it reads it where it is): the same tensor
    changed in place replays, a new one each call is a new key (uncaptured once they keep changing)."""
    var: contextvars.ContextVar[Any] = contextvars.ContextVar("held")
    t = torch.zeros(3)
    var.set(t)
    g = graphjit.graphed(_plus_held)
    for i in range(6):
        t.fill_(float(i))
        x = torch.ones(3)
        assert torch.equal(g(x, var), x + i)
    assert g.stats()["replays"] >= 2
    for i in range(6):
        var.set(torch.full((3,), 10.0 + i))
        x = torch.ones(3)
        assert torch.equal(g(x, var), x + 10 + i)


@pytest.mark.parametrize("name", ["context_variable", "thread_local"])
def test_under_the_compile_tracer(emu, monkeypatch, name: str) -> None:
    """``tracer="compile"``: Dynamo's front end (its ``eager`` back end on the CPU), each value toggled between calls:
    every output eager's, a graph per value, replayed."""
    import guard_cases as cases

    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **_kw: real(fn, backend="eager"))
    make = cases.VALUES[name]
    want, _state, _ = cases.run(make, "cpu", graph=False)
    got, _state, g = cases.run(make, "cpu", graph=True, tracer="compile")
    assert cases.max_diff(got, want) == 0.0, g.report()
    st = g.stats()
    assert st["graphs"] == 2 and st["replays"] >= 6 and not st["fallbacks"], g.report()
