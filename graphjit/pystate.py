"""The Python side of the state a call can reach, copied and put back around the runs graphjit adds.

A capture runs the function's Python code once more than the call would: the kernels it launches are
recorded, not run, but its Python effects are real.  An optimizer's per-step bookkeeping, a GradScaler's
per-optimizer stage and ``found_inf`` tensors (made during the capture, from the graph's memory), a
lazily created attribute: after a capture that fails, they would describe a step that never ran, and the
call's eager run would start from them (a GradScaler then reads a ``found_inf`` nobody computed).

:class:`PyState` copies, shallowly, every container the call can reach (object ``__dict__`` and ``__slots__``, dicts,
lists, a ``threading.local``'s attributes of the calling thread, a ``ContextVar``'s value) and every tensor-held
binding (a leaf's ``.grad``) before the capture, with the states of the host's global random generators
(:class:`graphjit.host_random.Saved`), and :meth:`PyState.restore` puts back each one whose contents changed:
afterwards the objects hold what they held before, the generators draw what they would have, and whatever the run
created is no longer referenced.
Tensor *contents* are not its job (:class:`graphjit.writes.Snapshot` copies those).

Runs at capture only (a walk and a shallow copy of each container), never on the replay path.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from . import context_values, host_random
from .backends.base import Backend
from .reach import FOREIGN_MODULES, Visits, instance_dict, skipped, slots_of, unwrap_own

log = logging.getLogger("graphjit")


class PyState:
    """Shallow copies of the containers reachable from ``roots`` (see the module docstring).

    Guarantees: after :meth:`restore`, each copied container holds the same keys and the same objects (by
    identity) as when the copy was taken, and each tensor's bindings (``.grad``) are the same objects.
    Containers the walk did not reach (past its size limit, or only C code holds them) are not touched.
    """

    def __init__(self, backend: Backend, roots: Iterable[tuple[str, Any]], device: str | None = None) -> None:
        """``device``: the call's, where its framework's host generators count (``Backend.host_generators``)."""
        self.backend = backend
        self.dicts: list[tuple[dict[Any, Any], dict[Any, Any]]] = []
        self.lists: list[tuple[list[Any], list[Any]]] = []
        self.slots: list[tuple[Any, str, Any]] = []
        self.bindings: list[tuple[Any, str, Any]] = []
        self.contexts: list[tuple[Any, Any]] = []  # (ContextVar, its value or ABSENT)
        # Python's and numpy's global generators, the framework's host ones for a call on a device (an island's draws)
        self.host = host_random.Saved(backend.host_generators(device) if device is not None else ())
        types_ = backend.tensor_types()
        tensors: set[int] = set()
        visits = Visits()
        stack: list[tuple[Any, int]] = [(value, 0) for _name, value in roots]
        while stack:
            obj, depth = stack.pop()
            obj = unwrap_own(obj)  # a graphed Module: what it wraps, not graphjit's state
            if isinstance(obj, types_):
                if id(obj) not in tensors:
                    tensors.add(id(obj))
                    for name, child in backend.tensor_state(obj):
                        self.bindings.append((obj, name, child))
                continue
            tp = type(obj)
            per_context = context_values.per_context(obj)  # (a threading.local's type is _thread's)
            if not per_context and (skipped(obj) or tp.__module__.partition(".")[0] in FOREIGN_MODULES):
                continue
            if not visits.first(obj, depth):
                if visits.full:
                    break
                continue
            if isinstance(obj, contextvars.ContextVar):  # its value (set back where it had one)
                value = context_values.current(obj)
                self.contexts.append((obj, value))
                if value is not context_values.ABSENT:
                    stack.append((value, depth + 1))
                continue
            children: Iterable[Any]
            if isinstance(obj, dict):
                saved = _copy(obj)
                self.dicts.append((obj, saved))
                children = list(saved.values())
            elif isinstance(obj, list):
                self.lists.append((obj, list(obj)))
                children = list(obj)
            elif isinstance(obj, (tuple, frozenset, set)):
                children = list(obj) if isinstance(obj, tuple) else ()
            else:
                children = []
                d = context_values.attributes(obj) if per_context else instance_dict(obj)  # (a threading.local's)
                if d is not None:
                    stack.append((d, depth + 1))
                for name in slots_of(type(obj)):
                    try:
                        value = object.__getattribute__(obj, name)
                    except (AttributeError, TypeError):
                        value = _UNSET
                    self.slots.append((obj, name, value))
                    if value is not _UNSET:
                        children.append(value)
            for child in children:
                stack.append((child, depth + 1))

    def restore(self) -> int:
        """Put back every container and binding that changed, and the host's global random generators; returns how
        many containers and bindings had changed (put back or not: the generators are not counted, no walk of the
        objects depends on them).  A container that refuses (a dict subclass that forbids updates) is left as it is,
        and the others are still put back."""
        self.host.put_back()
        n = 0
        for d, saved in self.dicts:
            if not _same_dict(d, saved):
                n += 1
                with contextlib.suppress(Exception):
                    _put_back(d, saved)
        for lst, items in self.lists:
            if len(lst) != len(items) or any(a is not b for a, b in zip(lst, items)):
                n += 1
                with contextlib.suppress(Exception):
                    list.__setitem__(lst, slice(None), items)
        for obj, name, value in self.slots:
            try:
                now = object.__getattribute__(obj, name)
            except (AttributeError, TypeError):
                now = _UNSET
            if now is value:
                continue
            n += 1
            base = threading.local if isinstance(obj, threading.local) else object  # (its C __setattr__: no bypass)
            with contextlib.suppress(AttributeError, TypeError):
                if value is _UNSET:
                    base.__delattr__(obj, name)
                else:
                    base.__setattr__(obj, name, value)
        for var, value in self.contexts:  # set again (a variable the run set where it had no value keeps it)
            if context_values.current(var) is not value:
                n += 1
                if value is not context_values.ABSENT:
                    var.set(value)
        for t, name, value in self.bindings:
            if dict(self.backend.tensor_state(t)).get(name) is not value:
                n += 1
                with contextlib.suppress(Exception):
                    self.backend.set_tensor_state(t, name, value)
        return n


_UNSET = object()


def dynamic_roots(dynamic: dict[str, Any]) -> list[tuple[str, Any]]:
    """A call's ``dynamic=`` arguments as roots: left out of what a call reaches for its writes (per-call data), but
    an island may change them, and undoing a second run of it must reach them too."""
    return [(f"dynamic argument {name!r}", value) for name, value in dynamic.items()]


def copy_or_none(backend: Backend, roots: Callable[[], Iterable[tuple[str, Any]]],
                 device: str | None = None) -> PyState | None:
    """:class:`PyState` of what ``roots()`` gives, or None where listing the roots or the copy failed (logged at debug
    level): for a copy whose only job is to undo a run graphjit adds (a replay's islands, run a second time to verify
    them), which must never fail the call."""
    try:
        return PyState(backend, roots(), device)
    except Exception as exc:
        log.debug("graphjit: the Python state could not be copied (%s: %s)", type(exc).__name__, exc)
        return None


@contextlib.contextmanager
def second_run(before: PyState | None, after: Callable[[], PyState | None]) -> Iterator[None]:
    """Around a second run graphjit adds after the call's own (a replay running a piecewise graph's islands again, to
    verify it): the block starts from the Python state ``before`` holds (the one the call's run started from, as the
    replay's tensors do), and the state the call's run left, copied by ``after()`` on entry, is put back on exit, so the
    call's Python effects are its own run's alone.  Nothing is done where ``before`` is None or the copy fails."""
    now = after() if before is not None else None
    if before is None or now is None:
        yield
        return
    before.restore()
    try:
        yield
    finally:
        now.restore()


def _copy(d: dict[Any, Any]) -> dict[Any, Any]:
    """``d``'s items in its own order (an OrderedDict's: the order it iterates in), read by the base classes' methods:
    a subclass's ``keys``/``__getitem__`` are not called (transformers' outputs override them).  An OrderedDict
    whose order no longer matches its items (something wrote it through ``dict``'s methods: a key its order names and
    it lacks, or one it holds and its order does not name) gives its items as dict stores them."""
    if isinstance(d, OrderedDict):
        try:
            items = dict(OrderedDict.items(d))
            if len(items) == dict.__len__(d):  # a key put in by dict's methods is missing from its order
                return items
        except (KeyError, RuntimeError):
            pass
    return dict(dict.items(d))


def _put_back(d: dict[Any, Any], saved: dict[Any, Any]) -> None:
    """Make ``d`` hold ``saved``'s items, in its order, by the base classes' methods (a subclass may forbid its own
    ``update``: transformers' outputs do).  An OrderedDict is written by OrderedDict's methods: ``dict.clear`` and
    ``dict.update`` would leave its order naming keys it no longer has (every later iteration raises KeyError)."""
    if isinstance(d, OrderedDict):
        OrderedDict.clear(d)
        for k, v in saved.items():
            OrderedDict.__setitem__(d, k, v)
    else:
        dict.clear(d)
        dict.update(d, saved)


def _same_dict(d: dict[Any, Any], saved: dict[Any, Any]) -> bool:
    """Whether ``d`` holds ``saved``'s items (the same objects), in ``saved``'s order where ``d`` is an OrderedDict."""
    if dict.__len__(d) != len(saved):
        return False
    for k, v in saved.items():
        if dict.get(d, k, _UNSET) is not v:
            return False
    if isinstance(d, OrderedDict):
        try:
            order = list(OrderedDict.keys(d))
        except (KeyError, RuntimeError):
            return False  # its order names a key it lacks: the copy (and what a put-back writes) has none such
        # an order that lacks keys dict's own methods put in is not compared (the copy was taken as dict stores them)
        return len(order) != len(saved) or order == list(saved)
    return True
