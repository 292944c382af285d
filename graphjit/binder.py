"""A call's arguments in parameter order with the defaults applied (:class:`Binder`), so that equivalent calls are one
key and run alike; and which functions get their calls as written (:func:`wraps_another`)."""

from __future__ import annotations

import functools
import inspect
import types
from collections.abc import Callable
from typing import Any, cast

__all__ = ["Binder", "as_written", "wraps_another"]


def wraps_another(fn: Callable[..., Any]) -> bool:
    """``fn`` (or the function of a bound method) is a decorator's wrapper of another function (``__wrapped__``, as
    ``functools.wraps`` sets it): it receives ``*args, **kwargs`` and may tell a keyword from a position, or a default
    from a value passed, whatever the signature ``inspect`` reports from the function it wraps.  transformers renames
    a deprecated keyword so (``past_key_values=`` to ``cache=``): bound with the defaults applied, the call would pass
    both.  Or ``fn`` is a ``functools.partial``: the signature ``inspect`` reports has its keywords as defaults, read
    once, and a call bound with them would pass them explicitly, overriding the partial's keywords as they are when
    it is called (``p.keywords["temperature"] = 4.0`` after the capture).  Their calls are passed as written
    (:class:`Binder` of None)."""
    return isinstance(fn, functools.partial) or getattr(getattr(fn, "__func__", fn), "__wrapped__", None) is not None


class Binder:
    """Puts a call's arguments in parameter order with the defaults applied, so that equivalent calls
    (``f(x)``, ``f(x=x)``, ``f(x, 2.0)``, ``f(x, scale=2.0)``) are one key and run alike.  Not for a function that
    wraps another (:func:`wraps_another`): its calls are passed as written, each way of writing one a key of its own.

    Guarantees: the function receives the same values for the same parameters as with the call as
    written: the result equals ``inspect.Signature.bind`` with ``apply_defaults()`` (its ``args`` and
    ``kwargs``).  A call that does not bind (a missing, unexpected or repeated argument) is passed on as it
    is, so that the function itself raises Python's error.  The common case (every parameter passed
    positionally) costs one comparison; a signature of plain parameters and ``**kwargs`` (a Hugging Face
    model's ``forward``) is bound without ``inspect`` (1.3 us against 9.8 us on a development CPU); anything else
    (``*args``, keyword-only or positional-only parameters) goes through ``inspect``.
    """

    def __init__(self, sig: inspect.Signature | None, fn: Callable[..., Any] | None = None) -> None:
        """``fn``: the function ``sig`` is of, whose defaults are read again where they were replaced since (a
        new ``__defaults__``, a changed ``__kwdefaults__``), so that a call that omits one gets the current value."""
        self._fn = fn
        top = getattr(fn, "__func__", fn)
        self._top = top if isinstance(top, types.FunctionType) and sig is not None else None
        self._plan_for(sig)

    def _plan_for(self, sig: inspect.Signature | None) -> None:
        params = list(sig.parameters.values()) if sig is not None else None
        self._plans = {False: _plan(params), True: _plan(params[1:] if params else params)}
        top = self._top
        self._defaults = top.__defaults__ if top is not None else None
        self._kwdefaults = dict(top.__kwdefaults__ or {}) if top is not None else None

    def _stale(self) -> bool:
        """The function's defaults are not those the plans were made with."""
        top = self._top
        return top is not None and (top.__defaults__ is not self._defaults or (
            (top.__kwdefaults__ or {}) != self._kwdefaults))

    def bind(self, method: bool, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...],
                                                                                         dict[str, Any]]:
        plan = self._plans[method]
        if plan is None:
            return args, kwargs
        names, defaults, general, varkw = plan
        if not kwargs and len(args) == len(names) and general is None:
            return args, kwargs
        if self._stale():  # defaults replaced since the plan: plan again from the function's signature now
            try:
                self._plan_for(inspect.signature(cast(Callable[..., Any], self._fn)))
            except (TypeError, ValueError):
                return args, kwargs
            return self.bind(method, args, kwargs)  # (not stale now: the plan has the defaults it was made from)
        if general is not None:  # *args, keyword-only or positional-only parameters
            try:
                bound = general.bind(*args, **kwargs)
            except TypeError:
                return args, kwargs
            bound.apply_defaults()
            return bound.args, bound.kwargs
        n = len(args)
        if n > len(names):
            return args, kwargs
        out = list(args)
        used = 0
        for name, default in zip(names[n:], defaults[n:]):
            if name in kwargs:
                out.append(kwargs[name])
                used += 1
            elif default is not inspect.Parameter.empty:
                out.append(default)
            else:
                return args, kwargs
        if used == len(kwargs):
            return tuple(out), {}
        if not varkw:
            return args, kwargs  # an unexpected keyword, or a parameter also given by position
        taken = names[n:]
        extra = {}
        for name, value in kwargs.items():
            if name in taken:
                continue
            if name in names:  # also given by position: Python's "multiple values" error, from the function
                return args, kwargs
            extra[name] = value
        return tuple(out), extra


def _plan(params: list[inspect.Parameter] | None
          ) -> tuple[list[str], list[Any], inspect.Signature | None, bool] | None:
    """``(names, defaults, general, varkw)`` of the parameters: ``general`` (a signature ``inspect`` binds) where they
    are not plain parameters, optionally followed by ``**kwargs`` (``varkw``)."""
    if params is None:
        return None
    varkw = bool(params) and params[-1].kind is inspect.Parameter.VAR_KEYWORD
    plain = params[:-1] if varkw else params
    simple = all(p.kind is p.POSITIONAL_OR_KEYWORD for p in plain)
    return ([p.name for p in plain], [p.default for p in plain],
            None if simple else inspect.Signature(params), varkw and simple)


def as_written(given: tuple[tuple[Any, ...], dict[str, Any]], args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a bound call has the shape of the call as written (``given``: as many positional arguments, the same
    keyword names): the replay lane checks a call as written, so a plan of a call the binder reshaped (a default
    applied, a plain parameter passed by keyword) would never meet it; none is made for such a key."""
    return len(args) == len(given[0]) and (kwargs is given[1] or kwargs.keys() == given[1].keys())
