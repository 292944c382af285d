"""``tracer="compile"`` runs its compiled function under Dynamo settings of its own (graphjit/backends/torch/
dynamo.py, ``for_capture``): floats specialized, and the counters graphjit keys by class (transformers' sliding-window
cache length, ``cumulative_length_int``) symbolic from their first compilation, so a decode loop that advances one
compiles once where Dynamo's automatic dynamic compiled twice (a Gemma 2 ``generate()``: 12 s each on an H100).
The settings are put back when the last such call returns, a user's own ``dynamic_sources`` kept beside them.

Dynamo's ``eager`` backend stands in for Inductor here: what is compiled, and how often, is Dynamo's choice."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from graphjit.backends.torch import dynamo  # noqa: E402

pytestmark = pytest.mark.torch

if not isinstance(getattr(getattr(torch.compiler, "config", None), "dynamic_sources", None), str):
    pytest.skip("this torch has no torch.compiler.config.dynamic_sources", allow_module_level=True)


class Layer:
    """Stands for a sliding-window cache layer: a Python count that only picks a branch."""

    def __init__(self, n: int, window: int) -> None:
        self.cumulative_length_int = n
        self.max_cache_len = window


def step(x, layer):
    full = layer.cumulative_length_int >= layer.max_cache_len
    layer.cumulative_length_int += 1
    return x * 2 if full else x + 1


class _Counting:
    """A Dynamo backend that counts its compilations and runs each graph as traced."""

    def __init__(self) -> None:
        self.graphs = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        return gm.forward


@pytest.fixture
def backend():
    torch._dynamo.reset()
    yield _Counting()
    torch._dynamo.reset()


def _loop(fn, x, window: int, counts: range) -> list:
    outs = []
    for n in counts:
        layer = Layer(n, window)
        outs.append(fn(x, layer))
        assert layer.cumulative_length_int == n + 1  # the count advanced, as in eager
    return outs


def test_a_counter_is_symbolic_from_the_first_compilation(backend):
    x = torch.arange(4.0)
    want = _loop(step, x, 6, range(2, 9))
    got = _loop(dynamo.for_capture(torch.compile(step, backend=backend)), x, 6, range(2, 9))
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    # counts 2..5 take one branch, 6..8 the other: one compilation each, none for the first value alone
    assert backend.graphs == 2


def test_without_the_settings_dynamo_compiles_the_first_value_on_its_own(backend):
    x = torch.arange(4.0)
    _loop(torch.compile(step, backend=backend), x, 6, range(2, 9))
    assert backend.graphs == 3  # 2 alone, 3..5 with the count symbolic, 6..8


def test_the_settings_are_put_back_and_a_users_sources_kept():
    from torch._dynamo import config as dynamo_config

    saved = torch.compiler.config.dynamic_sources
    float_before = dynamo_config.specialize_float
    seen: list[tuple[str, bool]] = []

    def read() -> None:
        seen.append((torch.compiler.config.dynamic_sources, dynamo_config.specialize_float))

    torch.compiler.config.dynamic_sources = "L['mine']"
    try:
        wrapped = dynamo.for_capture(read)
        wrapped()
        inner = dynamo.for_capture(lambda: (read(), wrapped()))  # re-entered: the settings stay until it returns
        inner()
        after = torch.compiler.config.dynamic_sources
    finally:
        torch.compiler.config.dynamic_sources = saved
    assert len(seen) == 3
    for sources, specialized in seen:
        assert sources.split(",")[0] == "L['mine']" and dynamo.counter_sources() in sources
        assert specialized is True
    assert after == "L['mine']"
    assert dynamo_config.specialize_float == float_before


def test_the_counter_sources_name_every_counter_attribute():
    import re

    from graphjit.families import COUNTERS

    patterns = dynamo.counter_sources().split(",")
    for _cls, attr in COUNTERS:
        name = f"L['kwargs']['past_key_values'].layers[3].{attr}"
        assert any(re.match(p, name) for p in patterns), (attr, patterns)
        assert not any(re.match(p, name + "_other") for p in patterns)
