"""Keys that differ only in a counter that picks branches share one graph (graphjit/families.py), on the CPU emulator,
which freezes what a capture read: a graph that read the counter into its data replays the capture's value.

The counter's holder stands in for transformers' ``StaticSlidingWindowLayer`` (same class name, a ``transformers``
module, ``max_cache_len`` and ``cumulative_length_int``)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import graphjit  # noqa: E402

pytestmark = pytest.mark.torch


class StaticSlidingWindowLayer:
    """What the family's classifier reads: the window and the Python count."""

    def __init__(self, window: int) -> None:
        self.max_cache_len = window
        self.cumulative_length_int = 0
        self.keys = torch.zeros(window, 4)


StaticSlidingWindowLayer.__module__ = "transformers.cache_utils"


def _branch_only(x: torch.Tensor, layer: StaticSlidingWindowLayer) -> torch.Tensor:
    n = layer.cumulative_length_int
    layer.cumulative_length_int += 1
    if n >= layer.max_cache_len:  # full: roll the window, as the layer does
        layer.keys.copy_(layer.keys.roll(-1, 0))
        layer.keys[-1].copy_(x)
    else:
        layer.keys.add_(x * 0.5)
    return layer.keys.sum(0) + x


def _reads_count(x: torch.Tensor, layer: StaticSlidingWindowLayer) -> torch.Tensor:
    n = layer.cumulative_length_int
    layer.cumulative_length_int += 1
    return x * n + layer.keys.sum(0)  # the count in the data: a graph froze it


def _run(fn, steps: int, graphed: bool, rounds: int = 1,
         warmup: int = 1) -> tuple[list[torch.Tensor], StaticSlidingWindowLayer, object]:
    """``rounds`` passes of ``steps`` calls, the count reset between them (a kept cache reset by the next generate():
    a value's key is captured once it repeats)."""
    layer = StaticSlidingWindowLayer(window=6)
    call = graphjit.graphed(fn, warmup=warmup) if graphed else fn
    outs = []
    for _ in range(rounds):
        layer.cumulative_length_int = 0
        for i in range(steps):
            x = torch.full((4,), float(i + 1))
            outs.append(call(x, layer))
    return outs, layer, call


@pytest.mark.parametrize("rounds", [2, 3])
def test_a_counter_that_picks_branches_replays_one_graph_per_class(emu, rounds):
    steps = 14
    want, eager_layer, _ = _run(_branch_only, steps, graphed=False, rounds=rounds)
    got, layer, g = _run(_branch_only, steps, graphed=True, rounds=rounds)
    for i, (a, b) in enumerate(zip(got, want)):
        assert torch.equal(a, b), (i, a, b)
    assert layer.cumulative_length_int == eager_layer.cumulative_length_int == steps
    assert torch.equal(layer.keys, eager_layer.keys)
    keys = g.stats()["keys"]
    families = [k for k in keys if k.get("members")]
    # n = 1..5 (not full, and still not after the call) share one graph, n >= 6 (full) another; n = 0 is its own
    assert len(families) == 2 and g.stats()["graphs"] == 3, g.report()
    assert all(k["members"] >= 3 and k["verify"].startswith("passed (and on another value") for k in families)
    # only three calls run eagerly, all in the first pass: n = 0 (a class of its own), n = 1 (the first of its
    # class: n = 2 takes its warmup over and captures) and n = 6 (the first full one, taken over by n = 7); every
    # other call replays: the captures' own replays, the proofs' and the members'
    assert sum(k["replays"] for k in keys) == steps * rounds - 3, g.report()
    assert g.stats()["replays"] == steps * rounds - 3, g.report()


def test_a_counter_read_into_the_data_fails_the_proof_and_gets_a_graph_per_value(emu, gj_log):
    steps = 10
    want, eager_layer, _ = _run(_reads_count, steps, graphed=False, rounds=2)
    got, layer, g = _run(_reads_count, steps, graphed=True, rounds=2)
    for i, (a, b) in enumerate(zip(got, want)):
        assert torch.equal(a, b), (i, a, b)  # the proof's call too: its result is the eager run's
    assert layer.cumulative_length_int == eager_layer.cumulative_length_int == steps
    keys = g.stats()["keys"]
    assert not any(k.get("members") for k in keys), g.report()
    assert "its graph differs from eager on another value of argument 'layer'.cumulative_length_int" in gj_log.text
    # afterwards each value is a key of its own again, as without families: called again, they replay right
    outs = []
    layer.cumulative_length_int = 0
    eager_layer.cumulative_length_int = 0
    for i in range(steps):
        x = torch.full((4,), float(i + 1))
        outs.append((g(x, layer), _reads_count(x, eager_layer)))
    assert all(torch.equal(a, b) for a, b in outs)
    assert g.stats()["graphs"] >= steps // 2, g.report()  # one per value again


def test_a_holder_outside_transformers_keeps_a_key_per_value(emu):
    """A class of the same name and attributes defined elsewhere is not transformers' layer: nothing says what its
    counter decides, so each value stays a key of its own."""
    Layer = type("StaticSlidingWindowLayer", (), {"__init__": StaticSlidingWindowLayer.__init__,
                                                  "__module__": __name__})
    layer = Layer(window=6)
    g = graphjit.graphed(_branch_only, warmup=1)
    for i in range(8):
        g(torch.full((4,), float(i + 1)), layer)
    assert not any(k.get("members") for k in g.stats()["keys"]), g.report()


def _syncs_when_full(x: torch.Tensor, layer: StaticSlidingWindowLayer) -> torch.Tensor:
    """``_branch_only`` whose full branch reads a value back to the CPU (a CUDA graph cannot hold it)."""
    n = layer.cumulative_length_int
    layer.cumulative_length_int += 1
    if n >= layer.max_cache_len:
        shift = int(layer.keys[0, 0].item() != 0.5)  # a CPU-GPU sync
        layer.keys.copy_(layer.keys.roll(-shift, 0))
        layer.keys[-1].copy_(x)
    else:
        layer.keys.add_(x * 0.5)
    return layer.keys.sum(0) + x


@pytest.mark.parametrize("warmup", [1, 2])
def test_the_values_of_one_class_share_their_warmups_and_their_verdict(emu, warmup):
    """A counter's values of one class warm up together (Families.take_over): the not-full class is captured on its
    value ``1 + warmup`` within the first pass, the values before it served by its graph from the second pass on.
    The full class syncs: it warms up on its first ``warmup`` values, the last of which finds the sync; they fail
    with it, and so does every later value of the class without warming up (before, each value warmed up on its own,
    and with ``warmup=2`` values whose record another value took over warmed up again on every pass)."""
    steps, rounds = 12, 3
    want, eager_layer, _ = _run(_syncs_when_full, steps, graphed=False, rounds=rounds)
    got, layer, g = _run(_syncs_when_full, steps, graphed=True, rounds=rounds, warmup=warmup)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert layer.cumulative_length_int == eager_layer.cumulative_length_int
    assert torch.equal(layer.keys, eager_layer.keys)
    s = g.stats()
    keys = {int(k["key"].rsplit("=", 1)[1]): k for k in s["keys"]}
    (fam,) = [k for k in keys.values() if k.get("members")]
    assert fam["key"].endswith(f"={1 + warmup}") and fam["members"] == 5 - 1, g.report()
    # the runs of the values whose record it took over, and one undone run of its own value before its capture
    assert fam["warmups"] == warmup + 1, g.report()
    full = {n: k for n, k in keys.items() if n >= 6}
    assert set(full) == set(range(6, steps)), g.report()
    assert all(k["state"] == "fallback" and k["reason"].startswith("CPU-GPU sync") for k in full.values()), g.report()
    assert sum(k["warmups"] for k in full.values()) == warmup, g.report()
    # every full call but the warmup calls before the one that found the sync
    assert s["fallbacks"] == {"CPU-GPU sync inside the function": (steps - 6) * rounds - (warmup - 1)}, g.report()
    # the not-full class from its capture on in the first pass, and every value of it in the later ones; n = 0 (a
    # class of its own) from the pass after its warmups
    assert s["replays"] == (5 - warmup) + 5 * (rounds - 1) + (rounds - 1 - warmup + 1), g.report()
