"""The replay lane's signing checks (csrc/lane_checks.c ``LayoutCheck`` and ``WalkCheck``, graphjit/sign_checks.py),
which ``keys.Signer.sign_plain`` asks first where the lane is loaded.  The Python comparison is the reference: every
call must get the key a signer without the C check gives it, and the C check must have served the calls that repeat
the last key (counted through a wrapper)."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

import pytest

from graphjit import env, lane, sign_checks
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
def test_the_c_checks_refuse_a_call_once_the_frameworks_backend_is_replaced(lane_on):
    """The layout and walk checks hold the backend they were made with: once graphjit.backends caches another one
    for the tensor type (the graph emulator's way), a call is signed by the Python path with the new backend."""
    from graphjit import backends

    a, b = torch.randn(3, 4), torch.randn(3, 4)
    fast, _reference = _pair()
    walked = Signer(_f, None, "auto", "f")
    for _ in range(4):
        fast.sign(None, (a, b, 2.0), {})
        walked.sign(None, (a,), {"b": b, "scale": 2.0})
    assert fast._fast and walked._walked, "both checks made"
    old = backends.type_cache[torch.Tensor]
    assert fast.sign(None, (a, b, 2.0), {}).backend is old
    replacement = type(old)()
    backends.type_cache[torch.Tensor] = replacement
    try:
        assert fast._fast[0](None, (a, b, 2.0)) is None  # the C check itself refuses
        assert walked._walked[0][0](None, (a,), {"b": b, "scale": 2.0}) is None
        assert fast.sign(None, (a, b, 2.0), {}).backend is replacement
        assert walked.sign(None, (a,), {"b": b, "scale": 2.0}).backend is replacement
    finally:
        backends.type_cache[torch.Tensor] = old
    assert fast.sign(None, (a, b, 2.0), {}).backend is old


@pytest.mark.torch
@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
def test_a_float_zero_is_keyed_by_its_sign_by_the_c_check_and_the_python_comparison(lane_on):
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    fast, reference = _pair()
    for zero, other in ((0.0, -0.0), (-0.0, 0.0)):  # 0.0 == -0.0, but 1 / x tells them apart: two keys
        for _ in range(3):
            _sign_both(fast, reference, None, (a, b, zero))
        assert _sign_both(fast, reference, None, (a, b, zero))  # the C check serves the same zero
        assert not _sign_both(fast, reference, None, (a, b, other))  # and refuses the other sign
        assert reference.sign(None, (a, b, zero), {}).key != reference.sign(None, (a, b, other), {}).key
    fast, reference = _walk_pair()  # a walked call (keyword arguments, an object's attribute): its spec's value
    for zero, other in ((0.0, -0.0), (-0.0, 0.0)):
        kwargs = {"cache": _Cache(3), "extra": {1: (torch.zeros(1), zero)}, "slotted": _Slotted(), "flag": zero}
        args = (torch.randn(2, 4),)
        for _ in range(2):
            _walk_both(fast, reference, args, kwargs)
        assert _walk_both(fast, reference, args, kwargs)
        for where in ("extra", "flag"):
            changed = dict(kwargs, **{where: {1: (torch.zeros(1), other)} if where == "extra" else other})
            assert not _walk_both(fast, reference, args, changed), where
            assert reference.sign(None, args, changed).key != reference.sign(None, args, kwargs).key


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
    made = sign_checks.layout_check(signer, compared)
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


# -- walked calls (keyword arguments, containers, objects holding tensors): lane.walk_check ------------------------


class _Layer:
    """A cache layer as transformers keeps one: tensors and sizes in its __dict__."""

    def __init__(self, n: int) -> None:
        self.keys, self.values = torch.zeros(2, n), torch.zeros(2, n)
        self.max_len, self.ready, self.device = n, True, torch.device("cpu")


class _Cache:
    def __init__(self, layers: int) -> None:
        self.layers = [_Layer(4) for _ in range(layers)]
        self.offloading = False


class _Slotted:
    __slots__ = ("maybe", "scale", "t")

    def __init__(self) -> None:
        self.t, self.scale = torch.zeros(3), 1.0


def _g(x: Any, cache: Any = None, extra: Any = None, **kw: Any) -> Any:
    return x


def _walk_pair() -> tuple[Signer, Signer]:
    fast = Signer(_g, None, "auto", "g")
    reference = Signer(_g, None, "auto", "g")
    reference.layout_checks = False
    return fast, reference


def _walk_both(fast: Signer, reference: Signer, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Sign one walked call with both: the same key and the call's own tensors in the same order.  True where the C
    check served it."""
    counted = [c[0] for c in fast._walked if isinstance(c[0], _Walked)]
    served = sum(c.served for c in counted)
    got, want = fast.sign(None, args, kwargs), reference.sign(None, args, kwargs)
    assert got.key == want.key and hash(got.key) == hash(want.key), (got.key, want.key)  # found by both
    assert [id(t) for t in got.tensors] == [id(t) for t in want.tensors]
    assert got.paths == want.paths
    fast._walked = tuple(c if isinstance(c[0], _Walked) else (_Walked(c[0]), *c[1:]) for c in fast._walked)
    return sum(c.served for c in counted) > served


class _Walked(_Counted):
    def __call__(self, instance: Any, args: tuple[Any, ...], kwargs: Any = None) -> Any:  # type: ignore[override]
        self.asked += 1
        tensors = self.check(instance, args, kwargs)
        self.served += tensors is not None
        return tensors


def _mutations() -> list[tuple[str, Callable[[Any, dict[str, Any]], None]]]:
    def deep_dtype(x: Any, kw: dict[str, Any]) -> None:
        kw["cache"].layers[1].keys = kw["cache"].layers[1].keys.double()

    def deep_shape(x: Any, kw: dict[str, Any]) -> None:
        kw["cache"].layers[0].values = torch.zeros(2, 5)

    def size(x: Any, kw: dict[str, Any]) -> None:
        kw["cache"].layers[0].max_len = 5

    def int_to_float(x: Any, kw: dict[str, Any]) -> None:
        kw["cache"].layers[0].max_len = 4.0

    def new_attribute(x: Any, kw: dict[str, Any]) -> None:
        kw["cache"].layers[0].added = 1

    def deleted_attribute(x: Any, kw: dict[str, Any]) -> None:
        del kw["cache"].layers[0].ready

    def reordered(x: Any, kw: dict[str, Any]) -> None:
        layer = kw["cache"].layers[0]
        ready = layer.ready
        del layer.ready
        layer.ready = ready  # the same attributes, another order: another key

    def fewer_layers(x: Any, kw: dict[str, Any]) -> None:
        kw["cache"].layers.pop()

    def tuple_for_list(x: Any, kw: dict[str, Any]) -> None:
        kw["cache"].layers = tuple(kw["cache"].layers)

    def device_value(x: Any, kw: dict[str, Any]) -> None:
        kw["cache"].layers[1].device = torch.device("meta")

    def dict_key_type(x: Any, kw: dict[str, Any]) -> None:
        kw["extra"] = {True: kw["extra"][1]}

    def slot_unset(x: Any, kw: dict[str, Any]) -> None:
        del kw["slotted"].scale

    def slot_set(x: Any, kw: dict[str, Any]) -> None:
        kw["slotted"].maybe = 3

    def another_kwarg(x: Any, kw: dict[str, Any]) -> None:
        kw["more"] = 1

    def cycle(x: Any, kw: dict[str, Any]) -> None:
        kw["cache"].layers[0].parent = kw["cache"]

    def unhashable(x: Any, kw: dict[str, Any]) -> None:
        kw["cache"].layers[0].notes = ["a list", {}]

    def a_set(x: Any, kw: dict[str, Any]) -> None:
        kw["cache"].layers[0].tags = {1, 2}

    def requires_grad(x: Any, kw: dict[str, Any]) -> None:
        kw["cache"].layers[0].keys.requires_grad_()

    return [(f.__name__, f) for f in (deep_dtype, deep_shape, size, int_to_float, new_attribute, deleted_attribute,
                                       reordered, fewer_layers, tuple_for_list, device_value, dict_key_type, slot_unset,
                                       slot_set, another_kwarg, cycle, unhashable, a_set, requires_grad)]


def _call() -> tuple[tuple[Any, ...], dict[str, Any]]:
    return (torch.randn(2, 4),), {"cache": _Cache(3), "extra": {1: (torch.zeros(1), 2.0)}, "slotted": _Slotted(),
                                  "flag": None}


@pytest.mark.torch
@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
@pytest.mark.parametrize("name", [n for n, _ in _mutations()])
def test_a_walked_call_gets_the_key_the_walk_gives_after_any_change(lane_on, name):
    mutate = dict(_mutations())[name]
    fast, reference = _walk_pair()
    args, kwargs = _call()
    for _ in range(2):  # the key, then the same key again: its C check made and checked on this call
        _walk_both(fast, reference, args, kwargs)
    assert fast._walked, "the lane is loaded: the walked call's structure has its C check"
    assert _walk_both(fast, reference, args, kwargs)
    assert _walk_both(fast, reference, (torch.randn(2, 4),), kwargs)  # other tensors, the same structure
    mutate(args, kwargs)
    assert not _walk_both(fast, reference, args, kwargs), name  # refused: the walk signs it
    for _ in range(3):  # and again, as the walk does
        _walk_both(fast, reference, args, kwargs)


@pytest.mark.torch
@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
def test_structures_the_spec_does_not_describe_are_always_walked(lane_on):
    """A deque, a set and a slice are walked every call; an OrderedDict and nested lists get the C check."""
    import collections

    for extra in (collections.OrderedDict(a=torch.zeros(1)), collections.deque([torch.zeros(1)]), {1, 2},
                  slice(0, 2), [torch.zeros(1), [1, [2, [3]]]] * 1):
        fast, reference = _walk_pair()
        for _ in range(4):
            _walk_both(fast, reference, (torch.zeros(2),), {"extra": extra})
        described = not isinstance(extra, (collections.deque, set, slice))
        assert bool(fast._walked) == described, type(extra)


@pytest.mark.torch
@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
def test_a_walked_call_under_other_modes_or_owner_flag_is_walked(lane_on):
    fast, reference = _walk_pair()
    args, kwargs = _call()
    for _ in range(3):
        _walk_both(fast, reference, args, kwargs)
    with torch.no_grad():
        assert not _walk_both(fast, reference, args, kwargs)
    for _ in range(3):
        _walk_both(fast, reference, args, kwargs)
    assert _walk_both(fast, reference, args, kwargs)
    kwargs["cache"].layers[2].keys = torch.zeros(2, 4)  # another tensor object, the same metadata: the same key
    assert _walk_both(fast, reference, args, kwargs)


@pytest.mark.torch
@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
def test_hf_decode_steps_are_signed_by_the_walk_check(lane_on):
    """transformers' generate() with a static cache (tiny Llama, emulated graphs): after the first decode steps,
    every decode step's call (keyword arguments, the cache object and its layers) is signed by the C check, and the
    tokens are eager generate()'s."""
    transformers = pytest.importorskip("transformers")
    from graph_emulator import emulated_torch

    import graphjit

    config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                      max_position_embeddings=128, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    prompt = torch.randint(3, 128, (1, 5), generator=torch.Generator().manual_seed(1))
    generate = {"max_new_tokens": 12, "do_sample": False, "cache_implementation": "static", "disable_compile": True,
                "pad_token_id": 0}
    with torch.no_grad():
        want = model.generate(prompt, **generate)
    with emulated_torch():
        model.forward = graphjit.graphed(model.forward)
        signer = model.forward._self_state.signer
        walks = []
        walk = signer._sign

        def counted(*a: Any) -> Any:
            walks.append(1)
            return walk(*a)

        signer._sign = counted  # type: ignore[method-assign]
        with torch.no_grad():
            got = model.generate(prompt, **generate)
            # the prefill, the first decode step and its repeat (the check made there, and checked by one more walk)
            # are walked; the others are not
            assert torch.equal(got, want) and len(walks) <= 5, len(walks)
            walks.clear()
            got = model.generate(prompt, **generate)  # the decode key's check kept across the prefill
    assert torch.equal(got, want)
    assert model.forward.stats()["calls"] >= 24 and len(walks) <= 1, len(walks)


class _PaddleLayer:
    def __init__(self, paddle: Any) -> None:
        self.keys, self.size = paddle.zeros([2, 4]), 4


@pytest.mark.paddle
def test_paddle_walked_calls_get_the_key_the_walk_gives(lane_on):
    paddle = pytest.importorskip("paddle")
    fast, reference = _walk_pair()
    layers = [_PaddleLayer(paddle), _PaddleLayer(paddle)]
    args, kwargs = (paddle.randn([2, 4]),), {"cache": layers, "extra": {"n": 3}}
    for _ in range(2):
        _walk_both(fast, reference, args, kwargs)
    assert fast._walked, "the lane is loaded: the walked call's structure has its C check"
    assert _walk_both(fast, reference, (paddle.randn([2, 4]),), kwargs)
    layers[1].size = 5
    assert not _walk_both(fast, reference, args, kwargs)
    layers[1].size = 4
    layers[0].keys = paddle.zeros([2, 4], dtype="float64")
    assert not _walk_both(fast, reference, args, kwargs)
    with paddle.no_grad():
        assert not _walk_both(fast, reference, args, kwargs)


class _Config:
    """A value type (its own __eq__ and __hash__, as an attrs class with hash=True has): walked like any object, its
    attributes the key, so one changed in place is another key."""

    def __init__(self, scale: float) -> None:
        self.scale = scale

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Config) and other.scale == self.scale

    def __hash__(self) -> int:
        return hash(self.scale)


class _Loose:
    """Equal to any other, hashed by identity."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Loose)

    __hash__ = object.__hash__


@pytest.mark.torch
@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
def test_a_value_or_dict_key_that_hashes_otherwise_is_walked(lane_on):
    config, loose = _Config(2.0), _Loose()
    for mutate in ("config", "loose", "dict key"):
        fast, reference = _walk_pair()
        kwargs: dict[str, Any] = {"cache": _Cache(1), "extra": {"c": config, "l": loose, loose: 1}}
        args = (torch.zeros(2, 4),)
        for _ in range(3):
            _walk_both(fast, reference, args, kwargs)
        assert _walk_both(fast, reference, args, kwargs)
        if mutate == "config":
            kwargs["extra"] = {"c": _Config(2.0), "l": loose, loose: 1}  # another object, equal attributes: served
            assert _walk_both(fast, reference, args, kwargs)
            kwargs["extra"]["c"].scale = 3.0  # changed in place: another key
        elif mutate == "loose":
            kwargs["extra"]["l"] = _Loose()  # as a value: an object of the same class and attributes, served
            assert _walk_both(fast, reference, args, kwargs)
            kwargs["extra"]["l"].scale = 1.0  # another attribute: another key
        else:
            kwargs["extra"] = {"c": config, "l": loose, _Loose(): 1}  # an equal dict key that hashes otherwise
        assert not _walk_both(fast, reference, args, kwargs), mutate
        config.scale = 2.0


@pytest.mark.torch
@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
def test_an_error_while_making_the_walk_check_leaves_the_call_signed(lane_on, monkeypatch):
    from graphjit import walk_spec

    def broken(*a: Any) -> Any:
        raise RuntimeError("a read that fails once")

    monkeypatch.setattr(walk_spec, "spec_of_call", broken)
    fast, reference = _walk_pair()
    args, kwargs = _call()
    for _ in range(3):
        _walk_both(fast, reference, args, kwargs)  # no error escapes: the walk signed each call
    assert not fast._walked and fast._walk_tried is fast._walk_key  # tried once for this key, not again


@pytest.mark.torch
@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
def test_an_ordered_dict_is_matched_in_its_own_order(lane_on):
    """An OrderedDict's items in the order its items() gives them (move_to_end changes that order, not the order of
    the dict underneath): another order is another key, as the walk says."""
    import collections

    fast, reference = _walk_pair()
    extra = collections.OrderedDict(a=torch.zeros(1), b=2, c=torch.ones(2))
    args = (torch.zeros(2),)
    for _ in range(3):
        _walk_both(fast, reference, args, {"extra": extra})
    assert _walk_both(fast, reference, args, {"extra": extra})
    extra.move_to_end("a")
    assert not _walk_both(fast, reference, args, {"extra": extra})
    extra.move_to_end("b")
    extra.move_to_end("c")  # back to a, b, c: the first key again, its check made again once it repeats
    for _ in range(2):
        _walk_both(fast, reference, args, {"extra": extra})
    assert _walk_both(fast, reference, args, {"extra": extra})


@pytest.mark.torch
@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
def test_a_keyword_call_replayed_twice_in_a_row_loads_the_lane_for_its_signing(monkeypatch):
    """The lane is loaded where a key first replays twice in a row, keyword calls included (they never take a plan:
    the lane's walk check signs them)."""
    if lane.missing_tools() is not None:
        pytest.skip("the replay lane cannot be built here")
    from graph_emulator import emulated_torch

    import graphjit

    monkeypatch.setattr(lane, "_module", None)  # a process where no key replayed yet,
    monkeypatch.setattr(lane, "loaded_if_built", lambda: None)  # on a machine where it was not built ahead of time
    monkeypatch.setenv("GRAPHJIT_LANE", "on")
    env.refresh()

    def step(x: Any, **kw: Any) -> Any:  # as transformers' forward takes its cache: a keyword argument stays one
        return x * 2 + kw["cache"].layers[0].keys.sum()

    try:
        with emulated_torch():
            g = graphjit.graphed(step)
            x, cache = torch.randn(2, 4), _Cache(2)
            for _ in range(4):
                g(x=x, cache=cache)
            assert lane.module() is None or g.stats()["replays"] >= 2
            for _ in range(4):
                g(x=x, cache=cache)
            assert lane.module() is not None
            assert g._self_state.signer._walked
            assert torch.equal(g(x=x, cache=cache), step(x, cache=cache))
    finally:
        monkeypatch.delenv("GRAPHJIT_LANE")
        env.refresh()


# -- counters: keys that differ only in ints every call advances (Gemma's sliding-window length) ------------------


class _Counting:
    """A cache layer whose Python int counter the caller advances every call, beside a tensor."""

    def __init__(self) -> None:
        self.keys, self.count, self.limit = torch.zeros(2, 4), 8, 16


@pytest.mark.torch
@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
def test_keys_that_differ_only_in_a_counter_are_made_by_the_check(lane_on):
    """The ints in which two walked keys differ, and nothing else, are free in the check: it takes any int there and
    the key is made with the call's values, equal (and hashing alike) to the walk's for every value; any other change
    (the counter's type, another value, a shape) is walked."""
    fast, reference = _walk_pair()
    layers = [_Counting(), _Counting()]
    extra = {"n": 3, "steps": [1, 2]}
    args = (torch.zeros(2),)

    def call() -> bool:
        return _walk_both(fast, reference, args, {"cache": layers, "extra": extra})

    call()
    for layer in layers:
        layer.count += 1
    call()  # differs from the last key in the two counters only: the check made with them free
    assert fast._walked and fast._walked[0][6] is not None
    served = 0
    for step in range(12):
        for layer in layers:
            layer.count += step % 3  # by any amount, together or not at all
        served += call()
    assert served == 12, served
    extra["steps"][0] = 7  # another int, which the free paths do not hold: walked
    assert not call()
    for layer in layers:
        layer.count += 1  # now two keys back: its ints and the list's differ from the last walked key
    for _ in range(3):
        call()  # whichever check serves, each key equals the walk's (checked in call)
    layers[0].count = True  # a bool where the int was: refused, walked
    assert not call()
    layers[0].count = 5
    layers[1].limit = 17  # another int, which the free paths do not hold: walked (and a check made for it later)
    assert not call()
    layers[1].keys = torch.zeros(3, 4)  # a shape: walked
    assert not call()


@pytest.mark.torch
@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
def test_counters_are_only_plain_ints_that_differ_alone():
    from graphjit.walk_spec import counters, key_maker

    base = (2, ("cache", (list, ((object, ("count", int, 8), ("t", (torch.Size([2, 4]), torch.float32))),))))
    moved = (2, ("cache", (list, ((object, ("count", int, 9), ("t", (torch.Size([2, 4]), torch.float32))),))))
    paths = counters(base, moved)
    assert paths == frozenset({(1, 1, 1, 0, 1, 2)})
    assert key_maker(base, sorted(paths))([9]) == moved
    shaped = (2, ("cache", (list, ((object, ("count", int, 8), ("t", (torch.Size([3, 4]), torch.float32))),))))
    assert counters(base, shaped) is None  # an int inside a shape
    flag = (2, ("cache", (list, ((object, ("count", bool, True), ("t", (torch.Size([2, 4]), torch.float32))),))))
    assert counters(base, flag) is None  # another type
    assert counters(base, base) is None  # nothing differs
    assert counters((1, (int, 1)), (1, (int, 2))) == frozenset({(1, 1)})  # a positional int
    assert counters((1, (float, 1.0)), (1, (float, 2.0))) is None  # only ints


@pytest.mark.torch
@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
def test_gemma_decode_steps_are_signed_by_the_check_with_their_counters(lane_on):
    """Gemma 2's sliding-window layers count their length in a Python int every decode step advances, so each step
    is another key: the check takes the counter's value and makes the key with it.  Tokens equal eager generate()'s
    and the graphs, replays and fallbacks are those of every call walked."""
    transformers = pytest.importorskip("transformers")
    from graph_emulator import emulated_torch

    import graphjit
    from graphjit.bench.torch import hf_families

    prompt = torch.randint(3, 64, (1, 8), generator=torch.Generator().manual_seed(1))
    greedy = {"max_new_tokens": 24, "do_sample": False, "pad_token_id": 0}
    results = []
    for checks in (False, True):
        model = hf_families.build(torch, transformers, "gemma2", layers=2, hidden=64, device="cpu")
        with torch.no_grad():
            want = model.generate(prompt, cache_implementation="static", disable_compile=True, **greedy)
        Signer.layout_checks = checks
        try:
            with emulated_torch():
                graphjit.graph_generation(model)
                signer = model.forward._self_state.signer
                walks: list[int] = []
                walk = signer._sign

                def counted(*a: Any, walk: Any = walk, walks: list[int] = walks) -> Any:
                    walks.append(1)
                    return walk(*a)

                signer._sign = counted  # type: ignore[method-assign]
                with torch.no_grad():
                    for _ in range(3):
                        assert torch.equal(model.generate(prompt, **greedy), want)
                    del walks[:]
                    assert torch.equal(model.generate(prompt, **greedy), want)
                stats = model.forward.stats()
        finally:
            Signer.layout_checks = True
        results.append((len(walks), {k: stats[k] for k in ("calls", "replays", "graphs", "fallbacks")}))
    (walked_all, stats_walked), (walked_checked, stats_checked) = results
    assert stats_checked == stats_walked
    assert walked_all >= 20 and walked_checked <= 2, results


@pytest.mark.torch
@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
def test_the_counters_check_is_made_again_for_another_structure_and_after_settings_are_read(lane_on):
    """The counters' paths are places in the key, the same for another cache of the same layout: a new cache of
    another shape, or settings read again, get a check of their own again once their counters move."""
    fast, reference = _walk_pair()
    args = (torch.zeros(2),)

    def run(layers: list[_Counting], steps: int) -> int:
        served = 0
        for _ in range(steps):
            for layer in layers:
                layer.count += 1
            served += _walk_both(fast, reference, args, {"cache": layers})
        return served

    assert run([_Counting(), _Counting()], 8) >= 6
    wider = [_Counting(), _Counting()]
    for layer in wider:
        layer.keys = torch.zeros(2, 8)  # another shape, the same counters' paths
    assert run(wider, 8) >= 6
    env.refresh()
    assert run(wider, 8) >= 6
