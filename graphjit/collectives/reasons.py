"""What the custom all-reduce takes and why it falls back: its constants, the fallback reasons
(:data:`REASONS`, the keys of ``collectives.stats()["fallbacks"]``), the checks of a call (settings, world
size, tensor) and of ``init``'s arguments.  Pure: no framework, no GPU."""

from __future__ import annotations

from typing import Any

from .. import env
from ..backends.dist_base import TensorInfo
from ..errors import ConfigError

SCOPES = ("graphed", "always")
BACKENDS = ("auto", "torch", "paddle")
DEFAULT_MAX_BYTES = 8 << 20
MAX_MAX_BYTES = 1 << 31
DEFAULT_SLOTS = 16384
DEFAULT_TIMEOUT_S = 600.0
DEFAULT_MAX_BLOCKS = 64
SUPPORTED_WORLD_SIZES = (2, 4, 6, 8)
DTYPE_CODES = {"float32": 0, "float16": 1, "bfloat16": 2}
ALGO_CODES = {"auto": 0, "1shot": 1, "2shot": 2}
HEADER_BYTES = 8192  # gjar::kHeaderBytes
# Eager calls with GRAPHJIT_AR_ALGO=auto above this size run the framework's collective: an eager call
# first copies its tensor into the staging buffer, and on 2 x H200 (bf16, NV18) that copy makes the
# custom path as slow as NCCL at 32 MiB (126-133 vs 135 us) and slower at 64 MiB in one of three runs
# (259 vs 246 us; benchmarks/results/allreduce_h200x2.json).  Captured calls are zero copy and stay
# faster than NCCL up to 64 MiB (222 vs 271 us), so they have no crossover below max_bytes.
EAGER_NCCL_ABOVE = 32 << 20

Reason = tuple[str, str]

REASONS: dict[str, str] = {
    "disabled": "GRAPHJIT_CUSTOM_AR=0 (or GRAPHJIT_DISABLE=1): the custom all-reduce is off",
    "nccl": "GRAPHJIT_AR_ALGO=nccl: always the framework's collective",
    "scope": "outside a graphed call or capture scope (init(scope='graphed'), the default)",
    "not initialized": "collectives.init() was not called for this call's process group",
    "static mode": "Paddle is building a static program (to_static AST): the call is recorded as Paddle's op",
    "arguments": "arguments the custom path does not take (not a tensor, unknown keywords)",
    "op": "the reduce op is not SUM",
    "dtype": "dtype other than float32, float16, bfloat16",
    "device": "the tensor is not on this rank's GPU",
    "contiguity": "the tensor is not contiguous",
    "empty": "the tensor has no elements",
    "misaligned": "the tensor's data pointer is not 16-byte aligned (a view at an odd offset)",
    "bytes % 16": "the tensor's size in bytes is not a multiple of 16",
    "bytes > max": "the tensor is larger than max_bytes (the staging and scratch buffers)",
    "world size": "the group's size is not 2, 4, 6 or 8",
    "multi-node": "the group spans more than one node",
    "topology": "no P2P between some pair of GPUs, no NVLink between all pairs above 2 GPUs, or the probe failed",
    "unavailable": "init could not set up the custom all-reduce here (no CUDA, no nvcc, a build or self-test failure)",
    "VMM memory": "captured tensor in VMM memory (e.g. PyTorch expandable_segments): CUDA IPC cannot share it",
    "pointer table full": "no free slot for another captured all-reduce (collectives.reset() frees them)",
    "stream": "the framework's current stream is not the stream being captured",
    "crossover": f"auto, eager call above {EAGER_NCCL_ABOVE >> 20} MiB: NCCL is as fast or faster there (the "
                 "copy through the staging buffer); captured calls have no such crossover",
    "foreign capture": "a compiled all-reduce captured into a CUDA graph graphjit did not capture (torch.compile "
                       "mode='reduce-overhead'): its buffers could not be registered, so the framework's collective "
                       "runs inside that graph",
}


# -- eligibility (pure: no framework, no GPU) ------------------------------------------------------
def check_settings(settings: env.Settings) -> Reason | None:
    if settings.disable:
        return "disabled", "GRAPHJIT_DISABLE=1"
    if not settings.custom_ar:
        return "disabled", "GRAPHJIT_CUSTOM_AR=0"
    if settings.ar_algo == "nccl":
        return "nccl", "GRAPHJIT_AR_ALGO=nccl"
    return None


def check_world(world: int) -> Reason | None:
    if world not in SUPPORTED_WORLD_SIZES:
        return "world size", f"world size {world} is not supported (2, 4, 6 or 8)"
    return None


def check_tensor(info: TensorInfo | None, *, device: str, max_bytes: int) -> Reason | None:
    """Why a tensor cannot take the custom path (None: it can).  The order is the order of the table."""
    if info is None:
        return "arguments", "the first argument is not a dense tensor"
    if info.dtype not in DTYPE_CODES:
        return "dtype", f"dtype {info.dtype} (the custom all-reduce sums float32, float16 and bfloat16)"
    if info.device != device:
        return "device", f"tensor on {info.device}, the custom all-reduce of this group runs on {device}"
    if not info.contiguous:
        return "contiguity", "the tensor is not contiguous"
    if info.numel == 0:
        return "empty", "the tensor has no elements"
    if info.ptr % 16:
        return "misaligned", f"data pointer {info.ptr:#x} is not 16-byte aligned"
    if info.nbytes % 16:
        return "bytes % 16", f"{info.nbytes} bytes is not a multiple of 16"
    if info.nbytes > max_bytes:
        return "bytes > max", f"{info.nbytes} bytes > max_bytes={max_bytes}"
    return None


OPTIONS = ("max_bytes", "scope", "pointer_slots", "timeout_s", "max_blocks")
"""``init``'s settings of a group (a second ``init`` of the group must repeat them), as :class:`Communicator`
attributes."""
SHARED_OPTIONS = ("max_bytes", "scope", "pointer_slots", "max_blocks")
"""``init`` arguments that must be equal on every rank: they size the buffers that each rank reads and writes in
the others' memory (offsets into them are computed from ``max_bytes``), set the kernels' block counts, the
pointer tables and which calls take the custom kernel."""


def check_same_options(per_rank: list[tuple[Any, ...]]) -> None:
    """Raise :class:`ConfigError` (on every rank alike: each sees all ranks' values) when the ranks passed
    different :data:`SHARED_OPTIONS` to ``init``."""
    for i, name in enumerate(SHARED_OPTIONS):
        values = [options[i] for options in per_rank]
        if len(set(values)) > 1:
            each = ", ".join(f"rank {r}: {v!r}" for r, v in enumerate(values))
            raise ConfigError(f"collectives.init: {name} differs between the ranks of the group ({each}); pass the "
                              f"same {', '.join(SHARED_OPTIONS)} on every rank (GRAPHJIT_AR_MAX_BYTES included)")


def validate(max_bytes: Any, scope_name: Any, pointer_slots: Any, timeout_s: Any, max_blocks: Any,
             backend: Any) -> None:
    """ConfigError for bad ``init`` arguments (names the argument and what it accepts)."""
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int):
        raise ConfigError(f"max_bytes={max_bytes!r}: expected an integer number of bytes, e.g. 8 << 20")
    if max_bytes < 16 or max_bytes % 16 or max_bytes > MAX_MAX_BYTES:
        raise ConfigError(f"max_bytes={max_bytes}: expected a multiple of 16 between 16 and {MAX_MAX_BYTES} (2 GiB); "
                          "it sizes the staging and scratch buffers, larger tensors use the framework's collective")
    if scope_name not in SCOPES:
        raise ConfigError(f"scope={scope_name!r}: expected 'graphed' (custom kernel inside graphed calls and capture "
                          "scopes only) or 'always'")
    if backend not in BACKENDS:
        raise ConfigError(f"backend={backend!r}: expected one of {', '.join(repr(b) for b in BACKENDS)}")
    if isinstance(pointer_slots, bool) or not isinstance(pointer_slots, int) or not 2 <= pointer_slots <= 1 << 24:
        raise ConfigError(f"pointer_slots={pointer_slots!r}: expected an integer from 2 to {1 << 24}")
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s >= 0:
        raise ConfigError(f"timeout_s={timeout_s!r}: expected seconds >= 0 (0: a stuck all-reduce waits forever)")
    if isinstance(max_blocks, bool) or not isinstance(max_blocks, int) or not 1 <= max_blocks <= 64:
        raise ConfigError(f"max_blocks={max_blocks!r}: expected an integer from 1 to 64")
