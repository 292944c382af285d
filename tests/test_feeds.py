"""graphjit.feeds on plain Python values: what a fed entry does with a value that is not a number."""

from __future__ import annotations

from graphjit.feeds import Feeds, Slot


class _NoCompare:
    """Stands for a user's device tensor: comparing it with a number would read it on the host (a sync)."""

    def __eq__(self, other: object) -> bool:
        raise AssertionError("compared with a number")

    __hash__ = object.__hash__


def test_a_value_that_is_not_a_number_is_left_in_place_without_being_compared():
    fills = []
    mine = _NoCompare()
    group = {"momentum": mine, "lr": 0.1}
    slot_m, slot_lr = Slot("momentum tensor"), Slot("lr tensor")
    feeds = Feeds([(group, "momentum", slot_m), (group, "lr", slot_lr)], lambda t, v: fills.append((t, v)))
    feeds.enter()
    assert group["momentum"] is mine and group["lr"] == "lr tensor"
    feeds.exit()
    assert group == {"momentum": mine, "lr": 0.1} and fills == [("lr tensor", 0.1)]


def test_a_zero_momentum_stays_a_number():
    group = {"momentum": 0.0}
    feeds = Feeds([(group, "momentum", Slot("t"))], lambda t, v: None)
    feeds.enter()
    assert group["momentum"] == 0.0
    feeds.exit()
