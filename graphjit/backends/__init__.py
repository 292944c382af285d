"""The registry of framework code: picks the framework from the tensors of a call, and finds the module
that does one job for one framework, imported only on demand.

A framework is imported only by modules inside a folder named after it, with the same file names for the
same jobs (``tests/test_layout.py`` checks it)::

    graphjit/backends/{torch,paddle}/  graphs (the Backend), dist (the all-reduce swap's view of the
                                       process group), training (graphed_layer's glue), device (the GPUs),
                                       breaks (a function the tracer runs eagerly: islands)
    graphjit/bench/{torch,paddle}/     the benchmarks' framework halves
    graphjit/doctor/{torch,paddle}/    the doctor's rows and probes

:func:`load` finds any of them; :func:`get` makes the framework's :class:`Backend`.  Detection by type looks
only at frameworks the program already imported (``sys.modules``), so graphjit never imports a framework
the user did not.
"""

from __future__ import annotations

import importlib
import sys
import threading
from typing import Any

from ..errors import BackendError
from .base import Backend, GraphHandle

NAMES = ("paddle", "torch")
_CLASSES = {"paddle": "PaddleBackend", "torch": "TorchBackend"}
JOBS = {
    "backends": ("graphs", "dist", "training", "device", "breaks"),
    "bench": ("decode", "train", "hf", "allreduce", "dispatch", "piecewise"),
    "doctor": ("rows", "ipc", "allreduce", "probe"),
}
"""The jobs each area's framework folders hold (not every framework has every job)."""


def module_name(framework: str, job: str, area: str = "backends") -> str:
    """``graphjit.<area>.<framework>.<job>``, checked against :data:`NAMES` and :data:`JOBS`."""
    if framework not in NAMES:
        raise BackendError(f"framework {framework!r} is unknown; expected one of {', '.join(map(repr, NAMES))}")
    if job not in JOBS.get(area, ()):
        raise BackendError(f"{area} has no job {job!r}; its jobs are {', '.join(JOBS.get(area, ()))}")
    return f"graphjit.{area}.{framework}.{job}"


def load(framework: str, job: str, area: str = "backends") -> Any:
    """The module doing ``job`` for ``framework`` in ``area`` (imports it, and with it the framework)."""
    return importlib.import_module(module_name(framework, job, area))

_lock = threading.Lock()
_instances: dict[str, Backend] = {}
_by_type: dict[type, Backend | None] = {}


def get(name: str) -> Backend:
    """The backend called ``name``; raises :class:`BackendError` if it is unknown or not installed."""
    backend = _instances.get(name)
    if backend is not None:
        return backend
    if name not in NAMES:
        raise BackendError(f"backend={name!r} is unknown; expected one of 'auto', " + ", ".join(repr(n) for n in NAMES))
    with _lock:
        if name not in _instances:
            try:
                module = load(name, "graphs")
            except ImportError as exc:
                raise BackendError(
                    f"backend={name!r} needs the {name} package, which cannot be imported ({exc}); "
                    f"install it (pip install 'graphjit[{name}-cpu]' or the GPU build)") from exc
            _instances[name] = getattr(module, _CLASSES[name])()
        return _instances[name]


cached_type_lookup = _by_type.get
"""``cached_type_lookup(tp, default)``: the backend of an already seen type, without the slow path."""
type_cache = _by_type
"""The dict behind :data:`cached_type_lookup` (cleared, never replaced): the replay lane's C checks look it up."""


def for_type(tp: type) -> Backend | None:
    """The backend whose tensor class ``tp`` is (or derives from), or None for a non-tensor type."""
    try:
        return _by_type[tp]
    except KeyError:
        pass
    found: Backend | None = None
    for name in NAMES:
        module = sys.modules.get(name)
        if module is None:
            continue
        tensor_cls = getattr(module, "Tensor", None)
        if isinstance(tensor_cls, type) and issubclass(tp, tensor_cls):
            found = get(name)
            break
    _by_type[tp] = found
    return found


_IDENTITY_KEYED = (
    ("torch", "torch.nn", "Module"), ("torch", "torch.optim", "Optimizer"),
    ("torch", "torch.optim.lr_scheduler", "LRScheduler"), ("torch", "torch.optim.lr_scheduler", "ReduceLROnPlateau"),
    ("torch", "torch.amp", "GradScaler"),
    ("paddle", "paddle.nn", "Layer"), ("paddle", "paddle.optimizer", "Optimizer"),
    ("paddle", "paddle.optimizer.lr", "LRScheduler"), ("paddle", "paddle.amp", "GradScaler"),
)
_KEYED: dict[type, bool] = {}


def identity_keyed(tp: type) -> bool:
    """True for a framework's stateful object class: a module/layer (``torch.nn.Module``, ``paddle.nn.Layer``),
    an optimizer, a learning-rate scheduler, a gradient scaler.  Such objects are keyed by identity and never
    walked attribute by attribute as arguments: their tensors are state, captured by address, and the Python
    values their code reads are guarded (only frameworks already imported are checked)."""
    known = _KEYED.get(tp)
    if known is not None:
        return known
    found = False
    for top, module_name, cls_name in _IDENTITY_KEYED:
        if top not in sys.modules:
            continue
        module = sys.modules.get(module_name)
        base = getattr(module, cls_name, None) if module is not None else None
        if isinstance(base, type) and issubclass(tp, base):
            found = True
            break
    if found or all(top in sys.modules for top, _m, _c in _IDENTITY_KEYED):
        _KEYED[tp] = found  # a framework imported later could still claim the type
    return found


def shield_from_compilers() -> None:
    """Keep the compilers of already-imported frameworks out of graphjit's own code (torch: Dynamo's skip list,
    :func:`graphjit.backends.torch.breaks.shield`, at once where Dynamo is imported and otherwise as soon as it
    is: it does not import Dynamo), before any graphed call can run under one."""
    if "torch" in sys.modules:
        load("torch", "breaks").shield()


def translating() -> bool:
    """True while an instantiated backend's framework is translating code (e.g. Paddle's AST
    to_static re-running a function's decorators in static mode)."""
    for backend in _instances.values():
        if backend.translating():
            return True
    return False


def imported() -> list[str]:
    """Names of the frameworks the program has imported."""
    return [n for n in NAMES if n in sys.modules]


def is_tensor(obj: Any) -> bool:
    return for_type(type(obj)) is not None


__all__ = ["JOBS", "NAMES", "Backend", "GraphHandle", "for_type", "get", "imported", "is_tensor", "load", "module_name",
           "shield_from_compilers"]
