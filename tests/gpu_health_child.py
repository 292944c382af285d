"""One fresh process of tests/test_gpu_health.py: a graphed function whose capture fails in one way (or, for
``fresh``, the first graphed key of the process), then what a program does next.

Prints one JSON line ``RESULT {...}`` and leaves with os._exit.  Usage: ``python tests/gpu_health_child.py KIND``.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import traceback

import torch

import graphjit

dev = torch.device("cuda", 0)
W = torch.randn(256, 256, device=dev) / 16
calls = {"n": 0}


def settle() -> int:
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return torch.cuda.memory_reserved(dev)


def plain(x):
    return torch.relu(x @ W) + 1


def sync_only_the_capture_sees(x):
    y = torch.relu(x @ W)
    torch.cuda.synchronize()  # the sync debug mode does not report this one; the capture fails on it
    return y + 1


gen = None


def uncapturable_op(x):
    # a generator of the user's own: a CUDA graph replays only the default generator
    return torch.relu(x @ W) + torch.rand(x.shape, device=x.device, generator=gen)


def raises_in_capture(x):
    y = torch.relu(x @ W)
    if torch.cuda.is_current_stream_capturing():
        raise ValueError("the function refuses to be captured")
    return y + 1


@graphjit.eager
def grows(y):
    calls["n"] += 1
    return y[:, : 8 + (calls["n"] > 2)]  # its third call returns another shape: its contract broken


def island_breaks_contract(x):
    y = torch.relu(x @ W)
    return grows(y) * 2


def main(kind: str) -> dict:
    global gen
    res: dict = {"kind": kind}
    fn = {"fresh": plain, "sync_only_the_capture_sees": sync_only_the_capture_sees,
          "uncapturable_op": uncapturable_op, "raises_in_capture": raises_in_capture,
          "island_breaks_contract": island_breaks_contract}[kind]
    x = torch.randn(64, 256, device=dev)
    # cuBLAS and the allocator warmed up on the streams graphjit uses, before the baseline
    warm = graphjit.graphed(lambda t: torch.relu(t @ W) + 1)
    for _ in range(4):
        warm(x + 1)
    res["warm"] = warm.stats()["graphs"]
    del warm
    base = settle()

    f = graphjit.graphed(fn)
    outs_ok = True
    for i in range(5):
        if kind == "uncapturable_op":
            gen = torch.Generator(device=dev).manual_seed(i)
            ref_gen = torch.Generator(device=dev).manual_seed(i)
            want = torch.relu(x @ W) + torch.rand(x.shape, device=dev, generator=ref_gen)
        elif kind == "island_breaks_contract":
            want = None
        else:
            want = plain(x)
        got = f(x)
        if want is not None:
            outs_ok = outs_ok and torch.equal(got, want)
    st = f.stats()
    res.update(outputs_equal_eager=outs_ok, graphs=st["graphs"], replays=st["replays"],
               fallbacks=st["fallbacks"], verify=[k.get("verify") for k in st["keys"]])
    # the same function captures another key afterwards (its pool is usable)
    x2 = torch.randn(32, 256, device=dev)
    if kind in ("fresh", "raises_in_capture", "sync_only_the_capture_sees"):
        other = graphjit.graphed(plain)
        for _ in range(4):
            ok2 = torch.equal(other(x2), plain(x2))
        res["other_key"] = {"graphs": other.stats()["graphs"], "equal": ok2}
        del other
    del f, got
    res["reserved_after_drop_minus_base"] = settle() - base

    # random numbers, drawn eagerly and by a new graph, follow the generator as eager ones do
    torch.manual_seed(7)
    eager = [torch.rand(4, 256, device=dev) for _ in range(6)]
    torch.manual_seed(7)
    noisy = graphjit.graphed(lambda t: t + torch.rand_like(t))
    z = torch.zeros(4, 256, device=dev)
    drawn = [noisy(z).clone() for _ in range(6)]
    st = noisy.stats()
    res["rng"] = {"graphs": st["graphs"], "replays": st["replays"], "fallbacks": st["fallbacks"],
                  "equal_eager": all(torch.equal(a, b) for a, b in zip(drawn, eager))}
    torch.cuda.synchronize()
    return res


if __name__ == "__main__":
    try:
        out = main(sys.argv[1])
    except BaseException as exc:  # the finding: reported, never a hang
        out = {"kind": sys.argv[1], "crash": f"{type(exc).__name__}: {exc}", "tb": traceback.format_exc()[-3000:]}
    sys.stdout.write("RESULT " + json.dumps(out, default=str) + "\n")
    sys.stdout.flush()
    os._exit(0)
