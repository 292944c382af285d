"""Probe (GPU): does resetting one CUDA graph free the cuBLAS workspace other live graphs captured on the same
stream use?  (torch's CUDAGraph::reset calls clearCublasWorkspacesForStream in some versions, pytorch#193402.)

Prints the allocator's bytes in use after priming a stream with a matmul, after capturing and resetting a second
graph on it, and whether a graph captured before still replays right over fresh allocations."""

from __future__ import annotations

import json

import torch


def main() -> None:
    dev = torch.device("cuda", 0)
    s = torch.cuda.Stream()
    a = torch.randn(4096, 4096, device=dev)
    b = torch.randn(4096, 4096, device=dev)
    torch.cuda.synchronize()
    m0 = torch.cuda.memory_allocated(dev)
    with torch.cuda.stream(s):
        c = a @ b
    torch.cuda.synchronize()
    del c
    m1 = torch.cuda.memory_allocated(dev)  # + the workspace of (handle, s)
    pool = torch.cuda.graph_pool_handle()
    g1 = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g1, stream=s, pool=pool):
        out1 = a @ b
    g2 = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g2, stream=s, pool=pool):
        out2 = b @ a
    torch.cuda.synchronize()
    m2 = torch.cuda.memory_allocated(dev)
    del out2
    g2.reset()
    torch.cuda.synchronize()
    m3 = torch.cuda.memory_allocated(dev)
    fill = [torch.full((1 << 20,), 7.0, device=dev) for _ in range(64)]  # reuse whatever was freed
    ref = a @ b
    ok = True
    for _ in range(20):
        g1.replay()
        torch.cuda.synchronize()
        ok = ok and torch.equal(out1, ref) and all(bool((t == 7).all()) for t in fill)
    print(json.dumps({"torch": torch.__version__, "after_prime": m1 - m0, "after_two_captures": m2 - m0,
                      "after_reset_of_the_second": m3 - m0, "first_graph_right_and_memory_untouched": ok}))


if __name__ == "__main__":
    main()
