"""Every refusal of graphed(): the error class, and a message that names the argument and what was expected."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

import graphjit

HAS_PADDLE = importlib.util.find_spec("paddle") is not None
HAS_TORCH = importlib.util.find_spec("torch") is not None
if HAS_PADDLE:
    import paddle
if HAS_TORCH:
    import torch


def f(x, cfg=None):
    return x + 1


# -- options at decoration ----------------------------------------------------------------------


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"tracer": "jit"}, r"tracer='jit': expected one of 'auto', 'sot', 'ast', 'eager', 'compile'"),
    ({"backend": "jax"}, r"backend='jax': expected one of 'auto', 'paddle', 'torch'"),
    ({"outputs": "view"}, r"outputs='view': expected one of 'copy', 'alias'"),
    ({"pool": "global"}, r"pool='global': expected one of 'shared', 'private'"),
    ({"tracer": None}, r"tracer=None: expected one of"),
    ({"warmup": 0}, r"warmup=0: expected an integer >= 1"),
    ({"warmup": -3}, r"warmup=-3: expected an integer >= 1"),
    ({"warmup": 1.5}, r"warmup=1.5: expected an integer >= 1"),
    ({"warmup": True}, r"warmup=True: expected an integer >= 1"),
    ({"max_graphs": 0}, r"max_graphs=0: expected an integer >= 1 or None"),
    ({"max_graphs": "8"}, r"max_graphs='8': expected an integer >= 1 or None"),
    ({"verify": "yes"}, r"verify='yes': expected True, False or None \(None: from GRAPHJIT_VERIFY\)"),
    ({"strict": 1}, r"strict=1: expected True, False or None \(None: from GRAPHJIT_STRICT\)"),
    ({"backend": "torch", "tracer": "sot"}, r"tracer='sot' is a paddle tracer; torch tracers are 'eager' and "
                                            r"'compile'"),
    ({"backend": "torch", "tracer": "ast"}, r"tracer='ast' is a paddle tracer"),
    ({"backend": "paddle", "tracer": "compile"}, r"tracer='compile' is a torch tracer; paddle tracers are 'sot', "
                                                 r"'ast' and 'eager'"),
])
def test_bad_options_raise_config_error_naming_the_option(kwargs, match):
    with pytest.raises(graphjit.ConfigError, match=match):
        graphjit.graphed(f, **kwargs)
    with pytest.raises(graphjit.ConfigError, match=match):
        graphjit.graphed(**kwargs)  # the decorator form checks options before it sees the function


def test_config_error_is_also_a_value_error():
    with pytest.raises(ValueError):
        graphjit.graphed(f, warmup=0)


@pytest.mark.parametrize("thing", [5, "step", object(), [f]])
def test_graphing_a_non_callable_is_refused(thing):
    with pytest.raises(graphjit.ConfigError, match=rf"graphed\(\) needs a function or callable, got "
                                                   rf"{type(thing).__name__}"):
        graphjit.graphed(thing)
    with pytest.raises(graphjit.ConfigError, match=r"needs a function or callable"):
        graphjit.graphed(warmup=3)(thing)


def test_graphing_an_already_graphed_function_is_refused():
    g = graphjit.graphed(f)
    with pytest.raises(graphjit.ConfigError, match=r"'f' is already graphed"):
        graphjit.graphed(g)
    with pytest.raises(graphjit.ConfigError, match=r"already graphed"):
        graphjit.graphed(tracer="eager")(g)


def test_graphing_a_bound_graphed_method_is_refused():
    class Model:
        @graphjit.graphed
        def step(self, x):
            return x

    with pytest.raises(graphjit.ConfigError, match=r"already graphed"):
        graphjit.graphed(Model().step)


def test_options_are_kept_on_the_graphed_function():
    g = graphjit.graphed(f, tracer="eager", warmup=3, outputs="alias", max_graphs=5)
    o = g.graphjit_options
    assert (o.tracer, o.warmup, o.outputs, o.max_graphs, o.backend) == ("eager", 3, "alias", 5, "auto")


# -- at call time ------------------------------------------------------------------------------------


@pytest.mark.paddle
def test_unhashable_argument_through_a_graphed_call_names_it():
    g = graphjit.graphed(f)
    with pytest.raises(graphjit.SignatureError, match=r"f: argument 'cfg' is a builtins.bytearray, which is neither "
                                                      r"a tensor nor hashable"):
        g(paddle.ones([2]), bytearray(b"ab"))
    with pytest.raises(TypeError):  # SignatureError is a TypeError as well
        g(paddle.ones([2]), cfg=bytearray(b"a"))
    assert g._self_state.traced == {}  # refused before anything was traced


@pytest.mark.paddle
@pytest.mark.torch
def test_tensors_of_two_frameworks_in_one_graphed_call():
    g = graphjit.graphed(f)
    with pytest.raises(graphjit.SignatureError, match=r"argument 'x' is a paddle tensor but argument 'cfg' is a "
                                                      r"torch tensor; one graphed call takes tensors of one "
                                                      r"framework only"):
        g(paddle.ones([2]), torch.ones(2))


@pytest.mark.paddle
def test_compile_tracer_with_paddle_tensors_is_a_backend_error():
    g = graphjit.graphed(f, tracer="compile")
    with pytest.raises(graphjit.BackendError, match=r"f: tracer='compile' does not apply to paddle tensors; paddle "
                                                    r"tracers are sot, ast, eager"):
        g(paddle.ones([2]))


@pytest.mark.torch
@pytest.mark.parametrize("tracer", ["sot", "ast"])
def test_paddle_tracer_with_torch_tensors_is_a_backend_error(tracer):
    g = graphjit.graphed(f, tracer=tracer)
    with pytest.raises(graphjit.BackendError, match=rf"f: tracer='{tracer}' does not apply to torch tensors; torch "
                                                    r"tracers are eager, compile"):
        g(torch.ones(2))


@pytest.mark.paddle
def test_forced_backend_with_other_framework_tensors():
    g = graphjit.graphed(f, backend="torch", tracer="eager")
    with pytest.raises(graphjit.SignatureError, match=r"f: backend='torch' but the call passed paddle tensors "
                                                      r"\(argument 'x'\)"):
        g(paddle.ones([2]))


@pytest.mark.paddle
@pytest.mark.torch
def test_no_tensors_with_both_frameworks_imported_asks_for_backend():
    def constant(n):
        return n * 2

    g = graphjit.graphed(constant)
    with pytest.raises(graphjit.SignatureError, match=r"constant: the call passed no tensors, so the framework "
                                                      r"cannot be told from the arguments \(both paddle and torch "
                                                      r"are imported\); pass backend='paddle' or backend='torch'"):
        g(3)
    assert graphjit.graphed(constant, backend="torch")(3) == 6
    assert graphjit.graphed(constant, backend="paddle", tracer="eager")(4) == 8


@pytest.mark.paddle
def test_an_internal_sot_failure_becomes_a_tracer_error_naming_the_way_out() -> None:
    """Paddle's SOT failing inside itself (InnerError) is not the function's error: graphjit says which
    tracer to use instead.  The function's own exceptions pass through unchanged."""
    paddle = pytest.importorskip("paddle")
    from paddle.jit.sot.utils.exceptions import InnerError

    def sot_breaks(x: Any) -> Any:
        raise InnerError("In simulate execution:\n  AttributeError: 'Variable' object has no attribute '__float__'")

    def own_error(x: Any) -> Any:
        raise ValueError("the function's own error")

    with pytest.raises(graphjit.TracerError, match="has no attribute '__float__'") as info:
        graphjit.graphed(sot_breaks, tracer="eager")(paddle.ones([2]))
    assert 'tracer="eager"' in str(info.value)
    assert isinstance(info.value.__cause__, InnerError)
    with pytest.raises(ValueError, match="own error"):
        graphjit.graphed(own_error, tracer="eager")(paddle.ones([2]))
