"""The replay lane's guard scan (``csrc/lane_guards.c``, used by ``GuardSet.holds``): one C call gives what the Python
expression ``list(map(operator.call, getters, containers)) != expected`` gives, negated, for every kind of container
and read, values that differ, entries gone, comparisons that raise, and it never swallows a KeyboardInterrupt."""

from __future__ import annotations

import operator
import os
from collections.abc import Callable
from typing import Any

import pytest

from graphjit import guard_set

pytestmark = pytest.mark.usefixtures("lane_on")


class Obj:
    def __init__(self, **kw: Any) -> None:
        self.__dict__.update(kw)


class Missing(dict):
    def __missing__(self, key: Any) -> Any:
        return "made by __missing__"


class Raises:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def __eq__(self, other: Any) -> bool:
        raise self.exc

    __hash__ = object.__hash__


class Contains(dict):
    def __contains__(self, key: Any) -> bool:
        return True


class Deep:
    def __init__(self) -> None:
        self.inner = Obj(x=3)


def _lists(entries: list[tuple[Callable, Any, list[Any]]]) -> tuple[bytes, list[Any], list[Any], list[Any], list[Any]]:
    """(kinds, getters, containers, keys, expected) of ``(getter, container, keys)`` entries, expected read now."""
    getters = [g for g, _c, _k in entries]
    containers = [c for _g, c, _k in entries]
    keys = [k for _g, _c, k in entries]
    expected = [g(c) for g, c, _k in entries]
    return bytes(guard_set._kind(g, k) for g, k in zip(getters, keys)), getters, containers, keys, expected


def _python(getters: list[Any], containers: list[Any], expected: list[Any]) -> bool:
    try:
        return list(map(operator.call, getters, containers)) == expected
    except Exception:
        return False


def _both(lists: tuple[bytes, list[Any], list[Any], list[Any], list[Any]]) -> tuple[bool, bool]:
    from graphjit import lane

    kinds, getters, containers, keys, expected = lists
    return _python(getters, containers, expected), lane.module().guards_hold(kinds, getters, containers, keys, expected)


def _entries() -> tuple[dict[str, Any], Obj, list[Any], Missing, Deep, list[tuple[Callable, Any, list[Any]]]]:
    d = {"a": 1, "b": 2.5, "c": "s", 7: None}
    o = Obj(x=1, y=(1, 2), z=None)
    seq = [10, 20, 30]
    miss = Missing(k=1)
    deep = Deep()
    has = guard_set.HasKey("absent")
    seen = guard_set.HasKey("PATH")
    odd = guard_set.HasKey("anything")
    entries = [
        (operator.itemgetter("a", "b", "c", 7), d, ["a", "b", "c", 7]),
        (operator.itemgetter("a"), d, ["a"]),
        (operator.attrgetter("x", "y", "z"), o, ["x", "y", "z"]),
        (operator.attrgetter("x"), o, ["x"]),
        (operator.itemgetter(0, 2), seq, [0, 2]),
        (operator.itemgetter("k"), miss, ["k"]),
        (operator.attrgetter("inner.x"), deep, ["inner.x"]),
        (has, d, [has]),
        (len, seq, [len]),
        (seen, os.environ, [seen]),  # a Mapping: its own __contains__
        (odd, Contains(), [odd]),  # a dict subclass whose __contains__ says otherwise than its items
    ]
    return d, o, seq, miss, deep, entries


def test_every_kind_of_read_holds_as_the_python_expression_says() -> None:
    *_, entries = _entries()
    lists = _lists(entries)
    assert lists[0] == bytes([0, 0, 1, 1, 0, 0, 2, 3, 2, 3, 3])
    assert _both(lists) == (True, True)


@pytest.mark.parametrize("change", ["item", "one_of_several_items", "attr", "list_item", "missing_key_read",
                                    "dotted", "has_key", "length", "deleted_item", "deleted_attr", "short_list",
                                    "equal_but_other_object", "nan"])
def test_a_change_fails_the_scan_as_it_fails_the_python_expression(change: str) -> None:
    d, o, seq, miss, deep, entries = _entries()
    lists = _lists(entries)
    if change == "item":
        d["a"] = 2
    elif change == "one_of_several_items":
        d[7] = 0
    elif change == "attr":
        o.y = (1, 3)
    elif change == "list_item":
        seq[2] = 31
    elif change == "missing_key_read":
        del miss["k"]  # now read through __missing__: another value
    elif change == "dotted":
        deep.inner = Obj(x=4)
    elif change == "has_key":
        d["absent"] = 0
    elif change == "length":
        seq.append(40)
    elif change == "deleted_item":
        del d["c"]
    elif change == "deleted_attr":
        del o.z
    elif change == "short_list":
        del seq[1:]
    elif change == "equal_but_other_object":
        d["b"] = float("2.5")  # another object, equal: holds
    elif change == "nan":
        d["b"] = float("nan")
        lists = _lists(entries)  # captured with a NaN: the same object holds (identity), another NaN would not
    python, scan = _both(lists)
    assert scan == python
    assert python is (change in ("equal_but_other_object", "nan"))


def test_a_comparison_that_raises_fails_the_scan_and_an_interrupt_propagates() -> None:
    d = {"a": 1}
    getter = operator.itemgetter("a")
    kinds = bytes([0])
    from graphjit import lane

    mod = lane.module()
    assert mod.guards_hold(kinds, [getter], [d], [["a"]], [Raises(ValueError("no"))]) is False
    with pytest.raises(KeyboardInterrupt):
        mod.guards_hold(kinds, [getter], [d], [["a"]], [Raises(KeyboardInterrupt())])
    with pytest.raises(TypeError, match="guards_hold"):
        mod.guards_hold(kinds, [getter], [d], [["a"]])


def test_a_comparison_that_rebinds_the_guarded_values_does_not_crash_the_scan() -> None:
    """``==`` runs Python: it may empty the dict and lists being scanned; the scan fails, never reads freed memory."""
    d = {"a": None, "b": 2}
    keys: list[list[Any]] = [["a", "b"]]
    expected: list[Any] = []

    class Clears:
        def __eq__(self, other: Any) -> bool:
            d.clear()
            keys[0].clear()
            expected.clear()
            return True

        __hash__ = object.__hash__

    d["a"] = Clears()
    expected.append((Clears(), 2))
    from graphjit import lane

    assert lane.module().guards_hold(bytes([0]), [operator.itemgetter("a", "b")], [d], keys, expected) is False


def test_a_key_freed_by_a_comparison_during_its_own_lookup_is_still_held() -> None:
    """A dict lookup compares colliding keys with ``__eq__``, which may drop the last reference to the key looked up
    (here: the keys list emptied); the scan holds it, so the lookup never reads a freed key."""
    freed: list[str] = []

    class Key:
        def __hash__(self) -> int:
            return 42

        def __eq__(self, other: Any) -> bool:
            return False

        def __del__(self) -> None:
            freed.append("key")

    keys = [Key()]

    class Collides:
        def __hash__(self) -> int:
            return 42

        def __eq__(self, other: Any) -> bool:
            keys.clear()
            return False

    d = {Collides(): 1, Collides(): 2}
    from graphjit import lane

    assert lane.module().guards_hold(bytes([0]), [None], [d], [keys], ["x"]) is False
    assert freed == ["key"]  # freed once the scan let go of it
