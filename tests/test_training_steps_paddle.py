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
from graphjit import guards, py_writes
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


def _context(model, opt, *more):
    from graphjit.backends.paddle import optimizers

    return optimizers.prepare([("argument 0", model), ("argument 1", opt), *more])


@pytest.mark.parametrize("opt_name", ["adamw", "momentum"])
def test_a_fed_learning_rate_follows_the_schedule_without_the_steps_own_refill(opt_name):
    """Around each call graphjit fills the optimizer's learning-rate tensor and skips the refill ``step()`` would do
    (a fill whose number a graph would bake), so the update reads only that tensor: parameters equal eager's
    bitwise under a schedule that changes every step, and ``get_lr()`` inside the call reads the tensor."""
    rng = np.random.default_rng(2)
    data = [(paddle.to_tensor(rng.standard_normal((8, 16)).astype("float32")),
             paddle.to_tensor(rng.standard_normal((8, 4)).astype("float32"))) for _ in range(6)]
    seen = []

    def step_reading_lr(model, opt, x, y):
        seen.append(opt.get_lr())  # a number, as eagerly
        return step(model, opt, x, y)

    runs = {}
    for fed in (False, True):
        model, opt, sched = _loop(opt_name)
        ctx = _context(model, opt) if fed else None
        assert (ctx is not None) == fed
        for x, y in data:
            if fed:
                with ctx:
                    step_reading_lr(model, opt, x, y)
                    assert opt._learning_rate is not sched  # the stand-in, the same on every call
                    assert "_create_global_learning_rate" in opt.__dict__  # step()'s own refill is skipped
                    stand_in = opt._learning_rate
                assert opt._learning_rate is sched and "_create_global_learning_rate" not in opt.__dict__
                assert float(opt._global_learning_rate()) == np.float32(sched())
            else:
                step_reading_lr(model, opt, x, y)
            sched.step()
        runs[fed] = [p.numpy() for p in model.parameters()]
    assert all(np.array_equal(a, b) for a, b in zip(runs[True], runs[False]))
    assert np.array_equal(np.float32(seen[:6]), np.float32(seen[6:])) and len(set(seen[:6])) > 1, seen
    assert stand_in.last_lr == float(np.float32(seen[-1])) or stand_in.last_lr == seen[-1]  # as the scheduler read
    assert stand_in.state_dict() == sched.state_dict()


def test_the_guards_see_one_stand_in_while_the_schedule_moves():
    """Checked inside the call's context (as before a replay), the scheduler path holds the stand-in, whose
    numbers never change: a schedule stepped outside the call ends no graph."""
    model, opt, sched = _loop("adamw")
    x, y = paddle.randn([8, 16]), paddle.randn([8, 4])
    ctx = _context(model, opt)
    src = guards.sources(step, None, [("argument 0", model), ("argument 1", opt)])
    recorder = NameRecorder()
    with ctx, recorder:
        step(model, opt, x, y)
    with ctx:
        guard = guards.GuardSet(guards.scan(src, lambda t: isinstance(t, paddle.Tensor), recorder.names, (),
                                            recorder.by_object))
    for _ in range(3):
        sched.step()
        with ctx:
            assert guard.holds(), guard.change()
    assert not guard.holds()  # outside the context the user's scheduler is back, and it moved


def test_a_scheduler_the_step_reaches_is_not_fed_and_a_stepping_stand_in_says_why():
    model, opt, sched = _loop("momentum")
    assert _context(model, opt, ("argument 2", sched)) is None  # it may step it inside: its guards decide
    ctx = _context(model, opt)
    with ctx:
        with pytest.raises(graphjit.GraphjitError, match="step your scheduler object"):
            opt._learning_rate.step()
    assert opt._learning_rate is sched


def test_the_helper_a_paddle_step_renews_on_every_call_is_not_a_value_of_the_call():
    """Paddle's ``step()`` sets ``optimizer.helper`` to a new LayerHelper on every call: Python state the kernels do
    not read, so it is neither a write a replay would miss nor a guarded value (``Backend.renewed_attributes``);
    any other attribute the step changes still is."""
    from graphjit import backends

    renewed = backends.get("paddle").renewed_attributes
    model, opt, _sched = _loop("momentum")
    x, y = paddle.randn([8, 16]), paddle.randn([8, 4])
    step(model, opt, x, y)  # the first call makes the accumulators and the first helper
    src = guards.sources(step, None, [("argument 0", model), ("argument 1", opt)])
    is_tensor = lambda t: isinstance(t, paddle.Tensor)  # noqa: E731
    plain_before, before = guards.scan(src, is_tensor, None, ()), guards.scan(src, is_tensor, None, (), renewed=renewed)
    guard = guards.GuardSet(before)
    step(model, opt, x, y)
    assert guard.holds(), guard.change()
    plain = [p for p, _o, _n in py_writes.written(plain_before, guards.scan(src, is_tensor, None, ()))]
    assert "argument 1.helper" in plain, plain
    opt._momentum = 0.5  # stands for a write the step itself would do
    kept = [p for p, _o, _n in py_writes.written(before, guards.scan(src, is_tensor, None, (), renewed=renewed))]
    assert not [p for p in kept if p.startswith("argument 1.helper")] and "argument 1._momentum" in kept, kept
    assert not guard.holds()
