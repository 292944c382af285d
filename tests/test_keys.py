"""Graph keys: what makes two calls share a graph (graphjit.keys.Signer), on real CPU tensors."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

import graphjit
from graphjit.keys import Signer, rebuild_call

HAS_PADDLE = importlib.util.find_spec("paddle") is not None
HAS_TORCH = importlib.util.find_spec("torch") is not None
if HAS_PADDLE:
    import paddle
if HAS_TORCH:
    import torch


def fn(x, y=None, scale=1.0, opts=None):
    return x


def signer(f=fn, buckets=None) -> Signer:
    return Signer(f, buckets, "auto", getattr(f, "__name__", "f"))


def key(*args, **kwargs):
    return signer().sign(None, args, kwargs).key


# -- paddle -------------------------------------------------------------------------------


@pytest.mark.paddle
def test_paddle_same_shape_and_dtype_is_the_same_key():
    a = paddle.ones([2, 3])
    b = paddle.zeros([2, 3])  # other contents, other tensor object, other address
    assert a.data_ptr() != b.data_ptr()
    assert key(a) == key(b)
    assert hash(key(a)) == hash(key(b))


@pytest.mark.paddle
def test_paddle_place_in_the_key_is_compared_by_value():
    """Paddle 3.x Places hash by value (the key holds the Place); 2.6's by identity (the key holds its name)."""
    from graphjit.backends.paddle import graphs as paddle_backend

    b = paddle_backend.PaddleBackend()
    t = paddle.ones([2])
    place = b.meta_key(t)[2]
    if paddle_backend._places_hash_by_value():
        assert place == t.place and place is not t.place
    else:
        assert place == str(t.place)
    assert b.meta_key(t) == b.meta_key(paddle.zeros([2])) and hash(b.meta_key(t)) == hash(b.meta_key(t))


@pytest.mark.paddle
def test_paddle_new_shape_dtype_or_stop_gradient_is_a_new_key():
    base = paddle.ones([2, 3], dtype="float32")
    assert key(base) != key(paddle.ones([3, 2], dtype="float32"))
    assert key(base) != key(paddle.ones([2, 3, 1], dtype="float32"))
    assert key(base) != key(paddle.ones([2, 3], dtype="float16"))
    assert key(base) != key(paddle.ones([2, 3], dtype="int64"))
    trainable = paddle.ones([2, 3], dtype="float32")
    trainable.stop_gradient = False
    assert key(base) != key(trainable)


@pytest.mark.paddle
def test_paddle_signature_collects_tensors_in_order_with_paths():
    a, b = paddle.ones([1]), paddle.ones([2])
    sig = signer().sign(None, (a,), {"opts": {"k": [b, 3]}})
    assert [t is a for t in sig.tensors] == [True, False]
    assert sig.tensors[1] is b
    assert sig.paths == ["argument 'x'", "argument 'opts'['k'][0]"]
    assert sig.backend is not None and sig.backend.name == "paddle"
    assert sig.pads == () and sig.overflow is None


# -- torch --------------------------------------------------------------------------------


@pytest.mark.torch
def test_torch_same_shape_and_dtype_is_the_same_key():
    a, b = torch.ones(2, 3), torch.randn(2, 3)
    assert key(a) == key(b)


@pytest.mark.torch
def test_torch_new_shape_dtype_or_requires_grad_is_a_new_key():
    base = torch.ones(2, 3)
    assert key(base) != key(torch.ones(3, 2))
    assert key(base) != key(torch.ones(2, 3, dtype=torch.float64))
    assert key(base) != key(torch.ones(2, 3, dtype=torch.int32))
    assert key(base) != key(torch.ones(2, 3, requires_grad=True))


@pytest.mark.torch
def test_non_tensor_values_are_part_of_the_key():
    x = torch.ones(2)
    assert key(x, None, 2.0) == key(x, None, 2.0)
    assert key(x, None, 2.0) != key(x, None, 3.0)
    assert key(x, opts="a") != key(x, opts="b")
    assert key(x, opts=None) != key(x, opts="None")
    assert key(x, opts=(1, 2)) == key(x, opts=(1, 2))
    assert key(x, opts=(1, 2)) != key(x, opts=(2, 1))


@pytest.mark.torch
@pytest.mark.parametrize(("a", "b"), [(True, 1), (1, 1.0), (True, 1.0), (False, 0), (0, 0.0)])
def test_bool_int_and_float_values_are_different_keys(a, b):
    x = torch.ones(2)
    assert a == b and hash(a) == hash(b)  # Python considers them equal; a graph that froze one must not serve the other
    assert key(x, scale=a) != key(x, scale=b)
    assert key(x, None, a) != key(x, None, b)
    assert key(x, opts=[a]) != key(x, opts=[b])
    assert key(x, opts={"k": a}) != key(x, opts={"k": b})


@pytest.mark.torch
def test_bool_and_int_dict_keys_are_different_keys():
    x = torch.ones(2)
    assert key(x, opts={True: "v"}) != key(x, opts={1: "v"})


@pytest.mark.torch
def test_kwargs_order_does_not_matter():
    x, y = torch.ones(2), torch.ones(3)
    assert key(x, y=y, scale=2.0) == key(x, scale=2.0, y=y)
    sig1 = signer().sign(None, (), {"x": x, "y": y})
    sig2 = signer().sign(None, (), {"y": y, "x": x})
    assert sig1.key == sig2.key
    assert [id(t) for t in sig1.tensors] == [id(t) for t in sig2.tensors]  # same leaf order, so same buffers


@pytest.mark.torch
def test_positional_and_keyword_passing_are_distinguished_consistently():
    x, y = torch.ones(2), torch.ones(3)
    assert key(x, y) == key(x, y)
    assert key(x, y=y) == key(x, y=y)
    assert key(x, y) != key(x)


@pytest.mark.torch
def test_nested_tuples_lists_and_dicts_of_tensors():
    a, b, c = torch.ones(2), torch.ones(3), torch.ones(4)
    nested = ((a, [b]), {"k": c, "n": 3})
    same = ((torch.zeros(2), [torch.zeros(3)]), {"k": torch.zeros(4), "n": 3})
    assert key(a, opts=nested) == key(a, opts=same)
    sig = signer().sign(None, (a,), {"opts": nested})
    assert len(sig.tensors) == 4
    assert sig.paths[1:] == ["argument 'opts'[0][0]", "argument 'opts'[0][1][0]", "argument 'opts'[1]['k']"]
    # a change anywhere inside the tree is a new key
    assert key(a, opts=nested) != key(a, opts=((a, [torch.ones(5)]), {"k": c, "n": 3}))
    assert key(a, opts=nested) != key(a, opts=((a, [b]), {"k": c, "n": 4}))
    assert key(a, opts=nested) != key(a, opts=((a, [b, b]), {"k": c, "n": 3}))
    # the container type is part of the structure
    assert key(a, opts=[b, c]) != key(a, opts=(b, c))
    assert key(a, opts={"k": b}) != key(a, opts={"j": b})


@pytest.mark.torch
def test_rebuild_call_puts_tensors_back_where_sign_found_them():
    a, b, c = torch.ones(1), torch.ones(2), torch.ones(3)
    args, kwargs = (a, [b, 1]), {"z": {"k": c}, "y": 5}
    sig = signer(lambda *args, **kw: None).sign(None, args, kwargs)
    new = [torch.full_like(t, 7.0) for t in sig.tensors]
    args2, kwargs2 = rebuild_call(args, kwargs, new, lambda t: isinstance(t, torch.Tensor))
    assert list(kwargs2) == ["z", "y"]  # the caller's keyword order is kept
    assert args2[0] is new[0] and args2[1][0] is new[1] and args2[1][1] == 1
    assert kwargs2["z"]["k"] is new[2] and kwargs2["y"] == 5


@pytest.mark.torch
def test_method_calls_key_on_the_instance():
    class Box:
        def step(self, x):
            return x

    s = Signer(Box.step, None, "auto", "Box.step")
    b1, b2 = Box(), Box()
    x = torch.ones(2)
    assert s.sign(b1, (x,), {}).key == s.sign(b1, (torch.zeros(2),), {}).key
    assert s.sign(b1, (x,), {}).key != s.sign(b2, (x,), {}).key


# -- refusals -------------------------------------------------------------------------------


@pytest.mark.torch
@pytest.mark.parametrize("bad", [bytearray(b"ab"), [1, bytearray(b"c")]])
def test_unhashable_non_tensor_argument_names_the_argument(bad):
    with pytest.raises(graphjit.SignatureError, match=r"argument 'opts'.*neither a tensor nor hashable"):
        key(torch.ones(2), opts=bad)


@pytest.mark.torch
def test_unhashable_positional_argument_is_named_by_parameter():
    with pytest.raises(graphjit.SignatureError, match=r"fn: argument 'scale' is a builtins.bytearray"):
        key(torch.ones(2), None, bytearray(b"a"))


@pytest.mark.paddle
@pytest.mark.torch
def test_tensors_of_both_frameworks_in_one_call_are_refused():
    with pytest.raises(graphjit.SignatureError,
                       match=r"argument 'x' is a paddle tensor but argument 'y' is a torch tensor"):
        key(paddle.ones([2]), torch.ones(2))
    with pytest.raises(graphjit.SignatureError,
                       match=r"argument 'x' is a torch tensor but argument 'opts'\[1\] is a paddle tensor"):
        key(torch.ones(2), opts=[torch.ones(1), paddle.ones([1])])


# -- the plain-call fast path ----------------------------------------------------------------


def _fw_tensors(name):
    if name == "torch":
        return (lambda *s, dtype=None: torch.zeros(*s, dtype=dtype or torch.float32)), torch.float16, torch.no_grad
    return (lambda *s, dtype=None: paddle.zeros(list(s), dtype=dtype or "float32")), "float16", paddle.no_grad


FRAMEWORKS = [pytest.param("torch", marks=pytest.mark.torch), pytest.param("paddle", marks=pytest.mark.paddle)]


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_a_plain_call_signed_without_the_walk_has_the_walks_key(name):
    """One signer signs a run of calls: each key, label list and tensor list equals a fresh signer's (which walks),
    calls of the same structure skip the walk, and any other call (a container, a keyword, another structure)
    walks again."""
    zeros, half, no_grad = _fw_tensors(name)

    def f(a, b=None, c=1.0, d=None):
        return a

    calls = [
        ((zeros(2, 3), zeros(4)), {}),
        ((zeros(2, 3), zeros(4)), {}),  # same structure: the fast path, the same key object
        ((zeros(2, 5), zeros(4)), {}),  # another shape
        ((zeros(2, 5, dtype=half), zeros(4)), {}),  # another dtype
        ((zeros(2, 5), zeros(4), 2.0), {}),  # a float
        ((zeros(2, 5), zeros(4), 2), {}),  # an int where a float was: another key
        ((zeros(2, 5), zeros(4), True), {}),  # a bool
        ((zeros(2, 5), None, 2.0), {}),  # None where a tensor was
        ((zeros(2, 5), [zeros(1)]), {}),  # a container: walked
        ((zeros(2, 5), zeros(4)), {"d": 3}),  # a keyword: walked
        ((zeros(2, 3), zeros(4)), {}),  # back to the first
    ]
    shared = Signer(f, None, "auto", "f")
    walks = []
    real = shared._sign

    def counting(*a, **k):
        walks.append(1)
        return real(*a, **k)

    shared._sign = counting
    keys = []
    for args, kwargs in calls:
        got = shared.sign(None, args, kwargs)
        want = Signer(f, None, "auto", "f").sign(None, args, kwargs)
        assert got.key == want.key and hash(got.key) == hash(want.key), (args, kwargs)
        assert got.labels == want.labels and all(a is b for a, b in zip(got.tensors, want.tensors))
        keys.append(got.key)
    assert keys[1] is keys[0] and keys[10] == keys[0] and len(set(keys[:10])) == 9
    assert len(walks) == 3  # the first call, the container and the keyword
    with no_grad():  # a mode is part of the key on the fast path too
        assert shared.sign(None, calls[0][0], {}).key != keys[0]


@pytest.mark.torch
def test_a_plain_call_keeps_requires_grad_and_the_bound_objects_mode_in_its_key():
    class M(torch.nn.Module):
        def forward(self, x):
            return x

    m = M()
    s = Signer(M.forward, None, "auto", "forward")
    x = torch.zeros(2)
    first = s.sign(m, (x,), {}).key
    assert s.sign(m, (x,), {}).key is first
    assert s.sign(m, (x.requires_grad_(),), {}).key != first
    x.requires_grad_(False)
    m.eval()
    assert s.sign(m, (x,), {}).key != first
    assert s.sign(None, (m, x), {}).key != first  # unbound: another structure, walked


@pytest.mark.torch
def test_a_repeated_plain_call_is_checked_in_one_call_and_any_change_of_its_key_is_still_seen(monkeypatch):
    """torch: a plain call with the last one's layout is checked by Dynamo's TensorGuards (no tensor's metadata read
    in Python); the check is never looser than the key: other shapes, ranks, dtypes, requires_grad, subclasses,
    modes or layouts give the walk's key."""
    from graphjit import backends

    backend = backends.get("torch")
    reads = []
    real = type(backend).meta_key
    monkeypatch.setattr(type(backend), "meta_key", lambda self, t: reads.append(1) or real(self, t))

    def f(a, b, c=1.0):
        return a

    s = Signer(f, None, "auto", "f")
    x, y = torch.zeros(4, 6), torch.zeros(6)
    first = s.sign(None, (x, y), {}).key
    s.sign(None, (x, y), {})  # makes the check
    del reads[:]
    for _ in range(3):
        assert s.sign(None, (torch.ones(4, 6), y), {}).key is first
    assert reads == []  # checked in one call
    changed = [(torch.zeros(6, 4).t(), y), (torch.zeros(4, 8)[:, :6], y), (torch.zeros(4, 6, 1), y),
               (torch.zeros(4, 6, dtype=torch.float16), y),
               (torch.zeros(4, 6, requires_grad=True), y),
               (torch.nn.Parameter(torch.zeros(4, 6), requires_grad=False), y),
               (x, torch.zeros(7)), (x, y, 2.0), (x, 3)]
    for args in changed:
        s.sign(None, (x, y), {})
        s.sign(None, (x, y), {})
        got = s.sign(None, args, {}).key
        want = Signer(f, None, "auto", "f").sign(None, args, {}).key
        assert got == want, args
        assert (got == first) is (type(args[0]) is torch.nn.Parameter), args  # a Parameter's key is a tensor's
    s.sign(None, (x, y), {})
    with torch.no_grad():
        assert s.sign(None, (x, y), {}).key != first


@pytest.mark.torch
def test_keys_in_turn_build_no_check_and_a_refused_check_is_made_again(monkeypatch):
    """The one-call check is made when a key repeats: keys called in turn (two batch sizes) never pay for one; a
    check the same key's tensors refuse (a Parameter first, plain tensors after) is made again for them."""
    from graphjit import backends

    backend = backends.get("torch")
    made = []
    real = type(backend).meta_check
    monkeypatch.setattr(type(backend), "meta_check", lambda self, ts: made.append(len(ts)) or real(self, ts))

    def f(a):
        return a

    s = Signer(f, None, "auto", "f")
    a, b = torch.zeros(2, 3), torch.zeros(4, 3)
    for _ in range(4):
        s.sign(None, (a,), {})
        s.sign(None, (b,), {})
    assert made == []
    s.sign(None, (a,), {})
    s.sign(None, (a,), {})
    assert made == [1]  # a repeat
    s.sign(None, (a,), {})
    assert made == [1]  # checked by it
    p = torch.nn.Parameter(torch.zeros(2, 3), requires_grad=False)
    t = Signer(f, None, "auto", "f")
    t.sign(None, (p,), {})
    t.sign(None, (p,), {})  # walked (a Parameter is not a plain call's type), the check made for it
    key = t.sign(None, (a,), {}).key
    assert t.sign(None, (a,), {}).key is key and t._plain[7] is not None and t._plain[7](a)


@pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")
def test_a_set_is_keyed_by_its_contents_passed_or_inside_an_argument_object():
    """A set is a value like a frozenset: equal contents one key, in any order; changed in place another key (a
    set inside an object holding tensors was keyed by identity, so a changed set replayed a stale graph)."""
    x = torch.ones(2)
    assert key(x, opts={1, 2}) == key(x, opts={2, 1})
    assert key(x, opts={1, 2}) != key(x, opts={1, 3})
    assert key(x, opts={1}) != key(x, opts={True})  # equal in Python, not the same call

    class Holder:
        def __init__(self):
            self.t = torch.ones(2)
            self.pending: set[int] = set()

    h = Holder()
    before = key(x, opts=h)
    h.pending.add(3)
    assert key(x, opts=h) != before
    h.pending.discard(3)
    assert key(x, opts=h) == before



class _Private:
    __slots__ = ("__buf", "n")

    def __init__(self, buf: Any, n: int) -> None:
        self.__buf, self.n = buf, n


@pytest.mark.torch
def test_a_private_slot_is_walked_under_its_mangled_name():
    """``__slots__ = ("__buf",)`` stores the attribute as ``_Private__buf``: the walk finds its tensor (before, it
    looked up ``__buf``, missed it and left the tensor out of the key and the inputs)."""
    import torch

    def f(holder: Any) -> Any:
        return holder

    s = Signer(f, None, "auto", "f")
    t = torch.zeros(3)
    sig = s.sign(None, (_Private(t, 1),), {})
    assert len(sig.tensors) == 1 and sig.tensors[0] is t
    assert sig.key != s.sign(None, (_Private(torch.zeros(4), 1),), {}).key
    assert "_Private__buf" in sig.paths[0]
