"""``tracer="compile"``: Dynamo's own guards are checked before each replay (``TorchBackend.tracer_guard``), with the
locals the compiled frame starts with.  A ``forward`` a decorator wrapped (``functools.wraps``, as transformers wraps
its models' ``forward``) starts a frame of the wrapper's code, whose locals are ``self``, ``args`` and ``kwargs``: bound
by the signature ``__wrapped__`` names instead, Dynamo's first guard (``len(L['kwargs']) == ...``) failed at capture
and the guard was silently left out.

Dynamo's ``eager`` backend stands in for Inductor (its guards are Dynamo's either way); graphs are emulated."""

from __future__ import annotations

import functools
import types

import pytest

torch = pytest.importorskip("torch")

from graph_emulator import EmulatedTorchBackend, emulated_torch  # noqa: E402

import graphjit  # noqa: E402
from graphjit.backends.torch import dynamo as gj_dynamo  # noqa: E402

pytestmark = pytest.mark.torch

holder = types.ModuleType("holder")  # graphjit's walk does not enter modules; Dynamo guards the values read off them
holder.scale = 1.0


def returns_tuple(fn):
    """A decorator as transformers' ``can_return_tuple``: the frame is the wrapper's, ``forward`` inlined into it."""

    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        return fn(self, *args, **kwargs)

    return wrapper


class Scaled(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    @returns_tuple
    def forward(self, x, shift=None):
        y = self.lin(x) * holder.scale
        return y if shift is None else y + shift


class Plain(Scaled):
    forward = Scaled.forward.__wrapped__  # the same forward, undecorated


@pytest.fixture
def compiled_eagerly(monkeypatch):
    """The compile tracer with Dynamo's eager backend, its guards Dynamo's own."""
    monkeypatch.setattr(EmulatedTorchBackend, "trace", lambda self, fn, tracer: (
        gj_dynamo.for_capture(torch.compile(fn, backend="eager")) if tracer == "compile" else fn))
    torch._dynamo.reset()
    holder.scale = 1.0
    with emulated_torch():
        yield
    torch._dynamo.reset()
    holder.scale = 1.0


@pytest.mark.parametrize("cls", [Scaled, Plain], ids=["wrapped", "plain"])
@pytest.mark.parametrize("how", ["positional", "keyword"])
def test_a_value_only_dynamos_guards_see_leaves_the_graph(compiled_eagerly, cls, how):
    """``holder.scale`` changes after four calls: the next call equals eager (not the graph's frozen 1.0), for a
    wrapped ``forward`` as for a plain one, its arguments given by position or by name."""
    torch.manual_seed(0)
    m = cls()
    g = graphjit.graphed(m, tracer="compile")
    x, shift = torch.randn(2, 8), torch.randn(2, 8)
    for i in range(8):
        holder.scale = 1.0 if i < 4 else 3.0
        with torch.no_grad():
            got = g(x, shift) if how == "positional" else g(x=x, shift=shift)
            want = m.lin(x) * holder.scale + shift
        torch.testing.assert_close(got, want, msg=lambda s, i=i: f"call {i}: {s}\n{g.report()}")
    st = g.stats()
    assert st["replays"] >= 1, g.report()  # the calls before the change replayed: the guard held then


def test_the_guard_of_a_wrapped_forward_is_kept(compiled_eagerly):
    """The captured key holds Dynamo's check (``GuardSet.extra``), and it holds while nothing changed."""
    m = Scaled()
    g = graphjit.graphed(m, tracer="compile")
    x = torch.randn(2, 8)
    with torch.no_grad():
        for _ in range(4):
            g(x)
    entries = list(g._self_state.entries.values())
    assert len(entries) == 1 and entries[0].guards is not None
    check = entries[0].guards.extra
    assert check is not None
    with torch.no_grad():  # (grad mode is in the global state Dynamo's guards check)
        assert check() is None  # Dynamo's guards hold while nothing changed
        holder.scale = 2.0
        assert check() is not None  # and fail once the value changed
