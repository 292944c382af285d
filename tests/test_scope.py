"""Deferral (nothing traced or run at decoration) and capture_scope (first call traces inside it, logs, progress)."""

from __future__ import annotations

import importlib.util
import logging
import re

import numpy as np
import pytest
from unseen import Unseen

import graphjit
from graphjit.scope import CaptureScope

HAS_PADDLE = importlib.util.find_spec("paddle") is not None
HAS_TORCH = importlib.util.find_spec("torch") is not None
if HAS_PADDLE:
    import paddle
if HAS_TORCH:
    import torch


def graphjit_records(caplog, level=None):
    return [r for r in caplog.records if r.name == "graphjit" and (level is None or r.levelno == level)]


# -- deferral ------------------------------------------------------------------------------------


@pytest.mark.parametrize("tracer", ["auto", "sot", "ast", "eager", "compile"])
def test_decoration_neither_runs_nor_traces(tracer):
    ran = []

    def step(x):
        ran.append(1)
        return x

    g = graphjit.graphed(step, tracer=tracer)
    assert ran == []
    assert g._self_state.traced == {}
    assert g.stats()["calls"] == 0 and g.stats()["keys"] == []


@pytest.mark.paddle
def test_paddle_layer_decorated_at_class_level_defers_until_first_call():
    ran = []

    class Block(paddle.nn.Layer):
        @graphjit.graphed(tracer="eager")
        def forward(self, x):
            ran.append(1)
            return x * 2

    m = Block()
    state = Block.__dict__["forward"]._self_state
    assert ran == [] and state.traced == {}
    m(paddle.ones([2]))
    assert ran == [1] and set(state.traced) == {"paddle"}


@pytest.mark.paddle
def test_first_call_traces_once_and_later_calls_reuse_the_tracer():
    g = graphjit.graphed(lambda x: x + 1)
    g(paddle.ones([2]))
    traced = g._self_state.traced["paddle"]
    g(paddle.ones([3]))
    g(paddle.ones([2], dtype="float64"))
    assert g._self_state.traced == {"paddle": traced}


# -- capture_scope ---------------------------------------------------------------------------------


@pytest.mark.paddle
def test_first_call_inside_the_scope_traces_there_and_the_scope_logs(gj_log):
    seen = []

    def step(x):
        seen.append(graphjit.in_capture_scope())
        return x * 3

    g = graphjit.graphed(step, tracer="eager")
    assert graphjit.in_capture_scope() is False
    with graphjit.capture_scope() as scope:
        assert graphjit.in_capture_scope() is True
        assert g._self_state.traced == {}
        out = g(paddle.ones([2]))
        assert set(g._self_state.traced) == {"paddle"}
    assert seen == [True]
    assert graphjit.in_capture_scope() is False
    np.testing.assert_array_equal(out.numpy(), [3.0, 3.0])
    assert isinstance(scope, CaptureScope)
    summary = [r.getMessage() for r in graphjit_records(gj_log, logging.INFO) if "capture_scope:" in r.getMessage()]
    assert len(summary) == 1
    assert re.fullmatch(r"graphjit capture_scope: (no graphs: 1 call\(s\) ran the traced function uncaptured \(no CUDA "
                        r"graphs: .+\)|1 graph\(s\) captured \([\d.]+ ms capturing\)); [\d.]+ s", summary[0]), summary


@pytest.mark.paddle
def test_sot_branch_on_in_capture_scope_follows_the_scope():
    """A function that asks in_capture_scope() must not have the first answer frozen into its program."""

    def step(x):
        if graphjit.in_capture_scope():
            return x + 100
        return x - 100

    g = graphjit.graphed(step)  # sot
    x = paddle.zeros([2])
    np.testing.assert_array_equal(g(x).numpy(), [-100, -100])
    with graphjit.capture_scope(progress=False):
        np.testing.assert_array_equal(g(x).numpy(), [100, 100])
    np.testing.assert_array_equal(g(x).numpy(), [-100, -100])


def test_scopes_nest_and_the_outermost_is_the_root():
    with graphjit.capture_scope(progress=False) as outer:
        with graphjit.capture_scope(progress=False) as inner:
            assert inner.parent is outer and outer.parent is None
            assert graphjit.scope.current() is inner
        assert graphjit.in_capture_scope() is True
        assert graphjit.scope.current() is outer
    assert graphjit.in_capture_scope() is False and graphjit.scope.current() is None


@pytest.mark.torch
def test_scope_without_progress_logs_nothing(gj_log):
    g = graphjit.graphed(lambda x: x * 2)
    with graphjit.capture_scope(progress=False):
        torch.testing.assert_close(g(torch.ones(2)), torch.full((2,), 2.0))
    assert not [r for r in graphjit_records(gj_log) if "capture_scope" in r.getMessage()]


def test_scope_is_left_when_the_body_raises():
    with pytest.raises(RuntimeError, match="boom"), graphjit.capture_scope(progress=False):
        raise RuntimeError("boom")
    assert graphjit.in_capture_scope() is False


def test_progress_lines_count_against_the_total(gj_log):
    scope = graphjit.capture_scope(total=3)
    with scope:
        scope.note_capture("step", "x[8, 4] float32@cuda:0", 12.5, ok=True)
        scope.note_capture("step", "x[4, 4] float32@cuda:0", 7.25, ok=False, reason="capture failed: sync")
        scope.note_capture("step", "x[2, 4] float32@cuda:0", 3.0, ok=True)
    lines = [r.getMessage() for r in graphjit_records(gj_log, logging.INFO)]
    assert len(lines) == 4
    assert re.fullmatch(r"graphjit capture_scope \[1/3\] step x\[8, 4\] float32@cuda:0: 12\.5 ms, about [\d.]+ s left",
                        lines[0])
    assert re.fullmatch(r"graphjit capture_scope \[2/3\] step x\[4, 4\] float32@cuda:0: not captured \(capture "
                        r"failed: sync\), about [\d.]+ s left", lines[1])
    assert re.fullmatch(r"graphjit capture_scope \[3/3\] step x\[2, 4\] float32@cuda:0: 3\.0 ms", lines[2])
    assert re.fullmatch(r"graphjit capture_scope: 2 graph\(s\) captured, 1 key\(s\) not captured \(22\.8 ms "
                        r"capturing\); [\d.]+ s", lines[3])
    s = scope.stats()
    assert (s["captures"], s["failures"], s["capture_ms"]) == (3, 1, 22.75)


def test_progress_without_total_counts_up(gj_log):
    with graphjit.capture_scope() as scope:
        scope.note_capture("f", "k", 1.0, ok=True)
        scope.note_capture("f", "k2", 1.0, ok=True)
    lines = [r.getMessage() for r in graphjit_records(gj_log, logging.INFO)]
    assert "[1] f k: 1.0 ms" in lines[0] and "[2] f k2: 1.0 ms" in lines[1]
    assert "left" not in lines[0]


@pytest.mark.parametrize("total", [-1, True, 2.5, "3"])
def test_bad_total_is_a_config_error(total):
    with pytest.raises(graphjit.ConfigError, match=rf"capture_scope\(total={re.escape(repr(total))}\): expected "
                                                   r"the number of captures to expect \(int >= 0\)"):
        graphjit.capture_scope(total=total)


def test_an_extra_warmup_run_that_raises_is_undone_and_the_call_keeps_its_own_result(emu):
    """Inside a scope a key's first call runs for itself, then graphjit's extra warmup runs: where one of those
    raises (its own run did not), what it wrote is put back, the call returns its own run's result, and the key runs
    uncaptured with the reason: the state is one eager call's, then two, three, ..."""
    torch = pytest.importorskip("torch")
    runs = Unseen()  # (an iterator the function advances is a reason of its own)
    acc = torch.zeros(1)

    @graphjit.graphed
    def step(x):
        acc.add_(x)
        if next(runs) == 1:  # the second execution: graphjit's extra run
            raise ValueError("second execution")
        return acc * 1

    x = torch.ones(1)
    with graphjit.capture_scope(progress=False):
        assert step(x).item() == 1.0
    assert acc.item() == 1.0
    for i in range(3):
        assert step(x).item() == i + 2.0
    assert "a warmup run raised" in step.stats()["fallbacks"], step.report()
