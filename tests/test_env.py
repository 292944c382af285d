"""GRAPHJIT_* variables: each toggle does what its table row says; bad values name the variable."""

from __future__ import annotations

import importlib.util
import logging
import re
from pathlib import Path

import numpy as np
import pytest

import graphjit
import graphjit.env
from graphjit.env import VARIABLES, table_markdown

HAS_PADDLE = importlib.util.find_spec("paddle") is not None
HAS_TORCH = importlib.util.find_spec("torch") is not None
if HAS_PADDLE:
    import paddle
if HAS_TORCH:
    import torch

PACKAGE = Path(graphjit.__file__).parent


def setenv(monkeypatch, **values):
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    return graphjit.refresh_env()


def test_defaults():
    s = graphjit.env.settings()
    assert (s.disable, s.debug, s.strict, s.verify, s.check_outputs) == (False, False, False, True, False)
    assert s.max_graphs is None and s.dump_dir is None and s.ar_algo == "auto" and s.custom_ar is True


# -- GRAPHJIT_DISABLE -----------------------------------------------------------------------------


@pytest.mark.paddle
def test_disable_calls_the_original_function(monkeypatch):
    ran = []

    def step(x, n):
        ran.append(n)
        return x * n

    g = graphjit.graphed(step)
    assert setenv(monkeypatch, GRAPHJIT_DISABLE="1").disable is True
    x = paddle.ones([2])
    np.testing.assert_array_equal(g(x, 3).numpy(), [3.0, 3.0])
    np.testing.assert_array_equal(g(x, n=4).numpy(), [4.0, 4.0])
    assert ran == [3, 4]
    assert g._self_state.traced == {}  # no tracer created
    stats = g.stats()
    assert stats["disabled_calls"] == 2 and stats["calls"] == 0 and stats["fallbacks"] == {}

    setenv(monkeypatch, GRAPHJIT_DISABLE="0")
    g(x, 5)
    assert g.stats()["calls"] == 1 and g.stats()["disabled_calls"] == 2
    assert set(g._self_state.traced) == {"paddle"}


@pytest.mark.torch
def test_disable_on_a_method_binds_the_instance(monkeypatch):
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.full((2,), 5.0), requires_grad=False)

        @graphjit.graphed
        def forward(self, x):
            return x * self.w

    setenv(monkeypatch, GRAPHJIT_DISABLE="yes")
    net = Net()
    torch.testing.assert_close(net(torch.ones(2)), torch.full((2,), 5.0))
    assert Net.__dict__["forward"].stats()["disabled_calls"] == 1
    assert Net.__dict__["forward"]._self_state.traced == {}


# -- GRAPHJIT_DEBUG ---------------------------------------------------------------------------------


@pytest.mark.paddle
@pytest.mark.parametrize("debug", ["0", "1"])
def test_debug_logs_the_tracer(monkeypatch, gj_log, debug):
    setenv(monkeypatch, GRAPHJIT_DEBUG=debug)

    def step(x):
        return x + 1

    graphjit.graphed(step, tracer="eager")(paddle.ones([2]))
    traced = [r for r in gj_log.records if r.name == "graphjit" and r.levelno == logging.DEBUG
              and "traced with paddle/eager" in r.getMessage()]
    assert len(traced) == (1 if debug == "1" else 0)


# -- GRAPHJIT_STRICT / GRAPHJIT_VERIFY / GRAPHJIT_MAX_GRAPHS: env default, decorator override --------------


def f(x):
    return x


@pytest.mark.parametrize(("value", "expected"), [("1", True), ("true", True), ("ON", True), ("0", False),
                                                 ("no", False), ("", False)])
def test_strict_from_env_and_decorator_override(monkeypatch, value, expected):
    assert setenv(monkeypatch, GRAPHJIT_STRICT=value).strict is expected
    assert graphjit.graphed(f)._self_state.strict() is expected
    assert graphjit.graphed(f, strict=not expected)._self_state.strict() is (not expected)


@pytest.mark.parametrize(("value", "expected"), [("1", True), ("0", False), ("off", False)])
def test_verify_from_env_and_decorator_override(monkeypatch, value, expected):
    assert setenv(monkeypatch, GRAPHJIT_VERIFY=value).verify is expected
    assert graphjit.graphed(f)._self_state.verify() is expected
    assert graphjit.graphed(f, verify=not expected)._self_state.verify() is (not expected)


def test_env_is_read_again_only_on_refresh(monkeypatch):
    monkeypatch.setenv("GRAPHJIT_STRICT", "1")
    assert graphjit.env.settings().strict is False  # cached until refresh
    assert graphjit.refresh_env().strict is True
    assert graphjit.env.settings().strict is True


@pytest.mark.paddle
def test_strict_env_does_not_turn_no_cuda_into_an_error(monkeypatch):
    setenv(monkeypatch, GRAPHJIT_STRICT="1")
    g = graphjit.graphed(lambda x: x * 2)
    np.testing.assert_array_equal(g(paddle.ones([2])).numpy(), [2.0, 2.0])
    assert sum(g.stats()["fallbacks"].values()) == 1


def test_max_graphs_from_env_and_decorator_override(monkeypatch):
    assert graphjit.graphed(f)._self_state.max_graphs() == 64
    assert setenv(monkeypatch, GRAPHJIT_MAX_GRAPHS="8").max_graphs == 8
    assert graphjit.graphed(f)._self_state.max_graphs() == 8
    assert graphjit.graphed(f, max_graphs=3)._self_state.max_graphs() == 3
    assert setenv(monkeypatch, GRAPHJIT_MAX_GRAPHS=" 0x10 ").max_graphs == 16


@pytest.mark.parametrize(("value", "match"), [
    ("lots", r"GRAPHJIT_MAX_GRAPHS='lots': expected a whole number, e.g. GRAPHJIT_MAX_GRAPHS=64"),
    ("4.5", r"GRAPHJIT_MAX_GRAPHS='4.5': expected a whole number"),
    ("-2", r"GRAPHJIT_MAX_GRAPHS='-2': expected a number >= 1"),
])
def test_bad_max_graphs_names_the_variable(monkeypatch, value, match):
    monkeypatch.setenv("GRAPHJIT_MAX_GRAPHS", value)
    with pytest.raises(graphjit.ConfigError, match=match):
        graphjit.refresh_env()


def test_max_graphs_zero_in_env_is_refused(monkeypatch):
    monkeypatch.setenv("GRAPHJIT_MAX_GRAPHS", "0")
    with pytest.raises(graphjit.ConfigError, match=r"GRAPHJIT_MAX_GRAPHS='0'"):
        graphjit.refresh_env()


@pytest.mark.parametrize("name", ["GRAPHJIT_DISABLE", "GRAPHJIT_DEBUG", "GRAPHJIT_STRICT", "GRAPHJIT_VERIFY",
                                  "GRAPHJIT_CHECK_OUTPUTS", "GRAPHJIT_CUSTOM_AR"])
def test_bad_bool_names_the_variable(monkeypatch, name):
    monkeypatch.setenv(name, "maybe")
    with pytest.raises(graphjit.ConfigError, match=rf"{name}='maybe': expected 0 or 1"):
        graphjit.refresh_env()


@pytest.mark.parametrize("value", ["1shot", "2SHOT", "auto", "nccl"])
def test_ar_algo_values(monkeypatch, value):
    assert setenv(monkeypatch, GRAPHJIT_AR_ALGO=value).ar_algo == value.lower()


@pytest.mark.parametrize("value", ["3shot", "one", "1-shot"])
def test_bad_ar_algo_names_the_variable_and_the_choices(monkeypatch, value):
    monkeypatch.setenv("GRAPHJIT_AR_ALGO", value)
    with pytest.raises(graphjit.ConfigError, match=rf"GRAPHJIT_AR_ALGO='{value}': expected one of auto, 1shot, "
                                                   r"2shot"):
        graphjit.refresh_env()


def test_bad_value_keeps_the_previous_settings(monkeypatch):
    before = graphjit.env.settings()
    monkeypatch.setenv("GRAPHJIT_AR_MAX_BYTES", "big")
    with pytest.raises(graphjit.ConfigError, match=r"GRAPHJIT_AR_MAX_BYTES='big'"):
        graphjit.refresh_env()
    assert graphjit.env.settings() is before


def test_paths(monkeypatch, tmp_path):
    s = setenv(monkeypatch, GRAPHJIT_DUMP_DIR=str(tmp_path / "dots"), GRAPHJIT_CACHE_DIR="~/gj-cache",
               GRAPHJIT_NVCC="/opt/cuda/bin/nvcc")
    assert s.dump_dir == tmp_path / "dots"
    assert s.cache_dir == Path("~/gj-cache").expanduser()
    assert s.nvcc == "/opt/cuda/bin/nvcc"


# -- the table ---------------------------------------------------------------------------------------


def test_table_lists_every_variable_once():
    table = table_markdown()
    rows = table.splitlines()
    assert rows[0].startswith("| variable |") and set(rows[1]) <= set("|- ")
    assert len(rows) == 2 + len(VARIABLES)
    names = [re.match(r"\| `(GRAPHJIT_[A-Z_]+)` \|", row).group(1) for row in rows[2:]]
    assert names == [v.name for v in VARIABLES]
    for v, row in zip(VARIABLES, rows[2:]):
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        assert cells[2] == (v.default or "unset")
        assert cells[3] == v.doc


def test_every_documented_variable_is_in_the_table():
    documented = {"GRAPHJIT_DISABLE", "GRAPHJIT_DEBUG", "GRAPHJIT_STRICT", "GRAPHJIT_VERIFY", "GRAPHJIT_CHECK_OUTPUTS",
                  "GRAPHJIT_DUMP_DIR", "GRAPHJIT_MAX_GRAPHS", "GRAPHJIT_CUSTOM_AR", "GRAPHJIT_AR_ALGO",
                  "GRAPHJIT_AR_MAX_BYTES", "GRAPHJIT_CACHE_DIR", "GRAPHJIT_NVCC"}
    assert documented <= {v.name for v in VARIABLES}
    assert len({v.name for v in VARIABLES}) == len(VARIABLES)


def test_every_variable_the_package_mentions_is_in_the_table():
    known = {v.name for v in VARIABLES}
    mentioned = set()
    for path in PACKAGE.rglob("*.py"):
        mentioned |= set(re.findall(r"GRAPHJIT_[A-Z][A-Z0-9_]*", path.read_text(encoding="utf-8")))
    assert mentioned, "the scan found nothing: the pattern or the package path is wrong"
    assert mentioned <= known, f"not in graphjit.env.VARIABLES: {sorted(mentioned - known)}"


def test_only_env_py_reads_graphjit_variables():
    """Settings are parsed in env.py only (listing the environment, as a benchmark report does, is fine)."""
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "env.py" and path.parent == PACKAGE:
            continue
        text = path.read_text(encoding="utf-8")
        if re.search(r"""(environ\.get\(|environ\[|getenv\()\s*[fr]?["']GRAPHJIT_""", text):
            offenders.append(str(path.relative_to(PACKAGE)))
    assert offenders == []


def test_an_empty_variable_means_its_default(monkeypatch):
    """``GRAPHJIT_VERIFY_MAX_BYTES=`` (set, empty) was read as 0, which turned verify off for every key that writes
    state; an empty value is the default, as an unset one."""
    import graphjit.env as env

    for name in ("GRAPHJIT_VERIFY_MAX_BYTES", "GRAPHJIT_CACHE_DIR", "GRAPHJIT_DISABLE", "GRAPHJIT_LANE"):
        monkeypatch.setenv(name, " ")
    settings = env.refresh()
    assert settings.verify_max_bytes == 1 << 30
    assert str(settings.cache_dir) not in ("", ".") and not settings.disable and settings.lane == "auto"
