#!/usr/bin/env python3
"""Probe: which ways of capturing a CUDA graph around a Paddle SOT-translated function work.

Target: paddlepaddle-gpu 2.6.2, Python 3.11, NVIDIA H200 (see notes/paddle-sot-capture.md).

The driver runs every variant in its own subprocess (``sys.executable``, ~60 s timeout each, a few
at a time), so a segfault or a hang in Paddle cannot take the driver down. Per variant it records
the exit code / signal, the last stage the child reached, whether capture succeeded, whether replay
on new inputs matched numpy, and the tail of stderr on failure. It writes everything to
``$OUT/paddle_capture_probe.json`` (when ``OUT`` is set; ``--json PATH`` overrides) and prints a
compact table.

On the H200, Paddle 2.6.2 has no sm_90 code for its elementwise/reduction kernels (they silently
return garbage), so the probe functions use ONLY ``paddle.matmul`` and copies, inputs are integer
valued float32 (exact under TF32 too) made with ``paddle.to_tensor`` from numpy, and results are
checked with numpy against a float64 reference -- never with Paddle reductions.

Children get MIN_GRAPH_SIZE=0 (unless a variant sets it): SOT 2.6.2 runs subgraphs of fewer than
10 ops eagerly by default, which would make every 'sot_*' variant test eager code. The outcome
column shows how many subgraphs SOT really compiled. With exit='os_exit' (the default) a child
leaves through os._exit while its graphs and captured outputs are still alive; freeing those in
the wrong order (graph before outputs) is itself a crash that the 'reset_then_del_out',
'del_graph' and '*_normal_exit' variants measure on purpose.

GPU run (paddle-gpu-kit, see notes/paddle-sot-capture.md):
    . /tmp/pdc/env.sh && PYTHONUNBUFFERED=1 timeout 500 $PY311 tools/probes/paddle_capture_probe.py

Usage:
    python paddle_capture_probe.py                 # run all variants
    python paddle_capture_probe.py --list          # list variants
    python paddle_capture_probe.py --only a,b      # run some
    python paddle_capture_probe.py --jobs 6        # parallel children (default 6)
    PROBE_FAKE_GRAPH=1 python paddle_capture_probe.py   # CPU dry run of the child logic with a
                                                         # fake graph (no CUDA needed)
    python paddle_capture_probe.py --child NAME --result FILE   # (internal) one variant
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor

# --------------------------------------------------------------------------------------------
# Variants
# --------------------------------------------------------------------------------------------
# Keys (defaults in DEFAULTS):
#   kind      'capture' (manual CUDAGraph around a call), 'runprog' (Paddle's own run_program
#             CUDA-graph mode, no manual capture), 'sync_fail' (capture around a function that
#             calls .numpy()), 'info' (versions, API presence, copy methods), 'recapture'
#             (capture the same function twice, with or without reset in between)
#   fn        'eager' | 'ast' | 'sot' | 'sot_break' | 'sot_pybranch' | 'eager_calls_sot' |
#             'wrap_cuda_graph'
#   weights   'const' (to_tensor, stop_gradient=True) | 'param' (Parameter, stop_gradient=False)
#   no_grad   run warmups + capture + replay under paddle.no_grad()
#   warmups   calls before the capture
#   mode      'thread_local' | 'global' | 'relaxed'
#   copy      how new inputs go into the static input: 'assign' (paddle.assign(src, output=dst)),
#             'copy_' (dst.copy_(src, False)), 'set_value' (dst.set_value(numpy))
#   after     what to do after the replay checks: 'keep' (graph alive until exit), 'reset'
#             (g.reset(), drop outputs first), 'reset_then_del_out' (g.reset() while the output
#             tensor is alive, then drop it), 'del_graph' (del g, outputs alive)
#   env       extra environment (FLAGS_*) for the child
#   exit      'os_exit' (flush + os._exit) | 'normal' (return from main, interpreter teardown)
DEFAULTS = dict(
    kind="capture",
    fn="sot",
    weights="const",
    no_grad=False,
    warmups=1,
    mode="thread_local",
    copy="assign",
    after="keep",
    env={},
    exit="os_exit",
    reset_between=True,
    recover=False,
)

VARIANTS: dict[str, dict] = {
    "info": dict(kind="info", fn="eager"),
    # ---- baselines
    "eager_tl": dict(fn="eager"),
    "eager_copy_": dict(fn="eager", copy="copy_"),
    "eager_set_value": dict(fn="eager", copy="set_value"),
    "eager_global": dict(fn="eager", mode="global"),
    "eager_relaxed": dict(fn="eager", mode="relaxed"),
    "eager_param": dict(fn="eager", weights="param"),
    "eager_reset": dict(fn="eager", after="reset"),
    "eager_reset_then_del_out": dict(fn="eager", after="reset_then_del_out"),
    "eager_del_graph": dict(fn="eager", after="del_graph"),
    "eager_normal_exit": dict(fn="eager", exit="normal"),
    "ast_const": dict(fn="ast"),
    "ast_param": dict(fn="ast", weights="param"),
    "ast_param_nograd": dict(fn="ast", weights="param", no_grad=True),
    "ast_param_w0": dict(fn="ast", weights="param", warmups=0),
    # ---- SOT: weights / grad bookkeeping
    "sot_const": dict(fn="sot"),
    "sot_param": dict(fn="sot", weights="param"),
    "sot_const_nograd": dict(fn="sot", no_grad=True),
    "sot_param_nograd": dict(fn="sot", weights="param", no_grad=True),
    # ---- SOT: warmups
    "sot_const_w0": dict(fn="sot", warmups=0),
    "sot_const_w2": dict(fn="sot", warmups=2),
    "sot_const_w3": dict(fn="sot", warmups=3),
    "sot_param_w0": dict(fn="sot", weights="param", warmups=0),
    "sot_param_w3": dict(fn="sot", weights="param", warmups=3),
    # ---- SOT: capture modes
    "sot_const_global": dict(fn="sot", mode="global"),
    "sot_const_relaxed": dict(fn="sot", mode="relaxed"),
    "sot_param_global": dict(fn="sot", weights="param", mode="global"),
    # ---- SOT: graph breaks
    "sot_break": dict(fn="sot_break", warmups=2),
    "sot_break_param": dict(fn="sot_break", weights="param", warmups=2),
    "sot_pybranch": dict(fn="sot_pybranch", warmups=2),
    # ---- SOT: flags
    "sot_const_no_exec_cg_flag": dict(fn="sot", env={"FLAGS_new_executor_use_cuda_graph": "0"}),
    "sot_param_no_exec_cg_flag": dict(fn="sot", weights="param",
                                      env={"FLAGS_new_executor_use_cuda_graph": "0"}),
    "sot_const_no_stream_safe": dict(fn="sot", env={"FLAGS_use_stream_safe_cuda_allocator": "0"}),
    "sot_const_auto_growth": dict(fn="sot", env={"FLAGS_allocator_strategy": "auto_growth"}),
    "sot_const_naive_best_fit": dict(fn="sot", env={"FLAGS_allocator_strategy": "naive_best_fit",
                                                    "FLAGS_fraction_of_gpu_memory_to_use": "0.03"}),
    "sot_const_no_pir_pt": dict(fn="sot", env={"FLAGS_enable_pir_with_pt_in_dy2st": "0"}),
    "sot_param_no_pir_pt": dict(fn="sot", weights="param",
                                env={"FLAGS_enable_pir_with_pt_in_dy2st": "0"}),
    "ast_const_pir_pt": dict(fn="ast", env={"DY2ST_TEST": "True"}),  # AST run with PIR+PT like SOT
    # ---- SOT: graph lifetime
    "sot_const_reset": dict(fn="sot", after="reset"),
    "sot_const_del_graph": dict(fn="sot", after="del_graph"),
    # ---- recapture the same compiled function
    "recapture_eager_reset": dict(kind="recapture", fn="eager", reset_between=True),
    "recapture_ast_reset": dict(kind="recapture", fn="ast", reset_between=True),
    "recapture_ast_keep": dict(kind="recapture", fn="ast", reset_between=False),
    "recapture_sot_reset": dict(kind="recapture", fn="sot", reset_between=True),
    "recapture_sot_keep": dict(kind="recapture", fn="sot", reset_between=False),
    # ---- eager code around a warm SOT function
    "eager_calls_sot": dict(fn="eager_calls_sot", warmups=2),
    "eager_calls_sot_param": dict(fn="eager_calls_sot", weights="param", warmups=2),
    # ---- Paddle's own run_program CUDA-graph mode
    "runprog_ast_mode": dict(kind="runprog", fn="ast"),
    "runprog_sot_mode": dict(kind="runprog", fn="sot"),
    "runprog_wrap_cuda_graph": dict(kind="runprog", fn="wrap_cuda_graph"),
    # ---- explicit teardown order, then a normal interpreter exit
    "eager_safe_teardown_normal_exit": dict(fn="eager", after="safe_teardown", exit="normal"),
    "ast_param_safe_teardown_normal_exit": dict(fn="ast", weights="param", after="safe_teardown",
                                                exit="normal"),
    "sot_const_safe_teardown_normal_exit": dict(fn="sot", after="safe_teardown", exit="normal"),
    "sot_param_safe_teardown_normal_exit": dict(fn="sot", weights="param", after="safe_teardown",
                                                exit="normal"),
    "sot_param_keep_normal_exit": dict(fn="sot", weights="param", exit="normal"),
    "sot_param_reset": dict(fn="sot", weights="param", after="reset"),
    "sot_param_reset_then_del_out": dict(fn="sot", weights="param", after="reset_then_del_out"),
    # ---- SOT's default MIN_GRAPH_SIZE=10: graphs this small are not compiled, run eagerly
    "sot_const_min10": dict(fn="sot", env={"MIN_GRAPH_SIZE": "10"}),
    # ---- capture broken by a sync (.numpy()) inside
    "sync_fail_tl": dict(kind="sync_fail", fn="eager", exit="normal"),
    "sync_fail_global": dict(kind="sync_fail", fn="eager", mode="global", exit="normal"),
    "sync_fail_relaxed": dict(kind="sync_fail", fn="eager", mode="relaxed", exit="normal"),
    "sync_fail_tl_os_exit": dict(kind="sync_fail", fn="eager"),
    "sync_fail_tl_recover": dict(kind="sync_fail", fn="eager", recover=True),
    "sync_fail_sot": dict(kind="sync_fail", fn="sot", warmups=2, recover=True),
}

CHILD_TIMEOUT_S = 60
M, K, H, N = 8, 64, 64, 32  # x [M,K] @ w1 [K,H] @ w2 [H,N]


# --------------------------------------------------------------------------------------------
# Child
# --------------------------------------------------------------------------------------------
G: dict = {}  # weights etc. for the probe functions (set by the child)
# The probe functions below use the module globals `paddle` and `psdb`, which the child binds
# after importing Paddle: an `import` statement inside a function makes SOT 2.6.2 give up on it.
paddle = None
psdb = None


def body_plain(x):
    h = paddle.matmul(x, G["W1"])
    return paddle.matmul(h, G["W2"])


def body_break(x):
    h = paddle.matmul(x, G["W1"])
    psdb.breakgraph()
    return paddle.matmul(h, G["W2"])


def body_branch(x):
    h = paddle.matmul(x, G["W1"])
    if G["FLAG"] and x.shape[0] == M:  # guarded Python-side branch
        h = paddle.matmul(h, G["EYE"])
    return paddle.matmul(h, G["W2"])


class Recorder:
    """Result dict rewritten to a file after every stage, so a crash leaves the last stage."""

    def __init__(self, path, name, cfg):
        self.path = path
        self.d = {"name": name, "config": cfg, "stage": "start", "stages": [], "events": {}}
        self.flush()

    def stage(self, s):
        self.d["stage"] = s
        self.d["stages"].append(s)
        print(f"[probe] stage {s}", file=sys.stderr, flush=True)
        self.flush()

    def set(self, **kw):
        self.d.update(kw)
        self.flush()

    def event(self, key, value):
        self.d["events"][key] = value
        self.flush()

    def flush(self):
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.d, f, default=str)
        os.replace(tmp, self.path)


def _err(e):
    s = f"{type(e).__name__}: {e}"
    s = " ".join(s.split())
    return s[:600]


def _finish(cfg, code):
    """exit='os_exit': leave right here, while the child's locals (graphs, captured outputs) are
    alive, so their teardown order cannot crash the process; exit='normal': return, so the
    locals are freed by Python and the interpreter shuts down normally."""
    if cfg["exit"] == "os_exit":
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def body_numpy(x):
    h = paddle.matmul(x, G["W1"])
    G["seen"] = h.numpy()  # a device->host sync (a graph break under SOT)
    return paddle.matmul(h, G["W2"])


def _child(name, result_path):
    import numpy as np

    cfg = dict(DEFAULTS)
    cfg.update(VARIANTS[name])
    rec = Recorder(result_path, name, cfg)
    fake = os.environ.get("PROBE_FAKE_GRAPH") == "1"
    try:
        import faulthandler

        faulthandler.enable(all_threads=False)
    except Exception:
        pass
    rec.stage("import")
    global paddle, psdb
    import paddle
    import paddle.device.cuda.graphs
    from paddle.jit.sot import psdb

    rec.set(paddle_version=paddle.__version__, python=sys.version.split()[0], fake_graph=fake)
    cuda = paddle.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0
    if not cuda and not fake:
        rec.set(status="no CUDA", capture_ok=None, replay_ok=None)
        return 0
    if cuda:
        paddle.set_device("gpu:0")
    else:
        paddle.set_device("cpu")
    core = paddle.base.core
    try:  # keep cuBLAS out of TF32 (inputs are exact in TF32 anyway)
        core.set_cublas_switch(False)
    except Exception:
        pass

    rng = np.random.default_rng(1234)

    def ints(*shape):
        return rng.integers(-3, 4, size=shape).astype(np.float32)

    # ---- weights
    w1_np, w2_np = ints(K, H), ints(H, N)
    w0_np = np.eye(K, dtype=np.float32)[rng.permutation(K)]  # permutation: exact
    if cfg["weights"] == "param":
        def mkparam(a):
            p = paddle.create_parameter(list(a.shape), "float32",
                                        default_initializer=paddle.nn.initializer.Assign(a))
            p.stop_gradient = False
            return p
        w1, w2, w0 = mkparam(w1_np), mkparam(w2_np), mkparam(w0_np)
        # the Assign initializer may run a kernel without sm_90 code: copy exact values in
        for p, a in ((w1, w1_np), (w2, w2_np), (w0, w0_np)):
            p.set_value(a)
    else:
        w1, w2, w0 = (paddle.to_tensor(a) for a in (w1_np, w2_np, w0_np))
    rec.set(weights_stop_gradient=bool(w1.stop_gradient))

    def ref(x_np, with_w0=False):
        xx = x_np.astype(np.float64)
        if with_w0:
            xx = xx @ w0_np.astype(np.float64)
        return xx @ w1_np.astype(np.float64) @ w2_np.astype(np.float64)

    def close(t, r):
        a = t.numpy() if hasattr(t, "numpy") else np.asarray(t)
        ok = bool(a.shape == r.shape and np.allclose(a, r, rtol=1e-4, atol=1e-3))
        return ok, float(np.max(np.abs(a.astype(np.float64) - r))) if a.shape == r.shape else None

    # ---- the function under test (module-level functions reading module globals: the AST
    # transformer loses closure variables of nested functions)
    G.update(W1=w1, W2=w2, EYE=paddle.to_tensor(np.eye(H, dtype=np.float32)), FLAG=True)
    body = body_plain

    fnk = cfg["fn"]
    with_w0 = fnk == "eager_calls_sot"
    sot_inner = None
    if fnk == "eager":
        fn = body
    elif fnk == "ast":
        fn = paddle.jit.to_static(body, full_graph=True)
    elif fnk == "sot":
        fn = paddle.jit.to_static(body, full_graph=False)
    elif fnk == "sot_break":
        fn = paddle.jit.to_static(body_break, full_graph=False)
    elif fnk == "sot_pybranch":
        fn = paddle.jit.to_static(body_branch, full_graph=False)
    elif fnk == "eager_calls_sot":
        sot_inner = paddle.jit.to_static(body, full_graph=False)

        def fn(x):
            return sot_inner(paddle.matmul(x, w0))
    elif fnk == "wrap_cuda_graph":
        fn = paddle.device.cuda.graphs.wrap_cuda_graph(body, mode=cfg["mode"]) if cuda else \
            paddle.jit.to_static(body)
        rec.set(wrap_type=type(fn).__name__)
    else:
        raise ValueError(fnk)

    def sot_sir_count():
        try:
            from paddle.jit.sot.symbolic.compile_cache import CompileSIRCache

            return len(CompileSIRCache().cache)
        except Exception as e:
            return _err(e)

    # ---- copies into the static input
    def copy_in(dst, src_np):
        how = cfg["copy"]
        if how == "assign":
            paddle.assign(paddle.to_tensor(src_np), output=dst)
        elif how == "copy_":
            dst.copy_(paddle.to_tensor(src_np), False)
        elif how == "set_value":
            dst.set_value(src_np)
        else:
            raise ValueError(how)

    # ---- graph (real or fake)
    class FakeGraph:
        def __init__(self, mode):
            self.call = self.out = None

        def capture_begin(self):
            pass

        def capture_end(self):
            pass

        def bind(self, call, out):
            self.call, self.out = call, out

        def replay(self):
            new = self.call()
            paddle.assign(new, output=self.out)

        def reset(self):
            self.call = self.out = None

    def new_graph(mode):
        if fake:
            return FakeGraph(mode)
        g = paddle.device.cuda.graphs.CUDAGraph(mode=mode)
        g.bind = lambda call, out: None
        return g

    def capturing_state():
        st = {}
        for nm in ("is_cuda_graph_capturing",):
            f = getattr(core, nm, None)
            if f is not None:
                try:
                    st[nm] = bool(f())
                except Exception as e:
                    st[nm] = _err(e)
        return st

    import contextlib

    grad_ctx = paddle.no_grad() if cfg["no_grad"] else contextlib.nullcontext()
    kind = cfg["kind"]

    # ================================================================ info
    if kind == "info":
        rec.stage("info")
        info = {}
        cg = getattr(core, "CUDAGraph", None)
        info["core_CUDAGraph"] = cg is not None
        for a in ("begin_capture_with_pool_id", "gen_new_memory_pool_id", "begin_capture",
                  "end_capture"):
            info["has_" + a] = bool(cg is not None and hasattr(cg, a))
        info["core_CUDAGraph_dir"] = [a for a in dir(cg) if not a.startswith("__")] if cg else None
        info["core_graph_functions"] = sorted(a for a in dir(core) if "graph" in a.lower())
        info["CUDAGraph_init_signature"] = None
        try:
            import inspect

            info["CUDAGraph_init_signature"] = str(
                inspect.signature(paddle.device.cuda.graphs.CUDAGraph.__init__))
        except Exception as e:
            info["CUDAGraph_init_signature"] = _err(e)
        flags = {}
        for fl in ("FLAGS_enable_pir_with_pt_in_dy2st", "FLAGS_enable_pir_in_executor",
                   "FLAGS_new_executor_use_cuda_graph", "FLAGS_use_stream_safe_cuda_allocator",
                   "FLAGS_allocator_strategy", "FLAGS_sync_nccl_allreduce",
                   "FLAGS_use_cuda_managed_memory", "FLAGS_new_executor_sequential_run",
                   "FLAGS_enable_new_ir_in_executor"):
            try:
                flags[fl] = paddle.get_flags(fl)[fl]
            except Exception as e:
                flags[fl] = "n/a: " + _err(e)[:80]
        info["flags"] = flags
        try:
            info["device_name"] = paddle.device.cuda.get_device_name() if cuda else "cpu"
            info["compute_capability"] = (paddle.device.cuda.get_device_capability()
                                          if cuda else None)
        except Exception as e:
            info["device_name"] = _err(e)
        info["tensor_has"] = {a: hasattr(paddle.Tensor, a)
                              for a in ("data_ptr", "_ptr", "copy_", "set_value", "_share_buffer_to",
                                        "_copy_to", "share_data")}
        rec.set(info=info)

        # copy methods: value right? same device buffer afterwards?
        def ptr(t):
            for get in (lambda: t.data_ptr(), lambda: t.value().get_tensor()._ptr(),
                        lambda: t._ptr()):
                try:
                    return int(get())
                except Exception:
                    pass
            return None

        copies = {}
        methods = {
            "assign_tensor": lambda d, a: paddle.assign(paddle.to_tensor(a), output=d),
            "assign_numpy": lambda d, a: paddle.assign(a, output=d),
            "copy__gpu_src": lambda d, a: d.copy_(paddle.to_tensor(a), False),
            "copy__gpu_src_blocking": lambda d, a: d.copy_(paddle.to_tensor(a), True),
            "copy__cpu_src": lambda d, a: d.copy_(paddle.to_tensor(a, place=paddle.CPUPlace()),
                                                  False),
            "set_value_numpy": lambda d, a: d.set_value(a),
            "set_value_tensor": lambda d, a: d.set_value(paddle.to_tensor(a)),
            "setitem_ellipsis": lambda d, a: d.__setitem__(Ellipsis, paddle.to_tensor(a)),
            "_C_ops_assign_out_": lambda d, a: paddle._C_ops.assign_out_(paddle.to_tensor(a), d),
        }
        for mname, f in methods.items():
            try:
                d = paddle.to_tensor(ints(M, K))
                p0 = ptr(d)
                a = ints(M, K)
                f(d, a)
                got = d.numpy()
                copies[mname] = {"value_ok": bool(np.array_equal(got, a)),
                                 "same_buffer": (p0 == ptr(d)) if p0 is not None else None,
                                 "ptr_available": p0 is not None}
            except Exception as e:
                copies[mname] = {"error": _err(e)}
        rec.set(copy_methods=copies)
        rec.set(status="ok")
        return 0

    # ================================================================ runprog
    if kind == "runprog":
        rec.stage("runprog_setup")
        x0 = paddle.to_tensor(ints(M, K))
        with grad_ctx:
            out0 = fn(x0)
        ok0, _ = close(out0, ref(x0.numpy()))
        rec.set(first_call_ok=ok0, sot_sirs=sot_sir_count())
        target = fn
        if fnk in ("ast", "sot"):
            target._cuda_graph_capture_mode = cfg["mode"]
            target._cuda_graph_pool_id = 0
        n_set = 0
        if fnk in ("sot", "wrap_cuda_graph"):
            # SOT compiles each subgraph into its own AST StaticFunction (FallbackWrapper); the
            # outer SymbolicStaticFunction never passes the mode on, so set it on the partial
            # programs directly
            try:
                from paddle.jit.sot.symbolic.compile_cache import CompileSIRCache

                for fw in CompileSIRCache().cache.values():
                    if getattr(fw, "partial_program", None) is not None:
                        fw.partial_program._cuda_graph_capture_mode = cfg["mode"]
                        fw.partial_program._cuda_graph_pool_id = 0
                        n_set += 1
            except Exception as e:
                rec.event("set_partial_mode_error", _err(e))
        rec.set(partial_programs_set=n_set)
        rec.stage("runprog_calls")
        results = []
        for _i in range(3):
            xi = ints(M, K)
            try:
                with grad_ctx:
                    oi = fn(paddle.to_tensor(xi))
                results.append(close(oi, ref(xi))[0])
            except Exception as e:
                results.append(_err(e))
                break
            rec.set(runprog_results=results)
        ok = all(r is True for r in results)
        rec.set(runprog_results=results, capture_ok=None, replay_ok=ok,
                status="ok" if ok else "wrong")
        return _finish(cfg, 0 if ok else 3)

    # ================================================================ sync_fail
    if kind == "sync_fail":
        rec.stage("sync_setup")
        xs = paddle.to_tensor(ints(M, K))
        fsync = body_numpy if fnk == "eager" else paddle.jit.to_static(body_numpy,
                                                                        full_graph=False)
        for _i in range(cfg["warmups"]):
            xw = ints(M, K)
            copy_in(xs, xw)
            rec.event(f"warmup_ok_{_i}", close(fsync(xs), ref(xw))[0])
        rec.set(sot_sirs_before=sot_sir_count())
        g = new_graph(cfg["mode"])
        rec.stage("sync_capture_begin")
        g.capture_begin()
        rec.set(capturing_inside=capturing_state())
        rec.stage("sync_call_with_numpy")
        try:
            out = fsync(xs)
            rec.event("numpy_in_capture", "no error")
        except Exception as e:
            rec.event("numpy_in_capture", _err(e))
        rec.stage("sync_capture_end")
        try:
            g.capture_end()
            rec.event("capture_end", "no error")
        except Exception as e:
            rec.event("capture_end", _err(e))
        rec.set(capturing_after_fail=capturing_state())
        if cfg.get("recover") and not fake:
            # try to get Paddle out of the capturing state: end the capture once more
            rec.stage("sync_recover_end_capture_again")
            try:
                core.CUDAGraph.end_capture()
                rec.event("end_capture_again", "no error")
            except Exception as e:
                rec.event("end_capture_again", _err(e))
            rec.set(capturing_after_recover=capturing_state())
        rec.stage("sync_after_eager")
        try:
            xe = ints(M, K)
            rec.event("eager_after_fail_ok", close(body(paddle.to_tensor(xe)), ref(xe))[0])
        except Exception as e:
            rec.event("eager_after_fail_ok", _err(e))
        rec.stage("sync_recapture")
        ok = False
        try:
            g2 = new_graph("thread_local")
            x2 = paddle.to_tensor(ints(M, K))
            body(x2).numpy()
            g2.capture_begin()
            o2 = body(x2)
            g2.capture_end()
            g2.bind(lambda: body(x2), o2)
            rec.event("recapture", "ok")
            xn = ints(M, K)
            copy_in(x2, xn)
            g2.replay()
            ok = close(o2, ref(xn))[0]
            rec.event("recapture_replay_ok", ok)
        except Exception as e:
            rec.event("recapture", _err(e))
        ev = rec.d["events"]
        cap_ok = ev.get("numpy_in_capture") == "no error" and ev.get("capture_end") == "no error"
        rec.set(capture_ok=cap_ok, replay_ok=ok, status="recovered" if ok else "not recovered")
        rec.stage("exit_" + cfg["exit"])
        return _finish(cfg, 0 if ok else 4)

    # ================================================================ capture / recapture
    x = paddle.to_tensor(ints(M, K))
    warm_ok = []
    with grad_ctx:
        rec.stage("warmup")
        for _i in range(cfg["warmups"]):
            xi = ints(M, K)
            copy_in(x, xi)
            o = fn(x)
            warm_ok.append(close(o, ref(xi, with_w0))[0])
            del o
        rec.set(warmup_ok=warm_ok, sot_sirs_before=sot_sir_count())
        x_cap = ints(M, K)
        copy_in(x, x_cap)
        g = new_graph(cfg["mode"])
        rec.stage("capture_begin")
        g.capture_begin()
        rec.set(capturing_inside=capturing_state())
        rec.stage("capture_call")
        try:
            out = fn(x)
        except Exception as e:
            rec.set(capture_ok=False, capture_error=_err(e),
                    capture_tb=traceback.format_exc()[-3000:])
            rec.stage("capture_end_after_error")
            try:
                g.capture_end()
            except Exception as e2:
                rec.event("capture_end_after_error", _err(e2))
            rec.set(status="capture raised")
            return _finish(cfg, 5)
        rec.stage("capture_end")
        try:
            g.capture_end()
        except Exception as e:
            rec.set(capture_ok=False, capture_error=_err(e), status="capture_end raised")
            return _finish(cfg, 6)
        g.bind(lambda: fn(x), out)
        rec.set(capture_ok=True, sot_sirs_after=sot_sir_count())

        rec.stage("replay")
        replays = []
        for _i in range(2):
            xn = ints(M, K)
            copy_in(x, xn)
            g.replay()
            ok, err = close(out, ref(xn, with_w0))
            replays.append({"ok": ok, "max_abs_err": err})
            rec.set(replays=replays)
        replay_ok = all(r["ok"] for r in replays)
        rec.set(replay_ok=replay_ok)

        rec.stage("post_eager_call")
        try:
            xp = ints(M, K)
            post = fn(paddle.to_tensor(xp))
            rec.set(post_call_ok=close(post, ref(xp, with_w0))[0])
            del post
        except Exception as e:
            rec.set(post_call_ok=_err(e))
        # the captured graph must still replay right after an uncaptured call
        xn = ints(M, K)
        copy_in(x, xn)
        g.replay()
        rec.set(replay_after_post_ok=close(out, ref(xn, with_w0))[0])

        if kind == "recapture":
            rec.stage("recapture_prepare")
            if cfg["reset_between"]:
                del out
                g.reset()
                del g
            x_cap2 = ints(M, K)
            copy_in(x, x_cap2)
            g2 = new_graph(cfg["mode"])
            rec.stage("recapture_begin")
            g2.capture_begin()
            rec.stage("recapture_call")
            out2 = fn(x)
            rec.stage("recapture_end")
            g2.capture_end()
            g2.bind(lambda: fn(x), out2)
            rec.stage("recapture_replay")
            xn = ints(M, K)
            copy_in(x, xn)
            g2.replay()
            ok2 = close(out2, ref(xn, with_w0))[0]
            rec.set(recapture_replay_ok=ok2)
            if not cfg["reset_between"]:
                xn = ints(M, K)
                copy_in(x, xn)
                g.replay()
                rec.set(first_graph_still_ok=close(out, ref(xn, with_w0))[0])
            replay_ok = replay_ok and ok2

        after = cfg["after"]
        rec.stage("after_" + after)
        if after == "reset":
            del out
            g.reset()
            rec.event("reset", "ok")
        elif after == "safe_teardown":
            # drop everything that may live in the graph's memory pool, then the graph
            import gc

            del out
            try:
                del post
            except NameError:
                pass
            gc.collect()
            g.reset()
            del g
            gc.collect()
            rec.event("safe_teardown", "ok")
        elif after == "reset_then_del_out":
            g.reset()
            rec.stage("del_out_after_reset")
            del out
            import gc

            gc.collect()
            rec.event("reset_then_del_out", "ok")
        elif after == "del_graph":
            del g
            import gc

            gc.collect()
            rec.event("del_graph", "ok")
        if after != "keep":
            rec.stage("after_lifetime_eager_call")
            try:
                xp = ints(M, K)
                post = fn(paddle.to_tensor(xp))
                rec.event("call_after_lifetime_ok", close(post, ref(xp, with_w0))[0])
            except Exception as e:
                rec.event("call_after_lifetime_ok", _err(e))

    rec.set(status="ok" if replay_ok else "wrong")
    rec.stage("exit_" + cfg["exit"])
    return _finish(cfg, 0 if replay_ok else 3)


def child_main(name, result_path):
    code = 1
    try:
        code = _child(name, result_path)
    except BaseException as e:
        traceback.print_exc()
        try:
            with open(result_path) as f:
                d = json.load(f)
            d["exception"] = _err(e)
            d["status"] = "python error"
            with open(result_path, "w") as f:
                json.dump(d, f, default=str)
        except Exception:
            pass
        code = 2
    sys.stdout.flush()
    sys.stderr.flush()
    cfg = dict(DEFAULTS)
    cfg.update(VARIANTS.get(name, {}))
    if cfg["exit"] == "normal":
        sys.exit(code)
    os._exit(code)


# --------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------
def run_variant(name, tmpdir, timeout):
    cfg = dict(DEFAULTS)
    cfg.update(VARIANTS[name])
    result_path = os.path.join(tmpdir, name + ".json")
    env = dict(os.environ)
    env.setdefault("MIN_GRAPH_SIZE", "0")
    env.update(cfg["env"])
    env["PYTHONUNBUFFERED"] = "1"
    cmd = [sys.executable, os.path.abspath(__file__), "--child", name, "--result", result_path]
    t0 = time.time()
    timed_out = False
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                         start_new_session=True)
    try:
        _out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except Exception:
            p.kill()
        _out, err = p.communicate()
    wall = time.time() - t0
    rc = p.returncode
    res = {"name": name, "config": cfg}
    try:
        with open(result_path) as f:
            res.update(json.load(f))
    except Exception as e:
        res["result_file_error"] = _err(e)
    res["returncode"] = rc
    res["signal"] = signal.Signals(-rc).name if (rc is not None and rc < 0) else None
    res["timed_out"] = timed_out
    res["wall_s"] = round(wall, 1)
    err_s = err.decode(errors="replace")
    # drop Paddle's GLOG info/warning noise from the tail
    lines = [ln for ln in err_s.splitlines() if ln.strip()]
    res["stderr_tail"] = lines[-30:] if (rc != 0 or timed_out or res.get("status") != "ok") else []
    # a short crash summary: first line that names a signal / C++ error
    for ln in lines:
        if any(k in ln for k in ("SIGSEGV", "SIGABRT", "Segmentation", "FatalError", "Fatal Python",
                                 "Error Message Summary")):
            res.setdefault("crash_hint", ln.strip()[:300])
            break
    if timed_out:
        res["outcome"] = "TIMEOUT(stage={})".format(res.get("stage"))
    elif rc is not None and rc < 0:
        res["outcome"] = "{}(stage={})".format(res["signal"], res.get("stage"))
    elif res.get("status") == "no CUDA":
        res["outcome"] = "no CUDA"
    elif rc == 0 and res.get("status") == "ok":
        res["outcome"] = "OK"
    elif rc == 0 and res.get("status") == "recovered":
        ev = res.get("events", {})
        res["outcome"] = "sync-fail: %s; recovered" % (
            "capture_end raised" if ev.get("capture_end") != "no error" else "no error raised")
    else:
        res["outcome"] = "rc={} {}(stage={})".format(rc, res.get("status"), res.get("stage"))
    if str(cfg.get("fn", "")).startswith(("sot", "eager_calls_sot", "wrap")) or \
            cfg.get("kind") == "runprog":
        ns = [res.get(k) for k in ("sot_sirs_before", "sot_sirs_after", "sot_sirs")]
        ns = [n for n in ns if isinstance(n, int)]
        if ns:
            n = max(ns)
            res["outcome"] += f" [SOT subgraphs: {n}]"
    return res


def _fmt(v):
    if v is None:
        return "-"
    if v is True:
        return "yes"
    if v is False:
        return "NO"
    return str(v)[:14]


def print_table(results):
    hdr = f"{'variant':38s} {'outcome':42s} {'capture':8s} {'replay':7s} {'post':5s} {'rc':>5s}"
    print(hdr)
    print("-" * len(hdr))
    for r in results:
        post = r.get("post_call_ok")
        print(f"{r['name']:38s} {r.get('outcome', '?')[:42]:42s} {_fmt(r.get('capture_ok')):8s} "
              f"{_fmt(r.get('replay_ok')):7s} {_fmt(post):5s} {r.get('returncode')!s:>5s}")


def driver(args):
    names = list(VARIANTS)
    if args.only:
        want = [n.strip() for n in args.only.split(",") if n.strip()]
        bad = [n for n in want if n not in VARIANTS]
        if bad:
            sys.exit(f"unknown variants: {bad}")
        names = want
    deadline = time.time() + args.budget_s
    tmpdir = tempfile.mkdtemp(prefix="pcprobe_")
    results = {}
    lock = threading.Lock()

    def job(n):
        if time.time() + 5 > deadline:
            r = {"name": n, "outcome": "not run (driver budget)"}
        else:
            r = run_variant(n, tmpdir, min(args.timeout, max(5, deadline - time.time())))
        with lock:
            results[n] = r
            print(f"[driver] {n}: {r['outcome']}", flush=True)

    # 'info' first, alone (its output says what the machine is)
    first = [n for n in names if n == "info"]
    rest = [n for n in names if n != "info"]
    for n in first:
        job(n)
    with ThreadPoolExecutor(max_workers=args.jobs) as ex:
        list(ex.map(job, rest))
    ordered = [results[n] for n in names]
    doc = {
        "probe": "paddle_capture_probe",
        "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "python": sys.version.split()[0],
        "argv": sys.argv,
        "env_flags": {k: v for k, v in os.environ.items() if k.startswith("FLAGS_")},
        "fake_graph": os.environ.get("PROBE_FAKE_GRAPH") == "1",
        "results": ordered,
    }
    path = args.json or (os.path.join(os.environ["OUT"], "paddle_capture_probe.json")
                         if os.environ.get("OUT") else None)
    if path:
        with open(path, "w") as f:
            json.dump(doc, f, indent=1, default=str)
        print(f"[driver] wrote {path}")
    print()
    print_table(ordered)
    sys.stdout.flush()
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--child")
    ap.add_argument("--result")
    ap.add_argument("--only")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--jobs", type=int, default=6)
    ap.add_argument("--timeout", type=float, default=CHILD_TIMEOUT_S)
    ap.add_argument("--budget-s", type=float, default=470, help="stop starting variants after this")
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.child:
        child_main(args.child, args.result)
        return
    if args.list:
        for n, v in VARIANTS.items():
            print(n, v)
        return
    sys.exit(driver(args))


if __name__ == "__main__":
    main()
