"""torch's side of the guards' held tensors (:func:`graphjit.guard_set.note_rebind`): the global registration hooks
through which every module tells when it rebinds a parameter, buffer or submodule (``m.b = t``, ``register_buffer``,
a new ``Parameter``, ``m.extra = Linear(...)``), so a replay compares the tensors its graph holds (and the names its
code found absent in those dicts) only after one did; and of loaded optimizer states
(:func:`watch_loads`, :func:`graphjit.guard_set.note_load`).

Not told (and so not caught): a ``_parameters`` / ``_buffers`` dict written directly, a parameter set to None, a
tensor's storage replaced in place (``p.data = ...``, ``module.half()``)."""

from __future__ import annotations

import threading
import weakref
from typing import Any

import torch

from ...guard_set import note_load, note_rebind

_lock = threading.Lock()
_installed: list[bool] = []
_watched: weakref.WeakSet[Any] = weakref.WeakSet()  # optimizers whose load_state_dict says so (note_load)


_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None) or (lambda: False)
_CONTAINERS = (torch.nn.ModuleList, torch.nn.ModuleDict, torch.nn.Sequential)


def _module_rebound(owner: Any, name: str, _module: Any) -> None:
    """The submodule registration hook: :func:`~graphjit.guard_set.note_rebind`, but for a new entry of a module
    container while Dynamo traces it.  transformers' decoders slice their ``ModuleList`` in every forward
    (``self.layers[:n]`` makes a new one and registers each layer in it): called there from compiled code, the hook
    was a graph break that split every compiled decode step (Gemma 3 under ``tracer="compile"``: 4 Dynamo graphs where
    2 are expected).  This file is inlined by Dynamo (``breaks._INLINED``), so such a registration traces to nothing.
    Any other registration in compiled code (a rebound entry, a submodule set on a module that is no container), and
    every registration outside it, is counted as before; the buffer and parameter hooks are :func:`note_rebind`
    itself (a rebind in compiled code breaks its graph, runs eagerly and is counted).  Not counted: a new entry that
    compiled code adds to an existing container (``layers.append(m)``)."""
    if _compiling() and isinstance(owner, _CONTAINERS) and name not in owner._modules:
        return None
    note_rebind()
    return None


def count_rebinds() -> bool:
    """Install the hooks once per process; False on a torch without them."""
    with _lock:
        if not _installed:
            hooks = torch.nn.modules.module
            try:
                hooks.register_module_buffer_registration_hook(note_rebind)
                hooks.register_module_parameter_registration_hook(note_rebind)
                hooks.register_module_module_registration_hook(_module_rebound)
                _installed.append(True)
            except AttributeError:
                _installed.append(False)
        return _installed[0]


def watch_loads(obj: Any) -> bool:
    """An optimizer's ``load_state_dict`` calls :func:`~graphjit.guard_set.note_load` after it (a post hook, installed
    once per optimizer); False for other objects (a scheduler loads its state into its own ``__dict__``, in place of
    values the guards read off the object) and on a torch without such hooks."""
    if not isinstance(obj, torch.optim.Optimizer):
        return False
    with _lock:
        if obj in _watched:
            return True
        try:
            obj.register_load_state_dict_post_hook(note_load)
        except AttributeError:
            return False
        _watched.add(obj)
        return True
