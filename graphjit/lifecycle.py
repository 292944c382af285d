"""The calls of a key that has no graph yet: warmup calls, the capturing call, and what happens when
a key cannot be graphed (the methods :class:`graphjit.api._State` inherits from :class:`KeyLifecycle`).

Every method here keeps the exactly-once promise of :mod:`graphjit.capture`: the call runs the
function once, eagerly or as the first replay, and the runs graphjit adds for itself (extra warmups
inside a capture scope, verify's eager reference) are undone.
"""

from __future__ import annotations

import abc
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import advances, env, reach, renewals, tracer_check
from . import families as families_mod
from . import recheck as recheck_mod
from . import scope as scope_mod
from .backends.base import Backend
from .buffers import OVERLAP, OVERLAP_WHY, InputMoved, InputsOverlap, KeyEntry
from .capture import BuildRequest, build, record_reference, verify_fits
from .dynamic import DynamicArgs
from .errors import CaptureError, GraphjitError, UnrecoverableCaptureError
from .feeds import StepContext
from .guards import Sources
from .key_changes import advances_differ, changes_key, holders_kept
from .keys import CallSignature, Signer
from .labels import changed_argument
from .leaves import changes, name, shown
from .pystate import PyState, copy_or_none, dynamic_roots
from .stats import KeyStats, State
from .warmup import Blocked, Warmup, extra_run_raised, watched_call
from .writes import Snapshot

if TYPE_CHECKING:
    from .history import KeyHistory
    from .invoke import Invoker
    from .options import Options
    from .stats import FunctionStats

log = logging.getLogger("graphjit")

FUNCTION_WIDE = frozenset(("rebinds a tensor held by an object", "adds tensors to an object on every call"))
"""Reasons that hold for every key of the function once seen (a cache that grows makes a new key per call)."""


class KeyLifecycle(abc.ABC):
    """Warmup, capture and failure handling of the keys of one graphed function (a mixin of ``_State``)."""

    name: str
    options: Options
    invoker: Invoker
    stats: FunctionStats
    entries: dict[tuple[Any, ...], KeyEntry]
    warming: dict[tuple[Any, ...], Warmup]
    failed: dict[tuple[Any, ...], str]
    blocked_fn: Blocked | None
    dynamic: DynamicArgs | None
    signer: Signer
    history: KeyHistory
    lock: threading.RLock
    tracer_checked: set[tuple[Any, ...]]  # keys whose first call checked the tracer (tracer_check)
    variants: dict[tuple[Any, ...], list[tuple[Any, ...]]]  # a key of the arguments -> its keys for other values
    step_feeds: dict[tuple[Any, ...], StepContext | None]  # a key -> the hyperparameters fed to its graph (feeds.py)
    fed: dict[tuple[Any, ...], renewals.Fed]  # a key of the arguments -> the tensors rebound it reads (renewals.py)
    families: families_mod.Families  # captured keys whose graph serves other values of their counters (families.py)

    # -- provided by _State -------------------------------------------------------------------
    @abc.abstractmethod
    def captured(self, entry: KeyEntry, sig: CallSignature, settings: env.Settings, instance: Any,
                 args: tuple[Any, ...], kwargs: dict[str, Any], previous: tuple[Any, ...] | None) -> Any: ...

    @abc.abstractmethod
    def key_stats(self, backend: Backend, sig: CallSignature) -> KeyStats: ...

    @abc.abstractmethod
    def own_value_run(self, backend: Backend, device: str, sig: CallSignature, warm: Warmup, instance: Any,
                      args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[bool, Any]: ...

    @abc.abstractmethod
    def slow(self, sig: CallSignature, settings: env.Settings, instance: Any, args: tuple[Any, ...],
             kwargs: dict[str, Any], previous: tuple[Any, ...] | None = None) -> Any: ...

    @abc.abstractmethod
    def roots(self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[tuple[str, Any]]: ...

    @abc.abstractmethod
    def guard_sources(self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Sources: ...

    @abc.abstractmethod
    def sign_bound(self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> CallSignature: ...

    @abc.abstractmethod
    def named_leaves(self, backend: Backend, sig: CallSignature, instance: Any, args: tuple[Any, ...],
                     kwargs: dict[str, Any]) -> dict[Any, str]: ...

    @abc.abstractmethod
    def strict(self) -> bool: ...

    @abc.abstractmethod
    def verify(self) -> bool: ...

    @abc.abstractmethod
    def say_once(self, level: int, topic: str, msg: str, *args: Any) -> None: ...

    @abc.abstractmethod
    def pool_for(self, backend: Backend, device: str) -> Any: ...

    @abc.abstractmethod
    def hand_out(self, entry: KeyEntry, sig: CallSignature, result: Any) -> None: ...

    # -- the calls ------------------------------------------------------------------------------
    def fallback(self, reason: str, backend: Backend, instance: Any, args: tuple[Any, ...],
                 kwargs: dict[str, Any], key: tuple[Any, ...] | None = None, device: str | None = None,
                 untraced: bool = False) -> Any:
        """Run the traced function uncaptured (``untraced``, or a tracer whose program keeps the Python values it was
        translated with, Paddle's ``ast``: the Python function itself), counted under ``reason`` (and under the key,
        if any).  With a ``device``, the key's first call checks the tracer (:meth:`KeyLifecycle.runner`)."""
        self.stats.fallback(reason)
        if key is not None:
            st = self.stats.keys.get(key)
            if st is not None:
                st.uncaptured += 1
        if env.settings().debug:
            log.debug("graphjit %s: call %d runs uncaptured (%s)", self.name, self.stats.calls, reason)
        if untraced or not backend.tracer_rereads_values(self.invoker.tracer_name(backend)):  # ast: a program's values
            return self.invoker.run_untraced(backend, instance, args, kwargs)  # are those it was translated with
        if key is None or device is None:
            return self.invoker.run(backend, instance, args, kwargs)
        run, traced = self.runner(backend, device, key, instance, args, kwargs)
        out = run()
        if traced is not None:
            self.check_tracer(backend, traced, out)
        return out

    def uncaptured(self, reason: str, detail: str, backend: Backend, sig: CallSignature, instance: Any,
                   args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A call that cannot even try to capture (bucket overflow, several devices, max_graphs): its key says why, and
        the call runs uncaptured under that reason.  Under a tracer that compiles (any but ``eager``), the first such
        call of a key runs the Python function itself: a signature seen once (a cache's counters before their first
        update moves them to the GPU, one more new key past max_graphs) is not worth a compilation, which would cost
        seconds and, once the signature settles, a recompilation; the key's later calls run the traced function."""
        with self.lock:
            st = self.key_stats(backend, sig)
            first = not st.uncaptured and not st.warmups and not st.replays and \
                self.invoker.tracer_name(backend) != "eager"
            st.state, st.reason, st.detail = State.FALLBACK, reason, detail
        return self.fallback(reason, backend, instance, args, kwargs, sig.key, untraced=first)

    def watched(self, backend: Backend, device: str, sig: CallSignature, warm: Warmup, instance: Any,
                args: tuple[Any, ...], kwargs: dict[str, Any], sync_watch: bool,
                before: reach.Reach | None = None) -> tuple[Any, reach.Reach | None]:
        """One eager run of the function as a warmup, observed (:func:`graphjit.warmup.watched_call`): its result and
        the walk of its roots after it, from which a run that follows with nothing between that could rebind what
        they hold (graphjit's bookkeeping only, in the same call) starts (``before``) instead of walking them again;
        None where the run rebound a root itself (a global or closure variable set at its first call).

        ``sync_watch``: also look for CPU-GPU syncs (the last warmup run before a capture; not the first of several,
        in which tracers translate and compilers may synchronise for themselves)."""
        st = self.key_stats(backend, sig)
        st.state = State.WARMUP
        budget = env.settings().verify_max_bytes
        roots = self.roots(instance, args, kwargs)
        guard_src = self.guard_sources(instance, args, kwargs) if sync_watch else None
        holders = warm.advances.holders(args, kwargs) if warm.advances is not None else None
        with scope_mod.graphed_call("warmup"):
            run, traced = self.runner(backend, device, sig.key, instance, args, kwargs, roots)
            tracer = self.invoker.tracer_name(backend)
            out, obs = watched_call(backend, run, roots, device, budget, sync_watch=sync_watch, guard_src=guard_src,
                                    runs_python=traced is not None or tracer == "eager",
                                    before=before if traced is None else None,
                                    host_calls=tracer in backend.host_watched_tracers)
        if traced is not None:
            self.check_tracer(backend, traced, out)
        warm.sync_watched = warm.sync_watched or sync_watch
        warm.note(obs, backend, out, sig.tensors)
        changed = self.own_key_change(sig, warm, instance, args, kwargs)  # (a failed run's advances: families.py)
        if warm.blocked is None:
            warm.blocked = changed
        if warm.blocked is None and holders is not None and warm.advances is not None:
            warm.blocked = holders_kept(warm.advances, holders, args, kwargs)
        st.warmups += 1
        if env.settings().debug:
            log.debug("graphjit %s [%s]: warmup %d/%d wrote %s%s", self.name, st.label, warm.calls,
                      self.options.warmup, [reach.describe(p) for _t, p in obs.written] or "nothing",
                      f"; blocked: {warm.blocked.reason}" if warm.blocked else "")
        return out, obs.after if reach.same_roots(roots, self.roots(instance, args, kwargs)) else None

    def own_key_change(self, sig: CallSignature, warm: Warmup, instance: Any, args: tuple[Any, ...],
                       kwargs: dict[str, Any]) -> Blocked | None:
        """After a warmup run: None where signing the same arguments again gives the same key, or where the run
        changed only scalars it can advance (:mod:`graphjit.advances`, noted in ``warm.advances``, the same on every
        run); else why the key cannot be replayed.  A call that changes what its key is made of otherwise (a tensor
        it puts into a cache, a counter in a tuple) cannot be replayed: a replay runs no Python, so the next call
        would find the value as the capture left it and replay the same graph again."""
        try:
            after = self.sign_bound(instance, args, kwargs)
        except GraphjitError as exc:
            return changes_key("its arguments", f"its arguments, which can no longer be signed ({exc})")
        if after.key == (sig.base if sig.base is not None else sig.key):
            if warm.advances is not None:  # an earlier run of the key advanced its scalars, this one did not
                return advances_differ(warm.advances.paths[0], "an earlier run changed it, this one did not")
            return None
        record = self.history.records.get(sig.key)
        backend = sig.backend if sig.backend is not None else after.backend
        if record is not None and backend is not None:
            found = [c for c in changes(record.leaves, self.named_leaves(backend, after, instance, args, kwargs))
                     if c.label[:1] != ("<read>",)]  # (read values: a variant key's, checked by its guards)
            if found:
                moved = advances.find(found, args, kwargs) if self.dynamic is None and not warm.islands else None
                if moved is not None:
                    return self.note_advances(sig, warm, moved, instance, args, kwargs)
                c = found[0]
                path = name(self.signer, c.label)
                return changes_key(path, f"{path} ({shown(c.old, 80)} before the call, {shown(c.new, 80)} after)")
        path = changed_argument(self.signer, instance is not None, sig.key, after.key) or "its arguments"
        return changes_key(path, path)

    def advanced(self, key: tuple[Any, ...] | None) -> bool:
        """Whether a call of ``key`` advances scalars of its own key (graphjit/advances.py): the next key is its
        doing, one per value of a counter, not a value that changes from call to call by chance."""
        if key is None:
            return False
        entry, warm = self.entries.get(key), self.warming.get(key)
        return (entry is not None and entry.advances is not None) or (warm is not None and warm.advances is not None)

    def note_advances(self, sig: CallSignature, warm: Warmup, moved: list[advances.Advance], instance: Any,
                      args: tuple[Any, ...], kwargs: dict[str, Any]) -> Blocked | None:
        """A warmup run changed only scalars a replay can set (:mod:`graphjit.advances`): kept for the key's
        graph if they are all it changed of its key and every run of the key leaves them the same."""
        found = advances.Advances(moved, [name(self.signer, a.label) for a in moved],
                                  advances.layout_of(moved, args, kwargs))
        if not found.explains(args, kwargs, lambda: self.sign_bound(instance, args, kwargs).key,
                              sig.base if sig.base is not None else sig.key):
            path = found.paths[0]
            return changes_key(path, f"{path} and more of its key than its scalars show (a value's type, a text "
                                "longer than a key's label keeps), so it is not a value a replay can set")
        if warm.advances is None:
            if warm.calls > 1:
                return advances_differ(found.paths[0], "an earlier run of the key left it as it was")
            warm.advances = found
            return None
        if not warm.advances.same_as(found):
            was, now = next(((a, b) for a, b in zip(warm.advances.items, found.items, strict=False)
                             if a.label != b.label or a.after != b.after), (warm.advances.items[0], found.items[0]))
            if was.label != now.label:
                return advances_differ(name(self.signer, now.label), "an earlier run of the key changed other values")
            return advances_differ(name(self.signer, now.label),
                                    f"an earlier run of the key left {was.after!r}, this one {now.after!r}")
        return None

    def runner(self, backend: Backend, device: str, key: tuple[Any, ...], instance: Any, args: tuple[Any, ...],
               kwargs: dict[str, Any], roots: list[tuple[str, Any]] | None = None
               ) -> tuple[Callable[[], Any], tracer_check.TracedRun | None]:
        """What runs a call: the traced function, or, on the first call of a key whose tracer is checked
        (:mod:`graphjit.tracer_check`), the Python function after a run of the traced one that is put back
        (then hand the returned run to :meth:`check_tracer` with the call's result).  ``roots``: the call's
        (:meth:`roots`), if the caller has them."""
        inv = self.invoker
        if key in self.tracer_checked or inv.tracer_name(backend) not in backend.checked_tracers:
            return (lambda: inv.run(backend, instance, args, kwargs)), None
        self.tracer_checked.add(key)
        traced = tracer_check.traced_run(backend, device, roots if roots is not None else
                                         self.roots(instance, args, kwargs),
                                         lambda: inv.run(backend, instance, args, kwargs),
                                         env.settings().verify_max_bytes)
        return (lambda: inv.run_untraced(backend, instance, args, kwargs)), traced

    def check_tracer(self, backend: Backend, traced: tracer_check.TracedRun, result: Any) -> None:
        """Replace the tracer by ``eager`` (logged once, shown in ``report()``) where :func:`tracer_check.verdict`
        says so for its program's first run of a key against the Python function's ``result``."""
        why, skipped = tracer_check.verdict(traced, backend, self.invoker.tracer_name(backend), result)
        if skipped is not None:
            self.say_once(logging.INFO, "tracer-check-skipped", "graphjit %s: %s", self.name, skipped)
        if why is not None:
            self.invoker.replace_tracer(backend, why)
            self.stats.tracer = why
            log.warning("graphjit %s: %s", self.name, why)

    def warm_call(self, backend: Backend, device: str, sig: CallSignature, warm: Warmup, instance: Any,
                  args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A warmup call: the function runs once, eagerly, and that is the call's result."""
        last = warm.calls + 1 >= self.options.warmup
        out = self.watched(backend, device, sig, warm, instance, args, kwargs, sync_watch=last)[0]
        if warm.blocked is not None:
            self.block(backend, sig, warm.blocked, out)
        return out

    def block(self, backend: Backend, sig: CallSignature, blocked: Blocked, result: Any) -> None:
        """The key runs uncaptured from now on (``result``: of the call that found out)."""
        st = self.key_stats(backend, sig)
        self.fail_key(sig.key, blocked.reason)
        st.state, st.reason, st.detail = State.FALLBACK, blocked.reason, blocked.message
        self.stats.fallback(blocked.reason)  # this call ran eagerly too, and no graph will follow
        st.uncaptured += 1
        if blocked.reason in FUNCTION_WIDE:
            self.blocked_fn = blocked
        if (active := scope_mod.current()) is not None:
            active.note_capture(self.name, st.label, 0.0, ok=False, reason=blocked.reason)
        if self.strict():
            raise CaptureError(f"{self.name} [{st.label}]: {blocked.message} (strict mode)",
                               reason=blocked.reason).after_run(result)
        self.say_once(logging.WARNING, "fail:" + blocked.reason, "graphjit %s [%s]: %s; running uncaptured",
                      self.name, st.label, blocked.message)

    def fail_key(self, key: tuple[Any, ...], reason: str) -> None:
        """``key`` runs uncaptured under ``reason`` from now on, and so do the keys whose warmups its record held
        (:attr:`Warmup.shared`: a counter's values of one class take the same branches) and the next values of
        their class (:meth:`graphjit.families.Families.take_over`)."""
        warm = self.warming.pop(key, None)
        self.failed[key] = reason
        for k in warm.shared if warm is not None else ():
            self.failed.setdefault(k, reason)
        self.families.failed(key, warm, reason)

    def no_graph_yet(self, key: tuple[Any, ...]) -> str:
        """Why a key has no graph (and so no static buffers) yet, and what to do."""
        failed = self.failed.get(key) or (self.blocked_fn.reason if self.blocked_fn else None)
        warm = self.warming.get(key)
        if failed is not None:
            return f"these arguments run uncaptured ({failed}), so there are no static buffers"
        if warm is not None:
            return (f"this signature is captured on the call after its {self.options.warmup} warmup call(s); "
                    f"{warm.calls} so far: call the function with them (or inside graphjit.capture_scope()) first")
        return ("no graph is captured for these arguments yet: call the function with them "
                f"{self.options.warmup + 1} times (or once inside graphjit.capture_scope()) first")

    def extra_warmups(self, backend: Backend, device: str, sig: CallSignature, warm: Warmup, count: int,
                      instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                      before: reach.Reach | None = None) -> tuple[reach.Reach, PyState] | None:
        """Inside a capture scope: ``count`` more warmup runs after the call's own, each undone (the state
        it writes and the generator put back), so that the call still acts like one eager call.

        Copied before them: :meth:`Warmup.undoable` (beyond ``GRAPHJIT_VERIFY_MAX_BYTES``: no extra runs).  A run that
        writes outside the copies blocks the key; that write stays, said at WARNING level.  ``before``: the walk of the
        roots after the call's own run (:meth:`watched`), where nothing ran since.  Returns the walk after the last
        run and the Python state taken before the runs where putting it back changed nothing (the state is then as
        both found it: the capture may start from them), else None."""
        warm.reference = None
        written, _names = warm.state(sig, backend)
        undoable = warm.undoable(sig, backend)
        budget = env.settings().verify_max_bytes
        if sum(backend.nbytes(t) for t in undoable) > budget or warm.untracked is not None:
            return None  # cannot undo them: capture after the call's own run
        record = self.verify() and verify_fits(sum(backend.nbytes(t) for t in written), budget)  # verify's reference
        snap = Snapshot(backend, undoable, device)
        start = self.roots(instance, args, kwargs)
        py = PyState(backend, start, device)
        own, known, mutated = {id(t) for t in written}, {id(t) for t in undoable}, set(warm.mutated_leaves)
        after: reach.Reach | None = None
        for k in range(count):
            last = k == count - 1
            try:
                out, after = self.watched(backend, device, sig, warm, instance, args, kwargs, sync_watch=last,
                                          before=before if k == 0 else None)
            except Exception as exc:  # the function's own error, in a run the call did not ask for: undone
                snap.restore({id(t) for t in warm.state(sig, backend)[0]})
                py.restore()
                warm.blocked = extra_run_raised(exc)
                return None
            if last and record and warm.blocked is None:  # verify's eager reference: it need not run again
                warm.reference = record_reference(backend, out, written, device)
            del out
            snap.restore({id(t) for t in warm.state(sig, backend)[0]})  # what its runs wrote (an input read only: kept)
            if py.restore():  # something had changed: the walk after the run may not be the state's any more
                after = None
            lost = [reach.describe(p) for t, p in warm.written_tensors() if id(t) not in known]
            new = [reach.describe(p) for t, p in warm.written_tensors() if id(t) not in own]
            new += [sig.paths[i] for i in sorted(warm.mutated_leaves - mutated)]
            if lost:
                log.warning("graphjit %s: an extra warmup run inside capture_scope wrote %s, which the call's own run "
                            "did not write and graphjit had not copied: that write stays", self.name, ", ".join(lost))
            if new and warm.blocked is None:
                warm.blocked = Blocked("writes different tensors on different calls", f"a warmup run wrote {new[0]}, "
                                       "which the call's own run did not write")
            if warm.blocked is not None:
                return None
        same = reach.same_roots(start, self.roots(instance, args, kwargs))  # a run that rebound a root: py misses it
        return (after, py) if after is not None and same else None

    def capture_key(self, backend: Backend, device: str, sig: CallSignature, warm: Warmup, instance: Any,
                    args: tuple[Any, ...], kwargs: dict[str, Any], no_adopt: frozenset[int]) -> Any:
        """The call that captures: after the key's warmup calls (the result comes from the first replay),
        or the first call of the key inside a capture scope (the result is the call's own eager run)."""
        settings = env.settings()
        st = self.key_stats(backend, sig)
        active = scope_mod.current()
        scope_run = active is not None and warm.calls < self.options.warmup
        own: Any = None
        walked: reach.Reach | None = None  # the roots' walk as the capture will find them, where known
        py: PyState | None = None  # and their Python state
        if scope_run:
            own, walked = self.watched(backend, device, sig, warm, instance, args, kwargs,
                                       sync_watch=warm.calls + 1 >= self.options.warmup)
            if active is not None and warm.blocked is None and warm.advances is not None:  # extra runs would start
                active.note_deferred(warm.advances.paths)  # where this run left its scalars: a later call captures
                return own
            step = self.step_feeds.get(sig.key)
            if step is not None:  # what the call's own run made (its gradients) is the step's from the extra runs on
                walked = None  # (the step's feeds may rebind them)
                step.learn()
                step.__exit__(None, None, None)
                step.__enter__()  # raises with every part exited; the caller's exit then does nothing
            if warm.blocked is None and warm.calls < self.options.warmup:
                settled = self.extra_warmups(backend, device, sig, warm, self.options.warmup - warm.calls, instance,
                                             args, kwargs, before=walked)
                walked, py = settled if settled is not None else (None, None)
            if warm.blocked is None and not warm.sync_watched and not backend.captures_recoverable:
                warm.blocked = Blocked("no sync-checked warmup", f"{backend.name} cannot recover from a capture that a "
                                       "CPU-GPU sync breaks, and the extra warmup run that checks for syncs could not "
                                       "be undone (see GRAPHJIT_VERIFY_MAX_BYTES); call it once before the capture "
                                       "scope, or raise the limit")
            if warm.blocked is not None:
                self.block(backend, sig, warm.blocked, own)
                return own
        if warm.shared and not scope_run:  # other values of its class warmed it up: a run of its own value first
            ran, result = self.own_value_run(backend, device, sig, warm, instance, args, kwargs)
            if warm.blocked is not None:
                result = result if ran else self.invoker.run(backend, instance, args, kwargs)
                self.block(backend, sig, warm.blocked, result)
                return result
        st.state_bytes = sum(backend.nbytes(t) for t in warm.state(sig, backend)[0])
        inv = self.invoker
        traced = inv.traced(backend)
        capture_fn = backend.capture_callable(traced, inv.target, inv.tracer_name(backend))
        more = warm.read_roots(self.roots(instance, args, kwargs))  # walked and copied with the roots at capture
        req = BuildRequest(
            fn_name=self.name, backend=backend, device=device, traced=inv.callable(traced, instance),
            capture_fn=inv.callable(capture_fn, instance), args=args, kwargs=kwargs, sig=sig, stats=st, warm=warm,
            roots=lambda: self.roots(instance, args, kwargs) + more, verify=self.verify(), replay_result=not scope_run,
            copy_outputs=self.options.outputs == "copy" or settings.check_outputs, dump_dir=settings.dump_dir,
            pool=self.pool_for(backend, device), verify_budget=settings.verify_max_bytes, debug=settings.debug,
            no_adopt=no_adopt, dynamic=self.dynamic, method=instance is not None, fed=self.fed.get(sig.base or sig.key),
            hooks_outside=inv.forward_of_self(instance),
            guard_sources=lambda: self.guard_sources(instance, args, kwargs),
            tracer_guard=lambda sargs, skwargs: backend.tracer_guard(
                inv.target, inv.tracer_name(backend), inv.frame_locals(instance, sargs, skwargs)),
            walked=None if more else walked, pystate=None if more else py)
        holders = warm.advances.holders(args, kwargs) if warm.advances is not None else None
        try:
            entry, result = build(req)
        except CaptureError as exc:
            return self.capture_failed(exc, backend, sig, st, own if scope_run else None, scope_run, instance, args,
                                       kwargs)
        finally:
            warm.reference = None  # a recorded reference is this build's only
        if warm.advances is not None:
            kept = holders_kept(warm.advances, holders, args, kwargs) if holders is not None else \
                advances_differ(warm.advances.paths[0], "its path could not be read before the capture")
            if kept is None and not warm.advances.left(args, kwargs):
                kept = advances_differ(warm.advances.paths[0], "the capturing call left other values than the "
                                        "warmup runs")
            if kept is not None:  # this call ran right (its capture and replay); later ones run uncaptured
                entry.release()  # (never inside a scope: a key with advances returned after its own run there)
                self.block(backend, sig, kept, result)
                return result
            entry.advances, st.advances = warm.advances, list(warm.advances.paths)
        self.warming.pop(sig.key, None)
        entry.feeds = self.step_feeds.get(sig.key) or (self.step_feeds.get(sig.base) if sig.base is not None else None)
        if entry.feeds is not None:
            entry.feeds.captured()
        self.entries[sig.key] = entry
        if entry.advances is not None and sig.base is None and self.dynamic is None:
            record = self.history.records.get(sig.key)
            self.families.found(sig.key, entry, record.leaves if record is not None else None, args, kwargs)
        if sig.base is not None:  # a graph for other values of what the function reads: found from the arguments' key
            keys = self.variants.setdefault(sig.base, [sig.base])
            if sig.key not in keys:
                keys.append(sig.key)
        if (sig.dynamic or sig.bucketed) and st.verify == "passed":
            entry.recheck = recheck_mod.DynamicCheck(recheck_mod.fingerprint(backend, sig.dynamic) if sig.dynamic
                                                     else None, sig.pads if sig.bucketed else None)
        if st.verify is not None and st.verify.startswith("skipped"):
            self.stats.verify_skipped[st.verify.split(": ", 1)[-1]] += 1
            self.say_once(logging.INFO, "verify-skip:" + st.verify, "graphjit %s [%s]: captured without verify (%s)",
                          self.name, st.label, st.verify)
        if active is not None:
            active.note_capture(self.name, st.label, st.capture_ms, ok=True)
        if scope_run:
            return own
        if settings.check_outputs and self.options.outputs == "alias":
            self.hand_out(entry, sig, result)
        return result

    def capture_failed(self, exc: CaptureError, backend: Backend, sig: CallSignature, st: KeyStats, own: Any,
                       scope_run: bool, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The key's capture or verify failed: it runs uncaptured from now on; this call's result is its
        one eager execution (already run, or run now)."""
        self.fail_key(sig.key, exc.reason)
        st.state, st.reason, st.detail = State.FALLBACK, exc.reason, str(exc)
        active = scope_mod.current()
        if active is not None:
            active.note_capture(self.name, st.label, 0.0, ok=False, reason=exc.reason)
        if isinstance(exc, UnrecoverableCaptureError):
            raise exc
        if scope_run:
            result = own
        elif exc.executed:
            result = exc.result
            self.stats.fallback(exc.reason)
            st.uncaptured += 1
        else:
            result = self.fallback(exc.reason, backend, instance, args, kwargs, sig.key)
        if self.strict():
            raise exc.after_run(result)
        self.say_once(logging.WARNING, "fail:" + exc.reason, "graphjit %s [%s]: %s; running uncaptured",
                      self.name, st.label, exc)
        return result

    def recheck(self, entry: KeyEntry, sig: CallSignature, instance: Any, args: tuple[Any, ...],
                kwargs: dict[str, Any]) -> Any:
        """A replayed call of a key with dynamic arguments or buckets not yet proven independent of them
        (:mod:`graphjit.recheck`): replay, or verify against eager when its dynamic values or padding are new."""
        check = entry.recheck
        assert check is not None
        backend = entry.inputs.backend
        st = entry.stats
        change = check.changed(backend, sig)
        if change is None:
            if check.settled():
                entry.recheck = None
                st.verify = (f"passed (the dynamic arguments did not change in {recheck_mod.CALLS} calls: "
                             "not re-checked)")
            return self.replay(entry, sig, env.settings(), instance, args, kwargs)
        entry.recheck = check.rest(change)
        written, paths = entry.warm.state(sig, backend)  # after the replay: the caller's own tensors

        def eager() -> Any:
            with scope_mod.graphed_call("warmup"):
                return self.invoker.run(backend, instance, args, kwargs)

        def roots() -> list[tuple[str, Any]]:
            return [*self.roots(instance, args, kwargs), *dynamic_roots(sig.dynamic)]

        before = copy_or_none(backend, roots, entry.device)  # the Python state the eager run starts from
        with self.lock:
            try:
                outcome, post = recheck_mod.against_eager(
                    backend, entry.device, written, paths, eager, lambda: entry.replay(sig, True, (args, kwargs)),
                    before if entry.piecewise else None, lambda: copy_or_none(backend, roots, entry.device))
            except InputMoved as moved:  # nothing replayed; the eager run's tensor writes were undone
                if before is not None:
                    before.restore()  # and its Python effects: the recapture runs the call
                return self.recapture(entry, moved.leaf, sig, instance, args, kwargs)
        if outcome.problem is None:
            st.verify = check.passed(change)
            return outcome.result
        post.restore()  # the state the eager reference left: the call ran exactly once
        backend.synchronize(entry.device)
        st.replays -= 1  # the rejected replay was verify's, not the call's
        del self.entries[sig.key]
        self.families.forget(entry, self.entries)
        entry.release()
        reason, message = check.rejected(change, sig, outcome.problem)
        self.failed[sig.key] = reason
        st.state, st.reason, st.detail, st.verify = State.FALLBACK, reason, message, "failed"
        self.stats.fallback(reason)
        st.uncaptured += 1
        if self.strict():
            raise CaptureError(f"{self.name} [{st.label}]: {message} (strict mode)", reason=reason).after_run(
                outcome.reference)
        self.say_once(logging.WARNING, "fail:" + reason, "graphjit %s [%s]: %s; running uncaptured", self.name,
                      st.label, message)
        return outcome.reference

    @abc.abstractmethod
    def replay(self, entry: KeyEntry, sig: CallSignature, settings: env.Settings, instance: Any,
               args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any: ...

    def input_moved(self, entry: KeyEntry, moved: InputMoved, sig: CallSignature, instance: Any, args: tuple[Any, ...],
                    kwargs: dict[str, Any]) -> Any:
        """A replay refused before it launched: overlapping inputs run uncaptured, else moved ones are recaptured."""
        if isinstance(moved, InputsOverlap):
            self.say_once(logging.WARNING, OVERLAP, "graphjit %s: %s; running such calls uncaptured", self.name,
                          OVERLAP_WHY % sig.paths[moved.leaf])
            return self.fallback(OVERLAP, entry.inputs.backend, instance, args, kwargs, sig.key)
        entry.no_adopt |= moved.leaves
        return self.recapture(entry, moved.leaf, sig, instance, args, kwargs)

    def recapture(self, entry: KeyEntry, leaf: int, sig: CallSignature, instance: Any, args: tuple[Any, ...],
                  kwargs: dict[str, Any]) -> Any:
        backend = entry.inputs.backend
        path = sig.paths[leaf] if leaf < len(sig.paths) else f"input {leaf}"
        self.say_once(logging.INFO, f"moved:{leaf}",
                      "graphjit %s: %s is updated in place and arrived at a new address; recapturing with a "
                      "graphjit-owned buffer that is copied in and back each call (pass the same tensor every "
                      "call to avoid the copies)", self.name, path)
        member = any(f.entry is entry and f.key != sig.key for f in self.families.items)
        del self.entries[sig.key]
        self.families.forget(entry, self.entries)
        entry.release()
        entry.stats.reason = f"recaptured: {path} moved"
        if member:  # another value of a family's counter: the family's record is not its own; it starts over, and
            self.families.moved |= entry.no_adopt  # the counter's next captures copy what moved (not adopted)
            return self.slow(sig, env.settings(), instance, args, kwargs)
        device = backend.device_str(sig.tensors[0])
        return self.capture_key(backend, device, sig, entry.warm, instance, args, kwargs, entry.no_adopt | {leaf})

