"""torch's batched contents comparison (``backends/torch/contents.py``), which a warmup's write probe uses: it reports
exactly what ``TorchBackend.equal`` tensor by tensor reports, with one comparison for an unchanged device group."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from graphjit import backends, reach  # noqa: E402
from graphjit.backends.torch import contents as contents_mod  # noqa: E402
from graphjit.writes import WriteProbe  # noqa: E402

pytestmark = pytest.mark.torch


def _tensors():
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    return [
        torch.randn(8, dtype=torch.bfloat16),
        torch.tensor([1.0, float("nan"), 3.0]),  # NaN equal to NaN
        torch.tensor(5, dtype=torch.int64),  # 0-dim
        torch.tensor([True, False]),
        base[:, 1::2],  # not contiguous
        torch.zeros(0),  # empty
        torch.tensor([1 + 2j, 3 - 1j]),
    ]


def test_unchanged_tensors_are_settled_by_one_comparison(monkeypatch):
    b = backends.get("torch")
    ts = _tensors()
    copy = b.contents(ts)
    assert len(copy.groups) == 1 and not copy.clones  # every one in the CPU's byte buffer
    calls = []
    real = torch.equal
    monkeypatch.setattr(torch, "equal", lambda x, y: calls.append(1) or real(x, y))
    assert b.changed(ts, copy) == []
    assert len(calls) == 1


@pytest.mark.parametrize("which", range(7))
def test_each_kind_of_tensor_written_in_place_is_reported_alone(which):
    b = backends.get("torch")
    ts = _tensors()
    copy = b.contents(ts)
    t = ts[which]
    if t.numel() == 0:
        t.resize_(2)  # an empty tensor can only change by its size
    elif t.dtype == torch.bool:
        t.logical_not_()
    else:
        t.add_(1)
    assert b.changed(ts, copy) == [which]


def test_what_equal_calls_equal_is_not_a_write():
    """Bytes that differ where ``equal`` does not (a zero's sign, another NaN): not reported, as before."""
    b = backends.get("torch")
    zero, nan = torch.tensor([0.0, 1.0]), torch.tensor([float("nan"), 1.0])
    copy = b.contents([zero, nan])
    zero[0] = -0.0
    nan[0] = -float("nan")
    assert b.changed([zero, nan], copy) == []


def test_a_resized_or_rebound_data_tensor_is_reported():
    b = backends.get("torch")
    grow, retype, same = torch.zeros(3), torch.zeros(3), torch.zeros(3)
    copy = b.contents([grow, retype, same])
    grow.resize_(5).zero_()
    retype.data = torch.zeros(3, dtype=torch.float64)  # the same tensor object, another dtype
    assert b.changed([grow, retype, same], copy) == [0, 1]


def test_large_and_unreadable_tensors_are_compared_one_by_one(monkeypatch):
    b = backends.get("torch")
    monkeypatch.setattr(contents_mod, "BATCHED_BYTES", 16)
    big, small = torch.zeros(8), torch.zeros(2)
    conj = torch.tensor([1 + 1j]).conj()  # a conjugate view: torch will not view it as bytes
    copy = b.contents([big, small, conj])
    assert sorted(copy.clones) == [0, 2] and [g.positions for g in copy.groups] == [[1]]
    big.add_(1)
    assert b.changed([big, small, conj], copy) == [0]
    small.add_(1)
    assert b.changed([big, small, conj], copy) == [0, 1]


def test_the_write_probe_reports_small_plain_tensors_through_it():
    """The probe's use: small plain tensors (no parameter) compared by contents, a write without a version bump
    (through ``.data``) found."""
    b = backends.get("torch")
    w, r, p = torch.ones(4), torch.zeros(4), torch.nn.Parameter(torch.ones(4))
    rch = reach.walk([("w", w), ("r", r), ("p", p)], lambda t: isinstance(t, b.tensor_types()))
    probe = WriteProbe(b, rch, 1 << 20, frozenset({id(r)}))
    r.data.add_(1)  # no counter moved
    assert sorted(reach.describe(path) for _t, path in probe.written()) == ["r"]


def test_tensors_known_written_are_never_compared():
    """What the probe found by a version counter is not compared again (a tensor on ``meta`` has no kernel to
    compare with); the rest of its group still is, by one comparison."""
    b = backends.get("torch")
    meta, plain, other = torch.zeros(2, device="meta"), torch.zeros(2), torch.zeros(3)
    copy = b.contents([meta, plain, other])
    assert b.changed([meta, plain, other], copy, known={0}) == []
    other.add_(1)
    assert b.changed([meta, plain, other], copy, known={0}) == [2]
    plain.add_(1)
    assert b.changed([meta, plain, other], copy, known={0, 2}) == [1]


def test_the_same_bytes_under_another_dtype_or_shape_is_a_write():
    """``.data`` rebound to a view of the same bytes (no counter moves): reported, as ``equal`` reports it."""
    b = backends.get("torch")
    retyped, reshaped, same = torch.zeros(4), torch.zeros(4), torch.zeros(4)
    rch = reach.walk([("a", retyped), ("b", reshaped), ("c", same)], lambda t: isinstance(t, b.tensor_types()))
    probe = WriteProbe(b, rch, 1 << 20, frozenset({id(retyped), id(reshaped), id(same)}))
    retyped.data = retyped.data.view(torch.int32)
    reshaped.data = reshaped.data.view(2, 2)
    assert sorted(reach.describe(path) for _t, path in probe.written()) == ["a", "b"]


def test_unchanged_neighbours_of_a_write_are_settled_by_their_bytes():
    """Where a group differs, each tensor's own bytes are compared first: ``equal`` runs only on the written one (an
    unchanged float8 tensor, which ``equal`` cannot compare on the CPU, beside a written one)."""
    b = backends.get("torch")
    f8, z = torch.zeros(4, dtype=torch.float8_e4m3fn), torch.zeros(2)
    copy = b.contents([f8, z])
    z.add_(1)
    assert b.changed([f8, z], copy) == [1]


def test_a_group_holds_at_most_its_bytes(monkeypatch):
    b = backends.get("torch")
    monkeypatch.setattr(contents_mod, "GROUP_BYTES", 16)
    ts = [torch.zeros(2), torch.zeros(2), torch.zeros(2)]  # 8 bytes each
    copy = b.contents(ts)
    assert [g.positions for g in copy.groups] == [[0, 1]] and sorted(copy.clones) == [2]
    ts[2].add_(1)
    assert b.changed(ts, copy) == [2]


def test_tensors_torch_will_not_join_are_cloned_one_by_one(monkeypatch):
    """A ``torch.cat`` that refuses its parts (tensor subclasses of several kinds) costs the batching, never the
    probe: each tensor is cloned and compared on its own."""
    b = backends.get("torch")
    real = torch.cat

    def refusing(parts, *args, **kwargs):
        if len(parts) > 1:
            raise RuntimeError("cannot join these")
        return real(parts, *args, **kwargs)

    monkeypatch.setattr(torch, "cat", refusing)
    ts = [torch.zeros(2), torch.ones(3)]
    copy = b.contents(ts)
    assert not copy.groups and sorted(copy.clones) == [0, 1]
    ts[1].add_(1)
    assert b.changed(ts, copy) == [1]
