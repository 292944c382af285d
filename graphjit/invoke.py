"""How a graphed function is called: traced once per framework, bound to its instance, and, for a
graphed Layer/Module object, called through the object itself so that its hooks run.

:class:`Invoker` guarantees:

* The tracer wraps the function at its first call, never at decoration (:meth:`Invoker.traced`).
* A graphed ``nn.Module`` / ``paddle.nn.Layer`` *object* runs exactly what calling it runs: the call goes
  through the object's ``__call__`` (forward pre-hooks, forward, forward hooks), with the traced forward
  put in place of ``forward`` for the duration of the call (:meth:`Invoker.callable`).  A graphed method
  (``@graphed def forward(self, ...)``) is bound like any method; the module's hooks run around it.
* An exception the function raises reaches the caller unchanged.  A tracer's own failure becomes a
  :class:`~graphjit.errors.TracerError` that is also an instance of the framework's exception type (and
  chains it), so code that catches what the framework raised still catches it.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import threading
from collections.abc import Callable
from typing import Any

from . import env, guards, reach
from .backends.base import Backend
from .errors import BackendError, TracerError
from .guard_sources import argument_pairs

log = logging.getLogger("graphjit")

_TRACER_ERRORS: dict[type, type] = {}


class Invoker:
    """The callables of one graphed function (see the module docstring)."""

    def __init__(self, fn: Callable[..., Any], name: str, tracer: str) -> None:
        self.fn = fn
        self.name = name
        self.tracer_option = tracer
        # A Layer/Module object is traced through its class's forward (a tracer must not replace the object's
        # forward) and called through the object (its hooks); a plain callable object through itself.
        self.module: Any = None
        if not inspect.isfunction(fn) and not inspect.ismethod(fn) and hasattr(type(fn), "forward"):
            self.module = fn
        self.target: Callable[..., Any] = type(fn).forward if self.module is not None else fn  # type: ignore
        self._traced: dict[str, Callable[..., Any]] = {}
        self.replaced: dict[str, str] = {}  # backend name -> why its tracer was replaced by "eager"
        self._lock = threading.RLock()  # one call through a module's __call__ with a swapped forward at a time

    def signature_target(self) -> Callable[..., Any]:
        """What the argument names come from: the module's bound forward, else the function."""
        return self.module.forward if self.module is not None else self.fn  # type: ignore[no-any-return]

    def forward_of_self(self, instance: Any) -> bool:
        """The graphed function is the ``forward`` of the object the guard scan calls ``self`` (a graphed ``forward``
        method called on its module, or the bound ``model.forward`` itself, as ``graph_generation`` graphs it): that
        object's own hooks run outside it (``Module.__call__`` runs them around ``forward``)."""
        if getattr(self.target, "__name__", None) != "forward":
            return False
        return instance is not None or inspect.ismethod(self.fn)

    def tracer_name(self, backend: Backend) -> str:
        if backend.name in self.replaced:
            return "eager"
        tracer = self.tracer_option
        if tracer == "auto":
            return backend.default_tracer
        if tracer not in backend.tracers:
            raise BackendError(f"{self.name}: tracer={tracer!r} does not apply to {backend.name} tensors; "
                               f"{backend.name} tracers are {', '.join(backend.tracers)}")
        return tracer

    def traced(self, backend: Backend) -> Callable[..., Any]:
        """The unbound traced callable (created at the first call)."""
        t = self._traced.get(backend.name)
        if t is None:
            with self._lock:
                t = self._traced.get(backend.name)
                if t is None:
                    t = self._traced[backend.name] = backend.trace(self.target, self.tracer_name(backend))
                    if env.settings().debug:
                        log.debug("graphjit %s: traced with %s/%s", self.name, backend.name, self.tracer_name(backend))
        return t

    def replace_tracer(self, backend: Backend, why: str) -> None:
        """Trace with ``eager`` from now on for ``backend`` (the chosen tracer computed wrong results)."""
        with self._lock:
            self.replaced[backend.name] = why
            self._traced[backend.name] = backend.trace(self.target, "eager")

    def run_untraced(self, backend: Backend, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """One call of the Python function itself (hooks included), whatever the tracer."""
        return self.callable(self.target, instance)(*args, **kwargs)

    def callable(self, fn: Callable[..., Any], instance: Any) -> Callable[..., Any]:
        """``fn`` (the traced function, or what the backend captures) ready to call with a call's arguments."""
        if self.module is not None:
            return self._through_module(fn)
        if instance is None:
            return fn
        return fn.__get__(instance, type(instance))  # type: ignore[no-any-return]

    def _through_module(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        module = self.module
        if fn is self.target:  # untraced: the object's own call runs exactly this forward
            return module  # type: ignore[no-any-return]
        bound = fn.__get__(module, type(module))
        lock = self._lock

        def call(*args: Any, **kwargs: Any) -> Any:
            with lock:
                d = module.__dict__
                saved = d.get("forward", _ABSENT)
                d["forward"] = bound  # found before the class's forward by __call__
                try:
                    return module(*args, **kwargs)
                finally:
                    if saved is _ABSENT:
                        d.pop("forward", None)
                    else:
                        d["forward"] = saved

        return call

    def run(self, backend: Backend, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """One call of the traced function; a tracer's own failure raises :class:`TracerError`."""
        try:
            fn = self.callable(self.traced(backend), instance)
            with backend.traced_call_guard():  # Paddle's translators are not thread-safe
                return fn(*args, **kwargs)
        except Exception as exc:
            why = backend.tracer_failure(exc, self.tracer_name(backend))
            if why is not None:
                refused = self._signature_refuses(instance, args, kwargs)
                if refused is not None:  # a missing or unexpected argument: the caller's error, not the tracer's
                    if isinstance(exc, TypeError):
                        raise  # Python's own error for the call, raised as the tracer called the function
                    raise refused from None  # (a tracer that wrapped it): the signature's own
            if why is None:
                original = backend.original_error(exc)
                if original is not None and original is not exc:
                    raise original from None  # the function's own error, as it raised it
                raise  # the function's own error, unchanged
            raise tracer_error(exc, self._tracer_message(backend, why)) from exc

    def _tracer_message(self, backend: Backend, why: str) -> str:
        tracer = self.tracer_name(backend)
        if tracer != "eager":
            way = 'use @graphjit.graphed(tracer="eager") (still captured into a CUDA graph)'
            if "ast" in backend.tracers and tracer != "ast":
                way += ' or tracer="ast"'
        else:
            way = "use another tracer: " + ", ".join(f'tracer="{t}"' for t in backend.tracers if t != tracer)
        return (f"{self.name}: {backend.name}'s tracer (tracer=\"{tracer}\") failed inside itself ({why}); this is a "
                f"limitation of {backend.name}'s {tracer}, not of graphjit's capture: {way}")

    def _frame_signature(self, instance: Any) -> tuple[Any, Any]:
        """``(the code's own function, the object a call binds to it or None)``: what :meth:`frame_locals` binds."""
        bound = self.module if self.module is not None else instance
        target = self.target if self.module is not None else getattr(self.fn, "__func__", self.fn)
        if inspect.ismethod(self.fn):
            bound = self.fn.__self__
        return target, bound

    def _signature_refuses(self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> TypeError | None:
        """The ``TypeError`` the function's own signature, where it can be read, gives a call with these arguments
        (a decorator's wrapper by its own: ``*args, **kwargs`` refuses nothing); None where it binds."""
        target, bound = self._frame_signature(instance)
        try:
            sig = inspect.signature(target, follow_wrapped=False)
        except (TypeError, ValueError):
            return None
        try:
            sig.bind(*((bound,) if bound is not None else ()), *args, **kwargs)
        except TypeError as exc:
            return exc
        return None

    def frame_locals(self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The locals a call with these arguments starts the traced function's frame with (parameters by name,
        defaults applied); empty where the signature cannot be read or the call does not bind.  The frame is the
        target's own code: a function a decorator wrapped (``functools.wraps``: transformers' ``forward`` wrappers,
        whose frame holds ``args`` and ``kwargs``) is bound by its own signature, not the one ``__wrapped__`` names."""
        target, bound = self._frame_signature(instance)
        try:
            sig = inspect.signature(target, follow_wrapped=False)
            call = sig.bind(*((bound,) if bound is not None else ()), *args, **kwargs)
        except (TypeError, ValueError):
            return {}
        call.apply_defaults()
        out = dict(call.arguments)
        code = getattr(target, "__code__", None)
        for name, cell in zip(getattr(code, "co_freevars", ()), getattr(target, "__closure__", None) or ()):
            with contextlib.suppress(ValueError):  # a frame's locals hold its free variables (Dynamo guards them so)
                out.setdefault(name, cell.cell_contents)
        return out

    def guard_sources(self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> guards.Sources:
        """Where a call finds the Python values it reads without receiving them (:func:`graphjit.guards.sources`)."""
        pairs = argument_pairs(args, kwargs)
        if self.module is not None:
            return guards.sources(self.target, self.module, pairs)
        return guards.sources(self.fn, instance, pairs)

    def roots(self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
              name_of: Callable[[int], str]) -> list[tuple[str, Any]]:
        """Where a call may find the state it writes (:func:`graphjit.reach.roots`); ``name_of(i)`` names
        positional argument ``i``."""
        pairs = [(f"argument {name_of(i)!r}", a) for i, a in enumerate(args)]
        pairs += [(f"argument {k!r}", v) for k, v in kwargs.items()]
        if self.module is not None:
            return reach.roots(self.target, self.module, pairs)
        return reach.roots(self.fn, instance, pairs)


_ABSENT = object()


def tracer_error(exc: BaseException, message: str) -> TracerError:
    """A :class:`TracerError` with ``message`` that is also an instance of ``type(exc)`` (where Python can
    make such a class; a plain TracerError otherwise)."""
    base = type(exc)
    cls = _TRACER_ERRORS.get(base)
    if cls is None:
        try:
            cls = type(f"TracerError[{base.__name__}]", (TracerError, base), {"__module__": TracerError.__module__})
            cls(message)  # some exception types need other constructor arguments
        except TypeError:
            cls = TracerError
        _TRACER_ERRORS[base] = cls
    return cls(message)  # type: ignore[no-any-return]


class KeepsWrapped(reach.OwnWrapper):
    """Paddle's SOT, binding a call's arguments to a function it inlines, deletes ``__wrapped__`` for a
    moment and sets it back; a wrapt proxy refuses that.  Here the deletion is a no-op (the setter then
    sets the same function), so that SOT inlines a graphed function called from another one (its code is
    the wrapped function's) and the inner call becomes part of the outer's program.

    Dynamo (``torch.compile``) does not inline a graphed function: it sees it as ``torch.compiler.disable``
    marks functions (the attributes below), ends its graph before the call and calls it, so graphjit graphs
    the call as anywhere else (a model whose ``forward`` is graphed under transformers' compiled
    ``generate()``, say).  Inlined, it would have been compiled without graphjit, or failed Dynamo's
    closure guards (a proxy is not a function object)."""

    _torchdynamo_disable = True
    _torchdynamo_disable_msg = "graphjit.graphed: graphjit captures and replays this call itself"

    def __delattr__(self, name: str) -> None:
        if name == "__wrapped__":
            return
        super().__delattr__(name)  # type: ignore[misc]
