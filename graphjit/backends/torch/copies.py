"""torch's side of graphjit's batch copies (:class:`graphjit.batch_copy.Operands`): which tensors a batch copy may
take, the current stream as an integer, and new output tensors."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from . import device as cuda_device


def _plain_bytes(t: Any) -> bool:
    """The tensor is its bytes: strided and dense, no lazy conjugate or negative bit, not complex, quantized or a
    zero tensor (whose data pointer is null)."""
    return bool(t.layout is torch.strided and t.is_contiguous() and not t.is_complex() and not t.is_quantized
                and not t.is_neg() and not t.is_conj() and not t._is_zerotensor())


class TorchOperands:
    """Dense, non-complex CUDA tensors; the stream is torch's current stream of the device.  Outputs only: four
    inputs took 6.8-8.7 us of host time by ``torch._foreach_copy_`` and 7.5-10.1 us by a batch copy, four outputs
    32.8-48.7 us by clones and 14.7-22.5 us by a batch copy (one H200 host, commit 6a1dbbe)."""

    inputs = False
    outputs = True

    def target(self, t: Any) -> tuple[str, int] | None:
        if not (type(t) is torch.Tensor and t.is_cuda and _plain_bytes(t)):
            return None
        index = t.device.index if t.device.index is not None else torch.cuda.current_device()
        return cuda_device.arch(index), index

    def stream(self, device: int) -> Callable[[], int]:
        return functools.partial(cuda_device.current_stream, device)

    def dense(self, t: Any) -> bool:
        return bool(t.is_contiguous())

    def data_ptr(self, t: Any) -> int:
        return int(t.data_ptr())

    def nbytes(self, t: Any) -> int:
        return int(t.numel() * t.element_size())

    def empty_like(self, t: Any) -> Any:
        # as clone(memory_format=contiguous_format) lays it out (empty_like alone keeps odd strides of size-1 dims)
        return torch.empty_like(t, memory_format=torch.contiguous_format)


OPERANDS = TorchOperands()
