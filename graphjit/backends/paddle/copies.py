"""Paddle's side of graphjit's batch copies (:class:`graphjit.batch_copy.Operands`): which tensors a batch copy may
take, the current stream as an integer, and new output tensors."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import paddle

from . import device as cuda_device

_COMPLEX = frozenset(d for d in (getattr(paddle, "complex64", None), getattr(paddle, "complex128", None)) if d)
_EMPTY = getattr(getattr(paddle, "_C_ops", None), "empty", None)  # empty(shape, dtype, place); stop_gradient=True


def _is_contiguous(t: Any) -> bool:
    check = getattr(t, "is_contiguous", None)  # Paddle without strided views: every dense tensor is contiguous
    return bool(check()) if check is not None else True


class PaddleOperands:
    """Dense, non-complex GPU tensors; the stream is Paddle's current stream of the device.  Inputs and outputs:
    Paddle copies tensor by tensor, about 5 us of host time each on an H200 host."""

    inputs = True
    outputs = _EMPTY is not None  # new outputs made on a given place without a copy (Paddle's _C_ops.empty)

    def target(self, t: Any) -> tuple[str, int] | None:
        place = t.place
        dense = getattr(t, "is_dense", None)  # not a sparse or selected-rows tensor
        if (not place.is_gpu_place() or t.dtype in _COMPLEX or (dense is not None and not dense())
                or not _is_contiguous(t)):
            return None
        index = int(place.gpu_device_id())
        return cuda_device.arch(index), index

    def stream(self, device: int) -> Callable[[], int]:
        return functools.partial(cuda_device.current_stream, device)

    def dense(self, t: Any) -> bool:
        return _is_contiguous(t)

    def data_ptr(self, t: Any) -> int:
        return int(t.data_ptr())

    def nbytes(self, t: Any) -> int:
        return int(t.numel()) * int(t.element_size())

    def empty_like(self, t: Any) -> Any:
        assert _EMPTY is not None  # outputs is False without it: never called then
        return _EMPTY(t.shape, t.dtype, t.place)  # on t's place (paddle.empty takes the current one)


OPERANDS = PaddleOperands()
