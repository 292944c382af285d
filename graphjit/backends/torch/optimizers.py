"""torch optimizers in a graphed training step: made capturable or fused, and their learning rate fed from a tensor.

:func:`prepare` runs once per key, at its first call, over the objects the call reaches (arguments, closure,
globals, the bound object, and the attributes and items of plain holders of those), and returns the
:class:`~graphjit.feeds.StepContext` of the key's calls: a :class:`~.grads.CallMark`, :class:`Adopt`, the
:class:`~graphjit.feeds.Feeds` of the learning rates and the :class:`~.grads.OwnedGrads` of the gradients.

* **Prepared once seen stepping.** After a call that ran the function eagerly (the key's first), each optimizer
  that stepped in it and whose parameters sit on CUDA is prepared; one the function reaches but never steps is
  left as it is.  With a ``capturable`` flag that is off (Adam and AdamW as constructed by default), it is made
  capturable and its step counts moved to the parameters' device, as Dynamo does when it compiles
  ``opt.step()`` (torch refuses to capture the default step: its counts live on the CPU).  torch's default SGD
  (``foreach``: it adds its lr as a Python number, which a graph would bake) is made fused, unless a gradient is
  sparse.  Results agree with the default algorithms to float rounding.  The key then watches one more warmup
  call before its capture where needed, so the capture knows the moved state.
* **Fed learning rate.** A float ``lr`` of a group of Adam or AdamW (capturable or fused) or of a fused SGD is
  fed through :mod:`graphjit.feeds`: a schedule that changes it every step costs no new capture.  Not where the
  call reaches the optimizer's scheduler (it may step it inside: the number is the scheduler's to set).  Betas,
  momentum and weight decay that move between calls are fed too, the optimizer then stepped by graphjit
  (:mod:`.hyper`); the hyperparameters of other optimizers stay guarded: a new value gets its own graph, a value
  that changes every call runs uncaptured and says what to change.
* **Gradients.** :mod:`.grads` keeps the gradient buffers, so ``zero_grad()`` with ``set_to_none=True`` graphs.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import torch

from ...feeds import Feeds, StepContext, StepPart, slot
from ...reach import instances
from .grads import CallMark, GradLayout, OwnedGrads
from .hyper import Hyper

log = logging.getLogger("graphjit")

_FEEDS_LR = (torch.optim.Adam, torch.optim.AdamW)


def optimizers(roots: list[tuple[str, Any]]) -> list[tuple[str, torch.optim.Optimizer]]:
    """The optimizers among ``roots`` and, up to two levels down, in their lists, dicts and plain objects'
    attributes (a trainer object holding ``.optimizer``), each once, named by where it was found."""
    return _instances(roots, (torch.optim.Optimizer,))


_SCHEDULERS = (torch.optim.lr_scheduler.LRScheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)


def _scheduled(roots: list[tuple[str, Any]]) -> set[int]:
    """``id()`` of the optimizers whose learning-rate scheduler the call reaches (it may step it inside: then the
    number is its own to set, and is not fed)."""
    return {id(s.optimizer) for _w, s in _instances(roots, _SCHEDULERS) if getattr(s, "optimizer", None) is not None}


_OPAQUE = (torch.Tensor, torch.nn.Module, torch.optim.Optimizer)


def _instances(roots: list[tuple[str, Any]], kinds: tuple[type, ...]) -> list[tuple[str, Any]]:
    return instances(roots, kinds, _OPAQUE)


def fused_parameters(roots: list[tuple[str, Any]]) -> frozenset[int]:
    """``id()`` of the parameters of the fused groups of the optimizers ``roots`` reach: torch's fused kernels
    (``_fused_adamw_``, ``_fused_sgd_``) write parameters and state without moving their version counters."""
    out: set[int] = set()
    for _where, opt in optimizers(roots):
        for group in opt.param_groups:
            if group.get("fused"):
                out.update(id(p) for p in group.get("params", ()))
    return frozenset(out)


def _on_cuda(opt: torch.optim.Optimizer, group: dict[str, Any]) -> bool:
    params = group.get("params", [])
    return bool(params) and all(isinstance(p, torch.Tensor) and p.is_cuda for p in params)


def make_capturable(opt: torch.optim.Optimizer) -> bool:
    """Turn the groups of ``opt`` capturable where it has the flag, it is off and the group's parameters are on
    CUDA (fused groups too: torch refuses to capture their step otherwise); move the step counts already made to
    the parameters' device.  True if it changed."""
    if "capturable" not in opt.defaults:
        return False
    changed = False
    for group in opt.param_groups:
        if group.get("capturable") or group.get("differentiable") or not _on_cuda(opt, group):
            continue
        group["capturable"] = True
        changed = True
        for p in group["params"]:
            state = opt.state.get(p)
            if not state:
                continue
            for k, v in list(state.items()):
                if k == "step" and isinstance(v, torch.Tensor) and v.device != p.device:
                    state[k] = v.to(p.device)
    if changed:
        opt.defaults["capturable"] = True  # groups added later (add_param_group) take it too
    return changed


def make_fused_sgd(opt: torch.optim.Optimizer) -> bool:
    """Turn the groups of an ``SGD`` fused where they are not, their parameters floating point on CUDA (torch's
    default foreach SGD adds its lr as a Python number, which a graph bakes; the fused kernel reads a tensor lr and
    a GradScaler's found_inf on the GPU).  True if it changed."""
    if not isinstance(opt, torch.optim.SGD):
        return False
    changed = False
    for group in opt.param_groups:
        if group.get("fused") or group.get("differentiable") or not _on_cuda(opt, group):
            continue
        if not all(torch.is_floating_point(p) for p in group["params"]):
            continue
        group["fused"], group["foreach"] = True, False
        changed = True
    if changed:
        opt._step_supports_amp_scaling = True  # type: ignore[attr-defined]  # as SGD(fused=True) sets it
        opt._graphjit_made_fused = True  # type: ignore[attr-defined]  # its user's algorithm is foreach (hyper.py)
        # SGD checks its parameters' device and dtype on its first fused step and then flips this flag; done here
        # (every parameter was checked above) so that no step writes it, which a graphed call could not replay.
        opt._need_device_dtype_check_for_fused = False  # type: ignore[attr-defined]
    return changed


def _feeds_lr(group: dict[str, Any], opt: torch.optim.Optimizer) -> bool:
    if isinstance(opt, _FEEDS_LR):
        return bool(group.get("capturable") or group.get("fused"))
    if isinstance(opt, torch.optim.SGD):
        return bool(group.get("fused"))
    return False


def _device_of(group: dict[str, Any]) -> torch.device:
    return group["params"][0].device


def _fill(t: torch.Tensor, value: float) -> None:
    t.fill_(value)


def _reached(roots: list[tuple[str, Any]], opts: list[tuple[str, torch.optim.Optimizer]]) -> list[torch.Tensor]:
    """The parameters of the optimizers and of the modules among ``roots``, each once (those that do not require
    grad included)."""
    seen: dict[int, torch.Tensor] = {}
    for _where, opt in opts:
        for group in opt.param_groups:
            for p in group.get("params", ()):
                seen.setdefault(id(p), p)
    for _name, value in roots:
        if isinstance(value, torch.nn.Module):
            for p in value.parameters():
                seen.setdefault(id(p), p)
    return [p for p in seen.values() if isinstance(p, torch.Tensor)]


def _feed(opt: torch.optim.Optimizer, feeds: Feeds) -> None:
    """Add the groups of ``opt`` whose float lr it reads from a tensor when given one to ``feeds`` (once each)."""
    fed = {id(c) for c, _n, _s in feeds.entries}
    for i, group in enumerate(opt.param_groups):
        if group.get("lr").__class__ not in (int, float) or not _feeds_lr(group, opt) or id(group) in fed:
            continue
        make = functools.partial(torch.zeros, (), dtype=torch.float32, device=_device_of(group))
        feeds.entries.append((group, "lr", slot(opt, i, "lr", make)))


class Adopt(StepPart):
    """The part of a step's context that prepares its optimizers once a call showed they step in it: made fused
    (SGD) or capturable (Adam, AdamW, ...), their float lr fed (see the module docstring).  An optimizer the
    function reaches but never steps (an evaluation function holding a trainer) is left as it is."""

    __slots__ = ("candidates", "feeds", "mark", "scheduled")

    def __init__(self, candidates: list[tuple[str, torch.optim.Optimizer]], feeds: Feeds, mark: CallMark,
                 scheduled: set[int]) -> None:
        self.candidates = list(candidates)
        self.feeds = feeds
        self.mark = mark
        self.scheduled = scheduled  # ids of optimizers whose scheduler the function reaches: their lr is not fed

    def captured(self) -> None:
        self.candidates = []

    def learn(self) -> bool:
        """Prepare the candidates that stepped in this call; True if one changed (its state moved: the key needs
        another watched warmup call before its capture)."""
        stepped = self.mark.stepped
        changed = False
        rest = []
        for where, opt in self.candidates:
            if id(opt) not in stepped:
                rest.append((where, opt))
                continue
            sparse = any(p.grad is not None and p.grad.is_sparse for g in opt.param_groups for p in g["params"])
            if not sparse and make_fused_sgd(opt):
                changed = True
                log.info("graphjit: %s (SGD) is made fused (fused=True), so that its learning rate can be fed from "
                         "a tensor and a schedule costs no new capture: pass fused=True yourself to keep it so", where)
            if make_capturable(opt):
                changed = True
                log.info("graphjit: %s (%s) is made capturable (capturable=True, its step counts on %s), as "
                         "torch.compile does, so that its step can be graphed: pass capturable=True yourself to keep "
                         "it so", where, type(opt).__name__, _device_of(opt.param_groups[0]))
            if id(opt) not in self.scheduled:
                _feed(opt, self.feeds)
        self.candidates = rest
        return changed


def prepare(roots: list[tuple[str, Any]]) -> StepContext | None:
    """The context of a key's calls when the call reaches optimizers (see the module docstring): a call mark, the
    optimizers' preparation once a call shows they step, the fed learning rates, the gradient buffers.  Without an
    optimizer, where the first call runs with grad enabled and reaches Modules with parameters that require grad (a
    forward and backward graphed apart from an eager optimizer step: gradient accumulation), the call mark and the
    gradient buffers alone (a backward into a gradient ``zero_grad()`` set to None is written in the buffer, which is
    the parameter's gradient again); else None."""
    opts = optimizers(roots)
    reached = _reached(roots, opts)
    if not opts and not (torch.is_grad_enabled() and any(p.requires_grad for p in reached)):
        return None
    mark = CallMark()
    feeds = Feeds([], _fill)
    scheduled = _scheduled(roots)
    for _where, opt in opts:  # an optimizer already capturable or fused: its lr is fed from the first call
        if id(opt) not in scheduled:
            _feed(opt, feeds)
    parts: list[StepPart] = [mark, Adopt(opts, feeds, mark, scheduled), feeds]
    hyper = Hyper(feeds, parts.append, bool(_instances(roots, (torch.amp.GradScaler,))))
    for where, opt in opts:
        if id(opt) not in scheduled:
            hyper.watch(where, opt)
    parts.append(hyper)
    params = [p for p in reached if p.requires_grad]
    owned = OwnedGrads(params) if params else None
    if owned is not None:
        parts.append(owned)
    parts.append(GradLayout(reached, mark, owned))
    return StepContext(parts)
