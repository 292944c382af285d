"""Shared fixtures: framework availability, GPU skips, a clean environment per test."""

from __future__ import annotations

import importlib.util
import logging

import pytest

HAS_TORCH = importlib.util.find_spec("torch") is not None
HAS_PADDLE = importlib.util.find_spec("paddle") is not None


def torch_cuda() -> bool:
    if not HAS_TORCH:
        return False
    import torch

    return bool(torch.cuda.is_available())


def paddle_cuda() -> bool:
    if not HAS_PADDLE:
        return False
    import paddle

    return bool(paddle.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "paddle" in item.keywords and not HAS_PADDLE:
            item.add_marker(pytest.mark.skip(reason="paddlepaddle is not installed"))
        if "torch" in item.keywords and not HAS_TORCH:
            item.add_marker(pytest.mark.skip(reason="torch is not installed"))
        if "gpu" in item.keywords:
            if "paddle" in item.keywords and not paddle_cuda():
                item.add_marker(pytest.mark.skip(reason="needs paddle with a CUDA GPU"))
            elif "paddle" not in item.keywords and not torch_cuda():
                item.add_marker(pytest.mark.skip(reason="needs torch with a CUDA GPU"))


@pytest.fixture(autouse=True)
def _fresh_env(monkeypatch: pytest.MonkeyPatch):
    """Every test starts from the default GRAPHJIT_* settings and re-reads them afterwards."""
    import os

    import graphjit.env

    for name in list(os.environ):
        if name.startswith("GRAPHJIT_"):
            monkeypatch.delenv(name, raising=False)
    graphjit.env.refresh()
    yield
    monkeypatch.undo()
    graphjit.env.refresh()


@pytest.fixture
def emu():
    """graphjit's torch backend replaced by the CPU stand-in for CUDA graphs (tests/graph_emulator.py)."""
    pytest.importorskip("torch")
    from graph_emulator import emulated_torch

    with emulated_torch() as backend:
        yield backend


@pytest.fixture
def lane_on(monkeypatch: pytest.MonkeyPatch):
    """The replay lane (graphjit/lane.py) built at once and loaded; a machine without the tools to build it skips."""
    from graphjit import env, lane

    missing = lane.missing_tools()
    if missing is not None:
        pytest.skip(f"the replay lane cannot be built here ({missing}): the Python path serves")
    monkeypatch.setenv("GRAPHJIT_LANE", "on")
    env.refresh()
    assert lane.prepare() is not None, lane.status()
    yield
    monkeypatch.delenv("GRAPHJIT_LANE")
    env.refresh()


@pytest.fixture(params=["python", "lane"])
def scan(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The guards compared by the Python expression (no lane loaded) or by the lane's C scan (csrc/lane_guards.c):
    each test that takes it runs both ways."""
    from graphjit import lane

    if request.param == "lane":
        request.getfixturevalue("lane_on")
    else:
        monkeypatch.setattr(lane, "_module", None)
    return str(request.param)


@pytest.fixture
def python_replays(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many calls graphjit's Python path handed to feed nodes (``Handoff.replay``), in a one-item list: those
    the replay lane did not serve."""
    from graphjit.handoff import Handoff

    count = [0]
    original = Handoff.replay

    def counted(self, *a, **k):
        count[0] += 1
        return original(self, *a, **k)

    monkeypatch.setattr(Handoff, "replay", counted)
    return count


@pytest.fixture
def gj_log(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG, logger="graphjit")
    return caplog


@pytest.fixture
def freed_by_refcount():
    """``check(make)``: runs ``make()`` with Python's cyclic collector off; ``make`` returns the objects to
    watch (a graphed layer's core, its slots and graphs).  True when every one of them died by reference
    counting alone, once ``make``'s list was dropped."""
    import gc
    import weakref

    def check(make):
        was = gc.isenabled()
        gc.collect()
        gc.disable()
        try:
            refs = [weakref.ref(o) for o in make()]
            return all(r() is None for r in refs)
        finally:
            if was:
                gc.enable()

    return check


# -- GPU process health ----------------------------------------------------------------------------------
def torch_health_problem() -> str | None:
    """None if this process can still use CUDA through torch as a program would: no stream left capturing,
    the default generator draws numbers (its state put back afterwards), queued work completes."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    try:
        if torch.cuda.is_current_stream_capturing():
            return "the current stream is still capturing"
        torch.cuda.synchronize()
        for i in range(torch.cuda.device_count()):
            gen = torch.cuda.default_generators[i]
            state = gen.get_state()
            try:
                torch.empty(1, device=f"cuda:{i}").uniform_()
            finally:
                gen.set_state(state)
        torch.cuda.synchronize()
    except Exception as exc:  # any failure here is the finding
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return None


@pytest.fixture(autouse=True)
def _gpu_process_stays_healthy(request: pytest.FixtureRequest):
    """After every torch GPU test: the process must still be usable (a graphjit failure must never poison it).
    An unhealthy process fails the test after which it was found, not the tests that come later."""
    yield
    node = request.node
    if "gpu" not in node.keywords or "paddle" in node.keywords:
        return
    problem = torch_health_problem()
    if problem is not None:
        pytest.fail(f"the process is not healthy after this test: {problem}", pytrace=False)


_exit_status = [0]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _exit_status[0] = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """With GRAPHJIT_TEST_HARD_EXIT=1 (tools/gpu_tests.py): leave at once after the report (Paddle 2.6 may hang
    in its exit handlers on the GPU machine)."""
    import os
    import sys

    if os.environ.get("GRAPHJIT_TEST_HARD_EXIT") == "1":
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_exit_status[0])
