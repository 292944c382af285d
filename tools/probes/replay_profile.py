"""Where the host time of a replayed ``@graphed`` call goes (torch, one GPU).

Times the whole call for the default path (copies in and out), alias outputs and the zero-copy path
(static_inputs + alias), each by the replay lane where it is loaded, and the default path by graphjit's
Python path alone; then the parts of that Python path one by one (key, dict lookup, input copies, graph
replay, output copy) against its whole call, and cProfile over it, listing the functions with the most own
time per call (the lane runs the same parts in one C function).  Diagnostic only: the speed claims are made by
``python -m graphjit bench decode`` (host-cost section).

Usage (GPU machine, repo root): ``PYTHONPATH=. python3 tools/probes/replay_profile.py --out DIR``; ``--emulate`` runs
it on a CPU through tests/graph_emulator.py (a smoke run of the probe itself: its numbers mean nothing).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import graphjit
from graphjit import lane


def per_call_us(fn: Callable[[], Any], iters: int = 2000, repeats: int = 7) -> float:
    samples = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        for _ in range(iters):
            fn()
        t1 = time.perf_counter_ns()
        torch.cuda.synchronize()
        samples.append((t1 - t0) / 1e3 / iters)
    return round(statistics.median(samples), 3)


def tiny(a: Any, b: Any, c: Any, d: Any) -> Any:
    return a + b + c + d


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--emulate", action="store_true", help="CPU smoke run through tests/graph_emulator.py")
    args = p.parse_args()
    if args.emulate:  # the probe's own smoke run: its numbers mean nothing
        sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
        from graph_emulator import emulated_torch

        with emulated_torch():
            torch.cuda.synchronize = lambda *a, **k: None  # type: ignore[assignment]
            measure(args, "cpu", torch.float32, "cpu (emulated graphs)")
        return
    measure(args, "cuda", torch.bfloat16, torch.cuda.get_device_name())


def measure(args: argparse.Namespace, device: str, dtype: Any, name: str) -> None:
    inputs = [torch.randn(8, 1024, device=device, dtype=dtype) for _ in range(4)]
    from graphjit.bench.common import environment

    result: dict[str, Any] = {"device": name, "torch": torch.__version__,
                              "git_commit": environment().get("git_commit"), "us": {}}
    us = result["us"]
    us["eager"] = per_call_us(lambda: tiny(*inputs))

    default = graphjit.graphed(tiny)
    alias = graphjit.graphed(tiny, outputs="alias")
    python_path = graphjit.graphed(tiny)  # the same call by graphjit's Python path alone (no replay lane)
    python_path._self_state.lane_allowed = False
    for _ in range(default.graphjit_options.warmup + 1):  # warmups, then the capture (static_inputs needs it)
        default(*inputs)
        alias(*inputs)
        python_path(*inputs)
    static_args, _ = alias.static_inputs(*inputs)
    us["graphed_default"] = per_call_us(lambda: default(*inputs))  # by the replay lane where it is loaded
    us["graphed_alias"] = per_call_us(lambda: alias(*inputs))
    us["graphed_static_alias"] = per_call_us(lambda: alias(*static_args))
    us["graphed_default_python"] = per_call_us(lambda: python_path(*inputs))
    result["lane"] = lane.status()

    state = python_path._self_state  # its parts: the lane runs them in one C function
    sig = state.signer.sign(None, tuple(inputs), {})
    entry = state.entries[sig.key]
    us["part_sign"] = per_call_us(lambda: state.signer.sign(None, tuple(inputs), {}))
    us["part_entries_get"] = per_call_us(lambda: state.entries.get(sig.key))
    if entry.check is not None:
        us["part_guard_check"] = per_call_us(entry.check)
    us["part_env_settings"] = per_call_us(graphjit.env.settings)
    us["part_inputs_load"] = per_call_us(lambda: entry.inputs.load(sig.tensors))
    us["part_graph_replay"] = per_call_us(entry.graph.replay)
    call = (tuple(inputs), {})
    us["part_outputs_copy"] = per_call_us(lambda: entry.outputs.result(sig.pads, True, sig.tensors, call))
    us["part_outputs_alias"] = per_call_us(lambda: entry.outputs.result(sig.pads, False, sig.tensors, call))
    us["part_entry_replay_copy"] = per_call_us(lambda: entry.replay(sig, True, call))
    us["part_state_replay_copy"] = per_call_us(
        lambda: state.replay(entry, sig, graphjit.env.settings(), None, tuple(inputs), {}))
    # The floors of the parts, as torch prices them: what one multi-tensor copy, one copy, one clone and one
    # allocation cost on this host (and a raw cudaMemcpyAsync through CuPy, where it is installed).
    dsts = [torch.empty_like(t) for t in inputs]
    us["floor_foreach_copy_4"] = per_call_us(lambda: torch._foreach_copy_(dsts, inputs))
    us["floor_copy_1"] = per_call_us(lambda: dsts[0].copy_(inputs[0]))
    us["floor_clone_1"] = per_call_us(lambda: inputs[0].clone())
    us["floor_empty_like_1"] = per_call_us(lambda: torch.empty_like(inputs[0]))
    us["floor_data_ptr_4"] = per_call_us(lambda: [t.data_ptr() for t in inputs])
    us["floor_meta_4"] = per_call_us(lambda: [(t.shape, t.dtype, t.device, t.requires_grad) for t in inputs])
    try:
        import cupy  # type: ignore[import-not-found]

        stream = torch.cuda.current_stream().cuda_stream
        nbytes = inputs[0].numel() * inputs[0].element_size()
        src, dst = inputs[0].data_ptr(), dsts[0].data_ptr()
        memcpy = cupy.cuda.runtime.memcpyAsync
        us["floor_cupy_memcpy_async_1"] = per_call_us(lambda: memcpy(dst, src, nbytes, 3, stream))
    except Exception as exc:  # CuPy absent or refusing: the floor is only informative
        us["floor_cupy_memcpy_async_1"] = f"n/a ({type(exc).__name__})"
    parts = ("part_sign", "part_entries_get", "part_env_settings", "part_inputs_load", "part_graph_replay",
             "part_outputs_copy")
    us["sum_of_parts_default"] = round(sum(us[k] for k in parts), 3)
    us["unexplained_default_python"] = round(us["graphed_default_python"] - us["sum_of_parts_default"], 3)

    prof = cProfile.Profile()  # the Python path (the lane's C function would show as one line)
    prof.enable()
    for _ in range(20000):
        python_path(*inputs)
    prof.disable()
    torch.cuda.synchronize()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(30)
    result["profile_top"] = buf.getvalue()
    text = json.dumps(result, indent=1)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "replay_profile.json").write_text(text)
    print(json.dumps(us, indent=1))
    print(result["profile_top"])


if __name__ == "__main__":
    main()
