"""The swap: ``paddle.distributed.all_reduce`` and ``torch.distributed.all_reduce``, wrapped once.

:func:`install` replaces the framework's public ``all_reduce`` attribute with a ``wrapt``
function wrapper (name, docstring, signature and ``inspect`` behaviour of the original are kept).
The wrapper hands every call to the dispatcher :func:`install` is given
(:func:`graphjit.collectives.custom_ar.dispatch`), which either runs
the custom kernel (eligible call, inside a graphed call or capture scope, or always with
``scope="always"``) with the original's in-place semantics and return value, or calls the
original with the caller's arguments unchanged, and counts why.

* Installing twice is a no-op; :func:`uninstall` puts the original back.
* Only the attribute is replaced: a module that did ``from torch.distributed import all_reduce``
  before the swap keeps calling the original (and is not counted).  Call ``collectives.init`` early,
  or call ``torch.distributed.all_reduce`` through the module.
* Paddle SOT: the wrapper is registered as a graph-break function, so SOT runs the call eagerly
  between two compiled subgraphs (see :mod:`graphjit.backends.paddle.dist`).
* torch.compile (``tracer="compile"``): while the custom all-reduce is enabled for some group
  (:func:`set_opaque`, called by ``collectives.init`` and ``shutdown``), the attribute holds a
  function Dynamo cannot take for the original: a default-group SUM becomes graphjit's custom op in
  the compiled graph, any other call a graph break (see :mod:`graphjit.backends.torch.dist`); either
  way the swap runs on real tensors.  Otherwise it holds the plain wrapper, which Dynamo rewrites
  as it rewrites the original.  :func:`swapped` finds the wrapper behind either.
* ``GRAPHJIT_DISABLE=1``: the wrapper calls the original at once (counted as "disabled").
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import wrapt

from ..backends.dist_base import DistBackend

log = logging.getLogger("graphjit")

_lock = threading.Lock()


class SwappedAllReduce(wrapt.FunctionWrapper):  # type: ignore[misc]
    """The wrapper graphjit puts in place of the framework's ``all_reduce``."""


@dataclass
class _Installed:
    """One framework's swap: where it lives, the original, the wrapper and what is published now."""

    module: Any
    attr: str
    original: Any
    wrapper: SwappedAllReduce
    dist: DistBackend
    public: Any  # the module attribute graphjit set last: the wrapper or its opaque version
    opaque: Any = None  # the backend's publish(wrapper), built on first use and reused


_installed: dict[str, _Installed] = {}


def swapped(obj: Any) -> SwappedAllReduce | None:
    """The swap's wrapper if ``obj`` is it or was published for it (``torch.distributed.all_reduce``
    after :func:`install`), else None."""
    if isinstance(obj, SwappedAllReduce):
        return obj
    inner = getattr(obj, "_graphjit_swap", None) if callable(obj) else None
    return inner if isinstance(inner, SwappedAllReduce) else None


Dispatch = Callable[[DistBackend, Any, tuple[Any, ...], dict[str, Any]], Any]
"""``dispatch(dist, original, args, kwargs)``: what a call of the wrapper runs."""


def _handler(dist: DistBackend, dispatch: Dispatch) -> Any:
    def handler(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return dispatch(dist, wrapped, args, kwargs)

    return handler


def install(dist: DistBackend, dispatch: Dispatch) -> bool:
    """Wrap ``dist``'s ``all_reduce`` unless already wrapped (every call then goes to ``dispatch``); True if
    this call wrapped it."""
    with _lock:
        module, attr = dist.wrap_target()
        current = getattr(module, attr)
        if swapped(current) is not None:
            return False
        wrapper = SwappedAllReduce(current, _handler(dist, dispatch))
        setattr(module, attr, wrapper)
        _installed[dist.name] = _Installed(module, attr, current, wrapper, dist, wrapper)
        log.debug("graphjit: wrapped %s.%s", module.__name__, attr)
    if dist.always_opaque:
        set_opaque(dist.name, True)
    return True


def set_opaque(name: str, opaque: bool) -> None:
    """Publish the compiler-opaque version of the wrapper (``opaque``) or the plain one.

    The opaque version (the backend's :meth:`~graphjit.backends.dist_base.DistBackend.publish`,
    built once and reused, so that compiled code guarding on it stays valid) makes a compiler stop
    at the call and run it eagerly, which the custom kernel needs.  Without an enabled custom
    all-reduce there is nothing to gain, and the plain wrapper leaves compilers their usual rewrite.
    """
    with _lock:
        e = _installed.get(name)
        if e is None:
            return
        opaque = opaque or e.dist.always_opaque
        if opaque and e.opaque is None:
            e.opaque = e.dist.publish(e.wrapper)
            if e.opaque is not e.wrapper:
                e.opaque._graphjit_swap = e.wrapper  # for swapped(): a plain attribute of the published function
                note = e.dist.mark_graph_break(e.opaque)
                log.debug("graphjit: %s.%s opaque to the compiler%s", e.module.__name__, e.attr,
                          f" ({note})" if note else "")
        target = e.opaque if opaque else e.wrapper
        if target is e.public or getattr(e.module, e.attr) is not e.public:
            return  # already published, or someone else replaced the attribute since
        setattr(e.module, e.attr, target)
        e.public = target


def uninstall(name: str | None = None) -> list[str]:
    """Put the original ``all_reduce`` back (of ``name``, or of every framework); returns the names."""
    done = []
    with _lock:
        for key in [name] if name else list(_installed):
            e = _installed.pop(key, None)
            if e is None:
                continue
            if getattr(e.module, e.attr) is e.public:
                setattr(e.module, e.attr, e.original)
            done.append(key)
    return done


def installed() -> list[str]:
    """Names of the frameworks whose ``all_reduce`` is wrapped now."""
    with _lock:
        return [n for n, e in _installed.items() if getattr(e.module, e.attr) is e.public]


def original(name: str) -> Any:
    """The framework's own ``all_reduce`` (whether or not it is wrapped)."""
    entry = _installed.get(name)
    if entry is not None:
        return entry.original
    from ..backends.dist_base import load

    module, attr = load(name).wrap_target()
    fn = getattr(module, attr)
    wrapper = swapped(fn)
    return wrapper.__wrapped__ if wrapper is not None else fn
