"""Paddle's rows of ``python -m graphjit doctor`` (section ``paddle``).

* :func:`check`: ``paddle build`` (CUDA or CPU build, its kernel architectures, SOT's Python
  limit), ``paddle GPUs`` (count, names, compute capability, CUDA graph support) and the capture flags
  (:func:`_paddle_flags`);
* with a GPU, :func:`_paddle_gpu_probes`: eager and SOT capture-and-replay, each in its own process
  (``python -m graphjit.doctor.paddle.probe``: a Paddle crash cannot end the doctor), and
  :func:`_paddle_kernels` (does an elementwise add on the GPU compute right; never blocking);
* without one, :func:`_paddle_cpu_fallback`: the traced (SOT) function runs in this process and must
  match eager;
* :func:`doctor_gpus`: what the ``custom all-reduce`` row (``--collectives``) needs to know when it runs its
  2-process check through Paddle.

paddle is imported inside these functions only, never when this module is imported, so that the doctor
can report a Paddle that is missing or does not import.  :mod:`graphjit.doctor` imports this module lazily.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import warnings
from typing import Any, cast

from ..capture import graphed_row
from ..children import run_child
from ..context import Context, driver_text
from ..report import FAIL, PASS, SKIP
from ..text import first_line, gpu_text

PADDLE_PROBE = "graphjit.doctor.paddle.probe"
"""The module of the GPU probe, run as ``python -m PADDLE_PROBE TRACER KERNELS(kernels|-) PLACE(gpu|cpu)``."""


def check(ctx: Context) -> None:
    """The ``paddle`` section: build, GPUs, capture flags, then the GPU probes (or the CPU fallback); a paddle
    that does not import is one failed row.  Run only when paddle is installed (:mod:`graphjit.doctor` reports
    a missing one)."""
    r = ctx.report
    try:
        with warnings.catch_warnings():  # paddle warns about ccache at import: not the doctor's business
            warnings.simplefilter("ignore")
            import paddle
    except Exception as exc:
        r.add("paddle", "paddle", FAIL, f"import failed: {first_line(exc)}", "reinstall paddle (pip install "
              "--force-reinstall paddlepaddle-gpu) in this environment")
        return
    version = paddle.__version__
    cuda_build = bool(paddle.is_compiled_with_cuda())
    rocm = bool(getattr(paddle, "is_compiled_with_rocm", lambda: False)())
    facts: dict[str, Any] = {"version": version, "compiled_with_cuda": cuda_build}
    if cuda_build:
        with contextlib.suppress(Exception):
            facts["cuda"], facts["cudnn"] = paddle.version.cuda(), paddle.version.cudnn()
        with contextlib.suppress(Exception):
            facts["cuda_archs"] = [int(a) for a in paddle.version.cuda_archs()]
        build = (f"{'ROCm' if rocm else 'CUDA'} {facts.get('cuda', '?')} / cuDNN {facts.get('cudnn', '?')} build"
                 + (f" (kernels for {_archs_text(facts['cuda_archs'])})" if facts.get("cuda_archs") else ""))
    else:
        build = "CPU build"
    sot_note = ""
    if sys.version_info >= (3, 12) and int(version.split(".")[0]) < 3 and version != "0.0.0":
        sot_note = f"; SOT needs Python <= 3.11 with paddle {version} (it falls back to the AST tracer)"
    if not cuda_build and ctx.system_gpus():
        r.add("paddle", "paddle build", FAIL, f"{version}, {build}, but this machine has {ctx.system_gpus()} NVIDIA "
              "GPU(s)" + sot_note, "pip uninstall paddlepaddle && pip install paddlepaddle-gpu (the build for your "
              "CUDA version: https://www.paddlepaddle.org.cn/install/quick)", **facts)
    else:
        r.add("paddle", "paddle build", PASS, f"{version}, {build}" + sot_note, **facts)

    devices: list[dict[str, Any]] = []
    graphs_ok = True
    if not cuda_build:
        r.add("paddle", "paddle GPUs", SKIP, "CPU build: no GPU")
    else:
        try:
            import paddle.device.cuda.graphs as graphs

            graphs_ok = bool(graphs.is_cuda_graph_supported())
            for i in range(paddle.device.cuda.device_count()):
                props = paddle.device.cuda.get_device_properties(i)
                devices.append({"index": i, "name": props.name, "capability": f"{props.major}.{props.minor}",
                                "memory_gib": getattr(props, "total_memory", 0) / 2**30})
        except Exception as exc:
            r.add("paddle", "paddle GPUs", FAIL, f"querying the GPUs failed: {first_line(exc)}",
                  "check the driver with nvidia-smi and that it supports paddle's CUDA version")
        else:
            if not devices:
                status = FAIL if ctx.system_gpus() else SKIP
                r.add("paddle", "paddle GPUs", status, "paddle sees no GPU"
                      + (f" although nvidia-smi lists {ctx.system_gpus()}" if ctx.system_gpus() else ""),
                      f"check CUDA_VISIBLE_DEVICES and that the driver supports CUDA {facts.get('cuda', '?')}"
                      if status == FAIL else None)
            elif not graphs_ok:
                r.add("paddle", "paddle GPUs", FAIL, gpu_text(devices, driver_text(ctx))
                      + f"; paddle {version} was built without CUDA graph support",
                      "install an official paddlepaddle-gpu wheel (built with CUDA graphs)", devices=devices)
            else:
                ctx.gpus["paddle"] = devices
                r.add("paddle", "paddle GPUs", PASS, gpu_text(devices, driver_text(ctx)), devices=devices)
    _paddle_flags(ctx, paddle, bool(devices))
    if devices and graphs_ok:
        _paddle_gpu_probes(ctx, devices, facts.get("cuda_archs") or [])
    else:
        _paddle_cpu_fallback(ctx, paddle)


def _archs_text(archs: list[int]) -> str:
    """``sm_80, sm_86`` for a few architectures, ``sm_60..sm_90`` for more than three."""
    archs = sorted(archs)
    if len(archs) > 3:
        return f"sm_{archs[0]}..sm_{archs[-1]}"
    return ", ".join(f"sm_{a}" for a in archs)


def _paddle_flags(ctx: Context, paddle: Any, gpu: bool) -> None:
    """One row per flag CUDA graphs need (``FLAGS_new_executor_use_cuda_graph``, ``FLAGS_allocator_strategy``,
    ``FLAGS_use_stream_safe_cuda_allocator``): its value, where it came from, and a fix when it is wrong."""
    r = ctx.report

    def flag(name: str) -> Any:
        try:
            return paddle.get_flags([name])[name]
        except Exception:
            return None

    def add(name: str, ok: bool, value: Any, good: str, fix: str) -> None:
        env_value = os.environ.get(name)
        text = f"{value!r}" + (f" (from the environment: {env_value})" if env_value is not None else "") + f"; {good}"
        if not gpu:
            r.add("paddle", name, SKIP, f"{value!r} (no GPU: used only for CUDA graphs)", value=value, env=env_value)
        elif value is None:
            r.add("paddle", name, SKIP, f"paddle {paddle.__version__} has no such flag", value=None, env=env_value)
        else:
            r.add("paddle", name, PASS if ok else FAIL, text, None if ok else fix, value=value, env=env_value)

    v = flag("FLAGS_new_executor_use_cuda_graph")
    add("FLAGS_new_executor_use_cuda_graph", True, v,
        "graphjit sets it to True at the first capture (run_program needs it)", "")
    v = flag("FLAGS_allocator_strategy")
    add("FLAGS_allocator_strategy", v == "auto_growth", v, "must be auto_growth for CUDA graphs",
        "unset FLAGS_allocator_strategy (or export FLAGS_allocator_strategy=auto_growth) before starting Python")
    v = flag("FLAGS_use_stream_safe_cuda_allocator")
    add("FLAGS_use_stream_safe_cuda_allocator", v is None or bool(v), v,
        "must be on (run_program inside a capture needs it)",
        "unset FLAGS_use_stream_safe_cuda_allocator (or export it as 1) before starting Python")


def _paddle_gpu_probes(ctx: Context, devices: list[dict[str, Any]], archs: list[int]) -> None:
    """Eager and SOT capture-and-replay, each in its own process (a Paddle crash cannot end the doctor)."""
    r = ctx.report
    if ctx.disabled:
        for tracer in ("eager", "sot"):
            r.add("paddle", f"paddle capture+replay ({tracer})", SKIP, "GRAPHJIT_DISABLE=1", "unset GRAPHJIT_DISABLE")
            ctx.captures[f"paddle {tracer}"] = SKIP
        return
    # SOT leaves functions smaller than MIN_GRAPH_SIZE ops uncompiled: 0 makes the probe go through SOT.
    extra = {"MIN_GRAPH_SIZE": os.environ.get("MIN_GRAPH_SIZE", "0")}
    kernels: dict[str, Any] | None = None
    for tracer in ("eager", "sot"):
        check = f"paddle capture+replay ({tracer})"
        tag = f"paddle {tracer}"
        ctx.say(f"a Paddle capture and replay, tracer {tracer}, in its own process (seconds)")
        result, why = run_child(["-m", PADDLE_PROBE, tracer, "kernels" if tracer == "eager" else "-", "gpu"],
                                ctx.timeout, extra)
        if result is None:
            ctx.captures[tag] = FAIL
            r.add("paddle", check, FAIL, f"on cuda:0: {why}",
                  "run the same probe with GRAPHJIT_DEBUG=1 python -m graphjit -vv doctor --framework paddle; "
                  + ("use tracer='eager' or 'ast' until this is fixed" if tracer == "sot" else "report the log"))
            continue
        if tracer == "eager":
            kernels = result
        if not result.get("ok"):
            ctx.captures[tag] = FAIL
            r.add("paddle", check, FAIL, f"on cuda:0: {result.get('error')}",
                  "see the error; GRAPHJIT_DEBUG=1 python -m graphjit -vv doctor --framework paddle shows more",
                  traceback=result.get("traceback"))
            continue
        worst = max(float(result["worst"]), float(result["worst_numpy"]))
        graphed_row(ctx, "paddle", check, True, "cuda:0", result["stats"], worst, int(result["calls"]), 1e-6, tag)
    _paddle_kernels(ctx, devices, archs, kernels)


def _paddle_kernels(ctx: Context, devices: list[dict[str, Any]], archs: list[int],
                    probe: dict[str, Any] | None) -> None:
    """The ``paddle kernels`` row (never blocking) from the eager probe's elementwise check, with the
    architectures paddle was built for against the GPUs'."""
    r = ctx.report
    caps = sorted({int(d["capability"].replace(".", "")) for d in devices})
    missing = [c for c in caps if archs and c not in archs]
    built = f"built for {_archs_text(archs)}" if archs else "its arch list is unknown"
    if probe is None or "elementwise_ok" not in probe:
        r.add("paddle", "paddle kernels", SKIP, "not checked (the eager probe did not finish)"
              + (f"; paddle is {built}, the GPU is sm_{missing[0]}" if missing else ""), blocking=False)
        return
    if probe["elementwise_ok"]:
        r.add("paddle", "paddle kernels", PASS, "elementwise add on cuda:0 matches numpy"
              + (f" (paddle {built}; sm_{missing[0]} runs through PTX)" if missing else ""), blocking=False)
        return
    r.add("paddle", "paddle kernels", FAIL, "elementwise add on cuda:0 returns wrong values"
          + (f" ({probe['elementwise_error']})" if probe.get("elementwise_error") else "")
          + (f": paddle is {built}, the GPU is sm_{missing[0]}" if missing else "")
          + "; matmul and copies (what graphjit's check uses) compute right",
          "install a Paddle build with kernels for this GPU (paddlepaddle-gpu 3.x for CUDA 12 on Hopper); until "
          "then only matmul, copies and NCCL compute right", blocking=False, archs=archs, capabilities=caps)


def _paddle_cpu_fallback(ctx: Context, paddle: Any) -> None:
    """No Paddle GPU: graphjit runs the traced (SOT) function; check that it matches eager."""
    r = ctx.report
    check = "paddle graphed (sot)"
    if ctx.disabled:
        r.add("paddle", check, SKIP, "GRAPHJIT_DISABLE=1", "unset GRAPHJIT_DISABLE")
        ctx.captures["paddle sot"] = SKIP
        return
    import numpy as np

    import graphjit

    calls = 3
    try:
        place = paddle.CPUPlace()
        rng = np.random.default_rng(0)
        w1 = paddle.to_tensor(rng.integers(-2, 3, (64, 64)).astype(np.float32), place=place)
        w2 = paddle.to_tensor(rng.integers(-2, 3, (64, 32)).astype(np.float32), place=place)

        def tiny(x: Any) -> Any:
            return paddle.matmul(paddle.matmul(x, w1), w2)

        step = cast(graphjit.GraphedFunction, graphjit.graphed(tiny, tracer="sot", strict=True))
        worst = 0.0
        with paddle.no_grad():
            for _ in range(calls):
                x = paddle.to_tensor(rng.integers(-2, 3, (8, 64)).astype(np.float32), place=place)
                got, want = step(x).numpy().astype(np.float64), tiny(x).numpy().astype(np.float64)
                worst = max(worst, float(np.linalg.norm(got - want)) / max(float(np.linalg.norm(want)), 1e-30))
        stats = step.stats()
    except Exception as exc:
        ctx.captures["paddle sot"] = FAIL
        r.add("paddle", check, FAIL, f"CPU fallback: {first_line(exc)}",
              "run GRAPHJIT_DEBUG=1 python -m graphjit -vv doctor --framework paddle and report the log")
        return
    graphed_row(ctx, "paddle", check, False, "cpu", stats, worst, calls, 1e-6, "paddle sot")



def doctor_gpus(ctx: Context) -> tuple[int, list[str], str | None]:
    """(GPUs Paddle sees, their names, why Paddle cannot run the check) for --collectives, from the paddle rows
    (which ran before it: a Paddle without CUDA graphs or without GPUs left no devices there)."""
    devices = ctx.gpus.get("paddle")
    if devices:
        return len(devices), [d["name"] for d in devices], None
    if importlib.util.find_spec("paddle") is None:
        return 0, [], "paddle is not installed (the check runs through paddle.distributed and NCCL)"
    return 0, [], "paddle sees no GPU it can capture on (see the paddle rows)"
