"""Paddle's module hooks as graphjit watches them (:mod:`graphjit.module_hooks`): the Layer dicts that hold the hooks
a call runs, and Paddle's count of hook registrations."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import paddle

HOLDERS = ("_forward_pre_hooks", "_forward_post_hooks")


def count() -> Callable[[], int] | None:
    """A reader of ``HookRemoveHelper.next_hook_id`` (every Layer hook registration moves it); None where this Paddle
    has no such count."""
    helper: Any = getattr(getattr(getattr(paddle.nn, "layer", None), "layers", None), "HookRemoveHelper", None)
    if not isinstance(getattr(helper, "next_hook_id", None), int):
        return None
    return lambda: helper.next_hook_id
