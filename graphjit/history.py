"""What graphjit remembers of a function's recent keys, to say what tells them apart.

Each new key's named leaves (:mod:`graphjit.leaves`) are kept for the most recent :data:`KEPT` keys.
They serve two things:

* labels: keys whose labels would look the same (they differ only in values the label does not show,
  such as a dataclass field or a counter inside a cache object) get those values appended
  (``cfg.scale=2.0``), and the keys they collide with are relabelled alike;
* reasons: a key that is still warming up when the next call comes with another signature is told
  why it has not captured: :data:`SIGNATURE_CHANGES` and the path of the first leaf that differs, with
  both values (:meth:`KeyHistory.explain`).

Nothing here runs on the replay path: only calls that make a new key add to it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, MutableMapping
from dataclasses import dataclass
from typing import Any

from .keys import Signer
from .labels import render
from .leaves import Change, Label, Leaves, changes, name, shown

SIGNATURE_CHANGES = "signature changes between calls"
"""The start of the reason of a key whose next call had another signature (the path of the difference follows)."""

KEPT = 256
"""Keys whose leaves are kept (the oldest go first)."""


@dataclass
class _Record:
    head: str  # the label's arguments half (labels.label_parts)
    modes: str  # and its modes half
    leaves: Leaves


class KeyHistory:
    """The leaves, labels and differences of one function's recent keys (see the module docstring)."""

    def __init__(self, signer: Signer, kept: int = KEPT) -> None:
        self.signer = signer
        self.kept = kept
        self.records: OrderedDict[Hashable, _Record] = OrderedDict()
        self.extras: dict[tuple[str, str], list[Label]] = {}  # per label halves: the leaves their labels add

    def add(self, key: Hashable, head: str, modes: str, leaves: Leaves,
            labels: MutableMapping[Hashable, Any]) -> str:
        """Remember a new key; its label (``labels``: the function's ``KeyStats`` by key, relabelled where they
        collide with it)."""
        self.records[key] = _Record(head, modes, leaves)
        while len(self.records) > self.kept:
            self.records.popitem(last=False)
        halves = (head, modes)
        same = [k for k, r in self.records.items() if k != key and (r.head, r.modes) == halves]
        if not same:
            return render(head, [], modes)
        extra = self.extras.setdefault(halves, [])
        for other in same:
            if self._values(other, extra) != self._values(key, extra):
                continue
            new = next((c.label for c in changes(self.records[other].leaves, leaves) if c.label not in extra), None)
            if new is not None:
                extra.append(new)
        for k in same:
            st = labels.get(k)
            if st is not None:
                st.label = self._label(k)
        return self._label(key)

    def explain(self, before: Hashable, after: Hashable, warmup: int) -> tuple[str, str]:
        """``(reason, detail)`` for key ``before``, whose call was followed by a call of key ``after``."""
        found = self._changes(before, after)
        if not found:
            return SIGNATURE_CHANGES, (
                "the next call had another signature (graphjit no longer holds what this key's call passed, so it "
                f"cannot say where they differ). {_advice(warmup)}")
        first = found[0]
        path = name(self.signer, first.label)
        more = ""
        if len(found) > 1:
            rest = [name(self.signer, c.label) for c in found[1:4]]
            more = f" (and {len(found) - 1} more: {', '.join(rest)}{', ...' if len(found) > 4 else ''})"
        detail = (f"the next call's signature differed at {path}: {shown(first.old, 80)} in this key's call, "
                  f"{shown(first.new, 80)} in the next{more}. {_advice(warmup)}")
        return f"{SIGNATURE_CHANGES}: {path}", detail

    def changed(self, before: Hashable, after: Hashable) -> str | None:
        """The path of the first leaf that differs between two kept keys (``argument 'cache'.layers[0].n``)."""
        found = self._changes(before, after)
        return name(self.signer, found[0].label) if found else None

    def note_values(self, key: Hashable, values: dict[str, str]) -> None:
        """Key ``key`` was captured with these values of what the function reads (``path -> value``), which a key
        made for other values of them shows in its label (:mod:`graphjit.guards`): so does this one."""
        record = self.records.get(key)
        if record is not None:
            for path, value in values.items():
                record.leaves.setdefault(("<read>", path), value)

    def clear(self) -> None:
        self.records.clear()
        self.extras.clear()

    def _changes(self, before: Hashable, after: Hashable) -> list[Change]:
        a, b = self.records.get(before), self.records.get(after)
        return [] if a is None or b is None else changes(a.leaves, b.leaves)

    def _values(self, key: Hashable, labels: list[Label]) -> tuple[str | None, ...]:
        leaves = self.records[key].leaves
        return tuple(leaves.get(label) for label in labels)

    def _label(self, key: Hashable) -> str:
        r = self.records[key]
        extra = self.extras.get((r.head, r.modes), [])
        return render(r.head, [f"{name(self.signer, label, short=True)}={shown(r.leaves.get(label))}"
                               for label in extra], r.modes)


def _advice(warmup: int) -> str:
    return (f"A key is captured on its call number {warmup + 1} with the same signature, so a value that changes on "
            "every call (a Python counter held by an object passed to the function, a shape that grows) keeps the "
            "function from ever capturing: pass such a value as a tensor, keep it out of the arguments (close over "
            "the object), or pad a varying dim with buckets=")
