"""``collector_paused``: the cyclic garbage collector is off during a capture and restored after it (CPU)."""

from __future__ import annotations

import gc
import importlib
import importlib.util

import pytest

from graphjit.backends.base import collector_paused


@pytest.mark.parametrize("enabled", [True, False])
def test_collector_is_off_inside_and_restored_after(enabled: bool) -> None:
    was = gc.isenabled()
    try:
        (gc.enable if enabled else gc.disable)()
        with collector_paused():
            assert not gc.isenabled()
        assert gc.isenabled() == enabled
        with pytest.raises(KeyError), collector_paused():  # also when the capture raises
            raise KeyError("capture failed")
        assert gc.isenabled() == enabled
    finally:
        (gc.enable if was else gc.disable)()


def test_cycles_made_inside_are_freed_after() -> None:
    class Held:
        freed = 0

        def __del__(self) -> None:
            Held.freed += 1

    gc.collect()
    old = gc.get_threshold()
    gc.set_threshold(1, 1, 1)  # enabled, the collector would run at almost every allocation below
    try:
        with collector_paused():
            cycle: list = [Held()]
            cycle.append(cycle)
            del cycle
            junk = [[object()] for _ in range(1000)]
            assert Held.freed == 0 and len(junk) == 1000
    finally:
        gc.set_threshold(*old)
    gc.collect()
    assert Held.freed == 1


def test_rebuilding_and_collecting_tensors_leaves_no_cycle() -> None:
    """``rebuild`` and ``collect_tensors`` run on every replayed call's inputs and outputs: they must not
    leave a reference cycle that keeps those tensors (GPU memory) alive until the collector runs."""
    import weakref

    from graphjit.buffers import collect_tensors
    from graphjit.keys import rebuild

    class T:  # a stand-in tensor type: only identity matters here
        pass

    def is_tensor(x: object) -> bool:
        return isinstance(x, T)

    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        a, b = T(), T()
        refs = [weakref.ref(a), weakref.ref(b)]
        template = [T(), {"k": (T(), None)}, [3]]
        obj = rebuild(template, [a, b], is_tensor)
        assert obj[0] is a and obj[1]["k"][0] is b and obj[1]["k"][1] is None and obj[2] == [3]
        found = collect_tensors(obj, is_tensor)
        assert found[0] is a and found[1] is b
        del a, b, obj, found
        assert all(r() is None for r in refs), "a tensor outlived its last reference"
    finally:
        if was:
            gc.enable()


def test_pauses_overlapping_across_threads_restore_the_collector_once() -> None:
    """Two threads' pauses overlap (A enters, B enters, A leaves, B leaves): the collector stays off until
    the last one leaves, then it is on again."""
    import threading

    was = gc.isenabled()
    gc.enable()
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen: dict[str, bool] = {}

    def thread_a() -> None:
        with collector_paused():
            a_in.set()
            b_in.wait(10)
        a_out.set()

    def thread_b() -> None:
        a_in.wait(10)
        with collector_paused():
            b_in.set()
            a_out.wait(10)
            seen["after A left, inside B"] = gc.isenabled()

    try:
        ts = [threading.Thread(target=thread_a), threading.Thread(target=thread_b)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(20)
        assert seen == {"after A left, inside B": False}
        assert gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()


def test_every_backend_capture_runs_with_the_collector_paused() -> None:
    """``Backend.capture`` is where the pause lives: it wraps the framework's ``capture_graph``, which both
    backends implement (and neither overrides ``capture``)."""
    import types

    from graphjit.backends.base import Backend

    seen: list[bool] = []
    framework = types.SimpleNamespace(capture_graph=lambda fn, device, pool, debug: (seen.append(gc.isenabled()),
                                                                                      fn()))
    was = gc.isenabled()
    gc.enable()
    try:
        assert Backend.capture(framework, lambda: "out", "cuda:0", None, False) == (None, "out")  # type: ignore[arg-type]
        assert seen == [False] and gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()
    for module, name in (("torch", "TorchBackend"), ("paddle", "PaddleBackend")):
        if importlib.util.find_spec(module) is None:
            continue
        cls = getattr(importlib.import_module(f"graphjit.backends.{module}.graphs"), name)
        assert "capture_graph" in cls.__dict__ and "capture" not in cls.__dict__, cls
