"""A function that prints or logs on every call (CPU, graph emulator): a replay runs no Python, so its graph would
print nothing; the key runs uncaptured instead, its reason naming each place, and every call prints as eager's does.
What prints only in the first call (a lazy set-up's message), what a disabled log level drops, what an island
(``@graphjit.eager``) prints and graphjit's own log records leave the key graphed."""

from __future__ import annotations

import logging

import pytest

torch = pytest.importorskip("torch")

import graphjit  # noqa: E402
from graphjit.warmup import PRINTS  # noqa: E402

pytestmark = pytest.mark.torch

user_log = logging.getLogger("user_model")


def _run(fn, calls=6):
    g = graphjit.graphed(fn)
    x = torch.ones(2)
    for _ in range(calls):
        assert torch.equal(g(x), fn(x))
    return g.stats(), g


def test_a_print_on_every_call_runs_uncaptured_and_prints_every_time(emu, capsys):
    def step(x):
        print("step", tuple(x.shape))
        return x * 2

    st, g = _run(step)
    printed = capsys.readouterr().out.count("step (2,)")
    assert printed == 12, printed  # six graphed calls and six eager references
    assert st["graphs"] == 0 and st["fallbacks"] == {PRINTS: 5}, g.report()
    key = st["keys"][0]
    assert key["reason"] == PRINTS and "print() at " in key["detail"] and "test_host_output.py" in key["detail"]


def test_a_log_record_on_every_call_runs_uncaptured_a_disabled_level_does_not(emu, caplog):
    def warns(x):
        user_log.warning("shape %s", tuple(x.shape))
        return x * 2

    def debugs(x):
        user_log.debug("shape %s", tuple(x.shape))  # below the logger's level: no record is made
        return x * 2

    with caplog.at_level(logging.WARNING, logger="user_model"):
        st, g = _run(warns)
        assert st["fallbacks"] == {PRINTS: 5} and "logger 'user_model' at " in st["keys"][0]["detail"], g.report()
        st, g = _run(debugs)
        assert st["graphs"] == 1 and st["replays"] >= 3, g.report()


def test_a_first_call_message_an_island_and_graphjits_own_log_leave_it_graphed(emu, capsys):
    seen = []

    def lazy(x):
        if not seen:
            seen.append(1)
            print("set up once")
        logging.getLogger("graphjit").warning("graphjit's own record")
        logging.getLogger("torch._dynamo").warning("a framework's diagnostic")
        return x * 2

    st, g = _run(lazy)
    assert st["graphs"] == 1 and st["fallbacks"] == {}, g.report()

    @graphjit.eager
    def report(y):
        print("island", tuple(y.shape))
        return y

    def piecewise(x):
        return report(x * 2) + 1

    st, g = _run(piecewise)
    assert st["graphs"] == 1 and st["replays"] >= 3, g.report()
    capsys.readouterr()
    for _ in range(3):
        g(torch.ones(2))
    assert capsys.readouterr().out.count("island (2,)") == 3  # the island runs in every replay
    assert g.stats()["replays"] == st["replays"] + 3


def test_only_what_reaches_a_writing_handler_or_the_standard_streams_counts(emu, capsys):
    """A library logger with only a NullHandler writes nothing (graphed); a warning shown on every call is not
    watched (graphed: warnings show once a place by default); a write to standard output is output (uncaptured); a
    record of a user's own odd making never raises out of graphjit's watch."""
    quiet = logging.getLogger("quiet_lib")
    quiet.addHandler(logging.NullHandler())
    quiet.propagate = False
    try:
        def silent(x):
            quiet.warning("nobody hears this")
            return x * 2

        st, g = _run(silent)
        assert st["graphs"] == 1 and st["fallbacks"] == {}, g.report()
    finally:
        quiet.propagate = True
        quiet.handlers.clear()

    import warnings

    def warns(x):
        warnings.warn("deprecated", FutureWarning, stacklevel=1)
        return x * 2

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        st, g = _run(warns)
    assert st["graphs"] == 1 and st["fallbacks"] == {}, g.report()

    import sys

    def writes(x):
        sys.stdout.write("step\n")
        return x * 2

    st, g = _run(writes)
    assert st["fallbacks"] == {PRINTS: 5} and "a write to standard output at " in st["keys"][0]["detail"], g.report()
    assert capsys.readouterr().out.count("step\n") == 12

    class Odd(logging.LogRecord):
        def __getattribute__(self, name):
            if name == "name":
                raise KeyError(name)
            return super().__getattribute__(name)

    odd = logging.getLogger("odd_records")
    odd.makeRecord = lambda *a, **k: Odd(*a[:7])  # type: ignore[method-assign]
    odd.addHandler(logging.NullHandler())

    def odd_log(x):
        odd.warning("an odd record")
        return x * 2

    st, g = _run(odd_log)  # every call returns eager's result: the watch read the record without raising
    assert st["calls"] == 6 and "logger 'odd_records' at " in st["keys"][0]["detail"], g.report()
    odd.handlers.clear()
