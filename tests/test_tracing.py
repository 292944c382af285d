"""Tracers on CPU: what a graphed call returns equals eager (paddle sot/ast/eager, torch eager/compile),
and graphed methods of paddle.nn.Layer / torch.nn.Module keep their name, docstring, signature and binding."""

from __future__ import annotations

import importlib.util
import inspect

import numpy as np
import pytest

import graphjit

HAS_PADDLE = importlib.util.find_spec("paddle") is not None
HAS_TORCH = importlib.util.find_spec("torch") is not None
if HAS_PADDLE:
    import paddle
if HAS_TORCH:
    import torch


def traced_of(g, backend):
    return g._self_state.traced.get(backend)


# -- paddle tracers --------------------------------------------------------------------------


def control_flow(x, n: int, flag: bool):
    """Python loops and branches on Python values, and a branch on a tensor value."""
    y = x * 2.0
    for i in range(n):
        y = y + i
    if flag:
        y = paddle.tanh(y)
    if y.mean() > 0:
        y = y - 1.0
    else:
        y = y + 1.0
    return y, y.sum()


def graph_break(x, n: int):
    """A tensor read back into Python (a graph break for SOT), then Python control flow on it."""
    y = x + 1
    s = float(y.sum())
    if s > 0:
        y = y * n
    else:
        y = y - n
    return {"y": y, "s": s}


@pytest.mark.paddle
@pytest.mark.parametrize("tracer", ["auto", "sot", "ast", "eager"])
def test_paddle_control_flow_equals_eager(tracer):
    g = graphjit.graphed(control_flow, tracer=tracer)
    for x in (paddle.ones([2, 3]), -3 * paddle.ones([2, 3]), paddle.randn([4, 3])):
        for n, flag in ((0, False), (3, True), (2, False)):
            got_y, got_s = g(x, n, flag)
            want_y, want_s = control_flow(x, n, flag)
            np.testing.assert_allclose(got_y.numpy(), want_y.numpy(), rtol=1e-6, atol=1e-6)
            np.testing.assert_allclose(got_s.numpy(), want_s.numpy(), rtol=1e-5, atol=1e-5)
    traced = traced_of(g, "paddle")
    # ast: no program on a CPU, where every call is uncaptured: such a call runs the Python function (a static
    # program keeps the Python values it was translated with)
    expected = {"auto": "SotFunction", "sot": "SotFunction", "ast": "NoneType"}
    if tracer == "eager":
        assert traced is control_flow
    else:
        assert type(traced).__name__ == expected[tracer]


@pytest.mark.paddle
@pytest.mark.parametrize("tracer", ["sot", "eager"])
def test_paddle_graph_break_equals_eager(tracer):
    if tracer == "sot" and int(paddle.__version__.split(".")[0]) < 3:
        pytest.skip("Paddle 2.6's SOT cannot translate float(tensor): graphjit raises TracerError (and the failed "
                    "translation crashes that Paddle later in the process)")
    g = graphjit.graphed(graph_break, tracer=tracer)
    for x, n in ((paddle.ones([2, 3]), 3), (-5 * paddle.ones([2, 3]), 3), (paddle.ones([2, 3]), 4)):
        got, want = g(x, n), graph_break(x, n)
        assert set(got) == {"y", "s"}
        np.testing.assert_allclose(got["y"].numpy(), want["y"].numpy())
        assert float(got["s"]) == want["s"]


# -- paddle.nn.Layer method decorated at class level -----------------------------------------------


class EagerBlock(paddle.nn.Layer if HAS_PADDLE else object):
    def __init__(self, k: int):
        super().__init__()
        self.lin = paddle.nn.Linear(4, 4)
        self.k = k

    @graphjit.graphed(tracer="eager")
    def forward(self, x, scale: float = 1.0):
        """Block forward: linear, scaled, plus k."""
        y = self.lin(x) * scale
        if self.k > 1:  # Python control flow on an attribute
            y = y + self.k
        return y


@pytest.mark.paddle
def test_paddle_layer_method_keeps_name_doc_signature_and_binding():
    Block = EagerBlock
    graphed = Block.__dict__["forward"]
    assert isinstance(graphed, graphjit.GraphedFunction)
    assert Block.forward.__name__ == "forward"
    assert Block.forward.__qualname__ == "EagerBlock.forward"
    assert Block.forward.__doc__ == "Block forward: linear, scaled, plus k."
    assert inspect.signature(graphed) == inspect.signature(graphed.__wrapped__)
    assert list(inspect.signature(graphed).parameters) == ["self", "x", "scale"]
    graphed.reset()
    calls_before = graphed.stats()["calls"]
    a, b = Block(1), Block(2)
    assert list(inspect.signature(a.forward).parameters) == ["x", "scale"]
    assert inspect.signature(a.forward).parameters["scale"].default == 1.0
    x = paddle.randn([3, 4])
    original = graphed.__wrapped__
    with paddle.no_grad():
        np.testing.assert_allclose(a(x).numpy(), original(a, x).numpy(), rtol=1e-6)
        np.testing.assert_allclose(b(x, scale=2.0).numpy(), original(b, x, 2.0).numpy(), rtol=1e-6)
        np.testing.assert_allclose(b.forward(x, 2.0).numpy(), (b.lin(x) * 2.0 + 2).numpy(), rtol=1e-6)
        np.testing.assert_allclose(Block.forward(a, x).numpy(), a.lin(x).numpy(), rtol=1e-6)
    # two instances: separate keys (their weights are captured by address)
    signer = graphed._self_state.signer
    assert signer.sign(a, (x,), {}).key != signer.sign(b, (x,), {}).key
    assert signer.sign(a, (x,), {}).key == signer.sign(a, (paddle.zeros([3, 4]),), {}).key
    # stats() through an instance is the function's
    assert a.forward.stats() == graphed.stats()
    assert graphed.stats()["calls"] == calls_before + 4


@pytest.mark.paddle
def test_paddle_layer_method_with_the_default_sot_tracer_equals_eager():
    class Block(paddle.nn.Layer):
        def __init__(self, k: float):
            super().__init__()
            self.lin = paddle.nn.Linear(4, 4)
            self.k = k

        @graphjit.graphed
        def forward(self, x):
            return paddle.nn.functional.relu(self.lin(x)) + self.k

    a, b = Block(1.0), Block(2.0)
    x = paddle.randn([3, 4])
    with paddle.no_grad():
        for m in (a, b, a):  # each instance its own translation, with its own weights
            want = paddle.nn.functional.relu(m.lin(x)) + m.k
            np.testing.assert_allclose(m(x).numpy(), want.numpy(), rtol=1e-5)
    assert type(Block.__dict__["forward"]._self_state.traced["paddle"]).__name__ == "SotFunction"


@pytest.mark.paddle
@pytest.mark.parametrize("tracer", ["auto", "sot", "eager"])
def test_paddle_graphed_layer_instance_equals_eager(tracer):
    lin = paddle.nn.Linear(4, 4)
    g = graphjit.graphed(lin, tracer=tracer)
    x = paddle.randn([2, 4])
    with paddle.no_grad():
        np.testing.assert_allclose(g(x).numpy(), lin(x).numpy(), rtol=1e-5)
        np.testing.assert_allclose(g(2 * x).numpy(), lin(2 * x).numpy(), rtol=1e-5)
    assert g.stats()["calls"] == 2


AST_REASON = ("Paddle's AST tracer (dy2static DecoratorTransformer) re-applies every decorator it does not know "
              "inside the translated function, so @graphjit.graphed(tracer='ast') in decorator syntax creates a new "
              "GraphedFunction in static mode, which calls to_static again (RuntimeError 'NOT in dynamic mode', or, "
              "with torch imported too, SignatureError 'no tensors': static Values are not paddle.Tensor). "
              "api.py _State.call should call the function directly when paddle is not in dynamic mode")


@pytest.mark.paddle
def test_paddle_ast_tracer_in_decorator_syntax_equals_eager():
    @graphjit.graphed(tracer="ast")
    def step(x):
        y = x * 2
        if y.mean() > 0:
            y = y + 1
        return y

    x = paddle.randn([3, 4])
    want = step.__wrapped__(x)
    np.testing.assert_allclose(step(x).numpy(), want.numpy(), rtol=1e-6)


@pytest.mark.paddle
def test_paddle_layer_method_with_the_ast_tracer_equals_eager():
    class Block(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.lin = paddle.nn.Linear(4, 4)

        @graphjit.graphed(tracer="ast")
        def forward(self, x):
            return paddle.nn.functional.relu(self.lin(x))

    m = Block()
    x = paddle.randn([3, 4])
    with paddle.no_grad():
        want = paddle.nn.functional.relu(m.lin(x))
        np.testing.assert_allclose(m(x).numpy(), want.numpy(), rtol=1e-5)



# -- torch -------------------------------------------------------------------------------------------


@pytest.mark.torch
def test_torch_module_method_keeps_name_doc_signature_and_binding():
    class Net(torch.nn.Module):
        def __init__(self, k: float):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)
            self.k = k

        @graphjit.graphed
        def forward(self, x, scale: float = 1.0):
            """Net forward."""
            y = self.lin(x) * scale
            for _ in range(2):
                y = y + self.k
            return y

    graphed = Net.__dict__["forward"]
    assert Net.forward.__name__ == "forward" and Net.forward.__doc__ == "Net forward."
    assert inspect.signature(graphed) == inspect.signature(graphed.__wrapped__)
    assert list(inspect.signature(graphed).parameters) == ["self", "x", "scale"]
    a, b = Net(1.0), Net(2.0)
    assert list(inspect.signature(b.forward).parameters) == ["x", "scale"]
    x = torch.randn(3, 4)
    with torch.no_grad():
        torch.testing.assert_close(a(x), a.lin(x) + 2.0)
        torch.testing.assert_close(b(x, scale=3.0), b.lin(x) * 3.0 + 4.0)
        torch.testing.assert_close(Net.forward(b, x), b.lin(x) + 4.0)
    signer = graphed._self_state.signer
    assert signer.sign(a, (x,), {}).key != signer.sign(b, (x,), {}).key
    assert b.forward.stats()["calls"] == 3
    assert "torch" in graphed._self_state.traced  # default torch tracer: eager
    assert graphed._self_state.traced["torch"] is graphed.__wrapped__


@pytest.mark.torch
@pytest.mark.slow
def test_torch_compile_tracer_equals_eager_on_cpu():
    def f(x, n: int):
        y = torch.sin(x) * n
        if n > 2:
            y = y.cos()
        return y.sum(-1)

    g = graphjit.graphed(f, tracer="compile")
    x = torch.randn(3, 5)
    torch.testing.assert_close(g(x, 3), f(x, 3))
    assert traced_of(g, "torch") is not f  # a torch.compile wrapper, not the function itself
    assert g.stats()["calls"] == 1
