"""Gradient buffers a graphed training step keeps, so that ``zero_grad()`` with its default graphs.

``zero_grad()`` with ``set_to_none=True`` (inside the step, or before the call) makes every backward create new
gradient tensors, which a replay cannot do.  Once a call that ran the Python function made a parameter's
gradient, that tensor is the parameter's buffer, one per parameter for the whole process (every key and every
graphed function shares it: no rebinding between keys, one copy of gradient memory).  While graphjit runs a
call (on that thread):

* a parameter of the key whose ``.grad`` is None gets its buffer back, zeroed (the user zeroed it before the
  call); one whose ``.grad`` is another tensor gets the buffer holding that tensor's values;
* ``Optimizer.zero_grad()`` and ``Module.zero_grad()`` zero the buffers in place instead of setting them to
  None (as PyTorch's whole-network capture recipe and NeMo do), and behave as torch's for other parameters;
* before an optimizer steps, a buffer zeroed in this call that the backward did not write (a parameter a branch
  left unused) is set back to None, so the optimizer skips it as it skips it eagerly;
* after the call, a buffer the function's own ``zero_grad()`` zeroed that nothing wrote since (``zero_grad()`` at the
  end of the step) is set back to None, as eagerly; after a replay, each parameter the captured call left so.

Before each replay, :class:`GradLayout` checks what the graph assumed of the parameters the step reaches: which
require grad, and the gradient tensors it reads without owning them; a difference runs the call uncaptured.

The values are eager's: a backward into zeros is the fresh gradient, into the buffer left as it was is eager's
accumulation.  Outside graphjit's calls ``zero_grad()`` is torch's.  The wrappers and the step hook are
installed once, at the first training step graphjit prepares, and step aside when no call is running.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Iterable
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from ... import scope
from ...feeds import StepPart

_BUFFERS: dict[int, tuple[weakref.ref[torch.Tensor], torch.Tensor]] = {}  # id(param) -> (param, its buffer)
log = logging.getLogger("graphjit")


def buffer_of(p: torch.Tensor) -> torch.Tensor | None:
    """The gradient buffer graphjit keeps for parameter ``p`` (None if it keeps none)."""
    rec = _BUFFERS.get(id(p))
    return rec[1] if rec is not None and rec[0]() is p else None


def _keep(p: torch.Tensor, buf: torch.Tensor) -> None:
    key = id(p)

    def gone(_ref: Any) -> None:
        _BUFFERS.pop(key, None)

    _BUFFERS[key] = (weakref.ref(p, gone), buf)
class _Local(threading.local):
    """depth: graphjit calls running on this thread; zeroed: id(param) -> (p, buf, version, whether the function's own
    zero_grad() zeroed it, rather than graphjit at the call's start); stepped.  The class's values are what a thread
    reads before it sets its own (no AttributeError raised and caught on every read)."""

    depth = 0
    zeroed: dict[int, tuple[torch.Tensor, torch.Tensor, int, bool, int]] | None = None
    stepped: set[int] | None = None


_LOCAL = _Local()
_INSTALL_LOCK = threading.Lock()
_installed = False


def _depth() -> int:
    return _LOCAL.depth


def _zeroed() -> dict[int, tuple[torch.Tensor, torch.Tensor, int, bool, int]]:
    z = _LOCAL.zeroed
    if z is None:
        z = _LOCAL.zeroed = {}
    return z


def _zero_in_place(params: Iterable[torch.Tensor]) -> bool:
    """``zero_grad(set_to_none=True)`` of ``params`` with their buffers zeroed in place; False (nothing done, the
    original ``zero_grad`` runs) when no graphjit call runs on this thread or none of ``params`` has a buffer."""
    if not _depth():
        return False
    zero = []
    rest = []
    for p in params:
        g = p.grad
        if g is None:
            continue
        if g.is_sparse or buffer_of(p) is not g:
            rest.append(p)
        else:
            zero.append((p, g))
    if not zero:
        return False
    for p in rest:
        p.grad = None
    for _p, g in zero:
        if g.grad_fn is not None:
            g.detach_()
        else:
            g.requires_grad_(False)
    torch._foreach_zero_([g for _p, g in zero])
    zeroed = _zeroed()
    for p, g in zero:
        zeroed[id(p)] = (p, g, g._version, True, scope.run_id())
    return True


def _unwritten(p: torch.Tensor, rec: tuple[torch.Tensor, torch.Tensor, int, bool, int]) -> bool:
    """Whether ``p``'s gradient is still the buffer ``rec`` zeroed and nothing wrote it since."""
    return p.grad is rec[1] and rec[1]._version == rec[2]


def _left_zeroed(p: torch.Tensor, rec: tuple[torch.Tensor, torch.Tensor, int, bool, int] | None) -> bool:
    """Whether the function's own ``zero_grad()`` zeroed ``p``'s buffer in this call and nothing wrote it since: its
    gradient is None eagerly."""
    return rec is not None and rec[3] and _unwritten(p, rec)


def _before_step(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    """Optimizer step pre-hook, during graphjit's calls: note that ``opt`` stepped; a buffer zeroed in this call
    that no backward wrote goes back to None."""
    if not _depth():
        return
    stepped = _LOCAL.stepped
    if stepped is not None:
        stepped.add(id(opt))
    zeroed = _zeroed()
    if not zeroed:
        return
    for group in opt.param_groups:
        for p in group["params"]:
            rec = zeroed.get(id(p))
            # (a zero_grad() of another run of the function in this call, a capture's before verify's reference run,
            # is not this run's: that run's step reads the gradients it finds)
            if rec is not None and (not rec[3] or rec[4] == scope.run_id()) and _unwritten(p, rec):
                p.grad = None


def install() -> None:
    """Wrap ``Optimizer.zero_grad`` and ``Module.zero_grad`` (as they are now) and add the step hook, once."""
    global _installed
    with _INSTALL_LOCK:
        if _installed:
            return
        opt_zero = torch.optim.Optimizer.zero_grad
        mod_zero = torch.nn.Module.zero_grad

        def optimizer_zero_grad(self: torch.optim.Optimizer, set_to_none: bool = True) -> None:
            if not set_to_none or not _zero_in_place(p for g in self.param_groups for p in g["params"]):
                opt_zero(self, set_to_none)

        def module_zero_grad(self: torch.nn.Module, set_to_none: bool = True) -> None:
            if not set_to_none or not _zero_in_place(self.parameters()):
                mod_zero(self, set_to_none)

        optimizer_zero_grad.__wrapped__ = opt_zero  # type: ignore[attr-defined]
        module_zero_grad.__wrapped__ = mod_zero  # type: ignore[attr-defined]
        torch.optim.Optimizer.zero_grad = optimizer_zero_grad  # type: ignore[method-assign,assignment]
        torch.nn.Module.zero_grad = module_zero_grad  # type: ignore[method-assign,assignment]
        register_optimizer_step_pre_hook(_before_step)
        _installed = True


class CallMark(StepPart):
    """The first part of a torch step's context: marks a graphjit call running on this thread (what the
    ``zero_grad`` wrappers and the step hook act in), and records which optimizers step in it."""

    __slots__ = ("capturing", "cleared", "entered", "left", "stepped")

    def __init__(self) -> None:
        install()
        self.entered = False
        self.stepped: set[int] = set()
        self.left: list[torch.Tensor] = []  # the parameters the last call's own zero_grad() left without gradient
        self.cleared: list[torch.Tensor] = []  # those of the last call before the capture: None after each replay
        self.capturing = False

    def enter(self) -> None:
        depth = _depth()
        if depth == 0:
            _LOCAL.stepped = set()
        _LOCAL.depth = depth + 1
        self.entered = True

    def exit(self) -> None:
        if not self.entered:
            return
        self.entered = False
        if self.capturing:
            self.capturing = False
            self.replayed()
        depth = _LOCAL.depth = _depth() - 1
        if depth == 0:
            _LOCAL.stepped = None
            zeroed = _zeroed()
            # zero_grad() last: None, as eagerly (never after a replay: no Python ran, so no record is the function's)
            for rec in list(zeroed.values()):
                if _left_zeroed(rec[0], rec):
                    rec[0].grad = None
            zeroed.clear()

    def learn(self) -> bool:
        self.stepped = set(_LOCAL.stepped or ())
        zeroed = _zeroed()  # (a buffer set back to None before the step counts: a replay leaves it zeroed)
        self.left = [rec[0] for rec in zeroed.values() if rec[3] and (rec[0].grad is None or _unwritten(rec[0], rec))]
        return False

    def captured(self) -> None:
        """What the last call that ran the function before the capture left: its ``zero_grad()``'s zeroed buffers
        are None after each replay, and after the capturing call itself (whose own are not known here: verify wrote
        them again), once it ends."""
        self.cleared = self.left
        self.capturing = True

    def replayed(self) -> None:
        for p in self.cleared:
            p.grad = None


class OwnedGrads(StepPart):
    """The gradient buffers of the parameters one key's step trains (see the module docstring).

    Guarantees: around a call, each owned parameter's ``.grad`` is its buffer (zeroed where it was None, holding
    the values of another tensor the user put there); a parameter becomes owned when a call that ran the Python
    function before the key's capture made or replaced its gradient (a function that only reads gradients, or
    never runs backward, owns none and changes none); after a replay, a parameter the captured step left without
    a gradient has none, as eagerly."""

    __slots__ = ("learning", "pairs", "params", "seen", "unused")

    def __init__(self, params: list[torch.Tensor]) -> None:
        install()
        self.params = params
        self.pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.learning = True
        self.seen: list[Any] | None = None
        self.unused: list[torch.Tensor] = []  # owned, but without a gradient after the capture

    def enter(self) -> None:
        zero = []
        for p, buf in self.pairs:
            g = p.grad
            if g is buf:
                continue
            if g is None:
                zero.append((p, buf))
            else:
                buf.copy_(g)
            p.grad = buf
        if zero:
            torch._foreach_zero_([b for _p, b in zero])
            zeroed = _zeroed()
            for p, b in zero:
                zeroed[id(p)] = (p, b, b._version, False, 0)
        if self.learning:
            self.seen = [(g, g._version if g is not None else -1) for g in (p.grad for p in self.params)]

    def replayed(self) -> None:
        for p in self.unused:
            p.grad = None

    def learn(self) -> bool:
        """After a call that ran Python: own the gradients it made or replaced, and those it wrote in a buffer another
        key owns (a key first called after another key's calls: a backward into that buffer)."""
        seen, self.seen = self.seen, None
        if seen is None:
            return False
        owned = {id(p) for p, _b in self.pairs}
        for p, (before, version) in zip(self.params, seen):
            g = p.grad
            if g is None or id(p) in owned or g.is_sparse:
                continue
            if (g is not buffer_of(p) or g._version == version) and g is before:  # not made, replaced nor written
                continue
            buf = buffer_of(p)
            if buf is None:
                _keep(p, g)
                buf = g
            elif g is not buf:  # another key's buffer holds this parameter's gradient: keep one
                buf.copy_(g)
                p.grad = buf
            self.pairs.append((p, buf))
            owned.add(id(p))
        return False

    def captured(self) -> None:
        """The key is captured: its gradients are known (later calls replay, or run Python that owns no more)."""
        self.learning = False
        self.seen = None
        self.unused = [p for p, _b in self.pairs if p.grad is None]


class GradLayout(StepPart):
    """What a captured step's graph assumed of the parameters the step reaches, checked before each replay.

    A graph computes the gradients of the parameters that required grad when it was captured and reads gradient
    tensors at the addresses they had then.  So where the capture stepped an optimizer or owned gradients
    (:class:`OwnedGrads`), a replay is refused (:meth:`stale`, the call then runs uncaptured under the reason) when a
    parameter's ``requires_grad`` changed since (frozen or unfrozen: ``reset()`` captures the step again); and where
    the step owns no gradient (it steps without running the backward), when a gradient it reads is another tensor
    or None (``zero_grad()`` with its default ``set_to_none=True`` before each backward outside the function: each
    backward then makes new gradients).  A step that runs its backward needs no such check: :class:`OwnedGrads`
    puts its buffers back before each call."""

    __slots__ = ("expected", "mark", "owned", "params", "reads", "said")

    def __init__(self, params: list[torch.Tensor], mark: CallMark, owned: OwnedGrads | None) -> None:
        self.params = params
        self.mark = mark
        self.owned = owned
        self.expected: list[tuple[torch.Tensor, bool, torch.Tensor | None]] = []
        self.reads = False  # the step owns no gradient: the ones it reads must stay the tensors they were
        self.said = False  # the first refusal is logged at WARNING (the others are counted in stats())

    def captured(self) -> None:
        owned = {id(p) for p, _b in self.owned.pairs} if self.owned is not None else set()
        stepped = self.mark.stepped or _LOCAL.stepped
        if not stepped and not owned:  # no backward, no step (an evaluation function holding a trainer): no check
            self.expected = []
            return
        self.expected = [(p, p.requires_grad, p.grad) for p in self.params]
        self.reads = not owned

    def stale(self) -> str | None:
        for p, requires, grad in self.expected:
            if p.requires_grad is not requires:
                return self.say("a parameter's requires_grad changed since the capture (call reset() after freezing "
                                "or unfreezing parameters)", p)
            if self.reads and p.grad is not grad:
                return self.say("a gradient it reads is another tensor than at the capture (zero_grad() with "
                                "set_to_none=True before a backward outside the function: graph the backward with "
                                "the step, or call zero_grad(set_to_none=False))", p)
        return None

    def say(self, reason: str, p: torch.Tensor) -> str:
        """``reason``, logged at WARNING the first time (a parameter of shape ``p.shape``)."""
        if not self.said:
            self.said = True
            log.warning("graphjit: a graphed training step runs uncaptured: %s (a parameter of shape %s)", reason,
                        tuple(p.shape))
        return reason
