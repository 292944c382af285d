"""What the custom all-reduce counts (:class:`Stats`, process-wide: :data:`STATS`) and what ``init`` reports
(:class:`Report`)."""

from __future__ import annotations

import logging
import threading
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

log = logging.getLogger("graphjit")


class Stats:
    """Counters of every call the swap saw (process-wide)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.clear()

    def clear(self) -> None:
        self.eager = 0
        self.captured = 0
        self.fallbacks: Counter[str] = Counter()
        self.details: dict[str, str] = {}
        self.registered = 0
        self.registrations = 0
        self.said: set[str] = set()

    def fallback(self, key: str, detail: str) -> None:
        with self.lock:
            self.fallbacks[key] += 1
            first = key not in self.details
            if first:
                self.details[key] = detail
        if first:
            level = logging.DEBUG if key in ("scope", "static mode") else logging.INFO
            log.log(level, "graphjit all-reduce: the framework's collective runs (%s: %s)", key, detail)

    def as_dict(self) -> dict[str, Any]:
        with self.lock:
            return {"custom": {"eager": self.eager, "captured": self.captured},
                    "fallbacks": dict(self.fallbacks), "reasons": dict(self.details),
                    "registered": self.registered, "registrations": self.registrations}


STATS = Stats()


@dataclass(frozen=True)
class Report:
    """What ``init`` set up (``enabled``) or why not (``reason_key``, ``reason``)."""

    enabled: bool
    reason_key: str | None
    reason: str | None
    backend: str
    rank: int
    world_size: int
    max_bytes: int
    scope: str
    device: int | None = None
    arch: str | None = None
    library: str | None = None

    def __bool__(self) -> bool:
        return self.enabled

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
