"""Paddle's sot tracer runs what it leaves out of its program from code it generates, calling the C functions the
function's code calls from its own executor's frames (graphjit/host_clock.py, ``Backend.simulator_modules``): a
warmup's name recorder sees a clock read or a print there as the function's, with the line of the function's code,
and sees none of the tracer's own (its translation is not watched).  On a
CPU Paddle makes no graphs, so the recorder is run directly around the tracer's calls; the GPU test of the whole
path (the key uncaptured, every call eager's) is tests/test_gpu_guards_paddle.py."""

from __future__ import annotations

import time

import pytest

from graphjit.names import NameRecorder

pytestmark = pytest.mark.paddle

paddle = pytest.importorskip("paddle")


def _clock_step(x):
    return x * 2 + (time.perf_counter() // 3600 + 1) * 0  # a reading that moves slower than the test: a stable key


def _plain_step(x):
    return paddle.nn.functional.relu(x * 2) + 1


def _converting_step(x):  # conversions of a time the function passes: no clock read
    t = time.gmtime(0)
    return x + float(time.strftime("%Y", t)) * 0 + time.localtime(86400.0).tm_year * 0


def _local_time_step(x):  # a conversion of now: a clock read
    return x + time.localtime().tm_year * 0


def _printing_step(x):
    print("step")  # a replay would not print
    return x * 2


def _simulators() -> tuple[str, ...]:
    from graphjit.backends.paddle.graphs import PaddleBackend

    return PaddleBackend.simulator_modules


def _watched(fn, calls: int = 3, paused: list[str] | None = None, what: str = "clocked") -> list[list[str]]:
    """The clocks (``what``: or the prints, "emitted") a warmup's recorder sees in each of ``calls`` calls of ``fn``
    through SOT (the first translates),
    with the backend's watch off while SOT translates, as a warmup keeps it (``paused``: "pause"/"resume" as called)."""
    from graphjit.backends.paddle.graphs import PaddleBackend
    from graphjit.backends.paddle.sot import skip_graphjit_in_sot

    skip_graphjit_in_sot()  # as the backend does: SOT never translates graphjit's own code (the recorder's hook)
    translated = paddle.jit.to_static(fn, full_graph=False)  # what tracer="sot" runs
    x = paddle.ones([3])
    seen = []
    for _ in range(calls):
        rec = NameRecorder(names=False, simulators=_simulators())

        def pause(rec=rec):
            (paused if paused is not None else []).append("pause")
            rec.pause()

        def resume(rec=rec):
            (paused if paused is not None else []).append("resume")
            rec.resume()

        with PaddleBackend.compiles_unwatched(None, pause, resume), rec:  # type: ignore[arg-type]
            translated(x)
        seen.append(list(getattr(rec, what)))
    return seen


def test_a_clock_the_sot_tracer_reads_for_the_function_is_the_function_s():
    seen = _watched(_clock_step)
    assert all(len(c) == 1 for c in seen), seen
    assert all("time.perf_counter()" in c[0] and __file__ in c[0] for c in seen), seen  # the line in this file


def test_the_sot_tracer_itself_reads_no_clock_and_prints_nothing():
    assert _watched(_plain_step) == [[], [], []]
    assert _watched(_plain_step, what="emitted") == [[], [], []]


def test_a_print_the_sot_tracer_makes_for_the_function_is_the_function_s(capsys):
    seen = _watched(_printing_step, what="emitted")
    assert capsys.readouterr().out == "step\n" * 3
    assert all(len(c) == 1 and c[0].startswith("print() at " + __file__) for c in seen), seen


def _step_translated_here(x):  # translated by this test alone: SOT keeps a translation per code object
    return paddle.nn.functional.relu(x * 3) - 1


def test_the_watch_is_off_while_sot_translates_and_not_for_the_code_it_made():
    paused: list[str] = []
    _watched(_step_translated_here, calls=1, paused=paused)
    first = len(paused)
    assert first >= 2 and paused == ["pause", "resume"] * (first // 2), paused  # the first call translates
    _watched(_step_translated_here, calls=2, paused=paused)
    assert len(paused) == first, paused  # later calls run the cached code, watched throughout


def test_without_the_simulators_the_read_is_not_seen():
    translated = paddle.jit.to_static(_clock_step, full_graph=False)
    with NameRecorder(names=False) as rec:
        translated(paddle.ones([3]))
    assert rec.clocked == []  # what a warmup saw before: the tracer's frame is not the user's code


def test_a_conversion_of_a_time_the_function_passes_is_no_clock_read_and_of_now_is():
    assert _watched(_converting_step) == [[], [], []]
    seen = _watched(_local_time_step)
    assert all(len(c) == 1 and "time.localtime() without a time" in c[0] for c in seen), seen


def test_the_sot_tracer_s_own_debug_prints_are_not_the_function_s(capsys):
    """SOT's log level 2 prints from its executor where a guard misses (its cache holds two translations here): the
    recorder sees those prints called from the tracer's frames, for no code of the function's, and keeps none."""
    from paddle.jit.sot.utils.envs import ENV_SOT_LOG_LEVEL

    from graphjit.backends.paddle.graphs import PaddleBackend
    from graphjit.backends.paddle.sot import skip_graphjit_in_sot

    def step(x, k):  # translated by this test alone; each value of k its own translation
        return paddle.nn.functional.relu(x * k) - 2

    skip_graphjit_in_sot()
    translated = paddle.jit.to_static(step, full_graph=False)
    x = paddle.ones([3])
    translated(x, 1)
    translated(x, 2)
    before = ENV_SOT_LOG_LEVEL.get()
    ENV_SOT_LOG_LEVEL.set(2)
    try:
        seen = []
        for k in (1, 2, 1):
            rec = NameRecorder(names=False, simulators=_simulators())
            with PaddleBackend.compiles_unwatched(None, rec.pause, rec.resume), rec:  # type: ignore[arg-type]
                translated(x, k)
            seen.append(list(rec.emitted))
    finally:
        ENV_SOT_LOG_LEVEL.set(before)
    assert "[Cache]" in capsys.readouterr().out, "SOT printed its cache misses"
    assert seen == [[], [], []], seen


def test_blocks_of_two_threads_that_overlap_leave_sot_s_own_function_in_place():
    import threading

    from paddle.jit.sot.opcode_translator.executor import executor_cache as cache

    from graphjit.backends.paddle import sot

    original = cache.start_translate
    entered, leave = threading.Event(), threading.Event()

    def other() -> None:
        with sot.translations_unwatched(lambda: None, lambda: None):
            entered.set()
            leave.wait(10)

    t = threading.Thread(target=other)
    t.start()
    assert entered.wait(10)
    with sot.translations_unwatched(lambda: None, lambda: None):
        assert cache.start_translate is not original  # wrapped while any block is open
        leave.set()
        t.join(10)
        assert cache.start_translate is not original  # the other thread's block ended first: still wrapped for this one
    assert cache.start_translate is original
