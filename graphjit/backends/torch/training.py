"""torch glue of :func:`graphjit.graphed_layer`: the ``nn.Module`` wrapper and the autograd Function.

The state machine (keys, slots, FIFO queue, capture and verify) is framework-neutral and lives in
:mod:`graphjit.training`; this module gives it torch's autograd:

* the backward graph is ``torch.autograd.grad(outputs, inputs + parameters, grad_outputs)`` captured
  right after the forward graph, on the backend's side stream, into the slot's pool (never
  ``.backward()``: ``AccumulateGrad`` must not run inside a capture);
* the layer's trainable parameters are inputs of :class:`_GraphedStep`, so torch's own
  ``AccumulateGrad`` stores their gradients (and runs their hooks) exactly as in eager mode.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ...training.core import GraphedLayerCore
from ...training.glue import Glue
from ...training.slots import MicroBatch
from ...training.wrapper import GraphedLayerMixin
from .. import get

_MAX_NODES = 200_000  # bound on the autograd-graph walk of stray_leaves


class _GraphedStep(torch.autograd.Function):
    """One graphed micro-batch: forward replays the slot's forward graph, backward its backward graph."""

    @staticmethod
    def forward(ctx: Any, core: GraphedLayerCore, mb: MicroBatch, *tensors: Any) -> tuple[Any, ...]:  # type: ignore[override]
        return core.forward_step(ctx, mb, tensors)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, *grads: Any) -> tuple[Any, ...]:  # type: ignore[override]
        core, mb = ctx.graphjit
        return (None, None, *core.backward_replay(mb, grads))


try:
    torch.is_autocast_enabled("cuda")
    _AUTOCAST_TAKES_DEVICE = True
except TypeError:  # torch < 2.4
    _AUTOCAST_TAKES_DEVICE = False


def _autocast_key() -> tuple[Any, ...]:
    """Autocast state of CUDA (part of the key: the captured kernels depend on it)."""
    if _AUTOCAST_TAKES_DEVICE:
        if torch.is_autocast_enabled("cuda"):
            return ("autocast", torch.get_autocast_dtype("cuda"))
        return ()
    if torch.is_autocast_enabled():
        return ("autocast", torch.get_autocast_gpu_dtype())
    return ()


_top_hooks = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)  # torch >= 2.1

CHECKPOINTING = "inside activation checkpointing (torch.utils.checkpoint, use_reentrant=False)"


def saved_tensors_hooks_reason() -> str | None:
    """Why a call cannot replay graphs under the saved-tensors hooks active now, or None where there are none.

    Non-reentrant ``torch.utils.checkpoint`` (Hugging Face's gradient checkpointing default) runs the forward under
    hooks that count the tensors autograd saves, and recomputes it in the backward under hooks that expect the same
    count: a graph replay saves none, and the backward it replays reads the activations the graph kept, which is what
    checkpointing is there to free.  Other hooks (``torch.autograd.graph.save_on_cpu``, a user's own) would not see
    the graph's activations either.  So a call under any of them runs eagerly: ``CHECKPOINTING`` for
    checkpointing's, one naming the hook's function otherwise.  Where torch cannot say which hooks are active
    (before 2.1) this answers None."""
    if _top_hooks is None:
        return None
    try:
        hooks = _top_hooks(False)
    except Exception:  # another signature: cannot tell
        return None
    if hooks is None:
        return None
    pack = hooks[0]
    module = getattr(pack, "__module__", None) or "?"
    name = getattr(pack, "__qualname__", None) or type(pack).__name__
    if module == "torch.utils.checkpoint" or "_checkpoint_hook" in name or "_recomputation_hook" in name:
        return CHECKPOINTING
    where = name.split(".<locals>")[0]
    return f"inside saved-tensors hooks ({module}.{where}: torch.autograd.graph.saved_tensors_hooks)"


class TorchGlue(Glue):
    def __init__(self, layer: torch.nn.Module) -> None:
        self.backend = get("torch")
        self.layer = layer
        self._aliases: dict[str, Any] | None = None

    def call_layer(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return self.layer(*args, **kwargs)

    def run_layer(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        with torch.enable_grad():
            if self._aliases is not None:
                return torch.func.functional_call(self.layer, self._aliases, args, kwargs)
            return self.layer(*args, **kwargs)

    def begin_capture_params(self, params: list[Any]) -> list[Any]:
        """Fresh leaf aliases of the trainable parameters (same storage), used while recording.

        A parameter's AccumulateGrad node remembers the stream it was created on; eager steps before
        the recording (and a previous step's loss, still referenced by the training loop) keep that
        node alive on the default stream, and a backward captured on the side stream that reaches it
        has to synchronise with the default stream, which invalidates the capture (seen with torch
        2.11 on the H200).  Aliases get their nodes on the capture stream; they share the parameters'
        storage, so the graphs read the values the optimizer writes.
        """
        named = [(n, p) for n, p in self.layer.named_parameters() if p.requires_grad]
        if [p for _, p in named] != list(params):  # pragma: no cover - defensive: orders must agree
            return params
        self._aliases = {n: p.detach().requires_grad_(True) for n, p in named}
        return list(self._aliases.values())

    def end_capture_params(self) -> None:
        self._aliases = None

    def mode_key(self) -> tuple[Any, ...]:
        return (bool(self.layer.training), *_autocast_key())

    def trainable_params(self) -> list[Any]:
        return [p for p in self.layer.parameters() if p.requires_grad]

    def static_input(self, t: Any) -> Any:
        s = t.detach().clone()
        if t.requires_grad:
            s.requires_grad_(True)
        return s

    def grad(self, outputs: Sequence[Any], targets: Sequence[Any], grad_outputs: Sequence[Any]) -> list[Any]:
        if not targets:
            return []
        return list(torch.autograd.grad(tuple(outputs), tuple(targets), grad_outputs=tuple(grad_outputs),
                                        allow_unused=True))

    def apply(self, core: GraphedLayerCore, mb: MicroBatch, tensors: Sequence[Any]) -> tuple[Any, ...]:
        return _GraphedStep.apply(core, mb, *tensors)  # type: ignore[no-any-return]

    def detach(self, t: Any) -> Any:
        return t.detach()

    def may_keep_grad(self, p: Any) -> bool:
        # AccumulateGrad keeps (steals) the incoming tensor only when .grad is None; otherwise it adds
        # it into .grad in place, so the graph's buffer can be handed over without a copy.
        return p.grad is None

    def copy_input_grad(self, t: Any) -> bool:
        # A leaf's gradient may become its .grad (stolen by AccumulateGrad); a non-leaf's flows on to
        # its grad_fn (retain_grad() stores a clone), so the graph's buffer is handed over as is.
        return bool(t.is_leaf)

    def snapshot(self) -> Any:
        with torch.no_grad():
            buffers = [(b, b.detach().clone()) for b in self.layer.buffers()]
        cpu_rng = torch.get_rng_state()
        cuda_rng = None
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            cuda_rng = (torch.cuda.current_device(), torch.cuda.get_rng_state())
        return buffers, cpu_rng, cuda_rng

    def restore(self, snap: Any) -> None:
        buffers, cpu_rng, cuda_rng = snap
        with torch.no_grad():
            for b, saved in buffers:
                b.copy_(saved)
        torch.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state(cuda_rng[1], cuda_rng[0])

    def stray_leaves(self, outputs: Sequence[Any], targets: Sequence[Any]) -> list[str]:
        wanted = {id(t) for t in targets}
        seen: set[int] = set()
        keep: list[Any] = []  # holds the nodes visited, so that their ids stay unique during the walk
        stack = [o.grad_fn for o in outputs if o.grad_fn is not None]
        stray: list[str] = []
        while stack and len(seen) < _MAX_NODES:
            fn = stack.pop()
            if fn is None or id(fn) in seen:
                continue
            seen.add(id(fn))
            keep.append(fn)
            variable = getattr(fn, "variable", None)
            if variable is not None:  # an AccumulateGrad node: a leaf that requires grad
                if id(variable) not in wanted:
                    stray.append(f"a {tuple(variable.shape)} {str(variable.dtype).replace('torch.', '')} tensor")
                continue
            for nxt, _ in fn.next_functions:
                if nxt is not None:
                    stack.append(nxt)
        return stray

    def hooks(self) -> list[str]:
        found = []
        for name, m in self.layer.named_modules():
            if any(getattr(m, attr, None) for attr in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks",
                                                         "_backward_pre_hooks")):
                found.append(name or type(m).__name__)
        return found

    def eager_reason(self) -> str | None:
        return saved_tensors_hooks_reason()

    def default_device(self) -> str | None:
        for p in self.layer.parameters():
            return self.backend.device_str(p)
        return None


class GraphedModule(GraphedLayerMixin, torch.nn.Module):
    """The ``torch.nn.Module`` :func:`graphjit.graphed_layer` returns: calls like the wrapped module
    (``self.layer``), whose parameters, buffers and train/eval mode it shares.  Methods: ``stats()``,
    ``report()``, ``reset()`` (:class:`graphjit.training.GraphedLayerMixin`); ``.to()``/``.cuda()``/
    ``.half()`` drop the graphs; ``copy.deepcopy`` graphs the copied module anew."""

    def __init__(self, layer: torch.nn.Module, options: dict[str, Any]) -> None:
        super().__init__()
        self.layer = layer
        self._attach_core(TorchGlue(layer), options)
