"""Whole training steps as users write them, shared by the CPU tests (emulated CUDA graphs, test_training_steps.py)
and the GPU tests (test_gpu_training_steps.py): forward, loss, backward, optimizer step in one graphed function,
called once per batch, the loop around it (zero_grad before the call, a scheduler after it) as users write it,
run graphed and eagerly from the same seed and compared after every call.

:func:`build` makes one loop from its options; :func:`run` runs it and returns the outputs and the state after
every call (parameters, their gradients, buffers, optimizer state, the gradient scaler's scale).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

import graphjit


@dataclass
class Loop:
    fn: Callable[..., Any]
    args: Callable[[int], tuple[Any, ...]]
    before: Callable[[int], None]
    after: Callable[[int, Any], None]
    state: Callable[[], list[torch.Tensor]]
    calls: int
    optimizer: torch.optim.Optimizer


def make_optimizer(name: str, params: Any, device: str) -> torch.optim.Optimizer:
    """``adamw`` / ``adam``: as constructed by default (on the CPU, where no capturable Adam exists, fused);
    ``adamw_fused``; ``sgd``: momentum 0.9, torch's default foreach; ``sgd_fused``."""
    cpu = device == "cpu"
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-2, fused=True) if cpu else torch.optim.AdamW(params, lr=1e-2)
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-2, fused=True) if cpu else torch.optim.Adam(params, lr=1e-2)
    if name == "adamw_fused":
        return torch.optim.AdamW(params, lr=1e-2, fused=True)
    if name == "sgd":
        return torch.optim.SGD(params, lr=5e-2, momentum=0.9)
    if name == "sgd_fused":
        return torch.optim.SGD(params, lr=5e-2, momentum=0.9, fused=True)
    raise ValueError(name)


def make_scheduler(name: str | None, opt: torch.optim.Optimizer, calls: int) -> Any:
    if name is None or name == "warmup":
        return None
    s = torch.optim.lr_scheduler
    if name == "lambda":
        return s.LambdaLR(opt, lambda k: 0.93 ** k)
    if name == "step":
        return s.StepLR(opt, step_size=5, gamma=0.5)
    if name == "plateau":
        return s.ReduceLROnPlateau(opt, patience=0, factor=0.7)
    if name == "cosine":
        return s.CosineAnnealingLR(opt, T_max=calls)
    if name == "onecycle":  # moves Adam's betas[0] / SGD's momentum on every step, and the lr
        return s.OneCycleLR(opt, max_lr=1e-2, total_steps=calls + 1)
    if name == "cyclic":  # the same, triangular
        return s.CyclicLR(opt, base_lr=1e-3, max_lr=1e-2, step_size_up=4)
    if name == "decay":
        return WeightDecaySchedule(opt)
    if name == "momentum_to_zero":
        return MomentumToZero(opt)
    raise ValueError(name)


class MomentumToZero:
    """A hand-written momentum schedule that reaches 0 for a while and comes back (torch's SGD keeps no momentum
    buffer update at 0: a step that must not be fed a zero)."""

    def __init__(self, opt: torch.optim.Optimizer) -> None:
        self.opt, self.k = opt, 0

    def step(self) -> None:
        self.k += 1
        for group in self.opt.param_groups:
            group["momentum"] = [0.9, 0.8, 0.7, 0.0, 0.0, 0.0, 0.5, 0.6][self.k % 8]


class WeightDecaySchedule:
    """A hand-written schedule of weight decay (and lr), set in ``param_groups`` after every call."""

    def __init__(self, opt: torch.optim.Optimizer) -> None:
        self.opt, self.k = opt, 0

    def step(self) -> None:
        self.k += 1
        for group in self.opt.param_groups:
            group["weight_decay"] = 0.05 * 0.8 ** self.k
            group["lr"] = 1e-2 * 0.95 ** self.k


def build(device: str, opt: str = "adamw", zero: str = "inside", sched: str | None = None, form: str = "args",
          amp: str | None = None, clip: bool = False, dropout: bool = False, item: bool = False,
          overflow: bool = False, calls: int = 16) -> Loop:
    """One training loop (see the module docstring).

    ``zero``: ``inside`` (``opt.zero_grad()`` first in the step, its default set_to_none=True), ``outside``
    (before each call), ``in_place`` (inside, set_to_none=False), ``accumulate`` (before every other call only,
    so every second backward adds to the gradients of the call before).  ``form``: ``args``
    (``step(model, opt, x, y)``) or ``closure``.  ``amp``: ``fp16`` (autocast and a GradScaler) or ``bf16``;
    ``overflow``: the scaler starts at 2**40, so the first steps overflow and are skipped."""
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = [torch.nn.Linear(16, 32)]
    if dropout:
        layers.append(torch.nn.Dropout(0.2))
    layers += [torch.nn.ReLU(), torch.nn.Linear(32, 4)]
    model = torch.nn.Sequential(*layers).to(device)
    optimizer = make_optimizer(opt, model.parameters(), device)
    scheduler = make_scheduler(sched, optimizer, calls)
    scaler = (torch.amp.GradScaler(device, init_scale=2.0 ** 40 if overflow else 2.0 ** 10) if amp == "fp16"
              else None)
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(amp or "")
    g = torch.Generator(device=device).manual_seed(1)
    xs = [torch.randn(8, 16, generator=g, device=device) for _ in range(calls)]
    ys = [torch.randn(8, 4, generator=g, device=device) for _ in range(calls)]

    def body(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if zero == "inside":
            opt.zero_grad()
        elif zero == "in_place":
            opt.zero_grad(set_to_none=False)
        autocast = torch.autocast(device, dtype=dtype) if dtype is not None else contextlib.nullcontext()
        with autocast:
            loss = torch.nn.functional.mse_loss(model(x).float(), y)
        if scaler is not None:
            scaler.scale(loss).backward()
            if clip:
                scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            if clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
        if item:
            loss.item()
        return loss.detach()

    if form == "args":
        fn: Callable[..., Any] = body

        def args(i: int) -> tuple[Any, ...]:
            return model, optimizer, xs[i], ys[i]
    else:
        def fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return body(model, optimizer, x, y)

        def args(i: int) -> tuple[Any, ...]:
            return xs[i], ys[i]

    def before(i: int) -> None:
        if zero == "outside" or (zero == "accumulate" and i % 2 == 0):
            optimizer.zero_grad()
        if sched == "warmup":
            for group in optimizer.param_groups:
                group["lr"] = 1e-2 * min(1.0, (i + 1) / 6)

    def after(i: int, loss: torch.Tensor) -> None:
        if scheduler is None:
            return
        if sched == "plateau":
            scheduler.step(float(loss) * (1.0 if i % 3 else 10.0))  # a metric that stops improving now and then
        else:
            scheduler.step()

    def state() -> list[torch.Tensor]:
        out: list[torch.Tensor] = []
        for p in model.parameters():
            out.append(p)
            out.append(p.grad if p.grad is not None else torch.zeros(0))
        out += list(model.buffers())
        for s in optimizer.state.values():
            out += [v.reshape(()).to(p.device, torch.float32) if v.dim() == 0 else v for v in s.values()
                    if isinstance(v, torch.Tensor)]
        if scaler is not None:
            out.append(scaler._scale.float() if scaler._scale is not None else torch.zeros(0))
        return out

    return Loop(fn, args, before, after, state, calls, optimizer)


def run(loop: Loop, graph: bool, **options: Any) -> tuple[list[torch.Tensor], list[list[torch.Tensor]], Any]:
    """Outputs of every call, the state after every call (copies), the graphed function (or None)."""
    f = graphjit.graphed(loop.fn, **options) if graph else loop.fn
    outs: list[torch.Tensor] = []
    states: list[list[torch.Tensor]] = []
    for i in range(loop.calls):
        loop.before(i)
        out = f(*loop.args(i))
        outs.append(out.detach().clone())
        loop.after(i, out)
        states.append([t.detach().clone() for t in loop.state()])
    return outs, states, (f if graph else None)


def max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    """The largest absolute difference between two lists of tensors (inf where shapes differ or only one side
    is finite)."""
    worst = 0.0
    if len(a) != len(b):
        return float("inf")
    for x, y in zip(a, b):
        if x.shape != y.shape:
            return float("inf")
        if not torch.equal(torch.isfinite(x), torch.isfinite(y)):
            return float("inf")
        finite = torch.isfinite(x)
        if x.numel() and finite.any():
            worst = max(worst, float((x.double() - y.double())[finite].abs().max()))
    return worst


def compare(make: Callable[[], Loop], **options: Any) -> tuple[float, dict[str, Any], Any]:
    """The largest difference between the graphed and the eager loop (outputs and state after every call), the
    graphed function's stats, and the graphed function."""
    worst, st, g, _loop = compare_loops(make, **options)
    return worst, st, g


def compare_loops(make: Callable[[], Loop], **options: Any) -> tuple[float, dict[str, Any], Any, Loop]:
    """:func:`compare`, and the loop that ran graphed (its optimizer, as the loop left it)."""
    want_out, want_state, _ = run(make(), graph=False)
    loop = make()
    got_out, got_state, g = run(loop, graph=True, **options)
    worst = max_diff(got_out, want_out)
    for a, b in zip(got_state, want_state):
        worst = max(worst, max_diff(a, b))
    return worst, g.stats(), g, loop
