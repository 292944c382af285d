"""GPU tests, torch: never a stale replay.  Every case of tests/guard_cases.py (a function that reads a Python
value it does not receive: an attribute, a global, a closed-over list or dict item, a slice bound; training loops
with a float-lr scheduler, a hand-written warmup, StepLR, weight decay changed, a tensor lr; BatchNorm) graphed
with both torch tracers equals the same loop run eagerly, call by call, outputs and state (parameters, buffers,
optimizer state); where the value settles or toggles, graphs replay.  A failed capture (fused AdamW with a
GradScaler, fp16) leaves no trace.  The CPU counterparts: tests/test_guards.py (emulated graphs)."""

from __future__ import annotations

import pytest

import graphjit
from graphjit import guards, renewals

pytestmark = [pytest.mark.gpu, pytest.mark.torch]

torch = pytest.importorskip("torch")

import guard_cases as cases  # noqa: E402

DEV = "cuda"
TOL = 1e-5  # the same kernels in the same order: differences are a different cuBLAS algorithm at most


def _check(make, **options):
    want_out, want_state, _ = cases.run(make, DEV, graph=False)
    got_out, got_state, g = cases.run(make, DEV, graph=True, **options)
    assert cases.max_diff(got_out, want_out) <= TOL, g.report()
    for i, (a, b) in enumerate(zip(got_state, want_state)):
        assert cases.max_diff(a, b) <= TOL, (i, cases.max_diff(a, b), g.report())
    return g.stats(), g


TRACERS = ["eager", "compile"]


@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize("name", sorted(cases.VALUES))
def test_a_changed_value_never_replays_a_stale_graph(name, tracer):
    make = cases.VALUES[name]
    if tracer not in make(DEV).extra.get("tracers", TRACERS):
        pytest.skip(f"{name}: not covered under tracer={tracer!r} (see the case)")
    st, g = _check(make, tracer=tracer)
    if make(DEV).keeps_graph:  # a graph per value, or one graph fed the tensors rebound (graphjit/renewals.py)
        renewed = any((k["reason"] or "").startswith(renewals.REASON) for k in st["keys"])
        assert (st["graphs"] >= 2 or renewed) and st["replays"] >= 3, g.report()
    else:
        assert any(r.startswith(guards.REASON) for r in st["fallbacks"]), g.report()
    assert "verify failed" not in st["fallbacks"], g.report()


@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize("name", sorted(cases.TRAINING))
def test_training_loops_equal_eager_after_every_call(name, tracer):
    make = cases.TRAINING[name]
    st, g = _check(make, tracer=tracer)
    print(g.report())  # with torch.compile too, whether the step graphs (the promise here is equality)
    if tracer == "compile":
        return  # equal to eager is the promise; whether a compiled whole step graphs is shown in the report
    if make(DEV).keeps_graph:
        assert st["replays"] >= 4, g.report()
    else:
        assert any(r.startswith(guards.REASON) for r in st["fallbacks"]), g.report()


@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize("make", [cases.batchnorm_no_grad, cases.batchnorm_functional])
def test_batchnorm_running_statistics_equal_eager_after_every_call(tracer, make):
    st, g = _check(make, tracer=tracer)
    assert st["replays"] >= 5, g.report()


def _amp_step(fused: bool, graph: bool, steps: int = 12):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8)).to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=fused)
    scaler = torch.amp.GradScaler("cuda")

    def step(x, y):
        opt.zero_grad(set_to_none=False)
        with torch.autocast("cuda", dtype=torch.float16):
            loss = torch.nn.functional.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        if torch.cuda.is_current_stream_capturing():  # the capture fails after the step's Python ran
            raise RuntimeError("refused during the capture")
        return loss.detach().float()

    f = graphjit.graphed(step) if graph else step
    gen = torch.Generator(device=DEV).manual_seed(1)
    losses = []
    for _ in range(steps):
        x = torch.randn(32, 64, device=DEV, generator=gen)
        y = torch.randn(32, 8, device=DEV, generator=gen)
        losses.append(f(x, y))
    state = [p.detach().clone() for p in model.parameters()]
    for s in opt.state.values():
        state += [v.detach().clone() for v in s.values() if isinstance(v, torch.Tensor)]
    state += [scaler._scale.clone(), scaler._growth_tracker.clone()]
    return losses, state, f


def test_a_failed_capture_with_fused_adamw_and_a_grad_scaler_leaves_no_trace():
    want_losses, want_state, _ = _amp_step(fused=True, graph=False)
    got_losses, got_state, f = _amp_step(fused=True, graph=True)
    st = f.stats()
    assert st["graphs"] == 0 and st["fallbacks"], f.report()  # the step raised during its capture
    assert all(torch.isfinite(t).all() for t in got_losses + got_state)
    assert cases.max_diff(got_losses, want_losses) <= TOL, f.report()
    assert cases.max_diff(got_state, want_state) <= TOL, f.report()


@pytest.mark.parametrize("tracer", TRACERS)
def test_a_deadline_read_from_the_host_clock_is_eagers(tracer):
    """A step that stops adding once ``time.monotonic()`` passes a deadline: it runs uncaptured under its reason
    (graphjit/host_clock.py), every call equal to eager, on either side of the deadline (before, the graph kept its
    capture's reading; under ``tracer="compile"`` the read is a graph break Dynamo runs as Python, watched since
    the names recorder's ``names=False``)."""
    import time

    from graphjit import host_clock

    w = torch.randn(16, 16, device=DEV)
    deadline = [time.monotonic() + 3600]

    def step(x):
        return x @ w + (1.0 if time.monotonic() < deadline[0] else 0.0)

    g = graphjit.graphed(step, tracer=tracer)
    x = torch.randn(4, 16, device=DEV)
    with torch.no_grad():
        for i in range(10):
            if i == 6:
                deadline[0] = 0.0  # passed (a guarded value too: its own key, watched again)
            assert torch.allclose(g(x), step(x), rtol=1e-5, atol=1e-5), (i, g.report())
    assert g.stats()["replays"] == 0 and host_clock.REASON in g.stats()["fallbacks"], g.report()


def test_the_dynamo_guards_of_a_compiled_function_are_checked_before_a_replay():
    """tracer="compile": a value only Dynamo's guards see (a module attribute graphjit's walk does not reach) makes
    the call leave the old graph."""
    import types

    holder = types.ModuleType("holder")  # modules are not walked by graphjit's guards; Dynamo guards their values
    holder.scale = 1.0
    w = torch.randn(16, 16, device=DEV)

    def step(x):
        return (x @ w) * holder.scale

    g = graphjit.graphed(step, tracer="compile")
    x = torch.randn(4, 16, device=DEV)
    with torch.no_grad():
        for i in range(8):
            holder.scale = 1.0 if i < 4 else 3.0
            assert torch.allclose(g(x), (x @ w) * holder.scale, rtol=1e-4, atol=1e-4), (i, g.report())


@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize("held", ["nobody", "old"])
def test_a_tensor_made_anew_on_the_model_is_fed_to_one_graph_and_never_written(tracer, held):
    """``m.delta = torch.full(...)`` before every five calls, ten times (Qwen2-VL's ``rope_deltas``): from the first
    new tensor on, the graph reads graphjit's own tensor, filled from the model's before each call (before, a graph per
    tensor, and uncaptured after eight); between calls ``m.delta`` is the caller's, and a tensor the caller keeps is
    never written.  Every call equals eager."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 64).to(DEV)

    class Shifted(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = lin
            self.delta = None

        def forward(self, x):
            return torch.tanh(self.lin(x) + self.delta)

    m = Shifted()
    g = graphjit.graphed(m, tracer=tracer)
    kept = []
    for gen in range(10):
        if held == "old" and m.delta is not None:
            kept.append((m.delta, m.delta.clone()))
        mine = m.delta = torch.full((1, 64), 0.1 * gen, device=DEV)
        for step in range(5):
            x = torch.randn(8, 64, device=DEV)
            with torch.no_grad():
                got = g(x)
                want = torch.tanh(lin(x) + m.delta)
            assert m.delta is mine
            assert (got - want).abs().max().item() <= TOL, (held, gen, step, g.report())
    for t, was in kept:
        assert torch.equal(t, was)
    st = g.stats()
    (key,) = st["keys"]
    assert st["graphs"] == 1 and key["captures"] == 2 and key["reason"].startswith(renewals.REASON), g.report()
    assert key["replays"] >= 45 and not st["fallbacks"], g.report()


def test_a_cublas_reduction_flag_changed_after_the_capture_is_another_key():
    """A bf16 GEMM's kernel is chosen at the capture under cuBLAS's reduced-precision-reduction flag: a call after
    the caller switched it off is another key (its own graph, equal to eager under the new flag), never the old
    graph; back to the first flag, the first graph replays (modes.py's kernel flags)."""
    torch.manual_seed(0)
    a = torch.randn(64, 4096, device=DEV, dtype=torch.bfloat16)
    b = torch.randn(4096, 64, device=DEV, dtype=torch.bfloat16)
    f = graphjit.graphed(lambda x, y: x @ y)
    matmul = torch.backends.cuda.matmul
    before = matmul.allow_bf16_reduced_precision_reduction
    try:
        for flag in (True, True, True, True, False, False, False, False, True):
            matmul.allow_bf16_reduced_precision_reduction = flag
            assert torch.equal(f(a, b), a @ b), (flag, f.report())
    finally:
        matmul.allow_bf16_reduced_precision_reduction = before
    stats = f.stats()
    assert stats["graphs"] == 2 and "cuBLAS bf16 reduction off" in f.report(), f.report()
    assert stats["replays"] >= 4, f.report()
