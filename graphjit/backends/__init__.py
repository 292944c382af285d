"""Backend registry: picks the framework from the tensors of a call, imports it only on demand.

These modules are the only place where graphjit imports paddle or torch.  Detection by type looks
only at frameworks the program already imported (``sys.modules``), so graphjit never imports a
framework the user did not.

The modules named ``*bench*`` hold the framework code of ``python -m graphjit bench`` (see
:mod:`graphjit.bench`); the registry never imports them.
"""

from __future__ import annotations

import importlib
import sys
import threading
from typing import Any

from ..errors import BackendError
from .base import Backend, GraphHandle

NAMES = ("paddle", "torch")
_MODULES = {"paddle": ".paddle", "torch": ".torch"}
_CLASSES = {"paddle": "PaddleBackend", "torch": "TorchBackend"}

_lock = threading.Lock()
_instances: dict[str, Backend] = {}
_by_type: dict[type, Backend | None] = {}


def get(name: str) -> Backend:
    """The backend called ``name``; raises :class:`BackendError` if it is unknown or not installed."""
    backend = _instances.get(name)
    if backend is not None:
        return backend
    if name not in _MODULES:
        raise BackendError(f"backend={name!r} is unknown; expected one of 'auto', " + ", ".join(repr(n) for n in NAMES))
    with _lock:
        if name not in _instances:
            try:
                module = importlib.import_module(_MODULES[name], __name__)
            except ImportError as exc:
                raise BackendError(
                    f"backend={name!r} needs the {name} package, which cannot be imported ({exc}); "
                    f"install it (pip install 'graphjit[{name}-cpu]' or the GPU build)") from exc
            _instances[name] = getattr(module, _CLASSES[name])()
        return _instances[name]


cached_type_lookup = _by_type.get
"""``cached_type_lookup(tp, default)``: the backend of an already seen type, without the slow path."""


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


_IDENTITY_KEYED = (("torch", "torch.nn", "Module"), ("paddle", "paddle.nn", "Layer"))


def identity_keyed(tp: type) -> bool:
    """True for a framework's module/layer class (``torch.nn.Module``, ``paddle.nn.Layer``): keyed by
    identity, never walked attribute by attribute (only frameworks already imported are checked)."""
    for top, module_name, cls_name in _IDENTITY_KEYED:
        if top not in sys.modules:
            continue
        module = sys.modules.get(module_name)
        base = getattr(module, cls_name, None) if module is not None else None
        if isinstance(base, type) and issubclass(tp, base):
            return True
    return False


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


__all__ = ["NAMES", "Backend", "GraphHandle", "for_type", "get", "imported", "is_tensor"]
