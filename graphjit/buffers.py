"""What a key replays: its graph's static buffers (tensor inputs and outputs) and the entry that replays it.

A replayed call stays here from :meth:`KeyEntry.replay` to its result: :meth:`StaticInputs.load`, the graph's
``replay()``, :meth:`StaticOutputs.result` (``docs/architecture.md`` walks the whole path).

Inputs.  A graph reads its inputs from fixed addresses.  For each tensor input graphjit keeps one
static buffer and copies the caller's tensor into it only when the caller's tensor is somewhere else
(a different address, or a smaller size of a bucketed dimension).  An input that the function
mutates in place (a KV cache) is *adopted*: the caller's own tensor is the static buffer, so a decode
loop that passes the same cache every step copies nothing and sees its cache updated exactly as
eager would.  If an adopted input later arrives at another address, :class:`InputMoved` is raised
and the key is captured again with a graphjit-owned buffer, which is then copied in and copied back
on every call (the caller's tensor is never left stale, and the previously adopted tensor is never
written to again).

Outputs.  ``outputs="copy"`` returns fresh tensors; ``outputs="alias"`` returns the graph's static
output tensors (views, when bucket padding is sliced off), valid until the next call of the function.
Either way, an output that is one of the call's inputs (the function returns the cache it wrote in place, as
transformers' models return their cache object) is the caller's own tensor, as an eager call returns it, and an
output object that is one of the call's arguments is the caller's own object (``tree.places``): never copied,
whether the graph reads the tensor in place (adopted) or a copy of it, so passing it back in the next call keeps
every address the graph was captured with, and Python values the replay advances are advanced on it.  An output
that is a tensor of the function's state (a module buffer it returns) is that tensor, never copied; with ``"copy"``, an
output that is a view of another output is the same view of that output's copy (:func:`_sub_views`).
"""

from __future__ import annotations

import bisect
import contextlib
from collections.abc import Callable, Container, Sequence
from typing import TYPE_CHECKING, Any

from .backends.base import Backend, GraphHandle
from .batch_copy import Batch
from .handoff import NOT_SERVED, Handoff
from .keys import CallSignature, Pad
from .rebuild_plan import FRESH, KEEP, rebuilder
from .renewals import Feed, occupied
from .tree import Call, Path, collect_tensors, places

if TYPE_CHECKING:
    from .advances import Advances
    from .feeds import StepContext
    from .guard_set import GuardSet
    from .recheck import DynamicCheck
    from .stats import KeyStats
    from .warmup import Warmup

__all__ = ["OVERLAP", "OVERLAP_WHY", "InputMoved", "InputsOverlap", "KeyEntry", "StaticInputs", "StaticOutputs",
           "collect_tensors", "real_view"]

OVERLAP = "a written input overlaps another input"
"""The reason of a call that passes an input the graph writes in place and, as another input, its memory (the same
tensor, a view overlapping it) where the graph has a buffer for each (:meth:`StaticInputs.overlap`): it runs
uncaptured."""
OVERLAP_WHY = ("%s is written in place and overlaps another input, which has a buffer of its own: a graph would read "
               "that input from a copy made before the write; pass them as one tensor, or as copies")


class InputMoved(Exception):
    """Adopted (in-place mutated) inputs arrived at new addresses: the key must be recaptured.

    ``leaf``: the first of them; ``leaves``: all of them (a cache passed anew moves all its tensors at once)."""

    def __init__(self, leaf: int, leaves: frozenset[int] | None = None) -> None:
        super().__init__(leaf)
        self.leaf = leaf
        self.leaves = leaves if leaves is not None else frozenset((leaf,))


class InputsOverlap(InputMoved):
    """An input the graph writes in place shares memory with another input of the call (:meth:`StaticInputs.overlap`:
    the same tensor twice, or views that overlap): the call runs uncaptured (the key keeps its graph).  Where a caller
    does not tell it apart, it is an :class:`InputMoved`: the key is captured again, and that capture refuses views
    that overlap in part."""


def real_view(backend: Backend, static: Any, real: Sequence[int], full: Sequence[int]) -> Any:
    """The part of a padded ``static`` buffer that holds a tensor of shape ``real``."""
    view = static
    for dim, (r, f) in enumerate(zip(real, full)):
        if r != f:
            view = backend.narrow(view, dim, 0, r)
    return view


class StaticInputs:
    """The static input buffers of one key, and the copies in and back around each replay."""

    def __init__(self, backend: Backend, statics: list[Any], adopted: list[bool], mutated: list[bool],
                 bucketed: set[int], grad_free: bool = False) -> None:
        self.backend = backend
        self.grad_free = grad_free  # no input of this key requires grad (the key holds that flag)
        self.statics = statics
        self.ptrs = [backend.data_ptr(s) for s in statics]
        self.strides = [backend.strides(s) for s in statics]
        self.shapes = [backend.shape(s) for s in statics]
        self.adopted = adopted
        self.adopted_idx = [i for i, a in enumerate(adopted) if a]
        self.mutated_idx = [i for i, m in enumerate(mutated) if m]
        self.mutated = mutated
        self.bucketed = [i in bucketed for i in range(len(statics))]
        self.any_bucketed = bool(bucketed)
        self.last_real: dict[int, tuple[int, ...]] = {}
        self.copies = 0
        self.copy_backs = 0
        # Inputs that were one tensor in the capturing call share one buffer: (input, the first of them).  A call
        # that passes them as different tensors, or passes an adopted input again as another argument, is another
        # aliasing than the graph's: load() says so (InputMoved) and the key is captured again for it.
        first: dict[int, int] = {}
        self.alias_pairs: list[tuple[int, int]] = []
        for i, st in enumerate(statics):
            owner = first.setdefault(id(st), i)
            if owner != i:
                self.alias_pairs.append((i, owner))
        self.aliases = frozenset(i for i, _owner in self.alias_pairs)  # copied in by their owner: one buffer
        # inputs the graph writes in place in graphjit's buffers (copied back after): a call that also passes their
        # memory as another input with a buffer of its own has the graph read a copy the write never reaches
        self.written_copied = [i for i in self.mutated_idx if not adopted[i]]
        self.buffer_of = [first[id(st)] for st in statics]
        self.sizes = [backend.nbytes(st) for st in statics] if self.written_copied else []
        self.apart: list[tuple[int, ...]] = []  # the last few address tuples found without such an overlap
        self.adopted_ptrs = frozenset(self.ptrs[i] for i in self.adopted_idx)
        # graphjit's own buffers (handed out by static_inputs()): a caller may pass one as another input
        # (a view into one, too: a source inside a buffer is read before anything is copied into that buffer)
        owned = sorted({(p, p + backend.nbytes(statics[i])) for i, p in enumerate(self.ptrs) if not adopted[i]})
        self.owned_starts = [start for start, _end in owned]
        self.owned_ends = [end for _start, end in owned]
        # several moved inputs: one launch of graphjit's batch copy (graphjit.batch_copy), where it can serve
        ops = backend.batch_operands()
        self.batch = (Batch.plan(ops, [None if adopted[i] else st for i, st in enumerate(statics)])
                      if ops is not None and ops.inputs else None)

    def load(self, tensors: Sequence[Any]) -> None:
        """Bring the caller's tensors into the static buffers (hot path).

        A tensor is in place only at the buffer's address *and* with its strides: a view of it at the same
        address with another layout (``x.t()`` of a square ``x``) is copied in through a clone (an adopted one
        moved), never read as the buffer's layout.

        Raises :class:`InputMoved` (before copying anything) if an adopted input moved.
        """
        b = self.backend
        ptr, stride = b.data_ptr, b.strides
        ptrs, strides = self.ptrs, self.strides
        if self.written_copied:
            shared = self.overlap(tensors)
            if shared is not None:  # uncaptured: a graph of one buffer for both would be recaptured at every switch
                raise InputsOverlap(shared[0])  # where calls alternate (views that overlap in part have none at all)
        for i in self.adopted_idx:
            t = tensors[i]
            if ptr(t) != ptrs[i] or (stride(t) != strides[i] and not self._same_layout(i, t)):
                moved = frozenset(j for j in self.adopted_idx
                                  if ptr(tensors[j]) != ptrs[j] or not self._same_layout(j, tensors[j]))
                raise InputMoved(i, moved)
        for i, o in self.alias_pairs:
            a, c = tensors[i], tensors[o]
            if a is not c and (ptr(a) != ptr(c) or stride(a) != stride(c)):
                raise InputMoved(i)  # one tensor at capture, two now: the graph reads one buffer for both
        adopted_ptrs, aliases = self.adopted_ptrs, self.aliases
        which: list[int] = []
        srcs: list[Any] = []
        statics = self.statics
        for i, t in enumerate(tensors):
            if i in aliases:  # one buffer with its owner input (the same tensor), which copies it in, padded or not
                continue
            if self.any_bucketed and self.bucketed[i]:
                real = b.shape(t)
                if real != self.shapes[i]:
                    self._load_padded(i, t, real)
                    continue
                self.last_real.pop(i, None)
            if t is statics[i]:  # the buffer itself (static_inputs(), or an adopted input checked above)
                continue
            p = ptr(t)
            if p != ptrs[i]:
                if p in adopted_ptrs:  # an adopted input passed again as this one: the graph reads a stale copy
                    raise InputMoved(i)
                which.append(i)
                # another input's buffer or a view into one (static_inputs() passed swapped): read before it is written
                srcs.append(b.clone(t) if self.inside_owned(p) else t)
            elif stride(t) != strides[i] and not self._same_layout(i, t):  # the buffer in another layout: via a clone
                which.append(i)
                srcs.append(b.clone(t))
        if which:
            batch = self.batch
            if batch is None or not batch.into(which, srcs):
                b.copy_many([statics[i] for i in which], srcs, self.grad_free)
            self.copies += len(which)

    def overlap(self, tensors: Sequence[Any]) -> tuple[int, int] | None:
        """``(i, j)``: input ``i`` is one the graph writes in place in a buffer of graphjit's, and the call also passes
        its memory as input ``j``, which has a buffer of its own (the same tensor twice, or overlapping views); None
        where there is none.  Eager would read the write there; the graph reads a copy made before it.  Each input's
        span is its buffer's size from its address (a strided view may reach further: not seen)."""
        ptr, sizes, buffer_of = self.backend.data_ptr, self.sizes, self.buffer_of
        starts = tuple(map(ptr, tensors))
        if starts in self.apart:  # the addresses of a recent call (a decode loop passes the same tensors): as then
            return None
        for i in self.written_copied:
            start, end, mine = starts[i], starts[i] + sizes[i], buffer_of[i]
            for j, other in enumerate(starts):
                if buffer_of[j] != mine and other < end and start < other + sizes[j]:
                    return i, j
        self.apart = [starts, *self.apart[:3]]
        return None

    def inside_owned(self, p: int) -> bool:
        """The address ``p`` lies inside one of graphjit's own input buffers."""
        k = bisect.bisect_right(self.owned_starts, p) - 1
        return k >= 0 and p < self.owned_ends[k]

    def _same_layout(self, i: int, t: Any) -> bool:
        """``t`` (at buffer ``i``'s address) has the buffer's strides, where its size makes them matter."""
        got = self.backend.strides(t)
        want = self.strides[i]
        if got == want:
            return True
        shape = self.shapes[i]
        return len(got) == len(want) and all(g == w for g, w, n in zip(got, want, shape) if n > 1)

    def _load_padded(self, i: int, t: Any, real: tuple[int, ...]) -> None:
        b = self.backend
        static = self.statics[i]
        src = b.clone(t) if b.data_ptr(t) == self.ptrs[i] else t
        if self.last_real.get(i) != real or self.mutated[i]:
            b.zero_(static)  # padding rows must not carry data of an earlier, larger call
            self.last_real[i] = real
        b.copy_(real_view(b, static, real, self.shapes[i]), src)
        self.copies += 1

    def store_back(self, tensors: Sequence[Any]) -> None:
        """Copy in-place mutations from owned static buffers back into the caller's tensors."""
        b = self.backend
        for i in self.mutated_idx:
            if self.adopted[i]:
                continue
            t = tensors[i]
            real = b.shape(t)
            in_place = b.data_ptr(t) == self.ptrs[i]
            if in_place and real == self.shapes[i] and self._same_layout(i, t):
                continue
            view = real_view(b, self.statics[i], real, self.shapes[i])
            b.copy_(t, b.clone(view) if in_place else view)  # the buffer itself in another layout: via a clone
            self.copy_backs += 1


class StaticOutputs:
    """The output structure of one graph: static output tensors plus any constant non-tensor leaves.

    ``inputs``: the graph's static inputs, and ``arguments`` the capturing call's ``(args, kwargs)`` holding them.
    An output that is one of the inputs is the call's own tensor, and an output container or object that is one of
    the arguments (unchanged: the same tensors under it) is the call's own object, as an eager call returns them
    (see the module docstring): never copied, whether the graph reads the caller's tensor in place (adopted) or a
    copy of it (a graph-owned buffer, copied back where the graph writes it)."""

    def __init__(self, backend: Backend, obj: Any, is_tensor: Callable[[Any], bool],
                 bucket_dims: set[tuple[int, int]], inputs: StaticInputs | None = None,
                 arguments: Call | None = None, state: Container[int] = ()) -> None:
        self.backend = backend
        self.obj = obj
        self.is_tensor = is_tensor
        self.single = is_tensor(obj)
        self.tensors: list[Any] = [obj] if self.single else collect_tensors(obj, is_tensor)
        statics = self.statics = inputs.statics if inputs is not None else []
        index: dict[int, int] = {}
        shared: set[int] = set()  # a buffer behind several inputs (one tensor and a view of it): not one input
        for i, st in enumerate(statics):
            if index.setdefault(id(st), i) != i:
                shared.add(id(st))
        for k in shared:
            del index[k]
        # the call's input each output is (None: none), handed back as the call's own tensor
        self.source: list[int | None] = [index.get(id(t)) for t in self.tensors]
        # outputs that are tensors the function's state holds (``state``: their ids; a module's buffer it updates in
        # place and returns): handed back as that very tensor, as an eager call returns it, never copied
        self.kept = [src is None and id(t) in state for t, src in zip(self.tensors, self.source)]
        # The return value's tree, planned once per mode (tree.rebuilder): copied, the outputs that are not the
        # call's inputs are fresh clones; aliased, the static outputs themselves; padded, views or clones of them
        # (the copy plan: it takes them in the same order).
        # (once each: an output returned twice, ``return h, h``, is one copy at both places, as eager's is one tensor)
        self.fresh = list({id(t): t for t, src, kept in zip(self.tensors, self.source, self.kept)
                           if src is None and not kept}.values())
        # those that are views of an input's buffer (``return x[0]``): (its index among them, the input's, where in
        # it, the buffer's strides); a call whose tensor there has the buffer's layout gets that view of its own
        # tensor, as eager does (else a copy)
        self.views: list[tuple[int, int, int, tuple[int, ...]]] = []
        for j, t in enumerate(self.fresh):
            for i, st in enumerate(statics):
                offset = backend.view_offset(t, st)  # None at once on a framework that makes no views (Paddle)
                if offset is not None and _inside(backend.extent(t), backend.extent(st)):
                    self.views.append((j, i, offset, backend.strides(st)))
                    break
        # the bucketed dims of each of those, sliced back to the call's real size where it is padded
        self.slice_dims = [[(d, n) for d, n in enumerate(backend.shape(t)) if (d, n) in bucket_dims]
                           for t in self.fresh]
        # those that are views of another of them (``return logits, logits[:, -1]``), outside bucket padding: the
        # same view of that one's copy, as eager's is a view of the tensor it returns (:func:`_sub_views`)
        self.sub_views = [] if bucket_dims else _sub_views(backend, self.fresh, {j for j, *_ in self.views})
        subs = {j for j, _i, _o in self.sub_views}
        self.copied_at = [j for j in range(len(self.fresh)) if j not in subs]  # the outputs a replay copies
        copied = self.copied = [self.fresh[j] for j in self.copied_at]
        self.batch: Batch | None = None
        if not self.single:
            argument = _arguments(statics, arguments, is_tensor) if arguments is not None else None
            inputs_at = [KEEP if src is None else src for src in self.source]
            self.rebuild_copy = rebuilder(obj, [KEEP if kept else FRESH if src is None else src
                                                for src, kept in zip(self.source, self.kept)], is_tensor, argument)
            self.rebuild_alias = rebuilder(obj, inputs_at, is_tensor, argument)
            # copies of several outputs: one launch of graphjit's batch copy (graphjit.batch_copy), where it can serve
            ops = backend.batch_operands()
            self.batch = Batch.plan(ops, copied, every=True) if ops is not None and ops.outputs else None

    def result(self, pads: Sequence[Pad], copy: bool, tensors: Sequence[Any] | None, call: Call | None) -> Any:
        """The call's return value: copies (or views) of the static outputs, padding sliced off; the call's own
        ``tensors`` and arguments (``call``: its ``(args, kwargs)``) where an output is one of them.  Without
        ``tensors``, the static outputs as the graph holds them (verify compares those)."""
        b = self.backend
        if not pads:  # the common case: nothing to slice
            if self.single:
                t, src = self.tensors[0], self.source[0]
                if src is not None:
                    return tensors[src] if tensors is not None else t
                if copy and self.views and tensors is not None:
                    return self._viewed(tensors)[0]
                return b.clone(t) if copy and not self.kept[0] else t
            if copy:
                if self.views and tensors is not None:
                    return self.rebuild_copy(self._viewed(tensors), tensors, call)
                batch = self.batch
                outs = batch.out_of() if batch is not None else None
                if outs is None:
                    clone = b.clone
                    outs = [clone(self.fresh[j]) for j in self.copied_at]
                if self.sub_views:
                    outs = self._with_sub_views(outs)
                return self.rebuild_copy(outs, tensors, call)
            return self.rebuild_alias((), tensors, call)
        padmap: dict[tuple[int, int], int] = {}
        for p in pads:
            padmap.setdefault((p.dim, p.padded), p.real)
        if tensors is None:  # the static inputs, as the call's real sizes see them
            tensors = list(self.statics)
            for p in pads:
                tensors[p.leaf] = b.narrow(tensors[p.leaf], p.dim, 0, p.real)
        out = []
        for t, dims in zip(self.fresh, self.slice_dims):
            v = t
            if padmap and dims:
                for d, n in dims:
                    real = padmap.get((d, n))
                    if real is not None:
                        v = b.narrow(v, d, 0, real)
            out.append(b.clone(v) if copy else v)
        if self.single:
            src = self.source[0]
            return tensors[src] if src is not None else self.tensors[0] if self.kept[0] else out[0]
        return self.rebuild_copy(out, tensors, call)

    def rebuild_from_copies(self, copied: list[Any], tensors: Sequence[Any] | None, call: Call | None) -> Any:
        """:attr:`rebuild_copy` from copies of :attr:`copied` alone (the feed nodes' copies: :mod:`graphjit.handoff`),
        the views of them made here."""
        return self.rebuild_copy(self._with_sub_views(copied) if self.sub_views else copied, tensors, call)

    def _with_sub_views(self, copied: list[Any]) -> list[Any]:
        """The outputs for :attr:`fresh` from the copies of those that are not views of another (:attr:`copied_at`,
        in order): each of the others the same view of its base's copy (:attr:`sub_views`)."""
        outs: list[Any] = [None] * len(self.fresh)
        for j, o in zip(self.copied_at, copied):
            outs[j] = o
        view_of, fresh = self.backend.view_of, self.fresh
        for j, i, offset in self.sub_views:
            outs[j] = view_of(outs[i], fresh[j], offset)
        return outs

    def _viewed(self, tensors: Sequence[Any]) -> list[Any]:
        """Copies of the static outputs (:attr:`fresh`), but each that is a view of an input's buffer (:attr:`views`)
        the same view of the call's own tensor there, where that tensor has the buffer's strides and needs no grad (a
        tensor in another layout, or one the copy path copied into the buffer by a layout change: a copy)."""
        b, fresh = self.backend, self.fresh
        viewed: dict[int, Any] = {}
        for j, i, offset, strides in self.views:
            base = tensors[i]
            if b.strides(base) == strides and not b.requires_grad(base):
                viewed[j] = b.view_of(base, fresh[j], offset)
        outs = [viewed[j] if j in viewed else b.clone(t) for j, t in enumerate(fresh)]
        for j, i, offset in self.sub_views:  # (never one of the views above: those are views of an input)
            outs[j] = b.view_of(outs[i], fresh[j], offset)
        return outs


def _sub_views(b: Backend, fresh: Sequence[Any], skip: set[int]) -> list[tuple[int, int, int]]:
    """``(j, i, offset)`` for each output ``fresh[j]`` (not in ``skip``: a view of an input) whose elements lie
    within another output ``fresh[i]``, a view of it of its dtype (``return logits, logits[:, -1]``), where a copy
    of ``fresh[i]`` has its strides (``offset``: elements past its first).  ``i`` is the widest such output, the
    first of equally wide ones, so it is never itself one of them.  Decided at capture: pairs are compared by the
    bytes they span first (ints), :meth:`Backend.view_offset` only for those inside another's."""
    spans = [b.extent(t) for t in fresh]
    out: list[tuple[int, int, int]] = []
    dense: dict[int, bool] = {}
    for j, span in enumerate(spans):
        if j in skip or span[0] == span[1]:
            continue
        best, widest = None, -1
        for i, outer in enumerate(spans):
            if i != j and _inside(span, outer) and outer[1] - outer[0] > widest:
                best, widest = i, outer[1] - outer[0]
        if best is None or (spans[best] == span and best > j):
            continue  # none, or this one is the base of equally wide views
        offset = b.view_offset(fresh[j], fresh[best])
        if offset is None or offset < 0:
            continue
        if best not in dense:  # the copy a replay hands out has the base's strides (a dense base)
            dense[best] = b.strides(b.clone(fresh[best])) == b.strides(fresh[best])
        if dense[best]:
            out.append((j, best, offset))
    return out


def _inside(span: tuple[int, int], outer: tuple[int, int]) -> bool:
    """The memory ``span`` lies within ``outer`` (a view of an input's own elements, not merely of its storage)."""
    return outer[0] <= span[0] and span[1] <= outer[1]


def _arguments(statics: Sequence[Any], arguments: Call,
               is_tensor: Callable[[Any], bool]) -> Callable[[Any, list[Any]], Path | None]:
    """For :func:`~graphjit.tree.rebuilder`: the path of a container or object of the capturing call's arguments
    whose tensors are still the static inputs at its place (the call did not rebind them), else None."""
    where = places(arguments[0], arguments[1], is_tensor)

    def argument(x: Any, leaves: list[Any]) -> Path | None:
        found = where.get(id(x))
        if found is None:
            return None
        path, first, stop = found
        if stop > len(statics) or len(leaves) != stop - first or any(
                t is not statics[first + j] for j, t in enumerate(leaves)):
            return None
        return path

    return argument


class KeyEntry:
    """A captured graph of one key, with its static inputs and outputs (made by :func:`graphjit.capture.build`).

    What a replay does is decided here once: whether guards are checked first (:attr:`check`), whether the graph
    is piecewise (it then takes the call's dynamic values)."""

    __slots__ = ("__weakref__", "advances", "check", "device", "feed", "feeds", "graph", "guards", "handoff", "inputs",
                 "lane", "lane_settings", "lane_tries", "no_adopt", "outputs", "piecewise", "recheck", "stats", "warm")

    def __init__(self, graph: GraphHandle, inputs: StaticInputs, outputs: StaticOutputs, stats: KeyStats,
                 no_adopt: frozenset[int], warm: Warmup, device: str, guard: GuardSet | None = None,
                 piecewise: bool = False) -> None:
        self.guards = guard
        # What a replay checks first: every value the capture read still holds (None: nothing to check).
        self.check: Callable[[], bool] | None = (
            guard.holds if guard is not None and (len(guard) or guard.extra or guard.hooks) else None)
        # the copies of the tensors graphjit feeds the graph at places the caller rebinds, around each replay
        self.feed = (Feed(guard.fed, guard.fed_which, guard.taken, occupied(guard, warm))
                     if guard is not None and guard.fed is not None and guard.fed_which else None)
        self.graph = graph
        self.piecewise = piecewise  # a PiecewiseGraph: its islands read the call's dynamic values
        self.inputs = inputs
        self.outputs = outputs
        self.stats = stats
        self.no_adopt = no_adopt
        self.warm = warm  # what warmup found; holds the state tensors the graph writes, so they stay alive with it
        self.device = device
        self.recheck: DynamicCheck | None = None  # still to verify on a call with other dynamic values or padding
        self.feeds: StepContext | None = None  # hyperparameters filled into device tensors around each call (feeds.py)
        self.advances: Advances | None = None  # scalars of its key each replay sets as the call would (advances.py)
        # the graph copies the call's tensors in and out itself where it has feed nodes (handoff.py)
        # (a key with buckets has none: Handoff.plan refuses it, so a served call has no pads)
        self.handoff = None if piecewise else Handoff.plan(inputs.backend, graph.feed, inputs, outputs, stats)
        self.lane: Any = None  # the replay lane's plan of this key (lane.py): None not made yet, False never
        self.lane_settings: Any = None  # the settings it was made under
        self.lane_tries = 0  # replays at which its plan could not be made yet (lane.PLAN_TRIES)

    def replay(self, sig: CallSignature, copy: bool, call: Call | None) -> Any:
        """Load inputs, replay, copy mutations back, return outputs (``call``: the call's ``(args, kwargs)``, whose
        own objects come back where an output is one of them).  Raises ``InputMoved``.

        The graph's feed nodes serve the call where they can (:meth:`Handoff.replay`, which ``_State.replay`` calls
        itself on the replay path); else :meth:`replay_copies`."""
        handoff = self.handoff
        if handoff is not None:
            result = handoff.replay(sig.tensors, copy, call)
            if result is not NOT_SERVED:
                return result
        return self.replay_copies(sig, copy, call)

    def replay_copies(self, sig: CallSignature, copy: bool, call: Call | None) -> Any:
        """A replay by copies around the framework's launch, for a call the feed nodes did not serve.  Raises
        ``InputMoved``."""
        inputs = self.inputs
        before = inputs.copies
        st = self.stats
        handoff = self.handoff
        if handoff is not None and handoff.broken:
            self.handoff = None
        inputs.load(sig.tensors)
        graph = self.graph
        if self.piecewise:
            graph.dynamic = sig.dynamic  # type: ignore[attr-defined]
        graph.replay()
        if inputs.mutated_idx:
            inputs.store_back(sig.tensors)
        st.replays += 1
        st.input_copies += inputs.copies - before
        st.copy_backs = inputs.copy_backs
        return self.outputs.result(sig.pads, copy, sig.tensors, call)

    def release(self) -> None:
        if self.lane:  # the plan holds the buffers and the handoff: they go now, not at the next collection
            self.lane.retire()
        self.lane = None
        self.handoff = None  # its feed launches the executable graph reset() frees
        with contextlib.suppress(Exception):
            self.graph.reset()
