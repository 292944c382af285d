"""Which absences the guards keep: what the function's code looks up with a fallback and did not find.

``getattr(self.config, "scale", 1.0)``, ``hasattr(m, "doubled")``, ``settings.get("scale", 1.0)``,
``os.environ.get("FLAG")``, ``globals().get("NAME")`` and a global caught by ``except NameError`` read nothing when
the thing is absent, so :mod:`graphjit.guards` has no value to compare; the call took a default or a branch that a
replay repeats after the thing appears.  :func:`graphjit.names.code_probes` finds the names and keys code looks up
that way; this module says where their absence is guarded (as ``Scan.unshadowed`` entries: ``name in d`` stays
False), and where a present one's value is (a looked-up environment variable or ``globals()`` entry).

Guarantees: only ever adds guards (an over-approximation of the lookups costs a check per replay, never a wrong
replay).  Limits: an attribute looked up on an object through a chain the code builds at run time, or a key in a dict
that is not one of settings (string keys, plain values: a cache filled by key), is not guarded absent.
"""

from __future__ import annotations

import builtins
import enum
import os
import types
from collections.abc import Iterable, Iterator
from typing import Any

from .backends import identity_keyed
from .guardable import guardable, plain, settings
from .names import Probes
from .reach import Path

__all__ = ["ENVIRONMENT", "as_set", "attribute_probes", "environment_entry", "of_environment", "of_function",
           "of_globals", "on_class", "probed_dict", "where_absent", "where_stored"]


ENVIRONMENT = "os.environ["
"""How the guards' paths of environment variables start (``os.environ['FLAG']``)."""
_ENVIRONMENT = ENVIRONMENT + "{!r}]"


def environment_entry(key: Any) -> tuple[dict[Any, Any], Any] | None:
    """``(store, stored key)``: ``os.environ``'s own dict of its entries and ``key`` as that dict holds it, where this
    Python keeps one (CPython: ``_data``, keys made by ``encodekey``; bytes on POSIX).  ``os.environ[key]``, ``key in
    os.environ`` and every write through ``os.environ`` go through that dict, so a guard reads it there: one dict
    lookup in C, where the mapping's Python methods cost a microsecond or more a replay (an absent key's check raised
    and caught a ``KeyError``).  None where there is no such dict or the key has no stored form."""
    env = os.environ
    store, encode = getattr(env, "_data", None), getattr(env, "encodekey", None)
    if type(store) is not dict or not callable(encode):
        return None
    try:
        return store, encode(key)
    except Exception:  # a key the environment cannot hold (a lone surrogate): read through the mapping
        return None


def where_stored(container: Any, key: Any, value: Any) -> tuple[Any, Any, Any]:
    """Where a guard reads ``container[key]`` (``value`` now): for a present environment variable, in the dict
    ``os.environ`` keeps (:func:`environment_entry`), with the value stored there; anything else as it is."""
    if container is os.environ:
        stored = environment_entry(key)
        if stored is not None and stored[1] in stored[0]:
            return stored[0], stored[1], stored[0][stored[1]]
    return container, key, value


def as_set(container: Any, value: Any) -> Any:
    """``value`` as the program set it: read from the dict ``os.environ`` keeps (:func:`where_stored`), decoded as
    ``os.environ[key]`` gives it (a str, not the bytes kept on POSIX), for what a guard shows; anything else as it
    is."""
    if type(value) is bytes and container is getattr(os.environ, "_data", None):
        try:
            return os.environ.decodevalue(value)  # type: ignore[attr-defined,arg-type]
        except Exception:
            return value
    return value


def where_absent(d: Any, name: Any) -> tuple[Any, Any]:
    """``(container, key)`` where a guard checks that ``name`` stays out of ``d``: for an environment variable, the
    dict ``os.environ`` keeps (:func:`environment_entry`); anything else as it is."""
    if d is os.environ:
        stored = environment_entry(name)
        if stored is not None and stored[1] not in stored[0]:
            return stored
    return d, name


def of_function(f: types.FunctionType, probed: Probes, slots: list[tuple[Any, str, Any, Path]],
                absent: dict[tuple[int, str], tuple[Any, str, Path]]) -> None:
    """For ``f`` (whose code probes ``probed``): each global it loads that is not defined (a ``NameError`` caught, a
    branch not taken) goes to ``absent``; where it looks keys up in ``globals()`` or in ``os.environ`` (reached as
    a global or a closure variable: ``os``, ``environ``), each such key goes to ``slots`` where present (its value is
    then guarded as a global's) and to ``absent`` where not."""
    g = f.__globals__
    for var in probed.globals:
        if var not in g and not _builtin(g, var):
            absent.setdefault((id(g), var), (g, var, (f"global {var!r}",)))
    mappings: list[tuple[Any, str]] = []
    if "globals" in probed.globals and "globals" not in g:  # globals().get("NAME", default)
        mappings.append((g, "global {!r}"))
    cells = {n: c.cell_contents for n, c in zip(f.__code__.co_freevars, f.__closure__ or ()) if _filled(c)}
    if (g.get("os") is os and "os" in probed.globals) or g.get("environ") is os.environ or \
            any(v is os or v is os.environ for v in cells.values()):
        mappings.append((os.environ, _ENVIRONMENT))
    named = (cells[n] if n in cells else g.get(n) for n in probed.key_names)
    keys = probed.keys | {v for v in named if isinstance(v, str)}
    for mapping, shown in mappings:
        for key, present, path in _looked_up(mapping, keys, shown):
            if present:
                slots.append((mapping, "globals", key, path))
            else:
                absent.setdefault((id(mapping), key), (mapping, key, path))


def of_globals(read: Iterable[tuple[dict[str, Any], str]], own: frozenset[tuple[int, str]], out: Any,
               stack: list[tuple[Any, Path, int, Any]]) -> None:
    """The module globals the code that ran loaded (``read``, from :class:`~graphjit.names.NameRecorder`), but those
    the function's sources hold already (``own``: ``(id(globals), name)``; one container walked from two paths would
    not be followed where rebound): a plain value (``plain(v, 0)``: a number, a string, ``None``, an enum, a small
    container of those) goes into ``out`` (a :class:`graphjit.guards.Scan`) as a global's value, a list or dict of them
    onto ``stack`` to be walked (its entries guarded, read where the global holds it now); an undefined one (not a
    builtin) is kept undefined."""
    for g, var in read:
        if (id(g), var) in own or g is os.environ:  # (the environment's entries: of_environment)
            continue
        path: Path = (f"global {var!r} of {g.get('__name__', '?')}",)
        if var not in g:
            if not _builtin(g, var):
                out.unshadowed(g, var, path)
            continue
        value = g[var]
        if guardable(value) and (plain(value, 0) or isinstance(value, enum.Enum)):
            out.add(g, "globals", var, value, path)
        elif isinstance(value, (list, dict)) and plain(value, 0):
            new = id(value) not in out.links
            out.link(value, g, "globals", var, path)  # a second place of one already reached: checked as such
            if new:
                stack.append((value, path, 0, None))


def of_environment(read: Iterable[tuple[Any, str]], out: Any) -> None:
    """The environment variables the code that ran may read (``(os.environ, key)`` entries of ``read``, noted by
    :class:`~graphjit.names.NameRecorder` for code that loads ``os``, ``environ`` or ``getenv``: the keys that code
    looks up): a present one's value guarded, an absent one kept absent."""
    env = os.environ
    for key, present, path in _looked_up(env, [key for mapping, key in read if mapping is env], _ENVIRONMENT):
        if present:
            out.add(env, "globals", key, env[key], path)
        else:
            out.unshadowed(env, key, path)


def _looked_up(mapping: Any, keys: Iterable[str], shown: str) -> Iterator[tuple[str, bool, Path]]:
    """``(key, present, path)`` of each of ``keys`` in ``mapping`` (``globals()``, ``os.environ``), its path
    ``shown.format(key)``; a key the mapping cannot hold (an environment key with a lone surrogate: never set) is
    left out."""
    for key in keys:
        try:
            present = key in mapping
        except Exception:
            continue
        yield key, present, (shown.format(key),)


def probed_dict(d: dict[Any, Any], path: Path, through: frozenset[str]) -> bool:
    """``d`` (reached at ``path``) is a dict whose absent keys the code's key probes are guarded on: a dict of settings
    (:func:`~graphjit.guardable.settings`, empty included), not one through which a Module holds its submodules,
    parameters and buffers (``through``), nor one a class holds (a table of names, read whole)."""
    if len(path) > 1 and path[-1][0] == "." and path[-1][1] in through:
        return False
    return not (isinstance(path[0], str) and path[0].startswith("class ")) and settings(d)


def attribute_probes(obj: Any, depth: int, probes: Probes, own: Probes, by_object: dict[int, frozenset[str]] | None,
                     probed_by_object: dict[int, frozenset[str]] | None) -> frozenset[str]:
    """The names looked up by ``getattr``/``hasattr`` whose absence from ``obj`` (reached ``depth`` steps from the
    function's roots) is guarded: for a Module/Layer those of the code that took it as an argument
    (``probed_by_object``), for another object (a config) those and those of any code that ran (``probes``), for a
    root the function's own too (``own``); where the names that ran are not known (``by_object`` None), a root's
    only."""
    roots = own.attributes if depth == 0 else frozenset()
    if by_object is None:
        return roots
    mine = (probed_by_object or {}).get(id(obj), frozenset())
    if identity_keyed(type(obj)):  # a Module/Layer: its own code's lookups (another's are on its config, its kwargs)
        return mine | roots
    return mine | roots | probes.attributes  # a config whose Python __getattribute__ made it an argument too


def on_class(tp: type, name: str) -> bool:
    """``name`` is defined on ``tp`` or a base (read off ``vars`` of each: no descriptor or metaclass runs)."""
    return any(name in vars(c) for c in tp.__mro__)


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises
    except ValueError:
        return False
    return True


def _builtin(g: dict[str, Any], var: str) -> bool:
    """``var`` is a builtin name as ``g``'s code sees them (its ``__builtins__``, a module or a dict)."""
    b = g.get("__builtins__", builtins)
    return var in (b if isinstance(b, dict) else vars(b))
