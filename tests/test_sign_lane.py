"""The replay lane's check of a plain call's layout (csrc/lane.c ``LayoutCheck``, graphjit/lane.py ``layout_check``),
which ``keys.Signer.sign_plain`` asks first where the lane is loaded.  The Python comparison is the reference: every
call must get the key a signer without the C check gives it, and the C check must have served the calls that repeat
the last key (counted through a wrapper)."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

import pytest

from graphjit import env, lane
from graphjit.keys import Signer

HAS_TORCH = importlib.util.find_spec("torch") is not None
if HAS_TORCH:
    import torch


def _f(a: Any, b: Any, scale: Any) -> Any:
    return a * scale + b


class _Counted:
    """The C check, with the calls it served (gave tensors for) counted."""

    def __init__(self, check: Callable[..., Any]) -> None:
        self.check, self.served, self.asked = check, 0, 0

    def __call__(self, instance: Any, args: tuple[Any, ...]) -> Any:
        self.asked += 1
        tensors = self.check(instance, args)
        self.served += tensors is not None
        return tensors


def _pair(owner: Any = None) -> tuple[Signer, Signer]:
    fast = Signer(_f, None, "auto", "f", owner=owner)
    reference = Signer(_f, None, "auto", "f", owner=owner)
    reference.layout_checks = False  # the Python comparison only
    return fast, reference


def _sign_both(fast: Signer, reference: Signer, instance: Any, args: tuple[Any, ...]) -> bool:
    """Sign one call with both; the keys must be equal and the tensors the call's own.  True where the C check
    served it."""
    counted = fast._fast[0] if fast._fast else None
    served = counted.served if isinstance(counted, _Counted) else 0
    got, want = fast.sign(instance, args, {}), reference.sign(instance, args, {})
    assert got.key == want.key, (args, got.key, want.key)
    assert [id(t) for t in got.tensors] == [id(t) for t in want.tensors]
    assert got.paths == want.paths
    if fast._fast and not isinstance(fast._fast[0], _Counted):
        fast._fast = (_Counted(fast._fast[0]), *fast._fast[1:])
    return isinstance(counted, _Counted) and counted.served > served


@pytest.mark.torch
@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
def test_the_c_check_gives_every_call_the_key_the_python_comparison_gives(lane_on):
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    fast, reference = _pair()
    for _ in range(3):  # a new key, the same key again (the check made), then the C check made
        _sign_both(fast, reference, None, (a, b, 2.0))
    assert fast._fast, "the lane is loaded: the signer's layout has its C check"
    assert _sign_both(fast, reference, None, (a, b, 2.0))
    assert _sign_both(fast, reference, None, (torch.randn(3, 4), torch.randn(3, 4), 2.0))  # other tensors, same meta
    other = [
        (a, b, 3.0),  # another value
        (a, b, 2),  # another type, equal value
        (a, b, True),
        (a.double(), b, 2.0),  # another dtype
        (torch.randn(5, 4), b, 2.0),  # another shape
        (a.requires_grad_(False).clone().requires_grad_(), b, 2.0),  # requires_grad
        (torch.nn.Parameter(a.clone()), b, 2.0),  # another tensor type
        (a, b, "2.0"),
        (a, b),  # fewer arguments
        (a, b, 2.0, b),
        (a, 2.0, b),  # a tensor where a scalar was
    ]
    for args in other:
        assert not _sign_both(fast, reference, None, args), args
        for _ in range(3):  # each layout in turn: its own C check once it repeats
            _sign_both(fast, reference, None, args)
        _sign_both(fast, reference, None, (a, b, 2.0))
    with torch.no_grad():  # another mode: a probe gives another value
        assert not _sign_both(fast, reference, None, (a, b, 2.0))
    with torch.autocast("cpu", dtype=torch.bfloat16):  # modes read in Python (no C probe inside autocast)
        for _ in range(4):
            _sign_both(fast, reference, None, (a, b, 2.0))
        assert _sign_both(fast, reference, None, (a, b, 2.0))
    assert not _sign_both(fast, reference, None, (a, b, 2.0))  # out of the autocast block again


@pytest.mark.torch
@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
def test_a_function_mode_the_probes_refuse_is_signed_by_the_python_comparison(lane_on):
    from torch.overrides import TorchFunctionMode

    a, b = torch.randn(3, 4), torch.randn(3, 4)
    fast, reference = _pair()
    for _ in range(4):
        _sign_both(fast, reference, None, (a, b, 2.0))
    with TorchFunctionMode():  # modes() reads the same modes; the probes count the mode and refuse: never looser
        assert not _sign_both(fast, reference, None, (a, b, 2.0))
        assert not _sign_both(fast, reference, None, (a, b, 2.0))
    assert _sign_both(fast, reference, None, (a, b, 2.0))


class _Owner:
    def __init__(self) -> None:
        self.training = True


@pytest.mark.torch
@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
def test_bound_calls_and_an_owners_training_flag(lane_on):
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    one, two = _Owner(), _Owner()
    fast, reference = _pair()
    for _ in range(4):
        _sign_both(fast, reference, one, (a, b, 2.0))
    assert _sign_both(fast, reference, one, (a, b, 2.0))
    assert not _sign_both(fast, reference, two, (a, b, 2.0))  # another instance
    assert not _sign_both(fast, reference, None, (a, b, 2.0))  # unbound
    for _ in range(3):
        _sign_both(fast, reference, one, (a, b, 2.0))
    one.training = False
    assert not _sign_both(fast, reference, one, (a, b, 2.0))

    owner = _Owner()  # a function bound to its owner for good (a graphed Layer's forward): the flag is keyed
    fast, reference = _pair(owner)
    for _ in range(4):
        _sign_both(fast, reference, None, (a, b, 2.0))
    assert _sign_both(fast, reference, None, (a, b, 2.0))
    owner.training = False
    assert not _sign_both(fast, reference, None, (a, b, 2.0))
    del owner.training  # no flag at all: keyed as None, as getattr(owner, "training", None) gives
    assert not _sign_both(fast, reference, None, (a, b, 2.0))


@pytest.mark.torch
@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
def test_settings_read_again_send_the_signer_back_to_python_and_off_stays_off(lane_on, monkeypatch):
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    fast, reference = _pair()
    for _ in range(4):
        _sign_both(fast, reference, None, (a, b, 2.0))
    assert _sign_both(fast, reference, None, (a, b, 2.0))
    env.refresh()  # the same values read again: the check is made again under them
    assert not _sign_both(fast, reference, None, (a, b, 2.0))
    assert fast._fast and fast._fast[5] is env.settings()
    monkeypatch.setenv("GRAPHJIT_LANE", "off")
    env.refresh()
    assert not _sign_both(fast, reference, None, (a, b, 2.0))
    assert fast._fast is False  # switched off: the Python comparison signs every call of this layout
    assert not _sign_both(fast, reference, None, (a, b, 2.0))


class _Modes:
    """A backend's part of the check, for the check alone: one mode probe."""

    def __init__(self, mode: Callable[[], Any]) -> None:
        self.mode = mode

    def mode_probes(self, modes: tuple[Any, ...]) -> tuple[tuple[Callable[[], Any], ...], tuple[Any, ...]]:
        return (self.mode,), (modes,)


@pytest.mark.torch
@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
def test_a_probe_or_check_that_raises_is_a_refusal_and_an_interrupt_is_the_calls(lane_on):
    mod = lane.module()
    t = torch.zeros(2)
    raised: list[BaseException] = []

    def mode() -> Any:
        if raised:
            raise raised[0]
        return "m"

    check = lane.layout_check(mod, _Modes(mode), (torch.Tensor,), False, (None, (int, 1)), None, "m", None,
                              lambda *ts: len(ts) == 1)
    assert check(None, (t, 1)) == [t]
    assert check(None, (t, 2)) is None and check(None, (t, True)) is None and check(None, (t,)) is None
    assert check(object(), (t, 1)) is None  # an instance where the layout has none
    raised.append(ValueError("a probe that fails"))
    assert check(None, (t, 1)) is None  # the Python path reads the modes again and meets the error itself
    raised[0] = KeyboardInterrupt()
    with pytest.raises(KeyboardInterrupt):
        check(None, (t, 1))
    # no check to call, or more tensors than the lane takes: none made
    assert lane.layout_check(mod, _Modes(mode), (torch.Tensor,), False, (None,), None, "m", None, None) is None
    many = (None,) * (mod.MAX_TENSORS + 1)
    assert lane.layout_check(mod, _Modes(mode), (torch.Tensor,), False, many, None, "m", None, bool) is None
    with pytest.raises(TypeError):
        check(None)  # type: ignore[call-arg]


@pytest.mark.paddle
def test_paddle_calls_get_the_key_the_python_comparison_gives(lane_on):
    paddle = pytest.importorskip("paddle")
    a, b = paddle.randn([3, 4]), paddle.randn([3, 4])
    fast, reference = _pair()
    for _ in range(3):
        _sign_both(fast, reference, None, (a, b, 2.0))
    assert fast._fast, "the lane is loaded: the signer's layout has its C check (modes read by the backend)"
    assert _sign_both(fast, reference, None, (paddle.randn([3, 4]), paddle.randn([3, 4]), 2.0))
    trainable = paddle.randn([3, 4])
    trainable.stop_gradient = False
    for args in [(a, b, 3.0), (a.astype("float64"), b, 2.0), (paddle.randn([5, 4]), b, 2.0), (trainable, b, 2.0),
                 (a, b, 2)]:
        assert not _sign_both(fast, reference, None, args), args
        _sign_both(fast, reference, None, (a, b, 2.0))
    with paddle.no_grad():
        assert not _sign_both(fast, reference, None, (a, b, 2.0))
    for _ in range(3):
        _sign_both(fast, reference, None, (a, b, 2.0))
    assert _sign_both(fast, reference, None, (a, b, 2.0))


@pytest.mark.torch
@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
def test_the_check_is_made_from_the_layout_the_call_was_compared_with(lane_on):
    """Another thread may replace the signer's last plain call between a call's comparison and the making of its C
    check: the check is made from the layout that call compared with (its key, kinds, modes and tensor check), never
    from a mix of that one and the new one."""
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    wide = (torch.randn(5, 4), torch.randn(5, 4), 3.0)
    signer, _ = _pair()
    for _ in range(2):
        signer.sign(None, (a, b, 2.0), {})
    compared = signer._plain  # the layout of (a, b, 2.0), its check made: the next such call makes its C check
    for _ in range(2):
        signer.sign(None, wide, {})  # "another thread": the last plain call is now the wide one's
    assert signer._plain is not compared
    made = signer._layout_check(compared)
    assert made and made[3] is compared[2]  # the compared layout's key
    assert made[0](None, (a, b, 2.0)) is not None and made[0](None, wide) is None
    assert made[0](None, (torch.randn(5, 4), torch.randn(5, 4), 2.0)) is None


class _Flag:
    """A training flag whose comparison is interrupted once ``interrupt`` is set."""

    interrupt = False

    def __eq__(self, other: object) -> bool:
        if _Flag.interrupt:
            raise KeyboardInterrupt
        return isinstance(other, _Flag)

    __hash__ = object.__hash__


@pytest.mark.torch
@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
def test_an_interrupt_in_a_comparison_is_the_calls_and_an_exception_a_refusal(lane_on):
    mod = lane.module()
    t = torch.zeros(2)
    owner = _Owner()
    owner.training = _Flag()
    check = lane.layout_check(mod, _Modes(lambda: "m"), (torch.Tensor,), False, (None,), ("self", id(owner), _Flag()),
                              "m", owner, lambda *ts: True)
    assert check(None, (t,)) == [t]  # another flag object, equal to the keyed one
    _Flag.interrupt = True
    try:
        with pytest.raises(KeyboardInterrupt):
            check(None, (t,))
    finally:
        _Flag.interrupt = False
    owner.training = 1.5  # float.__eq__ with a _Flag: NotImplemented both ways, then identity: not equal
    assert check(None, (t,)) is None
