"""The README's ``bench generate`` table from the JSON files of one or more runs.

``python -m graphjit bench generate --families ...`` writes one JSON per run; a table of every family is made of
several runs (a device call holds a few families).  This prints the README's markdown table (eager, graphed first /
transformers' compiled first, graphed, compile tracer first / HF first, compile tracer, HF compiled, their ratio,
graphs), one row per family and batch, in the order given, and says which commits the rows come from and, per
target of the issue, in how many rows it was met, which rows were over and the mean ratio: a table
meant to be "one commit" is refused (exit 1) where they differ, unless ``--mixed`` allows it.  A family and batch
measured in two files is taken from the later one, unless fewer of its variants ran there (a row cut by the time
budget keeps the earlier, whole one).  Steady states are each file's own ``steady_s`` (the median of the last
half of the calls after the first).

Usage: ``python tools/generate_table.py benchmarks/results/generate_*_torch_h200.json [--mixed]``
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, NamedTuple

NAMES = {"llama": "Llama", "qwen2": "Qwen2", "gpt2": "GPT-2", "mistral": "Mistral", "qwen3": "Qwen3", "phi3": "Phi-3",
         "qwen2_moe": "Qwen2-MoE", "mixtral": "Mixtral", "gemma2": "Gemma 2", "gemma3_text": "Gemma 3",
         "qwen2_vl": "Qwen2-VL", "t5": "T5"}
HEADER = ("| family, batch | eager | graphed first / HF compiled first | graphed | compile tracer first / HF compiled "
          "first | compile tracer | HF compiled | compile tracer / HF | graphs |")


def _num(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.3g}" if x >= 0.1 else f"{x:.3f}".rstrip("0")


def _seconds(v: dict[str, Any], name: str, which: str) -> float | None:
    """Variant ``name``'s ``which`` ("first_s", "steady_s") where it ran; else None."""
    got = v.get(name) or {}
    return got.get(which) if got.get("status") == "ok" else None


def row(label: str, variants: dict[str, Any]) -> str:
    """One table row of one family and batch (``results[label]['variants']`` of a JSON)."""
    g_first, c_first, h_first = (_seconds(variants, n, "first_s") for n in ("graphed", "graphed_compile",
                                                                             "hf_compiled"))
    eager, graphed, compiled, hf = (_seconds(variants, n, "steady_s") for n in ("eager", "graphed", "graphed_compile",
                                                                               "hf_compiled"))
    family, _, batch = label.rpartition(" B")

    def over(a: float | None, b: float | None, digits: int) -> str:
        return f" ({a / b:.{digits}f})" if a is not None and b else ""

    graphs = ((variants.get("graphed") or {}).get("stats") or {}).get("graphs")
    cells = [f"{NAMES.get(family, family)} {batch}", _num(eager),
             f"{_num(g_first)} / {_num(h_first)}{over(g_first, h_first, 3)}", _num(graphed),
             f"{_num(c_first)} / {_num(h_first)}{over(c_first, h_first, 2)}", _num(compiled), _num(hf),
             f"{compiled / hf:.2f}" if compiled is not None and hf else "-",
             str(graphs) if graphs is not None else "-"]
    return "| " + " | ".join(cells) + " |"


class Runs(NamedTuple):
    """The JSON files' rows, ``label -> (commit, entry)`` of their ``results`` (a later file's row replaces an earlier
    one's where as many of its variants ran: :func:`ran`), and the targets' limits their ``summary.targets`` name."""

    rows: dict[str, tuple[str, dict[str, Any]]]
    limits: dict[str, float]


def load(paths: list[Path]) -> Runs:
    """The rows of ``paths`` (each read once); raises ``ValueError`` for a file that is not a bench generate JSON."""
    runs = Runs({}, {})
    for path in paths:
        data = json.loads(path.read_text())
        if data.get("benchmark") != "generate":
            raise ValueError(f"{path}: not a bench generate JSON")
        commit = str((data.get("env") or {}).get("git_commit") or "unknown")
        runs.limits.update((data.get("summary") or {}).get("targets") or {})
        for label, entry in (data.get("results") or {}).items():
            if label not in runs.rows or ran(entry) >= ran(runs.rows[label][1]):
                runs.rows[label] = (commit, entry)
    return runs


def ran(entry: dict[str, Any]) -> int:
    """How many of a row's variants ran (a variant the time budget left out has the status ``skipped``)."""
    return sum(1 for v in (entry.get("variants") or {}).values() if (v or {}).get("status") == "ok")


def table(paths: list[Path] | Runs, mixed: bool = False) -> tuple[list[str], dict[str, list[str]]]:
    """The table's lines and ``commit -> labels`` of the rows (of files, or :func:`load`'s); raises ``ValueError`` for
    several commits unless ``mixed``."""
    runs = load(paths) if isinstance(paths, list) else paths
    commits: dict[str, list[str]] = {}
    lines = [HEADER, "| --- " * 9 + "|"]
    for label, (commit, entry) in runs.rows.items():
        commits.setdefault(commit, []).append(label)
        lines.append(row(label, entry.get("variants") or {}))
    if len(commits) > 1 and not mixed:
        raise ValueError("rows from several commits: " + "; ".join(f"{c}: {', '.join(ls)}" for c, ls in commits.items())
                         + " (--mixed allows it)")
    return lines, commits


TARGETS = {"graphed_vs_hf_compiled_first": "graphed first / HF compiled first",
           "graphed_compile_vs_hf_compiled_first": "compile tracer first / HF compiled first",
           "graphed_compile_vs_hf_compiled_steady": "compile tracer / HF compiled, steady"}
"""The issue's targets, as the bench names them in each row's ``ratios`` and its ``summary.targets`` (the limits)."""


def targets(paths: list[Path] | Runs) -> list[str]:
    """One line per target: in how many rows it was met, the rows over it with their ratio, and the mean ratio over
    the rows (of files, or :func:`load`'s; the ratios and limits the bench wrote)."""
    runs = load(paths) if isinstance(paths, list) else paths
    lines = []
    for name, what in TARGETS.items():
        if name not in runs.limits:
            continue
        limit = runs.limits[name]
        ratios = {label: entry["ratios"][name] for label, (_c, entry) in runs.rows.items()
                  if name in (entry.get("ratios") or {})}
        over = [f"{label} {r:.3f}" for label, r in ratios.items() if r > limit]
        mean = sum(ratios.values()) / len(ratios) if ratios else float("nan")
        lines.append(f"{what} at most {limit:g}: met in {len(ratios) - len(over)} of {len(ratios)} rows (mean "
                     f"{mean:.3f}){'; over: ' + ', '.join(over) if over else ''}")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument("--mixed", action="store_true", help="allow rows of several commits (listed after the table)")
    a = p.parse_args(argv)
    try:
        runs = load(a.files)
        lines, commits = table(runs, a.mixed)
    except (ValueError, OSError, json.JSONDecodeError) as exc:
        print(f"generate_table: {exc}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    print("\nrows by commit: " + "; ".join(f"{c}: {len(ls)}" + (f" ({', '.join(ls)})" if len(commits) > 1 else "")
                                         for c, ls in commits.items()))
    print("\n".join(targets(runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
