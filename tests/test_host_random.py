"""A function that draws from the host's global random generators (Python's ``random``, numpy's legacy global one)
runs uncaptured under its reason, its numbers and the generators' states eager's.  Before, verify compared one call
and could pass by chance (``random.randint(0, 3)``), and every replay handed back the capture's number.  CPU
lifecycle through tests/graph_emulator.py."""

from __future__ import annotations

import random

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import graphjit  # noqa: E402

pytestmark = pytest.mark.torch


def _coin(x: torch.Tensor) -> torch.Tensor:
    return x + random.randint(0, 3)


def _np_coin(x: torch.Tensor) -> torch.Tensor:
    return x + float(np.random.randint(0, 4))


@graphjit.eager
def _island_noise() -> torch.Tensor:
    return torch.full((1,), random.random())


def _with_island(x: torch.Tensor) -> torch.Tensor:
    return x * 2 + _island_noise()


@pytest.mark.parametrize("fn", [_coin, _np_coin], ids=["random", "numpy"])
def test_host_random_draws_run_uncaptured_with_eagers_numbers(emu, fn) -> None:
    def run(f):
        random.seed(7)
        np.random.seed(7)
        outs = [float(f(torch.zeros(1))[0]) for _ in range(10)]
        return outs, random.getstate(), np.random.get_state()[1].tobytes()

    g = graphjit.graphed(fn)
    got, want = run(g), run(fn)
    assert got == want
    st = g.stats()
    assert st["replays"] == 0 and st["fallbacks"] == {"draws host random numbers": 9}, st


def test_a_draw_inside_an_island_is_not_this_reason(emu) -> None:
    """An island runs on every call: its draws are no reason to run uncaptured.  (Verify, which runs the island once
    more than eager would, then sees other numbers and keeps the key uncaptured: a limit of islands that draw on the
    host, not checked here.)"""
    g = graphjit.graphed(_with_island)
    for _ in range(6):
        g(torch.ones(1))
    assert "draws host random numbers" not in g.stats()["fallbacks"], g.stats()
