"""A tensor at a static buffer's address is that input only in the buffer's layout: a view of it at the same
address with other strides (``x.t()`` of a square ``x``) is another tensor of the same key, which a replay must
read as such.  Before, graphjit compared addresses alone, and the graph read the buffer in its captured layout:
a silently wrong result.  CPU lifecycle through tests/graph_emulator.py."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import graphjit  # noqa: E402

pytestmark = pytest.mark.torch


def _rows(a: torch.Tensor) -> torch.Tensor:
    """Layout-sensitive (rows differ from columns), and it writes nothing."""
    return a @ torch.arange(16.0).reshape(4, 4) + a.sum(0)


def test_a_transposed_view_of_a_static_input_is_copied_in_as_itself(emu):
    g = graphjit.graphed(_rows, outputs="alias")
    x = torch.randn(4, 4)
    for _ in range(3):
        g(x)
    (static,), _ = g.static_inputs(x)
    static.copy_(torch.randn(4, 4))
    assert torch.equal(g(static), _rows(static))  # the zero-copy path still replays in place
    expected = _rows(static.t().clone())
    out = g(static.t())
    assert torch.allclose(out, expected), (out - expected).abs().max()
    assert g.stats()["replays"] >= 2 and g.stats()["captures"] == 1


def _scale_rows(cache: torch.Tensor) -> torch.Tensor:
    cache.mul_(torch.arange(1.0, 5.0).reshape(4, 1))  # in place (adopted), layout-sensitive
    return cache.sum(1)


def test_an_adopted_input_passed_in_another_layout_moved(emu):
    g = graphjit.graphed(_scale_rows)
    cache = torch.ones(4, 4)
    for _ in range(3):
        g(cache)
    view = cache.t()
    expected_cache = view.clone()
    expected_out = _scale_rows(expected_cache)
    out = g(view)
    assert torch.equal(out, expected_out)
    assert torch.equal(view, expected_cache)  # written through the caller's view, as eagerly
    assert g(view) is not None and torch.equal(view, expected_cache * torch.arange(1.0, 5.0).reshape(4, 1))


def _sum_weighted(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a * 2 + b * 3


def test_one_tensor_passed_twice_at_capture_then_two_tensors(emu):
    g = graphjit.graphed(_sum_weighted)
    x = torch.ones(4)
    for _ in range(3):
        g(x, x)  # captured with one buffer for both
    y, z = torch.full((4,), 10.0), torch.full((4,), 100.0)
    assert torch.equal(g(y, z), _sum_weighted(y, z))  # before: both copied into one buffer (500, not 320)
    assert torch.equal(g(x, x), _sum_weighted(x, x))


def _add_then_read(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    a.add_(1)  # in place: a is adopted
    return a + b


def test_an_adopted_input_passed_again_as_another_argument(emu):
    g = graphjit.graphed(_add_then_read)
    y, z = torch.zeros(4), torch.zeros(4)
    for _ in range(3):
        g(y, z)
    x, x_eager = torch.zeros(4), torch.zeros(4)
    want = _add_then_read(x_eager, x_eager)  # b sees a's write: they are one tensor
    assert torch.equal(g(x, x), want) and torch.equal(x, x_eager)


def test_a_tensor_and_its_transpose_are_two_inputs(emu):
    g = graphjit.graphed(lambda a, b: a @ b)
    x = torch.randn(4, 4)
    for _ in range(3):
        g(x, x.t())  # same address and shape, other strides: two buffers
    y = torch.randn(4, 4)
    assert torch.allclose(g(y, y.t()), y @ y.t())
    assert g.stats()["captures"] == 1


def test_graphjits_own_buffers_passed_swapped(emu):
    g = graphjit.graphed(lambda a, b: a - b, outputs="alias")
    a, b = torch.ones(4), torch.full((4,), 5.0)
    for _ in range(3):
        g(a, b)
    (sa, sb), _ = g.static_inputs(a, b)
    want = sb - sa
    assert torch.equal(g(sb, sa), want)  # each read before the other buffer is written


def test_an_owned_written_buffer_passed_back_in_another_layout_is_written_back(emu):
    """An input the function writes in place whose buffer graphjit owns (it moved once), passed as its own buffer's
    transpose: copied in and written back through clones (before: torch refused the overlapping copy back, after
    the replay had run)."""
    g = graphjit.graphed(_scale_rows)
    for c in (torch.ones(4, 4),) * 3 + (torch.ones(4, 4),):
        g(c)  # the last one moved: recaptured with a graphjit-owned buffer
    (s,), _ = g.static_inputs(torch.ones(4, 4))
    s.copy_(torch.arange(16.0).reshape(4, 4))
    view = s.t()
    expected_view = view.clone()
    expected_out = _scale_rows(expected_view)
    assert torch.equal(g(view), expected_out)
    assert torch.equal(view, expected_view)


def test_graphs_launch_through_torchs_cpp_replay_only_where_its_python_wrapper_is_the_liveness_check():
    from graphjit.backends.torch.graphs import _thin_wrapper

    def liveness_only(self):
        if self._tracker is not None:
            self._tracker.check_alive(self.pool())
        super().replay()

    def instantiates_first(self):
        if self.keep_graph and not self.instantiated:
            self.instantiate()
        super().replay()

    assert _thin_wrapper(liveness_only) and not _thin_wrapper(instantiates_first) and not _thin_wrapper(None)


def test_one_bucketed_tensor_passed_twice_is_padded_and_copied_in_once(emu):
    """Two inputs that are one tensor share one buffer: its owner input copies it in, padded where its dim is
    bucketed; the other is not loaded again (it was: zeroed and copied twice)."""
    g = graphjit.graphed(_sum_weighted, buckets={"a": {0: [8]}, "b": {0: [8]}})
    for n in (5, 5, 5, 6, 3):
        x = torch.arange(float(n))
        assert torch.equal(g(x, x), _sum_weighted(x, x)), n
    st = g.stats()
    assert st["captures"] == 1 and st["replays"] == 3, st
    (key,) = st["keys"]
    assert key["input_copies"] == 2, key  # one per later replay (the capturing call copies in its own way): before, 4


def _write_then_read_other(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    a.add_(1)  # in place, into a buffer of graphjit's once a has moved (copied in and back)
    return b * 2


@pytest.mark.parametrize("lane", [False, True])
def test_a_written_input_passed_again_as_another_argument_after_two_tensors(emu, request, lane):
    """Captured with two tensors, then called with one tensor twice: ``b`` must see ``a``'s write, as in eager.
    Before, ``b`` was copied into its own buffer before the write (a silently wrong result: 0, not 2).  Such a call
    runs uncaptured, counted; the key keeps its graph, so calls that alternate recapture nothing."""
    if lane:
        request.getfixturevalue("lane_on")
    g = graphjit.graphed(_write_then_read_other)
    for i in range(4):  # a new tensor each call: a moves, so it gets a buffer copied in and back
        g(torch.full((4,), float(i)), torch.full((4,), 5.0))
    for i in range(3):
        x, x_eager = torch.full((4,), float(i)), torch.full((4,), float(i))
        want = _write_then_read_other(x_eager, x_eager)
        assert torch.equal(g(x, x), want) and torch.equal(x, x_eager), (x, x_eager)
    captures = g.stats()["captures"]
    for i in range(10):  # two tensors again, one tensor twice in turn
        x, y = torch.zeros(4), torch.full((4,), 5.0)
        assert torch.equal(g(x, y), torch.full((4,), 10.0)) and torch.equal(x, torch.ones(4))
        x, x_eager = torch.full((4,), float(i)), torch.full((4,), float(i))
        assert torch.equal(g(x, x), _write_then_read_other(x_eager, x_eager)) and torch.equal(x, x_eager)
    from graphjit.buffers import OVERLAP

    st = g.stats()
    assert st["captures"] == captures and st["fallbacks"] == {OVERLAP: 13}, g.report()


def test_a_written_input_and_an_overlapping_view_run_uncaptured_with_the_reason(emu):
    """Views that overlap in part, one of them written: no graph can have one buffer for both, so the call runs
    eagerly, counted under its reason, with eager's result and state."""
    g = graphjit.graphed(_write_then_read_other)
    for i in range(4):
        g(torch.full((4,), float(i)), torch.full((4,), 5.0))
    for _ in range(2):
        x, x_eager = torch.arange(8.0), torch.arange(8.0)
        want = _write_then_read_other(x_eager[:4], x_eager[2:6])
        assert torch.equal(g(x[:4], x[2:6]), want) and torch.equal(x, x_eager), (x, x_eager)
    from graphjit.buffers import OVERLAP

    assert OVERLAP in g.stats()["fallbacks"], g.report()


def test_a_sparse_input_runs_uncaptured_under_its_reason(emu, caplog):
    def spmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.sparse.mm(a, b) * 2

    g = graphjit.graphed(spmm, tracer="eager")
    a = torch.sparse_coo_tensor(torch.tensor([[0, 1], [1, 0]]), torch.tensor([1.0, 2.0]), (2, 2))
    b = torch.randn(2, 3)
    with caplog.at_level("WARNING", logger="graphjit"):
        for _ in range(4):  # warmup, capture and replay would each have cloned it (a RuntimeError of torch's)
            assert torch.equal(g(a, b), spmm(a, b))
    st = g.stats()
    assert st["captures"] == 0 and st["fallbacks"] == {"an input is not a strided tensor": 4}, st
    assert "argument 'a' is a tensor of layout torch.sparse_coo" in caplog.text
