"""torch's modes as graphjit keys calls on them (:meth:`TorchBackend.modes`, read on every call), and the autocast
cast cache a capture turns off (:func:`autocast_cache_off`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

_any_autocast: Callable[[], bool] = getattr(torch._C, "_is_any_autocast_enabled", lambda: True)
# The modes read on every call, as the C functions behind torch's Python wrappers where this torch has them.
_grad_enabled: Callable[[], bool] = torch.is_grad_enabled
_inference_mode: Callable[[], bool] = torch.is_inference_mode_enabled
_matmul_precision: Callable[[], str] = getattr(torch._C, "_get_float32_matmul_precision",
                                               torch.get_float32_matmul_precision)
_deterministic: Callable[[], bool] = getattr(torch._C, "_get_deterministic_algorithms",
                                             torch.are_deterministic_algorithms_enabled)
_default_dtype: Callable[[], Any] = torch.get_default_dtype  # what torch.ones(3) makes: the graph froze it
_function_modes: Callable[[], int] = getattr(torch._C, "_len_torch_function_stack", lambda: 1)


def _flag(name: str) -> Callable[[], Any]:
    """torch's C getter ``name``, or one that gives None where this torch has none."""
    return getattr(torch._C, name, lambda: None)


# The backend flags that choose the kernels a graph froze at its capture (cuBLAS's reduced-precision reductions for
# fp16 and bf16 GEMMs, whether cuDNN runs, its TF32 and its deterministic algorithms: the ones Dynamo's global state
# guard checks, and cuDNN's), and what ``describe`` calls them where they are not torch's defaults.  The fp32 matmul
# TF32 flag is in the fp32 matmul precision already.
_FLAGS: tuple[tuple[Callable[[], Any], str, Any], ...] = (
    (_flag("_get_cublas_allow_fp16_reduced_precision_reduction"), "cuBLAS fp16 reduction", True),
    (_flag("_get_cublas_allow_bf16_reduced_precision_reduction"), "cuBLAS bf16 reduction", True),
    (_flag("_get_cudnn_enabled"), "cuDNN", True),
    (_flag("_get_cudnn_allow_tf32"), "cuDNN tf32", True),
    (_flag("_get_cudnn_deterministic"), "cuDNN deterministic", False),
)
_flag_getters = tuple(getter for getter, _, _ in _FLAGS)
_fp16_reduction, _bf16_reduction, _cudnn, _cudnn_tf32, _cudnn_deterministic = _flag_getters


@contextlib.contextmanager
def autocast_cache_off() -> Iterator[None]:
    """Inside the block, autocast keeps no cache of its casts, where autocast is on or an autocast block is open: a
    graph that read a cached cast would read it after the user's autocast block freed it, so the casts are captured
    instead.  Outside every autocast block there is nothing cached and the flag stays as it is: it is part of the
    global state Dynamo's guards check, and a capture that flipped it made ``tracer="compile"`` recompile inside the
    capture (a failed capture, or seconds of compiling a program that only the capture ran).  The flag is put back
    when the block ends."""
    # Inside an autocast block switched off (``enabled=False``) the cache still holds the outer block's casts, and a
    # block the function enters takes them: the nesting level says so (1 after this increment: no block at all).
    inside_a_block = torch.autocast_increment_nesting() > 1
    torch.autocast_decrement_nesting()
    if not _any_autocast() and not inside_a_block:
        yield
        return
    cache = torch.is_autocast_cache_enabled()
    torch.set_autocast_cache_enabled(False)
    try:
        yield
    finally:
        torch.set_autocast_cache_enabled(cache)


def _autocast_modes() -> tuple[tuple[str, bool, Any], ...]:
    """(device type, enabled, dtype) of autocast for CUDA and the CPU (torch >= 2.4 API, older spelling
    as the fallback)."""
    try:
        return tuple((d, bool(torch.is_autocast_enabled(d)), torch.get_autocast_dtype(d)) for d in ("cuda", "cpu"))
    except TypeError:  # torch < 2.4
        return (("cuda", bool(torch.is_autocast_enabled()), torch.get_autocast_gpu_dtype()),
                ("cpu", bool(torch.is_autocast_cpu_enabled()), torch.get_autocast_cpu_dtype()))


def _default_device() -> Any:
    """The device of the innermost ``torch.device`` context or ``torch.set_default_device`` (what ``torch.ones(3)``
    makes), None where there is none.  :func:`read` asks only where a torch function mode is active."""
    from torch.overrides import _get_current_function_mode_stack
    from torch.utils._device import DeviceContext

    for mode in reversed(_get_current_function_mode_stack()):
        if isinstance(mode, DeviceContext):
            return mode.device
    return None


def read() -> tuple[Any, ...]:
    """The modes a call is keyed on: grad mode, inference mode, autocast (None outside every autocast block), the fp32
    matmul precision, deterministic algorithms, the default dtype and the default device (what ``torch.ones(3)``
    makes: a graph froze them; one C call where no torch function mode is active), and the kernel flags of
    ``_FLAGS`` (a graph froze the kernels they chose: a call under other flags is another key, as Dynamo's global
    state guard makes it another compile)."""
    autocast = _autocast_modes() if _any_autocast() else None
    return (_grad_enabled(), _inference_mode(), autocast, _matmul_precision(), _deterministic(), _default_dtype(),
            _default_device() if _function_modes() else None,
            (_fp16_reduction(), _bf16_reduction(), _cudnn(), _cudnn_tf32(), _cudnn_deterministic()))


def probes(modes: tuple[Any, ...]) -> tuple[tuple[Callable[[], Any], ...], tuple[Any, ...]] | None:
    """The C functions that give, on a call, the values they gave for ``modes`` (:func:`read`'s) exactly where
    :func:`read` would give ``modes`` again, with what they must give; None for modes read inside an autocast block
    or a torch function mode (their reads are Python: the replay lane leaves such calls to the Python path).  A
    torch function mode active on a call makes its probe differ (the count is 0 here), so the probes refuse such a
    call where :func:`read` might not: never looser."""
    grad, inference, autocast, precision, deterministic, dtype, device, flags = modes
    if autocast is not None or device is not None:
        return None
    return ((_any_autocast, _grad_enabled, _inference_mode, _matmul_precision, _deterministic, _default_dtype,
             _function_modes, *_flag_getters), (False, grad, inference, precision, deterministic, dtype, 0, *flags))


def describe(modes: tuple[Any, ...]) -> str:
    """The modes of :func:`read` as a key's label shows them (only those that are not the default)."""
    grad, inference, autocast, precision, deterministic, dtype, device, flags = modes
    parts = ["inference_mode" if inference else ("no_grad" if not grad else "")]
    for device_type, enabled, cast in autocast or ():
        if enabled:
            parts.append(f"autocast({device_type}, {str(cast).replace('torch.', '')})")
    if precision != "highest":
        parts.append(f"fp32 matmul={precision}")
    if deterministic:
        parts.append("deterministic")
    if dtype is not torch.float32:
        parts.append(f"default dtype {str(dtype).replace('torch.', '')}")
    if device is not None:
        parts.append(f"default device {device}")
    for (_, name, default), value in zip(_FLAGS, flags):
        on = value[0] if isinstance(value, tuple) else value  # cuBLAS's (allowed, split-K allowed) in torch >= 2.10
        if value is not None and bool(on) != default:
            parts.append(f"{name} {'on' if on else 'off'}")
    return " ".join(p for p in parts if p)
