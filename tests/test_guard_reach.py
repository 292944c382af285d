"""Values a call reads without receiving them, reached where the guards' walk did not look before (found by a probe
of the emulator): a class attribute set on a subclass over its base's value, the closure cells of a function stored
on an object or in a container, a helper's defaults, a property replaced on the class, what a weak reference refers
to.  Each kept replaying the graph of the old value: silently wrong.  CPU lifecycle through tests/graph_emulator.py."""

from __future__ import annotations

import functools
import sys
import weakref
from collections.abc import Callable
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import graphjit  # noqa: E402

pytestmark = pytest.mark.torch


def _check(fn: Callable[[Any], Any], change: Callable[[], None]) -> dict[str, Any]:
    """Six calls, ``change()``, four more; every output equal to the function's own eager call.  The stats after."""
    g = graphjit.graphed(fn)
    for i in range(10):
        if i == 6:
            change()
        x = torch.arange(4.0) + 1
        assert torch.equal(g(x), fn(x)), i
    st = g.stats()
    assert st["replays"] >= 4, st
    return st


class _Base(torch.nn.Module):
    scale = 2.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale


class _Sub(_Base):
    pass


def test_a_class_attribute_set_on_a_subclass_over_its_bases(emu, scan) -> None:
    _check(_Sub(), lambda: setattr(_Sub, "scale", 5.0))


class _Prop:
    @property
    def s(self) -> float:
        return 2.0


def test_a_property_replaced_on_the_class(emu, scan) -> None:
    o = _Prop()
    _check(lambda x: x * o.s, lambda: setattr(_Prop, "s", property(lambda self: 5.0)))


def _scaler() -> tuple[Callable[[Any], Any], Callable[[float], None], list[float]]:
    k, box = 2.0, [2.0]

    def set_k(v: float) -> None:
        nonlocal k
        k = v
    return (lambda x: x * k * box[0]), set_k, box


class _Holder(torch.nn.Module):
    def __init__(self, act: Any) -> None:
        super().__init__()
        self.act = act
        self.fns = [act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(x) + self.fns[0](x)


@pytest.mark.parametrize("how", ["rebound", "in place", "partial"])
def test_the_closure_of_a_function_stored_on_an_object(emu, scan, how) -> None:
    act, set_k, box = _scaler()
    m = _Holder(functools.partial(act) if how == "partial" else act)
    _check(m, (lambda: box.__setitem__(0, 3.0)) if how == "in place" else (lambda: set_k(5.0)))


def _helper(x: torch.Tensor, s: float = 2.0, cfg: dict[str, float] = {"s": 1.0}) -> torch.Tensor:  # noqa: B006
    return x * s * cfg["s"]


@pytest.mark.parametrize("how", ["replaced", "in place"])
def test_a_helpers_defaults(emu, scan, how) -> None:
    defaults = _helper.__defaults__

    def change() -> None:
        if how == "replaced":
            _helper.__defaults__ = (5.0, {"s": 1.0})
        else:
            _helper.__defaults__[1]["s"] = 3.0  # type: ignore[index]
    try:
        _check(lambda x: _helper(x) + 1, change)
    finally:
        _helper.__defaults__ = defaults
        defaults[1]["s"] = 1.0  # type: ignore[index]


class _Parent(torch.nn.Module):
    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = scale


class _Child(torch.nn.Module):
    """Holds its parent by a weak reference, as modules that must not keep their owner alive do."""

    def __init__(self, parent: torch.nn.Module) -> None:
        super().__init__()
        self._parent = weakref.ref(parent)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self._parent().scale


@pytest.mark.parametrize("how", ["attribute", "another parent"])
def test_what_a_weak_reference_refers_to(emu, scan, how) -> None:
    parent, other = _Parent(2.0), _Parent(5.0)
    child = _Child(parent)
    _check(child, (lambda: setattr(parent, "scale", 5.0)) if how == "attribute"
           else (lambda: setattr(child, "_parent", weakref.ref(other))))


@pytest.mark.parametrize("held", ["closure cell", "attribute"])
def test_a_users_module_held_otherwise_than_as_a_global(emu, scan, tmp_path, monkeypatch, held) -> None:
    """``c = config`` then ``c.SCALE``, or ``self.cfg = config`` then ``self.cfg.SCALE``: what the code names of a
    module of the user's own, as for one held as a global."""
    cfg = _users_module(tmp_path, monkeypatch, "gj_reach_cfg", "SCALE = 2.0\n")

    def make() -> Callable[[Any], Any]:
        c = cfg
        return lambda x: x * c.SCALE

    _check(make() if held == "closure cell" else _ModuleHolder(cfg), lambda: setattr(cfg, "SCALE", 5.0))


def _users_module(tmp_path: Any, monkeypatch: pytest.MonkeyPatch, name: str, text: str) -> Any:
    """A module of the user's own, ``name`` with ``text``, imported from ``tmp_path`` (dropped from ``sys.modules``
    after the test)."""
    import importlib

    (tmp_path / f"{name}.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module(name)
    monkeypatch.setitem(sys.modules, name, module)  # (undone: the entry goes again)
    return module


class _ModuleHolder(torch.nn.Module):
    """Holds a module as an attribute and reads its ``SCALE``."""

    def __init__(self, cfg: Any) -> None:
        super().__init__()
        self.cfg = cfg

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.cfg.SCALE


def test_a_function_on_self_when_the_graphed_function_is_the_bound_forward(emu, scan) -> None:
    """``model.forward = graphed(model.forward)``, as for transformers: what ``self.act`` closes over is read inside
    the call (its module's own hooks run outside it; its functions do not)."""
    class ActOnly(torch.nn.Module):
        def __init__(self, act: Any) -> None:
            super().__init__()
            self.act = act

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.act(x)

    act, set_k, _box = _scaler()
    _check(ActOnly(act).forward, lambda: set_k(5.0))


class _SubA(_Base):
    pass


class _SubB(_Base):
    pass


def test_sibling_subclasses_each_see_a_value_set_on_them(emu, scan) -> None:
    """Two classes reach one base: a value set later on either (whichever the walk met first) is a changed value."""
    for sub in (_SubA, _SubB):
        a, b = _SubA(), _SubB()
        try:
            _check(lambda x, a=a, b=b: a(x) + b(x), lambda sub=sub: setattr(sub, "scale", 5.0))
        finally:
            if "scale" in vars(sub):
                delattr(sub, "scale")


def test_a_users_big_module_held_by_an_object(emu, scan, tmp_path, monkeypatch) -> None:
    """A module of more than 256 globals: the ones the code names are guarded all the same."""
    text = "".join(f"V{i} = {i}\n" for i in range(400)) + "SCALE = 2.0\n"
    cfg = _users_module(tmp_path, monkeypatch, "gj_reach_big", text)
    _check(_ModuleHolder(cfg), lambda: setattr(cfg, "SCALE", 5.0))
