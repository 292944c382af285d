"""Where graphjit's own host time goes when a ``capture_scope`` captures many sizes, on the CPU: ``bench capture``'s
step (:func:`graphjit.bench.torch.capture.make_step`) captured at each size under the graph emulator
(tests/graph_emulator.py), against three eager runs of the step per size (what capturing by hand runs: two warmups
and the capture).  The emulator's own capture (a dispatch-mode recording of the step) and its replays are timed and
taken out, and so are the step's two eager runs graphjit makes per size (the call's own and the scope's extra
warmup), so what is left (``graphjit_own_ms_per_size``) is graphjit's bookkeeping: the watched warmups' walks, write
probes, guard scans and host-generator copies, the snapshot and Python state of the extra run, the guard set, the
verify's comparison.  Each of those is timed by wrapping it (``parts_ms_per_size``; inclusive times, so parts nest).

The emulator's CPU-GPU sync watch (a dispatch mode: a GPU's is a flag) is left off, as the step never syncs.  The
recorder of names and host reads (:class:`graphjit.names.NameRecorder`) stays on and is not wrapped: a wrapper of
anything that runs while its hook is set would be seen reading the clock.

Diagnostic only: a GPU host runs this Python at another speed, and ``bench capture`` (a GPU) is the claim.  Usage
(repo root, torch installed): ``python tools/probes/capture_scope_emulated.py [--layers 8] [--hidden 256]
[--sizes 1,2,4,...] [--out FILE]``
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import gc
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import graph_emulator  # noqa: E402
import torch  # noqa: E402

import graphjit  # noqa: E402
from graphjit import capture, guards, host_random, lifecycle, pystate, warmup, writes  # noqa: E402
from graphjit.bench.capture import VLLM_SIZES  # noqa: E402
from graphjit.bench.torch.capture import make_step  # noqa: E402

_spent: collections.Counter[str] = collections.Counter()
_calls: collections.Counter[str] = collections.Counter()


def _timed(label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter_ns()
        try:
            return fn(*args, **kwargs)
        finally:
            _spent[label] += time.perf_counter_ns() - t0
            _calls[label] += 1
    return timed


# (owner, attribute, label): what is wrapped; every one of them runs outside the name recorder's block
PARTS: tuple[tuple[Any, str, str], ...] = (
    (lifecycle, "watched_call", "watched runs (the step's own run included)"),
    (warmup, "walk", "walks of the function's state (in watched runs)"),
    (warmup, "WriteProbe", "write probes: versions and small tensors' contents before a run"),
    (writes.WriteProbe, "written", "write probes: what a run wrote"),
    (guards, "scan", "guard scans (before the last run)"),
    (host_random.Saved, "__init__", "host generators: copies"),
    (host_random.Saved, "moved", "host generators: checks"),
    (lifecycle, "Snapshot", "extra run: snapshot of what it may write"),
    (lifecycle, "PyState", "extra run: Python state taken"),
    (pystate.PyState, "restore", "extra run: Python state put back"),
    (capture, "GuardSet", "the key's guard set"),
    (capture, "after_capture", "after the capture (its walk, its writes)"),
    (capture, "verify_and_replay", "verify: replay and comparison (emulated replay included)"),
    (graph_emulator.EmulatedTorchBackend, "capture_graph", "EMULATOR capture (the step recorded)"),
    (graph_emulator.EmulatedGraph, "replay", "EMULATOR replays"),
)


@contextlib.contextmanager
def _wrapped() -> Any:
    saved = [(owner, name, getattr(owner, name)) for owner, name, _label in PARTS]
    try:
        for owner, name, label in PARTS:
            setattr(owner, name, _timed(label, getattr(owner, name)))
        yield
    finally:
        for owner, name, fn in saved:
            setattr(owner, name, fn)


def measure(layers: int, hidden: int, sizes: list[int]) -> dict[str, Any]:
    """One warm pass, then the timed one: graphjit's scope over ``sizes`` and the eager steps it stands against."""
    gen = torch.Generator().manual_seed(0)
    scale = hidden ** -0.5
    weights = [(torch.randn(hidden, generator=gen) * 0.1 + 1, torch.randn(2 * hidden, hidden, generator=gen) * scale,
                torch.randn(hidden, hidden, generator=gen) * scale) for _ in range(layers)]
    step = make_step(torch, weights)
    order = sorted(set(sizes), reverse=True)
    inputs = {b: torch.randn(b, hidden, generator=gen) for b in order}

    def scope() -> Any:
        fn = graphjit.graphed(step, warmup=2)
        with graphjit.capture_scope(progress=False, total=len(order)):
            for b in order:
                fn(inputs[b])
        return fn

    def eager(runs: int) -> float:
        t0 = time.perf_counter_ns()
        for b in order:
            for _ in range(runs):
                step(inputs[b])
        return (time.perf_counter_ns() - t0) / 1e6

    n = len(order)
    torch.set_num_threads(1)  # the step's own time is taken out: one thread keeps it steady on a busy machine
    with graph_emulator.emulated_torch() as emulated, torch.no_grad():
        emulated.sync_watch = lambda hits: contextlib.nullcontext()  # type: ignore[method-assign]
        scope()
        eager(3)
        gc.collect()
        by_hand = eager(3)
        with _wrapped():
            t0 = time.perf_counter_ns()
            fn = scope()
            total = (time.perf_counter_ns() - t0) / 1e6
        stats = fn.stats()
    parts = {label: round(_spent[label] / 1e6 / n, 3) for _o, _n, label in PARTS}
    emulator = sum(v for k, v in parts.items() if k.startswith("EMULATOR"))
    step_ms = by_hand / 3 / n
    return {
        "config": {"layers": layers, "hidden": hidden, "sizes": order},
        "graphs": stats.get("graphs"), "fallbacks": stats.get("fallbacks"),
        "total_ms_per_size": round(total / n, 3),
        "three_eager_steps_ms_per_size": round(by_hand / n, 3),
        "emulator_ms_per_size": round(emulator, 3),
        "graphjit_own_ms_per_size": round(total / n - emulator - 2 * step_ms, 3),
        "parts_ms_per_size": parts,
        "calls_per_size": {label: round(_calls[label] / n, 2) for _o, _n, label in PARTS},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=256, help="256: the step's matrices are past the write probe's "
                   "64 KiB content comparison, as bench capture's 1024 in bf16 are on a GPU")
    p.add_argument("--sizes", default=",".join(map(str, VLLM_SIZES)))
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    data = measure(args.layers, args.hidden, [int(s) for s in args.sizes.split(",")])
    print(json.dumps({k: v for k, v in data.items() if k not in ("config", "calls_per_size")}, indent=1))
    if args.out is not None:
        args.out.write_text(json.dumps(data, indent=1))


if __name__ == "__main__":
    main()
