"""What a graphed layer needs from its framework (:class:`Glue`, implemented in
``graphjit/backends/{torch,paddle}/training.py``)."""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..backends.base import Backend

if TYPE_CHECKING:
    from .core import GraphedLayerCore
    from .slots import MicroBatch

# -- the framework glue: implemented in backends/torch/training.py and backends/paddle/training.py ---
class Glue(abc.ABC):
    """What the state machine needs from a framework's autograd, for one wrapped layer."""

    backend: Backend
    layer: Any

    @abc.abstractmethod
    def call_layer(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Call the wrapped layer as the user would (grad mode as it is)."""

    @abc.abstractmethod
    def run_layer(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Call the wrapped layer with grad mode on (inside an autograd function or a capture)."""

    @abc.abstractmethod
    def mode_key(self) -> tuple[Any, ...]:
        """State outside the arguments that changes what the layer computes (train/eval, autocast)."""

    @abc.abstractmethod
    def trainable_params(self) -> list[Any]:
        """The layer's parameters that require grad, in a fixed order."""

    def begin_capture_params(self, params: list[Any]) -> list[Any]:
        """The tensors the recorded graphs differentiate with respect to, one per parameter, in
        ``params`` order; :meth:`run_layer` uses them until :meth:`end_capture_params`.  Default:
        the parameters themselves."""
        return params

    def end_capture_params(self) -> None:  # noqa: B027 - an optional hook; the default has nothing to undo
        """Back to the layer's own parameters."""

    @abc.abstractmethod
    def static_input(self, t: Any) -> Any:
        """A new leaf tensor with ``t``'s contents that requires grad exactly when ``t`` does."""

    @abc.abstractmethod
    def grad(self, outputs: Sequence[Any], targets: Sequence[Any], grad_outputs: Sequence[Any]) -> list[Any]:
        """Gradients of ``outputs`` (weighted by ``grad_outputs``) for ``targets``; None where unused.
        Never writes any ``.grad``."""

    @abc.abstractmethod
    def apply(self, core: GraphedLayerCore, mb: MicroBatch, tensors: Sequence[Any]) -> tuple[Any, ...]:
        """Run the autograd function of one graphed micro-batch (inputs, then parameters)."""

    @abc.abstractmethod
    def detach(self, t: Any) -> Any:
        """A tensor sharing ``t``'s memory, without autograd history."""

    @abc.abstractmethod
    def may_keep_grad(self, p: Any) -> bool:
        """True if the framework's accumulation may keep the gradient tensor handed to it as ``p.grad``
        (instead of adding it into an existing one): then it gets a fresh copy, never a graph buffer."""

    @abc.abstractmethod
    def copy_input_grad(self, t: Any) -> bool:
        """True if the gradient for input ``t`` must be a fresh tensor (it may be kept as a ``.grad``);
        False if it only flows on to the node that produced ``t`` within the backward pass."""

    @abc.abstractmethod
    def snapshot(self) -> Any:
        """Module state that a forward may change (buffers, RNG), to undo extra warmup passes."""

    @abc.abstractmethod
    def restore(self, snap: Any) -> None: ...

    def stray_leaves(self, outputs: Sequence[Any], targets: Sequence[Any]) -> list[str]:
        """Tensors that require grad, feed ``outputs``, and are not in ``targets`` (their gradient
        would be lost by the graphs); descriptions for the message.  Empty where unknown."""
        return []

    def hooks(self) -> list[str]:
        """Names of submodules with forward/backward hooks (they do not run on replays)."""
        return []

    def eager_reason(self) -> str | None:
        """Why the current call must run the layer eagerly, from the framework's state around it (a reason for
        stats, naming what the user did), or None.  Checked on every call before the key: a replay there would
        not act like the eager call.  Default: None."""
        return None

    def default_device(self) -> str | None:
        """The device of the layer's first parameter (for layers called without tensors)."""
        return None
