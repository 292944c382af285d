"""Arguments graphjit keys by value, and what a capture scope says on a machine without CUDA (issue 20's
CPU items): an unhashable object that holds no tensors is the documented SignatureError naming the argument
with every tracer, before the function runs; one that holds tensors is still walked; the scope's summary
says that no graph was captured, how many calls ran the traced function instead, and why."""

from __future__ import annotations

import dataclasses
import importlib.util
import logging

import pytest

import graphjit

HAS_TORCH = importlib.util.find_spec("torch") is not None
CUDA = HAS_TORCH and __import__("torch").cuda.is_available()


class NoHash:
    """An argument object whose class says it is unhashable, holding only plain values."""

    __hash__ = None  # type: ignore[assignment]

    def __init__(self, k: float) -> None:
        self.k = k


@dataclasses.dataclass
class Settings:  # eq=True without frozen: __hash__ is None too
    k: float


def _tensor(framework: str, n: int = 2):
    if framework == "paddle":
        paddle = pytest.importorskip("paddle")
        return paddle.ones([n])
    torch = pytest.importorskip("torch")
    return torch.ones(n)


CASES = [pytest.param("paddle", "sot", marks=pytest.mark.paddle),
         pytest.param("paddle", "eager", marks=pytest.mark.paddle),
         pytest.param("paddle", "ast", marks=pytest.mark.paddle),
         pytest.param("torch", "eager", marks=pytest.mark.torch)]


@pytest.mark.parametrize(("framework", "tracer"), CASES)
@pytest.mark.parametrize("make", [NoHash, Settings])
def test_an_unhashable_object_without_tensors_is_a_signature_error_naming_it(framework, tracer, make):
    ran = []

    def step(x, opts):
        ran.append(1)
        return x * {opts: 2.0}[opts]  # what the user's own code would do with it: hash it

    g = graphjit.graphed(step, tracer=tracer)
    with pytest.raises(graphjit.SignatureError, match=r"step: argument 'opts' is a .*(NoHash|Settings) with "
                       r"__hash__ = None that holds no tensors, so it is neither a tensor nor hashable") as info:
        g(_tensor(framework), make(2.0))
    assert not isinstance(info.value, graphjit.TracerError)
    assert "frozen dataclass" in str(info.value) and ran == []
    with pytest.raises(graphjit.SignatureError, match=r"argument 'opts'\[0\] is a"):
        g(_tensor(framework), [make(2.0)])  # inside a list it is still passed directly


@pytest.mark.parametrize("framework", [pytest.param("paddle", marks=pytest.mark.paddle),
                                       pytest.param("torch", marks=pytest.mark.torch)])
def test_an_unhashable_object_that_holds_tensors_is_walked(framework):
    @dataclasses.dataclass
    class Box:
        t: object
        inner: NoHash  # unhashable, inside an object that holds tensors: walked with it

    g = graphjit.graphed(lambda b: b.t * b.inner.k, tracer="eager")
    out = g(Box(_tensor(framework), NoHash(3.0)))
    assert [float(v) for v in out.numpy()] == [3.0, 3.0]
    assert "b.t[2]" in g.stats()["keys"][0]["key"]


@pytest.mark.torch
@pytest.mark.skipif(CUDA, reason="the no-CUDA path")
def test_on_a_cpu_the_scope_summary_says_no_graphs_and_how_many_calls_ran_the_traced_function(caplog):
    import torch

    caplog.set_level(logging.INFO, logger="graphjit")
    g = graphjit.graphed(lambda x: x + 1)
    with graphjit.capture_scope(total=3):
        for n in (4, 2, 1):
            g(torch.ones(n))
    (summary,) = [r.getMessage() for r in caplog.records if "capture_scope:" in r.getMessage()]
    assert summary.startswith(f"graphjit capture_scope: no graphs: 3 call(s) ran the traced function uncaptured "
                              f"(no CUDA graphs: torch {torch.__version__} is a CPU build); "), summary
    assert "0 captures" not in summary and "(0 not captured)" not in summary


def test_a_scope_that_captured_counts_graphs_and_failures_apart():
    scope = graphjit.capture_scope(progress=False)
    with scope:
        scope.note_capture("f", "x[2]", 1.5, ok=True)
        scope.note_capture("f", "x[4]", 0.0, ok=False, reason="capture failed: sync")
        scope.note_uncaptured("inputs on several devices (cpu, cuda:0)")
    assert scope.summary().startswith("1 graph(s) captured, 1 key(s) not captured (1.5 ms capturing); 1 call(s) ran "
                                      "the traced function uncaptured (inputs on several devices (cpu, cuda:0)); ")
    assert graphjit.capture_scope(progress=False).summary().startswith("nothing captured; ")


class AttrDict(dict):
    """The common idiom: attributes are items, a missing one raises KeyError (not AttributeError)."""

    __getattr__ = dict.__getitem__
    __setattr__ = dict.__setitem__


CONFIG = AttrDict(scale=2.0)


def test_an_attribute_dict_read_by_the_function_is_guarded_not_a_crash(emu):
    """graphjit asks values the function reads whether they are islands (``getattr(v, "__graphjit_island__",
    None)``): an object whose ``__getattr__`` raises KeyError was a crash at the second call."""
    torch = pytest.importorskip("torch")

    @graphjit.graphed
    def scaled(x):
        return x * CONFIG.scale

    x = torch.ones(2, 4)
    try:
        with torch.no_grad():
            for i in range(7):
                if i == 5:
                    CONFIG.scale = 5.0
                assert torch.equal(scaled(x), x * CONFIG.scale), i
    finally:
        CONFIG.scale = 2.0
    assert scaled.stats()["replays"] >= 3, scaled.report()


@pytest.mark.parametrize("kind", ["list", "dict", "deep"])
def test_an_argument_that_holds_itself_or_nests_too_deep_is_a_signature_error_naming_it(kind):
    """Not a RecursionError from inside graphjit: the documented SignatureError, naming the argument."""
    torch = pytest.importorskip("torch")

    @graphjit.graphed
    def f(x, extra):
        return x * 2

    x = torch.ones(2)
    if kind == "list":
        extra: object = [x]
        extra.append(extra)  # type: ignore[attr-defined]
    elif kind == "dict":
        extra = {"t": x}
        extra["me"] = extra  # type: ignore[index]
    else:
        extra = [x]
        for _ in range(400):
            extra = [extra]
    with pytest.raises(graphjit.SignatureError, match="argument 'extra' nests containers more than 256 deep"):
        f(x, extra)


@pytest.mark.torch
@pytest.mark.parametrize("kind", ["deque", "bytearray", "array", "numpy 1-d", "numpy 2-d"])
def test_a_sequence_edited_in_place_is_a_changed_value(emu, kind):
    """A deque, a bytearray, an ``array.array`` or a small numpy array the function reads items of, edited in place
    between calls (``window[0] = 3``, ``scales[1, 0] = 5``): the graph froze the old items, so it must not replay.
    Before, the object was compared by identity only: the old graph replayed, silently."""
    import array
    import collections

    np = pytest.importorskip("numpy")
    import torch

    made = {"deque": lambda: collections.deque([1.0, 2.0]), "bytearray": lambda: bytearray(b"\x01\x02"),
            "array": lambda: array.array("d", [1.0, 2.0]), "numpy 1-d": lambda: np.array([1.0, 2.0]),
            "numpy 2-d": lambda: np.array([[1.0, 2.0], [3.0, 4.0]])}
    holder = {"seq": made[kind]()}
    seq = holder["seq"]

    def step(x):
        s = holder["seq"]
        first = s[0, 0] if kind == "numpy 2-d" else s[0]
        return x * float(first)

    g = graphjit.graphed(step, tracer="eager")
    x = torch.ones(2)
    for i in range(8):
        if i == 4:
            if kind == "numpy 2-d":
                seq[0, 0] = 5
            else:
                seq[0] = 5
        assert torch.equal(g(x), step(x)), (i, g.report())
    st = g.stats()
    assert st["captures"] == 2, g.report()  # a graph of the new items


@pytest.mark.torch
def test_a_numpy_array_holding_nan_keeps_its_graph(emu):
    """A small numpy array is compared by its bytes: a NaN in it equals itself (read item by item, each read made a
    new NaN scalar that differed from the last: the key ran uncaptured for good)."""
    np = pytest.importorskip("numpy")
    import torch

    table = {"scales": np.array([1.0, float("nan")])}

    def step(x):
        return x * float(table["scales"][0])

    g = graphjit.graphed(step, tracer="eager")
    for _ in range(6):
        assert torch.equal(g(torch.ones(2)), torch.ones(2))
    assert g.stats()["replays"] >= 3 and not g.stats()["fallbacks"], g.report()
