"""Whole training steps with Paddle on the CPU: the step as written, ``step(model, opt, x, y)``, with Paddle's AdamW
and Momentum and a ``paddle.optimizer.lr`` scheduler, runs and equals eager (the CPU build has no CUDA graphs, so
the calls run uncaptured under that reason), the optimizer passed as an argument is held by identity, and the
scheduler's learning rate is among the values a graph's guards check, so a replay never uses a stale one (on a GPU
a schedule that changes it every step runs uncaptured with its path).  Paddle 2.6.2's optimizer kernels compute
wrong on the H200 (no Hopper code), so Paddle training is verified here, not on the GPU machine."""

from __future__ import annotations

import numpy as np
import pytest

import graphjit
from graphjit import guards
from graphjit.names import NameRecorder

pytestmark = pytest.mark.paddle

paddle = pytest.importorskip("paddle")


def _loop(opt_name: str):
    paddle.seed(0)
    model = paddle.nn.Sequential(paddle.nn.Linear(16, 32), paddle.nn.ReLU(), paddle.nn.Linear(32, 4))
    if opt_name == "adamw":
        sched = paddle.optimizer.lr.LambdaDecay(1e-2, lambda k: 0.9 ** k)
        opt = paddle.optimizer.AdamW(learning_rate=sched, parameters=model.parameters())
    else:
        sched = paddle.optimizer.lr.StepDecay(5e-2, step_size=3, gamma=0.5)
        opt = paddle.optimizer.Momentum(learning_rate=sched, momentum=0.9, parameters=model.parameters())
    return model, opt, sched


def step(model, opt, x, y):
    loss = paddle.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    opt.clear_grad()
    return loss.detach()


@pytest.mark.parametrize("opt_name", ["adamw", "momentum"])
def test_the_step_as_written_runs_and_equals_eager(opt_name):
    rng = np.random.default_rng(1)
    data = [(paddle.to_tensor(rng.standard_normal((8, 16)).astype("float32")),
             paddle.to_tensor(rng.standard_normal((8, 4)).astype("float32"))) for _ in range(8)]
    runs = {}
    for graph in (False, True):
        model, opt, sched = _loop(opt_name)
        f = graphjit.graphed(step, tracer="eager") if graph else step
        losses = []
        for x, y in data:
            losses.append(float(f(model, opt, x, y)))
            sched.step()
        runs[graph] = (losses, [p.numpy() for p in model.parameters()], f)
    assert runs[True][0] == runs[False][0]
    assert all(np.array_equal(a, b) for a, b in zip(runs[True][1], runs[False][1]))
    st = runs[True][2].stats()
    assert len(st["keys"]) == 1 and all(r.startswith("no CUDA graphs") for r in st["fallbacks"]), st


@pytest.mark.parametrize("opt_name", ["adamw", "momentum"])
def test_the_schedulers_learning_rate_is_guarded(opt_name):
    model, opt, sched = _loop(opt_name)
    x, y = paddle.randn([8, 16]), paddle.randn([8, 4])
    src = guards.sources(step, None, [("argument 0", model), ("argument 1", opt)])
    recorder = NameRecorder()
    with recorder:
        step(model, opt, x, y)
    found = guards.scan(src, lambda t: isinstance(t, paddle.Tensor), recorder.names, (), recorder.by_object)
    guard = guards.GuardSet(found)
    paths = {guards.describe(p) for _v, p in found.values().values()}
    assert "argument 1._learning_rate.last_lr" in paths, sorted(paths)
    assert guard.holds()
    for _ in range(3):
        sched.step()
    assert not guard.holds() and guard.change()[0] == "argument 1._learning_rate.last_lr"
