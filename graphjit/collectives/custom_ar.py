"""The custom all-reduce for one process group: init, eligibility, eager and captured calls.

``init(group)`` sets up, on every rank of the group at once (it is a collective):

1. local checks: ``GRAPHJIT_CUSTOM_AR``, world size (2, 4, 6, 8), CUDA, the GPU's architecture,
   the library (built with nvcc on first use, see :mod:`.csrc_build`);
2. every rank's node and GPU (PCI bus id) are exchanged: one node only, no shared GPU, P2P between
   all pairs, NVLink between all pairs above 2 GPUs (:mod:`.topology`);
3. per rank a signal+scratch buffer (header + ``max_bytes``) and a staging buffer (``max_bytes``),
   both ``cudaMalloc`` memory, whose IPC handles are exchanged and opened by every other rank;
4. a write-and-verify probe: every rank writes a token into every rank's buffer through the
   mappings, and every rank checks that all tokens arrived (P2P that the driver reports but that
   drops writes is caught here);
5. a self-test: one one-shot and one two-shot all-reduce of integer-valued data, checked exactly.

After every step that can differ between ranks, the ranks exchange their verdicts and all of them
take the first failure (in rank order): either every rank uses the custom all-reduce or none does.
A failure is not an exception: ``init`` returns a :class:`Report` whose ``reason`` says why, and
every later call runs the framework's collective, counted under that reason.  Bad arguments raise
:class:`~graphjit.errors.ConfigError`, and so do settings that differ between the ranks (step 2
compares them: :data:`SHARED_OPTIONS`).

Calls (through the swap, :mod:`.swap`):

* **eager** (not capturing): the input is copied into this rank's staging buffer and the kernel
  reads the staging buffers of all ranks; the result is written into the caller's tensor (in
  place, as ``all_reduce`` does).  Warmup calls inside a graphed function or a capture scope take
  this path, so they return the right sum.
* **captured** (the current stream is capturing): zero copy.  The kernel reads the tensor itself
  on every rank; its address is recorded and the launch gets the next pointer-table slot.  Right
  after the capture (``graphjit.scope.AFTER_CAPTURE``, before the graph's first replay) the ranks
  exchange IPC handles of those addresses and fill the slots.  All ranks must capture the same
  all-reduces in the same order (as for NCCL).  Programs that capture graphs themselves (with
  ``scope="always"``) call :func:`register_graph_buffers` after each capture, on every rank.

One stream at a time: the kernels of one group synchronize through per-block counters in device
memory, so a rank must not run two custom all-reduces of the same group concurrently (on two
streams without ordering between them), as with NCCL communicators.  Eager calls, warmups and
graph replays on the framework's current stream, graphjit's normal use, satisfy this.

Fallback reasons (the keys of ``stats()["fallbacks"]``; see :data:`REASONS`): a call that is not
eligible runs the original ``all_reduce`` with its own arguments, return value and semantics.
Decisions per call are made on each rank from the call's arguments, so they agree across ranks
when the ranks run the same program with the same settings (``GRAPHJIT_*`` included).
"""

from __future__ import annotations

import contextlib
import sys
import threading
from typing import Any

from .. import env
from .. import scope as scope_mod
from ..backends.dist_base import DistBackend, load
from ..errors import ConfigError
from . import swap
from .communicator import Communicator
from .reasons import (
    ALGO_CODES,
    BACKENDS,
    DEFAULT_MAX_BLOCKS,
    DEFAULT_MAX_BYTES,
    DEFAULT_SLOTS,
    DEFAULT_TIMEOUT_S,
    DTYPE_CODES,
    EAGER_NCCL_ABOVE,
    HEADER_BYTES,
    OPTIONS,
    REASONS,
    SCOPES,
    SHARED_OPTIONS,
    SUPPORTED_WORLD_SIZES,
    Reason,
    check_same_options,
    check_settings,
    check_tensor,
    check_world,
    validate,
)
from .report import STATS, Report, Stats

__all__ = ["ALGO_CODES", "BACKENDS", "DEFAULT_MAX_BLOCKS", "DEFAULT_MAX_BYTES", "DEFAULT_SLOTS", "DEFAULT_TIMEOUT_S",
           "DTYPE_CODES", "EAGER_NCCL_ABOVE", "HEADER_BYTES", "OPTIONS", "REASONS", "SCOPES", "SHARED_OPTIONS",
           "STATS", "SUPPORTED_WORLD_SIZES", "Communicator", "Reason", "Report", "Stats", "after_capture",
           "check_same_options", "check_settings", "check_tensor", "check_world", "communicators", "dispatch", "init",
           "register_graph_buffers", "reset", "reset_stats", "shutdown", "stats", "status", "validate"]


# -- the process-wide registry ---------------------------------------------------------------------
_COMMS: dict[Any, Communicator] = {}
_registry_lock = threading.RLock()


def dispatch(dist: DistBackend, original: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The swap's handler: run ``original(*args, **kwargs)`` or the custom kernel, counting why."""
    settings = env.settings()
    if settings.disable:
        STATS.fallback("disabled", "GRAPHJIT_DISABLE=1")
        return original(*args, **kwargs)
    if dist.static_mode():
        STATS.fallback("static mode", REASONS["static mode"])
        return original(*args, **kwargs)
    call = dist.parse_call(args, kwargs)
    if call is None:
        STATS.fallback("arguments", REASONS["arguments"])
        return original(*args, **kwargs)
    comm = None
    if _COMMS:
        try:
            comm = _COMMS.get(dist.group_key(call.group))
        except Exception:  # a group object the backend does not understand
            comm = None
    if comm is None:
        STATS.fallback("not initialized", REASONS["not initialized"])
        return original(*args, **kwargs)
    return comm.call(call, original, args, kwargs)


def after_capture() -> None:
    """``graphjit.scope.AFTER_CAPTURE`` hook: register what the capture that just ended recorded."""
    if not _COMMS:
        return
    current = scope_mod.last_capture()
    for comm in list(_COMMS.values()):
        if comm.pending_seq:
            comm.register(current)


def _pick_backend(backend: str, group: Any) -> DistBackend:
    if backend != "auto":
        return load(backend)
    if group is not None:
        module = type(group).__module__ or ""
        for name in ("torch", "paddle"):
            if module == name or module.startswith(name + "."):
                return load(name)
        raise ConfigError(f"group={group!r}: expected a torch.distributed or paddle.distributed process group, or None")
    present = [n for n in ("torch", "paddle") if n in sys.modules]
    if len(present) == 1:
        return load(present[0])
    if not present:
        raise ConfigError("collectives.init(): neither torch nor paddle is imported; initialise the framework's "
                          "process group first")
    initialized = [n for n in present if load(n).initialized()]
    if len(initialized) == 1:
        return load(initialized[0])
    raise ConfigError("collectives.init(): both torch and paddle are imported"
                      + (" and both have an initialised process group" if initialized else "")
                      + "; pass backend='torch' or backend='paddle'")


def init(group: Any = None, max_bytes: int | None = None, scope: str = "graphed", *, backend: str = "auto",
         pointer_slots: int = DEFAULT_SLOTS, timeout_s: float = DEFAULT_TIMEOUT_S,
         max_blocks: int = DEFAULT_MAX_BLOCKS) -> Report:
    """Set up the custom all-reduce for ``group`` (a collective: call it on every rank of the group).

    Args:
        group: the process group (torch or paddle); None: the default (world) group.
        max_bytes: the largest tensor the custom kernel takes (bytes, multiple of 16); sizes the
            staging and scratch buffers (device memory: about 2 x max_bytes per rank, each rank's
            mapped by every other).  Default ``GRAPHJIT_AR_MAX_BYTES`` or 8 MiB.
        scope: ``"graphed"``: the custom kernel runs inside graphed calls and capture scopes only;
            ``"always"``: for every eligible call.
        backend: ``"auto"`` (from ``group`` or the imported framework), ``"torch"``, ``"paddle"``.
        pointer_slots: capacity of the pointer table (one slot per captured all-reduce).
        timeout_s: a kernel waiting longer than this for another rank traps (0: waits forever).
        max_blocks: thread blocks per kernel (1..64; default 64, measured best on 2 x H200 from
            512 KiB up and no worse below; fewer leave SMs to kernels running alongside).

    Returns a :class:`Report`; ``report.enabled`` is False with ``report.reason`` when the custom
    all-reduce cannot run here (then the framework's collective runs).  With ``GRAPHJIT_AR_ALGO=auto``
    eager calls above 32 MiB also run the framework's collective (reason ``crossover``).  Wraps the framework's
    ``all_reduce`` (once) in any case, so that every call is counted in :func:`stats`.

    Raises :class:`~graphjit.errors.ConfigError` for a bad argument, and on every rank when the ranks passed
    different ``max_bytes``, ``scope``, ``pointer_slots`` or ``max_blocks`` (:data:`SHARED_OPTIONS`; with
    different buffer sizes the ranks would disagree on which calls fit).
    """
    if max_bytes is None:
        max_bytes = env.settings().ar_max_bytes or DEFAULT_MAX_BYTES
    validate(max_bytes, scope, pointer_slots, timeout_s, max_blocks, backend)
    dist = _pick_backend(backend, group)
    if not dist.initialized():
        raise ConfigError(f"{dist.name}.distributed is not initialised: call "
                          + ("torch.distributed.init_process_group()" if dist.name == "torch"
                             else "paddle.distributed.init_parallel_env()")
                          + " on every rank before graphjit.collectives.init()")
    try:
        resolved = dist.resolve_group(group)
        key = dist.group_key(resolved)
    except Exception as exc:
        raise ConfigError(f"group={group!r}: not a {dist.name} process group ({exc})") from exc

    swap.install(dist, dispatch)
    if after_capture not in scope_mod.AFTER_CAPTURE:
        scope_mod.AFTER_CAPTURE.append(after_capture)
    with _registry_lock:
        existing = _COMMS.get(key)
        options = (max_bytes, scope, pointer_slots, float(timeout_s), max_blocks)
        if existing is not None:
            if existing.options() != options:
                raise ConfigError("collectives.init() was already called for this group with other settings "
                                  f"({dict(zip(OPTIONS, existing.options()))}); call collectives.shutdown() first")
            return existing.report()
        comm = Communicator(dist, resolved, key, max_bytes, scope, pointer_slots, float(timeout_s), max_blocks)
        comm.setup()
        _COMMS[key] = comm
        if comm.enabled:
            swap.set_opaque(dist.name, True)
        return comm.report()


def communicators() -> list[Communicator]:
    return list(_COMMS.values())


def _targets(group: Any) -> list[Communicator]:
    if group is None:
        return list(_COMMS.values())
    found = []
    for comm in _COMMS.values():
        with contextlib.suppress(Exception):
            if comm.key == comm.dist.group_key(group):
                found.append(comm)
    return found


def register_graph_buffers(group: Any = None) -> int:
    """After capturing a graph yourself (``scope="always"``): register its all-reduces on every rank.

    A collective over each group with pending captured all-reduces.  graphjit's own captures do
    this automatically.  Returns the number of buffers registered.
    """
    return sum(comm.register(None) for comm in _targets(group) if comm.pending_seq)


def reset(group: Any = None) -> None:
    """Free the pointer-table slots of captured all-reduces (and the mappings of their buffers).

    Call it on every rank after dropping the graphs that used them (``fn.reset()``): replaying
    such a graph afterwards is an error the kernel reports (it never reads a stale slot).
    """
    for comm in _targets(group):
        comm.reset()


def shutdown(group: Any = None) -> None:
    """Free the buffers of the custom all-reduce (a collective).  The swap stays; calls pass through."""

    with _registry_lock:
        for comm in _targets(group):
            comm.shutdown()
            _COMMS.pop(comm.key, None)
        for name in {c.dist.name for c in _targets(group)} | set(swap.installed()):
            if not any(c.enabled and c.dist.name == name for c in _COMMS.values()):
                swap.set_opaque(name, False)


def stats() -> dict[str, Any]:
    """Calls that ran the custom kernel (eager / captured), fallbacks by reason, registrations, groups."""
    out = STATS.as_dict()
    out["groups"] = [c.report().as_dict() for c in _COMMS.values()]
    return out


def reset_stats() -> None:
    with STATS.lock:
        STATS.clear()


def status() -> list[Report]:
    return [c.report() for c in _COMMS.values()]


__all__ = [
    "REASONS",
    "Communicator",
    "Report",
    "check_settings",
    "check_tensor",
    "check_world",
    "init",
    "register_graph_buffers",
    "reset",
    "shutdown",
    "stats",
]
