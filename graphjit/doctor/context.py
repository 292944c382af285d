"""What the checks of one doctor run share: the :class:`Context` (the report, the options, what earlier
checks found), the driver text for GPU rows, and the lazy way to a framework's checks.

A framework's checks live in ``graphjit.doctor.<framework>.rows`` (a framework is imported only in a folder
named after it); :func:`framework_checks` imports that module on first use, so importing
:mod:`graphjit.doctor` imports no framework.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from .. import backends
from .driver import CudaDriver
from .report import SKIP, Report


@dataclass
class Context:
    """The options of a run and the facts its checks leave for the later ones (GPUs, captures, nvcc, csrc)."""

    report: Report
    frameworks: tuple[str, ...]
    explicit: bool
    collectives: bool
    timeout: float
    smi: dict[str, Any] | None = None
    driver: CudaDriver | None = None
    gpus: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # framework -> devices it sees
    captures: dict[str, str] = field(default_factory=dict)  # "torch", "paddle eager", ... -> PASS/FAIL/SKIP
    disabled: bool = False
    nvcc: str | None = None  # the nvcc the nvcc row found and ran
    nvcc_version: tuple[int, int] | None = None
    csrc: str = SKIP  # the csrc build row's status
    csrc_fix: str | None = None
    ar_summary: str | None = None  # the --collectives summary line
    progress: Callable[[str], None] | None = None  # told what runs next (the command prints it to stderr)

    def say(self, step: str) -> None:
        """Tell the user what runs next (a section, or a step that takes seconds), if anyone listens."""
        if self.progress is not None:
            self.progress(step)

    def cuda_driver(self) -> CudaDriver:
        """The CUDA driver API, loaded once per run."""
        if self.driver is None:
            self.driver = CudaDriver()
        return self.driver

    def system_gpus(self) -> int:
        """How many GPUs nvidia-smi listed (0 without nvidia-smi or when it failed)."""
        return len(self.smi["gpus"]) if self.smi and self.smi.get("gpus") else 0


def driver_text(ctx: Context) -> str | None:
    """The driver version for GPU rows: nvidia-smi's, else the CUDA version of the driver API, else None."""
    if ctx.smi and ctx.smi.get("driver"):
        return str(ctx.smi["driver"])
    v = ctx.cuda_driver().version()
    return f"CUDA {v[0]}.{v[1]} driver API" if v else None


def framework_checks(framework: str) -> ModuleType:
    """``graphjit.backends.<framework>_doctor`` (``torch`` or ``paddle``), imported on first use.  Importing it
    imports no framework either: its checks import the framework inside themselves."""
    return backends.load(framework, "rows", "doctor")
