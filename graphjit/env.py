"""Every ``GRAPHJIT_*`` environment variable, read in one place and documented in one table.

The variables are read once, lazily, the first time graphjit needs them; :func:`refresh` reads them
again (tests and long-running programs that change ``os.environ`` call it).  A malformed value raises
:class:`~graphjit.errors.ConfigError` naming the variable and the values it accepts.

``VARIABLES`` is the single source of the README's table (``python -m graphjit env`` prints it).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path

from .errors import ConfigError


@dataclass(frozen=True)
class Variable:
    """One environment variable: its name, its kind, its default and what it does."""

    name: str
    kind: str  # "bool" | "int" | "str" | "path" | "choice:a|b|c"
    default: str
    doc: str


VARIABLES: tuple[Variable, ...] = (
    Variable("GRAPHJIT_DISABLE", "bool", "0",
             "Call the original function: no tracing, no capture, no swap of all_reduce."),
    Variable("GRAPHJIT_DEBUG", "bool", "0",
             "Log every state change (warmup, capture, verify, replay, fallback) at DEBUG level, "
             "with fingerprints of inputs and outputs."),
    Variable("GRAPHJIT_STRICT", "bool", "0",
             "Raise instead of falling back (capture failure, bucket overflow, max_graphs). "
             "A decorator's strict= overrides it."),
    Variable("GRAPHJIT_VERIFY", "bool", "1",
             "After each capture replay once and compare with the eager warmup result. "
             "A decorator's verify= overrides it."),
    Variable("GRAPHJIT_VERIFY_MAX_BYTES", "int", str(1 << 30),
             "Memory verify may use for its copies of the state a function writes (twice the bytes of the "
             "tensors it writes: before and after the eager reference; with Paddle also the contents compared "
             "during warmup). A key that needs more is captured without verify, counted under 'verify skipped'. "
             "Paddle 2.6's SOT check on a key's first call copies the state the call can reach, parameters too "
             "where all of it fits in half of this."),
    Variable("GRAPHJIT_CHECK_OUTPUTS", "bool", "0",
             "With outputs=\"alias\": poison (NaN / minimum integer) the outputs of the previous call "
             "before the next one, so that a stale read shows up."),
    Variable("GRAPHJIT_DUMP_DIR", "path", "",
             "Write a Graphviz dot file per captured graph into this folder."),
    Variable("GRAPHJIT_MAX_GRAPHS", "int", "",
             "Default for max_graphs (graphs per function); a decorator's max_graphs= overrides it."),
    Variable("GRAPHJIT_CUSTOM_AR", "bool", "1",
             "0: never use the custom all-reduce, always the framework's collective (calls are still counted "
             "in collectives.stats())."),
    Variable("GRAPHJIT_AR_ALGO", "choice:auto|1shot|2shot|nccl", "auto",
             "Custom all-reduce algorithm: auto picks one-shot or two-shot by size and world size; nccl always "
             "uses the framework's collective. Read at each call (at capture for graphs): set it alike on every rank."),
    Variable("GRAPHJIT_AR_MAX_BYTES", "int", "",
             "Default max_bytes of collectives.init (8 MiB if unset): the size of the staging and scratch buffers; "
             "larger tensors use the framework's collective."),
    Variable("GRAPHJIT_AR_SHARED_GPU", "bool", "0",
             "Testing only: let ranks that share one GPU use the custom all-reduce (their kernels take turns on "
             "the GPU, milliseconds per call), so that the multi-process path can be tested on a 1-GPU machine. "
             "Set it alike on every rank; never in production."),
    Variable("GRAPHJIT_BATCH_COPY", "choice:auto|on|off", "auto",
             "How a replay copies inputs in and outputs out: auto gives a torch graph feed nodes (its own batch "
             "copies of the call's inputs and outputs, set per launch) and copies several tensors in one launch of "
             "graphjit's batch copy kernel (csrc) where its library is built, and builds it once in the background "
             "(nvcc) at the first capture where it is not; on also builds it, at once; off always uses the "
             "framework's copies."),
    Variable("GRAPHJIT_LANE", "choice:auto|on|off", "auto",
             "The replay lane: a call of a key that replays through its graph's feed nodes (positional, or "
             "keywords and containers a C walk check signs) is checked and launched in C (csrc/lane.c) instead of "
             "graphjit's Python path. auto builds it with the C compiler once, in the background, where a key "
             "first replays twice in a row and it is not built yet "
             "(python -m graphjit build builds it ahead of time); on builds it there at once; off: the Python path "
             "only."),
    Variable("GRAPHJIT_CACHE_DIR", "path", "~/.cache/graphjit",
             "Where compiled csrc libraries are kept, keyed by source hash and GPU architecture "
             "(python -m graphjit build fills it ahead of time)."),
    Variable("GRAPHJIT_NVCC", "path", "",
             "The nvcc to build csrc with (default: nvcc on PATH, then $CUDA_HOME/bin/nvcc, then "
             "/usr/local/cuda/bin/nvcc)."),
    Variable("GRAPHJIT_COMMIT", "str", "",
             "The commit that benchmark and doctor records name, for a copied tree whose .git is absent or "
             "not its own (default: read from the checkout's .git)."),
)

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


@dataclass(frozen=True)
class Settings:
    """The parsed values of every variable in :data:`VARIABLES`."""

    disable: bool
    debug: bool
    strict: bool
    verify: bool
    verify_max_bytes: int
    check_outputs: bool
    dump_dir: Path | None
    max_graphs: int | None
    custom_ar: bool
    ar_algo: str
    ar_max_bytes: int | None
    ar_shared_gpu: bool
    batch_copy: str
    lane: str
    cache_dir: Path
    nvcc: str | None
    commit: str | None


def _raw(name: str) -> str:
    """The variable's value, or its default where it is unset or empty (``GRAPHJIT_VERIFY_MAX_BYTES=`` is the
    default budget, not 0)."""
    default = next(v.default for v in VARIABLES if v.name == name)
    return os.environ.get(name, "").strip() or default.strip()


def _bool(name: str) -> bool:
    value = _raw(name).lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(f"{name}={os.environ.get(name)!r}: expected 0 or 1 (also true/false, yes/no, on/off)")


def _int(name: str, minimum: int = 0) -> int | None:
    value = _raw(name)
    if not value:
        return None
    try:
        number = int(value, 0)
    except ValueError:
        raise ConfigError(f"{name}={value!r}: expected a whole number, e.g. {name}=64") from None
    if number < minimum:
        raise ConfigError(f"{name}={value!r}: expected a number >= {minimum}")
    return number


def _choice(name: str) -> str:
    kind = next(v.kind for v in VARIABLES if v.name == name)
    allowed = kind.split(":", 1)[1].split("|")
    value = _raw(name).lower()
    if value not in allowed:
        raise ConfigError(f"{name}={value!r}: expected one of {', '.join(allowed)}")
    return value


def _read() -> Settings:
    dump = _raw("GRAPHJIT_DUMP_DIR")
    return Settings(
        disable=_bool("GRAPHJIT_DISABLE"),
        debug=_bool("GRAPHJIT_DEBUG"),
        strict=_bool("GRAPHJIT_STRICT"),
        verify=_bool("GRAPHJIT_VERIFY"),
        verify_max_bytes=_int("GRAPHJIT_VERIFY_MAX_BYTES") or 0,
        check_outputs=_bool("GRAPHJIT_CHECK_OUTPUTS"),
        dump_dir=Path(dump).expanduser() if dump else None,
        max_graphs=_int("GRAPHJIT_MAX_GRAPHS", minimum=1),
        custom_ar=_bool("GRAPHJIT_CUSTOM_AR"),
        ar_algo=_choice("GRAPHJIT_AR_ALGO"),
        ar_max_bytes=_int("GRAPHJIT_AR_MAX_BYTES", minimum=16),
        ar_shared_gpu=_bool("GRAPHJIT_AR_SHARED_GPU"),
        batch_copy=_choice("GRAPHJIT_BATCH_COPY"),
        lane=_choice("GRAPHJIT_LANE"),
        cache_dir=Path(_raw("GRAPHJIT_CACHE_DIR")).expanduser(),
        nvcc=_raw("GRAPHJIT_NVCC") or None,
        commit=_raw("GRAPHJIT_COMMIT") or None,
    )


_lock = threading.Lock()
_settings: Settings | None = None


def settings() -> Settings:
    """The current settings, read from the environment on first use (cheap afterwards)."""
    global _settings
    current = _settings
    if current is None:
        with _lock:
            if _settings is None:
                _settings = _read()
            current = _settings
    return current


def refresh() -> Settings:
    """Read every variable again (after ``os.environ`` changed) and return the new settings."""
    global _settings
    with _lock:
        _settings = _read()
        return _settings


def table_markdown() -> str:
    """The README's environment-variable table, generated from :data:`VARIABLES`."""
    rows = ["| variable | values | default | effect |", "| --- | --- | --- | --- |"]
    for v in VARIABLES:
        values = {"bool": "0 / 1", "int": "integer", "path": "path", "str": "text"}.get(
            v.kind, v.kind.split(":", 1)[-1].replace("|", " / "))
        default = v.default if v.default else "unset"
        rows.append(f"| `{v.name}` | {values} | {default} | {v.doc} |")
    return "\n".join(rows)
