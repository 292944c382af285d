"""What ``python -m graphjit bench allreduce`` makes of its workers' measurements: ratios, crossovers,
targets and the summary (pure: rank 0 and the tests use it), the table and the plot, and the workers'
framework-neutral side (their status, the custom kernel's counters, combining the ranks' checks and
timings).  The command line and the supervision of the workers are :mod:`graphjit.bench.allreduce`."""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

from . import common

KIB, MIB = 1 << 10, 1 << 20

# name -> (implementation, algorithm, mode)
VARIANTS: dict[str, tuple[str, str | None, str]] = {
    "nccl_eager": ("nccl", None, "eager"),
    "nccl_graph": ("nccl", None, "graph"),
    "custom_1shot_eager": ("custom", "1shot", "eager"),
    "custom_2shot_eager": ("custom", "2shot", "eager"),
    "custom_auto_eager": ("custom", "auto", "eager"),
    "custom_1shot_graph": ("custom", "1shot", "graph"),
    "custom_2shot_graph": ("custom", "2shot", "graph"),
    "custom_auto_graph": ("custom", "auto", "graph"),
    "symm_two_shot_eager": ("symm", "two_shot", "eager"),
    "symm_two_shot_graph": ("symm", "two_shot", "graph"),
}

# The targets for the custom all-reduce (auto) inside a CUDA graph: (label, applies to size, microseconds).
LATENCY_TARGETS: tuple[tuple[str, Callable[[int], bool], float], ...] = (
    ("<= 6 us up to 256 KiB", lambda s: s <= 256 * KIB, 6.0),
    ("<= 10 us at 1 MiB", lambda s: s == MIB, 10.0),
    ("<= 20 us at 4 MiB", lambda s: s == 4 * MIB, 20.0),
)

# Fallback reasons that are graphjit's choice, not a failure: larger than max_bytes, or auto sending an eager call
# above its measured crossover to the framework's collective (collectives.custom_ar.EAGER_NCCL_ABOVE).
BY_DESIGN = frozenset({"bytes > max", "crossover"})

def size_label(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", MIB), ("KiB", KIB)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"



# -- the results: ratios, crossovers, targets, summary (pure; rank 0 and the tests) -----------------
def us_of(entry: dict[str, Any], variant: str) -> float | None:
    v = entry.get("variants", {}).get(variant) or {}
    us = v.get("us_per_call")
    return float(us) if v.get("status") == "ok" and isinstance(us, (int, float)) and math.isfinite(us) else None


def _series(results: list[dict[str, Any]], variant: str) -> dict[int, float | None]:
    return {r["bytes"]: us_of(r, variant) for r in results}


def crossover(sizes: Sequence[int], a: dict[int, float | None], b: dict[int, float | None], a_name: str,
              b_name: str) -> dict[str, Any]:
    """Where ``b`` overtakes ``a``: ``from_bytes`` is the smallest measured size from which ``b`` is faster at that
    size and every larger size measured (None: ``a`` wins at the largest), with the winner per size and how often
    the winner changes along the sizes (more than once: noisy or not monotone)."""
    both = [s for s in sorted(sizes) if a.get(s) is not None and b.get(s) is not None]
    winners = {s: (b_name if b[s] < a[s] else a_name) for s in both}  # type: ignore[operator]
    start = None
    for s in reversed(both):
        if winners[s] != b_name:
            break
        start = s
    changes = sum(1 for x, y in itertools.pairwise(both) if winners[x] != winners[y])
    return {"faster": b_name, "than": a_name, "from_bytes": start,
            "from": size_label(start) if start is not None else None,
            "winner_by_size": {str(s): w for s, w in winners.items()}, "changes": changes,
            "measured_sizes": len(both)}


def finalize(data: dict[str, Any]) -> dict[str, Any]:
    """Add ``ratios``, ``crossovers``, ``targets``, ``tuning`` and ``summary`` to ``data`` (from its results)."""
    results = data.get("results", [])
    sizes = [r["bytes"] for r in results]
    s = {v: _series(results, v) for v in VARIANTS}

    def ratio(num: str, den: str) -> dict[str, float | None]:
        return {str(b): (cast(float, s[num][b]) / cast(float, s[den][b]) if s[num][b] is not None and s[den][b]
                         else None) for b in sizes}

    data["ratios"] = {
        "custom_auto_graph/nccl_graph": ratio("custom_auto_graph", "nccl_graph"),
        "custom_auto_eager/nccl_eager": ratio("custom_auto_eager", "nccl_eager"),
        "custom_2shot_graph/custom_1shot_graph": ratio("custom_2shot_graph", "custom_1shot_graph"),
        "custom_auto_graph/symm_two_shot_graph": ratio("custom_auto_graph", "symm_two_shot_graph"),
    }
    crossovers: dict[str, Any] = {}
    for mode in ("graph", "eager"):
        best = {b: min((v for v in (s[f"custom_1shot_{mode}"][b], s[f"custom_2shot_{mode}"][b]) if v is not None),
                       default=None) for b in sizes}
        crossovers[mode] = {
            "2shot_vs_1shot": crossover(sizes, s[f"custom_1shot_{mode}"], s[f"custom_2shot_{mode}"], "custom_1shot",
                                        "custom_2shot"),
            "nccl_vs_custom_auto": crossover(sizes, s[f"custom_auto_{mode}"], s[f"nccl_{mode}"], "custom_auto",
                                             "nccl"),
            "nccl_vs_best_custom": crossover(sizes, best, s[f"nccl_{mode}"], "custom_best", "nccl"),
        }
    data["crossovers"] = crossovers
    g = crossovers["graph"]
    data["tuning"] = {
        "two_shot_from_bytes": g["2shot_vs_1shot"]["from_bytes"],
        "nccl_from_bytes": g["nccl_vs_best_custom"]["from_bytes"],
        "auto_algo_by_size": {str(r["bytes"]): r.get("auto_algo") for r in results},
        "note": "in a graph: 2shot is faster than 1shot from two_shot_from_bytes on (None: never, at the sizes "
                "measured); NCCL is faster than the better custom algorithm from nccl_from_bytes on (None: never): "
                "auto's 1shot/2shot threshold and max_bytes can be set from these (world size 2)",
    }
    data["targets"] = _targets(sizes, s, _auto_chose_framework(results))
    data["summary"] = summary(data)
    return data


def fell_back_by_design(v: dict[str, Any]) -> bool:
    """Whether a variant's calls all went to the framework's collective for :data:`BY_DESIGN` reasons only."""
    return v.get("status") == "fallback" and set(v.get("fallback_reasons") or {"?": ""}) <= BY_DESIGN


def _auto_chose_framework(results: list[dict[str, Any]]) -> dict[str, set[int]]:
    """Per mode, the sizes at which custom auto handed its calls to the framework's collective by design
    (:data:`BY_DESIGN`): there auto *is* NCCL, so it cannot be slower than NCCL."""
    chose: dict[str, set[int]] = {"graph": set(), "eager": set()}
    for r in results:
        for mode in chose:
            if fell_back_by_design(r.get("variants", {}).get(f"custom_auto_{mode}") or {}):
                chose[mode].add(r["bytes"])
    return chose


def _targets(sizes: list[int], s: dict[str, dict[int, float | None]],
             framework: dict[str, set[int]]) -> dict[str, Any]:
    auto = s["custom_auto_graph"]
    latency = []
    for label, applies, target in LATENCY_TARGETS:
        rows = [{"bytes": b, "us": auto[b], "target_us": target,
                 "ok": None if auto[b] is None else bool(cast(float, auto[b]) <= target)} for b in sizes if applies(b)]
        verdicts = [r["ok"] for r in rows]
        # False: missed at a measured size; None: nothing measured, or some size not measured (see "sizes")
        ok = False if False in verdicts else (True if verdicts and None not in verdicts else None)
        latency.append({"target": label, "target_us": target, "sizes": rows, "ok": ok})
    never_slower = {}
    for mode in ("graph", "eager"):
        a, n = s[f"custom_auto_{mode}"], s[f"nccl_{mode}"]
        slower = [b for b in sizes if a[b] is not None and n[b] is not None and cast(float, a[b]) > cast(float, n[b])]
        chose = framework[mode]
        missing = [b for b in sizes if (a[b] is None or n[b] is None) and b not in chose]
        measured = len(sizes) - len(missing)
        never_slower[mode] = {"ok": (not slower and not missing) if measured else None, "slower_at": slower,
                              "not_measured": missing, "framework_by_design": sorted(chose)}
    return {"custom_auto_graph_latency": latency, "auto_never_slower_than_nccl": never_slower,
            "definition": "latency targets: custom auto inside a CUDA graph (variant custom_auto_graph); "
                          "never slower: custom_auto_<mode> <= nccl_<mode> at every measured size"}


def summary(data: dict[str, Any]) -> dict[str, Any]:
    """Problems: an error, a wrong result, and on GPUs a NCCL or custom variant that did not run (fallback,
    skipped; a fallback only for :data:`BY_DESIGN` reasons is graphjit's choice and not a problem).  torch's symmetric
    memory is a reference: skipped or failed, it is a note.  On the CPU smoke run only ``nccl_eager`` (gloo)
    must run."""
    on_gpu = data.get("device") == "cuda"
    problems: list[str] = []
    notes: list[str] = []
    for r in data.get("results", []):
        for name, v in r.get("variants", {}).items():
            st = v.get("status")
            where = f"{size_label(r['bytes'])} {name}"
            must_run = name == "nccl_eager" or (on_gpu and VARIANTS[name][0] in ("nccl", "custom"))
            if st == "error":
                (problems if VARIANTS[name][0] != "symm" else notes).append(f"{where}: error: {v.get('error')}")
            elif st == "fallback" and must_run and not fell_back_by_design(v):
                # (larger than --ar-max-bytes: graphjit sends it to NCCL by design; recorded, not a problem)
                problems.append(f"{where}: fell back to the framework's collective: {v.get('fallback_reasons')}")
            elif st == "skipped" and must_run and not str(v.get("reason", "")).startswith("shared-GPU smoke run"):
                problems.append(f"{where}: skipped: {v.get('reason')}")
            chk = v.get("check")
            if chk and chk.get("correct") is False:
                problems.append(f"{where}: differs from {chk.get('against')}: max abs diff {chk.get('max_abs_diff')} "
                                f"> {chk.get('tol')}")
    if not data.get("results"):
        problems.append("no size was measured")
    return {"ok": not problems, "problems": problems, "notes": notes}


# -- table and plot (rank 0) -----------------------------------------------------------------------
SHORT = {"fallback": "fb", "skipped": "skip", "error": "err"}


def variant_cell(entry: dict[str, Any], variant: str) -> Any:
    v = entry.get("variants", {}).get(variant)
    if not v:
        return None
    if v.get("status") != "ok":
        return SHORT.get(v.get("status", ""), v.get("status"))
    us = v.get("us_per_call")
    bad = (v.get("check") or {}).get("correct") is False
    return f"{us:.1f}!" if bad else us


def table(data: dict[str, Any]) -> str:
    rows = []
    ratios = data.get("ratios", {})
    for r in data.get("results", []):
        b = r["bytes"]
        target = next((t for _label, applies, t in LATENCY_TARGETS if applies(b)), None)
        auto = us_of(r, "custom_auto_graph")
        verdict = None if target is None or auto is None else ("ok" if auto <= target else "MISS")
        rg = ratios.get("custom_auto_graph/nccl_graph", {}).get(str(b))
        re_ = ratios.get("custom_auto_eager/nccl_eager", {}).get(str(b))
        rows.append([size_label(b), variant_cell(r, "nccl_eager"), variant_cell(r, "nccl_graph"),
                     variant_cell(r, "custom_1shot_graph"), variant_cell(r, "custom_2shot_graph"),
                     variant_cell(r, "custom_auto_graph"), None if rg is None else f"{rg:.2f}", target, verdict,
                     variant_cell(r, "custom_auto_eager"), None if re_ is None else f"{re_:.2f}",
                     variant_cell(r, "symm_two_shot_eager"), variant_cell(r, "symm_two_shot_graph")])
    head = ["size", "nccl eager", "nccl graph", "1shot graph", "2shot graph", "auto graph", "auto/nccl graph",
            "target us", "target", "auto eager", "auto/nccl eager", "symm eager", "symm graph"]
    return common.format_table(head, rows)


def report_lines(data: dict[str, Any]) -> list[str]:
    lines = ["(us per all-reduce, median; fb: fell back to the framework's collective (not timed), skip: skipped, "
             "err: error, !: differs from NCCL; symm: torch symmetric-memory two_shot)"]
    if data.get("shared_gpu"):
        lines.append("shared-GPU smoke run (--shared-gpu): both ranks take turns on one GPU and the framework's "
                     "all-reduce is gloo: the results are checked, the timings and targets below mean nothing")
    t = data.get("targets", {})
    parts = []
    for item in t.get("custom_auto_graph_latency", []):
        ok = item["ok"]
        missing = [size_label(r["bytes"]) for r in item["sizes"] if r["ok"] is None]
        if ok is False:
            state = "MISSED at " + ", ".join(size_label(r["bytes"]) for r in item["sizes"] if r["ok"] is False)
        elif ok:
            state = "ok"
        else:
            state = "not measured" + (f" at {', '.join(missing)}" if missing else " (size not in the sweep)")
        parts.append(f"{item['target']}: {state}")
    lines.append("targets, custom auto in a graph: " + "; ".join(parts))
    for mode, item in t.get("auto_never_slower_than_nccl", {}).items():
        if item["ok"] is None:
            state = "not measured"
        elif item["ok"]:
            state = "ok"
        else:
            bits = []
            if item["slower_at"]:
                bits.append("slower at " + ", ".join(size_label(b) for b in item["slower_at"]))
            if item["not_measured"]:
                bits.append("not measured at " + ", ".join(size_label(b) for b in item["not_measured"]))
            state = "NO: " + "; ".join(bits)
        lines.append(f"target, auto never slower than NCCL ({mode}): {state}")
    for mode, c in data.get("crossovers", {}).items():
        bits = []
        for c_item in c.values():
            if not c_item["measured_sizes"]:
                continue
            where = f"from {c_item['from']}" if c_item["from"] else "never"
            noisy = f" (winner changes {c_item['changes']}x)" if c_item["changes"] > 1 else ""
            bits.append(f"{c_item['faster']} faster than {c_item['than']}: {where}{noisy}")
        if bits:
            lines.append(f"crossovers ({mode}): " + "; ".join(bits))
    algos = {k: v for k, v in data.get("tuning", {}).get("auto_algo_by_size", {}).items() if v}
    if algos:
        picks: dict[str, list[str]] = {}
        for k, v in algos.items():
            picks.setdefault(v, []).append(size_label(int(k)))
        lines.append("auto picks: " + "; ".join(f"{a} at {', '.join(ss) if len(ss) < 4 else ss[0] + '..' + ss[-1]}"
                                                for a, ss in picks.items()))
    return lines


def plot(data: dict[str, Any], png_path: Path) -> str | None:
    results = data.get("results", [])
    sizes = [r["bytes"] for r in results]
    series: dict[str, list[float | None]] = {}
    styles: dict[str, dict[str, Any]] = {}
    colors = {"nccl": "C0", "custom_1shot": "C1", "custom_2shot": "C2", "custom_auto": "C3", "symm_two_shot": "C4"}
    for v in data.get("config", {}).get("variants", list(VARIANTS)):
        series[v] = [us_of(r, v) for r in results]
        base, mode = v.rsplit("_", 1)
        styles[v] = {"color": colors.get(base, "C5"), "linestyle": "-" if mode == "graph" else "--",
                     "marker": "o" if mode == "graph" else "s"}
        if base == "custom_auto":  # auto runs 1shot or 2shot: wide and translucent, so the line below shows
            styles[v].update(linewidth=3.5, alpha=0.4, marker="none")
    targets = [next((t for _l, applies, t in LATENCY_TARGETS if applies(b)), None) for b in sizes]
    if data.get("device") == "cuda" and any(t is not None for t in targets):
        series["target (auto, graph)"] = targets
        styles["target (auto, graph)"] = {"color": "black", "linestyle": "none", "marker": "x", "markersize": 6}
    cfg = data.get("config", {})
    env = data.get("env", {}).get("torch", {})
    title = (f"all-reduce, {data.get('world_size')} ranks, {cfg.get('dtype')}, {cfg.get('backend')} ({data.get('tag')}"
             f"{', ' + env['gpu'] if env.get('gpu') else ''})")
    return common.line_plot(png_path, title, sizes, series, "message size", "microseconds per all-reduce (median)",
                            log_x=True, log_y=True, x_labels=[size_label(b).replace(" ", "") for b in sizes],
                            styles=styles,
                            notes=[f"graph: {cfg.get('iters')} all-reduces captured in one graph, replayed once; "
                                   f"eager (dashed): {cfg.get('iters')} back-to-back calls; median of "
                                   f"{cfg.get('repeats')}, max over ranks; custom max_bytes {cfg.get('ar_max_bytes')}"])


# -- the workers' side, framework-neutral (the worker: graphjit.bench.torch.allreduce) ------
class WorkerStatus:
    """This rank's progress file (stage, error), read by the command when something goes wrong."""

    def __init__(self, path: Path, rank: int) -> None:
        self.path = path
        self.data: dict[str, Any] = {"rank": rank, "stage": "start", "done": False}
        self.save()

    def stage(self, text: str) -> None:
        self.data["stage"] = text
        self.save()

    def fail(self, exc: BaseException) -> None:
        self.data["error"] = common.error_text(exc)
        self.data["failed_at"] = time.time()  # the first rank to fail is usually the cause
        self.data["traceback"] = common.traceback_tail(exc, 20)
        self.save()

    def save(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        with contextlib.suppress(OSError):
            tmp.write_text(json.dumps(self.data, default=str))
            os.replace(tmp, self.path)


def custom_delta(before: dict[str, Any], after: dict[str, Any], expect: str | None) -> dict[str, Any]:
    """What graphjit's counters say about the calls between two ``collectives.stats()``: kernel calls, and the
    fallbacks with their reasons (then the status is ``fallback``)."""
    calls = {k: after["custom"][k] - before["custom"][k] for k in ("eager", "captured")}
    fallbacks = {k: n - before["fallbacks"].get(k, 0) for k, n in after["fallbacks"].items()
                 if n - before["fallbacks"].get(k, 0) > 0}
    out: dict[str, Any] = {"custom_calls": calls}
    if fallbacks:
        out["status"] = "fallback"
        out["fallback_reasons"] = {k: after["reasons"].get(k, "") for k in fallbacks}
        out["fallback_calls"] = fallbacks
    elif expect is not None and calls[expect] < 1:
        out["status"] = "fallback"
        out["fallback_reasons"] = {"not run": f"graphjit's counters show no {expect} custom all-reduce"}
    return out


def _worst(statuses: Sequence[str]) -> str:
    return "error" if "error" in statuses else ("fallback" if "fallback" in statuses else "ok")


def combine_checks(per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"status": _worst([c.get("status", "error") for c in per_rank])}
    errors = {str(r): c["error"] for r, c in enumerate(per_rank) if c.get("error")}
    if errors:
        out["error"] = next(iter(errors.values()))
        out["errors"] = errors
        out["traceback"] = next((c.get("traceback") for c in per_rank if c.get("traceback")), None)
    checks = [c["check"] for c in per_rank if c.get("check")]
    if checks:
        out["check"] = {"max_abs_diff": max(c["max_abs_diff"] for c in checks),
                        "tol": min(c["tol"] for c in checks), "against": checks[0]["against"],
                        "correct": all(c["correct"] for c in checks) and len(checks) == len(per_rank)}
    reasons: dict[str, str] = {}
    for c in per_rank:
        reasons.update(c.get("fallback_reasons") or {})
    if reasons:
        out["fallback_reasons"] = reasons
    calls = [c.get("custom_calls") for c in per_rank if c.get("custom_calls")]
    if calls:
        out["check_custom_calls"] = calls[0]
    return out


def combine_timings(per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    status = _worst([t.get("status", "error") for t in per_rank])
    out: dict[str, Any] = {"status": status}
    if status == "error":
        errors = {str(r): t["error"] for r, t in enumerate(per_rank) if t.get("error")}
        out["error"] = next(iter(errors.values()), "timing failed")
        out["errors"] = errors
        out["traceback"] = next((t.get("traceback") for t in per_rank if t.get("traceback")), None)
        return out
    if status == "fallback":
        reasons: dict[str, str] = {}
        for t in per_rank:
            reasons.update(t.get("fallback_reasons") or {})
        out["fallback_reasons"] = reasons
        out["note"] = "some timed calls ran the framework's collective: no custom timing recorded"
        return out
    medians = [t["median_us"] for t in per_rank]
    us = max(medians)
    samples = per_rank[0]["samples_us"]
    out.update({"us_per_call": us, "rank_us": medians, "samples_us": samples,
                "spread": (max(samples) - min(samples)) / medians[0] if medians[0] else None,
                "host_us_per_call": per_rank[0]["host_us_per_call"]})
    if per_rank[0].get("custom_calls"):
        out["custom_calls"] = per_rank[0]["custom_calls"]
    return out
