"""``@graphed(dynamic=(...))``: arguments that change on every call and that only islands read.

Per-call data such as attention metadata (per-sequence lengths, block tables of varying size, a Python
list) would make a new key on every call.  An argument named in ``dynamic`` is left out of the key and
out of the graph's static inputs: the function receives the call's own value, and on replay every island
(:func:`graphjit.eager`) that was handed that value, or a container, object or tensor inside it, gets
the current call's one in its place (:class:`Index`).  The graphed segments must not read it: verify
proves it on the first replayed call whose dynamic values differ from the capturing call's (the replay is
checked against an eager run of that call), and a key that fails runs uncaptured.

Guarantees and refusals:

* :class:`DynamicArgs` refuses (``ConfigError``, at decoration) names that are not parameters of the
  function, ``*args``/``**kwargs`` parameters, names listed twice or also in ``buckets``.
* Substitution follows identity: an island receives the current value for an object it got from a dynamic
  argument (``meta``, ``meta.lens``, ``meta["table"]``, ``tables[2]``).  Python numbers and strings are not
  followed (they are shared objects); a number computed from a dynamic argument outside an island is frozen
  at its capture value, and verify then reports the key.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

from .errors import ConfigError, IslandError
from .reach import describe
from .tree import is_object, object_fields


class _Dynamic:
    """What a dynamic argument is replaced by in the key and in the graph's static call."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<dynamic>"

    def __reduce__(self) -> str:
        return "DYNAMIC"


DYNAMIC = _Dynamic()

_SCALARS = (int, float, complex, str, bytes, bool, type(None))
MAX_DEPTH = 4
"""How deep :class:`Index` follows containers and objects inside a dynamic argument."""


class DynamicArgs:
    """The dynamic parameters of one function: where they sit in a bound call, and how to take them out."""

    def __init__(self, names: Any, sig: inspect.Signature | None, fn_name: str, bucket_names: Sequence[Any]) -> None:
        if isinstance(names, str):
            names = (names,)
        if not isinstance(names, (tuple, list)) or not all(isinstance(n, str) for n in names):
            raise ConfigError(f"{fn_name}: dynamic must be a tuple of parameter names, got {names!r}")
        if len(set(names)) != len(names):
            raise ConfigError(f"{fn_name}: dynamic lists {sorted({n for n in names if names.count(n) > 1})} twice")
        if sig is None:
            raise ConfigError(f"{fn_name}: dynamic= needs a function whose signature Python can read")
        params = sig.parameters
        self.names = tuple(names)
        self.fn_name = fn_name
        positional = [p.name for p in params.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        for n in names:
            p = params.get(n)
            if p is None:
                raise ConfigError(f"{fn_name}: dynamic names {n!r}, which the function does not have; its parameters "
                                  f"are: {', '.join(params)}")
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                raise ConfigError(f"{fn_name}: dynamic names {n!r}, a *args/**kwargs parameter; name a plain parameter")
            if n in bucket_names:
                raise ConfigError(f"{fn_name}: {n!r} is in both dynamic and buckets; a dynamic argument is not part "
                                  "of the key, so it cannot be padded")
        self._position = {False: {n: positional.index(n) for n in names if n in positional},
                          True: {n: positional.index(n) - 1 for n in names if n in positional[1:]}}

    def split(self, method: bool, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[
            tuple[Any, ...], dict[str, Any], dict[str, Any]]:
        """The call (bound by :class:`graphjit.keys.Binder`) with every dynamic argument replaced by
        :data:`DYNAMIC`, and the dynamic values by name (only those the call passed)."""
        values: dict[str, Any] = {}
        new_args: list[Any] | None = None
        new_kwargs: dict[str, Any] | None = None
        position = self._position[method]
        for n in self.names:
            if n in kwargs:
                if new_kwargs is None:
                    new_kwargs = dict(kwargs)
                values[n] = kwargs[n]
                new_kwargs[n] = DYNAMIC
                continue
            i = position.get(n)
            if i is not None and i < len(args):
                if new_args is None:
                    new_args = list(args)
                values[n] = args[i]
                new_args[i] = DYNAMIC
        return (tuple(new_args) if new_args is not None else args,
                new_kwargs if new_kwargs is not None else kwargs, values)

    def merge(self, method: bool, args: tuple[Any, ...], kwargs: dict[str, Any],
              values: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The inverse of :meth:`split`: the dynamic values put back where :data:`DYNAMIC` stands."""
        if not values:
            return args, kwargs
        out = list(args)
        kw = dict(kwargs)
        position = self._position[method]
        for n, v in values.items():
            if n in kw:
                kw[n] = v
            else:
                i = position.get(n)
                if i is not None and i < len(out):
                    out[i] = v
        return tuple(out), kw


class Index:
    """Which objects of a call's dynamic values sit where: ``id -> path`` (a :data:`graphjit.reach.Path` from
    the argument's name), for tensors, containers and objects (never Python numbers or strings, see the
    module docstring)."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.paths: dict[int, tuple[Any, ...]] = {}
        self._keep = values  # the ids stay valid while the index lives
        for name, v in values.items():
            self._walk(v, (name,), 0)

    def _walk(self, x: Any, path: tuple[Any, ...], depth: int) -> None:
        if isinstance(x, _SCALARS) or x is DYNAMIC:
            return
        if isinstance(x, (tuple, list, dict)) and not x:
            return  # empty containers may be shared objects
        self.paths.setdefault(id(x), path)
        if depth >= MAX_DEPTH:
            return
        if isinstance(x, (list, tuple)):
            for i, e in enumerate(x):
                self._walk(e, (*path, ("[]", i)), depth + 1)
        elif isinstance(x, dict):
            for k, e in x.items():
                self._walk(e, (*path, ("[]", k)), depth + 1)
        elif is_object(type(x)):
            for n, e in object_fields(x):
                self._walk(e, (*path, (".", n)), depth + 1)

    def path_of(self, x: Any) -> tuple[Any, ...] | None:
        if isinstance(x, _SCALARS):
            return None
        return self.paths.get(id(x))


def resolve(values: dict[str, Any], path: tuple[Any, ...]) -> Any:
    """The object at ``path`` in this call's dynamic ``values``; raises :class:`~graphjit.errors.IslandError`
    when it does not resolve (a shorter list, a missing key or attribute)."""
    name, *steps = path
    if name not in values:
        raise IslandError(f"this call did not pass dynamic argument {name!r}, which an island read when the key "
                              "was captured")
    x = values[name]
    for kind, at in steps:
        try:
            x = getattr(x, at) if kind == "." else x[at]
        except (AttributeError, LookupError, TypeError) as exc:
            where = describe(path)
            raise IslandError(f"dynamic argument {where} does not resolve in this call ({exc}); an island read it "
                                  "when the key was captured, so every call of the key must have it") from exc
    return x
