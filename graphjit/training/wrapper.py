"""What the framework wrappers ``graphed_layer`` returns share (:class:`GraphedLayerMixin`: the core, the call,
``stats``/``report``/``reset``, moving and copying), and the names graphed layers go by."""

from __future__ import annotations

import collections
import copy
import threading
from typing import Any

from ..reach import OwnWrapper
from .core import GraphedLayerCore
from .glue import Glue


class GraphedLayerMixin(OwnWrapper):
    """The methods both frameworks' wrappers share (``GraphedModule`` for torch, ``GraphedPaddleLayer``
    for Paddle); it comes first in their bases, before ``torch.nn.Module`` / ``paddle.nn.Layer``.  graphjit's walks
    go through it to the wrapped layer (:class:`~graphjit.reach.OwnWrapper`, ``__wrapped__``), never into its core's
    counters (an outer graphed layer or function calling it would find them written on every call).

    The wrapper keeps the wrapped layer as ``self.layer`` (a submodule: parameters, buffers and the
    train/eval mode are the layer's) and the :class:`GraphedLayerCore` outside the framework's
    attribute machinery (``object.__setattr__``), so it is neither a submodule nor state-dict entry.
    """

    layer: Any
    _graphjit_core: GraphedLayerCore

    @property
    def __wrapped__(self) -> Any:
        return self.layer

    def _attach_core(self, glue: Glue, options: dict[str, Any]) -> None:
        core = GraphedLayerCore(glue, _layer_name(type(glue.layer).__name__), **options)
        object.__setattr__(self, "_graphjit_core", core)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._graphjit_core.call(args, kwargs)

    def stats(self) -> dict[str, Any]:
        """Counters per input signature (warmups, captures = slots recorded, replays, backward replays,
        fallbacks and their reasons, capture ms, pool bytes) and the layer's micro-batch counts."""
        return self._graphjit_core.stats_dict()

    def report(self) -> str:
        return self._graphjit_core.report()

    def reset(self) -> None:
        """Stop using every graph (after replacing parameter tensors); refused while micro-batches wait.
        torch frees the graphs' memory once no output refers to it; Paddle keeps its graphs allocated
        until the process ends (see ``PaddleGraph``)."""
        self._graphjit_core.reset()

    def _apply(self, *args: Any, **kwargs: Any) -> Any:
        # torch's .to(), .cuda(), .half(), ... and Paddle's .to(), .float(), .bfloat16() move or replace the
        # parameters the graphs captured by address: every graph is dropped (the framework's _apply runs
        # first).  Paddle's astype() does not come through here: GraphedPaddleLayer overrides it.
        out = super()._apply(*args, **kwargs)  # type: ignore[misc]
        core = self.__dict__.get("_graphjit_core")
        if core is not None:
            core.reset()
        return out

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        """A copy of the wrapped layer, graphed anew with the same options (graphs are not copied)."""
        new = type(self)(copy.deepcopy(self.layer, memo), dict(self._graphjit_core.options))  # type: ignore[call-arg]
        memo[id(self)] = new
        return new

    def extra_repr(self) -> str:
        c = self._graphjit_core
        return f"warmup={c.warmup}, max_in_flight={c.max_in_flight}, outputs={c.outputs!r}"


_NAMES_GIVEN: collections.Counter[str] = collections.Counter()
_NAMES_LOCK = threading.Lock()


def _layer_name(cls_name: str) -> str:
    """``graphed_layer(Block)`` for the first graphed layer of a class, ``graphed_layer(Block#2)`` for the
    second, ...: reports and logs of two layers of one class are told apart."""
    with _NAMES_LOCK:
        _NAMES_GIVEN[cls_name] += 1
        n = _NAMES_GIVEN[cls_name]
    return f"graphed_layer({cls_name})" if n == 1 else f"graphed_layer({cls_name}#{n})"
