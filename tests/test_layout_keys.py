"""A tensor's layout is part of its key (graphjit/layouts.py): a function that branches on ``is_contiguous()``,
calls ``view()`` or returns results whose strides follow its inputs' acts on a transposed or channels-last input as
eager does.  Before, a key held shape, dtype, device and requires_grad only: a transposed input was copied into the
contiguous buffer of the first call's key, its branch frozen (silently wrong), its ``view`` error hidden and its
output strides the buffer's.  CPU lifecycle through tests/graph_emulator.py; Paddle's keys on its CPU tensors."""

from __future__ import annotations

import pytest

from graphjit import layouts


def test_layout_classes() -> None:
    assert layouts.of((4, 4), (4, 1)) is None
    assert layouts.of((4, 4), (1, 4)) == ("dense", (1, 0))
    assert layouts.of((2, 3, 4, 5), (60, 1, 15, 3)) == ("dense", (0, 2, 3, 1))  # channels-last
    assert layouts.of((1, 3, 1, 1), (3, 1, 3, 3)) is None  # size-1 dims' strides do not count
    assert layouts.of((1, 4), (9, 1)) is None
    assert layouts.of((8, 1), (17, 1)) == ("strided", (0,), ())  # a column of a growing cache: one class
    assert layouts.of((8, 1), (23, 1)) == layouts.of((8, 1), (17, 1))
    assert layouts.of((4, 2), (5, 1)) == ("strided", (0, 1), ())  # a slice of wider rows
    assert layouts.of((4, 3), (0, 1)) == ("strided", (1, 0), (0,))  # expanded
    assert layouts.of((), ()) is None
    assert layouts.dense_strides((2, 3, 4, 5), ("dense", (0, 2, 3, 1))) == (60, 1, 15, 3)
    assert layouts.dense_strides((4, 4), ("dense", (1, 0))) == (1, 4)
    assert layouts.dense_strides((2, 1, 3), None) == (3, 3, 1)


torch = pytest.importorskip("torch")

import graphjit  # noqa: E402


def _branchy(x: torch.Tensor) -> torch.Tensor:
    return x * 2 if x.is_contiguous() else x * 3


def _flat(x: torch.Tensor) -> torch.Tensor:
    return x.view(-1) + 1


def _plus(x: torch.Tensor) -> torch.Tensor:
    return x + 1


def _warm(g, x: torch.Tensor, n: int = 3) -> None:
    for _ in range(n):
        g(x)


@pytest.mark.torch
def test_a_branch_on_contiguity_follows_the_input(emu, scan) -> None:
    g = graphjit.graphed(_branchy)
    _warm(g, torch.randn(4, 4))
    for _ in range(4):
        t = torch.randn(4, 4).t()
        assert torch.equal(g(t), t * 3)
        c = torch.randn(4, 4)
        assert torch.equal(g(c), c * 2)
    st = g.stats()
    assert st["graphs"] == 2 and st["replays"] >= 6, st
    assert any("strides=(1, 4)" in line for line in g.report().splitlines()), g.report()


@pytest.mark.torch
def test_a_view_that_eager_refuses_is_refused(emu) -> None:
    g = graphjit.graphed(_flat)
    _warm(g, torch.randn(4, 4))
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        g(torch.randn(4, 4).t())
    x = torch.randn(4, 4)
    assert torch.equal(g(x), x.view(-1) + 1)


@pytest.mark.torch
def test_outputs_keep_a_channels_last_inputs_strides(emu) -> None:
    g = graphjit.graphed(_plus)
    _warm(g, torch.randn(2, 3, 4, 5))
    for _ in range(4):
        x = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
        out = g(x)
        assert out.stride() == _plus(x).stride() and torch.equal(out, x + 1)
    assert g.stats()["replays"] >= 2


@pytest.mark.torch
def test_a_slice_of_a_growing_buffer_keeps_its_key(emu, scan) -> None:
    """The last column of a cache that grows by one each step: its outer stride changes every call, its layout
    class does not, and the graph replays every step (copied in, as before)."""
    g = graphjit.graphed(_plus)
    cache = torch.randn(8, 4)
    for _step in range(8):
        cache = torch.cat([cache, torch.randn(8, 1)], dim=1)
        col = cache[:, -1:]
        assert torch.equal(g(col), col + 1)
    st = g.stats()
    assert st["graphs"] == 1 and st["replays"] >= 4, st


@pytest.mark.torch
def test_the_metadata_check_refuses_another_layout() -> None:
    from graphjit.backends.torch.graphs import TorchBackend

    b = TorchBackend.__new__(TorchBackend)
    x = torch.randn(4, 4)
    check = b.meta_check([x])
    if check is None:
        pytest.skip("this torch has no TensorGuards")
    assert check(torch.randn(4, 4)) and not check(torch.randn(4, 4).t())
    assert check(torch.randn(4, 5)[:, :4].contiguous())
    sliced = b.meta_check([torch.randn(4, 9)[:, :4]])
    assert sliced is not None
    assert sliced(torch.randn(4, 7)[:, :4]) and not sliced(torch.randn(4, 4)) and not sliced(torch.randn(4, 4).t())
    assert b.meta_key(x) != b.meta_key(x.t()) and b.meta_key(x) == b.meta_key(torch.randn(4, 4))


@pytest.mark.paddle
def test_paddle_keys_hold_the_layout() -> None:
    paddle = pytest.importorskip("paddle")
    from graphjit.backends.paddle import graphs

    if not graphs._STRIDED:
        pytest.skip("this Paddle has no strided views")
    b = graphs.PaddleBackend()
    x = paddle.randn([4, 4])
    assert b.meta_key(x) != b.meta_key(x.t()) and b.meta_key(x) == b.meta_key(paddle.randn([4, 4]))
    check = b.meta_check([x])
    if check is not None:
        assert check(paddle.randn([4, 4])) and not check(paddle.randn([4, 4]).t())
        wide = b.meta_check([paddle.randn([4, 9])[:, :4]])
        assert wide is not None and wide(paddle.randn([4, 7])[:, :4]) and not wide(paddle.randn([4, 4]))


@pytest.mark.torch
def test_a_tensor_without_strides_runs_uncaptured_under_its_reason(emu) -> None:
    """A sparse CSR tensor has neither ``is_contiguous()`` nor strides: its key and label are made without them, and
    the call runs uncaptured as any unstrided input does (not a RuntimeError from reading its layout)."""
    g = graphjit.graphed(lambda a, b: a @ b)
    a, b = torch.randn(4, 4).to_sparse_csr(), torch.randn(4, 3)
    for _ in range(3):
        assert torch.allclose(g(a, b), a.to_dense() @ b)
    assert g.stats()["fallbacks"] == {"an input is not a strided tensor": 3}


@pytest.mark.torch
def test_an_expanded_input_keeps_a_contiguous_buffer_and_eagers_strides(emu) -> None:
    """``arange(T)[None].expand(B, T)`` (position ids): its stride-0 dim is no order to lay a buffer out in."""
    g = graphjit.graphed(lambda p: (p * 2 + 1).view(-1))
    for _ in range(5):
        pos = torch.arange(6.0)[None].expand(4, 6)
        out = g(pos)
        assert torch.equal(out, (pos * 2 + 1).view(-1)) and out.stride() == (1,)
    assert g.stats()["replays"] >= 2 and not g.stats()["fallbacks"]


@pytest.mark.torch
def test_a_bucketed_transposed_input_gets_a_transposed_padded_buffer(emu) -> None:
    g = graphjit.graphed(_branchy, buckets={"x": {0: [8]}})
    for n in (5, 6, 7, 5, 6, 7):
        x = torch.randn(4, n).t()
        out = g(x)
        assert torch.equal(out, x * 3) and out.stride() == (x * 3).stride(), n
    assert g.stats()["replays"] >= 3 and not g.stats()["fallbacks"], g.stats()


@pytest.mark.paddle
def test_paddles_check_takes_the_tensors_it_was_made_from() -> None:
    """A size-1 dim with an odd stride (``logits[:, -1]`` of a batch of one): contiguous for the key, not for
    Paddle's ``is_contiguous()``; the check made from it must take it (or it is made again every call)."""
    paddle = pytest.importorskip("paddle")
    from graphjit.backends.paddle import graphs

    if not graphs._STRIDED:
        pytest.skip("this Paddle has no strided views")
    t = paddle.randn([1, 5, 8])[:, -1]
    assert not t.is_contiguous() and graphs._layout(t) is None
    check = graphs.PaddleBackend().meta_check([t])
    assert check is None or check(paddle.randn([1, 5, 8])[:, -1])


@pytest.mark.paddle
def test_paddles_check_refuses_each_part_of_the_key_it_was_made_from() -> None:
    """Paddle's one-loop check takes tensors with every part of the key it was made from, and refuses a change of any
    one: the count, a dtype, stop_gradient, a shape and (where Paddle has strided views) the layout."""
    paddle = pytest.importorskip("paddle")
    from graphjit.backends.paddle import graphs

    a, b = paddle.randn([4, 4]), paddle.randn([4, 3])
    check = graphs.PaddleBackend().meta_check([a, b])
    if check is None:
        pytest.skip("this Paddle's Place has no _equals")
    assert check(paddle.randn([4, 4]), paddle.randn([4, 3]))
    grad = paddle.randn([4, 3])
    grad.stop_gradient = False
    refused = [(paddle.randn([4, 4]),), (paddle.randn([4, 4]), paddle.randn([4, 3]), paddle.randn([1])),
               (paddle.randn([4, 4]).astype("float64"), paddle.randn([4, 3])), (paddle.randn([4, 4]), grad),
               (paddle.randn([4, 4]), paddle.randn([3, 4]))]
    if graphs._STRIDED:
        refused.append((paddle.randn([4, 4]).t(), paddle.randn([4, 3])))
    for args in refused:
        assert not check(*args), [list(t.shape) for t in args]
