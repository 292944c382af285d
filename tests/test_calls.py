"""Calls the way users write them: hooks of a graphed Layer/Module, nested graphed calls, what Paddle's
to_static refuses and SOT runs, the function's own exceptions, keys of equivalent calls, and clear
refusals at decoration (CPU; the graphed path on a GPU: tests/test_gpu_calls.py)."""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import graphjit

HAS_PADDLE = importlib.util.find_spec("paddle") is not None
HAS_TORCH = importlib.util.find_spec("torch") is not None
if HAS_PADDLE:
    import paddle
if HAS_TORCH:
    import torch

os.environ.setdefault("MIN_GRAPH_SIZE", "0")  # SOT compiles even the small functions here

PADDLE_TRACERS = [pytest.param(t, marks=pytest.mark.paddle) for t in ("eager", "sot", "ast")]
TORCH_TRACERS = [pytest.param(t, marks=pytest.mark.torch) for t in ("eager", "compile")]


# -- forward hooks of a graphed Layer/Module object --------------------------------------------------


@pytest.mark.parametrize("tracer", TORCH_TRACERS)
def test_torch_module_object_runs_its_hooks(tracer):
    m = torch.nn.Linear(4, 4)
    m.register_forward_pre_hook(lambda mod, args: (args[0] * 2,))
    m.register_forward_hook(lambda mod, args, out: out * 0 + 42)
    g = graphjit.graphed(m, tracer=tracer)
    x = torch.randn(3, 4)
    with torch.no_grad():
        want = m(x)
        got = g(x)
    assert torch.equal(want, torch.full((3, 4), 42.0)) and torch.equal(got, want)
    assert "forward" not in m.__dict__  # the traced forward was put in place only for the call


@pytest.mark.parametrize("tracer", PADDLE_TRACERS)
def test_paddle_layer_object_runs_its_hooks(tracer):
    layer = paddle.nn.Linear(4, 4)
    seen = []
    layer.register_forward_pre_hook(lambda lay, inputs: seen.append("pre"))
    layer.register_forward_post_hook(lambda lay, inputs, out: out * 0 + 42)
    g = graphjit.graphed(layer, tracer=tracer)
    x = paddle.randn([3, 4])
    with paddle.no_grad():
        got = g(x)
    np.testing.assert_array_equal(got.numpy(), np.full((3, 4), 42.0, np.float32))
    checked = tracer in graphjit.backends.get("paddle").checked_tracers  # Paddle 2.x's SOT: run once more, first call
    assert seen == ["pre"] * (2 if checked else 1)
    assert "forward" not in layer.__dict__


@pytest.mark.torch
def test_a_graphed_module_keys_on_its_forward_signature_and_training_flag():
    class Enc(torch.nn.Module):
        def forward(self, src, scale=1.0):
            return src * scale

    m = Enc()
    g = graphjit.graphed(m, buckets={"src": {0: [4, 8]}})
    x = torch.ones(3, 2)
    assert torch.equal(g(x), x)
    key = g.stats()["keys"][0]["key"]
    assert key.startswith("src[3, 2]->0:4"), key  # positional src matched by forward's parameter name
    m.eval()
    g(x)
    assert len(g.stats()["keys"]) == 2  # train/eval mode is part of the key


# -- nested graphed calls ---------------------------------------------------------------------------


@pytest.mark.parametrize("tracer", PADDLE_TRACERS)
def test_paddle_nested_graphed_calls_run_as_part_of_the_outer_one(tracer):
    inner = graphjit.graphed(_paddle_inner, tracer=tracer)
    _NESTED["inner"] = inner
    outer = graphjit.graphed(_paddle_outer, tracer=tracer)
    x = paddle.ones([2, 2])
    for _ in range(3):
        np.testing.assert_array_equal(outer(x).numpy(), np.full((2, 2), 3.0, np.float32))
    np.testing.assert_array_equal(inner(x).numpy(), np.full((2, 2), 2.0, np.float32))  # alone: its own calls


_NESTED: dict[str, object] = {}  # module level: the AST tracer cannot see closure variables


def _paddle_inner(a):
    return a * 2


def _paddle_outer(a):
    return _NESTED["inner"](a) + 1


@pytest.mark.torch
def test_torch_nested_and_recursive_graphed_calls():
    @graphjit.graphed
    def inner(a):
        return a * 2

    @graphjit.graphed
    def outer(a):
        return inner(a) + 1

    @graphjit.graphed
    def countdown(a, n):
        return a if n == 0 else countdown(a + 1, n - 1)

    x = torch.ones(2)
    with torch.no_grad():
        assert torch.equal(outer(x), x * 3)  # no graphs on a CPU: each call runs on its own
        assert torch.equal(countdown(x, 3), x + 3)
        from graph_emulator import emulated_torch

        with emulated_torch():  # graphs emulated: calls inside a warmup, capture or verify are part of it
            outer.reset()
            inner.reset()
            own = inner.stats()["calls"]
            for _ in range(4):
                assert torch.equal(outer(x), x * 3)
            assert outer.stats()["replays"] == 2 and inner.stats()["nested_calls"] >= 3
            assert inner.stats()["calls"] == own  # never on its own inside outer
            countdown.reset()
            for _ in range(4):
                assert torch.equal(countdown(x, 3), x + 3)
            assert countdown.stats()["replays"] == 2 and countdown.stats()["nested_calls"] >= 9


@pytest.mark.torch
def test_a_graphed_module_called_inside_a_graphed_call_is_captured_into_it_and_its_values_guarded(emu):
    class Scale(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.k = 2.0

        def forward(self, x):
            return x * self.k

    class Outer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = graphjit.graphed(Scale())  # held as a submodule

        def forward(self, x):
            return self.inner(x) + 1

    scale = Scale()
    inner = graphjit.graphed(scale)  # in a closure cell

    @graphjit.graphed
    def outer(x):
        return inner(x) + 1

    held = Outer()
    by_module = graphjit.graphed(held)
    x = torch.ones(2)
    with torch.no_grad():
        for i in range(8):
            if i == 5:  # a value the inner module reads, changed after the capture: another graph
                scale.k = held.inner.k = 3.0
            want = x * (3.0 if i >= 5 else 2.0) + 1
            assert torch.equal(outer(x), want) and torch.equal(by_module(x), want)
    for g in (outer, by_module):  # graphjit's own counters of the inner one are no value of the call
        st = g.stats()
        assert st["graphs"] == 2 and st["replays"] == 4 and not st["fallbacks"], g.report()
    assert inner.stats()["nested_calls"] >= 3


# -- what to_static refuses and SOT runs ---------------------------------------------------------------


class _Plain:
    def m(self, a):
        return a + 1


def _deco(f):
    @functools.wraps(f)
    def w(*a, **k):
        return f(*a, **k)
    return w


@_deco
def _behind_wraps(a):
    return a * 3


def _varargs(*xs):
    return xs[0] + xs[1]


def _ranged(a, r):
    return a * len(r)


def _selfish(self, a):
    return self + a


def _two(a, b):
    return a + b


def _paddle_cases():
    x = paddle.ones([2, 2])
    return {"*args": (_varargs, (x, x)), "non-Layer method": (_Plain().m, (x,)), "range": (_ranged, (x, range(3))),
            "functools.wraps": (_behind_wraps, (x,)), "first parameter self": (_selfish, (x, x)),
            "functools.partial": (functools.partial(_two, b=x), (x,))}


@pytest.mark.paddle
@pytest.mark.parametrize("case", ["*args", "non-Layer method", "range", "functools.wraps", "first parameter self",
                                  "functools.partial"])
def test_paddle_sot_runs_what_to_static_refuses(case):
    fn, args = _paddle_cases()[case]
    want = fn(*args).numpy()
    g = graphjit.graphed(fn, tracer="sot")
    for _ in range(2):
        np.testing.assert_array_equal(g(*args).numpy(), want)


@pytest.mark.paddle
@pytest.mark.parametrize("case", ["*args", "non-Layer method", "range", "functools.wraps", "first parameter self",
                                  "functools.partial"])
def test_paddle_ast_works_or_names_the_tracer_that_does(case):
    fn, args = _paddle_cases()[case]
    want = fn(*args).numpy()
    g = graphjit.graphed(fn, tracer="ast")
    try:
        got = g(*args)
    except graphjit.TracerError as exc:
        assert 'tracer="eager"' in str(exc) and "tracer=\"ast\"" in str(exc), exc
        return
    np.testing.assert_array_equal(got.numpy(), want)


# -- the function's own exceptions ---------------------------------------------------------------------


class Mine(Exception):
    pass


def _raises_key(x):
    y = x * 2
    raise KeyError(f"mine {y.shape[0]}")


def _raises_mine(x):
    raise Mine("custom")


FRAMEWORK_TRACERS = [pytest.param("paddle", t, marks=pytest.mark.paddle, id=f"paddle-{t}")
                     for t in ("eager", "sot", "ast")]
FRAMEWORK_TRACERS += [pytest.param("torch", t, marks=pytest.mark.torch, id=f"torch-{t}") for t in ("eager", "compile")]


@pytest.mark.parametrize(("framework", "tracer"), FRAMEWORK_TRACERS)
def test_the_functions_own_exceptions_reach_the_caller_unchanged(framework, tracer):
    x = paddle.ones([2]) if framework == "paddle" else torch.ones(2)
    with pytest.raises(KeyError, match="mine 2") as info:
        graphjit.graphed(_raises_key, tracer=tracer)(x)
    assert type(info.value) is KeyError
    with pytest.raises(Mine, match="custom") as mine:
        graphjit.graphed(_raises_mine, tracer=tracer)(x)
    assert type(mine.value) is Mine


def _adds(a, b):
    return a + b


@pytest.mark.parametrize(("framework", "tracer"), FRAMEWORK_TRACERS)
def test_a_call_that_does_not_bind_raises_pythons_error(framework, tracer):
    """A missing or an unexpected argument is the caller's error, whichever tracer runs the call (Paddle's tracers
    raise it from their own frames, which once read as the tracer failing)."""
    x = paddle.ones([2]) if framework == "paddle" else torch.ones(2)
    g = graphjit.graphed(_adds, tracer=tracer)
    for args, kwargs, text in (((x,), {}, "missing 1 required positional argument: 'b'"),
                               ((x, x, x), {}, "takes 2 positional arguments but 3 were given"),
                               ((x, x), {"c": x}, "unexpected keyword argument 'c'")):
        with pytest.raises(TypeError, match=text) as info:
            g(*args, **kwargs)
        assert type(info.value) is TypeError, info.value
    assert bool((g(x, x) == x + x).all())


@pytest.mark.paddle
def test_a_paddle_functions_own_error_is_a_tracer_failure_only_where_a_tracer_translates():
    """``paddle.reshape`` graphed itself runs no Python frame outside Paddle: its ValueError for a bad shape reaches the
    caller unchanged under the eager tracer (nothing translates there), and under ``sot``, whose translator cannot be
    told apart from the function, as a TracerError that is also the ValueError Paddle raised."""
    x = paddle.ones([2, 2])
    with pytest.raises(ValueError, match="shape") as eager:
        graphjit.graphed(paddle.reshape, tracer="eager")(x, "bad")
    assert type(eager.value) is ValueError
    with pytest.raises(ValueError, match="shape") as sot:
        graphjit.graphed(paddle.reshape, tracer="sot")(x, "bad")
    assert isinstance(sot.value, graphjit.TracerError)


@pytest.mark.paddle
def test_a_tracer_failure_is_catchable_as_what_the_framework_raised():
    from paddle.jit.sot.utils.exceptions import InnerError

    def breaks(x):
        raise InnerError("In simulate execution:\n  SomeInternalError: the translator gave up")

    with pytest.raises(InnerError) as info:  # what Paddle raised ...
        graphjit.graphed(breaks, tracer="eager")(paddle.ones([2]))
    assert isinstance(info.value, graphjit.TracerError)  # ... and graphjit's own error, naming the way out
    assert isinstance(info.value.__cause__, InnerError)


# -- keys ------------------------------------------------------------------------------------------------


@pytest.mark.torch
def test_equivalent_calls_are_one_key():
    def f(x, scale=2.0):
        return x * scale

    g = graphjit.graphed(f)
    x = torch.ones(2)
    for out in (g(x), g(x=x), g(x, 2.0), g(x, scale=2.0)):
        assert torch.equal(out, x * 2)
    assert len(g.stats()["keys"]) == 1
    with pytest.raises(TypeError):  # a call that does not bind is Python's error, unchanged
        g(x, 2.0, 3.0)
    with pytest.raises(TypeError):
        g(x, nonsense=1)


@pytest.mark.torch
def test_keyword_only_and_var_args_bind_too():
    def f(x, *rest, k=1, **extra):
        return x * k + len(rest) + len(extra)

    g = graphjit.graphed(f)
    x = torch.ones(2)
    assert torch.equal(g(x), f(x)) and torch.equal(g(x, k=1), f(x, k=1))
    assert len(g.stats()["keys"]) == 1
    assert torch.equal(g(x, 5, k=2, z=3), f(x, 5, k=2, z=3))


@pytest.mark.torch
def test_a_slice_argument_is_keyed_by_its_bounds():
    g = graphjit.graphed(lambda x, s: x[s])
    x = torch.arange(6.0)
    assert torch.equal(g(x, slice(1, 4)), x[1:4]) and torch.equal(g(x, slice(1, 4)), x[1:4])
    assert torch.equal(g(x, slice(0, 2)), x[0:2])
    assert len(g.stats()["keys"]) == 2


@pytest.mark.torch
def test_a_new_key_on_most_calls_is_said_once_naming_the_argument(gj_log):
    g = graphjit.graphed(lambda x, pos: x + pos)
    x = torch.ones(2)
    for pos in range(12):
        g(x, pos)
    warnings = [r.getMessage() for r in gj_log.records if r.levelno == logging.WARNING and "input signatures" in
                r.getMessage()]
    assert len(warnings) == 1 and "argument 'pos' changes from call to call" in warnings[0], warnings


@pytest.mark.torch
def test_many_signatures_captured_in_a_scope_are_not_warned_about(gj_log, emu):
    g = graphjit.graphed(lambda x: x * 2)
    with graphjit.capture_scope(progress=False):
        for n in range(1, 13):  # what a server does before it serves: one key per batch size
            g(torch.ones(n))
    assert g.stats()["graphs"] == 12
    for n in range(1, 13):
        g(torch.ones(n))
    assert not [r for r in gj_log.records if "input signatures" in r.getMessage()]
    for n in range(13, 61):  # and new signatures on most calls after it are still said
        g(torch.ones(n))
    assert [r for r in gj_log.records if "input signatures" in r.getMessage()]


@pytest.mark.torch
def test_labels_show_values_dtypes_and_sort_by_shape():
    class M(torch.nn.Module):
        @graphjit.graphed
        def forward(self, x, pos, scale=2.0):
            return x * scale + pos

    m = M()
    for n in (16, 2, 1):
        m(torch.ones(n), torch.zeros(1, dtype=torch.int64))
    keys = [k["key"] for k in M.forward.stats()["keys"]]
    assert "non-tensor" not in keys[0] and "scale=2.0" in keys[0], keys
    assert "x[16] float32" in keys[0] and "pos[1] int64" in keys[0], keys  # mixed dtypes: one per tensor
    rows = [line for line in M.forward.report().splitlines() if line.startswith("  [")]
    assert [r.split("] ", 1)[1].split()[0] for r in rows] == ["x[1]", "x[2]", "x[16]"], rows


# -- refusals at decoration ---------------------------------------------------------------------------------


def test_generators_async_functions_and_classmethods_are_refused():
    def gen(x):
        yield x

    async def co(x):
        return x

    with pytest.raises(graphjit.ConfigError, match="generator function"):
        graphjit.graphed(gen)
    with pytest.raises(graphjit.ConfigError, match="async function"):
        graphjit.graphed(co)
    with pytest.raises(graphjit.ConfigError, match=r"put @graphjit\.graphed under @classmethod"):
        graphjit.graphed(classmethod(lambda cls, x: x))
    with pytest.raises(graphjit.ConfigError, match=r"put @graphjit\.graphed under @staticmethod"):
        graphjit.graphed(staticmethod(lambda x: x))


def test_unknown_option_names_say_the_closest_valid_one():
    with pytest.raises(graphjit.ConfigError, match=r"no option 'bucket'; did you mean 'buckets'\?"):
        graphjit.graphed(bucket={"x": {0: [1]}})
    with pytest.raises(graphjit.ConfigError, match=r"no option 'warm_up'; did you mean 'warmup'\?"):
        graphjit.graphed(lambda x: x, warm_up=3)


# -- scopes, static_inputs and logs on a machine without graphs ---------------------------------------------


def test_entering_one_scope_object_twice_is_refused():
    sc = graphjit.capture_scope(progress=False)
    with sc:
        with pytest.raises(graphjit.ConfigError, match="already active"):
            with sc:
                pass
        with graphjit.capture_scope(progress=False) as inner:  # a new scope nests fine
            assert inner.parent is sc


def test_a_scope_belongs_to_its_thread():
    seen = []
    with graphjit.capture_scope(progress=False):
        t = threading.Thread(target=lambda: seen.append(graphjit.in_capture_scope()))
        t.start()
        t.join()
        assert graphjit.in_capture_scope()
    assert seen == [False]


@pytest.mark.torch
@pytest.mark.skipif(HAS_TORCH and torch.cuda.is_available(), reason="the no-CUDA path")
def test_on_a_cpu_the_scope_and_static_inputs_say_why_there_is_no_graph(gj_log):
    g = graphjit.graphed(lambda x: x + 1)
    with graphjit.capture_scope() as sc:
        g(torch.ones(2))
    end = [r.getMessage() for r in gj_log.records if "capture_scope:" in r.getMessage()]
    assert end and "no graphs: 1 call(s) ran the traced function uncaptured (no CUDA graphs" in end[-1], end
    assert sc.stats()["uncaptured"]
    with pytest.raises(graphjit.GraphjitError, match="run uncaptured \\(no CUDA graphs"):
        g.static_inputs(torch.ones(2))


@pytest.mark.torch
def test_debug_logs_every_state_change_and_fallback(gj_log, monkeypatch):
    monkeypatch.setenv("GRAPHJIT_DEBUG", "1")
    graphjit.refresh_env()
    g = graphjit.graphed(lambda x: x + 1)
    for _ in range(2):
        g(torch.ones(2))
    text = "\n".join(r.getMessage() for r in gj_log.records if r.levelno == logging.DEBUG)
    assert "new key" in text and "runs uncaptured" in text and "traced with torch/eager" in text, text


# -- command line and packaging ---------------------------------------------------------------------------------


def test_version_on_the_command_line():
    out = subprocess.run([sys.executable, "-m", "graphjit", "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == f"graphjit {graphjit.__version__}"


def test_the_license_is_an_spdx_string():
    from pathlib import Path

    import tomllib

    data = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    assert data["project"]["license"] == "Apache-2.0"


@pytest.mark.torch
def test_two_graphed_layers_of_one_class_have_their_own_names():
    class Block(torch.nn.Module):
        def forward(self, x):
            return x

    a, b = graphjit.graphed_layer(Block()), graphjit.graphed_layer(Block())
    assert a.report().splitlines()[0].split(":")[0] != b.report().splitlines()[0].split(":")[0]


def test_bench_help_says_where_results_go():
    out = subprocess.run([sys.executable, "-m", "graphjit", "bench", "dispatch", "--help"], capture_output=True,
                         text=True, timeout=60)
    assert "under the current folder" in " ".join(out.stdout.split())

