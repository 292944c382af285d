"""Bucket padding: key shapes, pads, overflow, decoration-time and call-time refusals (CPU)."""

from __future__ import annotations

import importlib.util
import logging

import numpy as np
import pytest

import graphjit
from graphjit.keys import Pad, Signer

HAS_PADDLE = importlib.util.find_spec("paddle") is not None
HAS_TORCH = importlib.util.find_spec("torch") is not None
if HAS_PADDLE:
    import paddle
if HAS_TORCH:
    import torch

SIZES = [1, 2, 4, 8]


def step(x, mask=None, *, n: int = 1):
    return x * 2


def sign(buckets, *args, f=step, instance=None, **kwargs):
    return Signer(f, buckets, "auto", f.__name__).sign(instance, args, kwargs)


# -- padding ------------------------------------------------------------------------------


@pytest.mark.torch
@pytest.mark.parametrize(("n", "padded"), [(1, 1), (2, 2), (3, 4), (4, 4), (5, 8), (8, 8)])
def test_dim_is_padded_to_the_next_bucket(n, padded):
    x = torch.ones(n, 16)
    sig = sign({"x": {0: SIZES}}, x)
    shape = sig.key[1][0]
    assert tuple(shape) == (padded, 16)
    assert sig.overflow is None
    assert sig.pads == ((Pad(leaf=0, dim=0, real=n, padded=padded),) if padded != n else ())
    assert sig.bucketed == ((0, 0, padded),)


@pytest.mark.torch
def test_sizes_in_one_bucket_share_a_key_and_other_buckets_do_not():
    b = {"x": {0: SIZES}}
    assert sign(b, torch.ones(5, 3)).key == sign(b, torch.ones(7, 3)).key == sign(b, torch.ones(8, 3)).key
    assert sign(b, torch.ones(4, 3)).key != sign(b, torch.ones(5, 3)).key
    # an unbucketed dim still keys exactly
    assert sign(b, torch.ones(5, 3)).key != sign(b, torch.ones(5, 4)).key


@pytest.mark.torch
def test_sizes_in_any_order_are_sorted_and_repeated_sizes_are_refused():
    assert sign({"x": {0: [8, 2, 4]}}, torch.ones(3)).key[1][0] == (4,)  # documented: a call pads to the next size
    with pytest.raises(graphjit.ConfigError, match=r"buckets\['x'\]\[0\] lists \[2\] more than once"):
        graphjit.graphed(step, buckets={"x": {0: [8, 2, 4, 2]}})


@pytest.mark.torch
def test_negative_dims_count_from_the_end():
    x = torch.ones(2, 3)
    last = sign({"x": {-1: SIZES}}, x)
    assert tuple(last.key[1][0]) == (2, 4) and last.pads == (Pad(0, 1, 3, 4),)
    assert sign({"x": {-1: SIZES}}, x).key == sign({"x": {1: SIZES}}, x).key
    with pytest.raises(graphjit.SignatureError, match=r"buckets names dim -3 of argument 'x', but it has 2 dims"):
        sign({"x": {-3: SIZES}}, x)


@pytest.mark.paddle
def test_paddle_padding_by_name_by_index_and_several_dims():
    x = paddle.ones([3, 5])
    by_name = sign({"x": {0: SIZES, 1: [6, 12]}}, x)
    by_index = sign({0: {0: SIZES, 1: [6, 12]}}, x)
    assert tuple(by_name.key[1][0]) == (4, 6)
    assert by_name.key == by_index.key
    assert set(by_name.pads) == {Pad(0, 0, 3, 4), Pad(0, 1, 5, 6)}


@pytest.mark.torch
def test_bucketed_keyword_argument_by_name():
    x, m = torch.ones(3), torch.ones(3, 3)
    sig = sign({"mask": {1: SIZES}}, x, mask=m)
    assert sig.pads == (Pad(leaf=1, dim=1, real=3, padded=4),)
    assert sign({"mask": {1: SIZES}}, x, m).key[2][0] == (3, 4)  # passed positionally: same padding


@pytest.mark.torch
def test_bucket_by_index_applies_when_the_argument_is_passed_by_keyword():
    sig = sign({0: {0: SIZES}}, x=torch.ones(3))
    assert sig.pads == (Pad(0, 0, 3, 4),)


@pytest.mark.torch
def test_overflow_is_reported_and_keeps_the_real_size():
    sig = sign({"x": {0: SIZES}}, torch.ones(9, 2))
    assert sig.overflow is not None
    assert "argument 'x' dim 0 is 9, larger than the largest bucket 8" in sig.overflow
    assert "buckets['x'][0]" in sig.overflow
    assert sig.key[1][0] == (9, 2)
    assert sig.pads == ()
    assert sign({"x": {0: SIZES}}, torch.ones(9, 2)).key != sign({"x": {0: SIZES}}, torch.ones(10, 2)).key


@pytest.mark.torch
def test_buckets_on_a_method_skip_the_instance():
    class Model:
        def forward(self, x, mask=None):
            return x

    obj = Model()
    by_name = sign({"x": {0: SIZES}}, torch.ones(3, 2), f=Model.forward, instance=obj)
    by_index = sign({0: {0: SIZES}}, torch.ones(3, 2), f=Model.forward, instance=obj)
    assert by_name.pads == by_index.pads == (Pad(0, 0, 3, 4),)
    by_kw = sign({"mask": {0: SIZES}}, torch.ones(1), f=Model.forward, instance=obj, mask=torch.ones(5))
    assert by_kw.pads == (Pad(1, 0, 5, 8),)


@pytest.mark.torch
def test_graphed_method_with_buckets_runs_and_keys_per_instance():
    class Model(torch.nn.Module):
        def __init__(self, k):
            super().__init__()
            self.k = k

        @graphjit.graphed(buckets={"x": {0: SIZES}})
        def forward(self, x):
            return x * self.k

    a, b = Model(2.0), Model(3.0)
    x = torch.arange(6.0).reshape(3, 2)
    assert torch.equal(a(x), x * 2.0)  # on CPU: the unpadded call, result not padded
    assert torch.equal(b(x), x * 3.0)
    signer = Model.__dict__["forward"]._self_state.signer
    sa, sb = signer.sign(a, (x,), {}), signer.sign(b, (x,), {})
    assert sa.pads == sb.pads == (Pad(0, 0, 3, 4),)
    assert sa.key != sb.key


# -- decoration-time refusals -------------------------------------------------------------------


@pytest.mark.parametrize(("buckets", "match"), [
    ({"y": {0: SIZES}}, r"step: buckets names argument 'y', which the function does not have; its parameters "
                        r"are: mask, n, x"),
    ({"x": {"0": SIZES}}, r"buckets\['x'\] dim '0' must be an integer \(negative dims count from the end\)"),
    ({"x": {True: SIZES}}, r"buckets\['x'\] dim True must be an integer"),
    ({"x": {0: []}}, r"buckets\['x'\]\[0\] must be a non-empty list of sizes, got \[\]"),
    ({"x": {0: 8}}, r"buckets\['x'\]\[0\] must be a non-empty list of sizes, got 8"),
    ({"x": {0: "1248"}}, r"buckets\['x'\]\[0\] must be a non-empty list of sizes"),
    ({"x": {0: [1, 2.0]}}, r"buckets\['x'\]\[0\] sizes must be positive integers, got \[1, 2.0\]"),
    ({"x": {0: [1, "2"]}}, r"buckets\['x'\]\[0\] sizes must be positive integers"),
    ({"x": {0: [0, 2]}}, r"buckets\['x'\]\[0\] sizes must be positive integers, got \[0, 2\]"),
    ({"x": {0: [True]}}, r"sizes must be positive integers"),
    ({"x": {}}, r"buckets\['x'\] must be a non-empty dict \{dim: \[sizes\]\}"),
    ({2: {0: SIZES}}, r"buckets names positional argument 2, but the function takes 2 positional arguments "
                      r"\(x, mask\)"),
    ({-1: {0: SIZES}}, r"buckets key -1 must be a positional index >= 0"),
    ({1.5: {0: SIZES}}, r"buckets key 1.5 must be a parameter name or a positional index"),
    ([("x", {0: SIZES})], r"buckets must be a dict \{argument: \{dim: \[sizes\]\}\}, got list"),
])
def test_bad_bucket_specs_raise_at_decoration(buckets, match):
    calls = []

    def step(x, mask=None, *, n: int = 1):
        calls.append(1)
        return x

    with pytest.raises(graphjit.ConfigError, match=match):
        graphjit.graphed(step, buckets=buckets)
    decorator = graphjit.graphed(buckets=buckets)  # the decorator form: refused when applied
    with pytest.raises(graphjit.ConfigError, match=match):
        decorator(step)
    assert calls == []


def test_bucket_names_pass_through_var_kwargs_and_var_args():
    def f(*args, **kwargs):
        return args

    graphjit.graphed(f, buckets={"anything": {0: SIZES}, 5: {0: SIZES}})  # nothing to check them against


# -- call-time refusals ---------------------------------------------------------------------------


@pytest.mark.torch
def test_an_optional_bucketed_tensor_may_be_left_out_or_none():
    def attn(x, mask=None):
        return x if mask is None else x * mask

    g = graphjit.graphed(attn, buckets={"mask": {0: SIZES}})
    x = torch.ones(3)
    assert torch.equal(g(x), x) and torch.equal(g(x, None), x) and torch.equal(g(x, mask=None), x)
    assert torch.equal(g(x, torch.full((3,), 2.0)), x * 2)
    keys = g.stats()["keys"]
    assert len(keys) == 2  # left out, None and mask=None are one call; a tensor mask is bucketed
    signer = g._self_state.signer
    padded = signer.sign(None, *signer.binder.bind(False, (x, torch.ones(3)), {}))
    assert padded.pads == (Pad(1, 0, 3, 4),)


@pytest.mark.torch
@pytest.mark.parametrize("value", [[1.0, 2.0], 3, None])
def test_a_non_tensor_bucketed_argument_is_a_plain_argument(value):
    g = graphjit.graphed(step, buckets={"mask": {0: SIZES}})
    assert torch.equal(g(torch.ones(2), value), torch.ones(2) * 2)
    assert g.stats()["keys"][0]["key"].startswith("x[2]")


@pytest.mark.paddle
def test_bucketed_dim_beyond_the_rank_names_the_argument():
    g = graphjit.graphed(step, buckets={"x": {2: SIZES}})
    with pytest.raises(graphjit.SignatureError,
                       match=r"step: buckets names dim 2 of argument 'x', but it has 2 dims \(shape \[3, 4\]\)"):
        g(paddle.ones([3, 4]))


# -- overflow on CPU ---------------------------------------------------------------------------------


@pytest.mark.paddle
def test_overflow_on_cpu_runs_the_function_and_says_so_once(gj_log):
    g = graphjit.graphed(step, buckets={"x": {0: SIZES}})
    x = paddle.arange(18, dtype="float32").reshape([9, 2])
    for _ in range(3):
        np.testing.assert_array_equal(g(x).numpy(), (x * 2).numpy())
    stats = g.stats()
    assert stats["calls"] == 3
    assert stats["fallbacks"] == {"larger than every bucket": 3}
    warnings = [r for r in gj_log.records if r.name == "graphjit" and r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "larger than the largest bucket 8" in warnings[0].getMessage()


@pytest.mark.paddle
@pytest.mark.parametrize("how", ["decorator", "env"])
def test_strict_overflow_raises_even_without_cuda(how, monkeypatch):
    if how == "env":
        monkeypatch.setenv("GRAPHJIT_STRICT", "1")
        graphjit.refresh_env()
        g = graphjit.graphed(step, buckets={"x": {0: SIZES}})
    else:
        g = graphjit.graphed(step, buckets={"x": {0: SIZES}}, strict=True)
    with pytest.raises(graphjit.BucketOverflowError, match=r"argument 'x' dim 0 is 9, larger than the largest "
                                                           r"bucket 8.*strict mode"):
        g(paddle.ones([9, 2]))


@pytest.mark.paddle
def test_strict_mode_without_overflow_still_runs_on_cpu(monkeypatch):
    """No CUDA is not a failure of the function: the traced function runs (ARCHITECTURE, 'No CUDA')."""
    monkeypatch.setenv("GRAPHJIT_STRICT", "1")
    graphjit.refresh_env()
    g = graphjit.graphed(step, buckets={"x": {0: SIZES}}, strict=True)
    x = paddle.ones([3, 2])
    np.testing.assert_array_equal(g(x).numpy(), np.full([3, 2], 2.0, dtype="float32"))


# -- padding a replay sees (the CPU emulator) -------------------------------------------------


@pytest.mark.torch
def test_a_key_captured_unpadded_is_checked_on_its_first_padded_call(emu):
    """A mean over the bucketed dim, captured at the bucket's own size (verify saw no padding): the first call padded
    otherwise is checked against eager and the key runs uncaptured, with the reason; before, every padded call replayed
    the mean over the zero rows too."""
    f = graphjit.graphed(lambda x: x.mean(0), buckets={0: {0: [4, 8]}})
    gen = torch.Generator().manual_seed(0)
    for n in (4, 4, 4, 4, 3, 2, 4):
        x = torch.rand(n, 3, generator=gen) + 1
        torch.testing.assert_close(f(x), x.mean(0), rtol=0, atol=0)
    (key,) = f.stats()["keys"]
    assert key["reason"] == "depends on the padding of a bucketed dim", f.report()
    assert "argument 'x' dim 0: 3 of 4" in key["detail"], key["detail"]


@pytest.mark.torch
def test_a_key_whose_padding_never_shows_keeps_replaying_after_its_check(emu):
    """Row-wise work (the padded rows stay apart): the check on the first padded call passes and every call replays."""
    f = graphjit.graphed(lambda x: torch.tanh(x) * 2, buckets={0: {0: [4, 8]}})
    gen = torch.Generator().manual_seed(0)
    for n in (4, 4, 4, 3, 2, 4, 1):
        x = torch.randn(n, 3, generator=gen)
        torch.testing.assert_close(f(x), torch.tanh(x) * 2, rtol=0, atol=0)
    (key,) = f.stats()["keys"]
    assert key["replays"] == 5 and key["verify"] == "passed (and on a call padded otherwise)", f.report()
