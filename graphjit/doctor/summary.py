"""The summary lines above the table: is there a GPU a checked framework can use, are CUDA graphs captured
and replayed correctly (and with which frameworks), and, with ``--collectives``, the custom all-reduce's
verdict.  Read from the :class:`~graphjit.doctor.context.Context` once every check has run."""

from __future__ import annotations

from .context import Context
from .report import FAIL, PASS
from .text import count_names


def summarise(ctx: Context) -> None:
    """Set ``ctx.report.summary``: the first line (GPUs, captures), and the ``--collectives`` line when asked."""
    r = ctx.report
    seen = {fw: devs for fw, devs in ctx.gpus.items() if devs}
    lines: list[str] = []
    if not seen and not ctx.system_gpus():
        broken = " (nvidia-smi failed: see below)" if ctx.smi and ctx.smi.get("error") else ""
        lines.append(f"no GPU on this machine{broken}: CUDA graphs will not be captured; graphed functions run the "
                     "traced function instead (one info log line says why)")
    elif not seen:
        lines.append(f"this machine has {ctx.system_gpus()} NVIDIA GPU(s) but no checked framework can use them: "
                     "CUDA graphs will not be captured and graphed functions run the traced function instead; "
                     "see the fixes below")
    else:
        devices = next(iter(seen.values()))
        ok = [k for k, v in ctx.captures.items() if v == PASS]
        bad = [k for k, v in ctx.captures.items() if v == FAIL]
        text = f"{count_names([d['name'] for d in devices])}: "
        if ok and not bad:
            text += "CUDA graphs are captured and replayed correctly with " + ", ".join(ok)
        elif ok:
            text += f"CUDA graphs work with {', '.join(ok)}; they FAIL with {', '.join(bad)} (see the fixes below)"
        elif bad:
            text += f"CUDA graph capture FAILS with {', '.join(bad)}: graphjit falls back to the traced function"
        else:
            text += "capture not checked"
        lines.append(text)
    if ctx.collectives and ctx.ar_summary:
        lines.append(f"--collectives: {ctx.ar_summary}")
    r.summary = lines
