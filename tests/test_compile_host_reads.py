"""Under ``tracer="compile"`` the Python Dynamo leaves out of its graphs (a graph break: ``time.time()``, ``print``)
runs as Python on every eager call, and a replay does not run it: a warmup watches that Python for host reads
(graphjit/names.py ``NameRecorder(names=False)``, ``Backend.host_watched_tracers``).  Before, no watch ran under a
compiling tracer: a clock read was frozen at the capture's reading (every replay handed it back, verify passed) and a
print happened only in the eager calls.  Dynamo's front end with its ``eager`` back end, on the CPU emulator."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import graphjit  # noqa: E402
from graphjit import host_clock  # noqa: E402
from graphjit.names import NameRecorder  # noqa: E402
from graphjit.warmup import PRINTS  # noqa: E402

pytestmark = pytest.mark.torch

_DEADLINE = [0.0]
_LOG = logging.getLogger("compile_host_reads_user")


@pytest.fixture
def dynamo_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    """``torch.compile`` with Dynamo's ``eager`` back end (no Inductor on the test machine's CPU), its caches reset."""
    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **_kw: real(fn, backend="eager"))
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _before_deadline(x: torch.Tensor) -> torch.Tensor:
    return x * 2 if time.monotonic() < _DEADLINE[0] else x * 0


def _prints(x: torch.Tensor) -> torch.Tensor:
    print("graphjit test: a step")
    return x * 2


def _logs(x: torch.Tensor) -> torch.Tensor:
    _LOG.warning("a step")
    return x * 2


@graphjit.eager
def _island_clock(x: torch.Tensor) -> torch.Tensor:
    return x + float(time.monotonic() > _DEADLINE[0])


def _with_island(x: torch.Tensor) -> torch.Tensor:
    return _island_clock(x * 2) + 1


def _plain(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(x - 1) * 3


def test_a_deadline_read_in_a_graph_break_is_eagers(emu, dynamo_eager) -> None:
    """The deadline passes after the graph would have been captured: eager's result changes, and so must the call's."""
    g = graphjit.graphed(_before_deadline, tracer="compile")
    _DEADLINE[0] = time.monotonic() + 3.0  # (Dynamo's first compile takes a second or so)
    x = torch.arange(3.0) + 1
    for i in range(4):
        assert torch.equal(g(x), x * 2), i
    time.sleep(max(0.0, _DEADLINE[0] - time.monotonic()) + 0.05)
    assert torch.equal(g(x), x * 0)
    st = g.stats()
    assert st["replays"] == 0 and host_clock.REASON in st["fallbacks"], g.report()
    assert "time.monotonic() at " in st["keys"][0]["detail"], g.report()


@pytest.mark.parametrize("fn,where", [(_prints, "print() at "), (_logs, "logger 'compile_host_reads_user' at ")],
                         ids=["print", "logger"])
def test_a_print_or_log_record_in_a_graph_break_runs_on_every_call(emu, dynamo_eager, capsys, fn: Any,
                                                                    where: str) -> None:
    g = graphjit.graphed(fn, tracer="compile")
    for _ in range(5):
        x = torch.ones(2)
        assert torch.equal(g(x), x * 2)
    st = g.stats()
    assert st["graphs"] == 0 and PRINTS in st["fallbacks"], g.report()
    assert where in st["keys"][0]["detail"], g.report()
    if fn is _prints:
        assert capsys.readouterr().out.count("graphjit test: a step") == 5


@pytest.mark.parametrize("fn", [_with_island, _plain], ids=["clock in an island", "no host read"])
def test_a_compiled_function_without_host_reads_is_captured(emu, dynamo_eager, fn: Any) -> None:
    _DEADLINE[0] = 0.0
    g = graphjit.graphed(fn, tracer="compile")
    for i in range(6):
        x = torch.arange(3.0) - 1
        assert torch.equal(g(x), fn(x)), i
    st = g.stats()
    assert st["graphs"] == 1 and st["replays"] >= 3 and not st["fallbacks"], g.report()


def _reads_attribute(x: Any) -> Any:
    return time.time() + x.shape[0] + len(str(x))


def test_a_recorder_without_names_sees_the_host_alone() -> None:
    """``names=False`` records the clock read and no names the code used (those of a translated run are not the
    function's)."""
    with NameRecorder(names=False) as rec:
        _reads_attribute(torch.ones(2))
    assert rec.complete and rec.clocked and "time.time() at " in rec.clocked[0]
    assert not rec.names and not rec.by_object and not rec.read_globals
    with NameRecorder() as full:
        _reads_attribute(torch.ones(2))
    assert full.clocked and "shape" in full.names
