"""Short texts the doctor's rows are made of: an exception's last line, a list of GPU names, a GPU summary."""

from __future__ import annotations

from typing import Any


def first_line(exc: BaseException) -> str:
    """``Type: last non-empty line of the message``, at most 300 characters."""
    text = [line for line in str(exc).strip().splitlines() if line.strip()]
    return f"{type(exc).__name__}: {text[-1] if text else ''}".strip().rstrip(":")[:300]


def count_names(names: list[str]) -> str:
    """``2 x NVIDIA H200, NVIDIA A100`` (first-seen order); ``none`` for no names."""
    seen: dict[str, int] = {}
    for n in names:
        seen[n] = seen.get(n, 0) + 1
    return ", ".join(f"{c} x {n}" if c > 1 else n for n, c in seen.items()) or "none"


def gpu_text(devices: list[dict[str, Any]], driver: str | None) -> str:
    """``N GPU(s): names (sm_XX, M GiB), driver D`` for the devices a framework sees."""
    names = count_names([d["name"] for d in devices])
    caps = ", ".join(sorted({f"sm_{d['capability'].replace('.', '')}" for d in devices if d.get("capability")}))
    mem = devices[0].get("memory_gib") if devices else None
    spec = f" ({caps}" + (f", {mem:.0f} GiB" if mem else "") + ")" if caps else ""
    return f"{len(devices)} GPU(s): {names}{spec}" + (f", driver {driver}" if driver else "")
