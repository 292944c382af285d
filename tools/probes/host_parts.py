"""The host cost of each step of a replayed ``@graphed`` call, and of the primitives a faster path could use
(torch, one GPU).

``replay_profile.py`` splits a call into its big parts; this probe splits the part before the replay
(the wrapper, binding, signing, the lock) and prices what a replay could be built from instead: a raw
``cudaGraphLaunch`` of the torch graph's executable (through CuPy), a call into graphjit's csrc library, an
allocation, writes of pointers into a pinned table.  Diagnostic only: the claims are made by
``python -m graphjit bench decode``.

Usage (GPU machine, repo root): ``PYTHONPATH=. python3 tools/probes/host_parts.py --out DIR``
"""

from __future__ import annotations

import argparse
import array
import ctypes
import json
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import graphjit

sys.path.insert(0, str(Path(__file__).resolve().parent))
import replay_profile  # the timer and the step this probe shares with it (imported after its folder is on the path)


def per_call_us(fn: Callable[[], Any]) -> float:
    return replay_profile.per_call_us(fn, iters=3000)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    inputs = [torch.randn(8, 1024, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
    us: dict[str, Any] = {}
    us["python_noop_call"] = per_call_us(lambda: None)
    tiny = replay_profile.tiny
    us["eager"] = per_call_us(lambda: tiny(*inputs))

    default = graphjit.graphed(tiny)
    alias = graphjit.graphed(tiny, outputs="alias")
    for _ in range(default.graphjit_options.warmup + 1):
        default(*inputs)
        alias(*inputs)
    static_args, _ = alias.static_inputs(*inputs)
    us["graphed_default"] = per_call_us(lambda: default(*inputs))
    us["graphed_static_alias"] = per_call_us(lambda: alias(*static_args))

    state = default._self_state
    astate = alias._self_state
    tup = tuple(inputs)
    sargs = tuple(static_args)
    us["state_call_default"] = per_call_us(lambda: state.call(tiny, None, tup, {}))
    us["state_call_static_alias"] = per_call_us(lambda: astate.call(tiny, None, sargs, {}))
    signer = state.signer
    us["bind"] = per_call_us(lambda: signer.binder.bind(False, tup, {}))
    us["sign_plain"] = per_call_us(lambda: signer.sign_plain(None, tup))
    sig = signer.sign_plain(None, tup)
    entry = state.entries[sig.key]
    asig = astate.signer.sign_plain(None, sargs)
    aentry = astate.entries[asig.key]
    lock = state.lock

    def locked() -> None:
        with lock:
            pass

    us["lock"] = per_call_us(locked)
    us["settings"] = per_call_us(graphjit.env.settings)
    from graphjit import scope as scope_mod

    us["scope_phase"] = per_call_us(scope_mod.phase)
    st = graphjit.env.settings()
    us["state_replay_default"] = per_call_us(lambda: state.replay(entry, sig, st, None, tup, {}))
    us["state_replay_static_alias"] = per_call_us(lambda: astate.replay(aentry, asig, st, None, sargs, {}))
    call, acall = (tup, {}), (sargs, {})
    us["entry_replay_default"] = per_call_us(lambda: entry.replay(sig, True, call))
    us["entry_replay_static_alias"] = per_call_us(lambda: aentry.replay(asig, False, acall))
    us["inputs_load_default"] = per_call_us(lambda: entry.inputs.load(sig.tensors))
    us["inputs_load_static"] = per_call_us(lambda: aentry.inputs.load(asig.tensors))
    us["graph_replay"] = per_call_us(entry.graph.replay)
    us["outputs_copy"] = per_call_us(lambda: entry.outputs.result(sig.pads, True, sig.tensors, call))
    us["outputs_alias"] = per_call_us(lambda: aentry.outputs.result(asig.pads, False, asig.tensors, acall))

    h = entry.handoff
    if h is not None:
        feed = entry.graph.feed
        us["fed"] = {"random": feed.random}
        us["handoff_replay_default"] = per_call_us(lambda: h.replay(sig.tensors, True, call))
        us["handoff_replay_static_alias"] = per_call_us(lambda: aentry.handoff.replay(asig.tensors, False, acall))
        import collections

        held: collections.deque[Any] = collections.deque(maxlen=3)  # outputs kept: a new address every call
        us["handoff_replay_default_outputs_kept"] = per_call_us(lambda: held.append(h.replay(sig.tensors, True, call)))
        us["graphed_default_outputs_kept"] = per_call_us(lambda: held.append(default(*inputs)))
        us["feed_launch_0_0"] = per_call_us(lambda: feed.launch(0, 0))
        t = feed.table
        t[4] = t[5] = t[6] = 0
        us["feed_set_only_0_0"] = per_call_us(lambda: feed.fn(feed.at, feed.stream()))
        us["feed_fn_0_0_launch"] = per_call_us(lambda: (t.__setitem__(6, 1), feed.fn(feed.at, feed.stream())))
        x0 = inputs[0]
        empty = feed.empty_for([x0])  # what the feed makes a fresh output with (chosen once per key)
        us["empty_like_contig"] = per_call_us(lambda: empty(x0))
        us["usable_1"] = per_call_us(lambda: feed.usable(x0))

    # primitives
    x = inputs[0]
    us["empty_like"] = per_call_us(lambda: torch.empty_like(x))
    shape, dt, dev = x.shape, x.dtype, x.device
    us["empty_shape"] = per_call_us(lambda: torch.empty(shape, dtype=dt, device=dev))
    us["clone"] = per_call_us(x.clone)
    us["data_ptr_4"] = per_call_us(lambda: [t.data_ptr() for t in inputs])
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        us["raw_stream"] = per_call_us(lambda: raw(0))
    us["current_stream_obj"] = per_call_us(lambda: torch.cuda.current_stream().cuda_stream)
    a = array.array("Q", [0] * 16)
    ptrs = [t.data_ptr() for t in inputs]

    def fill() -> None:
        for k, v in enumerate(ptrs):
            a[k] = v

    us["array_write_4"] = per_call_us(fill)
    pinned = torch.empty(64, dtype=torch.int64, pin_memory=True)
    view = memoryview((ctypes.c_uint64 * 64).from_address(pinned.data_ptr())).cast("B").cast("Q")

    def fill_pinned() -> None:
        for k, v in enumerate(ptrs):
            view[k] = v

    us["pinned_write_4"] = per_call_us(fill_pinned)
    try:
        from graphjit.backends.torch import device as cuda_device
        from graphjit.collectives import library as csrc_library

        lib = csrc_library.load(cuda_device.arch(0), build_if_missing=True)
        lib.copy_preload(0)
        fn = lib.copy_batch
        stream = raw(0) if raw is not None else 0
        dsts = [torch.empty_like(t) for t in inputs]
        d = array.array("Q", [t.data_ptr() for t in dsts])
        s = array.array("Q", ptrs)
        b = array.array("q", [t.numel() * t.element_size() for t in inputs])
        at = (d.buffer_info()[0], s.buffer_info()[0], b.buffer_info()[0])
        us["ctypes_copy_batch_0"] = per_call_us(lambda: fn(0, at[0], at[1], at[2], 0, stream))
        us["ctypes_copy_batch_4"] = per_call_us(lambda: fn(4, at[0], at[1], at[2], 0, stream))
        us["foreach_copy_4"] = per_call_us(lambda: torch._foreach_copy_(dsts, inputs))
    except Exception as exc:
        us["ctypes_copy_batch"] = f"n/a ({type(exc).__name__}: {exc})"
    try:
        import cupy  # type: ignore[import-not-found]

        g = torch.cuda.CUDAGraph()
        sx = inputs[0].clone()
        with torch.cuda.graph(g):
            sy = sx + sx
        g.replay()
        exe = g.raw_cuda_graph_exec()
        stream = raw(0) if raw is not None else torch.cuda.current_stream().cuda_stream
        launch = cupy.cuda.runtime.graphLaunch
        us["torch_graph_replay_1node"] = per_call_us(g.replay)
        us["cupy_graph_launch_1node"] = per_call_us(lambda: launch(int(exe), stream))
        us["torch_graph_replay_entry"] = per_call_us(entry.graph.replay)
        del sy
    except Exception as exc:
        us["cupy_graph_launch"] = f"n/a ({type(exc).__name__}: {exc})"
    us["threads"] = threading.active_count()
    text = json.dumps(us, indent=1)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "host_parts.json").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
