"""A replay that hands the graph its call's tensors: the graph copies them in and out itself.

A key's graph may be captured with two *feed nodes* (``csrc``: ``gj_feed_node``): a batch copy at its start that
copies the caller's moved inputs into the static inputs, and one at its end that copies the static outputs into
the fresh tensors the call returns.  Each call sets those two nodes' pointers in the executable graph and launches
it, in one call into graphjit's library (``gj_feed_launch``), instead of a framework copy before the replay and a
clone after it: on one H200 host that is most of a graphed call's host time (``bench decode``'s host-cost part).

:class:`Handoff` is planned once per key, after its capture (:meth:`Handoff.plan`): which inputs it may copy, where
each static buffer is and how many bytes it holds, which outputs come out fresh.  A call then makes one pass over
its tensors (:meth:`Handoff.replay`).

Guarantees: a call it serves acts as the copy-in, replay, copy-out path of :class:`~graphjit.buffers.KeyEntry`
would: the same bytes in the static inputs before the graph's first node reads them, the same fresh outputs, on
the current stream.  It serves a call only where that is plain: every adopted input at its buffer's address and
layout, every tensor passed twice passed as one tensor, every moved input with its buffer's strides (dense: the
buffers are; a size-1 dim's stride aside), its bytes its values and outside graphjit's own buffers, every static
output still at its address.
Anything else (and a library that refuses the call) it leaves to the copy path, which keeps its own checks
(:class:`~graphjit.buffers.InputMoved` and the rest): :meth:`Handoff.replay` then returns :data:`NOT_SERVED` having
launched nothing.

Refuses nothing: keys it cannot plan (bucketed or grad-requiring inputs, more tensors than a node holds, a
graph without feed nodes: Paddle's, a piecewise one, one captured while the library was being built) replay
by copies as before.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import array

    from .backends.base import Backend
    from .buffers import StaticInputs, StaticOutputs
    from .stats import KeyStats
    from .tree import Call

__all__ = ["NOT_SERVED", "Feed", "Handoff"]

log = logging.getLogger("graphjit")

STATUS_PENDING_ERROR = 6
"""The library's status for a call refused because a CUDA error of earlier work is pending (``GJ_ERR_STATE``): that
call only goes the copy path."""

NOT_SERVED: Any = object()
"""What :meth:`Handoff.replay` returns where the copy path must serve the call (nothing was launched)."""


class Feed(Protocol):
    """A backend's feed nodes of one graph (``backends/torch/feed.py``).

    ``table`` is what the library reads (``csrc/graphjit_ar.cu``, ``gj_feed_launch``): a header the backend
    fills, then six arrays of ``entries`` words from ``header`` on: input destinations, sources and sizes,
    output destinations, sources and sizes."""

    table: array.array[int]
    entries: int
    header: int

    def usable(self, t: Any) -> bool:
        """A fixed buffer the nodes may copy (dense memory of the graph's GPU); asked once per key."""

    negated: Callable[[Any], bool]
    """True for a caller's tensor whose bytes are not its values (a lazy negation); asked per call, so a C function
    where the framework has one."""

    def empty_for(self, outputs: Sequence[Any]) -> Callable[[Any], Any]:
        """The function that makes, for each of ``outputs`` (the fixed buffers copied out fresh), a new dense tensor
        laid out as a clone of it would be; chosen once per key (a C function where the framework has one)."""

    def launch(self, n_in: int, n_out: int) -> int:
        """Set the nodes to the table's first entries and replay the graph; 0, or the library's status."""

    def why(self, status: int) -> str:
        """The library's message for a failed :meth:`launch`."""


class Handoff:
    """The plan of one key's replays through its graph's feed nodes (see the module docstring)."""

    __slots__ = ("adopted", "adopted_ptrs", "aliases", "broken", "empty", "feed", "fresh", "in_bytes", "in_dst",
                 "in_src", "inputs", "inside_owned", "moved", "negated", "out_dst", "outputs", "ptr", "rebuild", "seen",
                 "single_source", "stats", "store_back", "stride", "table")

    def __init__(self, backend: Backend, feed: Feed, inputs: StaticInputs, outputs: StaticOutputs,
                 movable: Sequence[int], stats: KeyStats) -> None:
        self.feed = feed
        self.stats = stats  # the key's counters: a served call is counted here, its caller does not come back
        # inputs the graph writes in place into graphjit's buffers (not adopted): copied back into the caller's
        # tensors after the launch (an adopted input is written where the caller has it: nothing to copy)
        copied_back = any(not inputs.adopted[i] for i in inputs.mutated_idx)
        self.store_back: Callable[[Sequence[Any]], None] | None = inputs.store_back if copied_back else None
        self.table = feed.table
        self.ptr: Callable[[Any], int] = backend.data_ptr
        self.stride: Callable[[Any], Any] = backend.strides
        self.negated: Callable[[Any], bool] = feed.negated
        self.empty = feed.empty_for(outputs.copied)
        h, m = feed.header, feed.entries
        self.in_dst, self.in_src, self.in_bytes = h, h + m, h + 2 * m
        self.out_dst = h + 3 * m
        statics = inputs.statics
        self.inputs = inputs  # whose copies this counts
        # adopted inputs: the caller's own tensors, which must be where the graph reads them
        self.adopted = [(i, inputs.ptrs[i], inputs.strides[i]) for i in inputs.adopted_idx]
        self.adopted_ptrs = inputs.adopted_ptrs
        self.aliases = list(inputs.alias_pairs)
        self.inside_owned = inputs.inside_owned
        # inputs copied in when moved: (index, buffer, its address, its strides, its bytes, its dims of size > 1)
        self.moved = [(i, statics[i], inputs.ptrs[i], inputs.strides[i], backend.nbytes(statics[i]),
                       [d for d, n in enumerate(inputs.shapes[i]) if n > 1]) for i in movable]
        # per moved input, the source address its last served call came from (found outside graphjit's buffers and
        # the adopted ones, which never move for a key): the same address again needs no second look
        self.seen = [-1] * len(self.moved)  # -1: none yet (a null address is never served)
        self.outputs = outputs
        # outputs copied out (not one of the state's tensors, nor a view of another output): the fixed side of each
        # entry written once, here
        self.fresh = [(t, self.ptr(t)) for t in outputs.copied]
        table = self.table
        for j, (t, p) in enumerate(self.fresh):
            table[h + 4 * m + j] = p
            table[h + 5 * m + j] = backend.nbytes(t)
        self.single_source = outputs.source[0] if outputs.single else None  # the call's input it is, if one
        self.rebuild: Callable[..., Any] | None = (None if outputs.single else outputs.rebuild_from_copies
                                                   if outputs.sub_views else outputs.rebuild_copy)
        self.broken = False  # the library refused a call for a reason that holds for the next ones too

    @classmethod
    def plan(cls, backend: Backend, feed: Feed | None, inputs: StaticInputs, outputs: StaticOutputs,
             stats: KeyStats) -> Handoff | None:
        """The plan for a key whose graph has feed nodes, where every buffer a call may copy fits them; else None."""
        if feed is None or inputs.any_bucketed or not inputs.grad_free or outputs.views or \
                (outputs.single and outputs.kept[0]):
            # (an output that is a view of an input, or the one output a tensor of the function's state:
            # StaticOutputs.result makes it, the copy path serves)
            return None
        movable = [i for i in range(len(inputs.statics)) if not inputs.adopted[i] and i not in inputs.aliases]
        if len(movable) > feed.entries or len(outputs.copied) > feed.entries:
            return None
        if not all(feed.usable(inputs.statics[i]) for i in movable) or not all(map(feed.usable, outputs.copied)):
            return None
        return cls(backend, feed, inputs, outputs, movable, stats)

    def replay(self, tensors: Sequence[Any], copy: bool, call: Call | None) -> Any:
        """Replay the graph for a call of ``tensors`` (the key's tensors, in order); its result: fresh outputs
        (``copy``) or the static ones, the call counted in the key's stats and any input the graph writes in place
        copied back; an output that is one of the call's inputs or arguments is the call's own (``call``: its
        ``(args, kwargs)``).  :data:`NOT_SERVED` where the copy path must serve it (nothing launched, nothing
        counted)."""
        ptr, stride = self.ptr, self.stride
        for i, p, s in self.adopted:
            t = tensors[i]
            if ptr(t) != p or stride(t) != s:
                return NOT_SERVED  # moved, or another layout: the copy path says how (InputMoved)
        for i, o in self.aliases:
            if tensors[i] is not tensors[o]:
                return NOT_SERVED
        if self.store_back is not None and self.inputs.overlap(tensors) is not None:
            return NOT_SERVED  # a written input's memory passed twice: the copy path says so (InputMoved)
        table, negated, seen = self.table, self.negated, self.seen
        dst_at, src_at, bytes_at = self.in_dst, self.in_src, self.in_bytes
        k = 0
        for j, (i, static, sp, ss, nbytes, wide) in enumerate(self.moved):
            t = tensors[i]
            if t is static:
                continue
            p = ptr(t)
            st = stride(t)
            if st != ss and any(st[d] != ss[d] for d in wide):
                return NOT_SERVED  # not the dense buffer's layout (strides of size-1 dims do not count)
            if p == sp:
                continue  # the buffer itself, as another tensor object
            if negated(t):
                return NOT_SERVED
            if p != seen[j]:  # an address this input did not come from last time: where is it?
                if not p or p in self.adopted_ptrs or self.inside_owned(p):
                    return NOT_SERVED
                seen[j] = p
            table[dst_at + k] = sp
            table[src_at + k] = p
            table[bytes_at + k] = nbytes
            k += 1
        outs: list[Any] = []
        if copy and self.fresh:
            for t, p in self.fresh:
                if ptr(t) != p:
                    return NOT_SERVED  # a module buffer returned as it is, rebound since
            empty, at = self.empty, self.out_dst
            for j, (t, _p) in enumerate(self.fresh):
                o = empty(t)
                table[at + j] = ptr(o)
                outs.append(o)
        rc = self.feed.launch(k, len(outs))
        if rc:
            if rc != STATUS_PENDING_ERROR:  # not an error of earlier work: every later call would fail the same way
                self.broken = True
                log.info("graphjit: a graph's feed nodes failed (%s); its calls copy by the framework from now on",
                         self.feed.why(rc))
            return NOT_SERVED
        self.inputs.copies += k
        st = self.stats
        if not st.fed_replays:  # the first: who launches (decided at the graph's first replay by torch)
            st.feed = self.launcher()
        st.fed_replays += 1
        st.replays += 1
        st.input_copies += k
        if self.store_back is not None:
            self.store_back(tensors)
            st.copy_backs = self.inputs.copy_backs
        if not copy:
            return self.outputs.result((), False, tensors, call)
        if self.rebuild is None:
            src = self.single_source
            return outs[0] if src is None else tensors[src]
        return self.rebuild(outs, tensors, call)

    def launcher(self) -> str:
        """Who launches the graph: ``"torch"`` where its replays draw random numbers (the framework adds their
        offsets), else ``"library"``."""
        return "torch" if getattr(self.feed, "random", False) else "library"
