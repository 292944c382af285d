"""Warmup runs watch the Python code they run with a ``sys.setprofile`` hook (graphjit/names.py); a compiler
translating inside such a run is not watched, since a profile hook made a Dynamo compile of a transformers model
3-4x slower on the CPU.  The compile tracer's warmup is watched for what it does to the host alone (the Python of
Dynamo's graph breaks: a clock read, a print), not for names (those of the compiled function are Dynamo's to guard),
its compiles unwatched likewise; a function traced ``eager`` that calls a ``torch.compile``'d function has the
hook taken off for that compile and put back after it, so the names its own code reads are still guarded."""

from __future__ import annotations

import sys
import threading

import pytest

torch = pytest.importorskip("torch")

from graphjit.backends.torch import dynamo  # noqa: E402
from graphjit.names import NameRecorder  # noqa: E402

pytestmark = pytest.mark.torch


class _Profiled:
    """A Dynamo backend that notes whether a profile hook is set while it compiles (in the middle of Dynamo's
    compilation of a frame), then runs the graph as traced."""

    def __init__(self) -> None:
        self.seen: list[bool] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[object]) -> object:
        self.seen.append(sys.getprofile() is not None)
        return gm.forward

    def compile(self, fn):
        return torch.compile(fn, backend=self)


@pytest.fixture
def profiled():
    torch._dynamo.reset()
    yield _Profiled()
    torch._dynamo.reset()


class Cfg:
    scale = 2.0


def test_a_compile_inside_a_recorded_block_runs_without_the_hook_and_the_names_after_it_are_recorded(profiled):
    compiled = profiled.compile(lambda x: x * 3 + 1)

    def after(cfg):
        return cfg.scale

    rec = NameRecorder()
    with dynamo.compiles_unwatched(rec.pause, rec.resume), rec:
        compiled(torch.ones(3))
        assert sys.getprofile() is not None, "the hook is back after the compile"
        after(Cfg())
    assert profiled.seen == [False], profiled.seen
    assert rec.complete and "scale" in rec.names
    assert sys.getprofile() is None


def test_without_the_pause_the_compile_runs_under_the_hook(profiled):
    """The control: the callbacks do see the hook where nothing takes it off (so the test above can fail)."""
    compiled = profiled.compile(lambda x: x * 3 + 1)
    with NameRecorder():
        compiled(torch.ones(3))
    assert profiled.seen == [True]


def test_a_recorder_left_paused_is_not_complete():
    rec = NameRecorder()
    with rec:
        rec.pause()
        assert sys.getprofile() is None
    assert not rec.complete and not rec.paused
    assert sys.getprofile() is None


def test_pause_and_resume_from_another_thread_change_nothing():
    rec = NameRecorder()
    with rec:
        t = threading.Thread(target=rec.pause)
        t.start()
        t.join()
        assert sys.getprofile() is not None and not rec.paused
    assert rec.complete


def test_pause_keeps_a_profiler_that_is_not_the_recorders():
    def other(frame, event, arg):
        return None

    sys.setprofile(other)
    try:
        rec = NameRecorder()
        with rec:
            assert not rec.active
            rec.pause()
            assert sys.getprofile() is other
    finally:
        sys.setprofile(None)
    assert not rec.complete


def test_a_watched_warmup_compiles_unwatched_and_records_the_names_its_own_code_reads(profiled):
    """A warmup run as graphjit watches the last one before a capture (:func:`graphjit.warmup.watched_call` on the
    torch backend, the names recorded): the torch.compile'd function it calls compiles without the hook, and the
    attribute the function's own code reads after it is among the names recorded.  (On the emulator the capture's
    dispatch mode makes Dynamo skip the frame, so the real backend on the CPU runs this.)"""
    from graphjit import backends, guards
    from graphjit.warmup import watched_call

    b = backends.get("torch")
    inner = profiled.compile(lambda x: x * 3 + 1)
    cfg = Cfg()

    def f(x):
        return inner(x) * cfg.scale

    x = torch.ones(4)
    out, obs = watched_call(b, lambda: f(x), [("argument 'x'", x)], "cpu", 1 << 30, sync_watch=False,
                            guard_src=guards.sources(f, None), runs_python=True)
    assert torch.equal(out, (x * 3 + 1) * 2.0)
    assert profiled.seen == [False], profiled.seen
    assert obs.names is not None and "scale" in obs.names
    assert sys.getprofile() is None


def test_the_compile_tracers_warmup_compiles_unwatched_and_watches_its_graph_breaks_for_the_host_alone(profiled):
    """The compile tracer's warmup (:func:`graphjit.warmup.watched_call` with ``runs_python=False, host_calls=True``,
    as lifecycle.py calls it for torch's ``compile``): Dynamo compiles both graphs around the graph break without the
    hook, the break's clock read, which Dynamo runs as Python, is seen, and no names are recorded (they are Dynamo's
    to guard)."""
    import time

    from graphjit import backends, guards
    from graphjit.warmup import watched_call

    b = backends.get("torch")

    def f(x):
        y = x * 3
        stamp = time.time()  # Dynamo does not trace it: a graph break
        return y + 1 + stamp * 0

    compiled = profiled.compile(f)
    x = torch.ones(4)
    out, obs = watched_call(b, lambda: compiled(x), [("argument 'x'", x)], "cpu", 1 << 30, sync_watch=False,
                            guard_src=guards.sources(f, None), runs_python=False, host_calls=True)
    assert torch.equal(out, x * 3 + 1)
    assert profiled.seen and not any(profiled.seen), profiled.seen
    assert obs.clocked and "time.time() at " in obs.clocked[0], obs.clocked
    assert obs.names is None
    assert sys.getprofile() is None


def test_a_process_that_never_imported_dynamo_does_not_import_it_for_the_watch():
    """Nothing compiles where Dynamo was never imported (``torch.compile`` imports it where it is called), and
    importing it for a watched run cost the process's first capture 2.5-3 s on an H100's host: the watch leaves it
    unimported, and with it imported, watches the compiles as before."""
    import subprocess

    code = (
        "import sys, torch\n"
        "from graphjit.backends.torch import dynamo\n"
        "calls = []\n"
        "with dynamo.compiles_unwatched(lambda: calls.append('pause'), lambda: calls.append('resume')):\n"
        "    pass\n"
        "assert 'torch._dynamo' not in sys.modules, 'imported by the watch'\n"
        "import torch._dynamo\n"
        "f = torch.compile(lambda x: x * 2, backend='eager')\n"
        "with dynamo.compiles_unwatched(lambda: calls.append('pause'), lambda: calls.append('resume')):\n"
        "    f(torch.ones(2))\n"
        "assert calls[:2] == ['pause', 'resume'], calls\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-2000:]
