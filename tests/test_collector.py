"""``collector_paused``: the cyclic garbage collector is off during a capture and restored after it (CPU)."""

from __future__ import annotations

import gc

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
