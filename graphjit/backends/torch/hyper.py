"""Adam, AdamW and SGD stepped by graphjit with every scheduled hyperparameter read from device tensors.

torch's own kernels take betas, momentum and weight decay as Python numbers (the weight of ``_foreach_lerp_``, the
base of ``_foreach_pow``, the ``double`` arguments of the fused kernels): a graph bakes them, and a tensor there
is read on the host, a sync no graph can hold.  A schedule that moves them on every step (``OneCycleLR`` and
``CyclicLR`` cycle Adam's ``betas[0]`` or SGD's ``momentum``; a hand-written weight-decay schedule) would then
run uncaptured.

:class:`Hyper` watches the optimizers a step's calls prepared (:mod:`.optimizers`): once two calls that ran the
Python function saw one of those values change, the optimizer's ``lr``, ``betas`` / ``momentum`` and
``weight_decay`` are fed (:class:`~graphjit.feeds.Feeds`), and during graphjit's calls its ``step()`` is
:func:`adam_step` or :func:`sgd_step`: the same algorithm as torch's capturable foreach Adam/AdamW and foreach
SGD, written with the tensor overloads of the foreach ops (step hooks, ``_opt_called`` and closures as torch's
``step``), also for fused ones.  Results agree with torch's to float rounding (the first moment is
``beta1 * m + (1 - beta1) * g`` where torch lerps), not bitwise.  Refuses (stays guarded): Adam whose step counts
are on the CPU, ``differentiable``, complex or sparse parameters, a fused optimizer a ``GradScaler`` the call
reaches steps with arguments of its own, and an optimizer whose scheduler the call reaches (it may step it
inside).
"""

from __future__ import annotations

import functools
import logging
import types
from typing import Any

import torch

from ...errors import GraphjitError
from ...feeds import Feeds, StepPart, slot

log = logging.getLogger("graphjit")

_NAMES = {torch.optim.Adam: ("betas", "weight_decay"), torch.optim.AdamW: ("betas", "weight_decay"),
          torch.optim.SGD: ("momentum", "weight_decay")}


def _hyper_names(opt: torch.optim.Optimizer) -> tuple[str, ...]:
    return _NAMES.get(type(opt), ())


def eligible(opt: torch.optim.Optimizer, scaled: bool) -> bool:
    """True if graphjit can step ``opt`` with its hyperparameters in tensors (see the module docstring);
    ``scaled``: the call reaches a GradScaler (which steps a fused SGD with arguments of its own)."""
    adam = isinstance(opt, (torch.optim.Adam, torch.optim.AdamW))
    if not _hyper_names(opt) or (scaled and not adam):
        return False
    for group in opt.param_groups:
        if group.get("differentiable") or not group["params"]:
            return False
        if adam and (not (group.get("fused") or group.get("capturable")) or (scaled and group.get("fused"))):
            return False  # its step counts on the CPU; or a GradScaler steps it with arguments of its own
        for p in group["params"]:
            if p.is_complex() or (p.grad is not None and p.grad.is_sparse):
                return False
    return True


def _values(opt: torch.optim.Optimizer) -> tuple[Any, ...]:
    return tuple(tuple(g.get(n) for n in _hyper_names(opt)) for g in opt.param_groups)


def adam_step(opt: torch.optim.Optimizer) -> None:
    """One Adam/AdamW step of ``opt`` whose ``lr``, ``betas`` and ``weight_decay`` may be device tensors: torch's
    capturable foreach algorithm with tensor hyperparameters (no host read of them)."""
    with torch.no_grad():
        for group in opt.param_groups:
            decoupled = bool(group.get("decoupled_weight_decay", isinstance(opt, torch.optim.AdamW)))
            params, grads, avgs, sqs, maxes, steps = [], [], [], [], [], []
            amsgrad, maximize = bool(group.get("amsgrad")), bool(group.get("maximize"))
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = opt.state[p]
                if len(state) == 0:
                    state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    if amsgrad:
                        state["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                params.append(p)
                grads.append(p.grad)
                avgs.append(state["exp_avg"])
                sqs.append(state["exp_avg_sq"])
                steps.append(state["step"])
                if amsgrad:
                    maxes.append(state["max_exp_avg_sq"])
            if not params:
                continue
            lr, (beta1, beta2), wd, eps = group["lr"], group["betas"], group["weight_decay"], group["eps"]
            if maximize:
                grads = list(torch._foreach_neg(grads))
            torch._foreach_add_(steps, 1)
            if _nonzero(wd):
                if decoupled:
                    torch._foreach_mul_(params, 1 - lr * wd)
                else:
                    grads = list(torch._foreach_add(grads, torch._foreach_mul(params, wd)))
            torch._foreach_mul_(avgs, beta1)
            torch._foreach_add_(avgs, torch._foreach_mul(grads, 1 - beta1))
            torch._foreach_mul_(sqs, beta2)
            torch._foreach_addcmul_(sqs, torch._foreach_mul(grads, 1 - beta2), grads)
            bc1 = _powers(beta1, steps)
            bc2 = _powers(beta2, steps)
            torch._foreach_sub_(bc1, 1)  # beta1^t - 1
            torch._foreach_sub_(bc2, 1)
            torch._foreach_neg_(bc2)  # 1 - beta2^t
            torch._foreach_div_(bc1, lr)
            torch._foreach_reciprocal_(bc1)  # -lr / (1 - beta1^t)
            torch._foreach_sqrt_(bc2)
            if amsgrad:
                torch._foreach_maximum_(maxes, sqs)
                denom = torch._foreach_sqrt(maxes)
            else:
                denom = torch._foreach_sqrt(sqs)
            torch._foreach_div_(denom, bc2)
            torch._foreach_add_(denom, eps)
            torch._foreach_div_(denom, bc1)
            torch._foreach_addcdiv_(params, avgs, denom)


def sgd_step(opt: torch.optim.Optimizer) -> None:
    """One SGD step of ``opt`` whose ``lr``, ``momentum`` and ``weight_decay`` may be device tensors: torch's foreach
    algorithm with tensor hyperparameters (a parameter's first step starts its momentum buffer, as torch's)."""
    with torch.no_grad():
        for group in opt.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            grads = [p.grad for p in params]
            lr, momentum, wd = group["lr"], group["momentum"], group["weight_decay"]
            dampening, nesterov = group.get("dampening", 0), bool(group.get("nesterov"))
            if group.get("maximize"):
                grads = list(torch._foreach_neg(grads))
            if _nonzero(wd):
                grads = list(torch._foreach_add(grads, torch._foreach_mul(params, wd)))
            if _nonzero(momentum):
                bufs = []
                for p, g in zip(params, grads):
                    state = opt.state[p]
                    buf = state.get("momentum_buffer")
                    if buf is None:
                        buf = state["momentum_buffer"] = torch.clone(g).detach()
                    else:
                        buf.mul_(momentum).add_(g, alpha=1 - dampening)
                    bufs.append(buf)
                if nesterov and (not group.get("fused") or getattr(opt, "_graphjit_made_fused", False)):
                    # in place, as torch's foreach SGD (the user's, made fused by graphjit): gradients then hold
                    # the nesterov step
                    torch._foreach_add_(grads, torch._foreach_mul(bufs, momentum))
                elif nesterov:  # torch's fused SGD leaves the gradients as they are
                    grads = list(torch._foreach_add(grads, torch._foreach_mul(bufs, momentum)))
                else:
                    grads = bufs
            torch._foreach_add_(params, torch._foreach_mul(grads, -lr if isinstance(lr, torch.Tensor) else -float(lr)))


def _refuse_scaler_arguments(opt: torch.optim.Optimizer) -> None:
    """A GradScaler hands a fused optimizer its scale and found_inf; graphjit's steps take neither (while
    :class:`OwnStep` is in place the optimizer says it does not, so a scaler unscales it first, as torch's
    non-fused optimizers): never silently ignore them."""
    if getattr(opt, "grad_scale", None) is not None or getattr(opt, "found_inf", None) is not None:
        raise GraphjitError("graphjit: a GradScaler passed grad_scale/found_inf to an optimizer graphjit steps with "
                            "fed hyperparameters; keep betas, momentum and weight decay constant with a GradScaler")


def _nonzero(v: Any) -> bool:
    """A fed tensor counts as nonzero (its number decided it when the optimizer was fed); a number by its value."""
    return isinstance(v, torch.Tensor) or v != 0


def _several(make: Any, k: int) -> tuple[torch.Tensor, ...]:
    return tuple(make() for _ in range(k))


def _powers(base: Any, steps: list[torch.Tensor]) -> list[torch.Tensor]:
    """``base ** step`` for each step tensor: a fed base (a 0-dim tensor, as the steps) through the list overload,
    a number as torch's capturable Adam takes it."""
    if isinstance(base, torch.Tensor):
        return list(torch._foreach_pow([base] * len(steps), steps))
    return list(torch._foreach_pow(base, steps))


class OwnStep(StepPart):
    """During graphjit's calls, ``opt.step`` is :func:`adam_step` / :func:`sgd_step` behind torch's step hooks."""

    __slots__ = ("amp", "entered", "opt", "saved", "step")

    _MISSING = object()  # the optimizer had no ``step`` of its own (an LR scheduler's wrapper is one)

    def __init__(self, opt: torch.optim.Optimizer) -> None:
        self.opt = opt
        fn = adam_step if isinstance(opt, (torch.optim.Adam, torch.optim.AdamW)) else sgd_step

        @functools.wraps(fn)
        def step(self_: torch.optim.Optimizer, closure: Any = None) -> Any:
            """torch's ``Optimizer.step`` contract around ``fn``: the closure's loss, the scheduler's mark."""
            self_._opt_called = True  # type: ignore[attr-defined]  # as an LR scheduler's wrapper marks it
            loss = None
            if closure is not None:
                with torch.enable_grad():
                    loss = closure()
            _refuse_scaler_arguments(self_)
            fn(self_)
            return loss

        self.step = types.MethodType(torch.optim.Optimizer.profile_hook_step(step), opt)
        self.saved: Any = OwnStep._MISSING
        self.amp: Any = OwnStep._MISSING
        self.entered = False

    def enter(self) -> None:
        opt = self.opt
        self.saved = opt.__dict__.get("step", OwnStep._MISSING)
        self.amp = opt.__dict__.get("_step_supports_amp_scaling", OwnStep._MISSING)
        opt.step = self.step  # type: ignore[method-assign]
        opt._step_supports_amp_scaling = False  # type: ignore[attr-defined]  # a GradScaler unscales first
        self.entered = True

    def exit(self) -> None:
        if not self.entered:  # made during the call it would leave (Hyper.learn)
            return
        self.entered = False
        opt = self.opt
        for name, saved in (("step", self.saved), ("_step_supports_amp_scaling", self.amp)):
            if saved is OwnStep._MISSING:
                opt.__dict__.pop(name, None)
            else:
                setattr(opt, name, saved)
        self.saved = self.amp = OwnStep._MISSING


class Hyper(StepPart):
    """Watches the optimizers of a step's context and feeds their moving hyperparameters (module docstring).

    ``add(part)``: where the context takes :class:`OwnStep` parts (entered after the others, left first)."""

    __slots__ = ("add", "feeds", "scaled", "seen", "watched")

    def __init__(self, feeds: Feeds, add: Any, scaled: bool) -> None:
        self.feeds = feeds
        self.add = add
        self.scaled = scaled
        self.watched: list[tuple[str, torch.optim.Optimizer]] = []
        self.seen: dict[int, tuple[Any, ...]] = {}

    def watch(self, where: str, opt: torch.optim.Optimizer) -> None:
        if _hyper_names(opt) and all(o is not opt for _w, o in self.watched):
            self.watched.append((where, opt))

    def captured(self) -> None:
        self.seen = {}

    def learn(self) -> bool:
        changed = False
        rest = []
        for where, opt in self.watched:
            now = _values(opt)
            before = self.seen.get(id(opt))
            self.seen[id(opt)] = now
            if before is None or before == now or len(before) != len(now) or not eligible(opt, self.scaled):
                rest.append((where, opt))
                continue
            moved = self._feed(opt, before, now)
            self.add(OwnStep(opt))
            changed = True
            log.info("graphjit: %s (%s) changes %s between calls: graphjit steps it with them fed from tensors, so "
                     "that a schedule costs no new capture", where, type(opt).__name__, " / ".join(moved))
        self.watched = rest
        return changed

    def _feed(self, opt: torch.optim.Optimizer, before: tuple[Any, ...], now: tuple[Any, ...]) -> list[str]:
        """Feed the lr of each group and the hyperparameters that moved (the others stay numbers, guarded); the
        names of those that moved."""
        fed = {(id(c), n) for c, n, _s in self.feeds.entries}
        names = _hyper_names(opt)
        all_moved: set[str] = set()
        for i, group in enumerate(opt.param_groups):
            first = group["params"][0]
            dtype = torch.float64 if first.dtype == torch.float64 else torch.float32  # as torch's own scalars
            make = functools.partial(torch.zeros, (), dtype=dtype, device=first.device)
            moved = [n for n, a, b in zip(names, before[i], now[i]) if a != b]
            all_moved.update(moved)
            for name in ("lr", *moved):
                value = group.get(name)
                if (id(group), name) in fed:
                    continue
                if value.__class__ in (int, float):
                    self.feeds.entries.append((group, name, slot(opt, i, name, make)))
                elif value.__class__ is tuple and all(v.__class__ in (int, float) for v in value):
                    pair = functools.partial(_several, make, len(value))
                    self.feeds.entries.append((group, name, slot(opt, i, name, pair)))
        return sorted(all_moved)
