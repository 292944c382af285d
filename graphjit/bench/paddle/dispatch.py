"""The inputs of ``python -m graphjit bench dispatch`` with Paddle: ``n`` float32 zero tensors of ``shape`` on
the CPU (the device is set to the CPU), then the int ``3`` (the arguments of
:func:`graphjit.bench.dispatch.trivial`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import paddle


def make_inputs(n: int, shape: Sequence[int]) -> tuple[Any, ...]:
    paddle.set_device("cpu")
    return (*[paddle.zeros(list(shape), dtype="float32") for _ in range(n)], 3)
