"""GPU tests, Paddle (through the kit): a whole training step under ``@graphed`` with Paddle's optimizers and a
``paddle.optimizer.lr`` schedule stepped after each call.  Paddle 2.6.2 has no Hopper code for elementwise kernels
(the loss, the optimizers' updates), so these check what does not depend on their numbers: Momentum's step is
captured once and replayed for every later call while its learning rate changes (fed from its tensor, which holds
the scheduler's number before each replay), and AdamW, whose beta powers Paddle keeps on the CPU, runs uncaptured
with the reason that names them.  The numbers themselves are checked on the CPU (test_training_steps_paddle.py)."""

from __future__ import annotations

import numpy as np
import pytest

import graphjit

pytestmark = [pytest.mark.gpu, pytest.mark.paddle]

paddle = pytest.importorskip("paddle")

CALLS = 10


def _loop(opt_name: str):
    paddle.seed(0)
    paddle.set_device("gpu:0")
    model = paddle.nn.Sequential(paddle.nn.Linear(16, 32, bias_attr=False), paddle.nn.Linear(32, 4, bias_attr=False))
    sched = paddle.optimizer.lr.LambdaDecay(1e-2, lambda k: 0.9 ** k)
    if opt_name == "adamw":
        opt = paddle.optimizer.AdamW(learning_rate=sched, parameters=model.parameters())
    else:
        opt = paddle.optimizer.Momentum(learning_rate=sched, momentum=0.9, parameters=model.parameters())
    return model, opt, sched


def step(model, opt, x, y):
    loss = paddle.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    opt.clear_grad()
    return loss.detach()


def _data():
    rng = np.random.default_rng(1)
    return [(paddle.to_tensor(rng.standard_normal((8, 16)).astype("float32")),
             paddle.to_tensor(rng.standard_normal((8, 4)).astype("float32"))) for _ in range(CALLS)]


def test_momentum_under_a_schedule_is_captured_once_and_replayed_with_the_fed_rate():
    model, opt, sched = _loop("momentum")
    g = graphjit.graphed(step, tracer="eager", verify=False)  # verify compares numbers Hopper computes wrong here
    fills = float(paddle.full([], 0.5, dtype="float32").numpy()) == 0.5  # Paddle 2.6.2's fill kernel on Hopper: no
    for i, (x, y) in enumerate(_data()):
        g(model, opt, x, y)
        lr = float(opt._global_learning_rate().numpy())
        assert not fills or abs(lr - float(np.float32(sched()))) <= 1e-9, (i, lr, sched(), g.report())
        sched.step()
    st = g.stats()
    assert st["graphs"] == 1 and not st["fallbacks"] and st["replays"] >= CALLS - 3, g.report()
    assert opt._learning_rate is sched


def test_adamw_keeps_its_beta_powers_on_the_cpu_and_runs_uncaptured_saying_so():
    model, opt, sched = _loop("adamw")
    g = graphjit.graphed(step, tracer="eager")
    for x, y in _data():
        g(model, opt, x, y)
        sched.step()
    st = g.stats()
    assert st["graphs"] == 0 and "writes a tensor on another device" in st["fallbacks"], g.report()
    assert "beta" in g.report().lower() or "pow" in g.report().lower(), g.report()
