"""The per-call timer of the host-cost probes (``host_cost_emulated.py``, ``host_cost_paddle_emulated.py`` and, through
the first, ``hf_decode_host_emulated.py``); imports no framework."""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from typing import Any


def per_call_us(fn: Callable[[], Any], iters: int = 20000, repeats: int = 9, warm: int = 0) -> float:
    """Microseconds a call of ``fn``: the median of ``repeats`` timings of ``iters`` calls each, the collector off,
    after ``warm`` untimed calls."""
    for _ in range(warm):
        fn()
    samples = []
    gc.disable()
    try:
        for _ in range(repeats):
            t0 = time.perf_counter_ns()
            for _ in range(iters):
                fn()
            samples.append((time.perf_counter_ns() - t0) / iters / 1000)
    finally:
        gc.enable()
    return round(statistics.median(samples), 3)
