"""Several threads calling one graphed function at once get what eager would give them (CPU)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

import graphjit

HAS_PADDLE = importlib.util.find_spec("paddle") is not None
HAS_TORCH = importlib.util.find_spec("torch") is not None
if HAS_PADDLE:
    import paddle
if HAS_TORCH:
    import torch

ROOT = Path(__file__).resolve().parents[1]
THREADS = 4
CALLS = 25


def hammer(call, inputs, expected, close):
    """Run ``call(inputs[i])`` CALLS times in each of THREADS threads started together; return the problems."""
    problems: list[str] = []
    barrier = threading.Barrier(THREADS)

    def worker(i):
        barrier.wait()
        for j in range(CALLS):
            try:
                got = call(inputs[i])
            except Exception as exc:  # reported, not swallowed: the test fails on any
                problems.append(f"thread {i} call {j}: {type(exc).__name__}: {exc}")
                return
            if not close(got, expected[i]):
                problems.append(f"thread {i} call {j}: result differs from eager")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    return problems


def body(x, n: int):
    y = x
    for i in range(n):
        y = y * 2 + i
    return y.sum(-1)


@pytest.mark.paddle
def test_paddle_threads_equal_eager_with_the_eager_tracer():
    g = graphjit.graphed(body, tracer="eager")
    inputs = [paddle.randn([4 + i, 8]) for i in range(THREADS)]  # different shapes: different keys
    expected = [body(x, 3).numpy() for x in inputs]
    problems = hammer(lambda x: g(x, 3), inputs, expected,
                      lambda got, want: np.allclose(got.numpy(), want, rtol=1e-6))
    assert problems == []


@pytest.mark.torch
def test_torch_threads_equal_eager():
    g = graphjit.graphed(body)
    inputs = [torch.randn(4 + i % 2, 8) for i in range(THREADS)]
    expected = [body(x, 3) for x in inputs]
    problems = hammer(lambda x: g(x, 3), inputs, expected, lambda got, want: torch.allclose(got, want))
    assert problems == []


SOT_SCRIPT = textwrap.dedent("""
    import sys, threading
    import numpy as np
    import paddle
    import graphjit

    def body(x, n):
        y = x
        for i in range(n):
            y = y * 2 + i
        return y.sum(-1)

    g = graphjit.graphed(body)  # default paddle tracer: sot
    inputs = [paddle.randn([4, 8]) for _ in range(4)]
    want = [body(x, 3).numpy() for x in inputs]
    bad = []
    barrier = threading.Barrier(4)

    def worker(i):
        barrier.wait()
        for _ in range(10):
            try:
                if not np.allclose(g(inputs[i], 3).numpy(), want[i]):
                    bad.append("result differs from eager")
            except Exception as exc:
                bad.append(type(exc).__name__)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print("PROBLEMS", len(bad), sorted(set(bad)))
    sys.exit(1 if bad else 0)
""")


@pytest.mark.paddle
def test_paddle_threads_equal_eager_with_the_default_sot_tracer():
    # In a child process: the failure mode includes a crash of the interpreter.
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRAPHJIT_")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", SOT_SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, f"rc={proc.returncode}: {proc.stdout[-500:]} {proc.stderr[-1500:]}"
    assert "PROBLEMS 0 []" in proc.stdout
