"""The doctor's table: one :class:`Row` per check, the :class:`Report` that renders them and its exit status.

A row's mark is :data:`PASS`, :data:`FAIL` or :data:`SKIP`; only failures of rows marked ``blocking`` make
the exit status non-zero.  :meth:`Report.render` is the text the command prints, :meth:`Report.as_dict`
what ``--json`` writes.  Nothing here runs a check.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

PASS, FAIL, SKIP = "pass", "fail", "skip"


@dataclass
class Row:
    """One line of the doctor's table."""

    section: str
    check: str
    status: str  # PASS | FAIL | SKIP
    result: str
    fix: str | None = None
    blocking: bool = True
    """A failure here makes the exit status non-zero (False: informational for what was asked)."""
    lines: list[str] = field(default_factory=list)
    """Extra lines printed under the row (a P2P matrix, say)."""
    data: dict[str, Any] = field(default_factory=dict)
    """Facts behind the row, for ``--json``."""

    def as_dict(self) -> dict[str, Any]:
        """The row as JSON-ready data."""
        return {"section": self.section, "check": self.check, "status": self.status, "result": self.result,
                "fix": self.fix, "blocking": self.blocking, "lines": list(self.lines), "data": self.data}


@dataclass
class Report:
    """Every row, the summary lines and the exit status."""

    rows: list[Row] = field(default_factory=list)
    summary: list[str] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)

    def add(self, section: str, check: str, status: str, result: str, fix: str | None = None, *,
            blocking: bool = True, lines: list[str] | None = None, **data: Any) -> Row:
        """Append a row and return it; keyword arguments become its ``data``."""
        row = Row(section, check, status, result, fix, blocking, list(lines or []), data)
        self.rows.append(row)
        return row

    def failures(self, blocking: bool | None = None) -> list[Row]:
        """The failed rows: all, or only the blocking (True) or only the informational (False) ones."""
        return [r for r in self.rows if r.status == FAIL and (blocking is None or r.blocking == blocking)]

    @property
    def exit_code(self) -> int:
        """1 when a blocking check failed, else 0."""
        return 1 if self.failures(blocking=True) else 0

    def render(self) -> str:
        """The text the command prints: the summary, the table (fixes and hints under their rows) and a last
        line on the exit status."""
        width = max([len(r.check) for r in self.rows] + [5])
        from .. import __version__

        out = [*(f"graphjit {__version__} doctor: {s}" for s in self.summary[:1]), *self.summary[1:], ""]
        out.append(f"{'mark':4s}  {'check':{width}s}  result")
        out.append(f"{'-' * 4}  {'-' * width}  {'-' * 6}")
        indent = " " * (6 + width + 2)
        for r in self.rows:
            out.append(f"{r.status:4s}  {r.check:{width}s}  {r.result}")
            out.extend(indent + line for line in r.lines)
            if r.fix and r.status in (FAIL, SKIP):
                out.append(f"{indent}{'fix' if r.status == FAIL else 'hint'}: {r.fix}")
        out.append("")
        blocking, other = self.failures(blocking=True), self.failures(blocking=False)
        if blocking:
            out.append(f"exit status 1: {len(blocking)} failed check(s) stop what you asked for: "
                       + ", ".join(r.check for r in blocking))
        else:
            out.append("exit status 0: nothing you asked for is blocked")
        if other:
            out.append(f"  {len(other)} failed check(s) do not change the exit status "
                       f"({', '.join(r.check for r in other)}): "
                       "they matter only for the custom all-reduce (--collectives) or for your own model's kernels")
        return "\n".join(out)

    def as_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data (what ``--json`` writes, less ``argv``)."""
        from .. import __version__

        counts = {s: sum(1 for r in self.rows if r.status == s) for s in (PASS, FAIL, SKIP)}
        return {"tool": "graphjit doctor", "graphjit": __version__, "options": self.options,
                "summary": self.summary, "exit_code": self.exit_code, "counts": counts,
                "rows": [r.as_dict() for r in self.rows]}

