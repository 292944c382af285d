"""torch: timing ``steps`` calls ``repeats`` times (CUDA events on a GPU, the host clock on the CPU smoke run)
and the result fields every grid benchmark reports (bench hf, bench piecewise)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .. import common


def timed(on_gpu: bool, repeats: int, steps: int, step: Callable[[], Any]) -> dict[str, Any]:
    """``{"status": "ok", "us_per_step", "samples_us", "host_us_per_step", "spread"}`` for ``steps`` calls of
    ``step`` per repeat (GPU time by CUDA events on a GPU; host time on the CPU)."""
    import torch

    samples, host = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        if on_gpu:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        for _ in range(steps):
            step()
        t_host = time.perf_counter() - t0
        if on_gpu:
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) * 1e3 / steps)
        else:
            samples.append(t_host * 1e6 / steps)
        host.append(t_host * 1e6 / steps)
    med = common.median(samples)
    return {"status": "ok", "us_per_step": med, "samples_us": samples, "host_us_per_step": common.median(host),
            "spread": (max(samples) - min(samples)) / med if med else None}


def graphed_stats(fn: Any, on_gpu: bool, res: dict[str, Any], keys: tuple[str, ...] = ()) -> None:
    """Add a graphed variant's counters to ``res`` (and its first key's ``keys``); on a GPU a variant that
    captured no graph or fell back is marked ``"fallback"``."""
    if not hasattr(fn, "stats"):
        return
    st = fn.stats()
    res["stats"] = {k: st.get(k) for k in ("calls", "graphs", "captures", "replays", "fallbacks")}
    guard = common.guard_cost(fn)
    if guard is not None:
        res["guard"] = guard  # host cost of checking the Python values the graph froze, per replay
    if keys:
        first = (st.get("keys") or [{}])[0]
        res["stats"].update({k: first.get(k) for k in keys})
    if on_gpu and (not st.get("graphs") or st.get("fallbacks")):
        res["status"] = "fallback"
