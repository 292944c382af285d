"""The distributed-backend protocol: what :mod:`graphjit.collectives` needs from a framework.

:mod:`graphjit.collectives` (the custom all-reduce and the swap of ``all_reduce``) never imports
paddle or torch; it talks to a :class:`DistBackend`.  ``torch/dist.py`` and ``paddle/dist.py`` implement
it; :func:`load` imports one of them on demand (and so the framework, which the program has
imported already when it calls ``collectives.init``).

Everything here is about one call of the framework's ``all_reduce`` or one process group:
parsing the call the way the original parses it, describing the tensor (pointer, size, dtype,
layout), the process group (rank, size, exchanging small Python objects), streams and capture
state, and building the value the original would return.
"""

from __future__ import annotations

import abc
import contextlib
import threading
from collections.abc import Hashable, Iterator
from typing import Any, NamedTuple

from ..errors import BackendError
from . import load as framework_module


class _Compiled(threading.local):
    depth = 0  # a thread's default: read without an AttributeError raised and caught


_compiled = _Compiled()


@contextlib.contextmanager
def from_compiled_graph() -> Iterator[None]:
    """Marks swap calls made by a compiler's graph (torch's ``graphjit::all_reduce_`` op) on this thread."""
    depth = _compiled.depth
    _compiled.depth = depth + 1
    try:
        yield
    finally:
        _compiled.depth = depth


def in_compiled_graph() -> bool:
    """True inside :func:`from_compiled_graph` on this thread."""
    return _compiled.depth > 0


class Call(NamedTuple):
    """One parsed ``all_reduce`` call."""

    tensor: Any
    op: Any
    group: Any
    blocking: bool
    """The caller waits for the result (torch: ``async_op=False``; Paddle: ``sync_op=True``), so the original
    returns no work handle to wait on (torch) or a completed task (Paddle)."""


class TensorInfo(NamedTuple):
    """What eligibility needs to know about a tensor (cheap to build on every call)."""

    dtype: str  # "float32", "float16", "bfloat16", or the framework's name of any other dtype
    numel: int
    nbytes: int
    ptr: int
    contiguous: bool
    device: str  # "cpu" or "cuda:N"


class DistBackend(abc.ABC):
    """One framework's process groups, streams and ``all_reduce``."""

    name: str = "base"
    flag_name: str = "async_op"  # the 4th parameter of all_reduce(tensor, op, group, <flag>)
    flag_default: bool = False
    flag_is_blocking: bool = False  # True where the flag says "wait" (Paddle's sync_op), False for "do not" (async_op)
    default_op: Any = None  # the framework's ReduceOp.SUM

    # -- the function the swap wraps ---------------------------------------------------------
    @abc.abstractmethod
    def wrap_target(self) -> tuple[Any, str]:
        """``(module, attribute)`` of the public ``all_reduce`` to wrap."""

    #: publish the opaque version from the start (not only while a custom all-reduce is enabled)
    always_opaque = False

    def publish(self, wrapper: Any) -> Any:
        """What the swap puts in the framework's module for ``wrapper``.  Default: the wrapper itself;
        a backend whose compiler would look through it returns a callable the compiler leaves alone."""
        return wrapper

    def mark_graph_break(self, fn: Any) -> str | None:
        """Tell the framework's tracer to run ``fn`` eagerly (a graph break); returns what was done."""
        return None

    # -- process groups --------------------------------------------------------------------------
    @abc.abstractmethod
    def initialized(self) -> bool: ...

    @abc.abstractmethod
    def resolve_group(self, group: Any) -> Any:
        """The group a call with ``group`` runs on (``None``: the default group)."""

    @abc.abstractmethod
    def group_key(self, group: Any) -> Hashable:
        """A key that is equal for the same process group (after :meth:`resolve_group`)."""

    @abc.abstractmethod
    def rank(self, group: Any) -> int: ...

    @abc.abstractmethod
    def world_size(self, group: Any) -> int: ...

    @abc.abstractmethod
    def all_gather_object(self, obj: Any, group: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order (a collective: every rank of ``group`` must call it)."""

    # -- calls -----------------------------------------------------------------------------------
    def parse_call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Call | None:
        """The call's arguments as ``all_reduce(tensor, op=SUM, group=None, <flag>=<default>)`` binds
        them, or None if this is not a plain call (more arguments, unknown or repeated keywords, no tensor)."""
        if len(args) == 1 and not kwargs:  # all_reduce(t), the common call: no binding to do
            return Call(args[0], self.default_op, None, self._blocking(self.flag_default)) if args[0] is not None \
                else None
        names = ("tensor", "op", "group", self.flag_name)
        if len(args) > 4 or any(k not in names or names.index(k) < len(args) for k in kwargs):
            return None
        values = dict(zip(names, args))
        values.update(kwargs)
        tensor = values.get("tensor")
        if tensor is None:
            return None
        return Call(tensor, values.get("op", self.default_op), values.get("group"),
                    self._blocking(bool(values.get(self.flag_name, self.flag_default))))

    def _blocking(self, flag: bool) -> bool:
        return flag if self.flag_is_blocking else not flag

    @abc.abstractmethod
    def is_sum(self, op: Any) -> bool: ...

    @abc.abstractmethod
    def tensor_info(self, t: Any) -> TensorInfo | None:
        """None if ``t`` is not a (dense) tensor of this framework."""

    @abc.abstractmethod
    def result(self, call: Call) -> Any:
        """What the original returns for ``call`` once the result is in ``call.tensor``."""

    def static_mode(self) -> bool:
        """True while the framework builds a static program (the call is recorded, not run)."""
        return False

    # -- devices and streams ---------------------------------------------------------------------
    @abc.abstractmethod
    def cuda_unavailable(self) -> str | None:
        """None if the framework can run CUDA work here, else the reason."""

    @abc.abstractmethod
    def current_device(self) -> int: ...

    @abc.abstractmethod
    def capability(self, device: int) -> tuple[int, int]: ...

    @abc.abstractmethod
    def current_stream(self, device: int) -> int:
        """The raw ``cudaStream_t`` the framework launches work on now (0: legacy default)."""

    @abc.abstractmethod
    def capturing(self) -> bool:
        """True while the current stream (torch) or the framework (Paddle) captures a CUDA graph."""

    @abc.abstractmethod
    def synchronize(self, device: int) -> None: ...

    @abc.abstractmethod
    def from_numpy(self, array: Any, device: int) -> Any:
        """A new tensor on GPU ``device`` with the contents of the numpy ``array`` (a plain copy)."""

    @abc.abstractmethod
    def to_numpy(self, t: Any) -> Any:
        """A numpy copy of ``t`` (float32 for bfloat16)."""


_instances: dict[str, DistBackend] = {}


def load(name: str) -> DistBackend:
    """The distributed backend of framework ``name`` ("torch" or "paddle")."""
    backend = _instances.get(name)
    if backend is not None:
        return backend
    if name not in ("torch", "paddle"):
        raise BackendError(f"backend={name!r}: expected 'torch' or 'paddle'")
    try:
        module = framework_module(name, "dist")
    except ImportError as exc:
        raise BackendError(f"backend={name!r} needs {name}, which cannot be imported ({exc})") from exc
    backend = module.Dist()
    _instances[name] = backend
    return backend


__all__ = ["Call", "DistBackend", "TensorInfo", "load"]
