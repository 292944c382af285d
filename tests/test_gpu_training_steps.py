"""GPU tests of whole training steps (make test-gpu): every row of the training-steps table, one graphed call per
step, against the same loop run eagerly from the same seed, outputs, parameters, gradients, buffers, optimizer state
and the scaler's scale compared after every call (fp32 matmuls without TF32).  Where a row must graph, the step is
captured once (a graph per value where the row says so) and replayed on every later call; where it cannot, the
reason says what to change.  The loops are tests/step_cases.py's; their CPU counterparts: test_training_steps.py.

Default Adam/AdamW are made capturable by graphjit, so the graphed loop runs the capturable algorithm (bias
corrections on the GPU in fp32) where the eager loop runs the default one: they agree to float rounding (TOL)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import step_cases as cases  # noqa: E402

from graphjit import guards  # noqa: E402
from graphjit.backends.torch.syncs import SCALER_HINT  # noqa: E402
from graphjit.variants import OPTIMIZER_HINT  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.torch]
TOL = 1e-5
CALLS = 16


@pytest.fixture(autouse=True)
def _no_tf32():
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _graphed(worst: float, st: dict, g, graphs: int = 1, tol: float = TOL) -> None:
    assert worst <= tol, (worst, g.report())
    assert st["graphs"] == graphs and not st["fallbacks"], g.report()
    assert st["replays"] == CALLS - 2 * graphs, g.report()
    assert all(k["verify"] == "passed" for k in st["keys"]), g.report()


@pytest.mark.parametrize("form", ["args", "closure"])
@pytest.mark.parametrize("opt", ["sgd", "adamw", "adam"])
def test_the_step_as_written_with_default_optimizers_graphs(form, opt):
    """step(model, opt, x, y) or closed over; SGD, and Adam/AdamW as constructed by default (graphjit makes them
    capturable: their step counts move to the GPU)."""
    worst, st, g = cases.compare(lambda: cases.build("cuda", opt=opt, form=form))
    _graphed(worst, st, g)


@pytest.mark.parametrize("zero", ["inside", "outside", "accumulate", "in_place"])
def test_zero_grad_as_written_graphs(zero):
    worst, st, g = cases.compare(lambda: cases.build("cuda", opt="adamw", zero=zero))
    _graphed(worst, st, g)


@pytest.mark.parametrize("opt", ["adamw", "adam", "adamw_fused", "sgd_fused"])
@pytest.mark.parametrize("sched", ["lambda", "step", "plateau", "cosine", "warmup"])
def test_a_float_lr_schedule_graphs_once(opt, sched):
    worst, st, g, loop = cases.compare_loops(lambda: cases.build("cuda", opt=opt, sched=sched))
    _graphed(worst, st, g)
    assert isinstance(loop.optimizer.param_groups[0]["lr"], float)


@pytest.mark.parametrize("sched", ["lambda", "step"])
def test_sgd_as_constructed_by_default_graphs_once_under_a_schedule(sched):
    """torch's default SGD (foreach) is made fused, so its lr is fed: one capture under any schedule."""
    worst, st, g = cases.compare(lambda: cases.build("cuda", opt="sgd", sched=sched))
    _graphed(worst, st, g)


@pytest.mark.parametrize("opt,sched", [("adamw", "onecycle"), ("adam", "cyclic"), ("adamw_fused", "onecycle"),
                                       ("sgd", "onecycle"), ("sgd", "cyclic"), ("adamw", "decay"), ("sgd", "decay")])
def test_a_schedule_of_betas_momentum_or_weight_decay_graphs_once(opt, sched):
    """OneCycleLR / CyclicLR move Adam's betas[0] or SGD's momentum with the lr every step, a hand-written schedule
    the weight decay; optimizers as constructed by default (and a fused AdamW): graphjit steps them with those
    values read from tensors once two calls saw them move: one capture, every later call replayed."""
    worst, st, g = cases.compare(lambda: cases.build("cuda", opt=opt, sched=sched))
    assert worst <= TOL, (worst, g.report())
    assert st["graphs"] == 1 and not st["fallbacks"] and st["replays"] >= CALLS - 4, g.report()
    assert all(k["verify"] == "passed" for k in st["keys"]), g.report()


def test_a_momentum_that_reaches_zero_stays_right():
    worst, st, g = cases.compare(lambda: cases.build("cuda", opt="sgd", sched="momentum_to_zero"))
    assert worst <= TOL, (worst, g.report())
    assert st["graphs"] >= 1 and st["replays"] >= 6, g.report()


def test_a_moving_momentum_of_an_sgd_a_grad_scaler_steps_runs_uncaptured_saying_what_moved():
    worst, st, g = cases.compare(lambda: cases.build("cuda", opt="sgd", sched="onecycle", amp="fp16"))
    assert worst <= 1e-3, g.report()
    changed = [r for r in st["fallbacks"] if r.startswith(guards.REASON)]
    assert changed and "momentum" in changed[0], st["fallbacks"]
    detail = next(k["detail"] for k in st["keys"] if (k["reason"] or "").startswith(guards.REASON))
    assert OPTIMIZER_HINT in detail


@pytest.mark.parametrize("overflow", [False, True])
@pytest.mark.parametrize("clip", [False, True])
def test_fp16_with_a_grad_scaler_and_fused_adamw_graphs(overflow, clip):
    """found_inf stays on the GPU with a fused optimizer (made capturable); with the scale starting at 2**40 the
    first steps overflow and are skipped, as eager skips them."""
    worst, st, g = cases.compare(lambda: cases.build("cuda", opt="adamw_fused", amp="fp16", overflow=overflow,
                                                      clip=clip))
    _graphed(worst, st, g, tol=1e-3)


def test_fp16_with_a_grad_scaler_and_foreach_adamw_says_what_to_change():
    worst, st, g = cases.compare(lambda: cases.build("cuda", opt="adamw", amp="fp16"))
    assert worst <= 1e-3, g.report()
    assert "CPU-GPU sync inside the function" in st["fallbacks"], st["fallbacks"]
    assert SCALER_HINT in st["keys"][0]["detail"], st["keys"][0]["detail"]


@pytest.mark.parametrize("what", ["bf16", "clip", "dropout"])
def test_bf16_clipping_and_dropout_keep_graphing(what):
    kw = {"bf16": {"amp": "bf16"}, "clip": {"clip": True}, "dropout": {"dropout": True}}[what]
    worst, st, g = cases.compare(lambda: cases.build("cuda", opt="adamw", **kw))
    _graphed(worst, st, g, tol=1e-2 if what == "bf16" else TOL)


def test_loss_item_inside_the_step_says_so():
    worst, st, _g = cases.compare(lambda: cases.build("cuda", opt="adamw", item=True))
    assert worst <= TOL
    assert "CPU-GPU sync inside the function" in st["fallbacks"], st["fallbacks"]
