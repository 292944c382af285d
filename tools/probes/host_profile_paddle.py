"""Where the host time of a replayed ``@graphed`` call with Paddle tensors goes: ``bench decode --backend paddle``'s
host-cost call (four 8x256 inputs, three matrix products) graphed with the eager tracer, default and with static
inputs and aliased outputs, each timed and then run under cProfile, the costliest functions by own time kept; beside
them Paddle's own operations the call is made of (the replay alone, the tensors' attributes signing reads, Paddle's
modes).

Why: on the GPU host at 13af2a9 the static-and-alias call cost 77.9 us, the signing 23.5 and the raw replay 4.0, where
the Paddle graph emulator on a CPU puts graphjit's part of the same call at 6.5 us beside the signing: what is the
rest?  Diagnostic only (``bench decode --backend paddle`` makes the claims).

Usage (repo root): on the GPU machine ``python tools/probes/host_profile_paddle.py --out DIR``; on a CPU
``--emulate`` (the Paddle graph emulator, its replay stubbed: for the probe's own test).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import os
import pstats
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(Path(__file__).resolve().parent)]

import graph_emulator_paddle  # noqa: E402  # (imported only: it emulates inside emulated_paddle() alone)
import numpy as np  # noqa: E402
import paddle  # noqa: E402
from call_timer import per_call_us  # noqa: E402
from host_cost_paddle_emulated import graphed_pair, stub_replay  # noqa: E402

import graphjit.backends as registry  # noqa: E402


def tiny(a: Any, b: Any, c: Any, d: Any) -> Any:
    return paddle.matmul(paddle.matmul(paddle.matmul(a, b, transpose_y=True), c), d, transpose_y=True)


def profiled(fn: Callable[[], Any], calls: int, top: int) -> str:
    """``calls`` calls of ``fn`` under cProfile: the ``top`` costliest functions by own time, as text."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(top)
    return text.getvalue()


def measure(inputs: list[Any], iters: int, calls: int, top: int, stub: Callable[[], None] | None) -> dict[str, Any]:
    default, alias, static = graphed_pair(tiny, inputs)
    if stub is not None:
        stub()
    st = alias._self_state
    graph = st.entries[st.signer.sign_plain(None, static).key].graph
    t = inputs[0]
    backend = registry.get("paddle")
    us: dict[str, float] = {
        "eager": per_call_us(lambda: tiny(*inputs), iters, warm=100),
        "default": per_call_us(lambda: default(*inputs), iters, warm=100),
        "static_alias": per_call_us(lambda: alias(*static), iters, warm=100),
        "part_sign": per_call_us(lambda: st.signer.sign_plain(None, static), iters, warm=100),
        "part_modes": per_call_us(backend.modes, iters, warm=100),
        "attr_place": per_call_us(lambda: t.place, iters),
        "attr_dtype": per_call_us(lambda: t.dtype, iters),
        "attr_shape": per_call_us(lambda: t.shape, iters),
        "attr_stop_gradient": per_call_us(lambda: t.stop_gradient, iters),
        "attr_data_ptr": per_call_us(t.data_ptr, iters),
    }
    us["raw_replay"] = per_call_us(graph.replay, iters, warm=100)  # graphjit's handle: Paddle's replay, one frame more
    profiles = {"profile_default": profiled(lambda: default(*inputs), calls, top),
                "profile_static_alias": profiled(lambda: alias(*static), calls, top)}
    stats = {name: {k: g.stats()[k] for k in ("calls", "replays", "fallbacks")}
             for name, g in (("default", default), ("alias", alias))}  # (before the parts below replay the key)
    sig = default._self_state.signer.sign_plain(None, tuple(inputs))
    entry = default._self_state.entries[sig.key]
    # the default call's input copies (on a GPU one launch of graphjit's batch copy, where it serves), and its replay
    # with the output copied
    us["part_load_inputs"] = per_call_us(lambda: entry.inputs.load(sig.tensors), iters, warm=100)
    us["part_replay_copies"] = per_call_us(lambda: entry.replay_copies(sig, True, (tuple(inputs), {})), iters, warm=100)
    if t.place.is_gpu_place():
        from graphjit.backends.paddle import device as cuda_device

        index = int(t.place.gpu_device_id())
        us["part_current_stream"] = per_call_us(lambda: cuda_device.current_stream(index), iters)
    return {"us": us, "batch_copy": entry.inputs.batch is not None, **profiles, "stats": stats}


def run() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, default=None, help="folder for host_profile_paddle.json")
    p.add_argument("--iters", type=int, default=2000, help="calls per timing (nine timings, the median kept)")
    p.add_argument("--calls", type=int, default=2000, help="calls under cProfile per variant")
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--emulate", action="store_true", help="on a CPU: the Paddle graph emulator")
    args = p.parse_args()
    rng = np.random.default_rng(0)
    with graph_emulator_paddle.emulated_paddle() if args.emulate else contextlib.nullcontext():
        if args.emulate:
            paddle.set_device("cpu")
        inputs = [paddle.to_tensor(rng.standard_normal((8, 256)).astype("float32")) for _ in range(4)]
        with paddle.no_grad():
            result: dict[str, Any] = {"paddle": paddle.__version__, "emulated": args.emulate,
                                      "device": str(inputs[0].place),
                                      **measure(inputs, args.iters, args.calls, args.top,
                                                stub_replay if args.emulate else None)}
    for key in ("profile_default", "profile_static_alias"):
        print(f"== {key}\n{result[key]}")
    print(json.dumps({"us": result["us"], "stats": result["stats"]}, indent=1))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "host_profile_paddle.json").write_text(json.dumps(result, indent=1) + "\n")


def main() -> None:
    """:func:`run`, then ``os._exit`` with its status, failed or not (Paddle can hang at interpreter exit on a GPU
    machine)."""
    status = 1
    try:
        run()
        status = 0
    except SystemExit as exc:  # argparse's
        status = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


if __name__ == "__main__":
    main()
