"""GPU tests of graphed_layer: real forward and backward CUDA graphs (make test-gpu / test-gpu-paddle).

torch (the machine's python3): an MLP and a small transformer block trained 50 SGD steps, graphed
against eager from the same initial weights and data (fp32, TF32 off): losses within 1e-5 relative,
final parameters within 1e-5; 1F1B with 4 micro-batches equal to eager; a new shape records new graphs.

Paddle (the kit's paddlepaddle-gpu 2.6.2): only matmul and copies compute right on the H200, so the
layers are bias-free matmul chains, inputs come from numpy, every result (outputs, input and
parameter gradients) is checked against float64 numpy, and each backward starts from cleared
gradients (accumulation and the optimizer step need elementwise kernels: covered on the CPU).

Framework imports are inside the tests: the Paddle kit's Python has no torch, and the torch machine's
Python has no Paddle.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

import graphjit
from graphjit.bench.torch.train import build_model

TORCH = [pytest.mark.gpu, pytest.mark.torch]
PADDLE = [pytest.mark.gpu, pytest.mark.paddle]

LOSS_RTOL = 1e-5
PARAM_RTOL = 1e-5


# ==================================================================================================
# torch
# ==================================================================================================
@pytest.fixture
def tt():
    """torch with fp32 matmuls in full precision (no TF32), restored afterwards."""
    torch = pytest.importorskip("torch")
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
             torch.get_float32_matmul_precision())
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    yield torch
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[:2]
    torch.set_float32_matmul_precision(saved[2])


def make_mlp(torch, d_in=64, hidden=256, d_out=64):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(d_in, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, hidden),
                               torch.nn.GELU(), torch.nn.Linear(hidden, d_out)).cuda()


def make_block(torch, d=64, seq=32):
    """A pre-LayerNorm transformer block (causal self-attention written with matmuls, 4 heads, then a
    GELU MLP): the block ``bench train --model block`` times."""
    torch.manual_seed(0)
    return build_model(torch, "block", 1, d, seq)[0].cuda()

def batches(torch, shape_x, shape_y, n, seed=0):
    """``n`` batches ``(x, y)`` of a learnable target: ``y = tanh(x @ A)`` for a fixed random ``A``."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(shape_x[-1], shape_y[-1], generator=torch.Generator().manual_seed(1234)) / shape_x[-1] ** 0.5
    out = []
    for _ in range(n):
        x = torch.randn(*shape_x, generator=g)
        out.append((x.cuda(), torch.tanh(x @ a).cuda()))
    return out


def rel(torch, a, b) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def train_side_by_side(torch, eager, data, steps, lr, warmup=3):
    """The same SGD loop on ``eager`` and on a graphed copy of it; returns both loss curves and the
    graphed module."""
    graphed = graphjit.graphed_layer(copy.deepcopy(eager), warmup=warmup)
    runs = {}
    for name, model in (("eager", eager), ("graphed", graphed)):
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        losses = []
        for step in range(steps):
            x, y = data[step % len(data)]
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        runs[name] = torch.stack(losses).cpu().double()
    return runs["eager"], runs["graphed"], graphed


def check_training(torch, eager, graphed, losses_e, losses_g, steps, warmup, captures=1):
    assert torch.isfinite(losses_e).all()
    assert float(losses_e[-1]) < float(losses_e[0])  # it trains
    rel_loss = ((losses_g - losses_e).abs() / losses_e.abs()).max()
    assert float(rel_loss) <= LOSS_RTOL, (float(rel_loss), losses_e[:5], losses_g[:5])
    for (name, p), q in zip(eager.named_parameters(), graphed.layer.parameters()):
        assert rel(torch, q, p) <= PARAM_RTOL, (name, rel(torch, q, p))
    s = graphed.stats()
    assert not s["fallbacks"], s
    assert s["captures"] == captures and s["graphs"] == len(s["keys"]), s
    assert s["replays"] == steps - warmup * len(s["keys"]), s
    assert s["backward_replays"] == s["replays"] and s["in_flight"] == 0, s


@pytest.mark.parametrize("model", ["mlp", "block"])
@pytest.mark.gpu
@pytest.mark.torch
def test_torch_training_50_sgd_steps_equals_eager(tt, model):
    torch = tt
    steps, warmup = 50, 3
    if model == "mlp":
        eager = make_mlp(torch)
        data = batches(torch, (32, 64), (32, 64), steps)
        lr = 0.05
    else:
        eager = make_block(torch)
        data = batches(torch, (8, 32, 64), (8, 32, 64), steps)
        lr = 0.02
    losses_e, losses_g, graphed = train_side_by_side(torch, eager, data, steps, lr, warmup)
    check_training(torch, eager, graphed, losses_e, losses_g, steps, warmup)
    key = graphed.stats()["keys"][0]
    assert key["state"] == "replay" and key["slots"] == 1, key


@pytest.mark.gpu
@pytest.mark.torch
def test_torch_new_shape_records_new_graphs(tt):
    torch = tt
    steps, warmup = 20, 2
    eager = make_mlp(torch)
    data = [b for pair in zip(batches(torch, (16, 64), (16, 64), 10, 1), batches(torch, (48, 64), (48, 64), 10, 2))
            for b in pair]  # batch 16, batch 48, batch 16, ...
    losses_e, losses_g, graphed = train_side_by_side(torch, eager, data, steps, 0.05, warmup)
    check_training(torch, eager, graphed, losses_e, losses_g, steps, warmup, captures=2)
    keys = graphed.stats()["keys"]
    assert len(keys) == 2 and all(k["captures"] == 1 and k["replays"] == 8 for k in keys), keys


@pytest.mark.gpu
@pytest.mark.torch
def test_torch_a_residual_scale_changed_mid_training_trains_as_eager(tt):
    """The value the forward reads (``self.alpha``) changes after the recording, and back: the steps after each
    change are steps of the key of the current value (real CUDA graphs read no Python), losses and parameters as
    the eager loop's; the first key's graphs replay again once the value is back (training/values.py)."""
    torch = tt

    class Scaled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.fc2 = torch.nn.Linear(64, 128), torch.nn.Linear(128, 64)
            self.alpha = 1.0

        def forward(self, x):
            return x + self.alpha * self.fc2(torch.nn.functional.gelu(self.fc1(x)))

    def run(graph: bool):
        torch.manual_seed(0)
        model = Scaled().cuda()
        layer = graphjit.graphed_layer(model, warmup=2) if graph else model
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        gen = torch.Generator(device="cuda").manual_seed(1)
        losses = []
        for step in range(16):
            model.alpha = {6: 0.25, 11: 1.0}.get(step, model.alpha)
            x = torch.randn(32, 64, device="cuda", generator=gen)
            opt.zero_grad()
            loss = layer(x).pow(2).mean()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses, [p.detach().clone() for p in model.parameters()], layer

    want, want_params, _ = run(False)
    got, got_params, layer = run(True)
    np.testing.assert_allclose(got, want, rtol=LOSS_RTOL)
    for g, w in zip(got_params, want_params):
        torch.testing.assert_close(g, w, rtol=PARAM_RTOL, atol=1e-6)
    keys = layer.stats()["keys"]
    assert len(keys) == 2 and all(k["captures"] == 1 for k in keys), layer.report()
    first = next(k for k in keys if "alpha" not in k["key"])
    assert first["replays"] == 4 + 5, layer.report()  # steps 2-5 (the recording replays too) and 11-15


@pytest.mark.gpu
@pytest.mark.torch
def test_torch_outputs_are_fresh_tensors(tt):
    torch = tt
    g = graphjit.graphed_layer(make_mlp(torch), warmup=1)
    xs = [torch.randn(4, 64, device="cuda") for _ in range(4)]
    outs = []
    for x in xs:
        out = g(x)
        out.sum().backward()
        outs.append(out.detach())
    with torch.no_grad():
        for x, out in zip(xs, outs):  # earlier outputs were not overwritten by later replays
            assert rel(torch, out, g.layer(x)) < 1e-6
    assert g.stats()["replays"] == 3


def one_f_one_b(torch, layer, xs, ys):
    """Stage 0 of a 4-stage 1F1B pipeline: F0 F1 F2 B0 F3 B1 B2 B3; returns the 4 losses."""
    outs, losses = {}, {}
    for op in ("F0", "F1", "F2", "B0", "F3", "B1", "B2", "B3"):
        i = int(op[1])
        if op[0] == "F":
            outs[i] = layer(xs[i])
        else:
            loss = torch.nn.functional.mse_loss(outs.pop(i), ys[i])
            loss.backward()
            losses[i] = loss.detach()
    return torch.stack([losses[i] for i in range(4)])


@pytest.mark.parametrize("model", ["mlp", "block"])
@pytest.mark.gpu
@pytest.mark.torch
def test_torch_one_f_one_b_four_micro_batches_equals_eager(tt, model):
    """Several forwards before their backwards: each outstanding micro-batch gets its own graph pair;
    inputs require grad (activations of a previous stage) and get their gradients; parameter
    gradients accumulate over the 4 micro-batches as in eager."""
    torch = tt
    eager = make_mlp(torch) if model == "mlp" else make_block(torch)
    shape = (16, 64) if model == "mlp" else (4, 32, 64)
    graphed = graphjit.graphed_layer(copy.deepcopy(eager), warmup=3)
    opts = {n: torch.optim.SGD(m.parameters(), lr=0.02) for n, m in (("eager", eager), ("graphed", graphed))}
    gen = torch.Generator().manual_seed(7)
    for step in range(6):
        xs = [torch.randn(*shape, generator=gen).cuda() for _ in range(4)]
        ys = [torch.randn(*shape, generator=gen).cuda() for _ in range(4)]
        results = {}
        for name, model_ in (("eager", eager), ("graphed", graphed)):
            leaves = [x.clone().requires_grad_(True) for x in xs]
            opts[name].zero_grad(set_to_none=True)
            losses = one_f_one_b(torch, model_, leaves, ys)
            grads = [p.grad.clone() for p in model_.parameters()]
            results[name] = (losses.cpu().double(), [x.grad for x in leaves], grads)
            opts[name].step()
        (le, xg_e, pg_e), (lg, xg_g, pg_g) = results["eager"], results["graphed"]
        assert float(((lg - le).abs() / le.abs()).max()) <= LOSS_RTOL, (step, le, lg)
        for a, b in zip(xg_g, xg_e):
            assert rel(torch, a, b) <= 1e-5, step
        for a, b in zip(pg_g, pg_e):
            assert rel(torch, a, b) <= 1e-5, step
    for p, q in zip(eager.parameters(), graphed.layer.parameters()):
        assert rel(torch, q, p) <= PARAM_RTOL
    s = graphed.stats()
    key = s["keys"][0]
    # step 0: 3 eager warmups, F3 records slot 0; step 1: F1 and F2 record slots 1 and 2; later: replays only
    assert not s["fallbacks"] and key["slots"] == 3 and key["captures"] == 3, s
    assert key["replays"] == 6 * 4 - 3 and key["backward_replays"] == key["replays"] and s["in_flight"] == 0, s


# ==================================================================================================
# Paddle (bias-free matmul chains; numpy checks only)
# ==================================================================================================
TF32 = 5e-3  # cuBLAS may use TF32 for fp32 matmul in Paddle


@pytest.fixture
def pd():
    paddle = pytest.importorskip("paddle")
    paddle.set_device("gpu:0")
    return paddle


def nrel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def T(paddle, a, grad=False):
    t = paddle.to_tensor(np.ascontiguousarray(a, dtype=np.float32), place=paddle.CUDAPlace(0))
    t.stop_gradient = not grad
    return t


def make_params(layer, paddle, arrays, prefix):
    out = []
    for i, a in enumerate(arrays):
        p = layer.create_parameter(list(a.shape), dtype="float32")
        p.set_value(np.ascontiguousarray(a, dtype=np.float32))  # a host-to-device copy (no init kernel result used)
        layer.add_parameter(f"{prefix}{i}", p)
        out.append(p)
    return out


def chain_layer(paddle, ws_np):
    class Chain(paddle.nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.ws = make_params(self, paddle, ws_np, "w")

        def forward(self, x):
            h = x
            for w in self.ws:
                h = paddle.matmul(h, w)
            return h

    return Chain()


def chain_ref(x, ws, gy):
    """Output and gradients of x @ W0 @ W1 @ ... in float64."""
    hs = [np.asarray(x, np.float64)]
    for w in ws:
        hs.append(hs[-1] @ w)
    dh = np.asarray(gy, np.float64)
    dws = [None] * len(ws)
    for i in reversed(range(len(ws))):
        dws[i] = hs[i].T @ dh
        dh = dh @ np.asarray(ws[i], np.float64).T
    return hs[-1], dh, dws


def clear(layer):
    for p in layer.parameters():
        p.clear_gradient(False)  # no gradient: the next backward stores, never adds


@pytest.mark.gpu
@pytest.mark.paddle
def test_paddle_matmul_chain_forward_backward_graphs_on_new_inputs(pd):
    paddle = pd
    rng = np.random.default_rng(0)
    ws = [rng.standard_normal((64, 64)).astype(np.float32) / 8 for _ in range(3)]
    layer = chain_layer(paddle, ws)
    g = graphjit.graphed_layer(layer, warmup=2)
    for step in range(8):
        x_np = rng.standard_normal((8, 64)).astype(np.float32)
        gy_np = rng.standard_normal((8, 64)).astype(np.float32)
        x = T(paddle, x_np, grad=True)
        clear(layer)
        out = g(x)
        out.backward(T(paddle, gy_np))
        want, dx, dws = chain_ref(x_np, ws, gy_np)
        assert nrel(out.numpy(), want) < TF32, step
        assert nrel(x.grad.numpy(), dx) < TF32, step
        for p, dw in zip(layer.ws, dws):
            assert nrel(p.grad.numpy(), dw) < TF32, step
    s = g.stats()
    assert not s["fallbacks"], s
    assert s["captures"] == 1 and s["replays"] == 6 and s["backward_replays"] == 6, s
    assert s["keys"][0]["state"] == "replay" and s["in_flight"] == 0, s


@pytest.mark.gpu
@pytest.mark.paddle
def test_paddle_two_outputs_with_gradients_and_an_input_without(pd):
    """Two outputs carry gradients (no gradient is summed: no add kernel), one input needs none."""
    paddle = pd
    rng = np.random.default_rng(1)
    a_np, b_np, c_np = (rng.standard_normal((32, 32)).astype(np.float32) / 6 for _ in range(3))

    class TwoHeads(paddle.nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b, self.c = make_params(self, paddle, [a_np, b_np, c_np], "p")

        def forward(self, x, z):
            return paddle.matmul(paddle.matmul(x, self.a), self.b), paddle.matmul(z, self.c)

    layer = TwoHeads()
    g = graphjit.graphed_layer(layer, warmup=1)
    for step in range(5):
        x_np, z_np, g1_np, g2_np = (rng.standard_normal((4, 32)).astype(np.float32) for _ in range(4))
        x, z = T(paddle, x_np, grad=True), T(paddle, z_np, grad=False)
        clear(layer)
        o1, o2 = g(x, z)
        paddle.autograd.backward([o1, o2], [T(paddle, g1_np), T(paddle, g2_np)])
        want1, dx, (da, db) = chain_ref(x_np, [a_np, b_np], g1_np)
        want2, _, (dc,) = chain_ref(z_np, [c_np], g2_np)
        assert nrel(o1.numpy(), want1) < TF32 and nrel(o2.numpy(), want2) < TF32, step
        assert nrel(x.grad.numpy(), dx) < TF32 and z.grad is None, step
        for p, want in ((layer.a, da), (layer.b, db), (layer.c, dc)):
            assert nrel(p.grad.numpy(), want) < TF32, step
    s = g.stats()
    assert not s["fallbacks"] and s["captures"] == 1 and s["replays"] == 4 and s["backward_replays"] == 4, s


@pytest.mark.gpu
@pytest.mark.paddle
def test_paddle_one_f_one_b_four_micro_batches(pd):
    """F0 F1 F2 B0 F3 B1 B2 B3: outstanding micro-batches get their own graph pairs; every backward's
    gradients are read before the next one (each starts from cleared gradients)."""
    paddle = pd
    rng = np.random.default_rng(2)
    ws = [rng.standard_normal((32, 32)).astype(np.float32) / 6 for _ in range(2)]
    layer = chain_layer(paddle, ws)
    g = graphjit.graphed_layer(layer, warmup=3)
    for step in range(3):
        xs_np = [rng.standard_normal((4, 32)).astype(np.float32) for _ in range(4)]
        gys_np = [rng.standard_normal((4, 32)).astype(np.float32) for _ in range(4)]
        xs = [T(paddle, a, grad=True) for a in xs_np]
        outs = {}
        for op in ("F0", "F1", "F2", "B0", "F3", "B1", "B2", "B3"):
            i = int(op[1])
            if op[0] == "F":
                outs[i] = g(xs[i])
                continue
            clear(layer)
            out = outs.pop(i)
            out.backward(T(paddle, gys_np[i]))
            want, dx, dws = chain_ref(xs_np[i], ws, gys_np[i])
            assert nrel(out.numpy(), want) < TF32, (step, op)
            assert nrel(xs[i].grad.numpy(), dx) < TF32, (step, op)
            for p, dw in zip(layer.ws, dws):
                assert nrel(p.grad.numpy(), dw) < TF32, (step, op)
    s = g.stats()
    key = s["keys"][0]
    assert not s["fallbacks"] and key["slots"] == 3 and key["replays"] == 3 * 4 - 3, s
    assert key["backward_replays"] == key["replays"] and s["in_flight"] == 0, s
