"""``@graphjit.graphed``: trace, key, warm up, capture, verify and replay a function.

See ``ARCHITECTURE.md`` for the semantics.  In short: each distinct input signature (see
:mod:`graphjit.keys`) gets its own CUDA graph, captured at its first call (inside
``capture_scope()`` if one is active) and replayed afterwards.  Anything that cannot be graphed runs
the traced function instead, and the reason is counted in :meth:`GraphedFunction.stats` and logged
once; ``strict=True`` (or ``GRAPHJIT_STRICT=1``) raises instead.

Restrictions (as for any CUDA graph):

* Tensors the function closes over (weights, caches held as attributes) are captured by address.
  After replacing them (loading new weights, say) call :meth:`GraphedFunction.reset`.
* Python side effects and Python values computed inside the function run only during warmup and
  capture; a replay re-runs the GPU work only.  ``verify`` catches outputs that depend on them.
* The function must not synchronise the CPU with the GPU (``.item()``, ``.numpy()``, printing a
  tensor); such a key falls back with that reason.
* Graphs capture inference: a key whose outputs require grad runs uncaptured (use
  :func:`graphjit.graphed_layer` for training).
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, overload

import wrapt

from . import backends, env, reach
from . import scope as scope_mod
from .backends.base import Backend
from .buffers import InputMoved
from .capture import BuildRequest, KeyEntry, build
from .errors import (
    BackendError,
    BucketOverflowError,
    CaptureError,
    ConfigError,
    GraphjitError,
    SignatureError,
    TracerError,
    UnrecoverableCaptureError,
)
from .keys import BucketsArg, CallSignature, Signer, rebuild_call
from .stats import FunctionStats, KeyStats, State
from .tree import collect_tensors
from .warmup import Blocked, Warmup, watched_call
from .writes import Snapshot

log = logging.getLogger("graphjit")

F = TypeVar("F", bound=Callable[..., Any])

BACKENDS = ("auto", "paddle", "torch")
TRACERS = ("auto", "sot", "ast", "eager", "compile")
OUTPUTS = ("copy", "alias")
POOLS = ("shared", "private")
DEFAULT_MAX_GRAPHS = 64
FUNCTION_WIDE = frozenset(("rebinds a tensor held by an object", "adds tensors to an object on every call"))
"""Reasons that hold for every key of the function once seen (a cache that grows makes a new key per call)."""


@dataclass(frozen=True)
class Options:
    """The validated options of one graphed function."""

    backend: str = "auto"
    tracer: str = "auto"
    buckets: BucketsArg = None
    warmup: int = 2
    max_graphs: int | None = None
    outputs: str = "copy"
    verify: bool | None = None
    pool: str = "shared"
    strict: bool | None = None


def _check_choice(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if not isinstance(value, str) or value not in allowed:
        raise ConfigError(f"{name}={value!r}: expected one of {', '.join(repr(a) for a in allowed)}")


def _validate(o: Options) -> None:
    _check_choice("backend", o.backend, BACKENDS)
    _check_choice("tracer", o.tracer, TRACERS)
    _check_choice("outputs", o.outputs, OUTPUTS)
    _check_choice("pool", o.pool, POOLS)
    if isinstance(o.warmup, bool) or not isinstance(o.warmup, int) or o.warmup < 1:
        raise ConfigError(f"warmup={o.warmup!r}: expected an integer >= 1 (graphjit needs one eager run to find "
                          "in-place mutations and to verify the capture)")
    if o.max_graphs is not None and (isinstance(o.max_graphs, bool) or not isinstance(o.max_graphs, int)
                                     or o.max_graphs < 1):
        raise ConfigError(f"max_graphs={o.max_graphs!r}: expected an integer >= 1 or None")
    for name in ("verify", "strict"):
        value = getattr(o, name)
        if value is not None and not isinstance(value, bool):
            raise ConfigError(f"{name}={value!r}: expected True, False or None (None: from GRAPHJIT_{name.upper()})")
    if o.backend == "paddle" and o.tracer == "compile":
        raise ConfigError("tracer='compile' is a torch tracer; paddle tracers are 'sot', 'ast' and 'eager'")
    if o.backend == "torch" and o.tracer in ("sot", "ast"):
        raise ConfigError(f"tracer={o.tracer!r} is a paddle tracer; torch tracers are 'eager' and 'compile'")


@dataclass(frozen=True)
class _Ran:
    """The result of a call that already ran uncaptured (see :meth:`_State.device_of`)."""

    result: Any


class _State:
    """Per-function state: options, keys, graphs, stats.  Shared by every binding of the wrapper."""

    def __init__(self, fn: Callable[..., Any], options: Options) -> None:
        self.fn = fn
        self.options = options
        self.name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
        self.signer = Signer(fn, options.buckets, options.backend, self.name)
        self.stats = FunctionStats(self.name)
        self.entries: dict[tuple[Any, ...], KeyEntry] = {}
        self.warming: dict[tuple[Any, ...], Warmup] = {}
        self.failed: dict[tuple[Any, ...], str] = {}
        self.blocked_fn: Blocked | None = None
        self.lock = threading.RLock()
        self.traced: dict[str, Callable[..., Any]] = {}
        self.pools: dict[tuple[str, str], Any] = {}
        self.said: set[str] = set()
        self.handed_out: list[Any] = []
        self.poison_backend: Backend | None = None
        self.copy_outputs = options.outputs == "copy"
        # A Layer/Module instance is traced through its class's forward (to_static must not replace
        # the instance's forward); a plain callable object through itself.
        self.self_call: Any = None
        if not inspect.isfunction(fn) and not inspect.ismethod(fn) and hasattr(type(fn), "forward"):
            self.self_call = fn

    # -- helpers --------------------------------------------------------------------------
    def say_once(self, level: int, topic: str, msg: str, *args: Any) -> None:
        if topic not in self.said:
            self.said.add(topic)
            log.log(level, msg, *args)

    def strict(self) -> bool:
        return env.settings().strict if self.options.strict is None else self.options.strict

    def verify(self) -> bool:
        return env.settings().verify if self.options.verify is None else self.options.verify

    def max_graphs(self) -> int:
        if self.options.max_graphs is not None:
            return self.options.max_graphs
        from_env = env.settings().max_graphs
        return DEFAULT_MAX_GRAPHS if from_env is None else from_env

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

    def tracer_name(self, backend: Backend) -> str:
        tracer = self.options.tracer
        if tracer == "auto":
            return backend.default_tracer
        if tracer not in backend.tracers:
            raise BackendError(f"{self.name}: tracer={tracer!r} does not apply to {backend.name} tensors; "
                               f"{backend.name} tracers are {', '.join(backend.tracers)}")
        return tracer

    def traced_for(self, backend: Backend) -> Callable[..., Any]:
        """The traced callable (created at the first call, never at decoration)."""
        t = self.traced.get(backend.name)
        if t is None:
            with self.lock:
                t = self.traced.get(backend.name)
                if t is None:
                    target = type(self.self_call).forward if self.self_call is not None else self.fn
                    t = backend.trace(target, self.tracer_name(backend))
                    self.traced[backend.name] = t
                    if env.settings().debug:
                        log.debug("graphjit %s: traced with %s/%s", self.name, backend.name, self.tracer_name(backend))
        return t

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

    def label(self, backend: Backend, sig: CallSignature) -> str:
        parts = []
        for label, t in zip(sig.labels, sig.tensors):
            parts.append(f"{self.signer.short(label)}{list(backend.shape(t))}")
        pads = {p.leaf: p for p in sig.pads}
        for leaf, p in pads.items():
            parts[leaf] += f"->{p.dim}:{p.padded}"
        if sig.tensors:
            meta = backend.meta_key(sig.tensors[0])
            dtype = str(meta[1]).replace("paddle.", "").replace("torch.", "")
            parts.append(f"{dtype}@{backend.device_str(sig.tensors[0])}")
        others = len(sig.key) - 2 - len(sig.tensors)
        if others > 0:
            parts.append(f"+{others} non-tensor")
        modes = backend.describe_modes(sig.key[-1][1]) if sig.backend is not None else ""
        if modes:
            parts.append(modes)
        return " ".join(parts) if parts else "()"

    # -- the call -------------------------------------------------------------------------
    def call(self, wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        settings = env.settings()
        if settings.disable:
            self.stats.disabled_calls += 1
            return wrapped(*args, **kwargs)
        self.stats.calls += 1
        if self.handed_out:
            self.poison_previous()
        try:
            sig = self.signer.sign(instance, args, kwargs)
        except SignatureError:
            if backends.translating():  # a to_static translation re-applied this decorator: not a call
                return wrapped(*args, **kwargs)
            raise
        entry = self.entries.get(sig.key)
        if entry is not None:
            return self.replay(entry, sig, settings, instance, args, kwargs)
        if backends.translating():
            return wrapped(*args, **kwargs)
        return self.slow(sig, settings, instance, args, kwargs)

    def replay(self, entry: KeyEntry, sig: CallSignature, settings: env.Settings, instance: Any,
               args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        copy = self.copy_outputs
        check = not copy and settings.check_outputs
        with self.lock:
            try:
                result = entry.replay(sig, copy or check)
            except InputMoved as moved:
                return self.recapture(entry, moved.leaf, sig, instance, args, kwargs)
            except Exception as exc:
                poisoned = entry.inputs.backend.poisoned
                if poisoned is not None:
                    raise UnrecoverableCaptureError(f"{self.name}: {poisoned}") from exc
                raise
        if settings.debug:
            self.debug_replay(entry, sig, result)
        if check:
            self.hand_out(entry, result)
        return result

    def bind(self, fn: Callable[..., Any], instance: Any) -> Callable[..., Any]:
        """``fn`` bound to the instance of a method call (or to the graphed Layer/Module object).

        The tracer wraps the unbound function once; binding goes through the descriptor protocol, as
        Python binds methods (Paddle's StaticFunction caches one translation per instance there).
        """
        owner = self.self_call if self.self_call is not None else instance
        if owner is None:
            return fn
        return fn.__get__(owner, type(owner))  # type: ignore[no-any-return]

    def run_traced(self, backend: Backend, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        fn = self.bind(self.traced_for(backend), instance)
        try:
            with backend.traced_call_guard():  # Paddle's translators are not thread-safe
                return fn(*args, **kwargs)
        except Exception as exc:
            why = backend.tracer_failure(exc)
            if why is None:
                raise  # the function's own error
            tracer = self.tracer_name(backend)
            raise TracerError(
                f"{self.name}: the {backend.name} tracer {tracer!r} failed inside itself ({why}); this is a "
                f"limitation of {backend.name}'s {tracer}, not of graphjit's capture: use "
                "@graphjit.graphed(tracer=\"eager\") (still captured into a CUDA graph) or tracer=\"ast\"") from exc

    def fallback(self, reason: str, backend: Backend, instance: Any, args: tuple[Any, ...],
                 kwargs: dict[str, Any], key: tuple[Any, ...] | None = None) -> Any:
        """Run the traced function uncaptured, counted under ``reason`` (and under the key, if any)."""
        self.stats.fallback(reason)
        if key is not None:
            st = self.stats.keys.get(key)
            if st is not None:
                st.uncaptured += 1
        return self.run_traced(backend, instance, args, kwargs)

    def key_stats(self, backend: Backend, sig: CallSignature) -> KeyStats:
        st = self.stats.keys.get(sig.key)
        if st is None:
            st = KeyStats(label=self.label(backend, sig))
            self.stats.keys[sig.key] = st
        return st

    def slow(self, sig: CallSignature, settings: env.Settings, instance: Any, args: tuple[Any, ...],
             kwargs: dict[str, Any]) -> Any:
        """A call whose key has no graph: fall back, warm up, or capture (one screen: the decision)."""
        backend = self.pick_backend(sig)
        if backend.poisoned is not None:
            raise UnrecoverableCaptureError(f"{self.name}: {backend.poisoned}")
        if sig.overflow is not None:  # a bad call on every machine, so checked before the no-CUDA fallback
            if self.strict():
                raise BucketOverflowError(f"{self.name}: {sig.overflow} (strict mode)")
            self.say_once(logging.WARNING, "overflow:" + sig.overflow, "graphjit %s: %s; running uncaptured",
                          self.name, sig.overflow)
            return self.fallback("larger than every bucket", backend, instance, args, kwargs)
        failed = self.failed.get(sig.key)
        if failed is not None:
            return self.fallback(failed, backend, instance, args, kwargs, sig.key)
        device = self.device_of(backend, sig, instance, args, kwargs)
        if not isinstance(device, str):
            return device.result
        with self.lock:
            entry = self.entries.get(sig.key)
            if entry is not None:  # another thread captured this key meanwhile
                return self.replay(entry, sig, settings, instance, args, kwargs)
            if self.blocked_fn is not None:
                st = self.key_stats(backend, sig)
                st.state, st.reason, st.detail = State.FALLBACK, self.blocked_fn.reason, self.blocked_fn.message
                return self.fallback(self.blocked_fn.reason, backend, instance, args, kwargs, sig.key)
            warm = self.warming.get(sig.key)
            if warm is None:
                if len(self.entries) >= self.max_graphs():
                    msg = (f"max_graphs={self.max_graphs()} graphs already captured; new input signatures run "
                           "uncaptured (use buckets= to pad dims to fewer sizes, or raise max_graphs)")
                    if self.strict():
                        raise CaptureError(f"{self.name}: {msg}", reason="max_graphs reached")
                    self.say_once(logging.WARNING, "max_graphs", "graphjit %s: %s", self.name, msg)
                    return self.fallback("max_graphs reached", backend, instance, args, kwargs)
                warm = self.new_warmup(sig.key)
            if scope_mod.current() is not None or warm.calls >= self.options.warmup:
                return self.capture_key(backend, device, sig, warm, instance, args, kwargs, frozenset())
            return self.warm_call(backend, device, sig, warm, instance, args, kwargs)

    def device_of(self, backend: Backend, sig: CallSignature, instance: Any, args: tuple[Any, ...],
                  kwargs: dict[str, Any]) -> str | _Ran:
        """The one device of the call's tensors; or, where no graph can be captured for the call, the
        result of running it uncaptured (counted under its reason)."""
        devices = sorted({backend.device_str(t) for t in sig.tensors})
        if len(devices) > 1:
            reason = f"inputs on several devices ({', '.join(devices)})"
            self.say_once(logging.WARNING, reason, "graphjit %s: %s; running uncaptured", self.name, reason)
            return _Ran(self.fallback(reason, backend, instance, args, kwargs))
        device = devices[0] if devices else ("cuda:0" if backend.graphs_unavailable("cuda:0") is None else "cpu")
        unavailable = backend.graphs_unavailable(device)
        if unavailable is None:
            return device
        self.say_once(logging.INFO, "nocuda:" + unavailable, "graphjit %s: no CUDA graph (%s); running the %s %s "
                      "function", self.name, unavailable, backend.name, self.tracer_name(backend))
        reason = "no CUDA graphs: " + unavailable
        with self.lock:
            st = self.key_stats(backend, sig)
            st.state, st.reason = State.EAGER, reason
            self.failed[sig.key] = reason
        return _Ran(self.fallback(reason, backend, instance, args, kwargs, sig.key))

    def new_warmup(self, key: tuple[Any, ...]) -> Warmup:
        """A warmup record for a new key; the oldest records go once there are many (keys that never
        reach their capture: a value that changes on every call)."""
        limit = max(64, 2 * self.max_graphs())
        while len(self.warming) >= limit:
            self.warming.pop(next(iter(self.warming)))
        warm = self.warming[key] = Warmup()
        return warm

    def roots(self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[tuple[str, Any]]:
        """Where the call may find the state it writes (:func:`graphjit.reach.roots`)."""
        method = instance is not None
        pairs = [(f"argument {self.signer.short((method, i))!r}", a) for i, a in enumerate(args)]
        pairs += [(f"argument {k!r}", v) for k, v in kwargs.items()]
        if self.self_call is not None:
            return reach.roots(type(self.self_call).forward, self.self_call, pairs)
        return reach.roots(self.fn, instance, pairs)

    def watched(self, backend: Backend, device: str, sig: CallSignature, warm: Warmup, instance: Any,
                args: tuple[Any, ...], kwargs: dict[str, Any], sync_watch: bool) -> Any:
        """One eager run of the function as a warmup, observed (:func:`graphjit.warmup.watched_call`).

        ``sync_watch``: also look for CPU-GPU syncs (the last warmup run before a capture; not the first
        of several, in which tracers translate and compilers may synchronise for themselves)."""
        st = self.key_stats(backend, sig)
        st.state = State.WARMUP
        with scope_mod.graphed_call("warmup"):
            out, obs = watched_call(backend, lambda: self.run_traced(backend, instance, args, kwargs),
                                    self.roots(instance, args, kwargs), device, env.settings().verify_max_bytes,
                                    sync_watch=sync_watch)
        warm.sync_watched = warm.sync_watched or sync_watch
        warm.note(obs, backend, out, sig.tensors)
        st.warmups += 1
        if env.settings().debug:
            log.debug("graphjit %s [%s]: warmup %d/%d wrote %s%s", self.name, st.label, warm.calls,
                      self.options.warmup, [reach.describe(p) for _t, p in obs.written] or "nothing",
                      f"; blocked: {warm.blocked.reason}" if warm.blocked else "")
        return out

    def warm_call(self, backend: Backend, device: str, sig: CallSignature, warm: Warmup, instance: Any,
                  args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A warmup call: the function runs once, eagerly, and that is the call's result."""
        last = warm.calls + 1 >= self.options.warmup
        out = self.watched(backend, device, sig, warm, instance, args, kwargs, sync_watch=last)
        if warm.blocked is not None:
            self.block(backend, sig, warm.blocked, out)
        return out

    def block(self, backend: Backend, sig: CallSignature, blocked: Blocked, result: Any) -> None:
        """The key runs uncaptured from now on (``result``: of the call that found out)."""
        st = self.key_stats(backend, sig)
        self.failed[sig.key] = blocked.reason
        self.warming.pop(sig.key, None)
        st.state, st.reason, st.detail = State.FALLBACK, blocked.reason, blocked.message
        self.stats.fallback(blocked.reason)  # this call ran eagerly too, and no graph will follow
        st.uncaptured += 1
        if blocked.reason in FUNCTION_WIDE:
            self.blocked_fn = blocked
        active = scope_mod.current()
        if active is not None:
            active.note_capture(self.name, st.label, 0.0, ok=False, reason=blocked.reason)
        if self.strict():
            raise CaptureError(f"{self.name} [{st.label}]: {blocked.message} (strict mode)",
                               reason=blocked.reason).after_run(result)
        self.say_once(logging.WARNING, "fail:" + blocked.reason, "graphjit %s [%s]: %s; running uncaptured",
                      self.name, st.label, blocked.message)

    def extra_warmups(self, backend: Backend, device: str, sig: CallSignature, warm: Warmup, count: int,
                      instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Inside a capture scope: ``count`` more warmup runs after the call's own, each undone (the state
        it writes and the generator put back), so that the call still acts like one eager call."""
        written = [t for t, _p in warm.written_tensors()] + [sig.tensors[i] for i in sorted(warm.mutated_leaves)]
        nbytes = sum(backend.nbytes(t) for t in written)
        if nbytes > env.settings().verify_max_bytes or warm.untracked is not None:
            return  # cannot undo them: capture after the call's own run
        snap = Snapshot(backend, written, device)
        known = {id(t) for t in written}
        for k in range(count):
            self.watched(backend, device, sig, warm, instance, args, kwargs, sync_watch=k == count - 1)
            snap.restore()
            new = [p for t, p in warm.written_tensors() if id(t) not in known]
            if new and warm.blocked is None:
                warm.blocked = Blocked("writes different tensors on different calls",
                                       f"a warmup run wrote {reach.describe(new[0])}, which the call's own run did not "
                                       "write; graphjit cannot undo that run there")
            if warm.blocked is not None:
                return

    def capture_key(self, backend: Backend, device: str, sig: CallSignature, warm: Warmup, instance: Any,
                    args: tuple[Any, ...], kwargs: dict[str, Any], no_adopt: frozenset[int]) -> Any:
        """The call that captures: after the key's warmup calls (the result comes from the first replay),
        or the first call of the key inside a capture scope (the result is the call's own eager run)."""
        settings = env.settings()
        st = self.key_stats(backend, sig)
        scope_run = scope_mod.current() is not None and warm.calls < self.options.warmup
        own: Any = None
        if scope_run:
            own = self.watched(backend, device, sig, warm, instance, args, kwargs,
                               sync_watch=warm.calls + 1 >= self.options.warmup)
            if warm.blocked is None and warm.calls < self.options.warmup:
                self.extra_warmups(backend, device, sig, warm, self.options.warmup - warm.calls, instance, args,
                                   kwargs)
            if warm.blocked is None and not warm.sync_watched and not backend.captures_recoverable:
                warm.blocked = Blocked("no sync-checked warmup", f"{backend.name} cannot recover from a capture that a "
                                       "CPU-GPU sync breaks, and the extra warmup run that checks for syncs could not "
                                       "be undone (see GRAPHJIT_VERIFY_MAX_BYTES); call it once before the capture "
                                       "scope, or raise the limit")
            if warm.blocked is not None:
                self.block(backend, sig, warm.blocked, own)
                return own
        st.state_bytes = (sum(backend.nbytes(t) for t, _p in warm.written_tensors())
                          + sum(backend.nbytes(sig.tensors[i]) for i in warm.mutated_leaves))
        traced = self.traced_for(backend)
        original = type(self.self_call).forward if self.self_call is not None else self.fn
        capture_fn = backend.capture_callable(traced, original, self.tracer_name(backend))
        req = BuildRequest(
            fn_name=self.name, backend=backend, device=device, traced=self.bind(traced, instance),
            capture_fn=self.bind(capture_fn, instance), args=args, kwargs=kwargs, sig=sig, stats=st, warm=warm,
            roots=lambda: self.roots(instance, args, kwargs), verify=self.verify(),
            verify_budget=settings.verify_max_bytes, replay_result=not scope_run,
            copy_outputs=self.options.outputs == "copy" or settings.check_outputs,
            pool=self.pool_for(backend, device), dump_dir=settings.dump_dir, debug=settings.debug,
            no_adopt=no_adopt)
        active = scope_mod.current()
        try:
            entry, result = build(req)
        except CaptureError as exc:
            return self.capture_failed(exc, backend, sig, st, own if scope_run else None, scope_run, instance, args,
                                       kwargs)
        self.warming.pop(sig.key, None)
        self.entries[sig.key] = entry
        if st.verify is not None and st.verify.startswith("skipped"):
            self.stats.verify_skipped[st.verify.split(": ", 1)[-1]] += 1
            self.say_once(logging.INFO, "verify-skip:" + st.verify, "graphjit %s [%s]: captured without verify (%s)",
                          self.name, st.label, st.verify)
        if active is not None:
            active.note_capture(self.name, st.label, st.capture_ms, ok=True)
        if scope_run:
            return own
        if settings.check_outputs and self.options.outputs == "alias":
            self.hand_out(entry, result)
        return result

    def capture_failed(self, exc: CaptureError, backend: Backend, sig: CallSignature, st: KeyStats, own: Any,
                       scope_run: bool, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The key's capture or verify failed: it runs uncaptured from now on; this call's result is its
        one eager execution (already run, or run now)."""
        self.failed[sig.key] = exc.reason
        self.warming.pop(sig.key, None)
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

    def recapture(self, entry: KeyEntry, leaf: int, sig: CallSignature, instance: Any, args: tuple[Any, ...],
                  kwargs: dict[str, Any]) -> Any:
        backend = entry.inputs.backend
        path = sig.paths[leaf] if leaf < len(sig.paths) else f"input {leaf}"
        self.say_once(logging.INFO, f"moved:{leaf}",
                      "graphjit %s: %s is updated in place and arrived at a new address; recapturing with a "
                      "graphjit-owned buffer that is copied in and back each call (pass the same tensor every "
                      "call to avoid the copies)", self.name, path)
        del self.entries[sig.key]
        entry.release()
        entry.stats.reason = f"recaptured: {path} moved"
        device = backend.device_str(sig.tensors[0])
        return self.capture_key(backend, device, sig, entry.warm, instance, args, kwargs, entry.no_adopt | {leaf})

    def static_inputs(self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        sig = self.signer.sign(instance, args, kwargs)
        entry = self.entries.get(sig.key)
        if entry is None:
            raise GraphjitError(f"{self.name}: no graph is captured for these arguments yet; call the function once "
                                "with them (or inside graphjit.capture_scope()) first")
        b = entry.inputs.backend
        return rebuild_call(args, kwargs, entry.inputs.statics, lambda x: isinstance(x, b.tensor_types()))

    def hand_out(self, entry: KeyEntry, result: Any) -> None:
        b = entry.inputs.backend
        self.poison_backend = b
        types = b.tensor_types()
        self.handed_out = collect_tensors(result, lambda x: isinstance(x, types))

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

    def reset(self) -> None:
        with self.lock:
            for e in self.entries.values():
                e.release()
            self.entries.clear()
            self.warming.clear()
            self.blocked_fn = None
            self.failed.clear()
            self.stats.keys.clear()
            self.said.clear()
            self.handed_out = []


class BoundGraphedFunction(wrapt.BoundFunctionWrapper):  # type: ignore[misc]
    """A graphed method bound to an instance; ``stats()``/``reset()`` act on the whole function."""

    def stats(self) -> dict[str, Any]:
        return self._self_parent.stats()

    def reset(self) -> None:
        self._self_parent.reset()

    def report(self) -> str:
        return self._self_parent.report()

    def static_inputs(self, *args: Any, **kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return self._self_parent._self_state.static_inputs(self._self_instance, args, kwargs)


class GraphedFunction(wrapt.FunctionWrapper):  # type: ignore[misc]
    """The object ``@graphed`` returns: calls like the function, plus :meth:`stats` and :meth:`reset`.

    Name, docstring, signature and method binding of the wrapped function are kept (wrapt).
    """

    __bound_function_wrapper__ = BoundGraphedFunction

    def __init__(self, wrapped: Callable[..., Any], options: Options) -> None:
        state = _State(wrapped, options)
        super().__init__(wrapped, state.call)
        self._self_state = state

    def stats(self) -> dict[str, Any]:
        """Counters per key: state, captures, replays, fallbacks and their reasons, capture ms, pool bytes."""
        return self._self_state.stats.as_dict()

    def report(self) -> str:
        """:meth:`stats` as a short table."""
        return self._self_state.stats.report()

    def reset(self) -> None:
        """Drop every captured graph and fallback decision (call after replacing weights)."""
        self._self_state.reset()

    def static_inputs(self, *args: Any, **kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The graph's own input buffers for a call like ``fn(*args, **kwargs)``, as ``(args, kwargs)``.

        Write the next call's data into these tensors and call the function with them: an input
        already at its static address is not copied (the zero-copy path for decode loops, like the
        persistent input buffers of vLLM's model runner).  Buffers of bucketed arguments have the
        padded size.  Raises ``GraphjitError`` if no graph is captured for this signature yet.
        """
        return self._self_state.static_inputs(None, args, kwargs)

    @property
    def graphjit_options(self) -> Options:
        return self._self_state.options


@overload
def graphed(fn: F, *, backend: str = ..., tracer: str = ..., buckets: BucketsArg = ..., warmup: int = ...,
            max_graphs: int | None = ..., outputs: str = ..., verify: bool | None = ..., pool: str = ...,
            strict: bool | None = ...) -> F: ...


@overload
def graphed(fn: None = None, *, backend: str = ..., tracer: str = ..., buckets: BucketsArg = ..., warmup: int = ...,
            max_graphs: int | None = ..., outputs: str = ..., verify: bool | None = ..., pool: str = ...,
            strict: bool | None = ...) -> Callable[[F], F]: ...


def graphed(fn: Callable[..., Any] | None = None, *, backend: str = "auto", tracer: str = "auto",
            buckets: BucketsArg = None, warmup: int = 2, max_graphs: int | None = None, outputs: str = "copy",
            verify: bool | None = None, pool: str = "shared", strict: bool | None = None) -> Any:
    """Capture ``fn`` into CUDA graphs keyed on its input signature, and replay them.

    Usable bare (``@graphed``) or with options (``@graphed(buckets=...)``).  Options are validated
    here (``ConfigError`` naming the option); nothing is traced or run until the first call.
    See the module docstring for what a graph cannot capture.
    """
    options = Options(backend=backend, tracer=tracer, buckets=buckets, warmup=warmup, max_graphs=max_graphs,
                      outputs=outputs, verify=verify, pool=pool, strict=strict)
    _validate(options)
    if fn is None:
        return functools.partial(_decorate, options=options)
    return _decorate(fn, options)


def _decorate(fn: Callable[..., Any], options: Options) -> GraphedFunction:
    if not callable(fn):
        raise ConfigError(f"graphed() needs a function or callable, got {type(fn).__name__}")
    if isinstance(fn, (GraphedFunction, BoundGraphedFunction)):
        raise ConfigError(f"{getattr(fn, '__qualname__', fn)!r} is already graphed")
    return GraphedFunction(fn, options)
