"""The values of a counter's class share their warmups and their verdict (graphjit/families.py ``take_over``,
graphjit/family_calls.py), on the CPU emulator: cases a review of that change found or feared.  The counter's holder
is test_families' stand-in for transformers' ``StaticSlidingWindowLayer``."""

from __future__ import annotations

import contextlib
import random

import pytest

torch = pytest.importorskip("torch")

from test_families import StaticSlidingWindowLayer, _branch_only, _reads_count, _syncs_when_full  # noqa: E402

import graphjit  # noqa: E402
from graphjit import api, buffers  # noqa: E402
from graphjit import scope as scope_mod  # noqa: E402
from graphjit.errors import CaptureError  # noqa: E402

pytestmark = pytest.mark.torch


def _writes_input_at_3(x: torch.Tensor, layer: StaticSlidingWindowLayer) -> torch.Tensor:
    """A branch on one value inside the not-full class, which the class does not describe: it writes its input."""
    n = layer.cumulative_length_int
    layer.cumulative_length_int += 1
    if n == 3:
        x.mul_(2)
    layer.keys.add_(x * 0.5)
    return layer.keys.sum(0)


def _syncs_while_filling(x: torch.Tensor, layer: StaticSlidingWindowLayer) -> torch.Tensor:
    n = layer.cumulative_length_int
    layer.cumulative_length_int += 1
    if 1 <= n < layer.max_cache_len:
        s = float(layer.keys.sum().item() > -1)  # a sync in the filling class only
        layer.keys.add_(x * 0.5 * s)
    else:
        layer.keys.add_(x)
    return layer.keys.sum(0) + x


def _play(fn, plan, warmup=None, caches=2, **options):
    """``plan``: ``(cache, tokens)`` per "generate()", each restarting its cache's count at 0; graphed where
    ``warmup`` is given.  Returns the outputs, the inputs as the calls left them, the caches and the function."""
    layers = [StaticSlidingWindowLayer(window=6) for _ in range(caches)]
    g = graphjit.graphed(fn, warmup=warmup, **options) if warmup is not None else fn
    outs, xs = [], []
    for c, steps in plan:
        layers[c].cumulative_length_int = 0
        for i in range(steps):
            x = torch.full((4,), float(i + 1))
            outs.append(g(x, layers[c]))
            xs.append(x)
    return outs, xs, layers, g


def _same(got, want):
    (go, gx, gl, g), (wo, wx, wl, _) = got, want
    assert [i for i, (a, b) in enumerate(zip(go, wo)) if not torch.equal(a, b)] == [], g.report()
    assert [i for i, (a, b) in enumerate(zip(gx, wx)) if not torch.equal(a, b)] == [], g.report()
    for a, b in zip(gl, wl):
        assert a.cumulative_length_int == b.cumulative_length_int and torch.equal(a.keys, b.keys), g.report()


def test_the_captured_value_runs_once_itself_before_its_capture(emu):
    """The value that captures (n = 3: n = 1 and 2 warmed its record up) ran no warmup of its own: one watched run of
    it, undone, comes first, and a value that writes what the others did not is refused, its call right (before, the
    graph missed the write: the caller's tensor was not doubled).  (A family member that does so, n = 3 with
    ``warmup=1``, is proven by outputs and the record's state only: a class must fix every branch, as
    graphjit/families.py says.)"""
    plan = [(0, 5), (0, 5)]
    got = _play(_writes_input_at_3, plan, 2)
    _same(got, _play(_writes_input_at_3, plan))
    keys = {k["key"].rsplit("=", 1)[1]: k for k in got[3].stats()["keys"]}
    assert keys["3"]["reason"] == "writes different tensors on different calls", got[3].report()


def test_strict_mode_raises_for_every_value_of_a_failed_class(emu):
    """In strict mode each value of a class that failed raises once, as its own warmups' failure would (before, only
    the first did and the others fell back silently)."""
    layer = StaticSlidingWindowLayer(window=6)
    g = graphjit.graphed(_syncs_when_full, warmup=1, strict=True)
    raised = []
    for r in range(2):
        layer.cumulative_length_int = 0
        for i in range(12):
            n = layer.cumulative_length_int
            try:
                g(torch.full((4,), float(i + 1)), layer)
            except CaptureError:
                raised.append((r, n))
                layer.cumulative_length_int = n + 1  # the call ran (after_run)
    assert raised == [(0, n) for n in range(6, 12)], (raised, g.report())


@pytest.mark.parametrize("warmup", [1, 2])
@pytest.mark.parametrize("short", [1, 2, 3, 5, 8])
def test_a_second_cache_never_replays_a_released_graph(emu, monkeypatch, warmup, short):
    """A second cache (other tensors) reaches a family member first: its recapture releases the family's graph, and
    no key may replay it afterwards (before, the family's own key still did), nor may the member be recaptured on the
    family's record (it goes its own way)."""
    released, hits = [], []  # (the entries themselves: an id() of a freed one may come back)
    release, replay = buffers.KeyEntry.release, api._State.replay

    def counted_release(self):
        released.append(self)
        release(self)

    def checked_replay(self, entry, sig, *a, **k):
        if any(entry is e for e in released):
            hits.append(sig.key)
        return replay(self, entry, sig, *a, **k)

    monkeypatch.setattr(buffers.KeyEntry, "release", counted_release)
    monkeypatch.setattr(api._State, "replay", checked_replay)
    plan = [(0, 12), (1, short), (0, 12), (1, 12), (0, 12)]
    got = _play(_branch_only, plan, warmup)
    _same(got, _play(_branch_only, plan))
    assert not hits, got[3].report()


@pytest.mark.parametrize("warmup", [1, 2])
def test_a_class_that_syncs_fails_and_the_next_class_still_captures(emu, warmup):
    plan = [(0, 12)] * 3
    got = _play(_syncs_while_filling, plan, warmup, caches=1)
    _same(got, _play(_syncs_while_filling, plan, caches=1))
    assert any(k["state"] == "replay" and k.get("members") for k in got[3].stats()["keys"]), got[3].report()


def test_the_compile_tracer_never_compiles_inside_a_capture(emu, monkeypatch):
    """The capturing value ran the compiled function once before (its own run): Dynamo's recompile for a new value
    happens there, not inside the capture."""
    warmup = 2
    import torch._dynamo as dynamo
    from graph_emulator import EmulatedTorchBackend

    phases = []
    dynamo.reset()

    def compiler(gm, _example):
        phases.append(scope_mod.phase())
        return gm.forward

    monkeypatch.setattr(EmulatedTorchBackend, "trace",
                        lambda self, fn, tracer: torch.compile(fn, backend=compiler) if tracer == "compile" else fn)
    monkeypatch.setattr(EmulatedTorchBackend, "tracer_guard", lambda self, target, tracer, f_locals: None)
    got = _play(_branch_only, [(0, 10)] * 3, warmup, caches=1, tracer="compile")
    _same(got, _play(_branch_only, [(0, 10)] * 3, caches=1))
    assert phases and "capture" not in phases, phases


def _script(seed: int) -> list[tuple]:
    rnd = random.Random(seed)
    ops: list[tuple] = []
    for _ in range(120):
        r = rnd.random()
        if r < 0.08:
            ops.append(("rewind", rnd.randrange(2), rnd.choice([0, 0, 3, 5, 6])))
        elif r < 0.10:
            ops.append(("reset",))
        else:
            ops.append(("call", rnd.randrange(2) if rnd.random() < 0.3 else 0))
    return ops


def _fuzz(fn, ops, warmup, scoped=0):
    """``scoped``: graphed ops ``k`` with ``(k // scoped) % 2 == 0`` run inside a capture scope (one per such run)."""
    layers = [StaticSlidingWindowLayer(window=6), StaticSlidingWindowLayer(window=6)]
    g = graphjit.graphed(fn, warmup=warmup) if warmup else fn
    outs, scope = [], None
    with contextlib.ExitStack() as scopes:
        for k, op in enumerate(ops):
            inside = bool(warmup and scoped) and (k // max(scoped, 1)) % 2 == 0
            if inside and scope is None:
                scope = scopes.enter_context(graphjit.capture_scope(progress=False))
            elif not inside and scope is not None:
                scopes.close()
                scope = None
            if op[0] == "rewind":
                layers[op[1]].cumulative_length_int = op[2]
            elif op[0] == "reset":
                if warmup:
                    g.reset()
            else:
                outs.append(g(torch.full((4,), float(k % 7 + 1)), layers[op[1]]))
    return outs, layers, g


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("warmup", [1, 2, 3])
@pytest.mark.parametrize("fn", [_branch_only, _reads_count, _syncs_when_full])
@pytest.mark.parametrize("scoped", [0, 7])
def test_two_caches_rewinds_and_resets_in_random_order_act_as_eager(emu, seed, warmup, fn, scoped):
    """``scoped``: runs of 7 calls inside a capture scope in turn with 7 outside (the values of a class share their
    warmups inside a scope too)."""
    ops = _script(seed)
    want, wl, _ = _fuzz(fn, ops, 0)
    got, gl, g = _fuzz(fn, ops, warmup, scoped)
    for i, (a, b) in enumerate(zip(got, want)):
        assert torch.equal(a, b), (i, g.report())
    for a, b in zip(gl, wl):
        assert a.cumulative_length_int == b.cumulative_length_int and torch.equal(a.keys, b.keys), g.report()


@pytest.mark.parametrize("budget", ["50", "100"])  # the copies: 112 bytes
def test_values_share_no_warmups_where_the_own_run_could_not_be_undone(emu, monkeypatch, budget):
    """Where the capturing value's own run could not be undone (its copies over ``GRAPHJIT_VERIFY_MAX_BYTES``), no
    value takes another's record over: each warms up on its own, as before (a review found the class's word taken
    instead: the caller's tensor was not doubled)."""
    from graphjit import family_calls

    monkeypatch.setenv("GRAPHJIT_VERIFY_MAX_BYTES", budget)
    graphjit.env.refresh()
    own_runs = []
    run = family_calls.FamilyCalls.own_value_run
    monkeypatch.setattr(family_calls.FamilyCalls, "own_value_run", lambda *a: own_runs.append(1) or run(*a))
    plan = [(0, 5), (0, 5)]
    got = _play(_writes_input_at_3, plan, 2)
    _same(got, _play(_writes_input_at_3, plan))
    assert not own_runs and all(k["warmups"] <= 2 for k in got[3].stats()["keys"]), got[3].report()


def test_a_failed_copy_before_the_own_run_fails_the_class_and_changes_nothing(emu, monkeypatch):
    from graphjit import family_calls

    def no_memory(*_a, **_k):
        raise MemoryError("out of memory")

    monkeypatch.setattr(family_calls, "Snapshot", no_memory)
    plan = [(0, 12), (0, 12)]
    got = _play(_branch_only, plan, 2, caches=1)
    _same(got, _play(_branch_only, plan, caches=1))
    reasons = {k["reason"] for k in got[3].stats()["keys"]}
    assert "cannot undo a warmup run" in reasons, got[3].report()


def test_two_caches_in_turn_settle_after_a_members_recapture(emu, monkeypatch):
    """Two caches used in turn: the input that moved under a family member is copied in and back by the counter's
    next graphs instead of adopted, so the switches stop releasing graphs (a second review counted 23 releases in 12
    switches, each family key captured 12 times)."""
    releases = []
    release = buffers.KeyEntry.release
    monkeypatch.setattr(buffers.KeyEntry, "release", lambda self: releases.append(1) or release(self))
    plan = [(0, 12), (1, 12)] * 6
    got = _play(_branch_only, plan, 2)
    _same(got, _play(_branch_only, plan))
    assert len(releases) <= 4, (len(releases), got[3].report())


def test_a_call_of_another_layout_after_a_warming_value_that_writes_an_input_is_its_own_key(emu):
    """A call whose arguments hold fewer tensors than the warming key before it (a counter's class that writes its
    last input in place): not a value of that class, so it warms up on its own (before, the check whether the
    record's run could be undone read the record's written inputs at this call's indices first: IndexError, as T5's
    first forward of a generate() with an attention mask after one stopped at its first decode step by eos)."""

    def step(layer, *xs):
        layer.cumulative_length_int += 1
        xs[-1].add_(1)
        layer.keys.add_(xs[0].sum() * 0.5)
        return layer.keys.sum(0)

    def play(g):
        layer = StaticSlidingWindowLayer(window=6)
        xs = [torch.ones(4) for _ in range(4)]
        outs = [g(layer, *xs[:3]), g(layer, xs[3]), g(layer, xs[3])]
        return outs, xs, layer

    (go, gx, gl), (wo, wx, wl) = play(graphjit.graphed(step)), play(step)
    assert all(torch.equal(a, b) for a, b in zip(go + gx, wo + wx))
    assert gl.cumulative_length_int == wl.cumulative_length_int and torch.equal(gl.keys, wl.keys)


@pytest.mark.parametrize("warmup", [1, 2])
def test_a_capture_scope_shares_a_classs_warmups_and_leaves_nothing_that_blocks_replays(emu, warmup):
    """A counter's values called inside a ``capture_scope`` (a Gemma ``generate()`` there): a value's own call only
    warms its key up (extra runs would start from the next value), but the values of its class share those warmups
    there too, so the class captures inside the scope, and after the scope the same calls replay as they do without
    it.  Before, each value warmed up on its own inside the scope (nothing captured, nothing said), and the records
    it left kept the values from sharing afterwards: the same calls then ran eagerly, uncaptured, with no replay."""
    plan = [(0, 12), (0, 12)]

    def play(scoped: bool):
        layer = StaticSlidingWindowLayer(window=6)
        g = graphjit.graphed(_branch_only, warmup=warmup)
        outs, replays, scope = [], [], None
        for first, (_c, steps) in enumerate(plan):
            layer.cumulative_length_int = 0
            with graphjit.capture_scope(progress=False) if scoped and first == 0 else contextlib.nullcontext() as sc:
                scope = sc or scope
                for i in range(steps):
                    outs.append(g(torch.full((4,), float(i + 1)), layer))
            replays.append(g.stats()["replays"] - sum(replays))
        return outs, layer, g, replays, scope

    want = _play(_branch_only, plan)[0]
    plain, scoped = play(False), play(True)
    for outs, layer, g, _r, _s in (plain, scoped):
        assert [i for i, (a, b) in enumerate(zip(outs, want)) if not torch.equal(a, b)] == [], g.report()
        assert layer.cumulative_length_int == 12
    g, replays, sc = scoped[2], scoped[3], scoped[4]
    assert replays == plain[3] and replays[1] >= 11, (replays, plain[3], g.report())
    assert g.stats()["graphs"] == plain[2].stats()["graphs"], g.report()
    assert sc.stats()["captures"] >= 2 and sc.stats()["failures"] == 0, sc.stats()
