"""torch's side of a graph's feed nodes (:mod:`graphjit.handoff`): the two batch copy nodes a capture adds to a
graph (the caller's inputs in at its start, the outputs out at its end), and the launch that sets their pointers and
replays the graph in one call into graphjit's csrc library (``gj_feed_launch``).

Guarantees: a graph with feed nodes replays exactly as one without while its nodes copy nothing; every replay by
torch (:meth:`TorchFeed.before_replay`, which :class:`~graphjit.backends.torch.graphs.TorchGraph` calls) first sets
them to copy nothing where a call through :meth:`TorchFeed.launch` set them, so a framework replay never copies from
an earlier call's tensors.  A graph whose replays advance torch's CUDA generator (random ops captured: torch adds the
draws' offsets before each launch) is launched by torch after its nodes are set; others are launched by the library
directly (``cudaGraphLaunch``, what torch's own replay ends with).  Which one a graph is, is read from the default
generator's offset around its first replay by torch (a changed offset: torch launches every time).

Refuses nothing: where the library is not loaded, the torch build cannot give the executable graph
(``raw_cuda_graph_exec``) or a node cannot be added, the capture has no feed and replays copy as before.
"""

from __future__ import annotations

import array
import ctypes
import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ... import batch_copy
from . import device as cuda_device
from .copies import _plain_bytes

log = logging.getLogger("graphjit")


def library(index: int) -> Any:
    """The csrc library loaded for GPU ``index`` (None where there is none yet: being built, switched off or
    failed).  Called before a capture begins, never inside one."""
    try:
        return batch_copy.library(cuda_device.arch(index), index)
    except Exception:  # no GPU this torch can ask: no feeds
        return None


def add_node(lib: Any, index: int) -> int:
    """Add a feed node to the capture in progress on GPU ``index``'s current stream; its handle, or 0 where it could
    not be added (the graph then gets no feed)."""
    try:
        return int(lib.feed_node(index, cuda_device.current_stream(index)))
    except Exception as exc:
        log.debug("graphjit: no feed node: %s", exc)
        return 0


def attach(handle: Any, graph: Any, lib: Any, in_node: int, out_node: int, index: int) -> None:
    """Give ``handle`` (the :class:`~.graphs.TorchGraph` of ``graph``, a captured ``CUDAGraph`` kept with
    ``keep_graph``) its feed; a torch without ``instantiate`` or ``raw_cuda_graph_exec`` gives none."""
    try:
        graph.instantiate()
        feed = TorchFeed(lib, graph, int(graph.raw_cuda_graph_exec()), in_node, out_node, index)
    except Exception as exc:
        log.debug("graphjit: no feed for this graph: %s", exc)
        return
    handle.feed = feed
    handle.replay = feed.replay_by_torch  # the feed's method, not the handle's: no reference cycle keeps the pool


def generator_offset(index: int) -> int | None:
    """The philox offset of torch's default CUDA generator of GPU ``index``; None where torch cannot say."""
    try:
        return int(torch.cuda.default_generators[index].get_offset())
    except Exception:
        return None



def standard_strides(t: Any) -> bool:
    """Whether ``t``'s strides are those a contiguous tensor of its shape gets when it is made (each dimension's the
    product of the later sizes, a size 0 counted as 1), which ``torch.empty_like`` then keeps."""
    stride, want = t.stride(), 1
    for d in range(t.dim() - 1, -1, -1):
        if stride[d] != want:
            return False
        want *= max(int(t.shape[d]), 1)
    return True


def _empty_contiguous(t: Any) -> Any:
    return torch.empty_like(t, memory_format=torch.contiguous_format)


def empty_for(outputs: Sequence[Any]) -> Callable[[Any], Any]:
    """What makes each fresh output of a key (``Feed.empty_for``): ``torch.empty_like`` itself (no keyword to parse:
    about 0.2 us less a call on a development CPU) where every output has :func:`standard_strides`; else with
    ``memory_format=torch.contiguous_format``, as ``Backend.clone`` lays it out (``empty_like`` alone keeps the odd
    strides a contiguous tensor may have in its size-1 dims)."""
    return torch.empty_like if all(map(standard_strides, outputs)) else _empty_contiguous

class TorchFeed:
    """The feed nodes of one captured graph and the table :func:`gj_feed_launch` reads (see ``csrc``)."""

    __slots__ = ("at", "entries", "fn", "graph", "header", "index", "lib", "negated", "random", "stream", "table")

    dirty_word = 7
    """The header's word (unused by the library) that says the nodes may hold a call's pointers: set before every
    launch that may set them (:meth:`launch`, the replay lane's), cleared only by a successful clear."""

    def __init__(self, lib: Any, graph: Any, exec_handle: int, in_node: int, out_node: int, index: int) -> None:
        words, entries, header = lib.feed_layout()
        self.table = array.array("Q", [0] * words)
        self.table[0], self.table[1], self.table[2], self.table[3] = exec_handle, in_node, out_node, index
        self.at = self.table.buffer_info()[0]
        self.entries = entries
        self.header = header
        self.lib = lib
        self.fn = lib.feed_launch
        self.graph = graph
        self.index = index
        self.stream = functools.partial(cuda_device.current_stream, index)
        self.random: bool | None = None  # the graph advances the generator (None: not known before a torch replay)
        # a caller's tensor whose bytes are not its values: torch's lazy negative bit (a real view such as
        # ``z.conj().imag``); the dtype, never complex here, is the key's.  The C method itself: no Python frame
        self.negated = torch.Tensor.is_neg

    # -- what a feed may copy ----------------------------------------------------------------
    def usable(self, t: Any) -> bool:
        """A fixed buffer (a static input or output) the nodes may copy: dense CUDA memory of this GPU."""
        return bool(type(t) is torch.Tensor and t.is_cuda and t.device.index == self.index and _plain_bytes(t))

    def empty_for(self, outputs: Sequence[Any]) -> Callable[[Any], Any]:
        return empty_for(outputs)

    # -- launches --------------------------------------------------------------------------------
    @property
    def dirty(self) -> bool:
        """The nodes may hold a call's pointers (:attr:`dirty_word`): a launch tried since the last clear."""
        return bool(self.table[self.dirty_word])

    def launch(self, n_in: int, n_out: int) -> int:
        """Set the nodes to the table's first ``n_in`` input and ``n_out`` output entries and replay the graph
        on the current stream; the library's status (0: launched)."""
        table = self.table
        table[4], table[5], table[self.dirty_word] = n_in, n_out, 1
        if self.random is False:
            table[6] = 1
            return int(self.fn(self.at, self.stream()))
        table[6] = 0
        rc = int(self.fn(self.at, self.stream()))
        if rc:
            return rc
        self._torch_replay()
        return 0

    def lane_launch(self) -> tuple[int, Callable[[int], int], int] | None:
        """For the replay lane (``graphjit/lane.py``): ``(address of gj_feed_launch, the current raw stream's
        function, its argument)``, which the lane calls as :meth:`launch` does for a graph the library launches;
        None for a graph torch launches (random draws, or not known yet) or without the raw stream's C function."""
        stream = cuda_device.raw_stream()
        if self.random is not False or stream is None:
            return None
        try:
            address = int(ctypes.cast(self.fn, ctypes.c_void_p).value or 0)
        except (TypeError, ctypes.ArgumentError):  # not a function of a loaded library
            return None
        return (address, stream, self.index) if address else None

    def why(self, status: int) -> str:
        return str(self.lib.last_error() or f"status {status}")

    def before_replay(self) -> None:
        """Before a replay by torch, where a call set the nodes: they copy nothing.  Where the library cannot set
        them, the executable graph is instantiated again from the captured one (whose nodes copy nothing); raises
        where that fails too."""
        table = self.table
        table[4] = table[5] = table[6] = 0
        rc = int(self.fn(self.at, self.stream()))
        if rc:
            why = self.why(rc)
            try:
                self.graph.instantiate()
                table[0] = int(self.graph.raw_cuda_graph_exec())
            except Exception as exc:
                from ...errors import GraphjitError

                raise GraphjitError(f"graphjit: could not clear a graph's feed nodes before its replay: {why}; "
                                    f"instantiating it again failed too: {exc}") from exc
            self._forget()
            log.info("graphjit: a graph's feed nodes could not be cleared (%s): instantiated again", why)
        table[self.dirty_word] = 0

    def retire(self) -> None:
        """The executable graph is being freed: the library refuses this table from now on."""
        table = self.table
        table[0] = table[self.dirty_word] = 0

    def _forget(self) -> None:
        """What the library remembers of the nodes' last settings no longer holds (a fresh executable)."""
        start = self.header + 6 * self.entries
        self.table[start] = 0
        self.table[start + 1 + 3 * self.entries] = 0

    def replay_by_torch(self) -> None:
        """A replay by torch (:meth:`before_replay` first); the first one tells whether the graph draws random
        numbers."""
        if self.dirty:
            self.before_replay()
        self._torch_replay()

    def _torch_replay(self) -> None:
        if self.random is None:
            before = generator_offset(self.index)
            self.graph.replay()
            after = generator_offset(self.index)
            self.random = before is None or after is None or before != after
            return
        self.graph.replay()
