"""``graphjit.graphed_layer``: forward and backward CUDA graphs for training a Layer or Module.

``graphed_layer(layer, warmup=3)`` returns a wrapper (a ``torch.nn.Module`` for a torch module, a
``paddle.nn.Layer`` for a Paddle layer) that calls like ``layer`` and, per input signature (shapes,
dtypes, devices, requires-grad flags and non-tensor values, as ``@graphed`` keys them; plus the
layer's train/eval mode and, for torch, the autocast state), goes through these states:

WARMUP
    The first ``warmup`` calls of a key run the layer eagerly (plain autograd, exactly eager).
CAPTURE (record)
    The next call records a *slot*: graphjit-owned static inputs, then ``2`` more eager forward and
    backward passes on a side stream (lazy initialisation of the backward kernels; module buffers
    such as running statistics and the RNG state are restored afterwards), then the forward graph and,
    right after it and into the same memory pool, the backward graph: ``autograd.grad`` of the
    outputs that require grad with respect to the inputs that require grad and the layer's trainable
    parameters.  ``.backward()`` never runs inside a capture, so no ``.grad`` is touched there.  With
    ``verify`` (default from ``GRAPHJIT_VERIFY``) both graphs are replayed once and compared with the
    eager pass (outputs, and gradients for grad-outputs equal to the outputs); a mismatch falls back.
REPLAY
    A call copies its tensors into the slot's static inputs (only those at another address),
    replays the forward graph and returns copies of the outputs through an autograd function
    (``torch.autograd.Function`` / ``paddle.autograd.PyLayer``); its backward copies the incoming
    gradients into the static grad-outputs, replays the backward graph, and returns the gradients.
FALLBACK / EAGER
    A key whose capture failed (reason in :meth:`stats`), a machine without CUDA (one INFO line per
    layer), grad mode off, nothing requiring grad, or ``GRAPHJIT_DISABLE=1``: the layer runs eagerly.

Outputs.  ``outputs="copy"`` (default) returns fresh tensors: a later forward of the same slot
cannot change what the caller holds.  ``outputs="alias"`` returns the slot's static output buffers
(no copy), valid until that slot's next forward (after this micro-batch's backward).

Gradients, exactly as eager.  The layer's trainable parameters are inputs of the autograd function,
so torch's / Paddle's own gradient accumulation stores their gradients (and runs their hooks, e.g.
DDP's).  Where that accumulation may keep the tensor it is handed as ``.grad`` (torch: ``.grad`` is
None; Paddle: always, since after ``clear_gradients()`` it keeps the next incoming tensor), it gets a
fresh copy of the graph's gradient buffer, as eager gets a fresh tensor; otherwise (torch, ``.grad``
exists) the buffer itself is added into ``.grad`` in place.  Gradients of leaf inputs are fresh copies
(they become ``.grad``); with torch, gradients flowing on to non-leaf inputs are the buffers
themselves (consumed within the backward pass; Paddle: copies).  So gradient accumulation over
micro-batches gives the same ``.grad`` as eager, never a buffer a later replay overwrites.  Any number
of outputs may carry gradients; inputs may or may not require grad; unused inputs and parameters get
no gradient, as in eager.

Several micro-batches in flight (1F1B and interleaved pipeline schedules).  A forward replay
overwrites its slot's saved activations, so a forward issued before the previous micro-batch's
backward takes another slot: each key has up to ``max_in_flight`` slots, each with its own forward
graph, backward graph, static buffers and memory pool, recorded lazily the first time that many
micro-batches are outstanding.  Memory cost per slot: about one eager forward-plus-backward of the
layer (saved activations and backward temporaries, kept reserved in the slot's pool), plus its
static inputs, outputs and grad-outputs, plus one set of gradient buffers the size of the inputs that
require grad and of the trainable parameters.  A plain loop (one micro-batch at a time) uses one
slot; a 1F1B stage with P micro-batches in flight uses P.  Beyond ``max_in_flight`` a micro-batch
runs eagerly (said once; an error in strict mode).  Backwards must come in forward order (first in,
first out): a backward out of that order raises :class:`~graphjit.errors.BackwardOrderError` naming
the micro-batch expected (a micro-batch whose outputs were dropped without a backward frees its slot
and leaves the queue).  With Paddle, the error reaches the caller wrapped by Paddle's autograd
engine (an ``OSError`` whose text carries the message).

Environment (read through :mod:`graphjit.env`) and Paddle's ``CUDAGraphedLayer`` toggles:

* ``GRAPHJIT_DISABLE=1`` calls the wrapped layer itself (no warmup counting, no capture): the
  counterpart of ``PADDLE_DEBUG_CUDAGRAPHEDLAYER_FALLBACK_TO_DEFAULT=1``.
* ``GRAPHJIT_DEBUG=1`` logs every state change at DEBUG level (warmup k/n, record of a slot with its
  capture time and pool size, each forward and backward replay with micro-batch number, slot and
  fingerprints of inputs, outputs and gradients, each fallback): the counterpart of
  ``PADDLE_DEBUG_ENABLE_CUDAGRAPH_LAYER_LOGGING=1``.  graphjit does not read the Paddle variables.
* ``GRAPHJIT_STRICT``, ``GRAPHJIT_VERIFY``, ``GRAPHJIT_MAX_GRAPHS`` (input signatures per layer) and
  ``GRAPHJIT_DUMP_DIR`` apply as for ``@graphed``.

Values the forward reads (:mod:`graphjit.training.values`): its closure cells, globals and the attributes of the
layer and of the Modules/Layers among its arguments that its code names, the parameters it holds among them, are
read at a key's first recording and checked before each of its calls: a call after one changed is a call of the key
of the current values (warmed up and recorded like any key; labelled with the change); one that cannot key a graph,
or that changes on every call (8 such keys), runs eagerly with its reason.

Restrictions (as for any CUDA graph): parameters are captured by address (an optimizer updates them
in place, which is fine; after moving the layer, or changing which parameters require grad, call
:meth:`reset`); a layer whose last warmup call writes a Python value its forward reads (a counter
``self.calls += 1``) runs eagerly with its reason; forward hooks run during warmup and capture only; the layer
must not synchronise the CPU with the GPU; tensors that require grad and that the layer uses must be its
parameters or its inputs (torch: checked at capture); backward through one micro-batch twice
(``retain_graph=True``) and double backward are not supported.
"""

from __future__ import annotations

from typing import Any

from .. import backends
from ..errors import BackwardOrderError, ConfigError
from ..policy import check_choice, check_count, check_flag, check_max_graphs
from .core import GraphedLayerCore
from .glue import Glue
from .slots import DEFAULT_MAX_IN_FLIGHT, DEFAULT_WARMUP, OUTPUTS


# -- the public entry point ------------------------------------------------------------------------
def _validate(warmup: Any, max_in_flight: Any, outputs: Any, verify: Any, strict: Any, max_graphs: Any) -> None:
    check_count("warmup", warmup, "eager steps before the graphs are recorded: lazy initialisation must not end up "
                "in a capture")
    check_count("max_in_flight", max_in_flight, "micro-batches of one input signature that may wait for their "
                "backward at once")
    check_choice("outputs", outputs, OUTPUTS)
    check_flag("verify", verify)
    check_flag("strict", strict)
    check_max_graphs(max_graphs)


def _framework_of(layer: Any) -> str | None:
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and isinstance(layer, torch.nn.Module):
        return "torch"
    paddle = sys.modules.get("paddle")
    if paddle is not None and isinstance(layer, paddle.nn.Layer):
        return "paddle"
    return None


def graphed_layer(layer: Any, warmup: int = DEFAULT_WARMUP, *, max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
                  outputs: str = "copy", verify: bool | None = None, strict: bool | None = None,
                  max_graphs: int | None = None, _simulate: bool = False) -> Any:
    """Wrap ``layer`` (a ``torch.nn.Module`` or a ``paddle.nn.Layer``) for training with CUDA graphs.

    Returns a module/layer of the same framework that calls like ``layer`` (its parameters, state
    dict under the prefix ``layer.``, and ``train()``/``eval()`` are the wrapped layer's), plus
    ``stats()``, ``report()`` and ``reset()``.  The first ``warmup`` calls of each input signature run
    eagerly; then a forward graph and a backward graph are recorded and replayed (see the module
    docstring for the states, the FIFO rule for micro-batches, gradient semantics and the memory
    cost).  ``max_in_flight``: graph pairs per input signature, i.e. micro-batches that may wait for
    their backward at once.  ``outputs``: "copy" (fresh tensors) or "alias" (static buffers, valid
    until that slot's next forward).  ``verify``/``strict``/``max_graphs``: as for ``@graphed``
    (defaults from ``GRAPHJIT_VERIFY``/``GRAPHJIT_STRICT``/``GRAPHJIT_MAX_GRAPHS``).

    ``_simulate=True`` is for tests on machines without CUDA: the graphed path runs with every
    static buffer, slot and copy, but a "replay" re-runs the layer instead of a CUDA graph.
    """
    _validate(warmup, max_in_flight, outputs, verify, strict, max_graphs)
    if getattr(layer, "_graphjit_core", None) is not None:
        raise ConfigError(f"{type(layer).__name__} is already a graphed layer")
    framework = _framework_of(layer)
    if framework is None:
        tp = type(layer)
        raise ConfigError(f"graphed_layer() needs a torch.nn.Module or a paddle.nn.Layer, got "
                          f"{tp.__module__}.{tp.__qualname__} (for a plain function use @graphjit.graphed)")
    backends.get(framework)  # the backend instance (raises BackendError if it cannot be built)
    options = {"warmup": warmup, "max_in_flight": max_in_flight, "outputs": outputs, "verify": verify,
               "strict": strict, "max_graphs": max_graphs, "simulate": bool(_simulate)}
    if framework == "torch":
        from ..backends.torch.training import GraphedModule

        return GraphedModule(layer, options)
    from ..backends.paddle.training import GraphedPaddleLayer

    return GraphedPaddleLayer(layer, options)


__all__ = ["BackwardOrderError", "Glue", "GraphedLayerCore", "graphed_layer"]
