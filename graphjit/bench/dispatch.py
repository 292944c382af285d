"""``python -m graphjit bench dispatch``: what graphjit's key path costs per call, on the host.

For each framework that is importable (torch, paddle; CPU tensors, so it runs on any machine) it
times, with ``time.perf_counter_ns`` over ``--iters`` calls, ``--repeats`` times (median reported,
microseconds per call):

* ``direct``:  a trivial function of 4 tensors and an int (it returns its first argument);
* ``sign``:    :meth:`graphjit.keys.Signer.sign` alone on the same arguments (the replay lane built and loaded
  first, so that its C check of the call's layout signs it, as on a replayed call's Python path);
* ``sign_python``: the same with the Python comparison alone (``Signer.layout_checks`` off);
* ``graphed``: the ``@graphjit.graphed`` call (default options); on CPU tensors it takes the no-CUDA
  fallback path, so it is sign + the cache lookups + the bookkeeping + the traced call.  For paddle
  the default tracer is SOT, so this includes a call of the SOT-translated function;
* ``graphed_eager``: the same with ``tracer="eager"`` (paddle only; torch's default tracer is eager):
  graphjit's own key path without a tracer's cost.

Ratios ``graphed / direct`` and ``sign / direct`` and the absolute overhead ``graphed - direct`` are
reported.  Writes ``dispatch_<tag>_<date>.json`` and a PNG bar plot next to it.

The input tensors are made in ``graphjit.bench.{torch,paddle}.dispatch``; nothing here imports a framework.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import time
from collections.abc import Callable
from typing import Any, cast

from . import common
from .common import say

FRAMEWORKS = ("torch", "paddle")
N_TENSORS = 4
SHAPE = (8, 16)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", choices=("auto", *FRAMEWORKS), default="auto",
                        help="framework to measure (default auto: every importable one)")
    parser.add_argument("--iters", type=common.positive_int, default=20000, help="calls per timed repeat")
    parser.add_argument("--repeats", type=common.positive_int, default=7, help="timed repeats (median reported)")


def trivial(a: Any, b: Any, c: Any, d: Any, n: int) -> Any:
    """The function under test: no tensor work at all, so every microsecond above it is overhead."""
    return a


def _time(call: Callable[..., Any], args: tuple[Any, ...], iters: int, repeats: int) -> list[float]:
    """Microseconds per call, one sample per repeat; one untimed repeat first (caches, lazy imports)."""
    samples: list[float] = []
    perf = time.perf_counter_ns
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for r in range(repeats + 1):
            n = max(1, iters // 10) if r == 0 else iters
            t0 = perf()
            for _ in range(n):
                call(*args)
            dt = perf() - t0
            if r:
                samples.append(dt / n / 1e3)
    finally:
        if gc_was_enabled:
            gc.enable()
    return samples


def measure(framework: str, iters: int, repeats: int) -> dict[str, Any]:
    """One framework's numbers (raises if the framework cannot run)."""
    import graphjit
    from graphjit.keys import Signer

    from .. import backends

    args = backends.load(framework, "dispatch", "bench").make_inputs(N_TENSORS, SHAPE)
    lane_status = common.prepare_lane()  # signing asks the lane's C check where it is loaded
    signer = Signer(trivial, None, "auto", "trivial")
    python_signer = Signer(trivial, None, "auto", "trivial")
    python_signer.layout_checks = False  # the Python comparison alone, for the record
    step = cast(graphjit.GraphedFunction, graphjit.graphed(trivial))
    steps: dict[str, Callable[..., Any]] = {"graphed": step}
    if framework == "paddle":  # its default tracer is SOT; this one isolates graphjit's own path
        steps["graphed_eager"] = graphjit.graphed(trivial, tracer="eager")

    def sign(*a: Any) -> Any:
        return signer.sign(None, a, {})

    def sign_python(*a: Any) -> Any:
        return python_signer.sign(None, a, {})

    samples = {
        "direct": _time(trivial, args, iters, repeats),
        "sign": _time(sign, args, iters, repeats),
        "sign_python": _time(sign_python, args, iters, repeats),
    }
    for name, fn in steps.items():
        fn(*args)  # first call: picks the backend, traces, logs why there is no graph
        samples[name] = _time(fn, args, iters, repeats)
    us: dict[str, Any] = {k: common.median(v) for k, v in samples.items()}  # floats: repeats >= 1, no list is empty
    direct, sign_us, graphed_us = us["direct"], us["sign"], us["graphed"]
    key_path_us = us.get("graphed_eager", graphed_us)  # graphjit's own path, eager tracer
    stats = step.stats()
    fallbacks = stats.get("fallbacks", {})
    path = "replay" if stats.get("graphs") else ("fallback: " + ", ".join(fallbacks) if fallbacks else "unknown")
    return {
        "status": "ok",
        "version": _version(framework),
        "us": us,
        "min_us": {k: min(v) for k, v in samples.items()},
        "samples_us": samples,
        "ratio": {f"{k}_vs_direct": (v / direct if direct else None) for k, v in us.items() if k != "direct"},
        "overhead_us": graphed_us - direct,
        "graphed_tracer": "sot" if framework == "paddle" else "eager",
        "key_path_overhead_us": key_path_us - direct,
        "sign_share_of_key_path": sign_us / (key_path_us - direct) if key_path_us > direct else None,
        "graphed_path": path,
        "lane": lane_status,  # sign: by the lane's C check where it is loaded; sign_python: the Python comparison
        "stats": {k: stats.get(k) for k in ("calls", "graphs", "replays", "fallbacks")},
    }


def _version(framework: str) -> str:
    import sys

    return str(getattr(sys.modules.get(framework), "__version__", "?"))


def _available(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def run(args: argparse.Namespace) -> int:
    tag = common.machine_tag(args)
    json_path, png_path = common.output_paths(args.out, f"dispatch_{tag}_{common.today()}.json")
    wanted = FRAMEWORKS if args.backend == "auto" else (args.backend,)
    results: dict[str, Any] = {}
    for fw in wanted:
        if not _available(fw):
            results[fw] = {"status": "skipped", "reason": f"{fw} is not installed"}
            continue
        say(f"dispatch: {fw}: {args.repeats} x {args.iters} calls per variant ...")
        results[fw] = common.guarded(lambda fw=fw: measure(fw, args.iters, args.repeats))
    data = common.header("dispatch", args, tag)
    data.update({
        "description": "host cost per call of graphjit's key path against a direct call (CPU tensors); "
                       "median over repeats, microseconds per call",
        "config": {"iters": args.iters, "repeats": args.repeats, "n_tensors": N_TENSORS, "n_ints": 1,
                   "tensor_shape": list(SHAPE), "device": "cpu", "timer": "time.perf_counter_ns",
                   "function": "trivial(a, b, c, d, n) -> a"},
        "env": common.environment(),
        "results": results,
    })
    ok = {fw: r for fw, r in results.items() if r.get("status") == "ok"}
    plot_note = None
    if not args.no_plot and ok:
        plot_note = common.bar_plot(
            png_path, f"graphjit dispatch cost per call (CPU tensors, {tag})", list(ok),
            {name: [r["us"].get(name) for r in ok.values()] for name in ("direct", "sign", "graphed", "graphed_eager")},
            "microseconds per call (median)")
    data["plot"] = None if (args.no_plot or not ok or plot_note) else png_path.name
    if plot_note:
        data["plot_error"] = plot_note
    common.write_json(json_path, data)

    rows = []
    for fw, r in results.items():
        if r.get("status") == "ok":
            rows.append([fw, r["us"]["direct"], r["us"]["sign"], r["us"]["sign_python"], r["us"]["graphed"],
                         r["us"].get("graphed_eager"), r["ratio"]["graphed_vs_direct"],
                         f"{r['graphed_path']} (tracer {r['graphed_tracer']})"])
        else:
            rows.append([fw, None, None, None, None, None, None, r.get("error") or r.get("reason")])
    say(common.format_table(["framework", "direct us", "sign us", "sign (Python) us", "graphed us",
                             "graphed eager-tracer us", "graphed/direct", "path"], rows))
    say(f"wrote {json_path}" + (f" and {png_path}" if data["plot"] else ""))
    if plot_note:
        say(f"no plot: {plot_note}")
    failed = [fw for fw, r in results.items() if r.get("status") == "error"]
    for fw in failed:
        say(f"dispatch: {fw} failed: {results[fw]['error']}")
    return 1 if failed or not ok else 0
