"""torch's ``rel_error``, the comparison behind verifying a capture against eager (CPU tests): equal outputs score 0
through one ``torch.equal``; anything else is scored in float64 as before, a complex tensor by its real and imaginary
parts."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from graphjit.backends import get  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.fixture
def b():
    return get("torch")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.complex64])
def test_equal_tensors_score_zero(b, dtype):
    t = (torch.arange(6) % 2).to(dtype)
    assert b.rel_error(t, t.clone()) == 0.0


def test_a_difference_in_the_imaginary_part_counts(b):
    a, c = torch.tensor([1 + 1j, 2 + 0j]), torch.tensor([1 + 2j, 2 + 0j])
    assert b.rel_error(a, c) == pytest.approx(1 / 3)  # |1j - 2j| / sqrt(|1 + 2j|^2 + |2|^2)


def test_nan_in_the_same_places_is_equal_and_in_other_places_is_not(b):
    x = torch.tensor([1.0, float("nan"), 3.0])
    assert b.rel_error(x, x.clone()) == 0.0
    assert b.rel_error(x, torch.tensor([1.0, 2.0, 3.0])) == math.inf


def test_unequal_tensors_are_scored_in_float64(b):
    got, want = torch.tensor([1.0, 2.0], dtype=torch.bfloat16), torch.tensor([1.0, 2.5], dtype=torch.bfloat16)
    assert b.rel_error(got, want) == pytest.approx(0.5 / math.sqrt(1 + 2.5**2))
    assert b.rel_error(torch.arange(3), torch.arange(3) + 1) == math.inf
    assert b.rel_error(torch.ones(2), torch.ones(3)) == math.inf


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
def test_a_dtype_torch_equal_does_not_take_is_still_scored(b):
    t, u = torch.zeros(4, dtype=torch.complex32), torch.ones(4, dtype=torch.complex32)
    assert b.rel_error(t, t.clone()) == 0.0
    assert b.rel_error(u, t) == math.inf  # ||u - t|| / ||t|| with ||t|| = 0
