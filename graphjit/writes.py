"""Which tensors a call writes, and copies of them to put back.

:class:`WriteProbe` watches one eager call: before it, it records the version counter of every
reachable tensor (and, where counters are missing or incomplete, a copy of the contents); after it,
the tensors whose counter moved or whose contents changed are the ones the call wrote.

:class:`Snapshot` copies a set of tensors and the random generator's state, and puts both back:
verify runs the eager reference and the graph replay from the same state with it, so the extra
execution graphjit needs is invisible afterwards.

Both run during warmup and verify only.  Their memory is bounded by ``GRAPHJIT_VERIFY_MAX_BYTES``:
a probe that would copy more stops copying and reports itself :attr:`WriteProbe.incomplete`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any

from .backends.base import Backend
from .reach import Path, Reach, describe
from .tree import collect_tensors, structure


def tolerance(t: Any) -> float:
    """Relative error (norm-wise) a replay may differ from eager by: kernels are the same, so this
    only absorbs a different cuBLAS algorithm choice, never a frozen or stale value."""
    name = str(getattr(t, "dtype", "")).lower()
    if "16" in name or "8" in name:
        return 2e-2
    return 1e-4


def compare_outputs(b: Backend, got: Any, expected: Sequence[Any], expected_shape: Any,
                    is_tensor: Callable[[Any], bool]) -> str | None:
    """Why a replay's result ``got`` (padding sliced off) is not the eager reference's (``expected``: copies of
    its tensors, ``expected_shape``: its :func:`~graphjit.tree.structure`), or None."""
    tensors = collect_tensors(got, is_tensor)
    if structure(got, is_tensor) != expected_shape or len(tensors) != len(expected):
        return "the non-tensor part of the output differs between the eager call and the capture"
    for j, (t, want) in enumerate(zip(tensors, expected)):
        err = b.rel_error(t, want)
        if not err <= tolerance(want):
            return f"output {j} differs from eager by {err:.3g} (relative)"
    return None


class WriteProbe:
    """The writes of one call to the tensors of a :class:`~graphjit.reach.Reach`.

    Guarantees: a tensor whose version counter moved is reported; with ``versions_complete`` False
    (or for a tensor without a counter, one the backend says kernels write without moving it: a module
    buffer, or one of at most :data:`SMALL_BYTES`, where such a kernel's running statistics may sit in any
    attribute) a non-parameter tensor whose contents changed is reported too, as long as the copies fit
    ``budget`` bytes.  Refuses nothing; :attr:`incomplete` says what
    it could not watch.
    """

    SMALL_BYTES = 1 << 16
    """Tensors up to this size are compared by contents too: ``F.batch_norm`` updates running statistics held in plain
    attributes without moving their counters (before, verify's eager reference and its replay both updated them)."""

    def __init__(self, backend: Backend, reach: Reach, budget: int, unversioned: frozenset[int] = frozenset()) -> None:
        self.backend = backend
        self.reach = reach
        self.incomplete: str | None = "the walk of reachable objects stopped at its size limit" if reach.truncated \
            else None
        self.versions: list[tuple[Any, int]] = []
        self.compared: list[Any] = []
        used = 0
        b = backend
        for t, path in reach.tensors.values():
            v = b.version(t)
            if v is not None:
                self.versions.append((t, v))
                if (b.versions_complete and not b.version_blind(path) and id(t) not in unversioned
                        and b.nbytes(t) > self.SMALL_BYTES):
                    continue
            if b.is_parameter(t) and id(t) not in unversioned:
                continue
            n = b.nbytes(t)
            if used + n > budget:
                self.incomplete = (f"comparing {describe(path)} ({n} bytes) would pass GRAPHJIT_VERIFY_MAX_BYTES="
                                   f"{budget}")
                continue
            used += n
            self.compared.append(t)
        self.copy = b.contents(self.compared) if self.compared else None
        self.copied_bytes = used

    def written(self) -> list[tuple[Any, Path]]:
        """The tensors the call wrote (call after it), with the path of each."""
        b = self.backend
        hit: dict[int, Any] = {}
        for t, v in self.versions:
            if b.version(t) != v:
                hit[id(t)] = t
        if self.compared:
            known = {i for i, t in enumerate(self.compared) if id(t) in hit}
            for i in b.changed(self.compared, self.copy, known):
                t = self.compared[i]
                hit[id(t)] = t
        self.compared, self.copy = [], None
        return [(t, self.reach.tensors[i][1]) for i, t in hit.items()]


class Snapshot:
    """Copies of ``tensors`` and of the generator state of ``device``; :meth:`restore` puts them back."""

    def __init__(self, backend: Backend, tensors: Iterable[Any], device: str) -> None:
        self.backend = backend
        self.device = device
        self.saved = [(t, backend.clone(t)) for t in tensors]
        self.rng = backend.rng_state(device)

    @property
    def nbytes(self) -> int:
        return sum(self.backend.nbytes(c) for _t, c in self.saved)

    def restore(self, only: Collection[int] | None = None) -> None:
        """Put the copies back (``only``: those of the tensors whose ``id`` is in it: the ones a run wrote; a tensor
        that was only read is never written, which an expanded or inference tensor would refuse), and the generator."""
        b = self.backend
        for t, c in self.saved:
            if only is None or id(t) in only:
                b.copy_(t, c)
        if self.rng is not None:
            b.set_rng_state(self.device, self.rng)

    def differs(self, current: Sequence[Any], paths: Sequence[str]) -> str | None:
        """Why ``current`` (one tensor per saved one, in order) is not what was saved, or None."""
        b = self.backend
        for (_t, want), got, path in zip(self.saved, current, paths):
            err = b.rel_error(got, want)
            if not err <= tolerance(want):
                return f"the write to {path} differs from eager by {err:.3g} (relative)"
        return None

    def rng_differs(self) -> bool:
        """True if the generator is not where it was when this snapshot was taken."""
        return self.rng is not None and not self.backend.rng_equal(self.backend.rng_state(self.device), self.rng)
