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


def test_host_timing_takes_turns_across_the_calls_and_drops_one_that_raises():
    """``DecodeRunner.time_host``: after each call's warmup, one repeat of every call in turn, so a slow minute of the
    host weighs on all of them alike; a call that raises is recorded under ``errors`` and timed no further."""
    import types

    from graphjit.bench.decode_runner import DecodeRunner

    order: list[str] = []
    count = {"c": 0}

    def call(name):
        return lambda: order.append(name)

    def flaky():
        count["c"] += 1
        if count["c"] > 20 + 2 * 3:  # its warmup, then two repeats of three calls
            raise RuntimeError("gone")
        order.append("c")

    runner = types.SimpleNamespace(args=types.SimpleNamespace(host_repeats=4, host_iters=3), sync=lambda: None)
    out: dict = {"us": {}, "errors": {}}
    DecodeRunner.time_host(runner, {"a": call("a"), "b": call("b"), "c": flaky}, out)  # type: ignore[arg-type]
    timed = order[3 * 20:]  # after the three warmups
    assert timed[:9] == ["a"] * 3 + ["b"] * 3 + ["c"] * 3  # the first repeat of each, in turn
    assert timed[9:18] == ["a"] * 3 + ["b"] * 3 + ["c"] * 3
    assert timed[18:] == (["a"] * 3 + ["b"] * 3) * 2  # c raised in its third repeat: not timed again
    assert set(out["us"]) == {"a", "b"} and len(out["samples_us"]["a"]) == 4
    assert "gone" in out["errors"]["c"]
