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
