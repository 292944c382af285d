"""torch's side of the guards' held tensors (:func:`graphjit.guard_set.note_rebind`): the global registration hooks
through which every module tells when it rebinds a parameter or buffer (``m.b = t``, ``register_buffer``, a new
``Parameter``), so a replay compares the tensors its graph holds only after one did.

Not told (and so not caught): a ``_parameters`` / ``_buffers`` dict written directly, a parameter set to None, a
tensor's storage replaced in place (``p.data = ...``, ``module.half()``)."""

from __future__ import annotations

import threading

import torch

from ...guard_set import note_rebind

_lock = threading.Lock()
_installed: list[bool] = []


def count_rebinds() -> bool:
    """Install the hooks once per process; False on a torch without them."""
    with _lock:
        if not _installed:
            hooks = torch.nn.modules.module
            try:
                hooks.register_module_buffer_registration_hook(note_rebind)
                hooks.register_module_parameter_registration_hook(note_rebind)
                _installed.append(True)
            except AttributeError:
                _installed.append(False)
        return _installed[0]
