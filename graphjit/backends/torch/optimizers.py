"""torch optimizers in a graphed training step: made capturable, and their learning rate fed from a tensor.

:func:`prepare` runs once per key, before the key's first warmup call, over the objects the call reaches
(arguments, closure, globals, the bound object, and the attributes and items of plain holders of those).

* **Capturable.** An optimizer with a ``capturable`` flag (Adam, AdamW, Adamax, NAdam, RAdam, RMSprop, ASGD,
  Adadelta, ...) whose parameters all sit on CUDA and whose flag is off (as constructed by default) is turned
  capturable, its step counts moved to the parameters' device, as Dynamo does when it compiles ``opt.step()``.
  Without that its ``step()`` keeps its step counts on the CPU, which a CUDA graph cannot advance, and torch
  refuses the capture.  Results are those of the capturable algorithm: the same update, with its bias
  corrections computed on the GPU in the parameters' precision (within float rounding of the default path).
* **Gradients owned by the graph.** ``zero_grad()`` with its default ``set_to_none=True`` (inside the step, or
  before the call) makes every backward create new gradient tensors, which a graph cannot do again.  Once a
  key's first call has made a parameter's gradient, that tensor is the parameter's gradient buffer
  (:class:`OwnedGrads`): around each later call a parameter whose ``.grad`` was set to None gets the buffer back,
  zeroed, and ``zero_grad()`` called inside the step zeroes the buffers in place (as PyTorch's whole-network
  capture recipe and NeMo do).  The values are eager's: a backward into zeros is the fresh gradient, into the
  buffer left as it was is eager's accumulation; ``p.grad`` is the same tensor from call to call.
* **Fused SGD.** torch's default SGD (``foreach``) adds its lr as a Python number, which a graph would bake; an
  SGD whose parameters are floating point on CUDA is made fused (its kernel reads a tensor lr, and a GradScaler's
  found_inf on the GPU).  The update is the same, to float rounding.
* **Fed learning rate.** A float ``lr`` of a group of Adam or AdamW (capturable or fused) or of a fused SGD is
  fed through :mod:`graphjit.feeds`: a schedule that changes it every step costs no new capture.  Other
  hyperparameters (betas, momentum, weight decay) and the lr of other optimizers stay guarded: a new value gets
  its own graph, a value that changes every call runs uncaptured and says what to change.
"""

from __future__ import annotations

import functools
import logging
import types
from collections.abc import Iterator
from typing import Any

import torch

from ...feeds import Feeds, StepContext, slot

log = logging.getLogger("graphjit")

_FEEDS_LR = (torch.optim.Adam, torch.optim.AdamW)
_MAX_DEPTH = 2
_MAX_ITEMS = 64


def optimizers(roots: list[tuple[str, Any]]) -> list[tuple[str, torch.optim.Optimizer]]:
    """The optimizers among ``roots`` and, up to two levels down, in their lists, dicts and plain objects'
    attributes (a trainer object holding ``.optimizer``), each once, named by where it was found."""
    found: dict[int, tuple[str, torch.optim.Optimizer]] = {}
    for name, value in roots:
        for where, opt in _find(name, value, 0, set()):
            found.setdefault(id(opt), (where, opt))
    return list(found.values())


def _find(name: str, value: Any, depth: int, seen: set[int]) -> Iterator[tuple[str, torch.optim.Optimizer]]:
    if isinstance(value, torch.optim.Optimizer):
        yield name, value
        return
    if depth >= _MAX_DEPTH or id(value) in seen or isinstance(value, (torch.Tensor, torch.nn.Module, type,
                                                                      types.ModuleType, types.FunctionType)):
        return
    seen.add(id(value))
    if isinstance(value, (list, tuple)):
        items: list[tuple[str, Any]] = [(f"{name}[{i}]", v) for i, v in enumerate(value[:_MAX_ITEMS])]
    elif isinstance(value, dict):
        items = [(f"{name}[{k!r}]", v) for k, v in list(value.items())[:_MAX_ITEMS]]
    else:
        d = getattr(value, "__dict__", None)
        if not isinstance(d, dict):
            return
        items = [(f"{name}.{k}", v) for k, v in list(d.items())[:_MAX_ITEMS]]
    for where, v in items:
        yield from _find(where, v, depth + 1, seen)


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
        opt._need_device_dtype_check_for_fused = True  # type: ignore[attr-defined]
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


_OWNED: list[frozenset[int]] = []  # the owned parameters of the calls running now (innermost last)


def _owned_now() -> frozenset[int]:
    return _OWNED[-1] if _OWNED else frozenset()


def _zero_owned(params: Iterator[torch.Tensor] | list[torch.Tensor], owned: frozenset[int]) -> None:
    """``zero_grad(set_to_none=True)`` of ``params`` with the owned ones zeroed in place instead."""
    zero = []
    for p in params:
        g = p.grad
        if g is None:
            continue
        if id(p) not in owned or g.is_sparse:
            p.grad = None
            continue
        if g.grad_fn is not None:
            g.detach_()
        else:
            g.requires_grad_(False)
        zero.append(g)
    if zero:
        torch._foreach_zero_(zero)


_ORIGINAL: dict[str, Any] = {"optimizer": torch.optim.Optimizer.zero_grad, "module": torch.nn.Module.zero_grad}


def _optimizer_zero_grad(self: torch.optim.Optimizer, set_to_none: bool = True) -> None:
    owned = _owned_now()
    if not set_to_none or not owned:
        return _ORIGINAL["optimizer"](self, set_to_none)
    _zero_owned([p for g in self.param_groups for p in g["params"]], owned)
    return None


def _module_zero_grad(self: torch.nn.Module, set_to_none: bool = True) -> None:
    owned = _owned_now()
    if not set_to_none or not owned:
        return _ORIGINAL["module"](self, set_to_none)
    _zero_owned(self.parameters(), owned)
    return None


class OwnedGrads:
    """The gradient buffers of the parameters a key's step trains (see the module docstring).

    Guarantees: around a call, each owned parameter's ``.grad`` is its buffer: zeroed where it was None, holding
    the tensor's values where the user put another tensor there (the buffer is what the graph reads), unchanged
    where it is the buffer; ``zero_grad()`` of optimizers and modules zeroes owned buffers in place during the
    call and behaves as torch's for every other parameter.  A parameter becomes owned when a call that ran the
    Python function before the key's first capture made or replaced its gradient (a function that only reads
    gradients, or never runs backward, owns none, and changes none)."""

    __slots__ = ("ids", "learning", "pairs", "params", "seen")

    def __init__(self, params: list[torch.Tensor]) -> None:
        self.params = params
        self.pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.ids: frozenset[int] = frozenset()
        self.learning = True
        self.seen: list[Any] | None = None

    def enter(self) -> None:
        zero = []
        for p, buf in self.pairs:
            g = p.grad
            if g is buf:
                continue
            if g is None:
                zero.append(buf)
            else:
                buf.copy_(g)
            p.grad = buf
        if zero:
            torch._foreach_zero_(zero)
        if self.learning:
            self.seen = [p.grad for p in self.params]
        _OWNED.append(self.ids)
        torch.optim.Optimizer.zero_grad = _optimizer_zero_grad  # type: ignore[method-assign]
        torch.nn.Module.zero_grad = _module_zero_grad  # type: ignore[method-assign]

    def exit(self) -> None:
        _OWNED.pop()
        if not _OWNED:
            torch.optim.Optimizer.zero_grad = _ORIGINAL["optimizer"]  # type: ignore[method-assign,assignment]
            torch.nn.Module.zero_grad = _ORIGINAL["module"]  # type: ignore[method-assign,assignment]

    def learn(self) -> None:
        """After a call that ran Python: own the gradients it made or replaced."""
        seen, self.seen = self.seen, None
        if seen is None:
            return
        ids = set(self.ids)
        for p, before in zip(self.params, seen):
            g = p.grad
            if g is not None and g is not before and id(p) not in ids and not g.is_sparse:
                self.pairs.append((p, g))
                ids.add(id(p))
        self.ids = frozenset(ids)

    def captured(self) -> None:
        """The key is captured: its gradients are known (later calls replay, or run Python that owns no more)."""
        self.learning = False
        self.seen = None


def _trained(roots: list[tuple[str, Any]], opts: list[tuple[str, torch.optim.Optimizer]]) -> list[torch.Tensor]:
    """The parameters of the optimizers and of the modules among ``roots``, each once."""
    seen: dict[int, torch.Tensor] = {}
    for _where, opt in opts:
        for group in opt.param_groups:
            for p in group.get("params", ()):
                seen.setdefault(id(p), p)
    for _name, value in roots:
        if isinstance(value, torch.nn.Module):
            for p in value.parameters():
                seen.setdefault(id(p), p)
    return [p for p in seen.values() if isinstance(p, torch.Tensor) and p.requires_grad]


def prepare(roots: list[tuple[str, Any]]) -> tuple[list[str], StepContext | None]:
    """Make the optimizers ``roots`` reach capturable, own the gradients of the parameters they train, and feed
    their learning rates (see the module docstring).  Returns what it changed, one line each (logged once by the
    caller), and the context to put around the key's calls (None: nothing to do)."""
    notes: list[str] = []
    entries = []
    opts = optimizers(roots)
    for where, opt in opts:
        if make_fused_sgd(opt):
            notes.append(f"{where} (SGD) is made fused (fused=True), so that its learning rate can be fed from a "
                         "tensor and a schedule costs no new capture: pass fused=True yourself to keep it so")
        if make_capturable(opt):
            notes.append(f"{where} ({type(opt).__name__}) is made capturable (capturable=True, its step counts on "
                         f"{_device_of(opt.param_groups[0])}), as torch.compile does, so that its step can be graphed: "
                         "pass capturable=True yourself to keep it so")
        for i, group in enumerate(opt.param_groups):
            lr = group.get("lr")
            if lr.__class__ not in (int, float) or not _feeds_lr(group, opt):
                continue
            device = _device_of(group)
            s = slot(opt, i, "lr", functools.partial(torch.zeros, (), dtype=torch.float32, device=device))
            entries.append((group, "lr", s))
    parts: list[Any] = [Feeds(entries, _fill)] if entries else []
    params = _trained(roots, opts)
    if params and opts:
        parts.append(OwnedGrads(params))
    return notes, (StepContext(parts) if parts else None)
