"""``python -m graphjit bench generate`` on the CPU: refuses without a GPU, a smoke run with --allow-cpu (tokens
compared with eager's), and its graphed variant captured for real through tests/graph_emulator.py."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from graphjit.__main__ import main
from graphjit.bench.generate import VARIANTS, _turn

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

pytestmark = [pytest.mark.torch,
              pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU paths are for machines without a GPU")]


def test_without_gpu_refuses_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    assert main(["bench", "generate", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "needs a CUDA GPU" in err and "--allow-cpu" in err
    assert main(["bench", "generate", "--allow-cpu", "--families", "llama,bogus", "--out", str(tmp_path)]) == 2
    assert main(["bench", "generate", "--allow-cpu", "--variants", "hf_compiled", "--out", str(tmp_path)]) == 2
    assert "nothing left to run on a CPU" in capsys.readouterr().err


def test_cpu_smoke_writes_json_and_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    rc = main(["bench", "generate", "--allow-cpu", "--out", str(tmp_path), "--tag", "ci"])
    out = capsys.readouterr().out
    assert rc == 0, out
    data = json.loads((tmp_path / "generate_torch_ci.json").read_text())
    assert data["complete"] is True and data["summary"]["ok"] is True, data["summary"]
    assert set(data["results"]) == {"llama B1", "gpt2 B1"}
    for entry in data["results"].values():
        graphed = entry["variants"]["graphed"]
        assert graphed["status"] == "ok" and graphed["tokens_equal_eager"] is True, graphed
        assert graphed["first_s"] > 0 and graphed["steady_s"] > 0 and all(graphed["calls_equal_eager"])
    assert (tmp_path / "generate_torch_ci.png").exists()
    assert all(entry["order"] == ["eager", "graphed"] for entry in data["results"].values())  # (no compiler on a CPU)


def test_a_time_budget_skips_what_would_end_past_it_and_still_writes_json_and_png(tmp_path: Path,
                                                                                  capsys: pytest.CaptureFixture[str]):
    """``--time-budget 1``: the first variant runs (nothing is known of the others yet), every later one that would end
    past a second, going by the longest so far, is skipped with its reason; the JSON is complete, the plot made, and a
    skipped graphed variant is a problem of the summary (its tokens went unchecked)."""
    main(["bench", "generate", "--allow-cpu", "--out", str(tmp_path), "--tag", "ci", "--time-budget", "1"])
    data = json.loads((tmp_path / "generate_torch_ci.json").read_text())
    statuses = [res["status"] for entry in data["results"].values() for res in entry["variants"].values()]
    assert statuses[0] == "ok" and "skipped" in statuses, statuses
    skipped = [res for entry in data["results"].values() for res in entry["variants"].values()
               if res["status"] == "skipped"]
    assert all("--time-budget of 1 s" in res["reason"] for res in skipped)
    assert data["complete"] is True and (tmp_path / "generate_torch_ci.png").exists()
    unchecked = [p for p in data["summary"]["problems"] if "skipped by --time-budget" in p]  # a graphed one skipped
    assert len(unchecked) == sum(entry["variants"]["graphed"]["status"] == "skipped"
                                 for entry in data["results"].values()) >= 1, data["summary"]


def test_the_compiled_variants_take_turns_going_first():
    assert _turn(list(VARIANTS), 0) == list(VARIANTS)
    assert _turn(list(VARIANTS), 3) == ["eager", "graphed", "hf_compiled", "graphed_compile"]
    assert _turn(["hf_compiled", "eager"], 1) == ["hf_compiled", "eager"]  # one compiled variant: nothing to swap


def test_a_batch_sizes_rows_alternate_which_compiled_variant_goes_first(tmp_path: Path, monkeypatch):
    """The turn is the family's place plus the batch size's: batch 1 goes compile tracer first in one family and
    transformers' first in the next (row by row, batch 1 was always the compile tracer's first with two sizes)."""
    from graphjit.bench import common
    from graphjit.bench import generate as gen

    seen: list[tuple[int, list[str]]] = []

    class Fake:
        def measure(self, family: str, batch: int, variant: str) -> dict[str, object]:
            return {"status": "ok", "first_s": 1.0, "second_s": 1.0, "steady_s": 1.0, "tokens_equal_eager": True}

    monkeypatch.setattr(common, "gpu_or_exit", lambda *a, **k: (True, None))
    monkeypatch.setattr(common, "start", lambda name, data, path, make: Fake())
    real_turn = gen._turn
    monkeypatch.setattr(gen, "_turn", lambda v, t: seen.append((t, real_turn(v, t))) or real_turn(v, t))
    parser = argparse.ArgumentParser()
    gen.add_arguments(parser)
    common.add_common_arguments(parser)
    args = parser.parse_args(["--families", "llama,gpt2,t5", "--batch", "1,8", "--out", str(tmp_path), "--no-plot"])
    assert gen.run(args) == 0
    firsts = [next(x for x in order if x in ("graphed_compile", "hf_compiled")) for _t, order in seen]
    assert firsts == ["graphed_compile", "hf_compiled", "hf_compiled", "graphed_compile", "graphed_compile",
                      "hf_compiled"]


def test_the_graphed_variant_decodes_from_one_graph(emu, monkeypatch):
    from graphjit.bench.torch import generate as torch_generate
    from graphjit.bench.torch.generate import GenerateBench

    # the pair whose first calls' tokens are compared with each other, here two that run on a CPU (the compiled
    # variants need a GPU): the second to run records it
    monkeypatch.setattr(torch_generate, "SAME_COMPILER", ("eager", "graphed"))

    args = argparse.Namespace(layers=2, hidden=64, dtype="fp32", new_tokens=6, prompt_len=5, repeats=2,
                              eager_repeats=1, compile_cache="kept", sliding_window=None)
    bench = GenerateBench(args, on_gpu=False)
    eager = bench.measure("qwen2", 2, "eager")
    graphed = bench.measure("qwen2", 2, "graphed")
    assert eager["status"] == graphed["status"] == "ok"
    # the compared variants' steady state from --repeats calls, eager's (no target compares it) from --eager-repeats
    assert len(graphed["samples_s"]) == 2 and len(eager["samples_s"]) == 1
    assert graphed["tokens_equal_eager"] is True
    assert graphed["stats"]["graphs"] == 1 and graphed["stats"]["captures"] == 1, graphed["stats"]
    assert "tokens_vs" not in eager and graphed["tokens_vs"] == {"eager": True}, graphed
    assert "tokens_vs" not in bench.measure("qwen2", 1, "graphed")  # another batch size: nothing to compare with


def test_the_summary_says_where_the_two_compiled_variants_made_the_same_tokens():
    from graphjit.bench.generate import compiled_tokens_equal

    ok = {"status": "ok"}
    results = {"llama B1": {"variants": {"graphed_compile": ok, "hf_compiled": {**ok, "tokens_vs": {"x": True}}}},
               "llama B8": {"variants": {"hf_compiled": ok, "graphed_compile": {**ok, "tokens_vs": {"x": False}}}},
               "gpt2 B1": {"variants": {"graphed_compile": ok, "hf_compiled": {"status": "skipped"}}}}
    assert compiled_tokens_equal(results) == {"llama B1": True, "llama B8": False}


def test_gemma_decodes_from_one_graph_with_its_configs_window(emu):
    """Gemma 2 with transformers' own sliding window (4096, the bench's default): the decode positions, keys of their
    own by the cache's Python count, share one graph (graphjit/families.py: the window never fills here), its replays
    advancing the count; tokens equal eager's."""
    from graphjit.bench.torch.generate import GenerateBench

    args = argparse.Namespace(layers=2, hidden=64, dtype="fp32", new_tokens=6, prompt_len=5, repeats=2,
                              eager_repeats=2, compile_cache="kept", sliding_window=None)
    bench = GenerateBench(args, on_gpu=False)
    assert bench.model("gemma2").config.sliding_window == 4096
    res = bench.measure("gemma2", 1, "graphed")
    assert res["status"] == "ok" and res["tokens_equal_eager"] is True, res
    assert res["stats"]["graphs"] == 1, res["stats"]


@pytest.mark.parametrize("mode", ["fresh", "kept"])
def test_each_variant_compiles_in_empty_caches_unless_kept(monkeypatch, mode):
    """``--compile-cache fresh`` (the default): every variant runs with its own new Inductor and Triton cache folders,
    so the compiled variant measured second cannot reuse the kernels the first one compiled; ``kept`` leaves them."""
    import os

    from graphjit.bench.torch.generate import GenerateBench

    seen = []

    def measure(self, family, batch, variant):
        seen.append((os.environ.get("TORCHINDUCTOR_CACHE_DIR"), os.environ.get("TRITON_CACHE_DIR")))
        return {"status": "ok"}

    monkeypatch.setattr(GenerateBench, "_measure", measure)
    outside = (os.environ.get("TORCHINDUCTOR_CACHE_DIR"), os.environ.get("TRITON_CACHE_DIR"))
    bench = GenerateBench(argparse.Namespace(dtype="fp32", compile_cache=mode, sliding_window=None), on_gpu=False)
    for variant in ("graphed_compile", "hf_compiled"):
        assert bench.measure("llama", 1, variant) == {"status": "ok"}
    if mode == "kept":
        assert seen == [outside, outside]
    else:
        (a_inductor, a_triton), (b_inductor, b_triton) = seen
        assert None not in (a_inductor, a_triton, b_inductor, b_triton) and a_inductor != b_inductor
        assert a_triton != b_triton and (a_inductor, a_triton) != outside
        assert not os.path.exists(a_inductor)  # the folder goes with its block
    assert (os.environ.get("TORCHINDUCTOR_CACHE_DIR"), os.environ.get("TRITON_CACHE_DIR")) == outside


def test_the_compiler_starts_once_and_once_per_family_before_its_first_compiled_variant(monkeypatch):
    """What a process pays once for its first compilation of a family's code lands in no variant: the compiler
    starts on a small function, both ways the variants compile, once, and on a one-layer model of each family through
    both compiled variants, before the family's first compiled variant (GPU runs), recorded in that variant alone."""
    import os

    from graphjit.bench.torch.generate import GenerateBench

    compiled = []

    def fake_compile(fn, *args, **kwargs):
        compiled.append((os.environ.get("TORCHINDUCTOR_CACHE_DIR"), kwargs))
        return fn

    monkeypatch.setattr(torch, "compile", fake_compile)
    families = []
    monkeypatch.setattr(GenerateBench, "_start_family", lambda self, family: families.append(family))
    bench = GenerateBench(argparse.Namespace(dtype="fp32", compile_cache="kept", sliding_window=None), on_gpu=False)
    assert bench.start_compiler() >= 0 and families == []
    assert bench.start_compiler("qwen3") >= 0 and families == ["qwen3"]
    assert bench.start_compiler("qwen3") >= 0 and families == ["qwen3"]  # a family is started once
    assert bench.start_compiler("gemma2") >= 0 and families == ["qwen3", "gemma2"]
    assert len(compiled) == 2  # the small function: once a process
    # as each compiled variant compiles (graphjit's compile tracer, transformers' reduce-overhead), in a fresh cache
    # even where the run keeps its caches
    assert [kw for _d, kw in compiled] == [{"options": {"triton.cudagraphs": False}}, {"mode": "reduce-overhead"}]
    assert all(d is not None for d, _kw in compiled)
    started = []
    bench = GenerateBench(argparse.Namespace(dtype="fp32", compile_cache="kept", sliding_window=None), on_gpu=False)
    bench.on_gpu = True  # as on a GPU run; the timed parts are stood in for
    monkeypatch.setattr(GenerateBench, "_measure", lambda self, family, batch, variant: {"status": "ok"})

    def fake_start(self, family):
        started.append(family)
        self.families_started.add(family)
        return 2.5

    monkeypatch.setattr(GenerateBench, "start_compiler", fake_start)
    variants = ("eager", "graphed", "graphed_compile", "hf_compiled")
    rows = [("llama", 1), ("llama", 8), ("mixtral", 1)]
    results = [bench.measure(family, batch, v) for family, batch in rows for v in variants]
    assert started == ["llama", "mixtral"]
    first = [None, None, 2.5, None]  # the family's first compiled variant alone
    assert [r.get("compiler_start_s") for r in results] == first + [None] * 4 + first


def test_the_steady_state_is_the_median_of_the_last_half_of_the_later_calls():
    """Calls whose keys still warm up (a prefill captured on the fourth call) are not the steady state."""
    from graphjit.bench.torch.generate import steady_state

    assert steady_state([0.112, 0.162, 0.189, 0.074, 0.074]) == 0.074  # Qwen3 B1's graphed samples on the H200
    assert steady_state([0.3, 0.1, 0.2, 0.1, 0.3, 0.2]) == 0.2
    assert steady_state([0.5]) == 0.5 and steady_state([0.5, 0.2]) == 0.2


def test_every_call_makes_the_tokens_asked_for_even_where_the_model_would_end_early(emu):
    """No end-of-sequence token: a random model whose greedy path hits it early (Qwen3 on the H200: about 31 of 64
    tokens) still makes ``--new-tokens``; a variant that made another number is a problem, not a time."""
    from graphjit.bench.generate import _wrong
    from graphjit.bench.torch.generate import GenerateBench

    args = argparse.Namespace(layers=2, hidden=64, dtype="fp32", new_tokens=12, prompt_len=5, repeats=1,
                              eager_repeats=1, compile_cache="kept", sliding_window=None)
    bench = GenerateBench(args, on_gpu=False)
    model = bench.model("llama")
    assert model.generation_config.eos_token_id is None
    for family in ("llama", "t5"):
        for variant in ("eager", "graphed"):
            res = bench.measure(family, 1, variant)
            assert res["tokens_made"] == [12, 12], (family, variant, res)
            assert _wrong(variant, res) is None
    assert _wrong("eager", {"new_tokens": 64, "tokens_made": [64, 31]}) == "made [64, 31] new tokens per call, not 64"


def test_the_bench_offers_every_family_the_models_module_builds():
    """The bench's list (in its framework-free half) and ``hf_families``' are the same families."""
    from graphjit.bench.generate import FAMILIES
    from graphjit.bench.torch import hf_families

    assert sorted(FAMILIES) == sorted(hf_families.FAMILIES)


def test_a_multimodal_models_text_decoder_decodes_from_one_graph(emu):
    """Qwen2-VL from its config, a text-only prompt: its decoder's 3-axis rotary positions are computed in the
    prefill and kept on the model; the decode step is one graph, tokens equal eager's."""
    from graphjit.bench.torch.generate import GenerateBench

    args = argparse.Namespace(layers=2, hidden=64, dtype="fp32", new_tokens=6, prompt_len=5, repeats=2,
                              eager_repeats=2, compile_cache="kept", sliding_window=None)
    res = GenerateBench(args, on_gpu=False).measure("qwen2_vl", 2, "graphed")
    assert res["status"] == "ok" and res["tokens_equal_eager"] is True, res
    assert res["stats"]["graphs"] == 1 and res["stats"]["replays"] >= 5, res["stats"]


def test_the_json_is_named_after_the_families_asked_for():
    """Runs of other families into one folder each keep their JSON (two runs once wrote one file)."""
    from graphjit.bench.generate import output_name

    assert output_name(None, ["llama", "gpt2"], "h200") == "generate_torch_h200.json"
    assert output_name("t5", ["t5"], "h200") == "generate_t5_torch_h200.json"
    assert output_name("gemma2,t5", ["gemma2", "t5"], "ci") == "generate_gemma2_t5_torch_ci.json"
