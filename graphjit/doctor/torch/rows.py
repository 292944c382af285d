"""PyTorch's rows of ``python -m graphjit doctor`` (section ``torch``), and torch's view of the GPUs for the
collectives rows.

* :func:`check`: ``torch build`` (CUDA, ROCm or CPU build, against the GPUs nvidia-smi lists),
  ``torch GPUs`` (count, names, compute capability, kernels for them) and ``torch capture+replay`` (a
  tiny function through :func:`graphjit.graphed` on GPU 0, or the CPU fallback, checked against eager);
* :func:`doctor_gpus` (the ``custom all-reduce`` row) and :func:`peer_access` (the ``P2P access`` row).

torch is imported inside these functions only, never when this module is imported, so that the doctor
can report a torch that is missing or does not import.  :mod:`graphjit.doctor` imports this module lazily.
The probes torch runs in their own processes are :mod:`graphjit.doctor.torch.ipc` and
:mod:`graphjit.doctor.torch.allreduce`.
"""

from __future__ import annotations

import importlib.util
import re
from typing import Any, cast

from ..capture import graphed_row
from ..context import Context, driver_text
from ..report import FAIL, PASS, SKIP
from ..text import first_line, gpu_text


def check(ctx: Context) -> None:
    """The ``torch`` section: build, GPUs, capture and replay; a torch that does not import is one failed row.
    Run only when torch is installed (:mod:`graphjit.doctor` reports a missing one)."""
    r = ctx.report
    try:
        import torch
    except Exception as exc:
        r.add("torch", "torch", FAIL, f"import failed: {first_line(exc)}", "reinstall torch (pip install "
              "--force-reinstall torch) in this environment")
        return
    cuda_build = bool(torch.backends.cuda.is_built()) and torch.version.cuda is not None
    hip = getattr(torch.version, "hip", None)
    build = f"CUDA {torch.version.cuda} build" if cuda_build else (f"ROCm {hip} build" if hip else "CPU build")
    facts: dict[str, Any] = {"version": torch.__version__, "cuda": torch.version.cuda, "hip": hip}
    if not cuda_build and ctx.system_gpus():
        r.add("torch", "torch build", FAIL, f"{torch.__version__}, {build}, but this machine has "
              f"{ctx.system_gpus()} NVIDIA GPU(s)", "install a CUDA build of torch for your driver, e.g. pip install "
              "torch --index-url https://download.pytorch.org/whl/cu128", **facts)
    else:
        r.add("torch", "torch build", PASS, f"{torch.__version__}, {build}", **facts)

    devices: list[dict[str, Any]] = []
    if hip:
        r.add("torch", "torch GPUs", SKIP, "ROCm build: graphjit supports CUDA GPUs only")
    elif not cuda_build:
        r.add("torch", "torch GPUs", SKIP, "CPU build: no GPU")
    elif not torch.cuda.is_available():
        status = FAIL if ctx.system_gpus() else SKIP
        r.add("torch", "torch GPUs", status, "torch sees no CUDA GPU"
              + (f" although nvidia-smi lists {ctx.system_gpus()}" if ctx.system_gpus() else ""),
              f"check CUDA_VISIBLE_DEVICES and that the driver supports CUDA {torch.version.cuda} "
              "(nvidia-smi shows the highest CUDA version it supports)" if status == FAIL else None)
    else:
        try:
            arch_list = list(torch.cuda.get_arch_list())
            for i in range(torch.cuda.device_count()):
                p = torch.cuda.get_device_properties(i)
                devices.append({"index": i, "name": p.name, "capability": f"{p.major}.{p.minor}",
                                "memory_gib": p.total_memory / 2**30})
        except Exception as exc:
            r.add("torch", "torch GPUs", FAIL, f"querying the GPUs failed: {first_line(exc)}",
                  "check the driver with nvidia-smi")
        else:
            ctx.gpus["torch"] = devices
            unsupported = sorted({d["capability"] for d in devices if not torch_arch_ok(d["capability"], arch_list)})
            text = gpu_text(devices, driver_text(ctx))
            if unsupported and arch_list:
                r.add("torch", "torch GPUs", FAIL, f"{text}; torch {torch.__version__} has no kernels for "
                      f"{', '.join('sm_' + c.replace('.', '') for c in unsupported)} (built for {' '.join(arch_list)})",
                      "install a torch build that supports this GPU (a newer CUDA wheel)", devices=devices,
                      arch_list=arch_list)
            else:
                r.add("torch", "torch GPUs", PASS, text, devices=devices, arch_list=arch_list)
    _torch_capture(ctx, torch, bool(devices))


def torch_arch_ok(capability: str, arch_list: list[str]) -> bool:
    """Whether torch built for ``arch_list`` (``sm_90``, ``compute_90``, ...) runs on a GPU of ``capability``
    (``9.0``): SASS for exactly it, or PTX for it or an older architecture."""
    major, minor = (int(v) for v in capability.split("."))
    cc = major * 10 + minor
    for arch in arch_list:
        m = re.fullmatch(r"(sm|compute)_(\d+)([a-z]?)", arch)
        if not m:
            continue
        n = int(m.group(2))
        if m.group(1) == "sm" and n == cc:
            return True
        if m.group(1) == "compute" and n <= cc:  # PTX that the driver compiles for this GPU
            return True
    return False


def _torch_capture(ctx: Context, torch: Any, gpu: bool) -> None:
    """The ``torch capture+replay`` row: a tiny MLP through :func:`graphjit.graphed` (strict), 4 calls on
    ``cuda:0`` (or the CPU fallback), each compared with eager."""
    r = ctx.report
    if ctx.disabled:
        r.add("torch", "torch capture+replay", SKIP, "GRAPHJIT_DISABLE=1", "unset GRAPHJIT_DISABLE")
        ctx.captures["torch"] = SKIP
        return
    import graphjit

    device = "cuda:0" if gpu else "cpu"
    calls = 4
    try:
        g = torch.Generator().manual_seed(0)
        w1 = torch.randn(64, 64, generator=g).to(device)
        w2 = torch.randn(64, 32, generator=g).to(device)

        def tiny(x: Any) -> Any:
            return torch.relu(x @ w1) @ w2 + 1.0

        step = cast(graphjit.GraphedFunction, graphjit.graphed(tiny, strict=True))
        worst = 0.0
        with torch.no_grad():
            for _ in range(calls):
                x = torch.randn(8, 64, generator=g).to(device)
                got = step(x)
                want = tiny(x)
                err = float((got.double() - want.double()).norm() / want.double().norm().clamp_min(1e-30))
                worst = max(worst, err)
        stats = step.stats()
    except Exception as exc:
        ctx.captures["torch"] = FAIL
        r.add("torch", "torch capture+replay", FAIL, f"{'on ' + device if gpu else 'CPU fallback'}: {first_line(exc)}",
              "run with GRAPHJIT_DEBUG=1 python -m graphjit -vv doctor --framework torch and report the log")
        return
    graphed_row(ctx, "torch", "torch capture+replay", gpu, device, stats, worst, calls, 1e-4)


def doctor_gpus(ctx: Context) -> tuple[int, list[str], str | None]:
    """(GPUs torch sees, their names, why torch cannot run the check) for --collectives."""
    if ctx.gpus.get("torch"):
        devices = ctx.gpus["torch"]
        return len(devices), [d["name"] for d in devices], None
    if importlib.util.find_spec("torch") is None:
        return 0, [], "torch is not installed (the check runs through torch.distributed and NCCL)"
    try:
        import torch

        if not (torch.backends.cuda.is_built() and torch.version.cuda):
            return 0, [], f"torch {torch.__version__} is a CPU build"
        if not torch.cuda.is_available():
            return 0, [], f"torch {torch.__version__} sees no CUDA GPU"
        n = torch.cuda.device_count()
        return n, [torch.cuda.get_device_name(i) for i in range(n)], None
    except Exception as exc:
        return 0, [], f"torch cannot query the GPUs: {first_line(exc)}"


def peer_access(n: int) -> dict[tuple[int, int], bool | None]:
    """torch's can-access-peer for every ordered pair of its first ``n`` GPUs (None where the query failed)."""
    import torch

    access: dict[tuple[int, int], bool | None] = {}
    for i in range(n):
        for j in range(n):
            if i != j:
                try:
                    access[(i, j)] = bool(torch.cuda.can_device_access_peer(i, j))
                except Exception:
                    access[(i, j)] = None
    return access
