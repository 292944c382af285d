"""A function that draws from the host's global random generators (Python's ``random``, numpy's legacy global one)
runs uncaptured under its reason, its numbers and the generators' states eager's.  Before, verify compared one call
and could pass by chance (``random.randint(0, 3)``), and every replay handed back the capture's number; with
``warmup=1``, or inside a capture scope, the capture's and verify's runs (or the scope's extra run) drew numbers the
calls never saw, and every later call ran a number ahead of eager's.  One drawn in an island (``@graphjit.eager``)
is drawn on every call, once, as eagerly: the key is captured.  CPU lifecycle through tests/graph_emulator.py."""

from __future__ import annotations

import random
from collections.abc import Callable

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


@graphjit.eager
def _np_island_noise() -> torch.Tensor:
    return torch.full((1,), float(np.random.rand()))


def _with_np_island(x: torch.Tensor) -> torch.Tensor:
    return x * 2 + _np_island_noise()


def _run(f, scope: bool, calls: int = 10) -> tuple[list[float], object, bytes]:
    """``calls`` calls of ``f`` from seeded generators (the first inside a capture scope where ``scope``): the numbers,
    and the generators' states after them."""
    random.seed(7)
    np.random.seed(7)
    outs = []
    for i in range(calls):
        if scope and i == 0:
            with graphjit.capture_scope(progress=False):
                outs.append(float(f(torch.zeros(1))[0]))
        else:
            outs.append(float(f(torch.zeros(1))[0]))
    return outs, random.getstate(), np.random.get_state()[1].tobytes()


@pytest.mark.parametrize("scope", [False, True], ids=["calls", "scope"])
@pytest.mark.parametrize("warmup", [1, 2])
@pytest.mark.parametrize("fn", [_coin, _np_coin], ids=["random", "numpy"])
def test_host_random_draws_run_uncaptured_with_eagers_numbers(emu, fn, warmup: int, scope: bool) -> None:
    g = graphjit.graphed(fn, warmup=warmup)
    got, want = _run(g, scope), _run(fn, scope)
    assert got == want  # the numbers and the generators' states after them
    st = g.stats()
    assert st["replays"] == 0 and set(st["fallbacks"]) == {"draws host random numbers"}, st


@pytest.mark.parametrize("scope", [False, True], ids=["calls", "scope"])
@pytest.mark.parametrize("warmup", [1, 2])
@pytest.mark.parametrize("fn", [_with_island, _with_np_island], ids=["random", "numpy"])
def test_a_draw_inside_an_island_is_drawn_once_a_call_and_the_key_captured(emu, fn, warmup: int, scope: bool) -> None:
    """An island runs on every call: its draws are no reason to run uncaptured, and the runs graphjit adds (the
    capture, verify's reference and replay, a scope's extra run) put the generators back, so each call draws one
    number, as eagerly, and verify sees the numbers eager would."""
    g = graphjit.graphed(fn, warmup=warmup)
    got, want = _run(g, scope), _run(fn, scope)
    assert got == want
    assert len(set(got[0])) == len(got[0])  # a fresh number every call: no replay hands back the capture's
    st = g.stats()
    assert st["graphs"] == 1 and st["replays"] >= 10 - warmup - 1 and not st["fallbacks"], st


def test_torchs_cpu_generator_counts_for_a_call_on_a_gpu() -> None:
    """torch's backend names its CPU generator as a host generator of a call on a GPU (not of one on the CPU, whose
    generator is the device's); a draw from it is seen, and a saved Python state puts it back."""
    from graphjit import backends, host_random
    from graphjit.pystate import PyState

    b = backends.get("torch")
    assert b.host_generators("cpu") == ()
    gens = b.host_generators("cuda:0")
    assert [g.name for g in gens] == ["torch's CPU generator"]
    before = host_random.Saved(gens)
    assert before.moved() is None
    torch.rand(3)
    assert before.moved() == "torch's CPU generator"
    py = PyState(b, [], "cuda:0")
    want = torch.rand(4)
    py.restore()
    assert torch.equal(torch.rand(4), want)  # drawn again from the state the copy kept
    cpu_only = PyState(b, [], "cpu")  # a call on the CPU: Snapshot puts its generator back, not PyState
    torch.rand(2)
    state = torch.default_generator.get_state()
    cpu_only.restore()
    assert torch.equal(torch.default_generator.get_state(), state)


def _numpy_draws() -> list[Callable[[], object]]:
    return [lambda: np.random.rand(), lambda: np.random.randint(5), lambda: np.random.standard_normal(),
            lambda: np.random.seed(123), lambda: np.random.set_state(np.random.RandomState(7).get_state())]


@pytest.mark.parametrize("draw", range(5), ids=["rand", "randint", "standard_normal", "seed", "set_state"])
def test_numpys_generator_read_by_its_struct_sees_every_draw_and_is_put_back(draw: int) -> None:
    """Without a cached Gaussian the copy compares the MT19937 struct's bytes (graphjit/host_random.py ``_Numpy``):
    each kind of draw or reseeding is seen, and :meth:`Saved.put_back` puts the whole state back."""
    from graphjit import host_random

    np.random.seed(0)
    want = np.random.get_state()
    saved = host_random.Saved()
    assert saved.numpy is not None and saved.numpy.address is not None  # the bytes' path, layout checked
    assert saved.moved() is None
    _numpy_draws()[draw]()
    assert saved.moved() == "numpy's global random generator"
    saved.put_back()
    got = np.random.get_state()
    assert got[0] == want[0] and got[2:] == want[2:] and np.array_equal(got[1], want[1])
    assert saved.moved() is None


def test_numpys_generator_with_a_cached_gaussian_is_compared_whole() -> None:
    """After an odd number of Gaussians the next one comes from the cache without moving the key: the bytes cannot see
    it, so such a copy compares the whole state (and sees that draw)."""
    from graphjit import host_random

    np.random.seed(1)
    np.random.standard_normal()  # draws two, caches one
    want = np.random.get_state()
    assert want[3] == 1
    saved = host_random.Saved()
    assert saved.numpy is not None and saved.numpy.address is None
    assert saved.moved() is None
    np.random.standard_normal()  # the cached one: the key did not move
    assert np.random.get_state()[1].tobytes() == want[1].tobytes()
    assert saved.moved() == "numpy's global random generator"
    saved.put_back()
    assert np.random.get_state()[3:] == want[3:]


def test_a_global_generator_given_another_bit_generator_is_compared_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    from graphjit import host_random

    np.random.seed(2)
    saved = host_random.Saved()
    assert saved.numpy is not None and saved.numpy.address is not None
    monkeypatch.setattr(np.random.mtrand._rand, "_bit_generator", np.random.MT19937(5))
    assert saved.moved() == "numpy's global random generator"  # its state is another's now (by get_state)


def test_a_global_generator_on_another_bit_generator_is_read_in_numpys_dict_form() -> None:
    """``np.random.set_bit_generator(PCG64())``: the legacy tuple does not exist there (before, reading the state
    failed every copy, so every warmup raised); its dict form is compared and put back whole."""
    from graphjit import host_random

    original = np.random.get_bit_generator()
    np.random.set_bit_generator(np.random.PCG64(3))
    try:
        saved = host_random.Saved()
        assert saved.numpy is not None and isinstance(saved.numpy.state, dict)
        assert saved.moved() is None
        want = np.random.rand(3)
        assert saved.moved() == "numpy's global random generator"
        saved.put_back()
        assert saved.moved() is None
        assert np.array_equal(np.random.rand(3), want)  # drawn again from the state put back
    finally:
        np.random.set_bit_generator(original)


def test_a_copy_of_numpys_unmoved_generator_reuses_the_last_whole_read() -> None:
    """``np.random.get_state()`` is read once while the struct's bytes stay the same: a scope's many copies of an
    unmoved generator share it; a draw makes the next copy read it again."""
    from graphjit import host_random

    np.random.seed(4)
    first = host_random.Saved()
    again = host_random.Saved()
    assert first.numpy is not None and again.numpy is first.numpy
    np.random.rand()
    after = host_random.Saved()
    assert after.numpy is not first.numpy and first.moved() == "numpy's global random generator"
    assert after.moved() is None
    first.put_back()
    assert after.moved() == "numpy's global random generator" and first.moved() is None


@pytest.mark.parametrize("fn", [_np_coin, _with_np_island], ids=["draws", "island draws"])
def test_graphed_calls_with_numpys_generator_on_pcg64_act_as_eager(emu, fn) -> None:
    """The user-visible side of the dict-form read: with ``set_bit_generator(PCG64())`` every warmup raised before;
    now a drawing function runs uncaptured and an island's draws are drawn once a call, each equal to eager's."""
    original = np.random.get_bit_generator()
    try:
        results = []
        for f in (fn, graphjit.graphed(fn)):
            np.random.set_bit_generator(np.random.PCG64(11))
            results.append([float(f(torch.zeros(1))[0]) for _ in range(8)])
        assert results[0] == results[1]
        st = f.stats()
        if fn is _np_coin:
            assert st["replays"] == 0 and set(st["fallbacks"]) == {"draws host random numbers"}, st
        else:
            assert st["graphs"] == 1 and st["replays"] >= 5 and not st["fallbacks"], st
    finally:
        np.random.set_bit_generator(original)
