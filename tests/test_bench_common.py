"""What every benchmark JSON says of the host it ran on (``graphjit/bench/common.py``)."""

from __future__ import annotations

from graphjit.bench import common


def test_every_result_says_how_fast_the_host_ran_python_and_how_busy_it_was():
    env = common.environment()
    speed = env["host_speed"]
    assert 0 < speed["python_ns"] < 100_000
    assert speed["load"] is None or speed["load"] >= 0


def test_the_host_speed_is_the_best_of_its_repeats(monkeypatch):
    """The best of the repeats: a host busy for one of them still reads as its speed."""
    ticks = iter([0, 5_000_000, 0, 1_000_000, 0, 9_000_000])  # three repeats of 10,000 iterations: 500, 100, 900 ns
    monkeypatch.setattr(common.time, "perf_counter_ns", lambda: next(ticks))
    assert common.host_speed(iterations=10_000, repeats=3)["python_ns"] == 100.0
