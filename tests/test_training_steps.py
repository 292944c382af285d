"""Whole training steps on the CPU, through the emulated CUDA graph (tests/graph_emulator.py: a replay runs the
recorded tensor work and no Python, as a real graph does), each loop of tests/step_cases.py graphed against the
same loop run eagerly, outputs and state after every call: the step's signature as written, containers of every
kind as arguments, zero_grad() with its default, float-lr schedules (fused AdamW and SGD here: the CPU has no
capturable Adam), and what stays uncaptured says why.  The same loops on a GPU: tests/test_gpu_training_steps.py."""

from __future__ import annotations

import collections
import dataclasses
from typing import NamedTuple

import pytest

torch = pytest.importorskip("torch")

import step_cases as cases  # noqa: E402

import graphjit  # noqa: E402
from graphjit import guards  # noqa: E402
from graphjit.variants import OPTIMIZER_HINT  # noqa: E402

pytestmark = pytest.mark.torch
TOL = 1e-6


def _graphs_once(worst: float, st: dict, g, calls: int = 16) -> None:
    assert worst <= TOL, (worst, g.report())
    assert st["graphs"] == 1 and st["replays"] == calls - 2 and not st["fallbacks"], g.report()
    assert st["keys"][0]["verify"] == "passed", g.report()


@pytest.mark.parametrize("form", ["args", "closure"])
@pytest.mark.parametrize("opt", ["sgd", "adamw"])
def test_the_step_signature_as_written_graphs_and_equals_eager(emu, form, opt):
    """step(model, opt, x, y): the model and the optimizer are arguments, held by identity, their tensors state."""
    worst, st, g = cases.compare(lambda: cases.build("cpu", opt=opt, form=form))
    _graphs_once(worst, st, g)
    assert "model" not in str(st["keys"][0].get("inputs", "")), st["keys"][0]


@pytest.mark.parametrize("zero", ["inside", "outside", "accumulate", "in_place"])
def test_zero_grad_as_written_graphs_and_equals_eager(emu, zero):
    """zero_grad() with its default set_to_none=True inside the step or before the call, or only before every other
    call (accumulation): the graph owns the gradient buffers; values, p.grad included, equal eager's."""
    worst, st, g = cases.compare(lambda: cases.build("cpu", opt="sgd", zero=zero))
    _graphs_once(worst, st, g)


@pytest.mark.parametrize("opt", ["adamw", "sgd_fused"])
@pytest.mark.parametrize("sched", ["lambda", "step", "plateau", "cosine", "warmup"])
def test_a_float_lr_schedule_graphs_once(emu, opt, sched):
    """A scheduler (or a hand-written warmup) sets a new float lr before every call: fed from a tensor, one capture,
    every later call replayed, parameters and optimizer state equal eager's."""
    worst, st, g, loop = cases.compare_loops(lambda: cases.build("cpu", opt=opt, sched=sched))
    _graphs_once(worst, st, g)
    lr = loop.optimizer.param_groups[0]["lr"]
    assert isinstance(lr, float), lr  # outside a call the user's number is back


def test_sgd_with_foreach_keeps_a_graph_per_lr_and_stays_right(emu):
    """SGD's default (foreach) reads its lr as a number: StepLR halves it every 5 calls, a graph per value."""
    worst, st, g = cases.compare(lambda: cases.build("cpu", opt="sgd", sched="step"))
    assert worst <= TOL, g.report()
    assert st["graphs"] >= 2 and st["replays"] >= 6, g.report()


@pytest.mark.parametrize("opt,sched", [("adamw", "onecycle"), ("adam", "cyclic"), ("sgd_fused", "onecycle"),
                                       ("sgd_fused", "cyclic"), ("adamw", "decay"), ("sgd_fused", "decay")])
def test_a_schedule_of_betas_momentum_or_weight_decay_graphs_once(emu, opt, sched):
    """OneCycleLR and CyclicLR move Adam's betas[0] / SGD's momentum with the lr on every step, a hand-written
    schedule the weight decay: once two calls saw them move, graphjit steps the optimizer itself with them read
    from tensors (hyper.py): one capture, every later call replayed, equal to eager's to float rounding."""
    worst, st, g = cases.compare(lambda: cases.build("cpu", opt=opt, sched=sched))
    assert worst <= TOL, (worst, g.report())
    assert st["graphs"] == 1 and not st["fallbacks"] and st["replays"] >= 16 - 4, g.report()


def test_a_moving_hyperparameter_of_an_optimizer_graphjit_cannot_step_stays_guarded(emu):
    """With a GradScaler the call reaches, a fused SGD is stepped by the scaler with arguments of its own:
    graphjit leaves it to torch, and OneCycleLR's moving momentum runs uncaptured, right, saying what moved."""
    worst, st, g = cases.compare(lambda: cases.build("cpu", opt="sgd_fused", sched="onecycle", amp="fp16"))
    assert worst <= TOL, g.report()
    changed = [r for r in st["fallbacks"] if r.startswith(guards.REASON)]
    assert changed and "momentum" in changed[0], st["fallbacks"]
    detail = next(k["detail"] for k in st["keys"] if (k["reason"] or "").startswith(guards.REASON))
    assert OPTIMIZER_HINT in detail, detail


def test_a_sync_in_the_step_says_so(emu):
    worst, st, _g = cases.compare(lambda: cases.build("cpu", opt="sgd", item=True))
    assert worst <= TOL
    assert "CPU-GPU sync inside the function" in st["fallbacks"], st["fallbacks"]


def test_fused_optimizer_writes_are_seen_without_version_counters(emu):
    """torch's fused kernels move no version counter of the parameters they write: warmup compares contents, so
    verify's eager reference is undone and the capture call's update happens once."""
    p = torch.nn.Parameter(torch.ones(4))
    opt = torch.optim.AdamW([p], lr=1e-2, fused=True)
    p.grad = torch.ones(4)
    opt.step()
    v = p._version
    opt.step()
    assert p._version == v  # the premise: if torch starts counting, this test can go
    worst, st, g = cases.compare(lambda: cases.build("cpu", opt="adamw_fused", zero="in_place"))
    _graphs_once(worst, st, g)


# -- containers as arguments ---------------------------------------------------------------------------------
class Pair(NamedTuple):
    a: torch.Tensor
    b: torch.Tensor


@dataclasses.dataclass
class Batch:
    x: torch.Tensor
    scale: float


class MyDict(dict):
    pass


class MyList(list):
    pass


def _containers(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)

    def t():
        return torch.randn(4, generator=g)

    dd = collections.defaultdict(list)
    dd["k"] = t()
    return {"defaultdict": dd, "ordered": collections.OrderedDict(a=t(), b=t()), "pair": Pair(t(), t()),
            "batch": Batch(t(), 2.0), "deque": collections.deque([t(), t()], maxlen=4), "mydict": MyDict(a=t()),
            "mylist": MyList([t(), t()])}


def _use(c: dict) -> torch.Tensor:
    types = (collections.defaultdict, collections.OrderedDict, Pair, Batch, collections.deque, MyDict, MyList)
    assert tuple(type(c[k]) for k in c) == types, [type(v) for v in c.values()]
    assert c["defaultdict"].default_factory is list and c["deque"].maxlen == 4
    return (c["defaultdict"]["k"] + c["ordered"]["a"] * c["ordered"]["b"] + c["pair"].a - c["pair"].b
            + c["batch"].x * c["batch"].scale + c["deque"][0] * c["deque"][1] + c["mydict"]["a"]
            + c["mylist"][0] - c["mylist"][1])


def test_every_container_kind_is_rebuilt_as_its_own_type(emu):
    g = graphjit.graphed(_use)
    for i in range(6):
        c = _containers(i)
        got = g(c)
        assert torch.allclose(got, _use(_containers(i))), i
    st = g.stats()
    assert st["graphs"] == 1 and st["replays"] == 4 and not st["fallbacks"], g.report()


class Stubborn(dict):
    """A dict whose constructor takes other arguments and whose copy refuses to refill."""

    def __init__(self, tag: str, items: dict) -> None:
        super().__init__(items)
        self.tag = tag

    def __copy__(self):
        raise TypeError("no copies")


def test_a_container_that_cannot_be_rebuilt_runs_uncaptured_with_its_name(emu):
    """A container whose constructor takes other arguments and whose copy refuses: its key runs uncaptured, every
    call right, the reason names the type (never an exception in the middle of a loop)."""
    g = graphjit.graphed(lambda d: d["a"] * 2)
    for i in range(5):
        out = g(Stubborn("t", {"a": torch.full((3,), float(i))}))
        assert torch.equal(out, torch.full((3,), 2.0 * i)), i
    st = g.stats()
    assert st["graphs"] == 0 and st["fallbacks"].get("an argument cannot be rebuilt"), g.report()
    assert "Stubborn" in st["keys"][0]["detail"]


class Tagged(dict):
    """A dict subclass with an attribute of its own."""


class Ring(collections.deque):
    pass


def test_subclasses_keep_their_attributes_and_maxlen(emu):
    def f(d, r):
        assert d.scale == 3.0 and r.maxlen == 2, (vars(d), r.maxlen)
        return d["x"] * d.scale + r[0]

    g = graphjit.graphed(f)
    for i in range(5):
        d = Tagged(x=torch.full((2,), float(i)))
        d.scale = 3.0
        out = g(d, Ring([torch.ones(2)], maxlen=2))
        assert torch.equal(out, torch.full((2,), 3.0 * i + 1)), i
    assert g.stats()["replays"] == 3 and not g.stats()["fallbacks"], g.report()


def test_a_function_that_runs_no_backward_leaves_the_gradients_alone(emu):
    """An evaluation function that reaches the optimizer (and a gradient left by training) owns no gradient
    buffer: gradients set to None between its calls stay None, the one left in place is not touched."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(2, 8)).sum().backward()
    left = model.bias.grad

    @graphjit.graphed
    def evaluate(x):
        _ = opt.param_groups[0]["lr"]
        with torch.no_grad():
            return model(x) * 2

    for i in range(5):
        model.weight.grad = None
        evaluate(torch.randn(2, 8))
        assert model.weight.grad is None and model.bias.grad is left, i
    assert evaluate.stats()["replays"] == 3


def test_a_step_first_called_inside_a_capture_scope_graphs(emu):
    """Inside capture_scope() the key's first call runs once for itself, then graphjit's undone extra warmups and
    the capture: the gradients the first run made are owned from the extra runs on."""
    loop = cases.build("cpu", opt="sgd", zero="inside")
    want_out, want_state, _ = cases.run(cases.build("cpu", opt="sgd", zero="inside"), graph=False)
    f = graphjit.graphed(loop.fn)
    outs, states = [], []
    for i in range(loop.calls):
        loop.before(i)
        if i == 0:
            with graphjit.capture_scope():
                out = f(*loop.args(i))
        else:
            out = f(*loop.args(i))
        outs.append(out.detach().clone())
        states.append([t.detach().clone() for t in loop.state()])
    st = f.stats()
    assert st["graphs"] == 1 and st["replays"] == loop.calls - 1 and not st["fallbacks"], f.report()
    assert cases.max_diff(outs, want_out) <= TOL
    assert all(cases.max_diff(a, b) <= TOL for a, b in zip(states, want_state))


class PlainSGD(torch.optim.Optimizer):
    """An optimizer graphjit does not know: it reads its lr as a Python number."""

    def __init__(self, params, lr):
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad, alpha=-group["lr"])


def test_an_optimizer_graphjit_does_not_know_keeps_its_guards(emu):
    """A schedule on an unknown optimizer: right, uncaptured once the lr changes every call, the reason names
    param_groups' lr and says how to make it cheap."""
    torch.manual_seed(0)

    def make():
        torch.manual_seed(0)
        model = torch.nn.Linear(8, 4)
        opt = PlainSGD(model.parameters(), lr=0.1)
        return model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 0.9 ** k)

    def body(model, opt, x):
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
        return model.weight.sum().detach()

    xs = [torch.randn(4, 8, generator=torch.Generator().manual_seed(i)) for i in range(10)]
    runs = []
    for f in (body, graphjit.graphed(body)):
        model, opt, sched = make()
        outs = []
        for x in xs:
            outs.append(f(model, opt, x))
            sched.step()
        runs.append((torch.stack(outs), model.weight.detach().clone(), f))
    assert torch.allclose(runs[0][0], runs[1][0], atol=1e-6) and torch.allclose(runs[0][1], runs[1][1], atol=1e-6)
    st = runs[1][2].stats()
    changed = [r for r in st["fallbacks"] if r.startswith(guards.REASON)]
    assert changed and "['lr']" in changed[0], st["fallbacks"]
    detail = next(k["detail"] for k in st["keys"] if (k["reason"] or "").startswith(guards.REASON))
    assert OPTIMIZER_HINT in detail


FLAG = {"aux": True}


def _two_heads():
    torch.manual_seed(0)
    model = torch.nn.ModuleDict({"body": torch.nn.Linear(16, 4), "aux": torch.nn.Linear(16, 4)})
    return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def _step_sync(model, opt, x, y):  # a data-dependent branch; .item() keeps the key uncaptured
    opt.zero_grad()
    out = model["body"](x)
    if out.sum().item() > 0:
        out = out + model["aux"](x)
    loss = torch.nn.functional.mse_loss(out, y)
    loss.backward()
    opt.step()
    return loss.detach()


def _step_flag(model, opt, x, y):  # a branch on a Python value the function reads: a graph per value
    opt.zero_grad()
    out = model["body"](x)
    if FLAG["aux"]:
        out = out + model["aux"](x)
    loss = torch.nn.functional.mse_loss(out, y)
    loss.backward()
    opt.step()
    return loss.detach()


@pytest.mark.parametrize("fn", [_step_sync, _step_flag])
def test_a_parameter_a_branch_leaves_unused_is_skipped_as_eagerly(emu, fn):
    """zero_grad() inside the step, and a branch that leaves a parameter without a gradient on some calls: eager's
    optimizer skips it (grad None); graphjit's kept buffer must not turn that into a zero gradient that momentum
    still moves."""
    g = torch.Generator().manual_seed(3)
    batches = [(torch.randn(8, 16, generator=g) * (1 if i % 2 else -1), torch.randn(8, 4, generator=g))
               for i in range(12)]
    runs = []
    for graph in (False, True):
        model, opt = _two_heads()
        f = graphjit.graphed(fn) if graph else fn
        FLAG["aux"] = True
        for i, (x, y) in enumerate(batches):
            if i == 6:
                FLAG["aux"] = False
            f(model, opt, x, y)
        runs.append(([p.detach().clone() for p in model.parameters()],
                     [p.grad is None for p in model.parameters()], f))
    assert cases.max_diff(runs[1][0], runs[0][0]) <= TOL, runs[1][2].report()
    assert runs[1][1] == runs[0][1]


def test_a_scheduler_stepped_inside_the_step_keeps_its_numbers(emu):
    """The scheduler is stepped in the graphed function: its optimizer's lr is not fed (the number is the
    scheduler's to set), so the lr after each call and get_last_lr() are eager's floats."""
    def make():
        torch.manual_seed(0)
        model = torch.nn.Linear(8, 4)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
        return model, opt, torch.optim.lr_scheduler.ExponentialLR(opt, 0.5)

    def step(model, opt, sched, x):
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
        sched.step()
        return x.sum()

    xs = [torch.randn(2, 8, generator=torch.Generator().manual_seed(i)) for i in range(6)]
    lrs = []
    for f_of in (lambda f: f, graphjit.graphed):
        model, opt, sched = make()
        f = f_of(step)
        seen = []
        for x in xs:
            f(model, opt, sched, x)
            seen.append((opt.param_groups[0]["lr"], sched.get_last_lr()[0]))
        lrs.append(seen)
    assert lrs[1] == lrs[0] and all(isinstance(a, float) and isinstance(b, float) for a, b in lrs[1])


def test_keys_of_several_batch_shapes_share_the_gradient_buffers(emu):
    """A smaller last batch (or shapes that cycle) makes other keys: each graphs, with the same gradient buffer
    per parameter, and the loop equals eager."""
    def make():
        torch.manual_seed(0)
        model = torch.nn.Linear(16, 4)
        return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def step(model, opt, x, y):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        return model.weight.grad.sum().detach()

    g = torch.Generator().manual_seed(5)
    batches = [(torch.randn(n, 16, generator=g), torch.randn(n, 4, generator=g)) for n in [8, 5, 3] * 8]
    runs = []
    for graph in (False, True):
        model, opt = make()
        f = graphjit.graphed(step) if graph else step
        outs = [f(model, opt, x, y).clone() for x, y in batches]
        grads = model.weight.grad
        runs.append((outs, [p.detach().clone() for p in model.parameters()], f, grads))
    assert cases.max_diff(runs[1][0], runs[0][0]) <= TOL and cases.max_diff(runs[1][1], runs[0][1]) <= TOL
    st = runs[1][2].stats()
    assert st["graphs"] == 3 and not st["fallbacks"] and st["replays"] >= 15, runs[1][2].report()


def test_default_sgd_adopted_after_its_first_call_graphs(emu, monkeypatch):
    """torch's default SGD is made fused once a call shows it steps (on CUDA; here its parameters are taken to be
    there): the first fused step must not write Python state a replay would miss (SGD's one-time device check)."""
    from graphjit.backends.torch import optimizers

    monkeypatch.setattr(optimizers, "_on_cuda", lambda opt, group: True)
    worst, st, g = cases.compare(lambda: cases.build("cpu", opt="sgd"))
    assert worst <= TOL, (worst, g.report())
    assert st["graphs"] == 1 and not st["fallbacks"], g.report()
    assert st["replays"] >= 16 - 3, g.report()


def test_a_momentum_that_reaches_zero_stays_right(emu):
    """At momentum 0 torch's SGD leaves its momentum buffers alone: a fed zero would update them, so a zero stays a
    number (guarded: a graph of its own) and the buffers end as eagerly."""
    worst, st, g = cases.compare(lambda: cases.build("cpu", opt="sgd_fused", sched="momentum_to_zero"))
    assert worst <= TOL, (worst, g.report())
    assert st["graphs"] >= 1 and st["replays"] >= 6, g.report()


def test_a_param_group_added_between_calls_and_scaler_arguments_are_handled():
    """Hyper compares hyperparameters group by group: a group added between two calls is a new baseline, not an
    error; graphjit's own step refuses a GradScaler's grad_scale / found_inf instead of ignoring them, and while it
    is in place the optimizer says it takes none (a scaler then unscales first)."""
    from graphjit.backends.torch import hyper
    from graphjit.feeds import Feeds

    a, b = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([a], lr=0.1, momentum=0.9, fused=True)
    parts = []
    h = hyper.Hyper(Feeds([], lambda t, v: t.fill_(v)), parts.append, False)
    h.watch("opt", opt)
    a.grad = torch.ones(2)
    assert not h.learn()
    opt.add_param_group({"params": [b], "momentum": 0.5})
    opt.param_groups[0]["momentum"] = 0.8
    assert not h.learn() and not parts  # another group count: a new baseline
    opt.param_groups[0]["momentum"] = 0.7
    assert h.learn() and len(parts) == 1
    own = parts[0]
    assert opt._step_supports_amp_scaling
    own.enter()
    try:
        assert not opt._step_supports_amp_scaling
        opt.grad_scale = torch.ones(())
        with pytest.raises(graphjit.GraphjitError, match="GradScaler"):
            opt.step()
        del opt.grad_scale
    finally:
        own.exit()
    assert opt._step_supports_amp_scaling and "step" not in opt.__dict__
