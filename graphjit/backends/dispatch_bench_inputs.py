"""The inputs of ``python -m graphjit bench dispatch``, built with torch or paddle.

:func:`make_inputs` returns the arguments of :func:`graphjit.bench.dispatch.trivial` for one framework:
:data:`~graphjit.bench.dispatch.N_TENSORS` float32 zero tensors of shape :data:`~graphjit.bench.dispatch.SHAPE`
on the CPU, then the int ``3``.  It imports that framework (paddle: and sets its device to the CPU).
"""

from __future__ import annotations

from typing import Any

from ..bench.dispatch import N_TENSORS, SHAPE


def make_inputs(framework: str) -> tuple[Any, ...]:
    """``(*tensors, 3)`` for ``framework`` (``"torch"``, else paddle): see the module's docstring."""
    tensors: list[Any]
    if framework == "torch":
        import torch

        tensors = [torch.zeros(SHAPE) for _ in range(N_TENSORS)]
    else:
        import paddle

        paddle.set_device("cpu")
        tensors = [paddle.zeros(list(SHAPE), dtype="float32") for _ in range(N_TENSORS)]
    return (*tensors, 3)
