"""The hooks of the framework's Module/Layer objects a graphed call reaches, checked with its guards.

A module's forward and backward hooks run inside its call: a graph captured while a hook was registered holds the
hook's kernels, and one captured without it has none.  A hook registered after the capture
(``m.register_forward_hook(f)``, torch's ``register_module_forward_hook(f)``, Paddle's
``register_forward_post_hook(f)``) or removed after it must therefore not replay that graph.  Such a call acts as a
call whose read values changed (:mod:`graphjit.variants`): the hooks' state is one of the values
(:meth:`HookWatch.state`), so a graph of the new hooks is captured once they settle (its warmup calls run them) and
the old graph serves again if they are removed.  With a tracer whose program froze the Python it ran (torch's
``compile``: Dynamo guards no hook by default) the call runs the Python function uncaptured, as for any read value.

Cost per replay (:meth:`HookWatch.holds`): one read of the framework's count of hook registrations (torch's
``RemovableHandle.next_id``, Paddle's ``HookRemoveHelper.next_hook_id``) and the length of each hook dict that held
hooks at capture (a removal moves no count).  Only where the count moved (a hook registered anywhere: a tensor hook
too) are the keys of every watched dict compared, about 0.1 us per dict, and the new count remembered.

What is watched: the dicts the backend names (:attr:`~graphjit.backends.base.Backend.hook_holders`) of every module
the guard scan reached (it follows the paths the call's code names), and the framework's global module hooks
(:meth:`~graphjit.backends.base.Backend.global_hooks`).  Not watched: tensor hooks (``t.register_hook``), entries
written into the dicts directly (private API), and hooks of a module the scan did not reach.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from .reach import Path, describe


class HookWatch:
    """The hook dicts of one captured graph and their keys at capture (see the module docstring)."""

    __slots__ = ("count", "dicts", "expected", "paths", "seen", "sized")

    def __init__(self, found: list[tuple[dict[Any, Any], Path]], count: Callable[[], int]) -> None:
        self.dicts = [d for d, _p in found]
        self.paths = [p for _d, p in found]
        self.expected = self.state()
        self.count = count
        self.seen = count()
        self.sized = [(d, len(d)) for d in self.dicts if d]  # a removal from these moves no count

    def state(self) -> tuple[tuple[Any, ...], ...]:
        """The keys of every watched dict, in order (hashable: a part of the graph's read values)."""
        return tuple(tuple(d) for d in self.dicts)

    def holds(self) -> bool:
        """True while the watched dicts hold the hooks they held at capture."""
        for d, n in self.sized:
            if len(d) != n:
                return False
        now = self.count()
        if now != self.seen:
            if self.state() != self.expected:
                return False
            self.seen = now
        return True

    def differences(self) -> Iterator[tuple[str, str, str]]:
        """``(path, hooks at capture, hooks now)`` of each watched dict that changed."""
        for d, path, keys in zip(self.dicts, self.paths, self.expected):
            now = tuple(d)
            if now != keys:
                yield describe(path), _hooks(keys), _hooks(now)


def watch(found: dict[int, tuple[dict[Any, Any], Path]], backend: Any) -> HookWatch | None:
    """A :class:`HookWatch` of the module hook dicts a scan ``found`` and the backend's global ones; None where the
    scan reached no module or the backend cannot count hook registrations."""
    count = backend.hook_count()
    if count is None or not found:
        return None
    return HookWatch([*found.values(), *backend.global_hooks()], count)


def _hooks(keys: tuple[Any, ...]) -> str:
    return f"{len(keys)} hook{'s' if len(keys) != 1 else ''}"
