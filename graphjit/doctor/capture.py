"""The capture-and-replay row every framework's check ends with: did a tiny function graphed through
:func:`graphjit.graphed` capture once, replay, and match eager (framework-neutral: it reads only the
numbers the framework's check measured and ``GraphedFunction.stats()``)."""

from __future__ import annotations

from typing import Any

from .context import Context
from .report import FAIL, PASS, SKIP


def graphed_row(ctx: Context, section: str, check: str, gpu: bool, device: str, stats: dict[str, Any],
                worst: float, calls: int, tol: float, tag: str | None = None) -> None:
    """Add the capture-and-replay row and record its status in ``ctx.captures[tag]``: a failure above ``tol``
    (relative error against eager), a skip without a GPU, a pass for 1 graph replayed on every call after its
    warmup calls without fallbacks, else a failure with the fallback reasons."""
    r = ctx.report
    tag = tag or section
    data: dict[str, Any] = {"device": device, "stats": stats, "max_rel_error": worst, "calls": calls}
    if worst > tol:
        ctx.captures[tag] = FAIL
        r.add(section, check, FAIL, f"on {device}: graphed result differs from eager by {worst:.3g} (relative)",
              "report this as a graphjit bug, with GRAPHJIT_DEBUG=1 output", **data)
        return
    if not gpu:
        ctx.captures[tag] = SKIP
        reasons = "; ".join(stats.get("fallbacks", {})) or "none recorded"
        r.add(section, check, SKIP, f"not captured (no GPU for {section}); graphed ran the traced function and "
              f"matched eager ({calls} calls; {reasons})", **data)
        return
    warmups = sum(k.get("warmups", 0) for k in stats.get("keys") or [])
    if stats.get("graphs") == 1 and stats.get("replays", 0) + warmups >= calls and not stats.get("fallbacks"):
        ctx.captures[tag] = PASS
        key = (stats.get("keys") or [{}])[0]
        r.add(section, check, PASS, f"on {device}: 1 graph, {stats['replays']} replays match eager "
              f"(max rel. error {worst:.1e}, capture {key.get('capture_ms', 0):.1f} ms)", **data)
        return
    ctx.captures[tag] = FAIL
    reasons = "; ".join(f"{k} x{v}" for k, v in (stats.get("fallbacks") or {}).items()) or "no replays"
    r.add(section, check, FAIL, f"on {device}: not replayed ({reasons})",
          "run with GRAPHJIT_DEBUG=1 python -m graphjit -vv doctor and report the log", **data)
