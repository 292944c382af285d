"""Counters and reasons: what happened to each graph key of a graphed function.

``GraphedFunction.stats()`` returns :meth:`FunctionStats.as_dict`, a plain JSON-serialisable dict, so
that it can be logged, asserted on in tests, or dumped next to a benchmark.  Fallbacks are never
silent: every call that did not replay a graph is counted under a reason string.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class State(str, Enum):
    """Lifecycle of one key: WARMUP -> CAPTURE -> (verify) -> REPLAY, or FALLBACK after a failure."""

    NEW = "new"
    WARMUP = "warmup"
    CAPTURE = "capture"
    REPLAY = "replay"
    FALLBACK = "fallback"  # runs uncaptured from now on; ``reason`` says why
    EAGER = "eager"  # no CUDA graphs on this machine or backend: the traced function runs


@dataclass
class KeyStats:
    """Counters of one graph key (one input signature)."""

    label: str
    order: Any = None  # what report rows sort by (the tensors' shapes)
    state: State = State.NEW
    warmups: int = 0
    captures: int = 0
    replays: int = 0
    uncaptured: int = 0
    capture_ms: float = 0.0
    pool_bytes: int = 0
    input_copies: int = 0
    copy_backs: int = 0
    fed_replays: int = 0  # replays whose graph copied the call's tensors itself (handoff.py)
    feed: str | None = None  # who launches them: "library", "torch" (random numbers drawn), None (no feed)
    reason: str | None = None  # short: the reason its calls are counted under
    detail: str | None = None  # the full message (what happened and what to do)
    verify: str | None = None  # "passed", "off", "failed" or "skipped: why"
    state_bytes: int = 0  # bytes of the reachable tensors the function writes (what verify copies, twice)
    segments: int = 0  # captured segments (1 for a whole graph)
    islands: int = 0  # islands between them (graphjit.eager)
    guards: tuple[int, int] = (0, 0)  # (containers, values) of Python values checked before each replay
    advances: list[str] = field(default_factory=list)  # scalars of the key each replay sets (advances.py)
    members: int = 0  # other keys (values of its counters) its graph serves (families.py)
    replay_us: float = 0.0  # host time of the piecewise replays, in total
    island_us: float = 0.0  # of which in islands

    def as_dict(self) -> dict[str, Any]:
        return {
            "key": self.label,
            "state": self.state.value,
            "warmups": self.warmups,
            "captures": self.captures,
            "replays": self.replays,
            "uncaptured_calls": self.uncaptured,
            "capture_ms": round(self.capture_ms, 3),
            "pool_bytes": self.pool_bytes,
            "input_copies": self.input_copies,
            "copy_backs": self.copy_backs,
            "fed_replays": self.fed_replays,
            "feed": self.feed,
            "reason": self.reason,
            "detail": self.detail,
            "verify": self.verify,
            "state_bytes": self.state_bytes,
            "segments": self.segments,
            "islands": self.islands,
            "guarded_values": self.guards[1],
            **({"advances": list(self.advances)} if self.advances else {}),
            **({"members": self.members} if self.members else {}),
            **({"replay_us": round(self.replay_us / self.replays, 2) if self.replays else None,
                "island_us": round(self.island_us / self.replays, 2) if self.replays else None}
               if self.islands else {}),
        }


@dataclass
class FunctionStats:
    """Counters of one graphed function, over all its keys."""

    name: str
    calls: int = 0
    disabled_calls: int = 0
    nested_calls: int = 0  # calls made inside another graphed call (run as part of it)
    fallbacks: Counter[str] = field(default_factory=Counter)
    verify_skipped: Counter[str] = field(default_factory=Counter)
    keys: dict[Any, KeyStats] = field(default_factory=dict)
    tracer: str | None = None  # set when the tracer was replaced: which by which, and why
    # counts kept elsewhere until read (the replay lane's served calls, lane.py): moved in before each read, by a
    # weak method of the function's state (the stats never keep the function, nor its graphs' memory, alive)
    pending: Callable[[], Callable[[], None] | None] | None = field(default=None, repr=False, compare=False)

    def fallback(self, reason: str, calls: int = 1) -> None:
        """Count ``calls`` calls that ran without a graph, under ``reason``."""
        self.fallbacks[reason] += calls

    def as_dict(self) -> dict[str, Any]:
        flush = self.pending() if self.pending is not None else None
        if flush is not None:
            flush()
        keys = [k.as_dict() for k in self.keys.values()]
        return {
            "function": self.name,
            "calls": self.calls,
            "disabled_calls": self.disabled_calls,
            "nested_calls": self.nested_calls,
            "graphs": sum(1 for k in self.keys.values() if k.state is State.REPLAY),
            "captures": sum(k.captures for k in self.keys.values()),
            "replays": sum(k.replays for k in self.keys.values()),
            "fallbacks": dict(self.fallbacks),
            "verify_skipped": dict(self.verify_skipped),
            "tracer": self.tracer,
            "pool_bytes": max((k.pool_bytes for k in self.keys.values()), default=0),
            "keys": keys,
        }

    def report(self) -> str:
        """A short human-readable table of the counters (for logs and the command line)."""
        d = self.as_dict()
        lines = [f"{self.name}: {d['calls']} calls, {d['graphs']} graphs, {d['replays']} replays"
                 + (f", {self.nested_calls} calls inside other graphed calls" if self.nested_calls else "")]
        if self.tracer:
            lines.append(f"  tracer: {self.tracer}")
        for reason, n in sorted(self.fallbacks.items(), key=lambda item: -item[1]):
            lines.append(f"  fallback x{n}: {reason}")
        for reason, n in sorted(self.verify_skipped.items(), key=lambda item: -item[1]):
            lines.append(f"  captured without verify x{n}: {reason}")
        stuck = Counter(k.reason for k in self.keys.values() if k.state is State.WARMUP and k.reason)
        for reason, n in sorted(stuck.items(), key=lambda item: -item[1]):
            lines.append(f"  still warming up x{n} key(s): {reason}")
        details: dict[str, str] = {}
        for k in keys_sorted(self.keys.values()):
            lines.append(
                f"  [{k.state.value:8s}] {k.label}  captures={k.captures} replays={k.replays}"
                f" capture_ms={k.capture_ms:.1f}" + _pieces(k) + (f"  reason: {k.reason}" if k.reason else ""))
            if k.reason and k.detail:
                details.setdefault(k.reason, k.detail)
        lines.extend(f"  why {reason!r}: {detail}" for reason, detail in details.items())
        return "\n".join(lines)


def _pieces(k: KeyStats) -> str:
    """`` segments=3 islands=2 replay_us=.. island_us=..`` for a piecewise key (per replay, host time)."""
    if not k.islands:
        return ""
    text = f" segments={k.segments} islands={k.islands}"
    if k.replays:
        text += f" replay_us={k.replay_us / k.replays:.1f} island_us={k.island_us / k.replays:.1f}"
    return text


def keys_sorted(keys: Any) -> list[KeyStats]:
    """Keys in the order of their tensors' shapes (numerically: x[2] before x[16]), then by label."""
    return sorted(keys, key=lambda k: (k.order is None, k.order or (), k.label))
