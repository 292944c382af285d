"""The host cost of a replayed ``@graphed`` call on the CPU, graphjit's own part only: the graph emulator
(tests/graph_emulator.py) with its launch stubbed (a replay does no tensor work), so what is timed is the wrapper,
the signing, the checks, the hand-off's table and the result, with the replay lane (graphjit/lane.py) on and off; and
graphjit's own part of one island boundary of a piecewise graph (``island_boundary_us``).

Diagnostic only (a GPU host runs this Python about three times slower; ``bench decode``'s host-cost part is the
claim).  Usage (repo root, torch installed): ``python tools/probes/host_cost_emulated.py [--out FILE]``
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import graph_emulator  # noqa: E402
import torch  # noqa: E402
from call_timer import per_call_us  # noqa: E402  # (re-exported: hf_decode_host_emulated.py imports it from here)

import graphjit  # noqa: E402
from graphjit import env, lane  # noqa: E402


def tiny(a: Any, b: Any, c: Any, d: Any) -> Any:
    return a + b + c + d


def measure(inputs: list[Any]) -> dict[str, float]:
    """The default call and static inputs with alias outputs, and the default call by graphjit's Python path alone
    (``python_path_default``: no plan serves it; with the lane loaded, its signing is the lane's C check)."""
    default = graphjit.graphed(tiny)
    alias = graphjit.graphed(tiny, outputs="alias")
    python_path = graphjit.graphed(tiny)
    python_path._self_state.lane_allowed = False
    for _ in range(default.graphjit_options.warmup + 3):
        default(*inputs)
        alias(*inputs)
        python_path(*inputs)
    static, _ = alias.static_inputs(*inputs)
    for _ in range(3):
        alias(*static)
    return {"default": per_call_us(lambda: default(*inputs)), "static_alias": per_call_us(lambda: alias(*static)),
            "python_path_default": per_call_us(lambda: python_path(*inputs))}


BOUNDARIES = 8


def boundary_us() -> dict[str, float]:
    """graphjit's own host cost of one island boundary: a chain of ``BOUNDARIES + 1`` small layers graphed whole
    against the same chain with an identity island between each two (``BOUNDARIES + 1`` segments)."""
    w = torch.randn(16, 16)

    @graphjit.eager
    def nothing(h: Any) -> Any:
        return h

    def chain(x: Any, cut: bool) -> Any:
        h = torch.tanh(x @ w)
        for _ in range(BOUNDARIES):
            if cut:
                h = nothing(h)
            h = torch.tanh(h @ w)
        return h

    x = torch.randn(4, 16)
    us = {}
    with torch.no_grad():
        for cut in (False, True):
            g = graphjit.graphed(lambda x, cut=cut: chain(x, cut))  # a plain call: x alone
            for _ in range(g.graphjit_options.warmup + 3):
                g(x)
            us["piecewise" if cut else "whole"] = per_call_us(lambda g=g: g(x), iters=5000)
            st = g.stats()
            segments = st["keys"][0].get("segments")
            if segments != (BOUNDARIES + 1 if cut else 1) or st["fallbacks"] or st["replays"] < st["calls"] - 5:
                raise RuntimeError(f"expected every timed call replayed through {BOUNDARIES + 1 if cut else 1} "
                                   f"segments, got {segments} segments, {st['replays']} replays of {st['calls']} "
                                   f"calls, fallbacks {st['fallbacks']}")
    us["per_boundary"] = round((us["piecewise"] - us["whole"]) / BOUNDARIES, 3)
    return us


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    graph_emulator.EmulatedGraph.replay = lambda self: None  # the launch stubbed: graphjit's part only
    graph_emulator.EmulatedFeed.launch = lambda self, n_in, n_out: 0
    inputs = [torch.randn(8, 256) for _ in range(4)]
    result: dict[str, Any] = {"eager_us": per_call_us(lambda: tiny(*inputs)), "inputs": "4 x float32[8, 256]"}
    with graph_emulator.emulated_torch():
        for mode in ("off", "on"):
            os.environ["GRAPHJIT_LANE"] = mode
            env.refresh()
            lane.prepare()
            result[f"lane_{mode}_us"] = measure(inputs)
        result["island_boundary_us"] = boundary_us()
    result["lane"] = lane.status()
    print(json.dumps(result, indent=2))
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
