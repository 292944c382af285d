"""stats(), report(), reset() and the no-CUDA log line on CPU builds."""

from __future__ import annotations

import importlib.util
import json
import logging

import numpy as np
import pytest

import graphjit

HAS_PADDLE = importlib.util.find_spec("paddle") is not None
HAS_TORCH = importlib.util.find_spec("torch") is not None
if HAS_PADDLE:
    import paddle
if HAS_TORCH:
    import torch


def no_cuda_lines(caplog, name):
    return [r for r in caplog.records if r.name == "graphjit" and r.levelno == logging.INFO
            and f"{name}: no CUDA graph (" in r.getMessage()]


def step(x, n=1):
    return x * n


@pytest.fixture
def paddle_cpu():
    if paddle.is_compiled_with_cuda():
        pytest.skip("this paddle is a CUDA build")


@pytest.fixture
def torch_cpu():
    if torch.backends.cuda.is_built():
        pytest.skip("this torch is a CUDA build")


@pytest.mark.paddle
def test_paddle_cpu_build_reason_is_counted_and_logged_once(gj_log, paddle_cpu):
    g = graphjit.graphed(step)
    for shape in ([2], [3], [2, 2], [2]):
        x = paddle.ones(shape)
        np.testing.assert_array_equal(g(x, 2).numpy(), (x * 2).numpy())
    stats = g.stats()
    reason = f"no CUDA graphs: paddle {paddle.__version__} is a CPU build"
    assert stats["fallbacks"] == {reason: 4}
    assert stats["calls"] == 4 and stats["disabled_calls"] == 0
    assert (stats["graphs"], stats["captures"], stats["replays"], stats["pool_bytes"]) == (0, 0, 0, 0)
    assert stats["function"] == "step"
    lines = no_cuda_lines(gj_log, "step")
    assert len(lines) == 1
    assert lines[0].getMessage() == (f"graphjit step: no CUDA graph (paddle {paddle.__version__} is a CPU build); "
                                     "running the paddle sot function")


@pytest.mark.torch
def test_torch_cpu_build_reason_is_counted_and_logged_once(gj_log, torch_cpu):
    g = graphjit.graphed(step)
    for _ in range(5):
        torch.testing.assert_close(g(torch.ones(3), 3), torch.full((3,), 3.0))
    reason = f"no CUDA graphs: torch {torch.__version__} is a CPU build"
    assert g.stats()["fallbacks"] == {reason: 5}
    lines = no_cuda_lines(gj_log, "step")
    assert len(lines) == 1 and "running the torch eager function" in lines[0].getMessage()


@pytest.mark.paddle
@pytest.mark.torch
def test_one_line_per_function_and_per_reason(gj_log, paddle_cpu, torch_cpu):
    def first(x):
        return x + 1

    def second(x):
        return x + 2

    g1, g2 = graphjit.graphed(first), graphjit.graphed(second)
    for _ in range(3):
        g1(paddle.ones([2]))
        g2(paddle.ones([2]))
    g1(torch.ones(2))  # the same function with the other framework: another reason, one more line
    g1(torch.ones(3))
    assert len(no_cuda_lines(gj_log, "first")) == 2
    assert len(no_cuda_lines(gj_log, "second")) == 1
    assert sum(g1.stats()["fallbacks"].values()) == 5
    assert set(g1.stats()["fallbacks"]) == {f"no CUDA graphs: paddle {paddle.__version__} is a CPU build",
                                            f"no CUDA graphs: torch {torch.__version__} is a CPU build"}


@pytest.mark.paddle
def test_stats_is_plain_json_and_report_names_the_reason():
    g = graphjit.graphed(step, tracer="eager")
    g(paddle.ones([2]), 2)
    stats = g.stats()
    assert json.loads(json.dumps(stats)) == stats
    report = g.report()
    assert report.splitlines()[0] == "step: 1 calls, 0 graphs, 0 replays"
    assert "fallback x1: no CUDA graphs: paddle" in report


@pytest.mark.paddle
def test_stats_are_per_function_not_shared():
    g1, g2 = graphjit.graphed(step), graphjit.graphed(lambda x: x)
    g1(paddle.ones([2]))
    assert g1.stats()["calls"] == 1 and g2.stats()["calls"] == 0


@pytest.mark.paddle
def test_reset_keeps_the_function_working_and_logs_the_reason_again(gj_log, paddle_cpu):
    g = graphjit.graphed(step)
    g(paddle.ones([2]), 2)
    g.reset()
    assert g.stats()["keys"] == []
    np.testing.assert_array_equal(g(paddle.ones([2]), 5).numpy(), [5.0, 5.0])
    assert g.stats()["calls"] == 2
    assert len(no_cuda_lines(gj_log, "step")) == 2  # reset forgets what was said


@pytest.mark.paddle
def test_keys_and_hits_show_in_stats_without_cuda():
    g = graphjit.graphed(step)
    g(paddle.ones([2, 3]))
    g(paddle.zeros([2, 3]))  # same key
    g(paddle.ones([4, 3]))  # new shape
    g(paddle.ones([2, 3], dtype="float64"))  # new dtype
    g(paddle.ones([2, 3]), n=2)  # new non-tensor value
    keys = g.stats()["keys"]
    assert len(keys) == 4
    assert sorted(k["uncaptured_calls"] for k in keys) == [1, 1, 1, 2]
    assert {k["state"] for k in keys} == {"eager"}
    g.reset()
    assert g.stats()["keys"] == []
