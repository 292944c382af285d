"""GPU tests, torch: real CUDA graphs on the GPU machine (make test-gpu).  Skipped without CUDA."""

from __future__ import annotations

import collections
import contextlib
import os
import subprocess
import sys
import textwrap

import pytest
from unseen import Unseen

import graphjit

pytestmark = [pytest.mark.gpu, pytest.mark.torch]

torch = pytest.importorskip("torch")


def rel(a, b) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


@pytest.fixture
def dev():
    return torch.device("cuda", 0)


def mlp_weights(dev, h=256, layers=4, dtype=torch.float32):
    g = torch.Generator(device="cpu").manual_seed(0)
    return [(torch.randn(h, h, generator=g) / h**0.5).to(dev, dtype) for _ in range(layers)]


def test_replay_equals_eager_on_fresh_inputs(dev):
    ws = mlp_weights(dev)

    def body(x, y):
        h = x
        for w in ws:
            h = torch.nn.functional.silu(h @ w) + h
        return h * y.sum(), (h - y).abs().amax(dim=-1)

    step = graphjit.graphed(body)
    with torch.no_grad():
        for i in range(12):
            x = torch.randn(8, 256, device=dev)
            y = torch.randn(8, 256, device=dev)
            got = step(x, y)
            want = body(x, y)
            assert rel(got[0], want[0]) < 1e-5 and rel(got[1], want[1]) < 1e-5, i
    s = step.stats()
    # 2 warmup calls (eager), then the capturing call's replay and 9 more
    assert s["captures"] == 1 and s["replays"] == 10 and s["graphs"] == 1, s
    assert not s["fallbacks"], s
    assert s["keys"][0]["input_copies"] >= 2 * 9  # new tensors every call after the capture: copied in


def test_inputs_are_copied_into_owned_buffers(dev):
    w = torch.randn(64, 64, device=dev)
    step = graphjit.graphed(lambda x: x @ w)
    x = torch.randn(4, 64, device=dev)
    with torch.no_grad():
        for _ in range(3):  # 2 warmups, then the capture
            step(x)
        for _ in range(5):
            x.copy_(torch.randn(4, 64, device=dev))
            # x is not the static buffer (graphjit owns it), so it is copied; the static buffer itself is not
            assert rel(step(x), x @ w) < 1e-6
    key = step.stats()["keys"][0]
    assert key["input_copies"] == 5 and key["replays"] == 6


def test_buckets_pad_and_slice(dev):
    w = torch.randn(32, 16, device=dev)

    @graphjit.graphed(buckets={"x": {0: [4, 8, 16]}})
    def step(x):
        return torch.tanh(x @ w), x.sum()  # the sum sees zero padding, so it stays exact

    with torch.no_grad():
        for n in [3, 4, 5, 8, 1, 16, 7, 2, 3] * 3:  # every bucket called at least 3 times: captured
            x = torch.randn(n, 32, device=dev)
            y, s = step(x)
            assert y.shape == (n, 16)
            assert rel(y, torch.tanh(x @ w)) < 1e-5
            assert abs(float(s) - float(x.sum())) < 1e-3
        big = torch.randn(17, 32, device=dev)
        assert rel(step(big)[0], torch.tanh(big @ w)) < 1e-5
    s = step.stats()
    assert s["graphs"] == 3, s  # 4, 8, 16
    assert s["fallbacks"] == {"larger than every bucket": 1}, s


def test_kv_cache_decode_matches_eager_over_100_steps(dev):
    """A decode step that writes into a KV cache in place, batch size varying by bucket."""
    torch.manual_seed(0)
    H, T, B = 64, 128, 16
    wq = torch.randn(H, H, device=dev) / H**0.5
    wo = torch.randn(H, H, device=dev) / H**0.5

    def decode(x, cache, pos):  # pos: a 1-element int tensor (a graph input, not a Python int)
        k = x @ wq
        cache.index_copy_(1, pos, k.unsqueeze(1))  # write this step's key into the cache, in place
        att = torch.softmax(torch.einsum("bh,bth->bt", x, cache) / H**0.5, dim=-1)
        return torch.einsum("bt,bth->bh", att, cache) @ wo

    step = graphjit.graphed(decode, buckets={"x": {0: [1, 2, 4, 8, 16]}, "cache": {0: [1, 2, 4, 8, 16]}})
    cache_g = torch.zeros(B, T, H, device=dev)
    cache_e = cache_g.clone()
    sizes = [1, 3, 8, 16, 5, 2, 16, 7, 4, 12]
    with torch.no_grad():
        for t in range(100):
            bs = sizes[t % len(sizes)]
            x = torch.randn(bs, H, device=dev)
            pos = torch.tensor([t % T], device=dev)
            got = step(x, cache_g[:bs], pos)
            want = decode(x, cache_e[:bs], pos)
            assert rel(got, want) < 1e-5, t
            assert torch.equal(cache_g, cache_e), t
    s = step.stats()
    assert s["graphs"] >= 5 and not s["fallbacks"], s


def test_kv_cache_same_tensor_is_adopted_then_moves(dev):
    """Same cache every call: updated in place with no copies; a new cache: recaptured, still exact."""
    H = 32
    w = torch.randn(H, H, device=dev)

    def step_fn(x, cache):
        cache.mul_(0.5).add_(x @ w)
        return cache.sum(dim=0)

    step = graphjit.graphed(step_fn)
    cache_g = torch.randn(4, H, device=dev)
    cache_e = cache_g.clone()
    with torch.no_grad():
        for _ in range(10):
            x = torch.randn(4, H, device=dev)
            assert rel(step(x, cache_g), step_fn(x, cache_e)) < 1e-5
            assert torch.allclose(cache_g, cache_e, rtol=1e-5, atol=1e-5)
        key = step.stats()["keys"][0]
        assert key["copy_backs"] == 0  # adopted: the graph writes the caller's cache directly
        other_g = torch.randn(4, H, device=dev)
        other_e = other_g.clone()
        snapshot = cache_g.clone()
        for _ in range(10):
            x = torch.randn(4, H, device=dev)
            assert rel(step(x, other_g), step_fn(x, other_e)) < 1e-5
            assert torch.allclose(other_g, other_e, rtol=1e-5, atol=1e-5)
        assert torch.equal(cache_g, snapshot)  # the first cache is never written again
        for _ in range(3):  # and back to the first cache: copied in and back, still exact
            x = torch.randn(4, H, device=dev)
            assert rel(step(x, cache_g), step_fn(x, cache_e)) < 1e-5
            assert torch.allclose(cache_g, cache_e, rtol=1e-5, atol=1e-5)
    s = step.stats()
    assert s["captures"] == 2 and s["keys"][0]["copy_backs"] >= 13, s


def test_alias_outputs_are_poisoned_with_check_outputs(dev, monkeypatch):
    monkeypatch.setenv("GRAPHJIT_CHECK_OUTPUTS", "1")
    graphjit.refresh_env()
    w = torch.randn(16, 16, device=dev)
    step = graphjit.graphed(lambda x: x @ w, outputs="alias")
    with torch.no_grad():
        for _ in range(2):  # the warmup calls return eager outputs
            step(torch.randn(2, 16, device=dev))
        a = step(torch.randn(2, 16, device=dev))
        a2 = step(torch.randn(2, 16, device=dev))
        assert torch.isnan(a).all(), "the previous call's output must be poisoned"
        assert not torch.isnan(a2).any()


def test_alias_outputs_are_the_static_buffers(dev):
    w = torch.randn(16, 16, device=dev)
    step = graphjit.graphed(lambda x: x @ w, outputs="alias")
    with torch.no_grad():
        x1, x2 = torch.randn(2, 16, device=dev), torch.randn(2, 16, device=dev)
        for _ in range(2):  # the warmup calls return eager outputs
            step(x1)
        a = step(x1)
        b = step(x2)
        assert a.data_ptr() == b.data_ptr()
        assert rel(a, x2 @ w) < 1e-6  # overwritten by the second call: that is what alias means


def test_verify_catches_a_stale_output(dev):
    turns = Unseen(1)  # a host value no guard sees: verify is what catches it
    seen: list[int] = []

    def leaky(x):
        seen.append(next(turns))
        return x * seen[-1]  # a Python value the graph freezes at capture

    step = graphjit.graphed(leaky)
    x = torch.randn(8, device=dev)
    with torch.no_grad():
        for _ in range(3):  # 2 warmups, then the capture, whose verify fails
            out = step(x)
            assert rel(out, x * seen[-1]) < 1e-6  # every call returns the eager result
    s = step.stats()
    assert s["keys"][0]["state"] == "fallback" and "verify failed" in s["keys"][0]["reason"], s
    strict = graphjit.graphed(leaky, strict=True)
    with torch.no_grad():
        strict(x), strict(x)
        with pytest.raises(graphjit.VerifyError, match="verify failed") as info:
            strict(x)
    assert info.value.executed and rel(info.value.result, x * seen[-1]) < 1e-6


def test_outputs_requiring_grad_fall_back(dev):
    lin = torch.nn.Linear(8, 8).to(dev)
    step = graphjit.graphed(lambda x: lin(x))
    out = step(torch.randn(2, 8, device=dev))
    assert out.requires_grad
    assert step.stats()["fallbacks"] == {"outputs require grad": 1}


def test_capture_scope_shares_a_pool_and_counts(dev, gj_log):
    w = torch.randn(64, 64, device=dev)
    step = graphjit.graphed(lambda x: torch.relu(x @ w), buckets={0: {0: [1, 2, 4, 8]}})
    with torch.no_grad(), graphjit.capture_scope(total=4) as scope:
        for bs in [8, 4, 2, 1]:
            step(torch.zeros(bs, 64, device=dev))
    assert scope.stats()["captures"] == 4 and scope.stats()["failures"] == 0
    assert "[4/4]" in gj_log.text
    with torch.no_grad():
        for bs in [1, 3, 8]:
            x = torch.randn(bs, 64, device=dev)
            assert rel(step(x), torch.relu(x @ w)) < 1e-5
    assert step.stats()["captures"] == 4


def test_sync_inside_falls_back_and_process_exits_cleanly():
    code = textwrap.dedent("""
        import logging, sys, torch, graphjit
        logging.basicConfig(level=logging.WARNING)
        def f(x):
            if x.sum().item() > 0:      # a CPU-GPU sync
                return x * 2
            return x * 3
        step = graphjit.graphed(f)
        x = torch.ones(4, device="cuda")
        with torch.no_grad():
            for _ in range(3):
                assert torch.equal(step(x), x * 2)
        s = step.stats()
        print("REASON", list(s["fallbacks"]))
        # the second call (the last warmup) is watched for syncs: it and the third are counted
        assert s["fallbacks"] == {"CPU-GPU sync inside the function": 2}, s
        # a graph still captures fine afterwards (no stream left capturing)
        g = graphjit.graphed(lambda x: x + 1)
        for _ in range(5):
            assert torch.equal(g(x), x + 1)
        assert g.stats()["replays"] == 3, g.stats()
        # the raw capture path: a sync during capture itself ends the capture
        from graphjit.backends import get
        b = get("torch")
        try:
            b.capture(lambda: x.sum().item(), "cuda:0", None, False)
        except graphjit.CaptureError as e:
            print("CAPTURE_ERROR", e.reason)
        with torch.cuda.stream(torch.cuda.Stream()):
            assert not torch.cuda.is_current_stream_capturing()
        assert torch.equal(g(x), x + 1)
        torch.cuda.synchronize()
        print("CLEAN")
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in [os.getcwd(), os.environ.get("PYTHONPATH", "")] if p))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "CLEAN" in r.stdout and "CAPTURE_ERROR capture failed" in r.stdout, r.stdout + r.stderr


def test_strict_mode_raises_on_sync(dev):
    step = graphjit.graphed(lambda x: x * float(x.sum()), strict=True)
    step(torch.ones(4, device=dev))  # the first of 2 warmup calls is not watched (tracers translate there)
    with pytest.raises(graphjit.CaptureError, match="synchronises the CPU with the GPU") as info:
        step(torch.ones(4, device=dev))
    assert info.value.executed


def test_max_graphs_then_uncaptured(dev):
    step = graphjit.graphed(lambda x: x + 1, max_graphs=2)
    for n in [1, 2, 3, 4]:
        for _ in range(3):  # 2 warmups and the capture per key
            x = torch.randn(n, device=dev)
            assert torch.equal(step(x), x + 1)
    s = step.stats()
    assert s["graphs"] == 2 and s["fallbacks"] == {"max_graphs reached": 6}, s


def test_module_method_two_instances(dev):
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(32, 32)

        @graphjit.graphed
        def forward(self, x):
            return torch.relu(self.lin(x))

    a, b = Block().to(dev), Block().to(dev)
    x = torch.randn(4, 32, device=dev)
    with torch.no_grad():
        for _ in range(3):
            assert rel(a(x), torch.relu(a.lin(x))) < 1e-5
            assert rel(b(x), torch.relu(b.lin(x))) < 1e-5
    assert Block.forward.stats()["graphs"] == 2


def test_threads_share_a_function(dev):
    import threading

    w = torch.randn(64, 64, device=dev)
    step = graphjit.graphed(lambda x: x @ w)
    errors = []

    def worker(seed):
        g = torch.Generator(device="cuda").manual_seed(seed)
        with torch.no_grad():
            for _ in range(50):
                x = torch.randn(4, 64, device=dev, generator=g)
                if rel(step(x), x @ w) > 1e-5:
                    errors.append(seed)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    torch.cuda.synchronize()
    assert not errors
    assert step.stats()["graphs"] == 1


def test_tracer_compile_equals_eager(dev):
    ws = mlp_weights(dev, h=128, layers=2)

    def body(x):
        for w in ws:
            x = torch.nn.functional.silu(x @ w) + x
        return x

    step = graphjit.graphed(body, tracer="compile")
    with torch.no_grad():
        for _ in range(4):
            x = torch.randn(4, 128, device=dev)
            assert rel(step(x), body(x)) < 1e-4
    assert step.stats()["graphs"] == 1, step.stats()


def test_dump_dir_writes_a_dot_file(dev, tmp_path, monkeypatch, gj_log):
    monkeypatch.setenv("GRAPHJIT_DUMP_DIR", str(tmp_path))
    graphjit.refresh_env()
    step = graphjit.graphed(lambda x: x * 2 + 1)
    for _ in range(3):
        step(torch.randn(8, device=dev))
    assert step.stats()["graphs"] == 1, step.stats()
    assert list(tmp_path.glob("*.dot")), (list(tmp_path.iterdir()), [r.getMessage() for r in gj_log.records])


def test_static_inputs_are_not_copied(dev):
    w = torch.randn(64, 64, device=dev)
    step = graphjit.graphed(lambda x, y: x @ w + y)
    with torch.no_grad():
        x, y = torch.randn(4, 64, device=dev), torch.randn(4, 64, device=dev)
        with pytest.raises(graphjit.GraphjitError, match="no graph is captured"):
            step.static_inputs(x, y)
        for _ in range(3):
            step(x, y)
        (sx, sy), _ = step.static_inputs(x, y)
        for _ in range(5):
            sx.copy_(torch.randn(4, 64, device=dev))
            sy.copy_(torch.randn(4, 64, device=dev))
            assert rel(step(sx, sy), sx @ w + sy) < 1e-5
    key = step.stats()["keys"][0]
    assert key["input_copies"] == 0 and key["replays"] == 6, key
    with pytest.raises(graphjit.GraphjitError, match="no graph is captured"):
        step.static_inputs(torch.randn(3, 64, device=dev), y)


def test_garbage_collection_cannot_break_a_capture(dev):
    """Python's collector is paused while graphjit captures: a reference cycle that holds an earlier CUDA
    graph and becomes garbage during a capture is freed after it (destroying a graph while a stream
    captures invalidates that capture), and no collection starts during any capture."""
    import gc

    victim = torch.cuda.CUDAGraph()  # an earlier graph, about to be dropped in a reference cycle
    a = torch.zeros(16, device=dev)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        a.add_(1)
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(victim):
        b = a * 2  # memory of the victim's own pool: destroying the victim releases that pool (cudaFree)
    del b
    victims = collections.deque([victim])  # (a deque: what the capture's Python run does to it is not undone)
    del victim
    # which call this is, from an object graphjit does not read into a key or a guard (a list the function appended
    # to and read back is a value it changes on every call: the function would run uncaptured, rightly)
    calls = Unseen(1)

    def body(x):
        if next(calls) == 3 and victims:  # the capturing call (2 warmups first): drop the graph in a cycle
            cycle: list = [victims.pop()]
            cycle.append(cycle)
            del cycle
        return torch.sin(x) * 2 + x

    seen_capturing = []

    def watch(phase, info):
        if phase == "start":
            seen_capturing.append(torch.cuda.is_current_stream_capturing())

    old = gc.get_threshold()
    gc.collect()
    gc.callbacks.append(watch)
    gc.set_threshold(1, 1, 1)  # a young collection at almost every allocation, also inside captures
    try:
        step = graphjit.graphed(body, warmup=2)
        layer = graphjit.graphed_layer(torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.GELU()).to(dev))
        with torch.no_grad():
            outs = [(step(x), x) for x in (torch.randn(64, device=dev) for _ in range(6))]
        for _ in range(6):
            layer(torch.randn(4, 32, device=dev)).sum().backward()
    finally:
        gc.set_threshold(*old)
        gc.callbacks.remove(watch)
    gc.collect()
    st = step.stats()
    # the capturing call replays too; its run emptied the deque the function reads (its length a guarded value since
    # 9c8429a), so the next call is another key, captured once too (with the collector at work) and replayed after
    assert not st["fallbacks"] and st["captures"] == st["graphs"] == 2 and st["replays"] == 2, st
    for got, x in outs:
        assert rel(got, torch.sin(x) * 2 + x) < 1e-6
    ls = layer.stats()
    assert not ls["fallbacks"] and ls["captures"] == 1 and ls["replays"] >= 1, ls
    assert not victims  # the cycle was made (during the capture: the third call)
    assert seen_capturing and not any(seen_capturing), "the collector ran during a capture"


def test_outputs_are_freed_with_their_last_reference(dev):
    """A replayed call's outputs (copies) go back to the allocator when the caller drops them, without waiting
    for Python's collector: nothing graphjit keeps refers to them (no reference cycle)."""
    import gc

    step = graphjit.graphed(lambda x: (x * 2, x + 1))  # two outputs: rebuilt into a tuple on every replay
    x = torch.randn(1 << 20, device=dev)
    with torch.no_grad():
        for _ in range(4):
            step(x)
    assert step.stats()["replays"] >= 2
    torch.cuda.synchronize()
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        before = torch.cuda.memory_allocated(dev)
        with torch.no_grad():
            out = step(x)
        assert torch.cuda.memory_allocated(dev) >= before + 2 * x.numel() * 4
        del out
        assert torch.cuda.memory_allocated(dev) == before, "the outputs outlived their last reference"
    finally:
        if was:
            gc.enable()


def test_a_dropped_function_gives_its_pool_memory_back(dev):
    """Dropping a graphed function (and its outputs) frees its graphs and then its memory pool: after
    ``torch.cuda.empty_cache()`` the device memory torch reserves is back where it was."""
    import gc

    # the process's first capture makes the BLAS workspaces of graphjit's capture stream, outside the pool, and they
    # stay for the process (as torch's own do for every stream): made here, before the base is read
    warm = graphjit.graphed(lambda x: torch.nn.functional.linear(x @ x, x, x[0]))
    with torch.no_grad():
        for _ in range(3):
            warm(torch.ones(8, 8, device=dev))
    del warm
    torch.cuda.synchronize()
    gc.collect()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_reserved(dev)

    def use() -> int:
        f = graphjit.graphed(lambda x: torch.relu(x @ x) * 2)
        x = torch.randn(2048, 2048, device=dev)
        with torch.no_grad():
            for _ in range(4):
                f(x)
        st = f.stats()
        assert st["replays"] >= 2 and not st["fallbacks"], st
        torch.cuda.synchronize()
        torch.cuda.empty_cache()  # what stays reserved now is in use: x, the graph's buffers and its pool
        return torch.cuda.memory_reserved(dev) - base

    pool_bytes = use()
    assert pool_bytes >= 3 * 2048 * 2048 * 4  # x, the static input, the intermediates and the output
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    assert torch.cuda.memory_reserved(dev) <= base, (torch.cuda.memory_reserved(dev), base, pool_bytes)


def test_collectives_read_the_stream_and_device_the_framework_would(dev):
    """The swap's fast reads (the raw current stream, the cached device names) agree with torch's own
    objects: on the default stream, on a side stream, during a capture, and for a tensor on each GPU."""
    from graphjit.backends.torch.dist import Dist

    d = Dist()
    assert d.current_stream(0) == torch.cuda.current_stream(0).cuda_stream
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        assert d.current_stream(0) == side.cuda_stream != torch.cuda.default_stream(0).cuda_stream
    x = torch.zeros(64, device=dev)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        seen = d.current_stream(0)
        x.add_(1)
        assert seen == torch.cuda.current_stream(0).cuda_stream
    torch.cuda.synchronize()
    for i in range(torch.cuda.device_count()):
        t = torch.ones(8, 3, device=f"cuda:{i}", dtype=torch.bfloat16)
        info = d.tensor_info(t)
        assert info == ("bfloat16", 24, 48, t.data_ptr(), True, f"cuda:{i}")
        assert d.tensor_info(t.t()).contiguous is False


def test_tp_mlp_example_runs_the_custom_all_reduce_in_its_graphs_on_one_gpu():
    """examples/tp_mlp.py --backend shared: 2 processes on GPU 0, each step captured with graphjit's custom
    all-reduce inside (the shared-GPU test mode); the result matches the single-process reference."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    environ = {k: v for k, v in os.environ.items() if not k.startswith("GRAPHJIT_")}
    environ["PYTHONPATH"] = root + os.pathsep + environ.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, os.path.join(root, "examples", "tp_mlp.py"), "--backend", "shared",
                           "--steps", "4"], capture_output=True, text=True, timeout=300, cwd=root, env=environ)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "graphjit's custom kernel for" in out and "MISMATCH" not in out, out[-4000:]
    assert "no CUDA graph" not in out, out[-4000:]


def test_the_first_capture_of_a_process_leaves_no_blas_workspace_in_its_pool():
    """cuBLAS and cuBLASLt keep a workspace per (handle, stream), made at the library's first use on a stream.  The
    first capture of a fresh process, of bf16 products through both (``mm``: cuBLAS, ``linear`` with a bias:
    cuBLASLt), must find both made outside it: made inside, they come from the graph's pool and pin it, and dropping
    the function would not give the pool's memory back (a segment of the graph's pool would stay reserved)."""
    code = textwrap.dedent("""
        import gc, torch, graphjit
        dev = torch.device("cuda", 0)
        w = torch.randn(1024, 1024, device=dev, dtype=torch.bfloat16)
        b = torch.randn(1024, device=dev, dtype=torch.bfloat16)
        x = torch.randn(64, 1024, device=dev, dtype=torch.bfloat16)
        torch.cuda.synchronize()

        def use():
            f = graphjit.graphed(lambda x: torch.nn.functional.linear(x @ w, w, b))
            with torch.no_grad():
                outs = [f(x) for _ in range(4)]
            assert f.stats()["replays"] >= 1 and not f.stats()["fallbacks"], f.stats()
            want = torch.nn.functional.linear(x @ w, w, b).float()
            assert float((outs[-1].float() - want).norm() / want.norm()) < 1e-2

        use()
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        pools = {tuple(s["segment_pool_id"]) for s in torch.cuda.memory_snapshot()}
        print("POOLS", sorted(pools))
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in [os.getcwd(), os.environ.get("PYTHONPATH", "")] if p))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "POOLS [(0, 0)]" in r.stdout, r.stdout + r.stderr  # only the default pool's memory is left


def test_the_pool_size_reading_is_torchs_memory_reserved():
    from graphjit.backends.torch.device import reserved as _reserved

    keep = torch.empty(1 << 20, device="cuda")
    assert _reserved(0) == torch.cuda.memory_reserved(0) > 0
    del keep


def _built_batch_library(dev) -> None:
    """graphjit's csrc library built and loaded for this GPU (the tests of batch copies need it there)."""
    from graphjit import batch_copy
    from graphjit.collectives import csrc_build

    major, minor = torch.cuda.get_device_capability(dev)
    arch = f"sm_{major}{minor}"
    if csrc_build.find_nvcc()[0] is None and not csrc_build.library_path(arch).is_file():
        pytest.skip("graphjit's csrc library is not built and nvcc is not installed")
    csrc_build.build(arch)
    assert batch_copy.library(arch, dev.index or 0) is not None, batch_copy.status()


def test_batch_copies_move_inputs_and_outputs_exactly(dev, monkeypatch):
    """Inputs and outputs of many dtypes, odd sizes, an address off 16-byte alignment, a large one: one batch copy
    of the outputs per replay (torch's inputs go in by _foreach_copy_), bit-equal to eager on a side stream too;
    and 70 tensors through the kernel directly (two launches of 64 entries at most)."""
    from graphjit import batch_copy

    _built_batch_library(dev)
    served = collections.Counter()
    into, out_of = batch_copy.Batch.into, batch_copy.Batch.out_of

    def counted_into(self, which, tensors):
        done = into(self, which, tensors)
        n = len(which)
        if done:
            served[n] += 1
        return done

    def counted_out_of(self):
        outs = out_of(self)
        n = len(outs) if outs is not None else 0
        if outs is not None:
            served[n] += 1
        return outs

    monkeypatch.setattr(batch_copy.Batch, "into", counted_into)
    monkeypatch.setattr(batch_copy.Batch, "out_of", counted_out_of)

    def body(a, b, c, d, big, *many):
        s = a.float().sum() + b.float().sum() + c.float().sum() + d.float().sum()
        return a * 2, b + 1, c.logical_not(), d[1:] - 3, big * 0.5, torch.stack(many).sum(0) + s

    step = graphjit.graphed(body)

    def fresh(i):
        g = torch.Generator(device="cpu").manual_seed(i)
        a = torch.randn(5, 7, generator=g).to(dev, torch.float16)
        b = torch.randint(-9, 9, (3, 11), generator=g).to(dev)  # int64
        c = (torch.randn(13, generator=g) > 0).to(dev)  # bool, 13 bytes
        d = torch.randn(9, generator=g).to(dev, torch.bfloat16)
        big = torch.randn(3 * 1024 * 1024 // 4, generator=g).to(dev)
        offset = torch.randn(301, generator=g).to(dev)[1:]  # 4 bytes past a 16-byte boundary
        many = [offset[:100] * k for k in range(65)]  # 66 + 5 inputs: more than one launch's 64 entries
        return a, b, c, d, big, offset[:100], *many

    side = torch.cuda.Stream(dev)
    for i in range(8):
        args = fresh(i)
        side.wait_stream(torch.cuda.current_stream(dev))  # the inputs were made on the default stream
        with torch.cuda.stream(side) if i % 2 else contextlib.nullcontext():
            got = step(*args)
            want = body(*args)
        torch.cuda.synchronize()
        for g_, w in zip(got, want):
            assert g_.dtype == w.dtype and torch.equal(g_, w)
    st = step.stats()
    assert st["replays"] >= 5 and st["captures"] >= 1
    assert served[6] >= st["replays"] and not served[71], served  # outputs out (inputs: torch's _foreach_copy_)
    from graphjit.backends.torch.copies import OPERANDS

    sources = fresh(99)
    statics = [torch.full_like(t, 7) for t in sources]
    plan = batch_copy.Batch.plan(OPERANDS, statics)
    assert plan is not None and all(plan.usable)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        assert plan.into(range(len(sources)), sources)
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(statics, sources))


def test_a_module_hook_registered_after_the_capture_is_run(dev):
    """A forward hook registered after the capture changes what a call computes: the graph captured without it is not
    replayed; a graph with it is captured once it settles, and the first graph serves again once it is removed."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64)).to(dev)
    f = graphjit.graphed(m)
    x = torch.randn(8, 64, device=dev)

    def calls(n):
        with torch.no_grad():
            for _ in range(n):
                got, want = f(x), m(x)
                assert torch.allclose(got, want, atol=1e-5), f.report()

    calls(4)
    assert f.stats()["graphs"] == 1
    h = m[0].register_forward_hook(lambda mod, a, out: out * 0.5 + 1)
    calls(5)
    st = f.stats()
    assert st["graphs"] == 2 and st["replays"] >= 4, f.report()
    h.remove()
    replays = st["replays"]
    calls(2)
    assert f.stats()["graphs"] == 2 and f.stats()["replays"] == replays + 2, f.report()
