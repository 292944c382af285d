"""A piecewise graph: captured segments with islands between them, replayed in order.

:class:`PiecewiseGraph` is what a key whose function calls islands (:mod:`graphjit.islands`) replays:
segment 0, island 0, segment 1, ... .  All segments were captured on one stream into one memory pool, in
this order, so each may read what an earlier one left there; they are never replayed out of order or
concurrently (the graphed function's lock is held across a replay).  An island step
(:class:`IslandStep`) calls the island's function eagerly with the arguments the capture recorded (the
segment's tensors, at their fixed addresses) and the current call's dynamic values, then copies its
outputs into the buffers the next segment reads.

Host time per replay and time spent in islands are counted for ``stats()`` (``replay_us``, ``island_us``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import scope
from .backends.base import Backend, GraphHandle
from .dynamic import Index, resolve
from .errors import IslandError
from .tree import collect_tensors, structure

__all__ = ["IslandStep", "PiecewiseGraph", "template_of"]


class _Slot:
    """Where an island's argument is taken from the current call's dynamic values."""

    __slots__ = ("path",)

    def __init__(self, path: tuple[Any, ...]) -> None:
        self.path = path


class Template:
    """An island's recorded arguments, with :class:`_Slot` where a dynamic value goes."""

    __slots__ = ("args", "kwargs", "slots")

    def __init__(self, args: tuple[Any, ...], kwargs: dict[str, Any], slots: int) -> None:
        self.args = args
        self.kwargs = kwargs
        self.slots = slots

    def fill(self, values: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        if not self.slots:
            return self.args, self.kwargs
        return (tuple(_fill(a, values) for a in self.args), {k: _fill(v, values) for k, v in self.kwargs.items()})


def template_of(args: tuple[Any, ...], kwargs: dict[str, Any], index: Index | None) -> Template:
    """The island's arguments as recorded at capture; objects found in ``index`` (the capturing call's
    dynamic values) become slots filled from each later call's dynamic values."""
    if index is None or not index.paths:
        return Template(args, kwargs, 0)
    counter = [0]
    new_args = tuple(_slotted(a, index, counter) for a in args)
    new_kwargs = {k: _slotted(v, index, counter) for k, v in kwargs.items()}
    return Template(new_args, new_kwargs, counter[0])


def _slotted(x: Any, index: Index, counter: list[int]) -> Any:
    path = index.path_of(x)
    if path is not None:
        counter[0] += 1
        return _Slot(path)
    if isinstance(x, list):
        return [_slotted(e, index, counter) for e in x]
    if isinstance(x, tuple):
        items = [_slotted(e, index, counter) for e in x]
        return type(x)(*items) if hasattr(x, "_fields") else type(x)(items)
    if isinstance(x, dict):
        return type(x)((k, _slotted(v, index, counter)) for k, v in x.items())
    return x


def _fill(x: Any, values: dict[str, Any]) -> Any:
    if isinstance(x, _Slot):
        return resolve(values, x.path)
    if isinstance(x, list):
        return [_fill(e, values) for e in x]
    if isinstance(x, tuple):
        items = [_fill(e, values) for e in x]
        return type(x)(*items) if hasattr(x, "_fields") else type(x)(items)
    if isinstance(x, dict):
        return type(x)((k, _fill(v, values)) for k, v in x.items())
    return x


@dataclass(eq=False)
class IslandStep:
    """One island of a piecewise graph: the function, its recorded arguments and its output buffers."""

    backend: Backend
    fn: Callable[..., Any]
    name: str
    site: str  # where the graphed function called it
    template: Template
    buffers: list[Any]  # what the next segment reads
    structure: Any  # of its outputs at capture (tree.structure)
    shapes: list[Any] = field(init=False)
    is_tensor: Callable[[Any], bool] = field(init=False)
    types: tuple[type, ...] = field(init=False)
    single: bool = field(init=False)

    def __post_init__(self) -> None:
        self.shapes = [self.backend.meta_key(t)[:2] for t in self.buffers]
        types = self.backend.tensor_types()
        self.is_tensor = lambda x: isinstance(x, types)
        self.types = types
        # decided once: an island that returned one tensor at capture is checked without walking its output
        self.single = len(self.buffers) == 1 and self.structure == structure(self.buffers[0], self.is_tensor)

    def run(self, values: dict[str, Any]) -> None:
        """Call the island eagerly and leave its outputs in the buffers; raises :class:`IslandError`."""
        template = self.template
        args, kwargs = template.fill(values) if template.slots else (template.args, template.kwargs)
        out = self.fn(*args, **kwargs) if kwargs else self.fn(*args)
        b = self.backend
        if self.single and isinstance(out, self.types):
            if out is self.buffers[0]:
                return  # the island wrote its input in place: nothing to copy
            got = [out]
        else:
            got = collect_tensors(out, self.is_tensor)
            if len(got) != len(self.buffers) or structure(out, self.is_tensor) != self.structure:
                raise IslandError(f"island {self.name} (called at {self.site}) returned outputs of another "
                                  "structure or other non-tensor values than when the key was captured; an "
                                  "island must return the same structure on every call of a key")
        for j, (buf, t) in enumerate(zip(self.buffers, got)):
            if t is buf:
                continue  # the island wrote its input in place: nothing to copy
            if b.meta_key(t)[:2] != self.shapes[j]:
                raise IslandError(
                    f"island {self.name} (called at {self.site}) returned output {j} with shape {list(b.shape(t))} "
                    f"where the key was captured with {list(self.shapes[j][0])} (dtype {self.shapes[j][1]}); make "
                    "the size part of the key (a plain argument or buckets=) or keep it fixed")
            b.copy_(buf, t)


class PiecewiseGraph(GraphHandle):
    """Segments and islands of one key, replayed in order (see the module docstring).  Set
    :attr:`dynamic` to the call's dynamic values before :meth:`replay`."""

    def __init__(self, steps: list[GraphHandle | IslandStep], stats: Any = None) -> None:
        self.steps = steps
        self.segments = [s for s in steps if isinstance(s, GraphHandle)]
        self.islands = [s for s in steps if isinstance(s, IslandStep)]
        self.pool_bytes = sum(g.pool_bytes for g in self.segments)
        # decided once: each step as (segment, None) or (None, the island's run), read in one loop by replay (a
        # segment's replay is looked up on every call: a handle may replace its own, as TorchGraph.reset does)
        self.order: list[tuple[Any, Callable[[dict[str, Any]], None] | None]] = [
            (None, s.run) if isinstance(s, IslandStep) else (s, None) for s in steps]
        self.dynamic: dict[str, Any] = {}
        self.stats = stats

    def replay(self) -> None:
        """Replay every step in order.  The thread is in the "island" phase for the whole loop (an island's code
        reads it; a segment's launch runs no Python that does), and each island's host time is counted apart."""
        clock = time.perf_counter
        t0 = clock()
        in_islands = 0.0
        values = self.dynamic
        previous = scope.enter_phase("island")
        try:
            for segment, island in self.order:
                if island is None:
                    segment.replay()
                else:
                    t = clock()
                    island(values)
                    in_islands += clock() - t
        finally:
            scope.leave_phase(previous)
        st = self.stats
        if st is not None:
            st.replay_us += (clock() - t0) * 1e6
            st.island_us += in_islands * 1e6

    def reset(self) -> None:
        for g in self.segments:
            with contextlib.suppress(Exception):
                g.reset()

    def dump(self, path: Path) -> None:
        for i, g in enumerate(self.segments):
            g.dump(path.with_name(f"{path.stem}-segment{i}{path.suffix}"))
