"""A function that reads the host clock (``time.monotonic()``, ``time.perf_counter()``, ``datetime.now()``) runs
uncaptured under its reason (graphjit/host_clock.py), its results eager's.  Before, verify compared one replay right
after the capture and passed, and every later replay handed back the capture's reading: a deadline never passed, a
timestamp never moved.  CPU lifecycle through tests/graph_emulator.py."""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import graphjit  # noqa: E402
from graphjit import host_clock  # noqa: E402

pytestmark = pytest.mark.torch

_DEADLINE = [0.0]


def _before_deadline(x: torch.Tensor) -> torch.Tensor:
    return x if time.monotonic() < _DEADLINE[0] else x * 0


def _hours(x: torch.Tensor) -> torch.Tensor:  # a reading that moves slower than the test runs: eager's results stay
    return x * (time.perf_counter() // 3600 + 1)


def _today(x: torch.Tensor) -> torch.Tensor:
    return x + datetime.datetime.now().year


def _helper() -> float:
    return time.time() // 86400


def _through_a_helper(x: torch.Tensor) -> torch.Tensor:
    return x + _helper()


@graphjit.eager
def _island_clock() -> torch.Tensor:
    return torch.full((1,), float(time.monotonic() > _DEADLINE[0]))


def _with_island(x: torch.Tensor) -> torch.Tensor:
    return x * 2 + _island_clock()


def _this_year(x: torch.Tensor) -> torch.Tensor:  # a conversion of now: reads the clock
    return x + time.localtime().tm_year


def _year_string(x: torch.Tensor) -> torch.Tensor:
    return x + float(time.strftime("%Y"))


def _epoch_year(x: torch.Tensor) -> torch.Tensor:  # a conversion of a given time: no read
    return x + time.gmtime(0).tm_year + float(time.strftime("%Y", time.gmtime(0)))


@pytest.mark.parametrize("fn", [_hours, _today, _through_a_helper, _this_year, _year_string],
                         ids=["perf_counter", "datetime.now", "helper", "localtime()", "strftime(format)"])
def test_a_clock_read_runs_uncaptured_with_eagers_results(emu, fn: Callable[[Any], Any]) -> None:
    g = graphjit.graphed(fn)
    for i in range(8):
        x = torch.arange(3.0) + 1
        assert torch.equal(g(x), fn(x)), i
    st = g.stats()
    assert st["replays"] == 0 and host_clock.REASON in st["fallbacks"], st
    assert "time" in str(g.stats()["keys"][0]["detail"]) or "now" in str(g.stats()["keys"][0]["detail"])


def test_a_conversion_of_a_given_time_keeps_the_graph(emu) -> None:
    """``time.gmtime(0)``, ``time.strftime(format, t)``: the caller passed the time, no clock is read."""
    g = graphjit.graphed(_epoch_year)
    for _ in range(6):
        x = torch.ones(3)
        assert torch.equal(g(x), _epoch_year(x))
    st = g.stats()
    assert st["replays"] >= 3 and host_clock.REASON not in st["fallbacks"], st


def test_a_deadline_passed_after_the_warmups_is_eagers(emu) -> None:
    """The deadline passes between calls: before, the graph kept the reading of its capture (before the deadline)."""
    _DEADLINE[0] = time.monotonic() + 3600
    g = graphjit.graphed(_before_deadline)
    x = torch.arange(3.0) + 1
    for _ in range(5):
        assert torch.equal(g(x), x)
    _DEADLINE[0] = time.monotonic() + 1.0  # (a guarded value: a new key, warmed up and watched again)
    for _ in range(3):
        assert torch.equal(g(x), x)
    time.sleep(max(0.0, _DEADLINE[0] - time.monotonic()) + 0.05)
    assert torch.equal(g(x), x * 0)
    assert g.stats()["replays"] == 0 and host_clock.REASON in g.stats()["fallbacks"], g.stats()


def test_a_clock_read_inside_an_island_is_not_this_reason(emu) -> None:
    """An island runs on every call: it may read the clock."""
    _DEADLINE[0] = 0.0
    g = graphjit.graphed(_with_island)
    for _ in range(6):
        x = torch.ones(1)
        assert torch.equal(g(x), _with_island(x))
    assert host_clock.REASON not in g.stats()["fallbacks"], g.stats()


def test_what_reads_a_clock() -> None:
    assert host_clock.read(time.time) == "time.time()"
    assert host_clock.read(time.perf_counter_ns) == "time.perf_counter_ns()"
    assert host_clock.read(datetime.datetime.now) == "datetime.now()"
    assert host_clock.read(datetime.date.today) == "date.today()"
    assert host_clock.read(len) is None and host_clock.read(time.sleep) is None
    assert host_clock.read(datetime.datetime.fromtimestamp) is None


def test_a_clock_read_with_one_warmup_call(emu) -> None:
    """``warmup=1``: its one watched call is the first, and a clock read there is the reason all the same."""
    g = graphjit.graphed(_hours, warmup=1)
    for _ in range(5):
        x = torch.ones(3)
        assert torch.equal(g(x), _hours(x))
    assert g.stats()["replays"] == 0 and host_clock.REASON in g.stats()["fallbacks"], g.stats()
