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


def count_rebinds() -> bool:
    """Install the hooks once per process; False on a torch without them."""
    with _lock:
        if not _installed:
            hooks = torch.nn.modules.module
            try:
                hooks.register_module_buffer_registration_hook(note_rebind)
                hooks.register_module_parameter_registration_hook(note_rebind)
                hooks.register_module_module_registration_hook(note_rebind)
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
