"""A CPU stand-in for torch's CUDA graphs, for CPU tests of graphjit's call lifecycle (never proof of
GPU behaviour: the GPU tests are that).

What it keeps of a real CUDA graph, since graphjit's exactly-once bookkeeping depends on it:

* Capture records the aten ops of the function (a ``TorchDispatchMode``) and runs only those that
  write nothing: an op that writes a tensor in place (``add_``, ``index_copy_``, ``copy_``, ``out=``)
  is recorded and not run (BatchNorm's update of its running statistics, which its schema does not mark,
  runs on copies), and every other op runs with the generator put back afterwards, so a capture
  changes no existing tensor and does not advance the generator, as a CUDA capture does.
* Replay runs every recorded op again, in order, on the same memory (inputs, intermediates and outputs keep their
  "addresses"); functional results are copied into the tensors the capture made.  The ops' tensor arguments are
  kept as aliases (``detach()``: the same storage, strides and offset), never as the caller's objects: a CUDA
  graph holds addresses, not Python references, so a tensor nobody else holds is referenced by graphjit alone.
  Python code does not run again: Python values and object attributes stay as the capture left them.
  Random ops draw new numbers from the generator and advance it.
* A sync (``.item()``, ``nonzero``, ``torch.equal``) inside a capture raises, as CUDA does, and is
  reported by ``sync_watch`` during warmup.
"""

from __future__ import annotations

import array
import contextlib
import ctypes
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import torch
from backend_swap import swapped
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from graphjit.backends.base import GraphHandle, Segments, in_island, segments_open
from graphjit.backends.torch import feed as feed_mod
from graphjit.backends.torch.copies import _plain_bytes
from graphjit.backends.torch.graphs import TorchBackend, autocast_cache_off
from graphjit.errors import CaptureError

aten = torch.ops.aten
__graphjit_skip_frames__ = True  # reasons name the test's line, not the emulator's
SYNC_OPS = {aten._local_scalar_dense.default, aten.nonzero.default, aten.is_nonzero.default, aten.equal.default,
            aten.masked_select.default, aten.allclose.default}


UNMARKED_WRITES = {aten.native_batch_norm.default}
"""Ops that write arguments their schema does not mark written (and that move no version counter)."""


def _writes(func: Any) -> bool:
    return any(a.alias_info is not None and a.alias_info.is_write for a in func._schema.arguments)


def _is_view(func: Any) -> bool:
    return any(r.alias_info is not None and not r.alias_info.is_write for r in func._schema.returns)


def _written_returns(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """What an in-place / out= op returns, without running it: the arguments it writes."""
    by_set: dict[Any, Any] = {}
    schema = func._schema
    for i, a in enumerate(schema.arguments):
        if a.alias_info is not None and a.alias_info.is_write:
            value = args[i] if i < len(args) else kwargs.get(a.name)
            for s in a.alias_info.before_set:
                by_set[s] = value
    rets = []
    for r in schema.returns:
        if r.alias_info is None:
            rets.append(None)
        else:
            rets.append(next((by_set[s] for s in r.alias_info.before_set if s in by_set), None))
    if not rets:
        return None
    return rets[0] if len(rets) == 1 else tuple(rets)


def _address(a: Any) -> Any:
    """What a recorded op keeps of an argument: a tensor's memory (an alias), not the tensor object."""
    return a.detach() if isinstance(a, torch.Tensor) else a


class _Recorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, Any, tuple[Any, ...], dict[str, Any], Any]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in SYNC_OPS:
            raise RuntimeError(f"operation not permitted when stream is capturing (emulated CUDA graph: {func})")
        if any(isinstance(a, torch.Generator) and a is not torch.default_generator
               for a in (*args, *kwargs.values())):  # torch raises so for a generator not registered with the graph
            raise RuntimeError("Attempt to increase offset for a CUDA generator not in capture mode (emulated CUDA "
                               f"graph: {func} draws from a generator of its own)")
        kept, kept_kw = tree_map(_address, args), tree_map(_address, kwargs)
        if _writes(func):
            self.ops.append(("write", func, kept, kept_kw, None))
            return _written_returns(func, args, kwargs)
        if func in UNMARKED_WRITES and args[5] and args[3] is not None:  # training: updates the running stats
            # native_batch_norm writes running_mean/var (args 3, 4) without saying so in its schema (a real
            # capture records it without running it): run it on copies, and the op itself on replay.
            state = list(args)
            state[3], state[4] = args[3].clone(), args[4].clone()
            out = func(*state, **kwargs)
            self.ops.append(("compute", func, kept, kept_kw, out))
            return out
        state = torch.default_generator.get_state()  # a random op (rand_like has no generator argument to tell)
        out = func(*args, **kwargs)
        torch.default_generator.set_state(state)
        self.ops.append(("view" if _is_view(func) else "compute", func, kept, kept_kw, out))
        return out


class EmulatedGraph(GraphHandle):
    """The recorded ops of one capture; :meth:`replay` runs them again on the same tensors."""

    def __init__(self, ops: list[tuple[str, Any, tuple[Any, ...], dict[str, Any], Any]]) -> None:
        self.ops = ops
        self.replays = 0

    def replay(self) -> None:
        with torch.no_grad():
            for kind, func, args, kwargs, out in self.ops:
                if kind == "view":
                    continue
                res = func(*args, **kwargs)
                if kind == "compute":
                    got, _ = tree_flatten(res)
                    want, _ = tree_flatten(out)
                    for dst, src in zip(want, got):
                        if isinstance(dst, torch.Tensor) and dst is not src:
                            dst.copy_(src)
        self.replays += 1

    def reset(self) -> None:
        self.ops = []


class EmulatedFeed:
    """Feed nodes of an emulated graph (graphjit.handoff): :meth:`launch` copies the table's input entries byte for
    byte (``memmove`` between the CPU tensors' storages, as the in node copies on the GPU), replays the recorded ops,
    then copies the output entries, as the out node does at the graph's end."""

    entries = 64
    header = 8

    def __init__(self, graph: EmulatedGraph) -> None:
        self.table = array.array("Q", [0] * (self.header + 6 * self.entries))
        self.graph = graph
        self.launches = 0
        self.negated = torch.Tensor.is_neg

    def usable(self, t: Any) -> bool:
        return bool(type(t) is torch.Tensor and t.device.type == "cpu" and _plain_bytes(t))


    def empty_for(self, outputs: Any) -> Any:
        return feed_mod.empty_for(outputs)  # the GPU feed's own choice

    def launch(self, n_in: int, n_out: int) -> int:
        t, h, m = self.table, self.header, self.entries
        for k in range(n_in):
            ctypes.memmove(t[h + k], t[h + m + k], t[h + 2 * m + k])
        self.graph.replay()
        for k in range(n_out):
            ctypes.memmove(t[h + 3 * m + k], t[h + 4 * m + k], t[h + 5 * m + k])
        self.launches += 1
        return 0

    def why(self, status: int) -> str:
        return f"status {status}"


class _SyncWatch(TorchDispatchMode):
    def __init__(self, hits: list[str]) -> None:
        super().__init__()
        self.hits = hits

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        if func in SYNC_OPS and not in_island():
            frame = next((f for f in reversed(traceback.extract_stack()[:-1])
                          if "torch" not in f.filename and "graph_emulator" not in f.filename), None)
            where = f"{frame.filename}:{frame.lineno}" if frame else "?"
            self.hits.append(f"{func} at {where}")
        return func(*args, **(kwargs or {}))


class EmulatedTorchBackend(TorchBackend):
    """The torch backend with :class:`EmulatedGraph` captures for CPU tensors."""

    def graphs_unavailable(self, device: str) -> str | None:
        return None if device == "cpu" else "the emulated backend captures CPU tensors only"

    def new_pool(self, device: str) -> Any:
        return None

    def device_guard(self, device: str) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def synchronize(self, device: str) -> None:
        pass

    def warmup_guard(self, device: str) -> contextlib.AbstractContextManager[Any]:
        """No side stream on the CPU (graphed_layer's side warmup runs on the caller's thread as it is)."""
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def sync_watch(self, hits: list[str]) -> Iterator[None]:
        with _SyncWatch(hits):
            yield

    feeds = True
    """Captures give their graph emulated feed nodes (:class:`EmulatedFeed`) where graphjit asks for them."""

    def capture_graph(self, fn: Callable[[], Any], device: str, pool: Any, debug: bool,
                      feed: bool = False, operands: Callable[[], Any] | None = None) -> tuple[GraphHandle, Any]:
        segments = _Segments()
        segments.resume()
        try:
            with autocast_cache_off(), segments_open(segments):  # as the real capture
                out = fn()
        except RuntimeError as exc:
            segments.end()
            first = str(exc).splitlines()[0]
            raise CaptureError(f"capture failed: {first}", reason="capture failed: " + first[:120]) from exc
        except BaseException:
            segments.end()
            raise
        whole = segments.cuts == 0
        graph = segments.cut()
        if feed and self.feeds and whole:
            graph.feed = EmulatedFeed(graph)  # type: ignore[assignment]
        return graph, out


class _Segments(Segments):
    """Emulated segments: one recorder per segment, entered and left by hand."""

    def __init__(self) -> None:
        self.rec: _Recorder | None = None
        self.cuts = 0

    def cut(self) -> GraphHandle:
        rec, self.rec = self.rec, None
        assert rec is not None, "cut outside a segment"
        rec.__exit__(None, None, None)
        self.cuts += 1
        return EmulatedGraph(rec.ops)

    def resume(self) -> None:
        assert self.rec is None, "resume inside a segment"
        self.rec = _Recorder()
        self.rec.__enter__()

    def end(self) -> None:
        if self.rec is not None:
            self.rec.__exit__(None, None, None)
            self.rec = None


def record_compile_tracer(monkeypatch: Any) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """Stand in for the compile tracer (on a CPU, Inductor would compile for a minute; the GPU tests run the real
    one): the function runs as written, and each call that goes through the compiled function appends its
    ``(args, kwargs)`` to the list returned (a plain function's call bound in parameter order by graphjit, a wrapped
    one's as written).  Its Dynamo guards are none."""
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def trace(self: Any, fn: Callable[..., Any], tracer: str) -> Callable[..., Any]:
        if tracer != "compile":
            return fn

        def compiled(*args: Any, **kwargs: Any) -> Any:
            calls.append((args, kwargs))
            return fn(*args, **kwargs)

        return compiled

    monkeypatch.setattr(EmulatedTorchBackend, "trace", trace)
    monkeypatch.setattr(EmulatedTorchBackend, "tracer_guard", lambda self, target, tracer, f_locals: None)
    return calls


@contextlib.contextmanager
def emulated_torch() -> Iterator[EmulatedTorchBackend]:
    """graphjit's torch backend replaced by :class:`EmulatedTorchBackend` for the block."""
    with swapped("torch", EmulatedTorchBackend()) as emulated:
        yield emulated
