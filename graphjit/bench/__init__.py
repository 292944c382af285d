"""Benchmarks behind ``python -m graphjit bench NAME``.

Each benchmark is a module of this package with two functions:

* ``add_arguments(parser)``: its own options (the command line adds ``--out``, ``--tag`` and
  ``--hard-exit`` to every benchmark, see :func:`graphjit.bench.common.add_common_arguments`);
* ``run(args) -> int``: run it, write ``JSON`` + ``PNG`` under ``--out``, print a short table, return
  the exit status.

Modules here never import a framework: their torch and paddle halves live in :mod:`graphjit.bench.torch`
and :mod:`graphjit.bench.paddle` (same file names), imported inside functions, so building the command
line costs nothing.  Adding a benchmark is one module plus one :func:`register` line below (and its
framework halves).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType


@dataclass(frozen=True)
class Benchmark:
    """One ``bench`` subcommand: its name, the module that implements it and a one-line help."""

    name: str
    module: str
    help: str

    def load(self) -> ModuleType:
        return importlib.import_module(self.module)


REGISTRY: dict[str, Benchmark] = {}


def register(name: str, module: str, help: str) -> Benchmark:
    """Add a ``bench`` subcommand (``module`` must define ``add_arguments`` and ``run``)."""
    if name in REGISTRY:
        raise ValueError(f"benchmark {name!r} is already registered ({REGISTRY[name].module})")
    bench = Benchmark(name, module, help)
    REGISTRY[name] = bench
    return bench


register("allreduce", "graphjit.bench.allreduce",
         "all-reduce on 2 GPUs (torch, NCCL): graphjit's custom 1shot/2shot/auto vs NCCL, eager and in a CUDA graph, "
         "4 KiB-64 MiB")
register("capture", "graphjit.bench.capture",
         "ahead-of-time capture of vLLM's 51 batch sizes: graphjit.capture_scope vs by hand into one pool, time and "
         "memory (torch; needs a GPU)")
register("decode", "graphjit.bench.decode",
         "decode step (L x matmul/silu/add/RMSNorm): eager vs raw CUDA graph vs @graphed vs compile (needs a GPU)")
register("dispatch", "graphjit.bench.dispatch",
         "host cost of graphjit's key path per call (Signer.sign, @graphed on CPU) against a direct call")
register("generate", "graphjit.bench.generate",
         "transformers' generate() per model family: eager vs graphjit.graph_generation (eager and compile tracers) vs "
         "transformers' compiled path, first call and steady state (torch + transformers; needs a GPU)")
register("hf", "graphjit.bench.hf",
         "Hugging Face Llama decode step (StaticCache): eager vs hand-made CUDA graph vs @graphed vs compile "
         "(torch + transformers; needs a GPU)")
register("piecewise", "graphjit.bench.piecewise",
         "decode step with per-call attention metadata: eager vs piecewise capture (attention an island) vs a whole "
         "graph of its fixed-shape variant, and the cost of one island boundary (torch; needs a GPU)")
register("train", "graphjit.bench.train",
         "training step (forward, backward, SGD) of an MLP and a transformer block: eager vs graphed_layer "
         "(torch; needs a GPU)")

__all__ = ["REGISTRY", "Benchmark", "register"]
