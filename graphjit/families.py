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

Before the capture, the keys of one class share their warmup runs (:func:`rebased`): a key whose call differs
from the previous call's warming key only in such counters, each in the class it had there, takes that key's warmup
record over, its advances moved to the new values.  So they do inside a capture scope, where each value's own call
only warms its key up (a scope's extra runs would start from the next value): the class captures there as outside,
and leaves no record per value that would keep its values from sharing after the scope.  A decode loop then warms
up on its first two positions and captures on the third, as a key without counters does, where each position
otherwise warmed up on its own (no graph before the third ``generate()``: every position is seen once per call).
The value that captures first runs once on its own, watched and undone
(:meth:`graphjit.family_calls.FamilyCalls.own_value_run`): one that writes what the others did not is refused.  The
capture's verify and the family's proof on the next value check the graph as before.  A failure (a sync, a refused
capture) fails the class: the values whose warmups the record held, and the next values of the class, run uncaptured
with its reason (:attr:`Families.failed_class`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from . import scope as scope_mod
from .advances import Advances, Target, put, value_at
from .leaves import Label, Leaves, changes
from .recheck import against_eager
from .stats import State

if TYPE_CHECKING:
    from .backends.base import Backend
    from .buffers import KeyEntry
    from .keys import CallSignature
    from .stats import KeyStats
    from .warmup import Warmup

__all__ = ["COUNTERS", "NOT_MEMBER", "Families", "Family", "classify", "rebased"]

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


def rebased(adv: Advances, old: Leaves, new: Leaves, args: tuple[Any, ...],
            kwargs: dict[str, Any]) -> Advances | None:
    """The advances ``adv`` of a key (its named leaves ``old``: a family's captured key, or a warming key whose runs
    found them), moved to a call whose leaves ``new`` differ from them only in ``int`` counters with a class
    (:data:`COUNTERS`), each in the class it had there for the same step: the same scalars, each counted one starting
    from this call's value.  None where the leaves are the same or differ in anything else, a counter leaves its
    class, or this call holds the scalars in places shared otherwise (:meth:`~graphjit.advances.Advances.targets`):
    the call's key is then not the family's, or warms up on its own."""
    diff = changes(old, new)
    targets = adv.targets(args, kwargs) if diff else None
    if targets is None:
        return None
    index = {item.label: i for i, item in enumerate(adv.items)}
    items = list(adv.items)
    for change in diff:
        i = index.get(change.label)
        if i is None:
            return None
        item, target = items[i], targets[i]
        value = value_at(target)
        if type(item.before) is not int or type(item.after) is not int or type(value) is not int or \
                repr(value) != change.new:
            return None
        step = item.after - item.before
        cls = classify(target, value, step)
        if cls is None or cls != classify(target, item.before, step):
            return None
        items[i] = replace(item, before=value, after=value + step)
    return Advances(items, adv.paths, adv.layout)


NOT_MEMBER: Any = object()
"""What :meth:`Families.call` returns for a call no family serves."""


@dataclass
class Family:
    """A captured key whose counters (its advances' ``counted`` items) pick branches only."""

    key: tuple[Any, ...]
    entry: KeyEntry
    leaves: dict[Label, str]  # the captured key's named leaves
    verified: bool = False
    members: list[tuple[Any, ...]] = field(default_factory=list)


class Families:
    """One graphed function's families (see the module docstring)."""

    def __init__(self) -> None:
        self.items: list[Family] = []
        self.dropped: set[tuple[Any, ...]] = set()  # captured keys whose family failed its proof
        # the last key that failed with counters found (its advances, the reason): the next value of their class
        # fails alike (take_over)
        self.failed_class: tuple[tuple[Any, ...], Advances, str] | None = None
        # the inputs (indices of a key's tensors) that moved under a family member: a recaptured counter's keys copy
        # them in and back instead of adopting them, so that two caches in turn settle (lifecycle.recapture)
        self.moved: frozenset[int] = frozenset()

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
        self.items.append(Family(key, entry, dict(leaves)))

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
            if rebased(adv, fam.leaves, leaves, args, kwargs) is None:
                continue
            if fam.entry.check is not None and not fam.entry.check():
                continue
            return fam
        return None

    def take_over(self, warming: dict[tuple[Any, ...], Warmup], records: Mapping[Any, Any],
                  rows: dict[tuple[Any, ...], KeyStats], previous: tuple[Any, ...] | None, sig: CallSignature,
                  args: tuple[Any, ...], kwargs: dict[str, Any], backend: Backend,
                  fits: Callable[[Backend, CallSignature, Warmup], bool]) -> Warmup | str | None:
        """What the new key of ``sig`` inherits from the previous call's key (``previous``) where the two differ only
        in counters of one class (:func:`rebased`; ``records``: the keys' named leaves,
        :class:`graphjit.history.KeyHistory`):

        * ``previous`` is warming up: its record, whose runs count as this key's, where ``fits(backend, sig,
          record)`` (a run of the capturing value's own can be undone before its capture); the old key's row in
          ``rows`` (stats) goes, its warmups counted in this key's, and the old key shares the record's verdict
          (:attr:`Warmup.shared`);
        * ``previous`` failed its warmups or its capture (:attr:`failed_class`): the reason, under which this key
          runs uncaptured without warming up (the class takes the same branches).

        None, and nothing changes, where they differ otherwise, or once a family of this function failed its proof
        (its counter is read into the data: each value warms up on its own)."""
        if previous is None or self.dropped:
            return None
        key = sig.key
        old, new = records.get(previous), records.get(key)
        if old is None or new is None:
            return None
        failed = self.failed_class
        if failed is not None and failed[0] == previous:
            adv = rebased(failed[1], old.leaves, new.leaves, args, kwargs)
            if adv is not None:
                self.failed_class = (key, adv, failed[2])
                return failed[2]
            return None
        warm = warming.get(previous)
        if warm is None or warm.advances is None or warm.blocked is not None:
            return None
        adv = rebased(warm.advances, old.leaves, new.leaves, args, kwargs)
        if adv is None or not fits(backend, sig, warm):  # fits reads the record's inputs at this call's: same layout
            return None
        warm.advances, warm.shared = adv, [*warm.shared, previous]
        warming[key] = warming.pop(previous)
        was, st = rows.pop(previous, None), rows.get(key)
        if was is not None and st is not None:
            st.warmups += was.warmups
        return warm

    def failed(self, key: tuple[Any, ...], warm: Warmup | None, reason: str) -> None:
        """``key`` failed its warmups or its capture under ``reason``: where its record found counters, the next
        value of their class fails alike (:meth:`take_over`)."""
        if warm is not None and warm.advances is not None:
            self.failed_class = (key, warm.advances, reason)

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
        """``entry`` is being released: no key may keep replaying it (its family's key and members included)."""
        for fam in [f for f in self.items if f.entry is entry]:
            self.drop(fam, entries)
            self.dropped.discard(fam.key)
        for key in [k for k, e in entries.items() if e is entry]:
            del entries[key]


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
