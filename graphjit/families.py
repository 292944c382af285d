"""Keys that differ only in a counter that picks branches: one graph replayed for all of them, proven on a second one.

A key whose call advances a Python scalar of its own key (:mod:`graphjit.advances`) gets one graph per value: the
value is part of the key, since a graph froze whatever the call computed from it.  Some counters only pick a branch.
transformers' sliding-window cache layer (``StaticSlidingWindowLayer``, Gemma 2 and 3) counts its length in a
Python int, ``cumulative_length_int``, beside the tensor ``cumulative_length`` its data path reads; on a decode step
(one new token) the int decides only whether the window is full (transformers' own comment: the int is there "to
avoid data-dependent control flows").  Keyed by its value, a 64-token ``generate()`` captured 64 graphs.

A *family* is the captured key of such a counter and every key that differs from it only in that counter's value,
where the value is in the same class (:data:`COUNTERS`: for the sliding-window layer, "the window is full" or "it
is not and stays so after this call").  The family's graph serves them all: a member key is mapped to the captured
key's :class:`~graphjit.buffers.KeyEntry`, whose replays set the counter to the call's value plus the capture's step
(:meth:`graphjit.advances.Advances.counting`).

What is checked, so that a member's replay acts as one eager call:

* the class is known for the counter's holder (its class or a base named in :data:`COUNTERS`, defined in
  ``transformers``) and fixes every branch the holder takes on the counter for the key's step: a value outside every
  class stays a key of its own, as before;
* every other leaf of the member's signature equals the captured key's (its shapes, dtypes, other scalars), and the
  captured key's guards hold;
* the first member with another counter value is verified as a capture is (:func:`graphjit.recheck.against_eager`:
  the eager call, its state copied and put back, the replay, outputs, written state and generator compared) and
  its counter must be left where the eager call left it.  A graph that read the count into its data (positions
  from ``get_seq_length()``, a mask offset made inside the graph) differs there: the family is dropped, the call's
  result is the eager run's, and the counter's values are keys of their own again, as before.

Only a graph proven on two counter values replays for others.  Refused (the keys stay one per value): a key with
dynamic arguments, a variant key of read values, a counter that is not an ``int``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import scope as scope_mod
from .advances import Target, put, value_at
from .leaves import Label, changes
from .recheck import against_eager
from .stats import State

if TYPE_CHECKING:
    from .backends.base import Backend
    from .buffers import KeyEntry
    from .keys import CallSignature

__all__ = ["COUNTERS", "NOT_MEMBER", "Families", "Family", "classify"]

Classifier = Callable[[Any, int, int], Any]
"""``(holder, value, step)`` -> the value's class (hashable; None: a class of its own)."""


def _sliding_window(layer: Any, n: int, step: int) -> Any:
    """transformers' ``StaticSlidingWindowLayer``: ``update`` and ``get_mask_sizes`` branch on ``n >= max_cache_len``
    (full) and on ``n + step > max_cache_len`` (filling up on this call); its data path reads the tensor
    ``cumulative_length``.  Full: every value takes the same branches.  Not full and still not full after ``step``
    more tokens (``1 <= n`` and ``n + step <= max_cache_len``): the same branches and a mask offset of 0.  Others
    (the first call, the one that fills the window): a class of their own."""
    w = getattr(layer, "max_cache_len", None)
    if type(w) is not int or step < 1:
        return None
    if n >= w:
        return "full"
    if n >= 1 and n + step <= w:
        return "filling"
    return None


COUNTERS: dict[tuple[str, str], Classifier] = {
    ("StaticSlidingWindowLayer", "cumulative_length_int"): _sliding_window,
}
"""(class name, attribute) -> how its values fall into classes that take the same branches.  The class, or a base
of it, must be defined in a ``transformers`` module."""


def classifier(holder: Any, attr: Any) -> Classifier | None:
    """The classifier of ``holder.attr`` (:data:`COUNTERS`), or None."""
    if not isinstance(attr, str):
        return None
    for cls in type(holder).__mro__:
        fn = COUNTERS.get((cls.__name__, attr))
        if fn is not None and cls.__module__.startswith("transformers."):
            return fn
    return None


def classify(target: Target, value: Any, step: int) -> Any:
    """The class of a counter's ``value`` at ``target`` for a call that advances it by ``step``; None where it has
    none."""
    holder, is_attr, attr = target
    fn = classifier(holder, attr) if is_attr else None
    if fn is None or type(value) is not int:
        return None
    return fn(holder, value, step)


NOT_MEMBER: Any = object()
"""What :meth:`Families.call` returns for a call no family serves."""


@dataclass
class Family:
    """A captured key whose counters (``counted``: advance index -> class) pick branches only."""

    key: tuple[Any, ...]
    entry: KeyEntry
    leaves: dict[Label, str]  # the captured key's named leaves
    counted: dict[int, Any]
    labels: frozenset[Label]
    verified: bool = False
    members: list[tuple[Any, ...]] = field(default_factory=list)


class Families:
    """One graphed function's families (see the module docstring)."""

    def __init__(self) -> None:
        self.items: list[Family] = []
        self.dropped: set[tuple[Any, ...]] = set()  # captured keys whose family failed its proof

    def found(self, key: tuple[Any, ...], entry: KeyEntry, leaves: dict[Label, str] | None, args: tuple[Any, ...],
              kwargs: dict[str, Any]) -> None:
        """After ``key``'s capture with advances: a family where some of its scalars are counters with a class.
        ``args``/``kwargs``: the capturing call's, as its run left them."""
        adv = entry.advances
        if adv is None or leaves is None or key in self.dropped:
            return
        targets = adv.targets(args, kwargs)
        if targets is None:
            return
        counted = {}
        for i, (item, target) in enumerate(zip(adv.items, targets)):
            if type(item.before) is int and type(item.after) is int:
                cls = classify(target, item.before, item.after - item.before)
                if cls is not None:
                    counted[i] = cls
        if not counted:
            return
        entry.advances = adv.counting(frozenset(counted))
        self.items.append(Family(key, entry, dict(leaves), counted,
                                 frozenset(adv.items[i].label for i in counted)))

    def member(self, sig: CallSignature, named: Callable[[], dict[Label, str]], args: tuple[Any, ...],
               kwargs: dict[str, Any]) -> Family | None:
        """The family serving this call, of a key without a graph: it differs from the family's key only in counted
        scalars, each in the class it had there, and the family's guards hold."""
        if sig.base is not None or sig.dynamic:
            return None
        leaves = None
        for fam in self.items:
            adv = fam.entry.advances
            if adv is None or fam.entry.stats.state is not State.REPLAY:
                continue
            if leaves is None:
                leaves = named()
            diff = changes(fam.leaves, leaves)
            if not diff or any(c.label not in fam.labels for c in diff):
                continue
            targets = adv.targets(args, kwargs)
            if targets is None or any(
                    classify(targets[i], value_at(targets[i]), adv.items[i].after - adv.items[i].before) != cls
                    for i, cls in fam.counted.items()):
                continue
            if fam.entry.check is not None and not fam.entry.check():
                continue
            return fam
        return None

    def drop(self, fam: Family, entries: dict[tuple[Any, ...], KeyEntry]) -> None:
        """The family no longer serves other keys: its members' keys are forgotten (their next calls are keys of their
        own), its key replays by exact values again."""
        if fam in self.items:
            self.items.remove(fam)
        self.dropped.add(fam.key)
        for k in fam.members:
            if entries.get(k) is fam.entry:
                del entries[k]
        fam.members.clear()
        adv = fam.entry.advances
        if adv is not None:
            fam.entry.advances = adv.counting(frozenset())

    def forget(self, entry: KeyEntry, entries: dict[tuple[Any, ...], KeyEntry]) -> None:
        """``entry`` is being released: no key may keep replaying it."""
        for fam in [f for f in self.items if f.entry is entry]:
            self.drop(fam, entries)
            self.dropped.discard(fam.key)


def prove(fam: Family, sig: CallSignature, backend: Backend, run: Callable[[], Any], lock: Any,
          args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str | None, Any]:
    """The family's first call with another counter value: ``run()`` (the eager call) against the family's replay
    (:func:`graphjit.recheck.against_eager`), the counters compared with where the eager call left them.  Returns
    ``(problem, result)``: on a problem, the result and the state (counters too) are the eager run's."""
    entry = fam.entry
    adv = entry.advances
    assert adv is not None
    targets = adv.targets(args, kwargs)
    assert targets is not None  # (member() read them just now)
    before = [value_at(t) for t in targets]
    eager_after: list[Any] = []

    def eager() -> Any:
        with scope_mod.graphed_call("warmup"):
            out = run()
        eager_after[:] = [value_at(t) for t in targets]
        for t, v in zip(targets, before):  # the replay's advance sets them from here
            put(t, v)
        return out

    written, paths = entry.warm.state(sig, backend)
    with lock:
        outcome, post = against_eager(backend, entry.device, written, paths, eager,
                                      lambda: entry.replay(sig, True, (args, kwargs)))
    problem = outcome.problem
    if problem is None:
        adv.apply(targets)
        now = [value_at(t) for t in targets]
        if now != eager_after:
            problem = f"the replay left its counters at {now}, the eager call at {eager_after}"
    if problem is None:
        return None, outcome.result
    post.restore()
    backend.synchronize(entry.device)
    for t, v in zip(targets, eager_after):
        put(t, v)
    entry.stats.replays -= 1  # the rejected replay was the proof's, not the call's
    return problem, outcome.reference
