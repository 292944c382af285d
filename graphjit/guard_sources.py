"""Where a call finds the Python values it reads without receiving them: the closure cells and globals of the
function and of the Python functions it reaches, the objects to walk, the names their code uses
(:func:`sources`).  :func:`graphjit.guards.scan` reads the values there."""

from __future__ import annotations

import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from . import absences, backends
from .guard_links import Place
from .guardable import OPAQUE_VALUES, by_identity, guardable, opaque
from .names import NO_PROBES, Probes, code_names, code_probes
from .reach import Path, describe, functions, global_names, modules_in, user_module

LINKED = (list, dict, tuple)  # the containers whose place the walk remembers (Scan.link): no identity guard holds them


@dataclass(frozen=True)
class Sources:
    """Where a call finds the values it reads without receiving them (see :func:`sources`)."""

    objects: list[tuple[str, Any]]
    slots: list[tuple[Any, str, Any, Path]]  # (container, kind, key, path) of closure cells and globals
    names: frozenset[str]
    anchors: dict[int, Place] = field(default_factory=dict)  # id(list, dict, tuple) -> where found (Scan.link)
    probes: Probes = NO_PROBES  # what the functions' code may find absent (names.code_probes)
    absent: list[tuple[dict[str, Any], str, Path]] = field(default_factory=list)  # globals loaded but not defined
    own_globals: frozenset[tuple[int, str]] = frozenset()  # (id(globals), name) of the globals visited here


def argument_pairs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[tuple[str, Any]]:
    """A call's arguments as :func:`sources` takes them: ``("argument 0", a)``, ``("argument 'mask'", m)``."""
    return [(f"argument {i}", a) for i, a in enumerate(args)] + [(f"argument {k!r}", v) for k, v in kwargs.items()]


def sources(fn: Callable[..., Any], bound: Any, args: Iterable[tuple[str, Any]] = ()) -> Sources:
    """The closure cells and globals of ``fn`` and of the Python functions it reaches through them (with what their
    code names of the user's own modules among those: ``config.SCALE``), the objects to walk (``bound``, a callable
    object, Layer/Module objects among ``args``), the names their code uses.  Islands (``eager``) are not followed."""
    from .islands import island_of

    objects: list[tuple[str, Any]] = []
    slots: list[tuple[Any, str, Any, Path]] = []
    names: set[str] = set()
    anchors: dict[int, Place] = {}
    probes, own, modules = [NO_PROBES], set[tuple[int, str]](), set[int]()
    absent: dict[tuple[int, str], tuple[dict[str, Any], str, Path]] = {}
    if bound is not None:
        objects.append(("self", bound))
    for name, value in args:
        objects.extend(modules_in(name, value))

    def visit(f: types.FunctionType) -> list[Any]:
        follow: list[Any] = []
        code = f.__code__
        names.update(code_names(code))
        probed = code_probes(code)
        probes.append(probed)
        held: list[tuple[types.ModuleType, Path]] = []  # the user's own modules in closure cells (``c = config``)
        for var, cell in zip(code.co_freevars, f.__closure__ or ()):
            try:
                value = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            path: Path = (f"closure variable {var!r}",)
            if guardable(value) or by_identity(value, _never) or pinnable(value):
                slots.append((cell, "cell", "cell_contents", path))  # (a tensor: pinned by scan)
            if isinstance(value, (types.FunctionType, types.MethodType)) or island_of(value) is not None:
                follow.append(value)
            elif isinstance(value, types.ModuleType):
                held.append((value, path))
            elif not guardable(value) and not opaque(value):
                objects.append((path[0], value))
                if isinstance(value, LINKED):
                    anchors.setdefault(id(value), (cell, "cell", "cell_contents", value, path))
        if f is not getattr(fn, "__func__", fn):  # a helper's defaults (the graphed function's own: in the key)
            for attr, value in (("__defaults__", f.__defaults__), ("__kwdefaults__", f.__kwdefaults__)):
                if value is not None:
                    where: Path = (f"{f.__qualname__}.{attr}",)
                    slots.append((f, "attr", attr, where))
                    if not guardable(value):  # a mutable default (``cfg={"s": 2.0}``): what it holds, walked
                        objects.append((where[0], value))
        g = f.__globals__
        absences.of_function(f, probed, slots, absent)
        own.update((id(g), var) for var in probed.globals)
        named = code_names(code)

        def place(g: dict[str, Any], var: str, path: Path) -> None:
            value = g[var]
            if guardable(value) or by_identity(value, _never) or pinnable(value):
                slots.append((g, "globals", var, path))
            if isinstance(value, (types.FunctionType, types.MethodType)) or island_of(value) is not None:
                follow.append(value)
            elif isinstance(value, types.ModuleType):  # the user's own (``config.SCALE``): what the code names of it
                if user_module(value) and id(value) not in modules:  # each once a sources() call
                    modules.add(id(value))
                    for attr in sorted(named.intersection(value.__dict__)):
                        place(value.__dict__, attr, (*path, (".", attr)))
            elif not guardable(value) and not opaque(value):
                objects.append((describe(path), value))
                if isinstance(value, LINKED):
                    anchors.setdefault(id(value), (g, "globals", var, value, path))
        for var in (v for v in global_names(code) if v in g):
            place(g, var, (f"global {var!r}",))
        for module, path in held:  # what the code names of it, as of a module held as a global
            if user_module(module) and id(module) not in modules:
                modules.add(id(module))
                for attr in sorted(named.intersection(module.__dict__)):
                    place(module.__dict__, attr, (*path, (".", attr)))
        return follow

    functions(fn, visit, objects, skip=lambda f: island_of(f) is not None, opaque=OPAQUE_VALUES)
    return Sources(objects, slots, frozenset(names), anchors, Probes.union(probes), list(absent.values()),
                   frozenset(own))


def pinnable(v: Any) -> bool:
    """A value held by identity, compared before every replay (:meth:`Scan.pin`): a tensor (the graph reads it at its
    address).  Not a list or dict whose entries are guarded: a rebuilt equal one (a scheduler's ``_last_lr``, a dict of
    settings made anew each step) would make a new graph every call: a guard reads a rebound one where it was read."""
    return backends.is_tensor(v)


def _never(_v: Any) -> bool:
    return False
