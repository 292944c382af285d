"""The warmup calls of one key: each runs the function once, eagerly, as that call's result, and
watches what it does.

:func:`watched_call` runs one call and returns its result with an :class:`Observation`: the tensors
it wrote (version counters, or contents where counters are missing), the tensors it rebound (an
attribute or list entry that held a tensor now holds another), whether it drew random numbers, and
whether it synchronised the CPU with the GPU.  :class:`Warmup` gathers the observations of a key's
warmup calls and decides whether the key can be captured at all (:attr:`Warmup.blocked`) and whether
verify can check its state (:attr:`Warmup.untracked`).

Everything here runs during warmup, never on the replay path: two walks of the reachable objects and
one version read per reachable tensor per warmup call.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import guards, host_clock, host_random, iterators, py_writes
from .backends.base import Backend
from .buffers import collect_tensors
from .islands import IslandCall, collecting
from .names import NO_PROBES, NameRecorder, Probes
from .reach import (
    ATOMS,
    FOREIGN_MODULES,
    OPAQUE,
    Path,
    Reach,
    added_tensors,
    addresses,
    describe,
    moved,
    rebinds,
    user_globals,
    walk,
)
from .sites import with_function
from .writes import WriteProbe

if TYPE_CHECKING:
    from .advances import Advances
    from .keys import CallSignature

ISLAND_HINT = ("Move the sync out of the graphed function, keep the value a tensor, or mark the function around "
               "it with @graphjit.eager: an island runs eagerly on every call and the rest is still graphed")


@dataclass
class Observation:
    """What one watched call did."""

    written: list[tuple[Any, Path]]
    rebound: list[Path]
    added: list[Path]
    drew_random: bool
    syncs: list[str]
    incomplete: str | None
    islands: list[IslandCall] = field(default_factory=list)
    created: list[tuple[Any, Path]] = field(default_factory=list)
    """Tensors the call stored where none were before (an optimizer's lazily created state, a new ``.grad``)."""
    moved: list[Path] = field(default_factory=list)
    """Tensors the call left over other memory than before (same object, new storage)."""
    elsewhere: list[Path] = field(default_factory=list)
    """Tensors the call wrote that live on another device than the key's (an optimizer's state on the CPU)."""
    py_written: list[tuple[str, str, str]] = field(default_factory=list)
    """Python values the function reads (:mod:`graphjit.guards`) that the call changed: ``(path, old, new)``."""
    names: set[str] | None = None
    """The names the Python code of the call used (when watched for guards and the call ran as Python)."""
    by_object: dict[int, frozenset[str]] | None = None
    """And by the object the code took as an argument (:class:`~graphjit.names.NameRecorder`)."""
    probes: Probes = NO_PROBES
    """What that code may find absent (:func:`graphjit.names.code_probes`)."""
    probed_by_object: dict[int, frozenset[str]] | None = None
    """The names looked up with ``getattr``/``hasattr`` by code that took the object as an argument."""
    read_globals: dict[tuple[int, str], tuple[dict[str, Any], str]] | None = None
    """The module globals that code loaded (``(globals, name)`` by ``(id(globals), name)``)."""
    read_cells: dict[int, tuple[str, Any]] | None = None
    """The closure values of the user's code that ran (``(name, value)`` by ``id(value)``)."""
    host_random: str | None = None
    """The host's global random generator the call drew from outside islands (:mod:`graphjit.host_random`)."""
    emitted: list[str] = field(default_factory=list)
    """What the call printed or logged outside islands, and where (a replay runs no Python, so it would not)."""
    clocked: list[str] = field(default_factory=list)
    """The host clocks the user's code read outside islands, and where (:mod:`graphjit.host_clock`)."""
    advanced: list[str] = field(default_factory=list)
    """The iterators the call advanced outside islands (:mod:`graphjit.iterators`), by path."""
    after: Reach | None = None
    """The walk of the call's roots after it (what the next run may start from where nothing ran between)."""


@dataclass
class Blocked:
    """Why a key runs uncaptured: ``reason`` (counted in stats) and ``message`` (for the user)."""

    reason: str
    message: str


def extra_run_raised(exc: Exception) -> Blocked:
    """Why a key whose extra warmup run inside ``capture_scope`` raised (the call's own run did not) runs uncaptured:
    that run is undone, and the call returns its own run's result."""
    return Blocked("a warmup run raised", f"an extra warmup run inside capture_scope raised {type(exc).__name__}: "
                   f"{exc} (the call's own run did not)")


_NO_STATE = ATOMS | {set, frozenset}  # what a capture's walk and copy would find nothing in (sets: never put back)
_ROOT_ITEMS = 4096  # a larger list or dict (a table, a log grown over a long run) costs a capture more than it tells


def _no_root(value: Any) -> bool:
    """``value`` is not worth a capture's walk and copy (:meth:`Warmup.read_roots`): a plain value, code, a class, a
    module, a logger or a thread (:data:`~graphjit.reach.FOREIGN_MODULES`), a container of over ``_ROOT_ITEMS``."""
    tp = type(value)
    return tp in _NO_STATE or isinstance(value, OPAQUE) or tp.__module__.partition(".")[0] in FOREIGN_MODULES or \
        (isinstance(value, (list, dict)) and len(value) > _ROOT_ITEMS)


@dataclass
class Warmup:
    """The warmup calls of one key so far."""

    calls: int = 0
    written: dict[int, tuple[Any, Path]] = field(default_factory=dict)
    """State the calls wrote besides their tensor inputs (closure, globals, bound object, modules), and the
    state they created: a later call writes that too, and what undoes a call must put it back."""
    mutated_leaves: set[int] = field(default_factory=set)
    """Indices (in the key's tensor leaves) of the inputs the calls wrote in place."""
    drew_random: bool = False
    untracked: str | None = None
    python_writes: bool = False
    """A call rebound or stored a tensor, or changed a Python value the function reads (what renewing refuses:
    :func:`graphjit.renewals.quiet`)."""
    blocked: Blocked | None = None
    sync_watched: bool = False  # a warmup run was watched for CPU-GPU syncs
    elsewhere_first: list[Path] = field(default_factory=list)
    """Tensors off the graph's device the key's first call wrote, while no later watched call has been seen (torch's
    Adam is made capturable after its first call, which moves them): a capture refuses a key that still has some."""
    islands: list[IslandCall] | None = None
    """The islands the last warmup call ran, in order (None before the first call)."""
    names: set[str] | None = None
    """Names the Python code of the watched warmup calls used: which values the guards check (None where not
    known: the tracer runs a program, or a profiler kept the recorder out)."""
    by_object: dict[int, frozenset[str]] | None = None
    """``id(object) -> names`` of the code those calls ran with the object as an argument (``self`` included)."""
    probes: Probes = NO_PROBES
    """What the code of those calls may find absent: guarded to stay absent (:func:`graphjit.guards.scan`)."""
    probed_by_object: dict[int, frozenset[str]] | None = None
    """``id(object) -> names`` those calls' code looked up on the object by ``getattr``/``hasattr`` while it was an
    argument of that code."""
    read_globals: dict[tuple[int, str], tuple[dict[str, Any], str]] | None = None
    """The module globals the code of those calls loaded, wherever it lives (a submodule's ``forward`` reading a flag
    of its own file): their plain values are guarded (:func:`graphjit.guards.scan`)."""
    read_cells: dict[int, tuple[str, Any]] | None = None
    """The closure values the user's code of those calls held (a hook's list): walked and copied at capture
    (:meth:`read_roots`)."""
    advances: Advances | None = None
    """The scalars of its own key each watched call left at the same values (:mod:`graphjit.advances`): what a
    replay of the key sets."""
    shared: list[tuple[Any, ...]] = field(default_factory=list)
    """Keys whose warmup runs this record holds besides its own: earlier values of a counter of one class
    (:meth:`graphjit.families.Families.take_over`); a capture or warmup that fails the key fails them too."""
    reference: Any = None
    """A capture scope's last undone warmup run, recorded for verify as its eager reference
    (:class:`graphjit.capture.Reference`); taken, or dropped, by the key's build."""

    def note(self, obs: Observation, backend: Backend, outputs: Any, leaves: list[Any]) -> None:
        """Fold one call's observation in (``leaves``: that call's tensor inputs, in key order); set
        :attr:`blocked` if the key cannot be graphed."""
        first = self.calls == 0
        self.calls += 1
        self.elsewhere_first = list(obs.elsewhere) if first else []
        leaf_of = {id(t): i for i, t in enumerate(leaves)}
        for t, path in obs.written:
            i = leaf_of.get(id(t))
            if i is not None:
                self.mutated_leaves.add(i)
            else:
                self.written.setdefault(id(t), (t, path))
        for t, path in obs.created:
            self.written.setdefault(id(t), (t, path))
        self.drew_random = self.drew_random or obs.drew_random
        self.python_writes = self.python_writes or bool(obs.rebound or obs.added or obs.py_written)
        if obs.names is not None:
            self.names = obs.names if self.names is None else self.names | obs.names
            self.by_object = _by_object(self.by_object, obs.by_object)
            self.probes = self.probes | obs.probes
            self.probed_by_object = _by_object(self.probed_by_object, obs.probed_by_object)
            self.read_globals = {**(self.read_globals or {}), **(obs.read_globals or {})}
            self.read_cells = {**(self.read_cells or {}), **(obs.read_cells or {})}
        previous, self.islands = self.islands, obs.islands
        if previous is not None and [c.island for c in previous] != [c.island for c in obs.islands] \
                and self.blocked is None:
            self.blocked = Blocked("islands differ between calls",
                                   f"one call ran the islands {_names(previous)} and another {_names(obs.islands)}; "
                                   "a key's calls must run the same islands in the same order (make what decides "
                                   "it part of the key: a plain argument)")
        if obs.incomplete and self.untracked is None:
            self.untracked = obs.incomplete
        if self.blocked is not None:
            return
        self.blocked = _blocked(obs, backend, outputs, first)
        if self.blocked is None and obs.py_written and not first:
            where, old, new = obs.py_written[0]
            self.blocked = Blocked(guards.WRITES, f"the function changes {where} ({old} -> {new}) on every call; a "
                                   "CUDA graph replays its kernels, not its Python code, so a replay would leave it as "
                                   "it is: keep that state in a tensor updated in place, or move the update out of the "
                                   "graphed function")

    def written_tensors(self) -> list[tuple[Any, Path]]:
        return list(self.written.values())

    def state(self, sig: CallSignature, backend: Backend) -> tuple[list[Any], list[str]]:
        """The tensors one call of the key writes, named: the state the warmups saw written, the call's
        inputs they wrote in place, and the call's own dynamic tensors (an island may write them).  What verify
        and the undone extra warmups copy."""
        tensors = [t for t, _p in self.written.values()]
        names = [describe(p) for _t, p in self.written.values()]
        for i in sorted(self.mutated_leaves):
            tensors.append(sig.tensors[i])
            names.append(sig.paths[i])
        types = backend.tensor_types()
        for name, value in sig.dynamic.items():
            for t in collect_tensors(value, lambda x: isinstance(x, types)):
                tensors.append(t)
                names.append(f"dynamic argument {name!r}")
        return tensors, names

    def read_roots(self, known: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
        """The values of the user's own module globals (:func:`~graphjit.reach.user_globals`) that the code of the
        watched calls loaded and the closure values of that code, other than ``known`` (the function's roots):
        state kept by code the call runs without naming it, such as a module's forward hook that appends to a list.
        A capture walks and copies them with its roots, so that a capture whose Python code changes them fails with
        its reason and is undone (the call then runs once, not twice).  Containers and objects only: a plain value
        there is guarded instead.  The closure values are handed over, not kept (an activation a comprehension closed
        over would otherwise live as long as the key's graph)."""
        ids = {id(v) for _n, v in known}
        out: list[tuple[str, Any]] = []
        for g, name in (self.read_globals or {}).values():
            value = g.get(name)
            if _no_root(value) or id(value) in ids or not user_globals(g):
                continue
            ids.add(id(value))
            out.append((f"global {name!r}", value))
        cells, self.read_cells = self.read_cells or {}, None  # taken once: a key's warmups' values are not kept alive
        for name, value in cells.values():
            if not _no_root(value) and id(value) not in ids:
                ids.add(id(value))
                out.append((f"closure variable {name!r}", value))
        return out

    def undoable(self, sig: CallSignature, backend: Backend) -> list[Any]:
        """What a run graphjit adds and undoes may write, as far as copies can put it back: :meth:`state` and every
        tensor the call passes (a run that takes another branch may write an input the others did not), each once.
        A tensor the call only reaches (a closure's, a module's) and the others' runs did not write is not among them:
        copying every reachable tensor would copy a model's weights held as plain tensors."""
        state, _names = self.state(sig, backend)
        seen = {id(t) for t in state}
        return state + [t for t in sig.tensors if id(t) not in seen]


def watched_call(backend: Backend, run: Callable[[], Any], roots: list[tuple[str, Any]], device: str, budget: int,
                 sync_watch: bool, guard_src: guards.Sources | None = None,
                 runs_python: bool = True, before: Reach | None = None,
                 host_calls: bool = False) -> tuple[Any, Observation]:
    """Run ``run()`` once and observe it (see the module docstring).  Exceptions of ``run`` propagate
    unchanged; the observation is then lost with them.  ``guard_src``: also record the Python values it
    changes (:mod:`graphjit.guards`) and, where ``runs_python`` (the tracer runs the function as Python), the
    names its code uses; where not, but ``host_calls`` (the tracer runs the Python it leaves out of its program:
    Dynamo's graph breaks), only what that Python does to the host (a clock read, a print, a log record).
    ``before``: the walk of ``roots`` as they are now (the last run's
    :attr:`Observation.after`, where nothing ran since that could rebind what they hold), instead of a new one."""
    b = backend
    types = b.tensor_types()

    def is_tensor(x: Any) -> bool:
        return isinstance(x, types)

    if before is None:
        before = walk(roots, is_tensor, b.tensor_state)
    where = addresses(before, b.data_ptr)
    probe = WriteProbe(b, before, budget, b.unversioned_writes(roots))
    rng = b.rng_state(device)
    host = host_random.Saved(b.host_generators(device))
    places = iterators.positions(before.iterators)
    syncs: list[str] = []
    values = (guards.scan(guard_src, is_tensor, None, b.tensor_holders, renewed=b.renewed_attributes)
              if guard_src is not None else None)
    # a run translated by a tracer uses no names of its own here; where the tracer runs what it leaves out of its
    # program as Python (``host_calls``: Dynamo's graph breaks), that Python is watched for host reads alone
    recorder = NameRecorder(names=runs_python, simulators=b.simulator_modules if host_calls else ())
    record = guard_src is not None and (runs_python or host_calls)
    with b.sync_watch(syncs) if sync_watch else contextlib.nullcontext(), collecting(b, device) as isl, \
            b.compiles_unwatched(recorder.pause, recorder.resume) if record else contextlib.nullcontext(), \
            recorder if record else contextlib.nullcontext():
        out = run()
    after = walk(roots, is_tensor, b.tensor_state)
    rebound, added = rebinds(before, after)
    drew = rng is not None and isl.drew_outside(rng, b.rng_state(device))
    obs = Observation(probe.written(), rebound, added, drew, [with_function(s) for s in syncs], probe.incomplete,
                      isl.calls, added_tensors(before, after), moved(before, where, b.data_ptr), after=after)
    obs.elsewhere = [p for t, p in obs.written if b.device_str(t) != device]
    obs.host_random = host.moved() if not isl.calls else None  # (an island draws on every call)
    obs.advanced = iterators.advanced(before.iterators, places) if not isl.calls else []
    if guard_src is not None and values is not None:
        if recorder.complete and runs_python:
            obs.names, obs.by_object, obs.probes = recorder.names, recorder.by_object, recorder.probes
            obs.probed_by_object, obs.read_globals = recorder.probed_by_object, recorder.read_globals
            obs.read_cells = recorder.read_cells
        obs.emitted, obs.clocked = recorder.emitted, recorder.clocked  # (a paused part unseen: what was seen holds)
        obs.py_written = py_writes.writes(values, lambda: guards.scan(guard_src, is_tensor, None, b.tensor_holders,
                                                                   renewed=b.renewed_attributes))
    return out, obs


def _by_object(seen: dict[int, frozenset[str]] | None,
               more: dict[int, frozenset[str]] | None) -> dict[int, frozenset[str]]:
    """``id(object) -> names`` of two watched calls together (each object's names of both)."""
    merged = dict(seen or {})
    for oid, names in (more or {}).items():
        merged[oid] = merged.get(oid, frozenset()) | names
    return merged


ELSEWHERE = "writes a tensor on another device"
PRINTS = "prints or logs on every call"


def elsewhere(paths: list[Path]) -> Blocked:
    """Why a key whose calls write ``paths`` (tensors off the graph's device) runs uncaptured."""
    where = ", ".join(describe(p) for p in paths[:3]) + (" ..." if len(paths) > 3 else "")
    return Blocked(ELSEWHERE, f"the function writes tensors that are not on the graph's device ({where}) on every "
                   "call; a CUDA graph replays the GPU's work only, so a replay would leave them as they are (an "
                   f"optimizer keeping state on the CPU does this: {OFF_DEVICE_HINT})")


OFF_DEVICE_HINT = ("torch's Adam and AdamW are made capturable for you; Paddle's Adam and AdamW keep their beta "
                   "powers on the CPU: use Momentum or SGD in a graphed step, or graph the model with "
                   "graphjit.graphed_layer and step the optimizer outside")

_GRAD_HINT = ("gradients set to None between calls are created anew by every backward: zero them in place "
              "with optimizer.zero_grad(set_to_none=False), or graph the model with graphjit.graphed_layer")


def _grads(paths: list[Path]) -> bool:
    return any(p and p[-1] == (".", "grad") for p in paths)


def _names(calls: list[IslandCall]) -> str:
    return "[" + ", ".join(c.island.name for c in calls) + "]"


def _blocked(obs: Observation, b: Backend, outputs: Any, first: bool) -> Blocked | None:
    if obs.syncs:
        return Blocked("CPU-GPU sync inside the function",
                       f"the function synchronises the CPU with the GPU ({obs.syncs[0]}); a CUDA graph cannot "
                       f"contain that. {ISLAND_HINT}")
    types = b.tensor_types()
    outs = collect_tensors(outputs, lambda x: isinstance(x, types))
    if b.grad_enabled() and any(b.requires_grad(o) for o in outs):
        return Blocked("outputs require grad",
                       "outputs require grad (autograd is recording through parameters or inputs that require grad). "
                       "@graphed captures inference; call it under torch.no_grad()/paddle.no_grad() (or freeze the "
                       "parameters), or use graphjit.graphed_layer for training")
    if obs.moved:
        where = ", ".join(describe(p) for p in obs.moved[:3]) + (" ..." if len(obs.moved) > 3 else "")
        return Blocked("moves the memory of a tensor",
                       f"after a call, tensors it can reach sit over other memory than before ({where}): the same "
                       "tensor object with new storage (torch's .data= / set_() / resize_(), or a tracer that writes "
                       "results back by sharing buffers); a CUDA graph would keep reading and writing the old memory")
    if obs.rebound:
        where = ", ".join(describe(p) for p in obs.rebound[:3]) + (" ..." if len(obs.rebound) > 3 else "")
        return Blocked("rebinds a tensor held by an object",
                       f"the function replaces tensors held by objects it can reach ({where}); a CUDA graph would "
                       "keep reading and writing the old tensors (" + (_GRAD_HINT if _grads(obs.rebound) else
                       "a cache that grows by concatenation does this: use a preallocated cache written in place, "
                       "such as transformers' StaticCache") + ")")
    if obs.emitted and not first:
        where = "; ".join(obs.emitted)
        return Blocked(PRINTS, f"the function prints or logs on every call ({where}); a replay runs no Python, so it "
                       "would not. Print or log outside the function, or mark the function that does with "
                       "@graphjit.eager (an island runs on every call)")
    if obs.advanced:  # (a first call's too: a capture, or a scope's extra run, would take one item more)
        where = ", ".join(obs.advanced)
        return Blocked(iterators.REASON, f"the function advances an iterator on every call ({where}); a replay runs "
                       "no Python and would not, and a capture's run would take an item the calls never see. Pass the "
                       "item in as an argument, or take it in an @graphjit.eager function")
    if obs.clocked:  # (a first call's too: with warmup=1 it is the only one watched)
        return Blocked(host_clock.REASON, f"the function reads the host clock ({'; '.join(obs.clocked)}); a replay "
                       "runs no Python and would hand back the capture's reading every time. Read it outside the "
                       "function and pass what it decides, or mark the function that reads it with @graphjit.eager")
    if obs.added and not first:
        where = ", ".join(describe(p) for p in obs.added[:3]) + (" ..." if len(obs.added) > 3 else "")
        return Blocked("adds tensors to an object on every call",
                       f"the function stores new tensors in objects it can reach on every call ({where}); a CUDA "
                       "graph would not do that again on replay" + (f" ({_GRAD_HINT})" if _grads(obs.added) else ""))
    if obs.elsewhere and not first:
        return elsewhere(obs.elsewhere)
    if obs.host_random is not None and not first:
        return Blocked(host_random.REASON,
                       f"the function draws numbers from {obs.host_random} on the CPU; {host_random.HINT}")
    if obs.drew_random:
        why = b.rng_in_graphs()
        if why is not None:
            return Blocked("draws random numbers", why)
    return None
