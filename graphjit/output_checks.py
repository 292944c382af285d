"""What a replayed call handed out, looked at again: ``GRAPHJIT_CHECK_OUTPUTS`` poisons an ``outputs="alias"``
call's outputs before the next call (a stale read shows), ``GRAPHJIT_DEBUG`` logs each replay's fingerprints.  A
mixin of ``api._State``."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from .tree import collect_tensors

if TYPE_CHECKING:
    from .backends.base import Backend
    from .buffers import KeyEntry
    from .keys import CallSignature

log = logging.getLogger("graphjit")


class OutputChecks:
    """The outputs of the last aliased call, kept to be poisoned before the next (``handed_out``)."""

    name: str
    handed_out: list[Any]
    poison_backend: Backend | None

    def hand_out(self, entry: KeyEntry, sig: CallSignature, result: Any) -> None:
        b = entry.inputs.backend
        self.poison_backend = b
        types = b.tensor_types()
        # the caller's own tensors (a cache the function returns) and the function's state (a module buffer it
        # returns): never poisoned
        own = {id(t) for t in sig.tensors}
        out = entry.outputs
        own.update(id(t) for t, kept in zip(out.tensors, out.kept) if kept)
        self.handed_out = [t for t in collect_tensors(result, lambda x: isinstance(x, types)) if id(t) not in own]

    def poison_previous(self) -> None:
        b = self.poison_backend
        handed, self.handed_out = self.handed_out, []
        if b is not None:
            for t in handed:
                b.poison_(t)

    def debug_replay(self, entry: KeyEntry, sig: CallSignature, result: Any) -> None:
        b = entry.inputs.backend
        types = b.tensor_types()
        log.debug("graphjit %s [%s]: replay %d inputs=%s outputs=%s", self.name, entry.stats.label,
                  entry.stats.replays, ",".join(b.fingerprint(t) for t in sig.tensors),
                  ",".join(b.fingerprint(t) for t in collect_tensors(result, lambda x: isinstance(x, types))))
