"""Probe (GPU, Paddle kit): a step that advances a closed-over state in place with
``paddle.assign(paddle.matmul(state, a), state)`` and returns ``paddle.matmul(x, state)``, 8 calls, graphed with
tracers ``eager`` and ``sot``, against plain eager Paddle on the same GPU and against numpy (float64).

Prints one JSON line per tracer: the relative error of outputs and state against eager Paddle and numpy, whether
the state's memory moved between calls, and the graphed function's counters.  Ends with os._exit (Paddle 2.6
may hang at exit there)."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import paddle

sys.path.insert(0, os.getcwd())
import graphjit

N = 64
rng = np.random.default_rng(0)
A = (rng.standard_normal((N, N)) / N**0.5).astype(np.float32) + np.eye(N, dtype=np.float32)
S0 = rng.standard_normal((N, N)).astype(np.float32)
XS = [rng.standard_normal((N, N)).astype(np.float32) for _ in range(8)]


def T(a: np.ndarray):
    return paddle.to_tensor(a, place=paddle.CUDAPlace(0))


_S: dict = {}


def step(x):
    paddle.assign(paddle.matmul(_S["state"], _S["a"]), _S["state"])
    return paddle.matmul(x, _S["state"])


def run(graphed: str | None):
    _S["state"], _S["a"] = T(S0.copy()), T(A)
    f = graphjit.graphed(step, tracer=graphed) if graphed else step
    outs, ptrs = [], []
    with paddle.no_grad():
        for x in XS:
            outs.append(f(T(x)).numpy())
            ptrs.append(_S["state"].data_ptr())
    return outs, _S["state"].numpy(), ptrs, (f.stats() if graphed else None)


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def main() -> None:
    s = S0.astype(np.float64)
    ref_np = []
    for x in XS:
        s = s @ A
        ref_np.append(x @ s)
    e_outs, e_state, _, _ = run(None)
    print(json.dumps({"tracer": "plain eager paddle", "out_vs_numpy": max(rel(a, b) for a, b in zip(e_outs, ref_np)),
                      "state_vs_numpy": rel(e_state, s)}), flush=True)
    for tracer in ("eager", "sot"):
        try:
            outs, state, ptrs, st = run(tracer)
            print(json.dumps({"tracer": tracer,
                              "out_vs_eager": [round(rel(a, b), 6) for a, b in zip(outs, e_outs)],
                              "state_vs_eager": rel(state, e_state), "state_vs_numpy": rel(state, s),
                              "state_moved": len(set(ptrs)) > 1, "graphs": st["graphs"], "replays": st["replays"],
                              "fallbacks": st["fallbacks"], "verify": [k.get("verify") for k in st["keys"]]}),
                  flush=True)
        except Exception as exc:  # the finding
            print(json.dumps({"tracer": tracer, "error": f"{type(exc).__name__}: {exc}"[:2000]}), flush=True)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
