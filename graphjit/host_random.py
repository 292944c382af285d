"""Whether a call drew numbers from the host's global random generators: Python's ``random`` module and, where
numpy is imported, numpy's legacy global generator (``np.random.rand``).  A replay runs no Python, so it would hand
back the capture's numbers every time (verify compares once and may pass by chance): such a key runs uncaptured.

Framework-free, read around warmup calls and the runs graphjit adds only, never on a replay: Python's state is read
(10-20 us) and set back unread, numpy's read whole where its generator's struct changed since the last whole read
(50-100 us) and else by that struct's bytes (:class:`_Numpy`).  A framework's own host generator where the function runs
on a device (torch's CPU generator, ``torch.rand(3)`` in a CUDA function) counts too: the backend names it
(:class:`Generator`, ``Backend.host_generators``).  A generator of the user's own (``random.Random()``,
``np.random.default_rng()``, a ``torch.Generator``) is not seen here: verify is what checks it.

The runs graphjit adds to a call (a capture, verify's eager reference and its replay of the islands, a scope's extra
warmup runs) put the global generators back with the rest of the Python state (:class:`Saved`, kept by
:class:`graphjit.pystate.PyState`): numbers an island draws are drawn once per call, as eagerly, and a capture that
fails leaves them where the call found them.  A capture runs no island, so a capture that moved them drew outside
the islands (:func:`graphjit.capture.capture_graph`'s caller says so, under :data:`REASON`).  The generators are
process-wide: another thread's draws made while such a run goes on are put back with it (that thread then draws the
same numbers again), and during a watched call or a capture they count as the call's (the key runs uncaptured;
``reset()`` tries it again).
"""

from __future__ import annotations

import ctypes
import random
import sys
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

REASON = "draws host random numbers"
"""The reason a key whose warmup call drew runs uncaptured (``@graphed``) or eagerly (``graphed_layer``)."""
HINT = ("a replay runs no Python and would hand back the capture's numbers every time. Draw them on the device "
        "(torch.rand, paddle.rand), pass them in, or mark the function that draws with @graphjit.eager")
"""What ``@graphed``'s message under :data:`REASON` says after which generator moved."""


class Generator(NamedTuple):
    """A framework's host generator a backend names for a device (``Backend.host_generators``): how to read, set and
    compare its state."""

    name: str
    get: Callable[[], Any]
    set: Callable[[Any], Any]
    same: Callable[[Any, Any], bool]


class Saved:
    """The states of the global generators (numpy's where numpy is imported) and of ``extra``, taken now:
    :meth:`moved` says which one has moved since, :meth:`put_back` sets them back."""

    __slots__ = ("extra", "numpy", "python", "states")

    def __init__(self, extra: Sequence[Generator] = ()) -> None:
        self.python = random.getstate()
        self.numpy = _Numpy.now()
        self.extra = tuple(extra)
        self.states = [g.get() for g in self.extra]

    def moved(self) -> str | None:
        """Which generator moved since this copy, or None (numpy's only where it was imported then).  The states
        cannot tell the call's draws from another thread's made meanwhile: such a draw runs the key uncaptured too,
        under the same reason (``reset()`` tries it again)."""
        if random.getstate() != self.python:
            return "Python's random module"
        if self.numpy is not None and self.numpy.moved():
            return "numpy's global random generator"
        for g, was in zip(self.extra, self.states):
            if not g.same(was, g.get()):
                return g.name
        return None

    def put_back(self) -> None:
        """Set each generator back to its state in this copy (Python's unread: setting it costs less than reading it;
        the others where they moved; one that refuses its own state is left as it is)."""
        random.setstate(self.python)
        if self.numpy is not None:
            self.numpy.put_back()
        for g, was in zip(self.extra, self.states):
            try:
                if not g.same(g.get(), was):
                    g.set(was)
            except Exception:
                pass


class _Numpy:
    """numpy's legacy global generator's state (``np.random.get_state()``: the MT19937 key words and position, and the
    Gaussian ``standard_normal`` cached), with the generator's MT19937 struct as bytes where its ``ctypes`` interface
    gives its address and those bytes are the state's key and position (checked here).

    ``np.random.get_state()`` takes 50-100 us (it copies the key through Python objects); the struct's bytes take one
    microsecond.  So where no Gaussian was cached, :meth:`moved` and :meth:`put_back` compare the bytes alone, and a
    new copy whose bytes are those of the last one read whole is that one (:data:`_last`): every draw of the legacy
    generator then advances the key's position (a Gaussian without a cached one draws two doubles), and a seed or
    ``set_state`` rewrites the struct.  What the bytes miss: a ``set_state`` back to the very key and
    position the generator is at, with a cached Gaussian (a state saved from this one where it cached one, put back
    after that Gaussian was drawn).  Where one was cached, the whole state is compared, as without the bytes."""

    __slots__ = ("address", "bits", "raw", "state")

    def __init__(self, state: Any, bits: Any, address: int | None, raw: bytes | None) -> None:
        self.state, self.address, self.raw = state, address, raw
        self.bits = bits  # the bit generator whose struct is at address (held: the address stays its)

    @classmethod
    def now(cls) -> _Numpy | None:
        """The state now, or None where numpy is not imported or has no legacy global generator.  Where the global
        generator was given another bit generator (``np.random.set_bit_generator(PCG64())``) its state is numpy's
        dict form, compared whole."""
        global _last
        np = sys.modules.get("numpy")
        if np is None:
            return None
        last = _last
        try:
            if last is not None and last._bytes_moved(np) is False:
                return last  # the bytes the last full read had: that state (a copy never changes)
        except Exception:
            pass
        state = _numpy_state(np)
        if state is None:
            return None
        bits = address = raw = None
        if isinstance(state, tuple) and not state[3]:  # MT19937 without a cached Gaussian: its struct's bytes
            try:
                bits = np.random.mtrand._rand._bit_generator
                address = bits.ctypes.state_address
                raw = ctypes.string_at(address, _MT_BYTES)
                if raw[:_MT_KEY] != state[1].tobytes() or int.from_bytes(raw[_MT_KEY:], sys.byteorder,
                                                                           signed=True) != state[2]:
                    bits = address = raw = None  # not numpy's mt19937_state {uint32 key[624]; int pos;}
            except Exception:
                bits = address = raw = None
        made = cls(state, bits, address, raw)
        if address is not None:
            _last = made
        return made

    def _bytes_moved(self, np: Any) -> bool | None:
        """Whether the struct's bytes changed, or None where they cannot say (no bytes kept, or the global generator
        holds another bit generator now)."""
        if self.address is None or np.random.mtrand._rand._bit_generator is not self.bits:
            return None
        return ctypes.string_at(self.address, _MT_BYTES) != self.raw

    def moved(self) -> bool:
        np = sys.modules.get("numpy")
        if np is None:
            return True
        try:
            by_bytes = self._bytes_moved(np)
        except Exception:
            by_bytes = None
        if by_bytes is not None:
            return by_bytes
        now = _numpy_state(np)
        return now is None or not _same_numpy(now, self.state)

    def put_back(self) -> None:
        try:
            if self.moved():
                sys.modules["numpy"].random.set_state(self.state)
        except Exception:  # a numpy that refuses its own state: left as it is
            pass


_last: _Numpy | None = None
"""The last :class:`_Numpy` read whole with its struct's bytes: a later copy whose bytes are still these is it."""
_MT_KEY = 624 * 4
_MT_BYTES = _MT_KEY + 4  # numpy's mt19937_state: uint32_t key[624]; int pos


def _numpy_state(np: Any) -> Any:
    """``np.random.get_state()``: the legacy tuple for MT19937 (the global generator's own), numpy's dict form for
    another bit generator (asked for so, without the warning the legacy form gives there); None where numpy has no
    legacy global generator."""
    try:
        legacy = type(np.random.mtrand._rand._bit_generator).__name__ == "MT19937"
    except Exception:  # a numpy before bit generators: the legacy tuple alone
        legacy = True
    try:
        return np.random.get_state() if legacy else np.random.get_state(legacy=False)
    except Exception:
        return None


def _same_numpy(a: Any, b: Any) -> bool:
    """Two numpy generator states (``np.random.get_state()``'s tuple or dict form) are the same: every value, arrays
    by their bytes."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same_numpy(a[k], b[k]) for k in a)
    if isinstance(a, (tuple, list)):
        return isinstance(b, type(a)) and len(a) == len(b) and all(_same_numpy(x, y) for x, y in zip(a, b))
    if hasattr(a, "tobytes") and hasattr(a, "dtype"):
        return hasattr(b, "tobytes") and getattr(b, "dtype", None) == a.dtype and getattr(b, "shape", None) == \
            a.shape and a.tobytes() == b.tobytes()
    return type(a) is type(b) and bool(a == b)
