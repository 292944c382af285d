"""Paddle optimizers in a graphed training step: their learning rate fed from the tensor they already read.

A Paddle optimizer's kernels read the learning rate from a device tensor it keeps (``_global_learning_rate()``),
but its ``step()`` refills that tensor on every call with the scheduler's number, a fill kernel whose value a CUDA
graph would bake.  :func:`prepare` runs once per key, at its first call, over the objects the call reaches, and
returns the :class:`~graphjit.feeds.StepContext` of the key's calls with one :class:`FeedsRate` per optimizer
whose learning rate is a ``paddle.optimizer.lr`` scheduler.

* **Fed learning rate.** Before each call (warmup, capture, verify and replay alike) the tensor is filled with
  the number the optimizer would use (``get_lr()``), when it changed; during the call the optimizer's own refill
  is skipped and ``optimizer._learning_rate`` is a stand-in (:class:`FedRate`) that reads as the scheduler.
  So a schedule stepped outside the call costs no new capture, and a graph's guards see the same stand-in on
  every call.  After the call the user's scheduler or number is back.
* **Not fed** where the call reaches the scheduler itself (it may step it inside: the number is its own to set,
  and the guards of :mod:`graphjit.guards` check it), or where the learning rate is a number (``set_lr``: the
  guards see a new number as a new value).
* Other hyperparameters (momentum, betas, weight decay) are Python numbers Paddle's kernels take as attributes:
  guarded.  Paddle's Adam and AdamW keep their beta powers on the CPU, which a replay would not update: such a
  step runs uncaptured with the reason "writes a tensor on another device" (:mod:`graphjit.warmup`).
"""

from __future__ import annotations

from typing import Any

import paddle
from paddle.base.layer_helper import LayerHelper
from paddle.optimizer.lr import LRScheduler

from ...errors import GraphjitError
from ...feeds import Slot, StepContext, StepPart, slot
from ...reach import instances

_OPAQUE = (paddle.Tensor, paddle.nn.Layer, paddle.optimizer.Optimizer, LRScheduler)


def optimizers(roots: list[tuple[str, Any]]) -> list[tuple[str, paddle.optimizer.Optimizer]]:
    """The Paddle optimizers among ``roots`` and two levels into their holders, each once, named by where found."""
    return instances(roots, (paddle.optimizer.Optimizer,), _OPAQUE)


def _schedulers(roots: list[tuple[str, Any]]) -> set[int]:
    """``id()`` of the schedulers the call reaches other than through an optimizer (it may step them)."""
    return {id(s) for _w, s in instances(roots, (LRScheduler,), _OPAQUE)}


class FedRate(LRScheduler):
    """Stands for an optimizer's scheduler while graphjit runs a call: ``get_lr()``, calling it and ``last_lr``
    give the number the optimizer's learning-rate tensor was filled with for this call (as the scheduler would);
    ``state_dict()`` is the scheduler's; stepping it is refused (step the scheduler itself, outside the call).
    Code of the call that reads the number makes it a guarded value of the call: a schedule that changes it then
    runs uncaptured, right."""

    def __init__(self, real: LRScheduler) -> None:  # no LRScheduler.__init__: it would step
        self.real = real
        self.base_lr = real.base_lr
        self.last_lr = float(real())
        self.last_epoch = real.last_epoch
        self.verbose = False
        self._var_name = getattr(real, "_var_name", None)

    def __call__(self) -> float:
        return self.last_lr

    def get_lr(self) -> float:
        return self.last_lr

    def state_dict(self) -> Any:
        return self.real.state_dict()

    def step(self, epoch: Any = None) -> None:
        raise GraphjitError("graphjit: the learning rate of an optimizer is fed from a tensor during a graphed call; "
                            "step your scheduler object, outside the graphed function")


def _skip_refill() -> None:
    """Stands for ``Optimizer._create_global_learning_rate`` during a call: the tensor exists and is filled."""


class FeedsRate(StepPart):
    """The fed learning rate of one optimizer (see the module docstring)."""

    __slots__ = ("filled", "opt", "saved", "stand_in")

    def __init__(self, opt: paddle.optimizer.Optimizer) -> None:
        self.opt = opt
        self.stand_in: FedRate | None = None
        self.filled: Slot = slot(opt, 0, "learning_rate", lambda: None)  # its number, shared by every key
        self.saved: Any = None

    def enter(self) -> None:
        opt = self.opt
        rate = opt._learning_rate
        self.saved = None
        if not isinstance(rate, LRScheduler) or isinstance(rate, FedRate):
            return  # a nested call, or no scheduler (any more): left as it is
        value = float(rate())
        tensor = opt._global_learning_rate()
        if tensor is None:  # made and filled once, eagerly, before any capture, as step() would make it
            if getattr(opt, "helper", None) is None:
                opt.helper = LayerHelper(type(opt).__name__)
            opt._create_global_learning_rate()
            tensor = opt._global_learning_rate()
            self.filled.last = value
        if tensor is None:
            return
        if self.stand_in is None or self.stand_in.real is not rate:
            self.stand_in = FedRate(rate)
        self.stand_in.last_lr, self.stand_in.last_epoch = value, rate.last_epoch
        if value != self.filled.last:
            tensor.fill_(value)
            self.filled.last = value
        self.saved = rate
        opt._learning_rate = self.stand_in
        opt._create_global_learning_rate = _skip_refill

    def exit(self) -> None:
        if self.saved is None:
            return
        opt = self.opt
        if opt._learning_rate is self.stand_in:
            opt._learning_rate = self.saved
        opt.__dict__.pop("_create_global_learning_rate", None)
        self.saved = None


def prepare(roots: list[tuple[str, Any]]) -> StepContext | None:
    """The context of a key's calls when the call reaches Paddle optimizers whose learning rate can be fed; None
    when there is none."""
    reached = _schedulers(roots)
    parts: list[StepPart] = []
    for _where, opt in optimizers(roots):
        rate = getattr(opt, "_learning_rate", None)
        if id(rate) in reached or not isinstance(rate, LRScheduler):
            continue  # a float rate: Paddle never refills it in step(); a new number (set_lr) is a new value
        parts.append(FeedsRate(opt))
    return StepContext(parts) if parts else None
