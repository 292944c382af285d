"""torch's module hooks as graphjit watches them (:mod:`graphjit.module_hooks`): the Module dicts that hold the hooks
a call runs, torch's global module hooks, and torch's count of hook registrations."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

HOLDERS = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks")
_GLOBAL = ("_global_forward_pre_hooks", "_global_forward_hooks", "_global_backward_pre_hooks",
           "_global_backward_hooks")


def count() -> Callable[[], int] | None:
    """A reader of ``RemovableHandle.next_id`` (every hook registration moves it: a module's, a global one, a
    tensor's); None where this torch has no such count."""
    handle = torch.utils.hooks.RemovableHandle
    return (lambda: handle.next_id) if isinstance(getattr(handle, "next_id", None), int) else None


def global_dicts() -> list[tuple[dict[Any, Any], tuple[Any, ...]]]:
    """torch's global module hook dicts (``register_module_forward_hook`` and the like), each with its path."""
    from torch.nn.modules import module

    return [(d, ("torch.nn.modules.module", (".", n))) for n in _GLOBAL
            if isinstance(d := getattr(module, n, None), dict)]
