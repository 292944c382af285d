"""Values a graphed function reads as attributes of the user's own modules (``import config``; ``config.SCALE``), on
the CPU through the emulated CUDA graph (a replay runs no Python, so a value frozen at capture shows): each change
between calls is a guarded value that changed, as a global of the function's own module is, and every call equals the
eager one.  Modules of Python's standard library and of installed packages (``math.pi``, ``torch.float32``) are not
read for values (graphjit.reach.user_module)."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

import config_module as config  # noqa: E402

import graphjit  # noqa: E402
from graphjit.reach import user_module  # noqa: E402

pytestmark = pytest.mark.torch


def _scaled(x):
    return x * config.SCALE


def _shifted(x):
    return x + config.TABLE["shift"][0]


def _tempered(x):
    return x / config.Knobs.temp


def _set_scale(v):
    config.SCALE = v


def _set_shift(v):
    config.TABLE["shift"][0] = v


def _set_temp(v):
    config.Knobs.temp = v


@pytest.mark.parametrize(("fn", "change", "start"), [(_scaled, _set_scale, 1.0), (_shifted, _set_shift, 0.0),
                                                     (_tempered, _set_temp, 1.0)], ids=["rebound", "item", "class"])
def test_a_value_of_the_users_own_module_is_guarded(emu, fn, change, start):
    g = graphjit.graphed(fn)
    x = torch.ones(2, 4)
    try:
        with torch.no_grad():
            for i in range(9):
                if i == 5:
                    change(3.0)
                assert torch.equal(g(x), fn(x)), (i, g.report())
    finally:
        change(start)
    st = g.stats()
    assert st["graphs"] == 2 and st["replays"] >= 4, g.report()


def test_only_the_users_own_modules_are_read_for_values():
    assert user_module(config)
    assert not user_module(math) and not user_module(torch) and not user_module(graphjit)


def test_modules_that_import_each_other_are_read_once_each(tmp_path, monkeypatch):
    """Every user module the code reaches is read once per scan, whatever the orders it can be reached in (modules
    importing each other made a slot for every chain: 109,600 for eight), and a module whose own ``__getattr__``
    raises something other than AttributeError is no crash."""
    import importlib
    import types

    from graphjit import guards

    n = 6
    names = [f"gj_mesh_{i}" for i in range(n)]
    for i, name in enumerate(names):
        imports = "".join(f"import {other}\n" for other in names if other != name)
        (tmp_path / f"{name}.py").write_text(f"{imports}VALUE = {i}.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    mods = [importlib.import_module(name) for name in names]
    odd = types.ModuleType("gj_odd")
    odd.__getattr__ = lambda name: {}[name]  # type: ignore[attr-defined]
    code = "def f(x):\n    return x * " + " + ".join(f"{a}.{b}.VALUE" for a in names for b in names if a != b) + \
        " + odd.VALUE_OR_NOT if False else x\n"
    space: dict = {**{name: m for name, m in zip(names, mods)}, "odd": odd}
    exec(compile(code, str(tmp_path / "user_code.py"), "exec"), space)
    src = guards.sources(space["f"], None)
    assert len([s for s in src.slots if s[2] == "VALUE"]) == n
