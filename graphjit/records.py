"""Results written to disk: JSON files written atomically with their values made JSON-safe, and the commit
of the checkout that produced them.  Used by the benchmarks and the doctor alike (framework-neutral)."""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any


def git_commit(start: Path | None = None) -> str | None:
    """The short commit of HEAD of the checkout holding graphjit (or ``start``), read from ``.git``
    directly, like ``git rev-parse --short HEAD`` but without running a subprocess; None if there
    is no checkout (an installed package, a copied tree).  ``GRAPHJIT_COMMIT`` names it instead where set."""
    from .env import settings

    named = settings().commit
    if named:
        return named
    here = (start or Path(__file__)).resolve()
    for folder in [here, *here.parents]:
        dot = folder / ".git"
        if dot.exists():
            break
    else:
        return None
    try:
        git_dir = dot
        if dot.is_file():  # a worktree or submodule: "gitdir: PATH"
            text = dot.read_text().strip()
            if not text.startswith("gitdir:"):
                return None
            git_dir = (folder / text.split(":", 1)[1].strip()).resolve()
        common = git_dir
        if (git_dir / "commondir").is_file():
            common = (git_dir / (git_dir / "commondir").read_text().strip()).resolve()
        head = (git_dir / "HEAD").read_text().strip()
        sha: str | None = None
        if head.startswith("ref:"):
            ref = head.split(":", 1)[1].strip()
            for base in (git_dir, common):
                if (base / ref).is_file():
                    sha = (base / ref).read_text().strip()
                    break
            else:
                packed = common / "packed-refs"
                if packed.is_file():
                    for line in packed.read_text().splitlines():
                        parts = line.split()
                        if len(parts) == 2 and parts[1] == ref:
                            sha = parts[0]
                            break
        else:
            sha = head
    except OSError:
        return None
    if not sha or not re.fullmatch(r"[0-9a-f]{40,64}", sha):
        return None
    return sha[:7]


def clean(obj: Any) -> Any:
    """JSON-safe copy: NaN/inf become strings, unknown objects their ``str``."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else str(obj)
    if isinstance(obj, dict):
        return {str(k): clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean(v) for v in obj]
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    return str(obj)


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` atomically (a crash mid-benchmark leaves the previous complete write)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(clean(data), indent=2, allow_nan=False) + "\n")
    os.replace(tmp, path)
