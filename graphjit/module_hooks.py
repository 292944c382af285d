"""The hooks of the framework's Module/Layer objects a graphed call reaches, checked with its guards.

A module's forward and backward hooks run inside its call: a graph captured while a hook was registered holds the
hook's kernels, and one captured without it has none.  A hook registered after the capture
(``m.register_forward_hook(f)``, torch's ``register_module_forward_hook(f)``, Paddle's
``register_forward_post_hook(f)``) or removed after it must therefore not replay that graph.  Such a call acts as a
call whose read values changed (:mod:`graphjit.variants`): the hooks' state is one of the values
(:meth:`HookWatch.state`), so a graph of the new hooks is captured once they settle (its warmup calls run them) and
the old graph serves again if they are removed (torch's ``compile`` tracer included: Dynamo compiles the call again
with the hook).  With a tracer whose program froze the Python it ran (Paddle's ``ast``) the call runs the Python
function uncaptured, as for any read value.

Cost per replay (:meth:`HookWatch.holds`): one read of the framework's count of hook registrations (torch's
``RemovableHandle.next_id``, Paddle's ``HookRemoveHelper.next_hook_id``) and the length of each hook dict that held
hooks at capture (a removal moves no count).  Only where the count moved (a hook registered anywhere: a tensor hook
too, which ``register_full_backward_hook`` makes in every eager forward) are the dicts compared: those empty at
capture by their truth value, the others by their keys (about 20 ns and 0.1 us a dict); the new count is remembered
where they hold.  Where they do not, the dicts that differed are remembered with the count: until one of them
changes or the count moves again, the watch fails at the cost of the fast path (a key whose hooks changed for good
lets its other graph serve without comparing every dict on every call).

What is watched: the dicts the backend names (:attr:`~graphjit.backends.base.Backend.hook_holders`) of every module
the guard scan reached and of every module below those (named by the code or not: ``getattr(self, name)(x)`` and
``self.children()`` run unnamed submodules), and the framework's global module hooks
(:meth:`~graphjit.backends.base.Backend.global_hooks`).  Not watched: tensor hooks (``t.register_hook``), entries
written into the dicts directly and dicts replaced (private API), hooks of a module the scan did not reach
(one only a ``functools.partial``'s bound arguments hold), and ``graphed_layer``'s recorded graphs (no guards).
A graphed ``forward`` method does not watch its own module's hooks: ``Module.__call__`` runs them outside it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from .reach import Path, describe


class HookWatch:
    """The hook dicts of one captured graph and their keys at capture (see the module docstring)."""

    __slots__ = ("count", "dicts", "empty", "expected", "failed", "filled", "paths", "seen")

    def __init__(self, found: list[tuple[dict[Any, Any], Path]], count: Callable[[], int]) -> None:
        self.dicts = [d for d, _p in found]
        self.paths = [p for _d, p in found]
        self.expected = self.state()
        self.count = count
        self.seen = count()
        self.empty = [d for d in self.dicts if not d]  # compared by truth value: any() of them, in C
        self.filled = [(d, tuple(d)) for d in self.dicts if d]  # a removal from these moves no count: sized each time
        self.failed: tuple[int, list[tuple[dict[Any, Any], int]]] | None = None  # (count, the dicts that differed)

    def state(self) -> tuple[tuple[Any, ...], ...]:
        """The keys of every watched dict, in order (hashable: a part of the graph's read values)."""
        return tuple(tuple(d) for d in self.dicts)

    def holds(self) -> bool:
        """True while the watched dicts hold the hooks they held at capture."""
        for d, keys in self.filled:
            if len(d) != len(keys):
                return False
        now = self.count()
        if now == self.seen:
            return True
        failed = self.failed
        if failed is not None and failed[0] == now and all(len(d) == n for d, n in failed[1]):
            return False  # nothing registered, nothing removed where it differed: it still differs
        if not any(self.empty) and all(tuple(d) == keys for d, keys in self.filled):
            self.seen, self.failed = now, None
            return True
        self.failed = (now, [(d, len(d)) for d, keys in zip(self.dicts, self.expected) if tuple(d) != keys])
        return False

    def differences(self) -> Iterator[tuple[str, str, str]]:
        """``(path, hooks at capture, hooks now)`` of each watched dict that changed."""
        for d, path, keys in zip(self.dicts, self.paths, self.expected):
            now = tuple(d)
            if now != keys:
                yield describe(path), _hooks(keys), _hooks(now)


def collect_hooks(d: dict[str, Any], path: Path, holders: tuple[str, ...], children: tuple[str, ...],
                  out: dict[int, tuple[dict[Any, Any], Path]]) -> None:
    """Add to ``out`` the hook dicts (``holders``) of the object whose instance dict is ``d`` and of every module below
    it through ``children`` (``_modules``), by ``id``; a module whose dicts are in ``out`` already is not walked
    again, nor is anything below it."""
    stack = [(d, path)]
    while stack:
        d, path = stack.pop()
        new = False
        for h in holders:
            hooks = d.get(h)
            if isinstance(hooks, dict) and id(hooks) not in out:
                out[id(hooks)] = (hooks, (*path, (".", h)))
                new = True
        if not new:
            continue
        for c in children:
            subs = d.get(c)
            if isinstance(subs, dict):
                for k, sub in subs.items():
                    sd = getattr(sub, "__dict__", None)
                    if isinstance(sd, dict):
                        stack.append((sd, (*path, (".", c), ("[]", k))))


def watch(found: dict[int, tuple[dict[Any, Any], Path]], backend: Any, outside: bool = False) -> HookWatch | None:
    """A :class:`HookWatch` of the module hook dicts a scan ``found`` and the backend's global ones; None where the
    scan reached no module or the backend cannot count hook registrations.  ``outside``: the graphed function is the
    ``forward`` of the object the scan calls ``self``: that object's own hooks run outside it (``Module.__call__``
    runs them around ``forward``), so they are not watched (another method that calls ``self(x)`` runs them inside,
    and watches them)."""
    count = backend.hook_count()
    if outside:
        found = {k: (d, p) for k, (d, p) in found.items() if not of_self(p)}
    if count is None or not found:
        return None
    return HookWatch([*found.values(), *backend.global_hooks()], count)


def of_self(path: Path) -> bool:
    """``path`` (a hook dict's, as :func:`collect_hooks` found it) is a dict of the object the scan calls ``self``
    itself, not of a module below it: where the graphed function is that object's ``forward``, its hooks run outside."""
    return len(path) == 2 and path[0] == "self"


def _hooks(keys: tuple[Any, ...]) -> str:
    return f"{len(keys)} hook{'s' if len(keys) != 1 else ''}"
