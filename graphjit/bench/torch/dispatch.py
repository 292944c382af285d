"""The inputs of ``python -m graphjit bench dispatch`` with torch: ``n`` float32 zero tensors of ``shape`` on
the CPU, then the int ``3`` (the arguments of :func:`graphjit.bench.dispatch.trivial`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def make_inputs(n: int, shape: Sequence[int]) -> tuple[Any, ...]:
    return (*[torch.zeros(tuple(shape)) for _ in range(n)], 3)
