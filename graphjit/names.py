"""Which names the code a call may run uses: what :mod:`graphjit.guards` counts as read.

A guarded value is an attribute or dict entry the function's code may read.  Its names come from the code
objects of the function and of the functions it reaches (:func:`code_names`), from the code its last warmup
call ran as Python (:class:`NameRecorder`, a ``sys.setprofile`` hook for that one call), and, where that run
is not known (a tracer that runs a program, a profiler in the way), from every method of the classes of the
reached objects (:func:`class_names`).  Nothing here runs on the replay path.
"""

from __future__ import annotations

import builtins
import dis
import logging
import os
import sys
import threading
import types
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

from . import host_clock
from .backends.base import in_island
from .reach import ATOMS, OPAQUE, unwrap, user_globals

_ATOMS = frozenset((int, float, bool, str, bytes, complex, type(None), tuple, list, dict))
_NOT_STATE = (types.FunctionType, types.MethodType, types.ModuleType, type, types.CodeType, types.FrameType,
              types.GeneratorType, BaseException)
_SKIP_CODE = ("torch.nn.modules.module", "paddle.nn.layer.layers", "torch._dynamo", "torch._inductor", "torch.fx",
              "torch._functorch", "torch._subclasses",
              "torch._library", "torch._ops", "torch.utils._", "torch.cuda", "torch.autograd", "paddle.jit",
              "paddle.base", "graphjit", "functools", "contextlib", "threading", "typing", "abc", "weakref",
              "importlib", "inspect", "logging", "warnings", "collections", "enum", "dataclasses", "copy", "re")
"""Modules whose running code adds no names: the Module/Layer call machinery (it reads every module's hooks and
compile slot: a ``module.compile()`` after the capture needs ``reset()``), tracers and compilers, graphjit, the
standard library's machinery.  A Module's own code counts (``Dropout.forward`` reads ``self.p``)."""
_SKIPPED: dict[str, bool] = {}  # module name -> whether it is one of _SKIP_CODE's (asked once a module)

_PRINT = builtins.print
_CLOCKS = host_clock.MODULE
_EMIT = logging.Logger.callHandlers.__code__  # runs where a logger emits a record (it passed level and filters)
MAX_EMITTED = 3
_OWN_LOGGERS = frozenset(("graphjit", "torch", "paddle", "py"))  # py.warnings: warnings are not watched (once a place)
_OWN_WRITERS = frozenset(("graphjit", "torch", "paddle", "logging", "warnings"))

def _written(logger: Any, level: int) -> bool:
    """A record of ``level`` handed to ``logger.callHandlers`` reaches a handler that writes it: one that is not a
    ``NullHandler`` and whose level lets it through, on the logger or the ancestors it propagates to; where the
    loggers have no handler at all, ``logging.lastResort`` (stderr, WARNING and above)."""
    found = 0
    c = logger
    while isinstance(c, logging.Logger):
        for h in c.handlers:
            found += 1
            if not isinstance(h, logging.NullHandler) and level >= h.level:
                return True
        if not c.propagate:
            break
        c = c.parent
    last = logging.lastResort
    return not found and last is not None and level >= last.level


_CLASS_NAMES: dict[type, frozenset[str]] = {}
_CODE_NAMES: dict[types.CodeType, frozenset[str]] = {}
_CODE_PROBES: dict[types.CodeType, Probes] = {}
_PROBING_CALLS = frozenset(("getattr", "hasattr"))
_ENV_NAMES = frozenset(("os", "environ", "getenv"))  # a code loading one of these may read the environment
_PROBING_METHODS = frozenset(("get", "pop", "setdefault", "__contains__", "getenv"))
_LOOKAHEAD = 8  # instructions from a probing call's start (or a constant) to the call (or the ``in``) that uses it


class Probes(NamedTuple):
    """What code may find absent without failing (:func:`code_probes`)."""

    attributes: frozenset[str]  # getattr(o, "name", default), hasattr(o, "name")
    keys: frozenset[str]  # d.get("key"), d.pop("key", None), d.setdefault("key", v), "key" in d, os.getenv("key")
    globals: frozenset[str]  # the global names it loads
    key_names: frozenset[str] = frozenset()  # globals and closure variables passed as such a key (d.get(FLAG))

    def __or__(self, other: tuple[Any, ...]) -> Probes:  # type: ignore[override]
        return Probes(*(a | b for a, b in zip(self, other)))

    @staticmethod
    def union(parts: Iterable[Probes]) -> Probes:
        """All of ``parts`` in one (:data:`NO_PROBES` for none)."""
        return Probes(*(frozenset().union(*p) for p in zip(NO_PROBES, *parts)))


NO_PROBES = Probes(frozenset(), frozenset(), frozenset(), frozenset())


def code_probes(code: types.CodeType) -> Probes:
    """What ``code`` (and the code nested in it) may find absent without failing: the string constants it looks up by
    name on an object (``getattr(o, "name", default)``, ``hasattr(o, "name")``) and in a mapping (``d.get("key")``,
    ``d.pop("key", None)``, ``"key" in d``), and the global names it loads (``LOAD_GLOBAL``).  A read of something
    absent takes a branch or a default that a replay keeps after the thing appears; :func:`graphjit.guards.scan`
    guards that those its objects, dicts and globals lack stay absent.  An over-approximation (a constant near such a
    call that it does not take is counted too): it only ever adds guards."""
    found = _CODE_PROBES.get(code)
    if found is not None:
        return found
    attributes: set[str] = set()
    keys: set[str] = set()
    loaded: set[str] = set()
    key_names: set[str] = set()
    todo = [code]
    while todo:
        c = todo.pop()
        todo.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
        try:
            ins = list(dis.get_instructions(c))
        except Exception:  # code dis cannot read: nothing found here
            continue
        for i, x in enumerate(ins):
            op, arg = x.opname, x.argval
            called = op in ("LOAD_GLOBAL", "LOAD_NAME")
            if (called and isinstance(arg, str)) or (op == "IMPORT_NAME" and arg == "os"):
                loaded.add(arg)  # (``import os`` inside a function: its environment reads count)
            into = attributes if called and arg in _PROBING_CALLS else \
                keys if (op in ("LOAD_ATTR", "LOAD_METHOD") and arg in _PROBING_METHODS) or \
                (called and arg == "getenv") else None
            if into is not None:
                for y in ins[i + 1:i + 1 + _LOOKAHEAD]:
                    if y.opname.startswith("CALL"):
                        break
                    if y.opname == "LOAD_CONST" and isinstance(y.argval, str):
                        into.add(y.argval)
                    elif into is keys and y.opname in ("LOAD_GLOBAL", "LOAD_NAME", "LOAD_DEREF") and \
                            isinstance(y.argval, str):
                        key_names.add(y.argval)
            elif op == "LOAD_CONST" and isinstance(arg, str):
                if i + 1 < len(ins) and ins[i + 1].opname == "BINARY_SUBSCR":  # d["key"] (os.environ["FLAG"])
                    keys.add(arg)
                    continue
                keys_view = False  # ``"key" in d.keys()``: the call of ``keys`` is not the end of the lookup
                for y in ins[i + 1:i + 1 + _LOOKAHEAD]:
                    if y.opname in ("LOAD_ATTR", "LOAD_METHOD"):
                        keys_view = y.argval == "keys"
                    elif y.opname == "PRECALL":  # (Python 3.11: before every CALL)
                        continue
                    elif y.opname.startswith("CALL") and keys_view and y.arg == 0:
                        keys_view = False
                        continue
                    if y.opname.startswith("CALL"):
                        break
                    if y.opname == "CONTAINS_OP":
                        keys.add(arg)
                        break
    found = _CODE_PROBES[code] = Probes(frozenset(attributes), frozenset(keys), frozenset(loaded),
                                        frozenset(key_names))
    return found


def code_names(code: types.CodeType) -> frozenset[str]:
    """The attribute and global names and the string constants of ``code`` and the code nested in it."""
    found = _CODE_NAMES.get(code)
    if found is None:
        names: set[str] = set()
        todo = [code]
        while todo:
            c = todo.pop()
            names.update(c.co_names)
            for k in c.co_consts:
                if isinstance(k, str):
                    names.add(k)
                elif isinstance(k, types.CodeType):
                    todo.append(k)
                elif isinstance(k, tuple):
                    names.update(s for s in k if isinstance(s, str))
        found = _CODE_NAMES[code] = frozenset(names)
    return found


_NOT_CALLED = frozenset(("__init__", "__new__", "__post_init__", "__repr__", "__str__", "extra_repr", "__getstate__",
                         "__setstate__", "__reduce__", "__reduce_ex__", "__init_subclass__", "__del__"))
"""Methods that set an object up or describe it, not what a call of the function runs: an attribute only
they name (a step counter the constructor sets and the training loop advances) is not read by the call."""


def class_names(tp: type) -> frozenset[str]:
    """The names the Python methods (and properties) of ``tp`` and its bases use, constructors and
    descriptions (:data:`_NOT_CALLED`) aside."""
    found = _CLASS_NAMES.get(tp)
    if found is None:
        names: set[str] = set()
        for cls in tp.__mro__:
            if cls is object or cls.__module__ == "builtins":
                continue
            for key, attr in list(vars(cls).items()):
                if key in _NOT_CALLED:
                    continue
                for f in _functions_of(attr):
                    names.update(code_names(f.__code__))
        found = _CLASS_NAMES[tp] = frozenset(names)
    return found


def _functions_of(attr: Any) -> Iterator[types.FunctionType]:
    if isinstance(attr, (staticmethod, classmethod)):
        attr = attr.__func__
    if isinstance(attr, property):
        for f in (attr.fget, attr.fset, attr.fdel):
            yield from _functions_of(f)
        return
    f = unwrap(attr)
    if isinstance(f, types.FunctionType) and getattr(attr, "__graphjit_island__", None) is None:
        yield f


def _simulated_line(frame: types.FrameType | None, simulators: tuple[str, ...]) -> str | None:
    """Where in the function's code a simulating tracer's ``frame`` called a C function for it: the nearest frame up
    outside the tracer's modules (Paddle's SOT: the code it generated from the function's, which keeps the function's
    module, file and lines).  None where that frame is not the user's code (the tracer's own, such as its debug
    logging, or a framework's): then the call was not made for the function."""
    for _ in range(24):
        if frame is None:
            break
        g = frame.f_globals
        module = g.get("__name__", "")
        if not (isinstance(module, str) and module.startswith(simulators)):
            if not isinstance(module, str) or module.startswith(_SKIP_CODE) or \
                    not (user_globals(g) or module == "__main__"):
                return None
            return f"{frame.f_code.co_filename}:{frame.f_lineno}"
        frame = frame.f_back
    return None


def _simulated_arguments(frame: types.FrameType, fn: Any) -> int | None:
    """How many arguments a simulating tracer's ``frame`` passes ``fn``, where it holds them as SOT's
    ``NullVariable.__call__`` does (``args``: the function, then its arguments; ``kwargs``), else None.  Its own call
    of ``fn`` unpacks them (``f(*args[1:], **kwargs)``), which :func:`graphjit.host_clock.read` cannot count."""
    local = frame.f_locals
    args, kwargs = local.get("args"), local.get("kwargs")
    if type(args) is tuple and args and args[0] is fn and (kwargs is None or type(kwargs) is dict):
        return len(args) - 1 + len(kwargs or ())
    return None


class NameRecorder:
    """Collects the names used by the Python code a call runs (a ``sys.setprofile`` hook on this thread,
    for the block), outside the frameworks', graphjit's and the standard library's own modules, outside
    islands and outside the import of a module the call triggers (its body and what that runs define names, they
    read none of the call's values: a first call importing Dynamo lazily named 6,000 attributes of other modules
    to guard).  Does nothing where a profiler is already set (its hook is kept).

    A compiler translating inside the block runs millions of Python calls of its own that add no names, and a
    profile hook makes each of them several times slower (a Dynamo compile of a transformers model took 3-4x as
    long under it): :meth:`pause` and :meth:`resume`, called by the backend where its compiler starts and ends
    (:meth:`~graphjit.backends.base.Backend.compiles_unwatched`), take the hook off for the compile.  A block left
    paused (its compile ended on another thread) is not complete: its names are then not known, and what it saw of the
    host (:attr:`emitted`, :attr:`clocked`) is what ran before the pause.

    ``names=False``: only what the call does to the host that a replay would not do again (:attr:`emitted`,
    :attr:`clocked`), for a run a tracer translates where the Python it leaves out of its program still runs (Dynamo's
    graph breaks): the names such a run uses are not the function's (its compiled parts use none here), so none is
    recorded.  ``simulators``: module prefixes of a tracer that runs that Python by simulating it and calls the C
    functions it calls from its own frames (Paddle's SOT; ``Backend.simulator_modules``): a clock read or a print from
    them is the function's, where the frame the tracer runs for is the user's code."""

    def __init__(self, names: bool = True, simulators: tuple[str, ...] = ()) -> None:
        self.record_names = names
        self.simulators = simulators  # module prefixes of a tracer that calls C functions for the function's code
        self.names: set[str] = set()
        # id(code) -> (the code that ran, the module globals it ran with): keyed by id, as a code object's hash is
        # computed from its contents on every call
        self.codes: dict[int, tuple[types.CodeType, dict[str, Any]]] = {}
        self.active = False
        self.paused = False
        self.thread = threading.get_ident()
        self.complete = False  # the whole call ran under the hook (no profiler of the user's was in the way)
        self.arguments: dict[int, set[int]] = {}  # id(object) -> id() of the codes that ran with it as an argument
        self.by_object: dict[int, frozenset[str]] = {}
        self.probes = NO_PROBES  # what the code that ran may find absent (:func:`code_probes`; its globals unused)
        self.probed_by_object: dict[int, frozenset[str]] = {}  # id(object) -> the attribute probes of its code
        self.read_globals: dict[tuple[int, str], tuple[dict[str, Any], str]] = {}  # (globals, name) the code loaded
        self.read_cells: dict[int, tuple[str, Any]] = {}  # id(value) -> (name, value): closure values of user code
        self.emitted: list[str] = []  # what the call printed or logged outside islands, and where (a replay would not)
        self.clocked: list[str] = []  # the host clocks the user's code read outside islands, and where
        self.importing: types.FrameType | None = None  # the body of a module being imported meanwhile (skipped)

    def __enter__(self) -> NameRecorder:
        if sys.getprofile() is None:
            sys.setprofile(self._hook)
            self.active = True
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.active:
            sys.setprofile(None)
            self.active = False
            self.complete = not self.paused
            self.paused = False
        probes = [self.probes]
        env = os.environ
        codes = self.codes
        for code, g in codes.values():
            self.names.update(code_names(code))
            found = code_probes(code)
            probes.append(found)
            for var in found.globals:
                self.read_globals.setdefault((id(g), var), (g, var))
            if not _ENV_NAMES.isdisjoint(found.globals):  # it may read the environment: its keys
                named = (g.get(n) for n in found.key_names)
                for key in found.keys | {v for v in named if isinstance(v, str)}:
                    self.read_globals.setdefault((id(env), key), (env, key))  # type: ignore[arg-type]
        self.probes = Probes.union(probes)
        self.codes = {}
        for oid, ran in self.arguments.items():
            names: set[str] = set()
            probed: set[str] = set()
            for code_id in ran:
                code = codes[code_id][0]
                names |= code_names(code)
                probed |= code_probes(code).attributes
            self.by_object[oid] = frozenset(names)
            if probed:
                self.probed_by_object[oid] = frozenset(probed)
        self.arguments.clear()

    def pause(self) -> None:
        """Take the hook off while a compiler translates on this thread (see the class); only the recorder's own
        thread, and only while its hook is the one set."""
        if self.active and not self.paused and threading.get_ident() == self.thread and \
                sys.getprofile() == self._hook:
            sys.setprofile(None)
            self.paused = True

    def resume(self) -> None:
        """Put the hook back after :meth:`pause`, on the recorder's own thread."""
        if self.paused and threading.get_ident() == self.thread and sys.getprofile() is None:
            sys.setprofile(self._hook)
            self.paused = False

    def _hook(self, frame: types.FrameType, event: str, arg: Any) -> None:
        if self.importing is not None:  # a module imported during the call: its code is not the call's reads
            if event == "return" and frame is self.importing:
                self.importing = None
            return
        if event != "call":
            if event != "c_call":
                return
            # most C calls are a framework's (a tensor's methods): told apart by the object they are bound to alone
            # (its type's type, not isinstance: that asks the object for its __class__)
            owner = getattr(arg, "__self__", None)
            if arg is _PRINT or owner is sys.stdout or owner is sys.stderr:
                if len(self.emitted) < MAX_EMITTED and not in_island():
                    self._printed(frame, arg)
            elif (owner is _CLOCKS or issubclass(type(owner), type)) and len(self.clocked) < MAX_EMITTED and \
                    (clock := host_clock.read(arg, frame, self._passed(frame, arg))) is not None:
                self._clocked(frame, clock)
            return
        code = frame.f_code
        if code.co_name == "<module>" and getattr(frame.f_globals.get("__spec__"), "_initializing", False):
            self.importing = frame  # the body of a module being imported (a lazy import on a first call): what it
            return  # and everything it calls name are its own definitions, not values the call reads
        if in_island():
            return
        if code is _EMIT:
            self._logged(frame)
            return
        if not self.record_names:
            return
        g = frame.f_globals
        module = g.get("__name__", "")
        skip = _SKIPPED.get(module) if type(module) is str else False
        if skip is None:
            skip = _SKIPPED[module] = module.startswith(_SKIP_CODE)
        if skip:
            return
        key = id(code)
        if key not in self.codes:
            self.codes[key] = (code, g)
        local = frame.f_locals
        if code.co_freevars and user_globals(g):  # a hook's list in its closure: state a capture copies
            for name in code.co_freevars:
                value = local.get(name)
                if type(value) not in ATOMS and not isinstance(value, OPAQUE):
                    self.read_cells.setdefault(id(value), (name, value))
        for value in local.values():  # the arguments, at the call: which objects this code reads from
            tp = type(value)  # only the type is asked (an object's own __getattr__ could do anything here)
            if tp not in _ATOMS and not issubclass(tp, _NOT_STATE) and (tp.__dictoffset__
                                                                         or "__slots__" in tp.__dict__):
                self.arguments.setdefault(id(value), set()).add(key)

    def _simulating(self, frame: types.FrameType) -> bool:
        """``frame`` is a simulating tracer's (:attr:`simulators`): it calls C functions for the function's code."""
        if not self.simulators:
            return False
        module = frame.f_globals.get("__name__", "")
        return isinstance(module, str) and module.startswith(self.simulators)

    def _passed(self, frame: types.FrameType, fn: Any) -> int | None:
        """The arguments a simulating tracer's ``frame`` passes ``fn`` (:func:`_simulated_arguments`); None for any
        other frame (:func:`graphjit.host_clock.read` counts them from its call instruction)."""
        return _simulated_arguments(frame, fn) if self._simulating(frame) else None

    def _printed(self, frame: types.FrameType, fn: Any) -> None:
        """``fn`` (``print``, or a ``write`` method) is called from ``frame``: noted where it writes to the process's
        standard output or error."""
        if fn is not _PRINT and (getattr(fn, "__self__", None) not in (sys.stdout, sys.stderr) or
                                 getattr(fn, "__name__", None) != "write"):
            return
        module = frame.f_globals.get("__name__", "")
        what = "print()" if fn is _PRINT else "a write to standard output"
        if self._simulating(frame):
            line = _simulated_line(frame, self.simulators)  # a simulating tracer's call, for the function's code
            if line is not None:
                self.emitted.append(f"{what} at {line} (as its tracer runs it)")
            return
        if isinstance(module, str) and module.partition(".")[0] in _OWN_WRITERS:
            return  # a log handler (its record was weighed by _logged), a warning (not watched), a framework's own
        self.emitted.append(f"{what} at {frame.f_code.co_filename}:{frame.f_lineno}")

    def _clocked(self, frame: types.FrameType, clock: str) -> None:
        """``clock`` (:func:`graphjit.host_clock.read`) is read from ``frame``: noted where that is the user's code, not
        a framework's, graphjit's or the standard library's, nor an island's; or where ``frame`` is a simulating
        tracer's (:attr:`simulators`), which calls it for the function's code."""
        module = frame.f_globals.get("__name__", "")
        if in_island() or not isinstance(module, str):
            return
        if self._simulating(frame):
            line = _simulated_line(frame, self.simulators)
            if line is not None:
                self.clocked.append(f"{clock} at {line} (as its tracer runs it)")
            return
        if module.startswith(_SKIP_CODE) or not (user_globals(frame.f_globals) or module == "__main__"):
            return  # (a notebook's: no __file__)
        self.clocked.append(f"{clock} at {frame.f_code.co_filename}:{frame.f_lineno}")

    def _logged(self, frame: types.FrameType) -> None:
        """A logger emits a record in the call that a handler writes (not a ``NullHandler``, not below its level; as
        ``callHandlers`` finds them, ``logging.lastResort`` where none is): where, unless it is graphjit's, a
        framework's (its tracer's and compiler's diagnostics, ``TORCH_LOGS``) or a captured warning.  Never raises
        (a record or logger of the user's own making is read defensively)."""
        try:
            record = frame.f_locals.get("record")
            fields = vars(record) if record is not None else {}
            name, level = fields.get("name"), fields.get("levelno")
            if not isinstance(name, str) or not isinstance(level, int) or name.partition(".")[0] in _OWN_LOGGERS:
                return
            if not _written(frame.f_locals.get("self"), level) or len(self.emitted) >= MAX_EMITTED:
                return
            self.emitted.append(f"logger {name!r} at {fields.get('pathname', '?')}:{fields.get('lineno', '?')}")
        except Exception:  # a profile hook must not raise into the user's call
            return


