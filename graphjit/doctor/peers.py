"""The peer rows of the custom all-reduce: ``P2P access`` (the can-access-peer matrix between the visible GPUs),
``NVLink`` (from ``nvidia-smi topo -m``) and ``CUDA IPC`` (a GPU 0 tensor shared with a second process).

The matrix is torch's when torch sees the GPUs (:mod:`graphjit.doctor.torch.rows`, imported lazily),
else from the CUDA driver API; the IPC probe runs in its own processes
(``python -m graphjit.doctor.torch.ipc``).  Failures block the exit status only with ``--collectives``.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Mapping
from typing import TypeVar

from .children import run_child, run_command
from .context import Context, framework_checks
from .report import FAIL, PASS, SKIP
from .text import count_names

IPC_PROBE = "graphjit.doctor.torch.ipc"
"""The module of the CUDA IPC probe, run as ``python -m IPC_PROBE`` (it needs torch with CUDA)."""


def check_peers(ctx: Context) -> None:
    """The ``P2P access`` row (with the matrix under it), then ``NVLink`` and ``CUDA IPC``; skips with fewer than
    2 GPUs."""
    r = ctx.report
    blocking = ctx.collectives
    count, names, access = _peer_matrix(ctx)
    if count == 0:
        for check in ("P2P access", "NVLink", "CUDA IPC"):
            r.add("collectives", check, SKIP, "no GPU that a checked framework can use" if ctx.system_gpus()
                  else "no GPU")
        return
    if count == 1:
        for check in ("P2P access", "NVLink"):
            r.add("collectives", check, SKIP, "one GPU: no peers")
        r.add("collectives", "CUDA IPC", SKIP, "one GPU: IPC between ranks needs two GPUs")
        return
    header = "      " + " ".join(f"GPU{j:<3d}" for j in range(count))
    lines = [header]
    for i in range(count):
        cells = ["X" if i == j else {True: "yes", False: "no", None: "?"}[access.get((i, j))] for j in range(count)]
        lines.append(f"GPU{i:<3d}" + "".join(f"{c:<7s}"[:7] for c in cells))
    missing = [f"{i}->{j}" for (i, j), ok in sorted(access.items()) if ok is False]
    unknown = [f"{i}->{j}" for (i, j), ok in sorted(access.items()) if ok is None]
    if missing:
        r.add("collectives", "P2P access", FAIL, f"{count} GPUs; no peer access {', '.join(missing)}",
              "check nvidia-smi topo -p2p r and the BIOS/IOMMU settings (ACS must allow P2P); the framework's "
              "all-reduce still works", blocking=blocking, lines=lines, matrix=_jsonable(access))
    elif unknown:
        r.add("collectives", "P2P access", SKIP, f"{count} GPUs; could not query {', '.join(unknown)}",
              lines=lines, matrix=_jsonable(access))
    else:
        r.add("collectives", "P2P access", PASS, f"{count} GPUs ({names}); every pair can access its peer",
              lines=lines, matrix=_jsonable(access))
    _nvlink(ctx, count)
    _ipc(ctx)


_V = TypeVar("_V")


def _jsonable(access: Mapping[tuple[int, int], _V]) -> dict[str, _V]:
    """The matrix with ``"i->j"`` keys, for ``--json``."""
    return {f"{i}->{j}": v for (i, j), v in sorted(access.items())}


def _peer_matrix(ctx: Context) -> tuple[int, str, dict[tuple[int, int], bool | None]]:
    """GPU count, names and can-access-peer per ordered pair (torch if it sees the GPUs, else the driver)."""
    access: dict[tuple[int, int], bool | None] = {}
    torch_devices = ctx.gpus.get("torch")
    if torch_devices:
        n = len(torch_devices)
        access = framework_checks("torch").peer_access(n)
        return n, count_names([d["name"] for d in torch_devices]), access
    devices = next(iter(ctx.gpus.values()), None)
    if not devices:
        return 0, "", access
    drv = ctx.cuda_driver()
    n = len(devices)
    for i in range(n):
        for j in range(n):
            if i != j:
                access[(i, j)] = drv.can_access_peer(i, j)
    return n, count_names([d["name"] for d in devices]), access


def _nvlink(ctx: Context, count: int) -> None:
    """The ``NVLink`` row from ``nvidia-smi topo -m``: a pass when every pair is linked by NVLink; a failure
    above 2 GPUs otherwise (the custom all-reduce needs it there), a skip for 2."""
    r = ctx.report
    exe = shutil.which("nvidia-smi")
    proc = run_command([exe, "topo", "-m"]) if exe else None
    if proc is None or proc.returncode != 0:
        r.add("collectives", "NVLink", SKIP, "nvidia-smi topo -m is not available" if exe is None or proc is None
              else "nvidia-smi topo -m failed")
        return
    links = parse_topo(proc.stdout)
    if not links:
        r.add("collectives", "NVLink", SKIP, "could not read nvidia-smi topo -m", raw=proc.stdout[-2000:])
        return
    kinds = sorted(set(links.values()))
    text = ", ".join(f"GPU{i}-GPU{j} {k}" for (i, j), k in sorted(links.items()) if i < j)
    if all(k.startswith("NV") for k in links.values()):
        r.add("collectives", "NVLink", PASS, f"NVLink between every pair ({'/'.join(kinds)})", links=_jsonable(links))
    elif count > 2:
        r.add("collectives", "NVLink", FAIL, f"not every pair has NVLink: {text}",
              "above 2 GPUs the custom all-reduce needs NVLink between all pairs; the framework's all-reduce still "
              "works", blocking=ctx.collectives, links=_jsonable(links))
    else:
        r.add("collectives", "NVLink", SKIP, f"no NVLink: {text} (PCIe P2P is enough for 2 GPUs)",
              links=_jsonable(links))


def parse_topo(text: str) -> dict[tuple[int, int], str]:
    """The link type per ordered GPU pair (``NV18``, ``PIX``, ``SYS``, ...) from ``nvidia-smi topo -m``'s matrix
    (colour codes removed); empty when there is none."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return {}
    header = lines[0].split()
    gpu_cols = [i for i, h in enumerate(header) if re.fullmatch(r"GPU\d+", h)]
    links: dict[tuple[int, int], str] = {}
    for line in lines[1:]:
        parts = line.split()
        m = re.fullmatch(r"GPU(\d+)", parts[0]) if parts else None
        if not m:
            continue
        i = int(m.group(1))
        for col in gpu_cols:
            if col + 1 < len(parts):
                j = int(header[col][3:])
                if i != j:
                    links[(i, j)] = parts[col + 1]
    return links


def _ipc(ctx: Context) -> None:
    """The ``CUDA IPC`` row: runs the IPC probe in its own processes (needs torch with CUDA)."""
    r = ctx.report
    if "torch" not in ctx.gpus:
        r.add("collectives", "CUDA IPC", SKIP, "the probe needs torch with CUDA", "pip install a CUDA build of torch "
              "to run this probe")
        return
    ctx.say("CUDA IPC between two processes (seconds)")
    result, why = run_child(["-m", IPC_PROBE], ctx.timeout)
    if result is None:
        r.add("collectives", "CUDA IPC", FAIL, f"probe failed: {why}", "check that processes may share GPU memory "
              "(containers: --ipc=host); the framework's all-reduce still works", blocking=ctx.collectives)
    elif not result.get("ok"):
        detail = result.get("error") or (f"written={result.get('written')}, peer_read={result.get('peer_read')}")
        r.add("collectives", "CUDA IPC", FAIL, f"a tensor shared between two processes did not work: {detail}",
              "check that processes may share GPU memory (containers: --ipc=host) and P2P works",
              blocking=ctx.collectives, probe=result)
    else:
        r.add("collectives", "CUDA IPC", PASS, "a GPU 0 tensor shared with a second process was written there and "
              "read from GPU 1", probe=result)
