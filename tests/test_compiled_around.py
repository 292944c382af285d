"""A graphed function called inside code that ``torch.compile`` compiles: Dynamo does not inline it (it is marked
as ``torch.compiler.disable`` marks functions), ends its graph before the call and calls it, so graphjit captures and
replays the call there as anywhere else.  Inlined, the function used to be compiled without graphjit (0 calls, said
nowhere), and a graphed closure made Dynamo fail its own guards (``AssertionError: Guard failed on the same frame
it was created``)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import graphjit  # noqa: E402

pytestmark = pytest.mark.torch


def _model():
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 4)

    @graphjit.graphed
    def f(x):  # a closure: what Dynamo's guards failed on
        return lin(x).relu()

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.l = torch.nn.Linear(4, 4)

        @graphjit.graphed
        def forward(self, x):
            return self.l(x) * 3

    return f, M()


def test_torch_compile_around_graphed_functions_calls_them_and_they_graph(emu):
    f, m = _model()

    def outer(x):
        return f(x) * 2 + m(x)

    compiled = torch.compile(outer, backend="eager")
    with torch.no_grad():
        for _ in range(6):
            x = torch.randn(2, 4)
            want = f.__wrapped__(x) * 2 + type(m).forward.__wrapped__(m, x)
            assert torch.allclose(compiled(x), want)
    for g in (f, m.forward):
        st = g.stats()
        assert st["calls"] == 6 and st["graphs"] == 1 and st["replays"] == 4, g.report()
    # Dynamo compiled none of graphjit's own frames (its folder is on Dynamo's skip list), nor the functions graphjit
    # ran for warmup and capture (Dynamo's hook is off around them): they ran as written
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    import graphjit.api
    import graphjit.buffers

    for code in (graphjit.api._State.call.__code__, graphjit.api._State.replay.__code__,
                 graphjit.buffers.StaticInputs.load.__code__, f.__wrapped__.__code__):
        assert not _debug_get_cache_entry_list(code), code.co_name


def test_torch_compile_around_a_graphed_closure_runs_without_a_graph():
    """On a CPU build (no CUDA graphs) the calls run uncaptured, with that reason, and results equal eager."""
    f, _m = _model()
    compiled = torch.compile(lambda x: f(x) * 2, backend="eager")
    with torch.no_grad():
        for n in (2, 2, 3):
            x = torch.randn(n, 4)
            assert torch.allclose(compiled(x), f.__wrapped__(x) * 2)
    st = f.stats()
    assert st["calls"] == 3 and not st["graphs"], f.report()


def test_fullgraph_refuses_a_graphed_call_naming_graphjit():
    """``torch.compile(fullgraph=True)`` cannot end its graph before the call: Dynamo refuses it, and its error names
    graphjit (never a silent compile of the function without graphjit)."""
    f, _m = _model()
    compiled = torch.compile(lambda x: f(x) * 2, backend="eager", fullgraph=True)
    with torch.no_grad(), pytest.raises(Exception) as err:
        compiled(torch.randn(2, 4))
    assert "graphjit" in str(err.value), str(err.value)[:2000]
    assert f.stats()["calls"] == 0


_FRESH = """
import sys
import torch
import graphjit
import graphjit.backends as registry

f = graphjit.graphed(lambda x: x * 2)


@graphjit.eager
def island(x):
    return x - 1


registry.get("torch")
f(torch.ones(3))  # on this CPU build: run uncaptured (no CUDA graphs), through the whole call path
assert "torch._dynamo" not in sys.modules, "graphjit imported Dynamo"
import torch._dynamo.trace_rules as rules
import graphjit.api
from pathlib import Path
assert Path(graphjit.api.__file__).resolve().as_posix() in rules.SKIP_DIRS, "graphjit is not on the skip list"
hooks = [h for h in sys.meta_path if type(h).__name__ == "_AfterImport"]
assert len(hooks) == 1 and hooks[0].fired and hooks[0].find_spec(rules.__name__, None) is None, "the hook is live"
assert rules.__loader__.__class__.__name__ != "_ThenExtend"
compiled = torch.compile(lambda x: island(f(x)) + 1, backend="eager")
for n in (2, 2, 3):
    x = torch.randn(n, 4)
    assert torch.allclose(compiled(x), x * 2 - 1 + 1)
from torch._dynamo.eval_frame import _debug_get_cache_entry_list
assert not _debug_get_cache_entry_list(graphjit.api._State.call.__code__), "Dynamo compiled graphjit's frame"
assert not _debug_get_cache_entry_list(island.__wrapped__.__code__), "Dynamo compiled the island"
explained = torch._dynamo.explain(lambda x: island(x * 3) * 2)(torch.ones(2))
assert explained.graph_break_count == 1 and "graphjit island" in str(explained.break_reasons[0].reason), explained
print("ok")
"""


def test_graphjit_does_not_import_dynamo_and_is_on_its_skip_list_once_something_does():
    """Importing Dynamo costs seconds (2 s here, 4 to 5 s on a GPU host): a graphed function's decoration and first
    call, and an island's decoration, no longer pay it.  Where the program imports Dynamo later (``torch.compile``),
    graphjit's files go on its skip list as the import finishes, so compiled code around a graphed call still never
    compiles graphjit's frames, and an island stays a graph break whose body Dynamo never compiles.  In a fresh
    interpreter: nothing here has imported Dynamo yet."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    run = subprocess.run([sys.executable, "-c", _FRESH], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stdout[-2000:] + run.stderr[-4000:]


class _Sliced(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(4, 4) for _ in range(3)])
        self.register_buffer("b", torch.zeros(4))

    def forward(self, x):
        for layer in self.layers[:2]:  # as transformers' decoders do in every forward: a new ModuleList
            x = layer(x)
        return x


def test_module_registration_in_compiled_code_is_no_graph_break_and_rebinds_are_still_counted():
    """graphjit's module registration hook (counting rebinds for the guards) runs whenever a module registers a
    submodule; transformers' ``self.layers[:n]`` registers each layer in a new ModuleList in every forward.  Compiled,
    that hook was a graph break (Gemma 3 under ``tracer="compile"``: 4 Dynamo graphs where 2 were expected); it now
    traces to nothing there, while the same slice run eagerly, and a buffer rebound in compiled code, are counted."""
    from graphjit import guard_set
    from graphjit.backends.torch import breaks, rebinds

    assert rebinds.count_rebinds()
    breaks.shield()
    m = _Sliced()
    compiled = torch.compile(m, backend="eager")
    counters = torch._dynamo.utils.counters
    counters.clear()
    for _ in range(2):
        assert torch.equal(compiled(torch.ones(2, 4)), m(torch.ones(2, 4)))
    assert dict(counters["graph_break"]) == {} and counters["stats"]["unique_graphs"] == 1
    before = guard_set._REBINDS[0]
    m(torch.ones(2, 4))
    assert guard_set._REBINDS[0] == before + 2  # eagerly: the two layers registered in the slice

    def rebind(mod, x):
        mod.b = x * 2
        return x + 1

    before = guard_set._REBINDS[0]
    torch.compile(rebind, backend="eager")(m, torch.ones(4))
    assert guard_set._REBINDS[0] > before and torch.equal(m.b, torch.full((4,), 2.0))
