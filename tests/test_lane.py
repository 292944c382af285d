"""The replay lane (graphjit/lane.py, csrc/lane.c) on the CPU emulator.

The lane is the compiled form of the Python path's replay of one key; the Python path is the reference.  So most
tests here run one sequence of calls twice, with ``GRAPHJIT_LANE=off`` and with the lane on, and require the same
outputs, the same stats and the same state afterwards, and that the lane served the calls it should (counted by the
Python path's ``Handoff.replay`` calls it did not make).  The emulator's feed nodes copy the table's entries with
``memmove`` (tests/graph_emulator.py), so a wrong pointer, size or count written by the lane gives wrong outputs."""

from __future__ import annotations

import ctypes
import gc
import threading
import weakref
from collections.abc import Callable
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import graph_emulator  # noqa: E402
from only_key import only_entry  # noqa: E402

import graphjit  # noqa: E402
from graphjit import env, lane  # noqa: E402

pytestmark = pytest.mark.torch

TIMINGS = {"capture_ms", "pool_bytes", "replay_us", "island_us"}
PROCESS_FIRST = {"guarded_values"}  # the first capture of a process may guard a module global (``posixpath.sep``)
"""Counts left out of the comparison: code run once per process (a lazy import's, torch's lazy wrappers) reads values
in the process's first capture that later captures do not."""


def _stats(g: Any) -> dict[str, Any]:
    d = g.stats()
    d["keys"] = [{k: v for k, v in key.items() if k not in TIMINGS | PROCESS_FIRST} for key in d["keys"]]
    d.pop("pool_bytes")
    return d


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return bool(a == b)


def _both(monkeypatch: pytest.MonkeyPatch, make: Callable[[], Any],
          calls: Callable[[Any], list[Any]]) -> tuple[list[Any], dict[str, Any], dict[str, Any], Any]:
    """``calls(make())`` with the lane off, then on: the outputs (equal), both stats, and the graphed function of
    the run with the lane."""
    monkeypatch.setenv("GRAPHJIT_LANE", "off")
    env.refresh()
    g_off = make()
    torch.manual_seed(0)
    out_off = calls(g_off)
    stats_off = _stats(g_off)
    assert g_off._self_state.lane is None
    monkeypatch.setenv("GRAPHJIT_LANE", "on")
    env.refresh()
    g_on = make()
    torch.manual_seed(0)
    out_on = calls(g_on)
    stats_on = _stats(g_on)
    assert _same(out_on, out_off)
    return out_on, stats_off, stats_on, g_on


def _in_threads(worker: Callable[[int], None], n: int) -> None:
    """``worker(0)`` .. ``worker(n - 1)``, each on a thread of its own, all started before any is joined."""
    threads = [threading.Thread(target=worker, args=(s,)) for s in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _step(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    h = a @ b + c
    return h * scale, (h.sum(0) - a[0]).to(torch.float64)


def _inputs(seed: int, rows: int = 5) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, 7, generator=g), torch.randn(7, 7, generator=g), torch.randn(rows, 7, generator=g)


def test_fresh_inputs_are_served_by_the_lane_as_by_the_python_path(emu, lane_on, monkeypatch, python_replays):
    def calls(g: Any) -> list[Any]:
        outs = [g(*_inputs(seed), 0.5) for seed in range(12)]
        return [o for out in outs for o in out]  # every output kept: none overwritten by a later call

    outs, off, on, g = _both(monkeypatch, lambda: graphjit.graphed(_step), calls)
    assert on == off
    assert all(_same(o, w) for o, w in zip(outs, [o for s in range(12) for o in _step(*_inputs(s), 0.5)]))
    served = on["keys"][0]["fed_replays"] - (python_replays[0] - off["keys"][0]["fed_replays"])
    assert served >= 6  # capture at call 3, two Python replays, then the lane
    assert g._self_state.lane is not None and g._self_state.lane is only_entry(g).lane


def test_static_inputs_and_alias_outputs_are_served_with_nothing_copied(emu, lane_on, monkeypatch, python_replays):
    def calls(g: Any) -> list[Any]:
        args = _inputs(0)
        for _ in range(4):
            g(*args, 2.0)
        static, _ = g.static_inputs(*args, 2.0)
        outs = []
        for seed in range(6):
            for buf, new in zip(static[:3], _inputs(seed)):
                buf.copy_(new)
            out = g(*static)
            assert out[0] is only_entry(g).outputs.tensors[0]  # alias: the graph's own output
            outs.append([t.clone() for t in out])
        return outs

    _, off, on, _g = _both(monkeypatch, lambda: graphjit.graphed(_step, outputs="alias"), calls)
    assert on == off
    assert on["keys"][0]["input_copies"] == off["keys"][0]["input_copies"]
    before = python_replays[0]
    g = graphjit.graphed(_step, outputs="alias")
    calls(g)
    assert python_replays[0] - before <= 4  # the rest served in C


def test_a_call_the_plan_does_not_cover_takes_the_python_path(emu, lane_on, monkeypatch):
    """Each way a call can differ from the planned one: another scalar, shape, dtype, layout (strides), grad mode,
    autocast block, owner training flag, keyword call; outputs and stats as with the lane off."""

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(7, 7)

        def forward(self, x: torch.Tensor, k: int) -> torch.Tensor:
            y = self.lin(x) * k
            return torch.nn.functional.dropout(y, 0.0, self.training) + 1

    torch.manual_seed(0)
    net = Net().eval()

    def calls(g: Any) -> list[Any]:
        x = torch.randn(4, 7)
        outs = []
        with torch.no_grad():  # inference: a key whose outputs require grad is not captured
            for _ in range(5):
                outs.append(g(x, 2))
            outs.append(g(x, 3))  # another scalar: another key
            outs.append(g(x, 2))
            outs.append(g(torch.randn(7, 4).t(), 2))  # strides
            with torch.enable_grad():
                outs.append(g(x, 2))  # grad mode
            with torch.inference_mode():
                outs.append(g(x, 2))
            with torch.autocast("cpu", dtype=torch.bfloat16):
                outs.append(g(x, 2))
            outs.append(g(x=x, k=2))  # keywords
            net.train()
            outs.append(g(x, 2))  # training flag
            net.eval()
            for _ in range(3):
                outs.append(g(x, 2))
            outs.append(g(torch.randn(5, 7), 2))  # shape
            for _ in range(3):
                outs.append(g(x, 2))
        return [o.detach().clone() for o in outs]

    def make() -> Any:
        return graphjit.graphed(net.forward)

    _, off, on, _g = _both(monkeypatch, make, calls)
    assert on == off


def test_settings_read_again_a_nested_call_and_a_changed_guard_take_the_python_path(emu, lane_on, monkeypatch):
    box = {"scale": 2.0}

    def f(x: torch.Tensor) -> torch.Tensor:
        return x * box["scale"] + 1

    def calls(g: Any) -> list[Any]:
        x = torch.randn(3, 4)
        outs = [g(x) for _ in range(5)]
        box["scale"] = 3.0  # a value the graph froze: the guards see it
        outs += [g(x) for _ in range(5)]
        monkeypatch.setenv("GRAPHJIT_DISABLE", "1")
        env.refresh()
        outs.append(g(x))
        monkeypatch.delenv("GRAPHJIT_DISABLE")
        env.refresh()
        outs += [g(x) for _ in range(3)]
        box["scale"] = 2.0
        return outs

    _, off, on, g = _both(monkeypatch, lambda: graphjit.graphed(f), calls)
    assert on == off and on["disabled_calls"] == 1
    x = torch.randn(3, 4)
    assert torch.equal(g(x), x * 2.0 + 1)


def test_reset_drops_the_plan_and_counts_survive_every_read(emu, lane_on, python_replays):
    g = graphjit.graphed(_step)
    args = _inputs(0)
    for _ in range(8):
        g(*args, 0.5)
    state = g._self_state
    assert state.lane is not None and state.lane.hits > 0
    d = g.stats()  # moves the lane's counts in first
    assert state.lane.hits == 0 and d["calls"] == 8 and d["replays"] == 8 - d["keys"][0]["warmups"]
    assert "8 calls" in g.report()
    g.reset()
    assert state.lane is None
    out = g(*args, 0.5)
    assert _same(out, _step(*args, 0.5)) and g.stats()["keys"][0]["state"] == "warmup"


def test_an_adopted_input_that_moved_is_captured_again(emu, lane_on, monkeypatch):
    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x * 2 + y

    def calls(g: Any) -> list[Any]:
        x, y = torch.randn(3, 4), torch.randn(3, 4)
        for _ in range(3):
            g(x, y)
        sx, sy = g.static_inputs(x, y)[0]
        outs = [g(sx, sy) for _ in range(4)]
        outs += [g(torch.randn(3, 4), sy) for _ in range(3)]
        return outs

    _, off, on, _g = _both(monkeypatch, lambda: graphjit.graphed(f), calls)
    assert on == off


def test_threads_calling_one_function_get_their_own_results(emu, lane_on):
    g = graphjit.graphed(_step)
    warm = _inputs(0)
    for _ in range(6):
        g(*warm, 0.5)
    assert g._self_state.lane is not None
    errors: list[str] = []

    def worker(seed: int) -> None:
        for i in range(40):
            args = _inputs(seed * 100 + i)
            if not _same(g(*args, 0.5), _step(*args, 0.5)):
                errors.append(f"thread {seed} call {i}")

    _in_threads(worker, 4)
    assert not errors
    assert g.stats()["calls"] == 6 + 160


def test_a_launch_through_a_c_function_pointer(emu, lane_on, monkeypatch, python_replays):
    """The lane's own launch (how it calls the csrc library's gj_feed_launch on a GPU): the emulator's launch
    behind a C function pointer, the table's counts and launch flag read from the table as the library reads them."""
    seen: list[tuple[int, int, int]] = []
    proto = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)

    def lane_launch(self: Any) -> tuple[int, Callable[[int], int], int]:
        def launch(table: int, stream: int) -> int:
            words = (ctypes.c_uint64 * 8).from_address(table)
            seen.append((words[4], words[5], words[6]))
            return self.launch(words[4], words[5]) if words[6] else 1
        self.c_launch = proto(launch)  # kept alive with the feed
        return ctypes.cast(self.c_launch, ctypes.c_void_p).value, lambda index: 0, 0

    monkeypatch.setattr(graph_emulator.EmulatedFeed, "lane_launch", lane_launch, raising=False)
    g = graphjit.graphed(_step)
    for seed in range(10):
        args = _inputs(seed)
        assert _same(g(*args, 0.5), _step(*args, 0.5))
    assert len(seen) >= 4 and all(s == (3, 2, 1) for s in seen)
    key = g.stats()["keys"][0]
    assert key["fed_replays"] == key["replays"] - 1 == 7  # every replay but the capturing call's


def test_a_failed_launch_is_left_to_the_python_path(emu, lane_on, monkeypatch):
    g = graphjit.graphed(_step)
    args = _inputs(0)
    for _ in range(6):
        g(*args, 0.5)
    feed = only_entry(g).graph.feed
    monkeypatch.setattr(feed, "launch", lambda n_in, n_out: 3, raising=False)  # the library refuses every launch
    g._self_state.drop_lane()
    only_entry(g).lane = None
    for _ in range(4):
        assert _same(g(*args, 0.5), _step(*args, 0.5))  # the copy path serves: the Python path marked it broken
    assert only_entry(g).handoff is None  # and the key's replays copy by the framework from now on


def test_a_plan_does_not_keep_its_function_alive(emu, lane_on):
    g = graphjit.graphed(_step)
    args = _inputs(0)
    for _ in range(6):
        g(*args, 0.5)
    assert g._self_state.lane is not None
    state = weakref.ref(g._self_state)
    entry = weakref.ref(only_entry(g))
    gc.collect()
    gc.disable()
    try:
        del g  # without a collection: no reference cycle holds the function or its entry (its graph's memory)
        assert state() is None and entry() is None
    finally:
        gc.enable()


def test_no_compiler_means_the_python_path(emu, monkeypatch, tmp_path):
    monkeypatch.setattr(lane, "_module", None)
    monkeypatch.setattr(lane, "_failed", None)
    monkeypatch.setattr(lane, "compiler", lambda: ["/nonexistent/cc"])
    monkeypatch.setenv("GRAPHJIT_LANE", "on")
    monkeypatch.setenv("GRAPHJIT_CACHE_DIR", str(tmp_path))
    env.refresh()
    try:
        g = graphjit.graphed(_step)
        for seed in range(6):
            args = _inputs(seed)
            assert _same(g(*args, 0.5), _step(*args, 0.5))
        assert g._self_state.lane is None
        assert "could not run" in (lane.status()["failed"] or "")
    finally:
        monkeypatch.delenv("GRAPHJIT_LANE")
        monkeypatch.delenv("GRAPHJIT_CACHE_DIR")
        env.refresh()


def test_a_plan_made_while_calls_pass_other_strides_keeps_the_graphs_layout(emu, lane_on):
    """The plan fixes the strides the handoff requires (its buffers'), not those of the call that made it: a
    transposed input is copied by the Python path (the framework's copy), never its storage's bytes by the lane."""

    def f(x: torch.Tensor) -> torch.Tensor:
        return x * 2 + 1

    g = graphjit.graphed(f)
    for _ in range(4):
        a = torch.randn(4, 4)
        assert torch.equal(g(a), f(a))
    for i in range(6):  # the plan is made on the first two of these
        b = torch.randn(4, 4).t()
        assert torch.equal(g(b), f(b)), i
    for i in range(4):  # and serves the graph's own layout after them
        a = torch.randn(4, 4)
        assert torch.equal(g(a), f(a)), i
    assert g._self_state.lane is not None and g._self_state.lane.hits >= 2


_written = torch.zeros(3, 4)


def _writes_and_returns_its_input(x: torch.Tensor) -> tuple[torch.Tensor]:
    _written.copy_(x * 2)
    return (x,)


def test_copied_outputs_none_of_them_fresh(emu, lane_on, monkeypatch):
    def calls(g: Any) -> list[Any]:
        outs = []
        for _ in range(8):
            x = torch.randn(3, 4)
            out = g(x)
            assert type(out) is tuple and out[0] is x and torch.equal(_written, x * 2)
            outs.append(_written.clone())
        return outs

    _, off, on, g = _both(monkeypatch, lambda: graphjit.graphed(_writes_and_returns_its_input), calls)
    assert on == off
    assert g._self_state.lane is not None


def test_reset_frees_the_buffers_at_once(emu, lane_on):
    g = graphjit.graphed(_step)
    args = _inputs(0)
    for _ in range(6):
        g(*args, 0.5)
    assert g._self_state.lane is not None
    entry = only_entry(g)
    held = [weakref.ref(t) for t in (*entry.inputs.statics, *entry.outputs.tensors)]
    del entry
    gc.disable()
    try:
        g.reset()
        assert all(r() is None for r in held)  # without a collection: nothing left in a reference cycle
    finally:
        gc.enable()


def test_an_interrupt_in_a_check_is_the_calls_own(emu, lane_on):
    """A KeyboardInterrupt raised once, inside a check the lane makes (the owner's ``training``): the call raises it
    (the lane does not swallow it and hand the call to the Python path, whose second read would not raise)."""

    class Owner:
        interrupts = 0

        @property
        def training(self) -> bool:
            if Owner.interrupts:
                Owner.interrupts -= 1
                raise KeyboardInterrupt
            return False

        def step(self, x: torch.Tensor) -> torch.Tensor:
            return x + 1

    owner = Owner()
    g = graphjit.graphed(owner.step)
    x = torch.randn(3)
    for _ in range(6):
        g(x)
    assert g._self_state.lane is not None
    Owner.interrupts = 1
    with pytest.raises(KeyboardInterrupt):
        g(x)
    assert torch.equal(g(x), x + 1)


def test_a_launch_that_raises_is_the_calls_error_and_counted_as_a_call(emu, lane_on, monkeypatch):
    def calls(g: Any) -> list[Any]:
        args = _inputs(0)
        outs = [g(*args, 0.5) for _ in range(6)]
        feed = only_entry(g).graph.feed
        state = {"n": 0}

        def launch(n_in: int, n_out: int) -> int:
            state["n"] += 1
            raise RuntimeError("the launch failed")

        monkeypatch.setattr(feed, "launch", launch, raising=False)
        entry = only_entry(g)
        if entry.lane:  # made again with the failing launch
            g._self_state.drop_lane()
            entry.lane.retire()
            entry.lane = None
        for _ in range(2):  # two Python replays, then the lane
            with pytest.raises(RuntimeError, match="the launch failed"):
                g(*args, 0.5)
        for _ in range(3):
            with pytest.raises(RuntimeError, match="the launch failed"):
                g(*args, 0.5)
        outs.append(torch.tensor(float(state["n"])))  # one launch a call, never a second one
        return outs

    _, off, on, _g = _both(monkeypatch, lambda: graphjit.graphed(_step), calls)
    assert on == off and on["calls"] == 11


def test_a_passing_settings_change_does_not_switch_the_lane_off(emu, lane_on, monkeypatch):
    g = graphjit.graphed(_step)
    args = _inputs(0)
    for _ in range(6):
        g(*args, 0.5)
    monkeypatch.setenv("GRAPHJIT_CHECK_OUTPUTS", "1")  # no plan under these settings
    env.refresh()
    for _ in range(3):
        g(*args, 0.5)
    monkeypatch.delenv("GRAPHJIT_CHECK_OUTPUTS")
    env.refresh()
    for _ in range(4):
        g(*args, 0.5)
    state = g._self_state
    assert state.lane is not None and state.lane is only_entry(g).lane and state.lane.hits >= 1


def test_settings_read_again_make_a_new_plan(emu, lane_on):
    g = graphjit.graphed(_step)
    args = _inputs(0)
    for _ in range(6):
        g(*args, 0.5)
    first = g._self_state.lane
    env.refresh()
    for _ in range(4):
        g(*args, 0.5)
    state = g._self_state
    assert state.lane is not None and state.lane is not first and state.lane.hits >= 1


def test_a_recaptured_key_frees_the_old_graphs_buffers_at_once(emu, lane_on):
    def f(x: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        state.add_(1)  # written in place: the caller's tensor is adopted
        return x * state

    g = graphjit.graphed(f)
    x, state = torch.randn(3, 4), torch.zeros(3, 4)
    for _ in range(6):
        g(x, state)
    assert g._self_state.lane is not None
    entry = only_entry(g)
    held = [weakref.ref(t) for t in entry.outputs.tensors]
    del entry
    gc.disable()
    try:
        other = torch.zeros(3, 4)
        assert torch.equal(g(x, other), x * 1)  # moved: recaptured, the old entry released
        assert all(r() is None for r in held)
    finally:
        gc.enable()


def test_the_doctors_row_says_where_the_lane_is_or_why_not(monkeypatch, tmp_path):
    from graphjit.doctor.context import Context
    from graphjit.doctor.report import Report
    from graphjit.doctor.system import check_lane

    def row(setting: str) -> Any:
        report = Report(options={})
        check_lane(Context(report, ("torch",), False, False, 60.0), setting)
        (only,) = report.rows
        return only

    assert row("off").status == "skip" and "GRAPHJIT_LANE=off" in row("off").result
    monkeypatch.setenv("GRAPHJIT_CACHE_DIR", str(tmp_path))
    env.refresh()
    monkeypatch.setattr(lane, "_paths", {})
    try:
        fresh = row("auto")  # nothing built in an empty cache: whether it can be, and nothing written
        assert ("not built yet" in fresh.result) == (lane.missing_tools() is None) and not list(tmp_path.iterdir())
        if lane.missing_tools() is None:
            monkeypatch.setattr(lane, "compiler", lambda: ["/nonexistent/cc"])
            broken = row("auto")
            assert broken.status == "skip" and "cannot be built here: no C compiler" in broken.result
    finally:
        monkeypatch.delenv("GRAPHJIT_CACHE_DIR")
        env.refresh()


def test_one_aliased_output_fresh_or_the_callers_own(emu, lane_on, monkeypatch):
    def fresh(x: torch.Tensor) -> torch.Tensor:
        return x * 3

    def own(x: torch.Tensor) -> torch.Tensor:
        return x.mul_(2)

    for fn in (fresh, own):
        def calls(g: Any, fn: Any = fn) -> list[Any]:
            x = torch.ones(2, 3)
            outs = []
            for _ in range(7):
                out = g(x)
                assert (out is x) == (fn is own)
                outs.append(out.clone())
            return outs

        _, off, on, g = _both(monkeypatch, lambda fn=fn: graphjit.graphed(fn, outputs="alias"), calls)
        assert on == off and g._self_state.lane is not None


def test_fresh_outputs_are_laid_out_as_a_contiguous_clone_by_both_paths(emu, lane_on, monkeypatch, python_replays):
    """A fresh output is made by ``torch.empty_like`` alone where its buffer has a contiguous tensor's own strides,
    else with ``memory_format=torch.contiguous_format`` (a contiguous buffer with an odd stride in a size-1 dim):
    either way laid out as the clone the copy path returns, by the lane and by the Python path."""
    from graphjit.backends.torch.feed import empty_for, standard_strides

    def odd(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return (x * 2).t(), x + 1  # [1, 8] with strides (1, 1): contiguous, not a contiguous tensor's own strides

    column = torch.randn(8, 1)
    assert not standard_strides((column * 2).t()) and standard_strides(column + 1)
    assert empty_for([column + 1]) is torch.empty_like and empty_for([(column * 2).t(), column]) is not torch.empty_like

    def calls(g: Any) -> list[Any]:
        outs = []
        for i in range(7):
            x = torch.randn(8, 1)
            out = g(x)
            want = odd(x)
            for o, w in zip(out, want):
                assert torch.equal(o, w)
                if i > g.graphjit_options.warmup:  # a replay (a warmup call returns the eager run's own outputs)
                    assert o.stride() == w.clone(memory_format=torch.contiguous_format).stride()
            outs.append(out)
        return outs

    _, off, on, g = _both(monkeypatch, lambda: graphjit.graphed(odd), calls)
    assert on == off and g._self_state.lane is not None
    served = on["keys"][0]["fed_replays"] - (python_replays[0] - off["keys"][0]["fed_replays"])
    assert served >= 1  # the lane's fresh outputs are laid out as the Python path's


def test_a_key_signed_inside_an_autocast_block_is_served_by_the_lane(emu, lane_on, monkeypatch, python_replays):
    """Modes read inside an autocast block have no C probe: the plan calls ``Backend.modes`` itself, so the lane
    serves that key's calls as the Python path would, and a call outside the block (another key) takes the Python
    path."""
    w = torch.randn(7, 7)

    def mm(x: torch.Tensor) -> torch.Tensor:
        return (x @ w).float() + 1

    def calls(g: Any) -> list[Any]:
        outs = []
        x = torch.randn(4, 7)
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            for _ in range(8):
                outs.append(g(x))
        with torch.no_grad():
            outs.append(g(x))  # out of the block: another key
        return [o.clone() for o in outs]

    _, off, on, _g = _both(monkeypatch, lambda: graphjit.graphed(mm), calls)
    assert on == off
    fed = [sum(k["fed_replays"] for k in stats["keys"]) for stats in (off, on)]
    served = fed[1] - (python_replays[0] - fed[0])
    assert served >= 3  # capture at call 3, two Python replays, then the lane


def test_a_key_without_a_handoff_is_told_once_that_it_never_has_a_plan(emu, lane_on, monkeypatch):
    """A piecewise key (an island cuts its graph) has no handoff, so no plan: its replays ask for one once, not on
    every call (each asking cost a plan's checks and the function's lock on the call's host time)."""

    @graphjit.eager
    def shift(h: torch.Tensor) -> torch.Tensor:
        return h + 1

    def step(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return shift(a @ b) * 2

    asked: list[int] = []
    planned = lane.plan
    monkeypatch.setattr(lane, "plan", lambda *a: asked.append(1) or planned(*a))
    g = graphjit.graphed(step)
    a, b = torch.randn(3, 4), torch.randn(4, 4)
    with torch.no_grad():
        outs = [g(a, b) for _ in range(12)]
    assert all(torch.equal(o, shift(a @ b) * 2) for o in outs)
    entry = only_entry(g)
    assert entry.handoff is None and entry.stats.replays == 12 - 2  # two warmups (the capture replays)
    assert entry.lane is False and len(asked) == 1, asked
