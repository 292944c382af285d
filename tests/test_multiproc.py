"""tests/multiproc.py, the harness of the multi-process GPU tests, exercised on the CPU."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import multiproc
import pytest

WORKER = textwrap.dedent('''
    import os, sys
    from pathlib import Path
    sys.path.insert(0, {tests!r})
    import multiproc

    class W:
        def __init__(self, rank):
            self.rank = rank
            self.enabled = os.environ.get("ENABLED", "1") == "1"
        def section_init(self):
            return {{"rank": self.rank}}
        def section_broken(self):
            if self.rank == int(os.environ["BREAK_RANK"]):
                raise ValueError(f"broken on rank {{self.rank}}")
            return {{"ok": True}}
        def section_after(self):
            return {{"ran": True}}

    rank, port, out = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    assert sys.argv[4:] == ["extra"]
    multiproc.run_worker(lambda: W(rank), ["init", "broken", "after"], out, enabled=lambda w: w.enabled)
''')


def _script(tmp_path: Path) -> Path:
    script = tmp_path / "pkg" / "worker.py"
    script.parent.mkdir()
    script.write_text(WORKER.format(tests=str(Path(__file__).resolve().parent)))
    return script


def test_sections_are_collected_in_rank_order_and_a_raising_section_stops_every_rank(tmp_path: Path) -> None:
    env = {**os.environ, "ENABLED": "1", "BREAK_RANK": "1"}
    results = multiproc.launch(_script(tmp_path), 2, "demo", tmp_path, env, timeout=60, extra_args=["extra"])
    assert [s["rank"] for s in multiproc.section(results, "init")] == [0, 1]
    assert "broken on rank 1" in results[1]["sections"]["broken"]["error"]
    assert results[0]["sections"]["broken"] == {"ok": True, "seconds": results[0]["sections"]["broken"]["seconds"]}
    with pytest.raises(pytest.fail.Exception, match="section broken raised"):
        multiproc.section(results, "broken")
    # rank 0's section passed, but rank 1's raised: neither runs the next section's collectives
    assert all("after" not in r["sections"] and r["stopped_after"].startswith("broken") for r in results)


def test_every_section_runs_when_none_raises(tmp_path: Path) -> None:
    env = {**os.environ, "ENABLED": "1", "BREAK_RANK": "-1"}
    results = multiproc.launch(_script(tmp_path), 2, "fine", tmp_path, env, timeout=60, extra_args=["extra"])
    assert [s["ran"] for s in multiproc.section(results, "after")] == [True, True]


def test_a_disabled_worker_stops_after_init(tmp_path: Path) -> None:
    env = {**os.environ, "ENABLED": "0", "BREAK_RANK": "-1"}
    results = multiproc.launch(_script(tmp_path), 2, "off", tmp_path, env, timeout=60, extra_args=["extra"])
    assert all(set(r["sections"]) == {"init"} for r in results)
    with pytest.raises(pytest.fail.Exception, match="did not run section after"):
        multiproc.section(results, "after")


def test_a_worker_that_writes_nothing_fails_the_test_with_its_log(tmp_path: Path) -> None:
    script = tmp_path / "pkg" / "worker.py"
    script.parent.mkdir()
    script.write_text("import sys\nprint('no result from', sys.argv[1])\nraise SystemExit(3)\n")
    with pytest.raises(pytest.fail.Exception, match=r"rank 0 of dead wrote no result \(exit 3\)"):
        multiproc.launch(script, 2, "dead", tmp_path, dict(os.environ), timeout=60)
