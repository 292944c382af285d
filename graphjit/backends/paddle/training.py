"""Paddle glue of :func:`graphjit.graphed_layer`: the ``paddle.nn.Layer`` wrapper and the PyLayer.

The state machine lives in :mod:`graphjit.training`; this module gives it Paddle's autograd.  The
backward graph is ``paddle.grad(outputs, inputs + parameters, grad_outputs)`` captured right after
the forward graph (never ``.backward()`` inside a capture, which would accumulate into ``.grad``
there); the layer's trainable parameters are inputs of :class:`_GraphedStep`, so Paddle's own
gradient accumulation stores their gradients as in eager mode.  Graphs are never destroyed (see
:class:`graphjit.backends.paddle.graphs.PaddleGraph`).

Unlike Paddle's ``CUDAGraphedLayer``, any number of outputs may carry gradients, and a forward issued
before earlier backwards gets its own graph pair.  Paddle's autograd engine re-raises an exception
from a PyLayer backward as an ``OSError`` whose message carries the original one (so a
``BackwardOrderError`` reaches the caller with its text, under that type).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import paddle

from ...training.core import GraphedLayerCore
from ...training.glue import Glue
from ...training.slots import MicroBatch
from ...training.wrapper import GraphedLayerMixin
from .. import get


class _GraphedStep(paddle.autograd.PyLayer):
    """One graphed micro-batch: forward replays the slot's forward graph, backward its backward graph."""

    @staticmethod
    def forward(ctx: Any, core: GraphedLayerCore, mb: MicroBatch, *tensors: Any) -> tuple[Any, ...]:  # type: ignore[override]
        return core.forward_step(ctx, mb, tensors)

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> tuple[Any, ...]:  # type: ignore[override]
        core, mb = ctx.graphjit
        with paddle.no_grad():
            return tuple(core.backward_replay(mb, grads))


def _amp_key() -> tuple[Any, ...]:
    with contextlib.suppress(Exception):
        tracer = paddle.base.framework._dygraph_tracer()
        level = str(tracer._amp_level)
        if not level.endswith("O0"):
            return ("amp", level, str(getattr(tracer, "_amp_dtype", "")))
    return ()


def _initialized(t: Any) -> bool:
    check = getattr(t, "_is_initialized", None)
    return bool(check()) if check is not None else True


class PaddleGlue(Glue):
    def __init__(self, layer: paddle.nn.Layer) -> None:
        self.backend = get("paddle")
        self.layer = layer

    def call_layer(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return self.layer(*args, **kwargs)

    def run_layer(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        with paddle.enable_grad():
            return self.layer(*args, **kwargs)

    def mode_key(self) -> tuple[Any, ...]:
        return (bool(self.layer.training), *_amp_key())

    def trainable_params(self) -> list[Any]:
        return [p for p in self.layer.parameters() if not p.stop_gradient]

    def static_input(self, t: Any) -> Any:
        with paddle.no_grad():
            s = self.backend.clone(t)
        s.stop_gradient = t.stop_gradient
        return s

    def grad(self, outputs: Sequence[Any], targets: Sequence[Any], grad_outputs: Sequence[Any]) -> list[Any]:
        if not targets:
            return []
        return list(paddle.grad(list(outputs), list(targets), grad_outputs=list(grad_outputs), retain_graph=False,
                                create_graph=False, allow_unused=True))

    def apply(self, core: GraphedLayerCore, mb: MicroBatch, tensors: Sequence[Any]) -> tuple[Any, ...]:
        out = _GraphedStep.apply(core, mb, *tensors)
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)

    def detach(self, t: Any) -> Any:
        return t.detach()

    def may_keep_grad(self, p: Any) -> bool:
        # Paddle keeps the incoming tensor as .grad when there is none, and also after
        # clear_gradients(set_to_zero=True) (the zeroed gradient is marked empty): always a copy.
        return True

    def copy_input_grad(self, t: Any) -> bool:
        return True  # Paddle may keep it (a leaf's .grad, a retained gradient): always a fresh tensor

    def snapshot(self) -> Any:
        # Running statistics are buffers or non-trainable parameters in Paddle (BatchNorm's mean/variance).
        state = list(self.layer.buffers()) + [p for p in self.layer.parameters() if p.stop_gradient]
        saved = [(t, self.backend.clone(t)) for t in state if t is not None and _initialized(t)]
        rng = None
        with contextlib.suppress(Exception):
            rng = paddle.get_rng_state()
        return saved, rng

    def restore(self, snap: Any) -> None:
        saved, rng = snap
        for t, value in saved:
            self.backend.copy_(t, value)
        if rng is not None:
            with contextlib.suppress(Exception):
                paddle.set_rng_state(rng)

    def default_device(self) -> str | None:
        for p in self.layer.parameters():
            return self.backend.device_str(p)
        return None


class GraphedPaddleLayer(GraphedLayerMixin, paddle.nn.Layer):
    """The ``paddle.nn.Layer`` :func:`graphjit.graphed_layer` returns: calls like the wrapped layer
    (``self.layer``), whose parameters and train/eval mode it shares.  Methods: ``stats()``,
    ``report()``, ``reset()`` (:class:`graphjit.training.GraphedLayerMixin`); ``.to()``, ``.astype()``,
    ``.float()``, ``.bfloat16()`` drop the graphs; ``copy.deepcopy`` graphs the copied layer anew."""

    def __init__(self, layer: paddle.nn.Layer, options: dict[str, Any]) -> None:
        super().__init__()
        self.layer = layer
        self._attach_core(PaddleGlue(layer), options)

    def astype(self, *args: Any, **kwargs: Any) -> Any:
        """Paddle's ``Layer.astype`` (it casts the parameters without going through ``_apply``), then every
        graph is dropped: the graphs captured the parameters by address."""
        out = super().astype(*args, **kwargs)
        self._graphjit_core.reset()
        return out
