"""torch half of ``python -m graphjit bench allreduce``: the worker process, one per rank.

``python -m graphjit.bench.torch.allreduce --worker CONFIG RANK`` is what
:func:`graphjit.bench.allreduce.supervise_workers` starts for every rank.  :class:`_Worker` joins the process
group (NCCL, or gloo for the smoke runs), sets up graphjit's custom all-reduce and torch's symmetric memory, then
for every size checks and times every variant, agreeing with the other ranks through a gloo side group; rank 0
writes the JSON and PNG and prints the table.  :func:`_worker_main` is a worker's whole life: it always ends
with ``os._exit`` after flushing.

The worker protocol's framework-neutral parts (the progress file
:class:`graphjit.bench.allreduce.WorkerStatus`, combining the ranks' checks and timings, the results, table and
plot) live in :mod:`graphjit.bench.allreduce`.  torch is imported when the worker starts, not with this module.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import common
from ..allreduce import CUSTOM_TIMEOUT_S, FORCED_ENV, RECORDED_ENV
from ..allreduce_results import (
    VARIANTS,
    WorkerStatus,
    combine_checks,
    combine_timings,
    custom_delta,
    finalize,
    plot,
    report_lines,
    size_label,
    table,
    variant_cell,
)
from ..common import say


class _Worker:
    """One rank: its process group, graphjit's custom all-reduce, the symmetric-memory reference, and the
    checks and timings of every size and variant (see the module's docstring)."""

    def __init__(self, cfg: dict[str, Any], rank: int, status: WorkerStatus) -> None:
        from datetime import timedelta

        import torch
        import torch.distributed as dist

        self.cfg, self.rank, self.status = cfg, rank, status
        self.data: dict[str, Any] = cfg["data"]
        self.world = int(self.data["world_size"])
        c = self.data["config"]
        self.torch, self.dist = torch, dist
        self.gpu = bool(cfg["on_gpu"])
        self.shared = bool(cfg.get("shared"))
        self.sizes: list[int] = c["sizes"]
        self.variants: list[str] = c["variants"]
        self.iters, self.repeats, self.warmup = int(c["iters"]), int(c["repeats"]), int(c["warmup"])
        self.dtype = getattr(torch, c["torch_dtype"])
        if self.gpu:
            index = 0 if self.shared else rank
            torch.cuda.set_device(index)
            self.device = torch.device("cuda", index)
        else:
            self.device = torch.device("cpu")
        timeout = timedelta(seconds=float(cfg["collective_timeout"]))
        status.stage("process group")
        self.backend: str = c["backend"]  # nccl, or gloo (CPU and shared-GPU smoke runs)
        dist.init_process_group(self.backend, init_method=f"file://{cfg['rendezvous']}",
                                rank=rank, world_size=self.world, timeout=timeout)
        # Verdicts and results go through gloo on the CPU: they still work when a GPU collective went wrong.
        self.ctl = dist.new_group(list(range(self.world)), backend="gloo", timeout=timeout)
        self.group_name = getattr(dist.group.WORLD, "group_name", None)
        status.stage("collectives.init")
        import graphjit
        from graphjit import collectives
        from graphjit.collectives import custom_ar, swap

        self.graphjit, self.collectives = graphjit, collectives
        self.report: dict[str, Any] | None = None
        self.init_error: str | None = None
        self.lib: Any = None
        if any(VARIANTS[v][0] == "custom" for v in self.variants):
            try:
                blocks = c.get("ar_max_blocks") or custom_ar.DEFAULT_MAX_BLOCKS
                rep = collectives.init(max_bytes=int(c["ar_max_bytes"]), scope="always", backend="torch",
                                       max_blocks=int(blocks),
                                       timeout_s=min(CUSTOM_TIMEOUT_S, float(cfg["collective_timeout"])),
                                       pointer_slots=max(custom_ar.DEFAULT_SLOTS, 2 * self.iters + 16))
                self.report = rep.as_dict()
                comms = custom_ar.communicators()
                if rep.enabled and comms:
                    self.lib = comms[0].lib
            except Exception as exc:
                self.init_error = common.error_text(exc)
        self.nccl = swap.original("torch")  # the framework's own all_reduce, never graphjit's
        self.symm_op: Any = None
        self.symm_mem: Any = None
        self.symm_reason: str | None = None
        if any(VARIANTS[v][0] == "symm" for v in self.variants):
            status.stage("symmetric memory probe")
            self.symm_reason = self._symm_probe()
        self.sbuf: Any = None

    # -- plumbing ---------------------------------------------------------------------------------
    def sync(self) -> None:
        if self.gpu:
            self.torch.cuda.synchronize()

    def agree(self, local: Any) -> list[Any]:
        out: list[Any] = [None] * self.world
        self.dist.all_gather_object(out, local, group=self.ctl)
        return out

    def set_algo(self, algo: str | None) -> None:
        if algo is None:
            os.environ.pop("GRAPHJIT_AR_ALGO", None)
        else:
            os.environ.update(GRAPHJIT_AR_ALGO=algo)  # graphjit reads it (env.py) after refresh_env()
        self.graphjit.refresh_env()

    def custom_stats(self) -> dict[str, Any]:
        return self.collectives.stats()

    def _symm_probe(self) -> str | None:
        """None if torch's symmetric-memory two_shot all-reduce works here (agreed by both ranks), else why not."""
        local: str | None = None
        if not self.gpu:
            local = "CPU smoke run: torch symmetric memory needs CUDA GPUs"
        elif self.shared:
            local = "shared-GPU smoke run: torch symmetric memory needs one GPU per rank"
        else:
            try:
                import torch.distributed._symmetric_memory as symm_mem

                op = getattr(getattr(self.torch.ops, "symm_mem", None), "two_shot_all_reduce_", None)
                if op is None:
                    local = f"torch {self.torch.__version__} has no torch.ops.symm_mem.two_shot_all_reduce_"
                elif not self.group_name:
                    local = "the process group has no group_name (torch too old for symmetric memory)"
                else:
                    self.symm_mem, self.symm_op = symm_mem, op
            except Exception as exc:
                local = f"torch.distributed._symmetric_memory is not importable: {common.error_text(exc)}"
        verdicts = self.agree(local)
        reason = next((f"rank {r}: {v}" for r, v in enumerate(verdicts) if v), None)
        if reason is None:
            try:
                buf = self.symm_alloc(4096 // self.dtype_size())
                buf.fill_(float(self.rank + 1))
                self.symm_op(buf, "sum", self.group_name)
                self.sync()
                local = None if bool((buf == float(self.world * (self.world + 1) // 2)).all()) else \
                    "the 4 KiB probe returned a wrong sum"
                del buf
            except Exception as exc:
                local = f"the 4 KiB probe failed: {common.error_text(exc)}"
            verdicts = self.agree(local)
            reason = next((f"rank {r}: {v}" for r, v in enumerate(verdicts) if v), None)
        if reason is not None:
            self.symm_op = None
        return reason

    def symm_alloc(self, numel: int) -> Any:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            enable = getattr(self.symm_mem, "enable_symm_mem_for_group", None)
            if enable is not None:  # needed before torch 2.7; a deprecated no-op afterwards
                with contextlib.suppress(Exception):
                    enable(self.group_name)
        buf = self.symm_mem.empty(numel, dtype=self.dtype, device=self.device)
        self.symm_mem.rendezvous(buf, self.group_name)
        return buf

    def dtype_size(self) -> int:
        return int(self.torch.empty((), dtype=self.dtype).element_size())

    # -- one size --------------------------------------------------------------------------------
    def run(self) -> int:
        torch = self.torch
        data = self.data
        if self.rank == 0:
            data["env"] = common.environment()
            data["env"]["worker_env"] = {k: v for k, v in sorted(os.environ.items()) if RECORDED_ENV.match(k)}
            data["collectives"] = {"report": self.report, "init_error": self.init_error}
            data["symm_mem"] = {"available": self.symm_op is not None, "reason": self.symm_reason}
            common.write_json(Path(self.cfg["json_path"]), data)
        es = self.dtype_size()
        for nbytes in self.sizes:
            label = size_label(nbytes)
            self.status.stage(f"size {label}")
            n = nbytes // es
            gen = torch.Generator(device=self.device)
            gen.manual_seed(int(self.cfg["data"]["config"]["seed"]) * 1_000_003 + 7919 * self.rank + nbytes)
            x = torch.randn(n, generator=gen, device=self.device).to(self.dtype)
            ref = x.clone()
            self.nccl(ref)
            parts = [torch.empty_like(x) for _ in range(self.world)]
            self.dist.all_gather(parts, x)
            exact = sum(p.double() for p in parts).to(self.dtype)  # correctly rounded sum of the inputs
            del parts
            entry: dict[str, Any] = {"bytes": nbytes, "size": label, "numel": n, "variants": {}}
            if self.lib is not None:
                with contextlib.suppress(Exception):
                    entry["auto_algo"] = {1: "1shot", 2: "2shot"}.get(self.lib.choose_algo(self.world, nbytes))
            self.sbuf = None
            if self.symm_op is not None and any(VARIANTS[v][0] == "symm" for v in self.variants):
                try:
                    self.sbuf = self.symm_alloc(n)
                    local = None
                except Exception as exc:
                    local = common.error_text(exc)
                verdicts = self.agree(local)
                bad = next((f"rank {r}: {v}" for r, v in enumerate(verdicts) if v), None)
                if bad:
                    self.sbuf = None
                    entry["symm_alloc_error"] = bad
            for name in self.variants:
                self.status.stage(f"size {label}, {name}")
                entry["variants"][name] = self.variant(name, x, ref, exact, entry.get("symm_alloc_error"))
            self.sbuf = None
            del x, ref, exact
            self.sync()
            data["results"].append(entry)
            if self.rank == 0:
                common.write_json(Path(self.cfg["json_path"]), data)
                say(f"allreduce: {label}: " + ", ".join(
                    f"{v} {variant_cell(entry, v):.1f}" if isinstance(variant_cell(entry, v), float)
                    else f"{v} {variant_cell(entry, v)}"
                    for v in self.variants))
        self.status.stage("done")
        self.agree("done")  # both ranks are through every collective
        if self.rank != 0:
            return 0
        return self.finish()

    def finish(self) -> int:
        data = self.data
        finalize(data)
        data["complete"] = True
        json_path, png_path = Path(self.cfg["json_path"]), Path(self.cfg["png_path"])
        note = None
        if not self.cfg["no_plot"]:
            note = plot(data, png_path)
        data["plot"] = None if (self.cfg["no_plot"] or note) else png_path.name
        if note:
            data["plot_error"] = note
        common.write_json(json_path, data)
        say(table(data))
        for line in report_lines(data):
            say(line)
        for p in data["summary"]["problems"][:20]:
            say(f"problem: {p}")
        for p in data["summary"]["notes"][:5]:
            say(f"note: {p}")
        say(f"wrote {json_path}" + (f" and {png_path}" if data["plot"] else ""))
        if note:
            say(f"no plot: {note}")
        return 0 if data["summary"]["ok"] else 1

    # -- one variant -----------------------------------------------------------------------------
    def skip_reason(self, impl: str, mode: str, symm_alloc_error: str | None) -> str | None:
        if not self.gpu:
            if impl == "custom":
                why = "CPU smoke run (gloo, no GPU): the custom all-reduce needs 2 CUDA GPUs on one node"
                if self.report and self.report.get("reason"):
                    why += f" (collectives.init: {self.report['reason_key']}: {self.report['reason']})"
                return why
            if impl == "symm":
                return self.symm_reason or "CPU smoke run: torch symmetric memory needs CUDA GPUs"
            if mode == "graph":
                return "CPU smoke run: CUDA graphs need a GPU"
            return None
        if self.shared and impl == "nccl" and mode == "graph":
            return "shared-GPU smoke run: the framework's all-reduce is gloo there, which a CUDA graph cannot hold"
        if impl == "custom" and self.init_error:
            return f"collectives.init raised: {self.init_error}"
        if impl == "symm":
            if self.symm_reason:
                return f"torch symmetric memory unavailable: {self.symm_reason}"
            if symm_alloc_error:
                return f"allocating the symmetric-memory buffer failed: {symm_alloc_error}"
        return None

    def variant(self, name: str, x: Any, ref: Any, exact: Any, symm_alloc_error: str | None) -> dict[str, Any]:
        impl, algo, mode = VARIANTS[name]
        reason = self.skip_reason(impl, mode, symm_alloc_error)
        if reason:
            return {"status": "skipped", "reason": reason}
        if impl == "custom":
            self.set_algo(algo)
        out: dict[str, Any]
        try:
            checks = self.agree(common.guarded(lambda: self.check(impl, mode, x, ref, exact)))
            out = combine_checks(checks)
            if impl == "nccl":
                out["backend"] = self.backend
            if out["status"] == "ok":
                timings = self.agree(common.guarded(lambda: self.timing(impl, mode, x.numel())))
                out.update(combine_timings(timings))
        finally:
            self.sync()
            self.agree(None)  # both ranks are done with this variant's buffers and graphs
            if impl == "custom":
                if mode == "graph":
                    with contextlib.suppress(Exception):
                        self.collectives.reset()  # free the pointer-table slots of the dropped graphs
                self.set_algo(None)
        return out

    def one(self, impl: str, buf: Any) -> Callable[[], Any]:
        if impl == "nccl":
            return lambda: self.nccl(buf)
        if impl == "custom":
            return lambda: self.dist.all_reduce(buf)  # graphjit's swap (scope="always")
        return lambda: self.symm_op(buf, "sum", self.group_name)

    def capture(self, fn: Callable[[], Any], count: int, impl: str) -> Any:
        """A CUDA graph of ``count`` calls of ``fn`` (one warmup call on a side stream first).  thread_local
        capture mode: the NCCL watchdog thread may query events while this thread captures."""
        torch = self.torch
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            for _ in range(count):
                fn()
        torch.cuda.synchronize()
        if impl == "custom":
            self.collectives.register_graph_buffers()  # a collective: both ranks captured the same
        return graph

    def check(self, impl: str, mode: str, x: Any, ref: Any, exact: Any) -> dict[str, Any]:
        """One all-reduce of ``x`` through the variant, compared with the correctly rounded sum; custom variants:
        did graphjit's kernel run, or the framework's collective (a fallback)?"""
        before = self.custom_stats() if impl == "custom" else None
        buf = self.sbuf if impl == "symm" else x.clone()
        if impl == "symm":
            buf.copy_(x)
        if mode == "eager":
            self.one(impl, buf)()
        else:
            graph = self.capture(self.one(impl, buf), 1, impl)
            buf.copy_(x)
            graph.replay()
            del graph
        self.sync()
        # Against the correctly rounded sum of the inputs.  The custom kernel adds in fp32 and rounds
        # once: within one eps of the largest value.  NCCL's ring rounds to the dtype after every hop:
        # up to world - 1 roundings.
        want, against = exact, "the correctly rounded sum"
        diff = float((buf.double() - want.double()).abs().max())
        scale = float(want.double().abs().max())
        roundings = max(1, self.world - 1) if impl == "nccl" else 1
        tol = float(self.torch.finfo(self.dtype).eps) * scale * roundings
        out: dict[str, Any] = {"status": "ok", "check": {"max_abs_diff": diff, "max_abs": scale, "tol": tol,
                                                         "correct": bool(diff <= tol), "against": against}}
        if before is not None:
            out.update(custom_delta(before, self.custom_stats(), expect="eager" if mode == "eager" else "captured"))
        return out

    def timing(self, impl: str, mode: str, numel: int) -> dict[str, Any]:
        torch = self.torch
        before = self.custom_stats() if impl == "custom" else None
        if impl == "symm":
            buf = self.sbuf
            buf.zero_()
        else:
            buf = torch.zeros(numel, dtype=self.dtype, device=self.device)
        one = self.one(impl, buf)
        iters = self.iters
        if mode == "eager":
            for _ in range(self.warmup):
                one()

            def body() -> None:
                for _ in range(iters):
                    one()
        else:
            graph = self.capture(one, iters, impl)
            graph.replay()  # warmup replay
            body = graph.replay
        self.sync()
        samples, host = [], []
        perf = time.perf_counter_ns
        for _ in range(self.repeats):
            one()  # untimed: lines the two ranks up
            if self.gpu:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                t0 = perf()
                body()
                t1 = perf()
                end.record()
                end.synchronize()
                samples.append(start.elapsed_time(end) * 1e3 / iters)
            else:
                t0 = perf()
                body()
                t1 = perf()
                samples.append((t1 - t0) / 1e3 / iters)
            host.append((t1 - t0) / 1e3 / iters)
        self.sync()
        out: dict[str, Any] = {"status": "ok", "samples_us": samples, "median_us": common.median(samples),
                               "host_us_per_call": common.median(host)}
        if before is not None:
            delta = custom_delta(before, self.custom_stats(), expect=None)
            out.update(delta)
        return out


def _worker_main(argv: list[str]) -> None:
    """A worker's whole life: whatever happens, it ends here with ``os._exit`` after flushing."""
    code = 1
    status: WorkerStatus | None = None
    try:
        os.environ.update(FORCED_ENV)  # again, before torch and NCCL read them
        cfg = json.loads(Path(argv[0]).read_text())
        rank = int(argv[1])
        status = WorkerStatus(Path(cfg["tmp"]) / f"rank{rank}.status.json", rank)
        code = _Worker(cfg, rank, status).run()
        status.data["done"] = True
        status.save()
    except BaseException as exc:
        if status is not None:
            status.fail(exc)
        traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)  # no interpreter teardown: NCCL, the IPC mappings and graphs go with the process


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        _worker_main(sys.argv[2:])
    print("usage: python -m graphjit bench allreduce [options]  (this module's entry point is for its workers)",
          file=sys.stderr)
    sys.exit(2)
