"""graphjit doctor: a tiny Paddle capture-and-replay on GPU 0 (matmul and copies only, checked in numpy).

Run in its own process by :func:`graphjit.doctor.paddle.rows._paddle_gpu_probes`, one per tracer::

    python -m graphjit.doctor.paddle.probe TRACER KERNELS PLACE

``TRACER``: ``eager`` or ``sot``; ``KERNELS``: ``kernels`` also checks an elementwise add on the device
(``-``: not); ``PLACE``: ``gpu`` (GPU 0) or ``cpu`` (tests of this probe).  It prints one line,
:data:`~graphjit.doctor.children.RESULT_MARK` followed by JSON (``ok``, ``calls``, ``worst``, ``worst_numpy``,
``stats``, ``elementwise_ok``; or ``error`` and ``traceback``), and always ends with ``os._exit(0)``: Paddle's
teardown never runs with graphs alive.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from typing import Any, NoReturn, cast

from ..children import RESULT_MARK

# Module globals, as in a script: tiny() reads them (the tracers see global loads), main() sets them.
paddle: Any = None
W1: Any = None
W2: Any = None


def tiny(x: Any) -> Any:
    """The graphed function: two matmuls, no elementwise kernel."""
    return paddle.matmul(paddle.matmul(x, W1), W2)


def _done(result: dict[str, Any]) -> NoReturn:
    """Print the result line and end the process without Python's (and Paddle's) teardown."""
    sys.stdout.write(RESULT_MARK + json.dumps(result) + "\n")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # never run Paddle's teardown with graphs alive


def main(argv: list[str]) -> NoReturn:
    """Run the probe for ``argv`` (TRACER KERNELS PLACE) and report; never returns."""
    global paddle, W1, W2
    result: dict[str, Any] = {"ok": False}
    try:
        import numpy as np
        import paddle as paddle_module

        import graphjit

        paddle = paddle_module
        tracer, kernels = argv[0], argv[1] == "kernels"
        place = paddle.CUDAPlace(0) if argv[2] == "gpu" else paddle.CPUPlace()  # cpu: tests of this script
        rng = np.random.default_rng(0)
        # Small integers: every product and sum is exact in fp32, also under TF32.
        W1_np = rng.integers(-2, 3, (64, 64)).astype(np.float32)
        W2_np = rng.integers(-2, 3, (64, 32)).astype(np.float32)
        W1 = paddle.to_tensor(W1_np, place=place)
        W2 = paddle.to_tensor(W2_np, place=place)

        step = cast(graphjit.GraphedFunction, graphjit.graphed(tiny, tracer=tracer, strict=True))
        calls, worst, worst_np = 4, 0.0, 0.0
        with paddle.no_grad():
            for _ in range(calls):
                x_np = rng.integers(-2, 3, (8, 64)).astype(np.float32)
                x = paddle.to_tensor(x_np, place=place)
                got = step(x).numpy().astype(np.float64)
                eager = tiny(x).numpy().astype(np.float64)
                want = x_np.astype(np.float64) @ W1_np.astype(np.float64) @ W2_np.astype(np.float64)
                scale = max(float(np.linalg.norm(want)), 1e-30)
                worst = max(worst, float(np.linalg.norm(got - eager)) / scale)
                worst_np = max(worst_np, float(np.linalg.norm(got - want)) / scale)
        result.update(ok=True, calls=calls, worst=worst, worst_numpy=worst_np, stats=step.stats())
        if kernels:
            try:
                a = paddle.to_tensor(x_np, place=place)
                s = paddle.add(a, a).numpy()
                result["elementwise_ok"] = bool(np.array_equal(s, 2 * x_np))
            except Exception as exc:
                result["elementwise_ok"] = False
                result["elementwise_error"] = type(exc).__name__ + ": " + str(exc).strip().splitlines()[-1][:200]
    except BaseException as exc:
        lines = [line for line in str(exc).strip().splitlines() if line.strip()]
        result["error"] = (type(exc).__name__ + ": " + (lines[-1] if lines else ""))[:300]
        result["traceback"] = traceback.format_exc()[-2000:]
    _done(result)


if __name__ == "__main__":
    main(sys.argv[1:])
