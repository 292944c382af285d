"""``@graphjit.graphed``: trace, key, warm up, capture, verify and replay a function.

See ``docs/architecture.md`` for the module map and a call's path, and the README's "What graphjit
guarantees" for the semantics.  In short: each distinct input signature (see :mod:`graphjit.keys`)
gets its own CUDA graph.  The first ``warmup`` calls of a signature run the function eagerly (each is
that call's one execution), the next call captures and replays (:mod:`graphjit.capture`), later calls
replay; inside ``capture_scope()`` the first call of a signature does all of it.  Anything that cannot
be graphed runs the traced function instead, and the reason is counted in
:meth:`GraphedFunction.stats` and logged once; ``strict=True`` (or ``GRAPHJIT_STRICT=1``) raises.

Restrictions (as for any CUDA graph):

* Tensors the function closes over (weights) are captured by address and held by identity (a rebound one is
  another graph's).  After replacing a storage under the same tensor, call :meth:`GraphedFunction.reset`.
* Python side effects and Python values computed inside the function run in warmup calls, the
  capture and verify's eager reference, never in a replay.  ``verify`` catches outputs and written
  state that depend on them.
* The function must not synchronise the CPU with the GPU (``.item()``, ``.numpy()``, printing a
  tensor); such a key runs uncaptured with that reason (and the file and line of the sync).
* Graphs capture inference: a key whose outputs require grad runs uncaptured (use
  :func:`graphjit.graphed_layer` for training).

This module holds the decorator, the wrappers it returns and the per-call decision (:meth:`_State.call`
and :meth:`_State.slow`: replay, warm up, capture or fall back).
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, overload

import wrapt

from . import advances, backends, env, renewals
from . import lane as lane_mod
from . import scope as scope_mod
from .backends.base import Backend
from .binder import as_written
from .buffers import InputMoved, KeyEntry
from .drops import KeyDrops
from .dynamic import DynamicArgs
from .errors import BucketOverflowError, GraphjitError, SignatureError, UnrecoverableCaptureError
from .families import NOT_MEMBER, Families
from .family_calls import FamilyCalls
from .feeds import StepContext
from .guards import Sources
from .handoff import NOT_SERVED
from .history import SIGNATURE_CHANGES, KeyHistory
from .invoke import Invoker, KeepsWrapped
from .keys import BucketsArg, CallSignature, Signer, rebuild_call
from .labels import changed_argument, key_order, label_parts
from .lane import MISS as LANE_MISS
from .lane import LaneHolder
from .leaves import leaves
from .options import GRAPHED_DOC, Options, check_callable, make_options
from .output_checks import OutputChecks
from .policy import Policy
from .stats import FunctionStats, KeyStats, State
from .variants import Drift, ValueVariants
from .warmup import Blocked, Warmup

log = logging.getLogger("graphjit")

F = TypeVar("F", bound=Callable[..., Any])
_UNBOUND: Any = object()  # the instance wrapt hands for a call of the unbound GraphedFunction: taken as None

NEW_KEY_WARNING_AFTER = 8  # keys made before graphjit checks whether most calls make a new one (naming the argument)


@dataclass(frozen=True)
class _Ran:
    """The result of a call that already ran uncaptured (see :meth:`_State.device_of`)."""

    result: Any


class _State(OutputChecks, LaneHolder, Policy, FamilyCalls, ValueVariants, KeyDrops):
    """Per-function state: options, keys, graphs, stats.  Shared by every binding of the wrapper."""

    def __init__(self, fn: Callable[..., Any], options: Options) -> None:
        name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
        Policy.__init__(self, name, options.strict, options.verify, options.max_graphs)
        self.fn = fn
        self.options = options
        self.invoker = Invoker(fn, self.name, options.tracer)
        # A bound method is called as it is: wrapt hands its __self__ as the instance, which must not bind again.
        self.prebound = inspect.ismethod(fn)
        owner = fn.__self__ if self.prebound else self.invoker.module  # type: ignore[attr-defined]
        self.signer = Signer(self.invoker.signature_target(), options.buckets, options.backend, self.name, owner=owner)
        self.dynamic = (DynamicArgs(options.dynamic, self.signer.signature, self.name, self.signer.bucket_targets())
                        if options.dynamic else None)
        self.stats = FunctionStats(self.name)
        self.stats.pending = weakref.WeakMethod(self.flush_lane)  # the counts of calls the lane served (lane.py)
        self.entries: dict[tuple[Any, ...], KeyEntry] = {}
        self.warming: dict[tuple[Any, ...], Warmup] = {}
        self.failed: dict[tuple[Any, ...], str] = {}
        self.tracer_checked: set[tuple[Any, ...]] = set()
        self.blocked_fn: Blocked | None = None
        self.lock = threading.RLock()
        self.pools: dict[tuple[str, str], Any] = {}
        self.handed_out: list[Any] = []
        self.poison_backend: Backend | None = None
        self.copy_outputs = options.outputs == "copy"
        self.last_new_key: tuple[Any, ...] | None = None
        self.scoped_keys = 0  # keys first called inside a capture scope or reached by an advance (not note_new_key's)
        self.previous_key: tuple[Any, ...] | None = None  # the key of the call before the one on the slow path
        self.last_key: tuple[Any, ...] | None = None  # the key of the previous call (any path)
        self.history = KeyHistory(self.signer)
        self.families = Families()  # captured keys whose graph serves other values of their counters
        self.variants: dict[tuple[Any, ...], list[tuple[Any, ...]]] = {}  # keys for other values of what fn reads
        self.drift: dict[tuple[Any, ...], Drift] = {}  # per key of the arguments: how its read values change
        self.step_feeds: dict[tuple[Any, ...], StepContext | None] = {}  # per key: the hyperparameters fed to its graph
        self.fed: dict[tuple[Any, ...], renewals.Fed] = {}  # per key of the arguments: tensors rebound, fed
        self.init_drops()

    @property
    def traced(self) -> dict[str, Callable[..., Any]]:
        """The traced callables made so far, by framework (empty until the first call traces)."""
        return self.invoker._traced

    # -- helpers --------------------------------------------------------------------------
    def pick_backend(self, sig: CallSignature) -> Backend:
        if sig.backend is not None:
            if self.options.backend != "auto" and sig.backend.name != self.options.backend:
                raise SignatureError(f"{self.name}: backend={self.options.backend!r} but the call passed "
                                     f"{sig.backend.name} tensors ({sig.paths[0]})")
            return sig.backend
        if self.options.backend != "auto":
            return backends.get(self.options.backend)
        present = backends.imported()
        if len(present) == 1:
            return backends.get(present[0])
        raise SignatureError(f"{self.name}: the call passed no tensors, so the framework cannot be told from the "
                             f"arguments ({'both paddle and torch are' if present else 'neither paddle nor torch is'} "
                             "imported); pass backend='paddle' or backend='torch' to graphed()")

    def pool_for(self, backend: Backend, device: str) -> Any:
        if self.options.pool == "private":
            return None
        active = scope_mod.current()
        if active is not None:
            return active.pool_for(backend, device)
        key = (backend.name, device)
        if key not in self.pools:
            self.pools[key] = backend.new_pool(device)
        return self.pools[key]

    def roots(self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[tuple[str, Any]]:
        """What the call can reach (writes are tracked there), dynamic arguments left out: they are per-call
        data (verify copies the current call's own, see capture._written_state)."""
        method = instance is not None
        if self.dynamic is not None:
            args, kwargs, _values = self.dynamic.split(method, args, kwargs)
        return self.invoker.roots(instance, args, kwargs, lambda i: self.signer.short((method, i)))

    def guard_sources(self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Sources:
        """Where the call finds the Python values it reads without receiving them (:mod:`graphjit.guards`)."""
        if self.dynamic is not None:
            args, kwargs, _values = self.dynamic.split(instance is not None, args, kwargs)
        return self.invoker.guard_sources(instance, args, kwargs)

    # -- the call -------------------------------------------------------------------------
    def call(self, wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if instance is _UNBOUND:
            instance = None
        lane = self.lane  # the key replayed last, served in C where the call is its (lane.py)
        if lane is not None:
            result = lane.run(instance, args, kwargs)
            if result is not LANE_MISS:
                return result
        return self.decide(wrapped, instance, args, kwargs)

    def decide(self, wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A call the replay lane did not serve (``lane.front`` calls it directly)."""
        lane = self.lane
        if lane is not None and (lane.hits or lane.raised):
            self.flush_lane()
        if self.gone:  # instances of a graphed method went: their keys go before any call is signed (drops.py)
            self.drop_now()
        settings = env.settings()
        if settings.disable:
            self.stats.disabled_calls += 1
            return wrapped(*args, **kwargs)
        if scope_mod.phase() is not None:  # inside another graphed call's warmup, capture or verify: part of it
            self.stats.nested_calls += 1
            return wrapped(*args, **kwargs)
        self.stats.calls += 1
        if self.handed_out:
            self.poison_previous()
        instance = None if self.prebound else instance
        signer = self.signer
        given = args, kwargs
        args, kwargs = signer.binder.bind(instance is not None, args, kwargs)
        sig = signer.sign_plain(instance, args) if not kwargs and self.dynamic is None else None
        if sig is None:
            try:
                sig = (signer.sign_walk(instance, args, kwargs) if self.dynamic is None  # sign_plain said no
                       else self.sign_dynamic(self.dynamic, instance, args, kwargs))
            except SignatureError:
                if backends.translating():  # a to_static translation re-applied this decorator: not a call
                    return wrapped(*args, **kwargs)
                raise
        previous, self.last_key = self.last_key, sig.key
        entry = self.entries.get(sig.key)
        if entry is not None:
            if previous == sig.key:  # replayed twice in a row: the next calls of the key may take the lane
                if kwargs and lane_mod.module() is None:  # a keyword call: signed by a C walk check first
                    lane_mod.prepare()
                elif self.wants_lane(entry, settings) and as_written(given, args, kwargs):
                    self.arm_lane(entry, sig)
            if entry.feeds is None:
                if entry.check is None and entry.recheck is None:  # nothing to check first: the replay path
                    return self.replay(entry, sig, settings, instance, args, kwargs)
                return self.captured(entry, sig, settings, instance, args, kwargs, previous)
            with self.lock, entry.feeds:  # one call at a time where a step context swaps the step's state
                why = entry.feeds.stale()  # what the graph assumed of the step's parameters (grads.GradLayout)
                if why is not None:
                    return self.fallback(why, entry.inputs.backend, instance, args, kwargs, sig.key)
                return self.captured(entry, sig, settings, instance, args, kwargs, previous)
        if backends.translating():
            return wrapped(*args, **kwargs)
        feeds = self.feeds_of(sig, instance, args, kwargs)
        if feeds is None:
            return self.slow(sig, settings, instance, args, kwargs, previous)
        with self.lock, feeds:
            try:
                return self.slow(sig, settings, instance, args, kwargs, previous)
            finally:
                if feeds.learn():  # the step's state changed (an optimizer made capturable): watch another warmup
                    warm = self.warming.get(sig.key)
                    if warm is not None:
                        warm.calls = min(warm.calls, self.options.warmup - 1)

    def captured(self, entry: KeyEntry, sig: CallSignature, settings: env.Settings, instance: Any,
                 args: tuple[Any, ...], kwargs: dict[str, Any], previous: tuple[Any, ...] | None) -> Any:
        """A call whose key has a graph: replayed while what the function read still holds."""
        if entry.check is not None and not entry.check():
            return self.values_changed(entry, sig, settings, instance, args, kwargs, previous)
        if entry.recheck is not None:
            return self.recheck(entry, sig, instance, args, kwargs)
        return self.replay(entry, sig, settings, instance, args, kwargs)

    def feeds_of(self, sig: CallSignature, instance: Any, args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> StepContext | None:
        """The key's :class:`~graphjit.feeds.StepContext`, made once, at its first call
        (:meth:`Backend.prepare_step`), where CUDA graphs can be captured."""
        try:
            return self.step_feeds[sig.key]
        except KeyError:
            pass
        backend = self.pick_backend(sig)
        device = backend.device_str(sig.tensors[0]) if sig.tensors else "cuda:0"
        step = None
        if backend.graphs_unavailable(device) is None:
            step = backend.prepare_step(self.roots(instance, args, kwargs))
        self.step_feeds[sig.key] = step
        return step

    def sign_dynamic(self, dynamic: DynamicArgs, instance: Any, args: tuple[Any, ...],
                     kwargs: dict[str, Any]) -> CallSignature:
        """The signature of a (bound) call without its dynamic arguments, which it carries as ``sig.dynamic``."""
        plain_args, plain_kwargs, values = dynamic.split(instance is not None, args, kwargs)
        sig = self.signer.sign(instance, plain_args, plain_kwargs)
        sig.dynamic = values
        return sig

    def sign_bound(self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> CallSignature:
        """The signature of a bound call, by the walk (or the plain path's last key), ``dynamic=`` arguments apart."""
        if self.dynamic is None:
            return self.signer.sign(instance, args, kwargs)
        return self.sign_dynamic(self.dynamic, instance, args, kwargs)

    def named_leaves(self, backend: Backend, sig: CallSignature, instance: Any, args: tuple[Any, ...],
                     kwargs: dict[str, Any]) -> dict[Any, str]:
        """The named leaves of a signed call (:func:`graphjit.leaves.leaves`), its ``dynamic=`` arguments left out."""
        method = instance is not None
        if self.dynamic is not None:
            args, kwargs, _values = self.dynamic.split(method, args, kwargs)
        return leaves(backend, sig, instance, instance if method else self.signer.owner, args, kwargs)

    def replay(self, entry: KeyEntry, sig: CallSignature, settings: env.Settings, instance: Any,
               args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        adv = entry.advances  # where this call holds the scalars the replay sets after (advances.py)
        targets = adv.targets(args, kwargs) if adv is not None else None
        if adv is not None and targets is None:
            return self.fallback(advances.LAYOUT, entry.inputs.backend, instance, args, kwargs, sig.key)
        copy, handoff = self.copy_outputs, entry.handoff
        check = not copy and settings.check_outputs
        with self.lock:
            feed = entry.feed  # tensors fed at places the caller rebinds (renewals.py): copied in, and back after
            if feed is not None and not feed.fill(sig.tensors):
                return self.fallback(feed.refused, entry.inputs.backend, instance, args, kwargs, sig.key)
            try:  # the graph's feed nodes take the call's tensors where they can (handoff.py), else copies
                call = (args, kwargs)
                result = handoff.replay(sig.tensors, copy or check, call) if handoff is not None else NOT_SERVED
                if result is NOT_SERVED:
                    result = entry.replay_copies(sig, copy or check, call)
            except InputMoved as moved:
                return self.input_moved(entry, moved, sig, instance, args, kwargs)
            except Exception as exc:
                poisoned = entry.inputs.backend.poisoned
                if poisoned is not None:
                    raise UnrecoverableCaptureError(f"{self.name}: {poisoned}") from exc
                raise
            if feed is not None:
                feed.back()
        if entry.feeds is not None:
            entry.feeds.replayed()
        if adv is not None and targets is not None:  # the Python scalars the call would have advanced
            adv.apply(targets)
        if settings.debug:
            self.debug_replay(entry, sig, result)
        if check:
            self.hand_out(entry, sig, result)
        return result

    def key_stats(self, backend: Backend, sig: CallSignature, args: tuple[Any, ...] = (),
                  kwargs: dict[str, Any] | None = None, instance: Any = None) -> KeyStats:
        """The key's counters, made (with its label, from the call's arguments) at its first call."""
        st = self.stats.keys.get(sig.key)
        if st is not None:
            return st
        method = instance is not None
        kwargs = kwargs or {}
        head, modes = label_parts(self.signer, backend, sig, method, args, kwargs)
        named = self.named_leaves(backend, sig, instance, args, kwargs)
        for path, value in (sig.guarded or {}).items():
            named[("<read>", path)] = value
        with self.lock:
            st = self.stats.keys.get(sig.key)
            if st is None:  # (another thread may have made it meanwhile)
                st = KeyStats(label="", order=key_order(backend, sig))
                self.stats.keys[sig.key] = st
                if instance is not None:
                    self.watch_owner(instance)
                st.label = self.history.add(sig.key, head, modes, named, self.stats.keys)
                self.note_new_key(sig, method)
                if env.settings().debug:
                    log.debug("graphjit %s: new key [%s]", self.name, st.label)
        return st

    def note_previous(self, previous: tuple[Any, ...] | None, sig: CallSignature) -> None:
        """A key still warming up whose call was followed by this call, of another key, says why it has not
        captured yet: where the two signatures differ (its reason and detail in stats() and report(); its calls
        were warmup calls, counted as such, not fallbacks)."""
        if previous is None or previous == sig.key or previous in self.entries:
            return
        st = self.stats.keys.get(previous)
        if st is None or st.state is not State.WARMUP or st.reason is not None or not st.warmups:
            return
        st.reason, st.detail = self.history.explain(previous, sig.key, self.options.warmup)

    def called_again(self, st: KeyStats) -> None:
        """A key said to be left behind by a signature change is called again: it is warming up after all."""
        st.reason = st.detail = None

    def note_new_key(self, sig: CallSignature, method: bool) -> None:
        """Warn once when most calls make a new key, naming the argument that changed last (keys made in a capture
        scope do not count: capturing many signatures ahead of time is what a scope is for)."""
        before, self.last_new_key = self.last_new_key, sig.key
        if scope_mod.current() is not None or self.advanced(self.previous_key):
            self.scoped_keys += 1
            return
        made = len(self.stats.keys) - self.scoped_keys
        if before is None or made < NEW_KEY_WARNING_AFTER or 2 * made <= self.stats.calls:
            return
        what = (self.history.changed(before, sig.key) or changed_argument(self.signer, method, before, sig.key)
                or "an argument")
        self.say_once(logging.WARNING, "new-keys", "graphjit %s: %d input signatures in %d calls; %s changes from "
                      "call to call. Each new signature runs its warmup calls eagerly and is captured on its own "
                      "(max_graphs=%d): pass values that change as tensors, or pad varying dims with buckets=",
                      self.name, made, self.stats.calls, what, self.max_graphs())

    def slow(self, sig: CallSignature, settings: env.Settings, instance: Any, args: tuple[Any, ...],
             kwargs: dict[str, Any], previous: tuple[Any, ...] | None = None) -> Any:
        """A call whose key has no graph: fall back, warm up, or capture (one screen: the decision)."""
        self.previous_key = previous
        backend = self.pick_backend(sig)
        if backend.poisoned is not None:
            raise UnrecoverableCaptureError(f"{self.name}: {backend.poisoned}")
        if self.families.items and (served := self.family_call(backend, sig, settings, instance, args, kwargs,
                                                               previous)) is not NOT_MEMBER:
            return served  # a counter's other value, in a class whose graph serves it (families.py)
        st = self.key_stats(backend, sig, args, kwargs, instance=instance)
        with self.lock:
            self.note_previous(previous, sig)
            if st.state is State.WARMUP and st.reason is not None and st.reason.startswith(SIGNATURE_CHANGES):
                self.called_again(st)
        if sig.overflow is not None:  # a bad call on every machine, so checked before the no-CUDA fallback
            if self.strict():
                raise BucketOverflowError(f"{self.name}: {sig.overflow} (strict mode)")
            self.say_once(logging.WARNING, "overflow:" + sig.overflow, "graphjit %s: %s; running uncaptured",
                          self.name, sig.overflow)
            return self.uncaptured("larger than every bucket", sig.overflow, backend, sig, instance, args, kwargs)
        failed = self.failed.get(sig.key)
        if failed is not None:
            if st.state is State.NEW:  # a key of a counter's class whose shared warmup failed (families.py)
                st.state, st.reason = State.FALLBACK, failed
            return self.fallback(failed, backend, instance, args, kwargs, sig.key)
        device = self.device_of(backend, sig, instance, args, kwargs)
        if not isinstance(device, str):
            return device.result
        with self.lock:
            entry = self.entries.get(sig.key)
            if entry is not None:  # another thread captured this key meanwhile: replayed only where its guards hold
                return self.captured(entry, sig, settings, instance, args, kwargs, previous)
            if self.blocked_fn is not None:
                st = self.key_stats(backend, sig)
                st.state, st.reason, st.detail = State.FALLBACK, self.blocked_fn.reason, self.blocked_fn.message
                return self.fallback(self.blocked_fn.reason, backend, instance, args, kwargs, sig.key)
            warm = self.warming.get(sig.key)
            if warm is None:
                if (why := self.graphs_full()) is not None:
                    return self.uncaptured("max_graphs reached", why, backend, sig, instance, args, kwargs)
                shares = previous is not None and sig.base is None and not sig.dynamic and self.dynamic is None \
                    and self.step_feeds.get(previous) is None
                taken = shares and self.families.take_over(self.warming, self.history.records, self.stats.keys,
                                                           previous, sig, args, kwargs, backend, self.own_run_fits)
                if isinstance(taken, str):  # the previous value of its counter's class failed (families.py)
                    return self.class_failed(taken, backend, sig, st, instance, args, kwargs)
                warm = taken or self.new_warmup(sig.key)
            if scope_mod.current() is not None or warm.calls >= self.options.warmup:
                if (why := self.graphs_full()) is not None:  # keys warming side by side: each began below the limit
                    self.warming.pop(sig.key, None)
                    return self.uncaptured("max_graphs reached", why, backend, sig, instance, args, kwargs)
                return self.capture_key(backend, device, sig, warm, instance, args, kwargs,
                                        self.families.moved if warm.advances is not None else frozenset())
            return self.warm_call(backend, device, sig, warm, instance, args, kwargs)

    def graphs_full(self) -> str | None:
        """Why a new key may not warm up or capture (``max_graphs`` graphs captured; said once), else None."""
        graphs = len({id(e) for e in self.entries.values()})
        if not self.over_key_limit(graphs, "graphs", "use buckets= to pad dims to fewer sizes, or raise max_graphs"):
            return None
        return (f"{graphs} graphs are already captured (max_graphs={self.max_graphs()}): use buckets= to pad dims to "
                "fewer sizes, pass changing values as tensors, or raise max_graphs")

    def device_of(self, backend: Backend, sig: CallSignature, instance: Any, args: tuple[Any, ...],
                  kwargs: dict[str, Any]) -> str | _Ran:
        """The one device of the call's tensors; or, where no graph can be captured for the call, the
        result of running it uncaptured (counted under its reason)."""
        if (why := backend.unstrided_input(sig.tensors, sig.paths)) is not None:
            self.say_once(logging.WARNING, "unstrided", "graphjit %s: %s; running uncaptured", self.name, why)
            return _Ran(self.uncaptured("an input is not a strided tensor", why, backend, sig, instance, args, kwargs))
        devices = sorted({backend.device_str(t) for t in sig.tensors})
        if len(devices) > 1:
            reason = f"inputs on several devices ({', '.join(devices)})"
            first = {backend.device_str(t): path for t, path in reversed(list(zip(sig.tensors, sig.paths)))}
            where = ", ".join(f"{path} is on {device}" for device, path in sorted(first.items()))
            why = (f"{where}; a CUDA graph runs on one device: put every tensor the call passes on one device (a "
                   "cache's counters too; a cache may move them at its first update)")
            self.say_once(logging.WARNING, reason, "graphjit %s: %s (%s); running uncaptured", self.name, reason, where)
            return _Ran(self.uncaptured(reason, why, backend, sig, instance, args, kwargs))
        device = devices[0] if devices else ("cuda:0" if backend.graphs_unavailable("cuda:0") is None else "cpu")
        unavailable = backend.graphs_unavailable(device)
        if unavailable is None:
            return device
        self.say_once(logging.INFO, "nocuda:" + unavailable, "graphjit %s: no CUDA graph (%s); running the %s %s "
                      "function", self.name, unavailable, backend.name, self.invoker.tracer_name(backend))
        reason = "no CUDA graphs: " + unavailable
        with self.lock:
            st = self.key_stats(backend, sig)
            st.state, st.reason = State.EAGER, reason
            self.failed[sig.key] = reason
        if (active := scope_mod.current()) is not None:
            active.note_uncaptured(reason)
        return _Ran(self.fallback(reason, backend, instance, args, kwargs, sig.key, device))

    def new_warmup(self, key: tuple[Any, ...]) -> Warmup:
        """A warmup record for a new key; the oldest records go once there are many (keys that never
        reach their capture: a value that changes on every call)."""
        limit = max(64, 2 * self.max_graphs())
        while len(self.warming) >= limit:
            self.warming.pop(next(iter(self.warming)))
        warm = self.warming[key] = Warmup()
        return warm

    def static_inputs(self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        instance = None if self.prebound else instance
        method = instance is not None
        args, kwargs = self.signer.binder.bind(method, args, kwargs)
        dynamic = self.dynamic
        sig = self.sign_bound(instance, args, kwargs)
        entry = self.entries.get(sig.key)
        if entry is None:
            raise GraphjitError(f"{self.name}: {self.no_graph_yet(sig.key)}")
        b = entry.inputs.backend
        is_tensor: Callable[[Any], bool] = lambda x: isinstance(x, b.tensor_types())  # noqa: E731
        if dynamic is None:
            return rebuild_call(args, kwargs, entry.inputs.statics, is_tensor)
        plain_args, plain_kwargs, values = dynamic.split(method, args, kwargs)  # handed back as they are
        return dynamic.merge(method, *rebuild_call(plain_args, plain_kwargs, entry.inputs.statics, is_tensor), values)

class BoundGraphedFunction(KeepsWrapped, wrapt.BoundFunctionWrapper):  # type: ignore[misc]
    """A graphed method bound to an instance; ``stats()``/``reset()`` act on the whole function."""

    def stats(self) -> dict[str, Any]:
        return self._self_parent.stats()

    def reset(self) -> None:
        self._self_parent.reset()

    def report(self) -> str:
        return self._self_parent.report()

    def static_inputs(self, *args: Any, **kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return self._self_parent._self_state.static_inputs(self._self_instance, args, kwargs)


class GraphedFunction(KeepsWrapped, wrapt.FunctionWrapper):  # type: ignore[misc]
    """The object ``@graphed`` returns: calls like the function, plus :meth:`stats` and :meth:`reset`.

    Name, docstring, signature and method binding of the wrapped function are kept (wrapt)."""

    __bound_function_wrapper__ = BoundGraphedFunction

    def __init__(self, wrapped: Callable[..., Any], options: Options) -> None:
        state = _State(wrapped, options)
        super().__init__(wrapped, lane_mod.front(state, _UNBOUND))
        # An unbound call's instance is ours, not None: for None, wrapt looks up the wrapped function's __self__ on
        # every call (an AttributeError raised and caught, 0.3 us of a call's host time on a development CPU).
        super(wrapt.FunctionWrapper, self).__init__(  # type: ignore[call-arg]
            wrapped, _UNBOUND, self._self_wrapper, None, self._self_binding)
        self._self_state = state

    def stats(self) -> dict[str, Any]:
        """Counters per key: state, captures, replays, fallbacks and their reasons, capture ms, pool bytes."""
        self._self_state.drop_now()
        return self._self_state.stats.as_dict()

    def report(self) -> str:
        """:meth:`stats` as a short table."""
        self._self_state.drop_now()
        return self._self_state.stats.report()

    def reset(self) -> None:
        """Drop every captured graph and fallback decision (call after replacing weights)."""
        self._self_state.reset()

    def static_inputs(self, *args: Any, **kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The graph's own input buffers for a call like ``fn(*args, **kwargs)``, as ``(args, kwargs)``.

        Write the next call's data into these tensors and call the function with them: an input
        already at its static address is not copied (the zero-copy path for decode loops, like the
        persistent input buffers of vLLM's model runner).  Buffers of bucketed arguments have the
        padded size.  A buffer is dense: contiguous, or transposed or channels-last where the key's tensor is; a key
        made by a slice or an expansion (graphjit/layouts.py's ``strided``) has contiguous buffers, which are another
        key's layout: pass such an argument contiguous for the zero-copy path.  Raises ``GraphjitError`` if no graph is
        captured for this signature yet."""
        return self._self_state.static_inputs(None, args, kwargs)

    @property
    def graphjit_options(self) -> Options:
        return self._self_state.options


@overload
def graphed(fn: F, *, backend: str = ..., tracer: str = ..., buckets: BucketsArg = ..., warmup: int = ...,
            max_graphs: int | None = ..., outputs: str = ..., verify: bool | None = ..., pool: str = ...,
            strict: bool | None = ..., dynamic: tuple[str, ...] = ...) -> F: ...


@overload
def graphed(fn: None = None, *, backend: str = ..., tracer: str = ..., buckets: BucketsArg = ..., warmup: int = ...,
            max_graphs: int | None = ..., outputs: str = ..., verify: bool | None = ..., pool: str = ...,
            strict: bool | None = ..., dynamic: tuple[str, ...] = ...) -> Callable[[F], F]: ...


def graphed(fn: Callable[..., Any] | None = None, /, **options: Any) -> Any:
    options_ = make_options(options)
    if fn is None:
        return functools.partial(_decorate, options=options_)
    return _decorate(fn, options_)


graphed.__doc__ = GRAPHED_DOC


def _decorate(fn: Callable[..., Any], options: Options) -> GraphedFunction:
    check_callable(fn, (GraphedFunction, BoundGraphedFunction))
    backends.shield_from_compilers()
    return GraphedFunction(fn, options)
