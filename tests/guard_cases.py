"""The cases of the guarded-values promise, shared by the CPU tests (emulated CUDA graphs, test_guards.py) and the
GPU tests (test_gpu_guards.py): each one a function that reads a Python value it does not receive, the value
changed between calls as users change it, run graphed and eagerly from the same seed.

A case is built by ``make(device)`` and returns a :class:`Case`: the function to graph, ``before(i)`` (what the
user's loop does before call ``i``: change the value, step a scheduler), ``inputs(i)`` and ``state()`` (the
tensors that must equal the eager run's after every call: parameters, buffers, optimizer state).
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

import graphjit

SCALE = 1.0  # a module global the "global" case's function reads
CONTEXT_SCALE: contextvars.ContextVar[float] = contextvars.ContextVar("CONTEXT_SCALE", default=1.0)
THREAD_STATE = threading.local()  # the "thread_local" case's


@dataclass
class Case:
    fn: Callable[..., Any]
    inputs: Callable[[int], tuple[Any, ...]]
    before: Callable[[int], None] = lambda i: None
    state: Callable[[], list[torch.Tensor]] = lambda: []
    grad: bool = False  # the call runs with autograd on (a training step)
    calls: int = 12
    keeps_graph: bool = True  # the value settles (or toggles), so a graph serves later calls
    extra: dict[str, Any] = field(default_factory=dict)


def _gen(device: str, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def _xs(device: str, n: int, shape: tuple[int, ...], seed: int = 1) -> list[torch.Tensor]:
    g = _gen(device, seed)
    return [torch.randn(*shape, generator=g, device=device) for _ in range(n)]


# -- the function reads a value of an object, a global, a closed-over container ---------------------------
def attribute(device: str) -> Case:
    """``x / m.temp``, the temperature changed before every call (then settles)."""
    torch.manual_seed(0)
    m = torch.nn.Linear(16, 16).to(device)
    m.temp = 1.0
    xs = _xs(device, 16, (4, 16))

    def step(x):
        return m(x) / m.temp

    def before(i):
        m.temp = 1.0 + min(i, 8)  # changes on every call up to call 8, then stays

    return Case(step, lambda i: (xs[i],), before, lambda: [m.weight], calls=16)


def global_value(device: str) -> Case:
    """A module global float, toggled between two values."""
    torch.manual_seed(0)
    w = torch.randn(16, 16, device=device)
    xs = _xs(device, 12, (4, 16))

    def step(x):
        return (x @ w) * SCALE

    def before(i):
        global SCALE
        SCALE = 2.0 if i % 2 else 0.5

    return Case(step, lambda i: (xs[i],), before)


def context_variable(device: str) -> Case:
    """A ``contextvars.ContextVar``'s value (``CONTEXT_SCALE.get()``), toggled between two values (under
    ``tracer="compile"`` too: tests/test_context_values.py runs Dynamo's front end on the CPU)."""
    torch.manual_seed(0)
    w = torch.randn(16, 16, device=device)
    xs = _xs(device, 12, (4, 16))

    def step(x):
        return (x @ w) * CONTEXT_SCALE.get()

    def before(i):
        CONTEXT_SCALE.set(2.0 if i % 2 else 0.5)

    return Case(step, lambda i: (xs[i],), before)


def thread_local(device: str) -> Case:
    """A ``threading.local``'s attribute (``THREAD_STATE.k``), toggled between two values (both tracers, as above)."""
    torch.manual_seed(0)
    w = torch.randn(16, 16, device=device)
    xs = _xs(device, 12, (4, 16))

    def step(x):
        return (x @ w) * THREAD_STATE.k

    def before(i):
        THREAD_STATE.k = 2.0 if i % 2 else 0.5

    return Case(step, lambda i: (xs[i],), before)


def list_item(device: str) -> Case:
    """An item of a closed-over list, changed on every call: runs uncaptured, right."""
    torch.manual_seed(0)
    w = torch.randn(16, 16, device=device)
    scales = [1.0, 3.0]
    xs = _xs(device, 10, (4, 16))

    def step(x):
        return (x @ w) * scales[0] + scales[1]

    def before(i):
        scales[0] = 1.0 + 0.5 * i

    return Case(step, lambda i: (xs[i],), before, calls=10, keeps_graph=False)


def slice_bound(device: str) -> Case:
    """``y[:, :self.k]``: k goes from 8 to 4 once; the graph for k=8 must never return 8 columns again."""
    torch.manual_seed(0)

    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(16, 16)
            self.k = 8

        def forward(self, x):
            return self.lin(x)[:, : self.k]

    m = Head().to(device)
    xs = _xs(device, 12, (4, 16))

    def before(i):
        m.k = 8 if i < 5 else 4

    return Case(m, lambda i: (xs[i],), before)


def dict_item(device: str) -> Case:
    """A closed-over dict item picks which weight to multiply by (toggled)."""
    torch.manual_seed(0)
    weights = {"a": torch.randn(16, 16, device=device), "b": torch.randn(16, 16, device=device)}
    cfg = {"which": "a"}
    xs = _xs(device, 12, (4, 16))

    def step(x):
        return x @ weights[cfg["which"]]

    def before(i):
        cfg["which"] = "a" if (i // 3) % 2 == 0 else "b"

    return Case(step, lambda i: (xs[i],), before)


def set_closure(device: str) -> Case:
    """A closed-over set the step reads (``len(tags)``, ``"double" in tags``), grown in place, then settled."""
    torch.manual_seed(0)
    w = torch.randn(16, 16, device=device)
    tags: set[str] = set()
    xs = _xs(device, 14, (4, 16))

    def step(x):
        y = (x @ w) * (1 + len(tags))
        return y * 2 if "double" in tags else y

    def before(i):
        if i in (3, 6):
            tags.add("a" if i == 3 else "double")

    return Case(step, lambda i: (xs[i],), before, calls=14)


def set_attribute(device: str) -> Case:
    """A module's set attribute the forward reads, changed in place with the same size (``{"a"}`` -> ``{"b"}``)."""
    torch.manual_seed(0)
    m = torch.nn.Linear(16, 16).to(device)
    m.active = {"a"}
    xs = _xs(device, 14, (4, 16))

    def step(x):
        return m(x) * (3.0 if "b" in m.active else 1.0)

    def before(i):
        if i == 5:
            m.active.discard("a")
            m.active.add("b")

    return Case(step, lambda i: (xs[i],), before, lambda: [m.weight], calls=14)


class _Pending:
    """An argument object holding a tensor and a set of pending ids (a request batch, a cache's bookkeeping)."""

    def __init__(self, x: torch.Tensor) -> None:
        self.x = x
        self.pending: set[int] = set()


def set_in_argument(device: str) -> Case:
    """A set inside an argument object, grown in place between calls: ``x * (1 + len(cache.pending))``."""
    torch.manual_seed(0)
    xs = _xs(device, 14, (4, 16))
    holder = _Pending(xs[0])

    def step(h):
        return h.x * (1 + len(h.pending))

    def inputs(i):
        holder.x = xs[i]
        return (holder,)

    def before(i):
        if i in (4, 8):
            holder.pending.add(i)

    return Case(step, inputs, before, calls=14)


def set_in_tuple(device: str) -> Case:
    """A set inside a namedtuple held in a closure (a config): ``"relu" in cfg.skip``, the set changed in place."""
    import collections

    torch.manual_seed(0)
    w = torch.randn(16, 16, device=device)
    Config = collections.namedtuple("Config", "scale skip")
    cfg = Config(2.0, {"relu"})
    xs = _xs(device, 14, (4, 16))

    def step(x):
        h = (x @ w) * cfg.scale
        return h if "relu" in cfg.skip else torch.relu(h)

    def before(i):
        if i == 5:
            cfg.skip.discard("relu")

    return Case(step, lambda i: (xs[i],), before, calls=14)


class _Gate:
    """A plain object compared by identity (no ``__eq__`` of its own)."""

    def __init__(self, fn):
        self.fn = fn


def tuple_rebound(device: str) -> Case:
    """A tuple of a number and an object in a Module attribute, rebound with another number: ``m.cfg = (3, gate)``."""
    torch.manual_seed(0)
    m = torch.nn.Linear(16, 16).to(device)
    gate = _Gate(torch.tanh)
    m.cfg = (1, gate)
    xs = _xs(device, 14, (4, 16))

    def step(x):
        k, g = m.cfg
        return g.fn(m(x)) * k

    def before(i):
        if i == 5:
            m.cfg = (3, gate)

    return Case(step, lambda i: (xs[i],), before, lambda: [m.weight], calls=14)


def set_of_functions(device: str) -> Case:
    """A closed-over set of functions (activations to apply), grown in place."""
    torch.manual_seed(0)
    w = torch.randn(16, 16, device=device)
    acts = {torch.relu}
    xs = _xs(device, 14, (4, 16))

    def step(x):
        h = x @ w
        return sum(f(h) for f in sorted(acts, key=lambda f: f.__name__))

    def before(i):
        if i == 5:
            acts.add(torch.tanh)

    return Case(step, lambda i: (xs[i],), before, calls=14)


def dict_of_functions(device: str) -> Case:
    """A closed-over dict mapping a name to an activation function, the function swapped (a config's choice)."""
    torch.manual_seed(0)
    w = torch.randn(16, 16, device=device)
    acts = {"act": torch.relu}
    xs = _xs(device, 14, (4, 16))

    def step(x):
        return acts["act"](x @ w)

    def before(i):
        acts["act"] = torch.tanh if (i // 4) % 2 else torch.relu

    return Case(step, lambda i: (xs[i],), before, calls=14)


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)
        self.act = torch.nn.ReLU()

    def forward(self, x):
        return self.act(self.lin(x))


def swapped_submodule(device: str) -> Case:
    """A submodule swapped for another (``m.act = nn.Tanh()``: held in the Module's ``_modules``), then back."""
    torch.manual_seed(0)
    m = _Block().to(device)
    relu, tanh = m.act, torch.nn.Tanh()
    xs = _xs(device, 14, (4, 16))

    def before(i):
        m.act = tanh if 4 <= i < 9 else relu

    return Case(m, lambda i: (xs[i],), before, lambda: [m.lin.weight], calls=14)


class _Scaled(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)
        self.scale = 1.0

    def forward(self, x):
        return self.lin(x) * self.scale


class _Parent(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.child = _Scaled()

    def forward(self, x):
        return self.child(x) + 1


def submodule_attribute(device: str) -> Case:
    """A float attribute of a submodule, read by the submodule's forward, changed on the parent's child: the graphed
    function is the parent (``self.child.scale``)."""
    torch.manual_seed(0)
    m = _Parent().to(device)
    xs = _xs(device, 14, (4, 16))

    def before(i):
        m.child.scale = 1.0 if i < 5 else 2.5

    return Case(m, lambda i: (xs[i],), before, lambda: [m.child.lin.weight], calls=14)


@dataclasses.dataclass
class _Knobs:
    """A config object whose ``==`` compares its fields (and which is therefore unhashable)."""

    scale: float
    act: str


def dataclass_rebound(device: str) -> Case:
    """A dataclass config in a Module attribute replaced by a changed copy (``dataclasses.replace``), then back.  (A
    new copy made before every call is a new object each time: such calls run uncaptured, never stale.)"""
    torch.manual_seed(0)
    m = torch.nn.Linear(16, 16).to(device)
    first = _Knobs(1.0, "relu")
    second = dataclasses.replace(first, scale=2.0, act="tanh")
    m.knobs = first
    xs = _xs(device, 14, (4, 16))

    def step(x):
        h = m(x) * m.knobs.scale
        return torch.relu(h) if m.knobs.act == "relu" else torch.tanh(h)

    def before(i):
        m.knobs = second if 5 <= i < 9 else first

    return Case(step, lambda i: (xs[i],), before, lambda: [m.weight], calls=14)


def nested_tuple_rebound(device: str) -> Case:
    """A namedtuple holding a tuple of a number and an object, in a closure list, rebound with another number."""
    import collections

    torch.manual_seed(0)
    w = torch.randn(16, 16, device=device)
    Cfg = collections.namedtuple("Cfg", "inner")
    gate = _Gate(torch.tanh)
    holder = [Cfg(((1, gate),))]
    xs = _xs(device, 14, (4, 16))

    def step(x):
        (k, g), = holder[0].inner
        return g.fn(x @ w) * k

    def before(i):
        if i == 5:
            holder[0] = Cfg(((3, gate),))

    return Case(step, lambda i: (xs[i],), before, calls=14)


class _Buffered(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)
        self.register_buffer("gain", torch.ones(16))

    def forward(self, x):
        return self.lin(x) * self.gain


def rebound_buffer(device: str) -> Case:
    """A registered buffer rebound to another tensor (``m.gain = t``: what re-registering a cache does), then back:
    the graph reads the buffer at its address, so a rebound one is another graph's."""
    torch.manual_seed(0)
    m = _Buffered().to(device)
    ones, doubled = m.gain, torch.full((16,), 2.0, device=device)
    xs = _xs(device, 14, (4, 16))

    def before(i):
        m.gain = doubled if 4 <= i < 9 else ones

    return Case(m, lambda i: (xs[i],), before, lambda: [m.gain], calls=14)


def rebound_parameter(device: str) -> Case:
    """A submodule's weight replaced by a new Parameter (weights swapped in by hand), then the old one put back."""
    torch.manual_seed(0)
    m = _Parent().to(device)
    old = m.child.lin.weight
    new = torch.nn.Parameter(torch.randn(16, 16, generator=_gen(device, 7), device=device) / 4)

    def before(i):
        m.child.lin.weight = new if 4 <= i < 9 else old

    xs = _xs(device, 14, (4, 16))
    return Case(m, lambda i: (xs[i],), before, lambda: [m.child.lin.weight], calls=14)


class _Optional(torch.nn.Module):
    """A module whose forward uses a buffer and a submodule only where they exist (``hasattr``; ``getattr`` with a
    default), as models with optional parts do."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        if hasattr(self, "shift"):
            y = y + self.shift
        extra = getattr(self, "extra", None)
        return y if extra is None else extra(y)


def _registered(device: str, what: str) -> Case:
    """A buffer (``register_buffer``) or a submodule (``m.extra = Linear(...)``) the module's ``forward`` looks up
    with a fallback, registered after call 5: it lands in the module's ``_buffers`` / ``_modules``, not in its
    ``__dict__``; before, the graph kept the branch without it."""
    torch.manual_seed(0)
    m = _Optional().to(device)
    extra = torch.nn.Linear(16, 16).to(device)
    xs = _xs(device, 12, (4, 16))

    def before(i):
        if i == 5:
            if what == "buffer":
                m.register_buffer("shift", torch.full((16,), 0.5, device=device))
            else:
                m.extra = extra

    return Case(m, lambda i: (xs[i],), before)


def probed_registered_buffer(device: str) -> Case:
    return _registered(device, "buffer")


def probed_registered_submodule(device: str) -> Case:
    return _registered(device, "submodule")


def _scaled(x: torch.Tensor, w: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    return (x @ w) * scale


def partial_keywords(device: str) -> Case:
    """A ``functools.partial`` the function calls, its keyword changed in place after call 5
    (``p.keywords["scale"] = 2.0``): the partial's call reads its keywords in C, where no code names them."""
    torch.manual_seed(0)
    w = torch.randn(16, 16, device=device)
    xs = _xs(device, 12, (4, 16))
    p = functools.partial(_scaled, w=w, scale=1.0)

    def before(i):
        if i == 5:
            p.keywords["scale"] = 2.0

    return Case(lambda x: p(x), lambda i: (xs[i],), before)


WEIGHT: torch.Tensor | None = None  # a module global tensor the "rebound_global_tensor" case's function reads


def _rebound(device: str, where: str) -> Case:
    """A tensor the function reads without receiving it, held elsewhere than in a Module (``where``: a closure cell, a
    global, a plain object's attribute, a closed-over list's item), rebound to another tensor for a few calls (new
    weights loaded by assignment), then back: the graph reads the tensor at its address, so a rebound one is another
    graph's.  Before, the graph went on reading the old tensor."""
    global WEIGHT
    torch.manual_seed(0)
    old = torch.randn(16, 16, device=device) / 4
    new = torch.randn(16, 16, generator=_gen(device, 7), device=device) / 4
    xs = _xs(device, 14, (4, 16))
    box = type("Weights", (), {})()
    box.w = old
    held = [old]
    WEIGHT = old

    def make() -> tuple[Callable[..., Any], Callable[[torch.Tensor], None]]:
        w = old

        def by_closure(x):
            return torch.tanh(x @ w)

        def rebind(t):
            nonlocal w
            w = t

        return by_closure, rebind

    by_closure, rebind = make()

    def by_global(x):
        return torch.tanh(x @ WEIGHT)

    def by_attribute(x):
        return torch.tanh(x @ box.w)

    def by_item(x):
        return torch.tanh(x @ held[0])

    def before(i):
        global WEIGHT
        t = new if 4 <= i < 9 else old
        rebind(t)
        WEIGHT = t
        box.w = t
        held[0] = t

    fn = {"closure": by_closure, "global": by_global, "attribute": by_attribute, "item": by_item}[where]
    return Case(fn, lambda i: (xs[i],), before, calls=14)


def rebound_closure_tensor(device: str) -> Case:
    return _rebound(device, "closure")


def rebound_global_tensor(device: str) -> Case:
    return _rebound(device, "global")


def rebound_attribute_tensor(device: str) -> Case:
    return _rebound(device, "attribute")


def rebound_list_tensor(device: str) -> Case:
    return _rebound(device, "item")


SETTINGS: dict[str, float] = {"scale": 1.0}  # a module global dict the "rebuilt_global_dict" case rebinds


def _rebuilt(device: str, where: str) -> Case:
    """A list or dict the function reads an item of, made anew before every call (``m.cfg = {"scale": s}``, a config
    reloaded, a global rebound), equal for a few calls, then other values, then back (``where``: an object's
    attribute, a global, a closure cell, a dict in a dict, a dict of tensors, a list).  Before, the guards read the
    first dict, which nobody changes any more: every later graph replayed the first values."""
    global SETTINGS
    torch.manual_seed(0)
    w_a = torch.randn(16, 16, device=device) / 4
    w_b = torch.randn(16, 16, generator=_gen(device, 7), device=device) / 4
    xs = _xs(device, 14, (4, 16))
    box = type("Holder", (), {})()
    box.cfg = {"scale": 1.0}
    box.weights = {"w": w_a}
    box.order = [1.0, 2.0]
    state = {"cfg": {"scale": 1.0}}

    def make() -> tuple[Callable[..., Any], Callable[[dict[str, float]], None]]:
        cfg = {"scale": 1.0}

        def by_closure(x):
            return torch.tanh(x @ w_a) * cfg["scale"]

        def rebind(d):
            nonlocal cfg
            cfg = d

        return by_closure, rebind

    by_closure, rebind = make()
    fns = {
        "attribute": lambda x: torch.tanh(x @ w_a) * box.cfg["scale"],
        "global": lambda x: torch.tanh(x @ w_a) * SETTINGS["scale"],
        "closure": by_closure,
        "nested": lambda x: torch.tanh(x @ w_a) * state["cfg"]["scale"],
        "tensors": lambda x: torch.tanh(x @ box.weights["w"]),
        "list": lambda x: torch.tanh(x @ w_a) * box.order[0] + box.order[1],
    }

    def before(i):
        global SETTINGS
        other = 4 <= i < 9
        scale = 3.0 if other else 1.0
        box.cfg = {"scale": scale}
        SETTINGS = {"scale": scale}
        rebind({"scale": scale})
        state["cfg"] = {"scale": scale}
        box.weights = {"w": w_b if other else w_a}
        box.order = [scale, 2.0]

    return Case(fns[where], lambda i: (xs[i],), before, calls=14)


def rebuilt_attribute_dict(device: str) -> Case:
    return _rebuilt(device, "attribute")


def rebuilt_global_dict(device: str) -> Case:
    return _rebuilt(device, "global")


def rebuilt_closure_dict(device: str) -> Case:
    return _rebuilt(device, "closure")


def rebuilt_nested_dict(device: str) -> Case:
    return _rebuilt(device, "nested")


def rebuilt_dict_of_tensors(device: str) -> Case:
    return _rebuilt(device, "tensors")


def rebuilt_list(device: str) -> Case:
    return _rebuilt(device, "list")


class Tuning:
    """A class the "class_attribute" and "class_nested" cases' functions read by its global name: a plain class
    attribute and a container of containers on the class (settings users toggle on the class, not an instance)."""

    scale = 1.0
    table: dict[str, list[float]] = {"shift": [0.0]}


def class_attribute(device: str) -> Case:
    """``Tuning.scale``: a class attribute the function reads through a global class, toggled.  Before, a class
    reached by its name was held by identity only: its attributes were never compared."""
    torch.manual_seed(0)
    w = torch.randn(16, 16, device=device)
    xs = _xs(device, 12, (4, 16))
    Tuning.scale = 1.0

    def step(x):
        return (x @ w) * Tuning.scale

    def before(i):
        Tuning.scale = 2.0 if (i // 3) % 2 else 1.0

    return Case(step, lambda i: (xs[i],), before)


def class_nested(device: str) -> Case:
    """``Tuning.table["shift"][0]``: a list in a dict on the class, changed in place, then settled.  Before, a class's
    containers were guarded one level down: the list inside the dict was not."""
    torch.manual_seed(0)
    w = torch.randn(16, 16, device=device)
    xs = _xs(device, 12, (4, 16))
    Tuning.table = {"shift": [0.0]}

    def step(x):
        return (x @ w) + Tuning.table["shift"][0]

    def before(i):
        Tuning.table["shift"][0] = float(min(i, 5))

    return Case(step, lambda i: (xs[i],), before)


def settings_key_added(device: str) -> Case:
    """``for name, v in scales.items()``: a dict of settings the function iterates gets a key after a few calls.
    Before, dicts had only their values guarded, so the graph kept multiplying by the old keys' values alone."""
    torch.manual_seed(0)
    w = torch.randn(16, 16, device=device)
    xs = _xs(device, 12, (4, 16))
    scales = {"a": 2.0}

    def step(x):
        y = x @ w
        for _name, v in scales.items():
            y = y * v
        return y

    def before(i):
        if i == 5:
            scales["b"] = 3.0
        if i == 8:
            del scales["a"]

    return Case(step, lambda i: (xs[i],), before)


class _Probed:
    """An object the "probed_*" cases' functions look names up on, with defaults for names it does not have."""


ENV_FLAG = "GRAPHJIT_TEST_GUARD_CASE_FLAG"  # an environment variable the "probed_environment" case reads


def _probed(device: str, where: str) -> Case:
    """A value the function looks up with a default, absent at the capture and set after call 5 (then kept):
    ``getattr(knobs, "scale", 1.0)``, ``hasattr(knobs, "doubled")``, ``settings.get("scale", 1.0)`` on a dict of
    settings and on an empty one, ``"scale" in empty.keys()``, ``globals().get(...)``, ``os.environ.get(...)``.
    Before, only values present at the capture were guarded: the graph kept the default."""
    import os

    torch.manual_seed(0)
    w = torch.randn(16, 16, device=device)
    xs = _xs(device, 12, (4, 16))
    knobs = _Probed()
    settings: dict[str, float] = {"shift": 0.0}
    empty: dict[str, float] = {}
    globals().pop("PROBED_SCALE", None)
    os.environ.pop(ENV_FLAG, None)

    fns = {
        "attribute": lambda x: (x @ w) * getattr(knobs, "scale", 1.0),
        "hasattr": lambda x: (x @ w) * (2.0 if hasattr(knobs, "doubled") else 1.0),
        "dict": lambda x: (x @ w) * settings.get("scale", 1.0) + settings["shift"],
        "empty_dict": lambda x: (x @ w) * empty.get("scale", 1.0),
        "keys_view": lambda x: (x @ w) * (2.0 if "scale" in empty.keys() else 1.0),
        "global": lambda x: (x @ w) * globals().get("PROBED_SCALE", 1.0),
        "environment": lambda x: (x @ w) * (3.0 if os.environ.get(ENV_FLAG) else 1.0),
    }
    sets = {
        "attribute": lambda: setattr(knobs, "scale", 2.0),
        "hasattr": lambda: setattr(knobs, "doubled", True),
        "dict": lambda: settings.__setitem__("scale", 2.0),
        "empty_dict": lambda: empty.__setitem__("scale", 2.0),
        "keys_view": lambda: empty.__setitem__("scale", 2.0),
        "global": lambda: globals().__setitem__("PROBED_SCALE", 2.0),
        "environment": lambda: os.environ.__setitem__(ENV_FLAG, "1"),
    }

    def before(i):
        if i == 5:
            sets[where]()
        if i == 11 and where == "environment":  # the last call: the process's environment as it was
            os.environ.pop(ENV_FLAG, None)

    return Case(fns[where], lambda i: (xs[i],), before)


def probed_attribute(device: str) -> Case:
    return _probed(device, "attribute")


def probed_hasattr(device: str) -> Case:
    return _probed(device, "hasattr")


def probed_dict_key(device: str) -> Case:
    return _probed(device, "dict")


def probed_empty_dict_key(device: str) -> Case:
    return _probed(device, "empty_dict")


def probed_keys_view(device: str) -> Case:
    return _probed(device, "keys_view")


def probed_global(device: str) -> Case:
    return _probed(device, "global")


def probed_environment(device: str) -> Case:
    return _probed(device, "environment")


BLOCK_GATED = True  # a module global the "submodule_global" case's submodule reads in its forward
BLOCK_TABLE: dict[str, float] = {"scale": 1.0}  # a global dict of settings the "submodule_global_dict" case's reads


class _GatedBlock(torch.nn.Module):
    """A submodule whose ``forward`` reads globals of its own file (as model files keep flags and tables)."""

    def __init__(self, device: str) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(16, 16).to(device)

    def forward(self, x):
        h = self.lin(x) * BLOCK_TABLE["scale"]
        return torch.relu(h) if BLOCK_GATED else torch.tanh(h)


def _submodule_global(device: str, where: str) -> Case:
    """The graphed function calls a model whose submodule's ``forward`` reads a global of its own file: a flag toggled,
    a dict of settings changed in place.  Before, only the graphed function's own globals were guarded: the graph kept
    the first branch and value."""
    global BLOCK_GATED, BLOCK_TABLE
    torch.manual_seed(0)
    BLOCK_GATED, BLOCK_TABLE = True, {"scale": 1.0}
    model = torch.nn.Sequential(_GatedBlock(device)).to(device)
    xs = _xs(device, 12, (4, 16))

    def before(i):
        global BLOCK_GATED
        flip = (i // 3) % 2 == 1
        if where == "flag":
            BLOCK_GATED = not flip
        else:
            BLOCK_TABLE["scale"] = 2.0 if flip else 1.0

    return Case(lambda x: model(x), lambda i: (xs[i],), before, lambda: [p for p in model.parameters()])


class _ProbingBlock(torch.nn.Module):
    """A submodule whose ``forward`` looks up a config's optional setting and an environment variable (as model
    files do: ``getattr(self.config, "x", default)``, ``os.environ.get(...)``); the config's own method runs too, so
    the config is an argument of code that ran."""

    def __init__(self, device: str, config: Any) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(16, 16).to(device)
        self.config = config

    def forward(self, x):
        import os

        h = self.lin(x) * self.config.factor() * getattr(self.config, "scale", 1.0)
        return h * (3.0 if os.environ.get(ENV_FLAG) else 1.0)


class _ProbedConfig:
    def factor(self) -> float:
        return 1.0


def _submodule_probe(device: str, where: str) -> Case:
    """A submodule reads ``getattr(self.config, "scale", 1.0)`` (the config absent ``scale`` at the capture, set after
    call 5) or ``os.environ.get(ENV_FLAG)`` (set after call 5, removed before the last call).  Before, only the graphed
    function's own lookups were guarded absent, and not on an object its own method made an argument."""
    import os

    torch.manual_seed(0)
    config = _ProbedConfig()
    os.environ.pop(ENV_FLAG, None)
    model = torch.nn.Sequential(_ProbingBlock(device, config)).to(device)
    xs = _xs(device, 12, (4, 16))

    def before(i):
        if i == 5:
            if where == "config":
                config.scale = 2.0
            else:
                os.environ[ENV_FLAG] = "1"
        if i == 11:
            os.environ.pop(ENV_FLAG, None)

    # tracer="compile" records no names (Dynamo translates the code) and Dynamo on torch 2.11 does not guard
    # os.environ: an environment variable read below the graphed function is not seen there (a known gap)
    extra = {"tracers": ("eager",)} if where == "environment" else {}
    return Case(lambda x: model(x), lambda i: (xs[i],), before, lambda: [p for p in model.parameters()], extra=extra)


def submodule_config_probe(device: str) -> Case:
    return _submodule_probe(device, "config")


def submodule_environment(device: str) -> Case:
    return _submodule_probe(device, "environment")


def submodule_global(device: str) -> Case:
    return _submodule_global(device, "flag")


def submodule_global_dict(device: str) -> Case:
    return _submodule_global(device, "table")


VALUES = {"attribute": attribute, "global": global_value, "context_variable": context_variable,
          "thread_local": thread_local, "list_item": list_item, "slice_bound": slice_bound,
          "dict_item": dict_item, "set_closure": set_closure, "set_attribute": set_attribute,
          "set_in_argument": set_in_argument, "set_in_tuple": set_in_tuple, "tuple_rebound": tuple_rebound,
          "set_of_functions": set_of_functions, "dict_of_functions": dict_of_functions,
          "swapped_submodule": swapped_submodule, "submodule_attribute": submodule_attribute,
          "dataclass_rebound": dataclass_rebound, "nested_tuple_rebound": nested_tuple_rebound,
          "rebound_buffer": rebound_buffer, "rebound_parameter": rebound_parameter,
          "class_attribute": class_attribute, "class_nested": class_nested, "settings_key_added": settings_key_added,
          "rebound_closure_tensor": rebound_closure_tensor, "rebound_global_tensor": rebound_global_tensor,
          "rebound_attribute_tensor": rebound_attribute_tensor, "rebound_list_tensor": rebound_list_tensor,
          "rebuilt_attribute_dict": rebuilt_attribute_dict, "rebuilt_global_dict": rebuilt_global_dict,
          "rebuilt_closure_dict": rebuilt_closure_dict, "rebuilt_nested_dict": rebuilt_nested_dict,
          "rebuilt_dict_of_tensors": rebuilt_dict_of_tensors, "rebuilt_list": rebuilt_list,
          "probed_attribute": probed_attribute, "probed_hasattr": probed_hasattr, "probed_dict_key": probed_dict_key,
          "probed_empty_dict_key": probed_empty_dict_key, "probed_keys_view": probed_keys_view,
          "probed_global": probed_global, "probed_registered_buffer": probed_registered_buffer,
          "probed_registered_submodule": probed_registered_submodule, "partial_keywords": partial_keywords,
          "probed_environment": probed_environment, "submodule_global": submodule_global,
          "submodule_global_dict": submodule_global_dict, "submodule_config_probe": submodule_config_probe,
          "submodule_environment": submodule_environment}


# -- training loops as users write them --------------------------------------------------------------------
def _mlp(device: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to(device)


def _train_case(device: str, model: torch.nn.Module, opt: torch.optim.Optimizer, before: Callable[[int], None],
                calls: int = 24, keeps_graph: bool = True, bn: torch.nn.Module | None = None) -> Case:
    xs = _xs(device, calls, (8, 16))
    ys = _xs(device, calls, (8, 4), seed=2)

    def step(x, y):
        opt.zero_grad(set_to_none=False)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    def state():
        out = [p for p in model.parameters()] + [b for b in model.buffers()]
        for s in opt.state.values():
            out += [v for v in s.values() if isinstance(v, torch.Tensor)]
        return out

    return Case(step, lambda i: (xs[i], ys[i]), before, state, grad=True, calls=calls, keeps_graph=keeps_graph)


def _adamw(model: torch.nn.Module, device: str, lr: Any = 1e-2, **kw: Any) -> torch.optim.Optimizer:
    """AdamW(capturable=True) on a GPU; on the CPU (no capturable AdamW there: its step counts are read with
    .item()) SGD with momentum, which keeps the same hyperparameters in ``param_groups``."""
    if device == "cpu":
        return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, **kw)
    return torch.optim.AdamW(model.parameters(), lr=lr, capturable=True, **kw)


def lambda_lr(device: str) -> Case:
    """LambdaLR stepped after every call (a float lr that changes every step): on a GPU AdamW (made capturable)
    reads it from a tensor graphjit fills, so one graph serves every call; on the CPU the stand-in, SGD with
    momentum, reads it as a number: uncaptured, right."""
    model = _mlp(device)
    opt = _adamw(model, device)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.95 ** s)

    def before(i):
        if i:
            sched.step()

    return _train_case(device, model, opt, before, keeps_graph=device != "cpu")


def warmup_by_hand(device: str) -> Case:
    """``for g in opt.param_groups: g["lr"] = ...`` for 8 steps, then constant: captured once it settles."""
    model = _mlp(device)
    opt = _adamw(model, device)

    def before(i):
        for g in opt.param_groups:
            g["lr"] = 1e-2 * min(1.0, (i + 1) / 8)

    return _train_case(device, model, opt, before)


def step_lr_sgd(device: str) -> Case:
    """SGD(momentum=0.9) with StepLR (the lr halves every 6 steps): one graph per lr."""
    model = _mlp(device)
    opt = torch.optim.SGD(model.parameters(), lr=5e-2, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=6, gamma=0.5)

    def before(i):
        if i:
            sched.step()

    return _train_case(device, model, opt, before)


def weight_decay(device: str) -> Case:
    """``weight_decay`` changed in ``param_groups`` half way."""
    model = _mlp(device)
    opt = _adamw(model, device, weight_decay=0.01)

    def before(i):
        if i == 12:
            opt.param_groups[0]["weight_decay"] = 0.2

    return _train_case(device, model, opt, before)


def tensor_lr(device: str) -> Case:
    """The lr in a tensor the scheduler fills (torch's recipe): graphed throughout."""
    model = _mlp(device)
    opt = _adamw(model, device, lr=torch.tensor(1e-2, device=device))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.95 ** s)

    def before(i):
        if i:
            sched.step()

    case = _train_case(device, model, opt, before)
    case.extra["cpu_sync"] = True
    return case


def batchnorm_step(device: str) -> Case:
    """A whole training step of a model with BatchNorm: running statistics as eager's after every call."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 4)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=5e-2, momentum=0.9)
    return _train_case(device, model, opt, lambda i: None, calls=10)


def resumed_from_checkpoint(device: str) -> Case:
    """``opt.load_state_dict(saved)`` between steps (a resumed run, another lr in the checkpoint): torch rebinds the
    optimizer's ``param_groups`` and ``state`` to new lists, dicts and tensors, and says so (a post hook graphjit
    installs): the graphs captured before are not replayed again.  Before, the guards kept reading the old containers:
    the graph went on with the old lr and the old momentum buffers."""
    model = _mlp(device)
    opt = torch.optim.SGD(model.parameters(), lr=5e-2, momentum=0.9)
    saved: list[Any] = []

    def before(i):
        if i == 3:
            state = opt.state_dict()
            state["param_groups"][0]["lr"] = 1e-2
            saved.append(state)
        if i == 7:
            opt.load_state_dict(saved[0])  # back to the state after call 2, with the lower lr

    return _train_case(device, model, opt, before, calls=14)


TRAINING = {"lambda_lr": lambda_lr, "warmup_by_hand": warmup_by_hand, "step_lr_sgd": step_lr_sgd,
            "weight_decay": weight_decay, "tensor_lr": tensor_lr, "batchnorm_step": batchnorm_step,
            "resumed_from_checkpoint": resumed_from_checkpoint}


def batchnorm_no_grad(device: str) -> Case:
    """BatchNorm in train mode under no_grad: running statistics equal eager's after every call."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32)).to(device).train()
    xs = _xs(device, 8, (16, 16))
    return Case(model, lambda i: (xs[i],), lambda i: None, lambda: list(model.buffers()), calls=8)


def batchnorm_functional(device: str) -> Case:
    """``F.batch_norm`` with running statistics in plain attributes (not buffers), in train mode under no_grad: the
    kernel writes them without moving their version counters; before, graphjit did not see the write, so verify's
    eager reference and its replay both updated them at the capture call."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(16, 32).to(device)
    stats = type("Stats", (), {})()
    stats.mean, stats.var = torch.zeros(32, device=device), torch.ones(32, device=device)

    def step(x):
        return torch.nn.functional.batch_norm(lin(x), stats.mean, stats.var, training=True, momentum=0.3)

    xs = _xs(device, 8, (16, 16))
    return Case(step, lambda i: (xs[i],), lambda i: None, lambda: [stats.mean, stats.var], calls=8)


# -- running a case ---------------------------------------------------------------------------------------------
def run(make: Callable[[str], Case], device: str, graph: bool, check_each: bool = True,
        **options: Any) -> tuple[list[Any], list[list[torch.Tensor]], Any]:
    """Outputs of every call, the state after every call (copies), and the graphed function (or None)."""
    case = make(device)
    f = graphjit.graphed(case.fn, **options) if graph else case.fn
    outs: list[Any] = []
    states: list[list[torch.Tensor]] = []
    for i in range(case.calls):
        case.before(i)
        args = case.inputs(i)
        if case.grad:
            out = f(*args)
        else:
            with torch.no_grad():
                out = f(*args)
        outs.append(out.detach().clone() if isinstance(out, torch.Tensor) else out)
        if check_each or i == case.calls - 1:
            states.append([t.detach().clone() for t in case.state()])
    return outs, states, (f if graph else None)


def max_diff(a: list[Any], b: list[Any]) -> float:
    """The largest absolute difference between two lists of tensors (inf where shapes differ or NaN appears)."""
    worst = 0.0
    assert len(a) == len(b), (len(a), len(b))
    for x, y in zip(a, b):
        if x.shape != y.shape:
            return float("inf")
        if not (torch.isfinite(x).all() and torch.isfinite(y).all()):
            return float("inf")
        if x.numel():
            worst = max(worst, float((x.double() - y.double()).abs().max()))
    return worst
