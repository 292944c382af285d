"""The host cost of a replayed ``@graphed`` call with Paddle tensors on the CPU, the graph's work left out: the Paddle
graph emulator (tests/graph_emulator_paddle.py) with its replay stubbed (a replay does no tensor work), so what is
timed is graphjit's wrapper, the signing (Paddle's tensor attributes read once a tensor), the guards, and the
Paddle copies the call makes (``default``: four inputs in and the output out; ``alias``: the inputs; ``static_alias``:
none); beside it those Paddle operations timed alone (``paddle_*``), and the signing and Paddle's modes apart
(``part_*``).  Paddle keys take graphjit's Python path (the replay lane serves graphs with feed nodes, which only
torch's have).

Diagnostic only: a GPU host runs this Python at another speed, and Paddle's own operations cost more there
(``bench decode --backend paddle``'s host-cost part is the claim).  Usage (repo root, paddle installed):
``python tools/probes/host_cost_paddle_emulated.py [--iters N] [--out FILE]``
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import graph_emulator_paddle  # noqa: E402
import numpy as np  # noqa: E402
import paddle  # noqa: E402
from call_timer import per_call_us as timed_us  # noqa: E402

import graphjit  # noqa: E402
import graphjit.backends as registry  # noqa: E402


def tiny(a: Any, b: Any, c: Any, d: Any) -> Any:
    return a + b + c + d


def graphed_pair(fn: Callable[..., Any], inputs: list[Any]) -> tuple[Any, Any, tuple[Any, ...]]:
    """``fn`` graphed with the eager tracer twice, by default and with aliased outputs, each key captured and replayed
    (``host_profile_paddle.py`` shares it), and the aliased one's static inputs, replayed too."""
    default = graphjit.graphed(fn, tracer="eager")
    alias = graphjit.graphed(fn, tracer="eager", outputs="alias")
    for _ in range(default.graphjit_options.warmup + 3):
        default(*inputs)
        alias(*inputs)
    static, _ = alias.static_inputs(*inputs)
    for _ in range(3):
        alias(*static)
    return default, alias, static


def stub_replay() -> None:
    """The emulator's replay stubbed (graphs captured and verified: a replay does no tensor work from now)."""
    graph_emulator_paddle.RerunGraph.replay = lambda self: None


def measure(inputs: list[Any], iters: int) -> dict[str, Any]:
    """Per call: eager, the default call (inputs copied, output copied), aliased outputs, static inputs with aliased
    outputs, the signing alone; and Paddle's own operations for the same work."""
    default, alias, static = graphed_pair(tiny, inputs)
    stub_replay()
    st = alias._self_state
    backend = registry.get("paddle")
    targets = [t.clone() for t in inputs]

    def per_call_us(fn: Callable[[], Any]) -> float:
        return timed_us(fn, iters, warm=200)

    us = {
        "eager": per_call_us(lambda: tiny(*inputs)),
        "default": per_call_us(lambda: default(*inputs)),
        "alias": per_call_us(lambda: alias(*inputs)),
        "static_alias": per_call_us(lambda: alias(*static)),
        "part_sign": per_call_us(lambda: st.signer.sign_plain(None, static)),
        "part_modes": per_call_us(backend.modes),
        "paddle_copy_4_inputs": per_call_us(lambda: [t.copy_(x, False) for t, x in zip(targets, inputs)]),
        "paddle_clone_output": per_call_us(lambda: backend.clone(inputs[0])),
    }
    stats = {g.stats()["function"] + (" alias" if g is alias else ""): {k: g.stats()[k] for k in ("calls", "replays",
             "fallbacks")} for g in (default, alias)}
    return {"us": us, "stats": stats}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--iters", type=int, default=5000, help="calls per timing (nine timings, the median kept)")
    args = p.parse_args()
    paddle.set_device("cpu")
    rng = np.random.default_rng(0)
    inputs = [paddle.to_tensor(rng.standard_normal((8, 256)).astype("float32")) for _ in range(4)]
    result: dict[str, Any] = {"paddle": paddle.__version__, "inputs": "4 x float32[8, 256]"}
    with graph_emulator_paddle.emulated_paddle(), paddle.no_grad():
        result.update(measure(inputs, args.iters))
    print(json.dumps(result, indent=2))
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
