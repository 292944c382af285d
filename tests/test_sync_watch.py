"""What counts as a CPU-GPU sync in a watched warmup (graphjit.backends.torch.syncs), on the CPU: torch's
sync debug mode reports each synchronising call with one exact text; its one-time notice about the mode
(whose wording also says "synchronizing") and every other warning are not syncs.  The watch is
process-wide machinery used per thread: another thread's syncs are not this call's.
"""

from __future__ import annotations

import threading
import warnings

import pytest

pytest.importorskip("torch")

from graphjit.backends.torch import syncs

NOTICE = ("Synchronization debug mode is a prototype feature and does not yet detect all synchronizing operations "
          "(Triggered internally at /pytorch/torch/csrc/cuda/Module.cpp:1003.)")


class Mode:
    def __init__(self, value: int = 0) -> None:
        self.value = value
        self.history: list[int] = []

    def get(self) -> int:
        return self.value

    def set(self, v: int) -> None:
        self.value = v
        self.history.append(v)


def test_only_torchs_report_of_a_synchronising_call_is_a_sync():
    assert syncs.is_sync_report("called a synchronizing CUDA operation")
    assert not syncs.is_sync_report(NOTICE)
    assert not syncs.is_sync_report("this op is synchronizing with the host, says a user")


def test_the_first_watch_of_a_process_finds_no_sync_in_code_without_one():
    mode = Mode()
    w = syncs.SyncWatcher(mode.get, mode.set)
    hits: list[str] = []
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("default")
        with w.watch(hits):
            warnings.warn(NOTICE, UserWarning, stacklevel=1)  # what torch prints on the first switch
            warnings.warn("the user's own warning", UserWarning, stacklevel=1)
    assert hits == []
    assert [str(m.message) for m in shown] == ["the user's own warning"]  # passed on; the notice is not
    assert mode.value == 0 and mode.history == [1, 0]


def test_every_sync_is_found_with_its_line_also_when_one_line_syncs_twice():
    mode = Mode()
    w = syncs.SyncWatcher(mode.get, mode.set)
    hits: list[str] = []
    filters = list(warnings.filters)
    with w.watch(hits):
        for _ in range(2):
            warnings.warn(syncs.SYNC_REPORT, UserWarning, stacklevel=1)
    assert len(hits) == 2 and all(h.startswith(syncs.SYNC_REPORT + " at ") and __file__ in h for h in hits), hits
    assert list(warnings.filters) == filters and warnings.showwarning is not w._show


def test_an_island_may_sync():
    mode = Mode()
    w = syncs.SyncWatcher(mode.get, mode.set)
    hits: list[str] = []
    with w.watch(hits):
        with w.island():
            warnings.warn(syncs.SYNC_REPORT, UserWarning, stacklevel=1)
        warnings.warn(syncs.SYNC_REPORT, UserWarning, stacklevel=1)
    assert len(hits) == 1


def test_another_threads_syncs_are_not_the_watched_calls():
    mode = Mode()
    w = syncs.SyncWatcher(mode.get, mode.set)
    mine: list[str] = []
    theirs: list[str] = []
    inside = threading.Event()
    done = threading.Event()

    def other() -> None:
        inside.wait()
        with w.watch(theirs):
            warnings.warn(syncs.SYNC_REPORT, UserWarning, stacklevel=1)
        warnings.warn(syncs.SYNC_REPORT, UserWarning, stacklevel=1)  # not watched: dropped (graphjit's mode)
        done.set()

    t = threading.Thread(target=other)
    t.start()
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        with w.watch(mine):
            inside.set()
            done.wait(10)
        t.join()
    assert mine == [] and len(theirs) == 1
    assert not [m for m in shown if syncs.is_sync_report(str(m.message))]
    assert mode.history == [1, 0]  # switched on once for both watches, off after the last


def test_a_user_who_runs_the_debug_mode_keeps_it_and_sees_other_threads_syncs():
    mode = Mode(1)
    w = syncs.SyncWatcher(mode.get, mode.set)
    hits: list[str] = []
    shown_elsewhere: list[str] = []

    def other() -> None:
        warnings.warn(syncs.SYNC_REPORT, UserWarning, stacklevel=1)

    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        with w.watch(hits):
            t = threading.Thread(target=other)
            t.start()
            t.join()
        shown_elsewhere = [str(m.message) for m in shown]
    assert hits == [] and shown_elsewhere == [syncs.SYNC_REPORT]
    assert mode.history == [] and mode.value == 1


def test_a_catch_warnings_that_outlives_the_watch_puts_back_a_hook_that_still_works():
    """A block that enters catch_warnings() inside a watch and leaves it after the watch restores graphjit's hook
    (it had saved it); warnings then still reach the user, and later watches still work (no loop)."""
    mode = Mode()
    w = syncs.SyncWatcher(mode.get, mode.set)
    saved = warnings.showwarning
    outer = warnings.catch_warnings()
    hits: list[str] = []
    with w.watch(hits):
        outer.__enter__()  # saves graphjit's hook
    outer.__exit__(None, None, None)  # puts it back after the watch
    try:
        with warnings.catch_warnings(record=True) as shown:
            warnings.simplefilter("always")
            warnings.warn("after the watch", UserWarning, stacklevel=1)
        for _ in range(2):
            with w.watch(hits):
                warnings.warn(syncs.SYNC_REPORT, UserWarning, stacklevel=1)
        with warnings.catch_warnings(record=True) as later:
            warnings.simplefilter("always")
            warnings.warn("later", UserWarning, stacklevel=1)
    finally:
        warnings.showwarning = saved
    assert [str(m.message) for m in shown] == ["after the watch"] and [str(m.message) for m in later] == ["later"]
    assert len(hits) == 2
