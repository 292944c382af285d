"""A guarded Python value that changes type but not value (``1 -> 1.0``, ``True -> 1``, ``(1, 2) -> (1.0, 2)``) or
only its zero's sign (``0.0 -> -0.0``) is a changed value: eager's result follows the type (the dtype of ``x + v``)
and the sign (``1 / v``), so a graph captured for the old one must not replay.  Both ways of comparing the guards
(GuardSet.holds's Python expression, the lane's C scan: csrc/lane_guards.c) are checked, through the emulated CUDA
graph (tests/graph_emulator.py)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import graphjit  # noqa: E402
from graphjit import guardable  # noqa: E402

pytestmark = pytest.mark.torch

OFFSET: object = 1  # the global the "global" case reads


CHANGES = {  # before -> after: == says equal, eager says otherwise
    "int_to_float": (1, 1.0),
    "bool_to_int": (True, 1),
    "float_to_bool": (1.0, True),
    "zero_to_negative_zero": (0.0, -0.0),
    "negative_zero_to_zero": (-0.0, 0.0),
    "tuple_int_to_float": ((1, 2), (1.0, 2)),
}


def _result(x, v):
    """What eager gives for ``v``: its dtype, and (through ``1 / v``) a zero's sign."""
    if isinstance(v, tuple):
        return x + v[0] + v[1]
    return x + v if v != 0 else 1.0 / (x * 0 + v)


def _make(where: str, first):
    """A function reading ``first`` where ``where`` says, and a setter of that value."""
    global OFFSET
    if where == "attribute":
        class Mod(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.v = first

            def forward(self, x):
                return _result(x, self.v)

        m = Mod()
        return m, lambda v: setattr(m, "v", v)
    if where == "global":
        OFFSET = first

        def step(x):
            return _result(x, OFFSET)

        def set_global(v):
            global OFFSET
            OFFSET = v

        return step, set_global
    box = [first] if where == "list" else {"v": first}
    key = 0 if where == "list" else "v"

    def step_box(x):
        return _result(x, box[key])

    return step_box, lambda v: box.__setitem__(key, v)


@pytest.mark.parametrize("where", ["attribute", "global", "list", "dict"])
@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_value_of_another_type_or_zero_sign_is_another_graphs(emu, scan, where, change):
    first, then = CHANGES[change]
    fn, set_value = _make(where, first)
    g = graphjit.graphed(fn)
    x = torch.arange(3)
    with torch.no_grad():
        for i in range(8):
            if i == 4:
                set_value(then)
            want, got = fn(x), g(x)
            assert got.dtype == want.dtype and torch.equal(got, want), (i, g.report())
    st = g.stats()
    assert st["graphs"] == 2 and st["replays"] >= 4, g.report()


def test_a_guard_compares_the_type_and_the_zeros_sign_as_same_and_keys_do():
    from graphjit.guard_set import same

    for a, b in CHANGES.values():
        assert a == b and not same(a, b) and guardable.hashable(a) != guardable.hashable(b)
        assert same(a, type(a)(a) if not isinstance(a, tuple) else tuple(a))
    assert same({1, 2}, guardable.snapshot({1, 2}))  # a set's snapshot holds for the set
    assert guardable.hashable(float("nan")) == guardable.hashable(float("nan"))  # by its bits: one key


def test_a_float_argument_of_the_other_zero_sign_is_another_key(emu):
    def inv(x, shift):
        return 1.0 / torch.full_like(x, shift)

    g = graphjit.graphed(inv)
    x = torch.ones(2)
    with torch.no_grad():
        for shift in (0.0, 0.0, 0.0, 0.0, -0.0, -0.0, -0.0, -0.0, 0.0):
            assert torch.equal(g(x, shift), inv(x, shift)), (shift, g.report())
    st = g.stats()
    assert st["graphs"] == 2 and len(st["keys"]) == 2, g.report()
