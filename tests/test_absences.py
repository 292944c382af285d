"""What code may find absent (graphjit/names.py ``code_probes``) and where the guards keep it absent
(graphjit/absences.py); the end-to-end cases are the ``probed_*`` ones of tests/guard_cases.py."""

from __future__ import annotations

import os

from graphjit import guards
from graphjit.names import code_probes

FLAG = "GRAPHJIT_TEST_ABSENCES_FLAG"


def _code(o, d):
    a = getattr(o, "scale", 1.0)
    b = hasattr(o.cfg, "flag")
    c = d.get("k", 2)
    e = "z" in o.opts
    g = os.environ.get(FLAG)
    h = d.pop("p", None)
    i = "v" in o.opts.keys()  # as code in the wild writes it
    return a, b, c, e, g, h, i, UNDEFINED_GLOBAL if "q" not in d else None  # noqa: F821


def test_code_probes_finds_lookups_with_a_fallback_and_loaded_globals():
    p = code_probes(_code.__code__)
    assert p.attributes == {"scale", "flag"}
    assert {"k", "z", "p", "q", "v"} <= p.keys
    assert "FLAG" in p.key_names
    assert {"os", "UNDEFINED_GLOBAL", "getattr", "hasattr"} <= p.globals


def test_sources_keep_an_undefined_global_and_an_unset_environment_variable_absent(monkeypatch):
    monkeypatch.delenv(FLAG, raising=False)
    src = guards.sources(_code, None)
    absent = {(id(c), k) for c, k, _p in src.absent}
    assert (id(globals()), "UNDEFINED_GLOBAL") in absent
    assert (id(os.environ), FLAG) in absent
    assert (id(globals()), "getattr") not in absent  # a builtin


def test_a_set_environment_variable_the_code_reads_is_a_guarded_value(monkeypatch):
    monkeypatch.setenv(FLAG, "1")
    src = guards.sources(_code, None)
    assert any(c is os.environ and k == FLAG for c, _kind, k, _p in src.slots)


class _Obj:
    def __init__(self):
        self.opts = {}
        self.cfg = _Cfg()


class _Cfg:
    pass


def _kept_absent(out: guards.Scan) -> set[str]:
    """``path.name`` (an object's) and ``path['key']`` (a dict's) of each name the scan keeps absent; each dict's names
    are checked by one ``isdisjoint`` (``named_wholes``: ``absent``, ``absent keys``), True at the scan."""
    kept = set()
    for _d, names, path, keys in out.absent.values():
        kept |= {f"{guards.describe(path)}[{n!r}]" if keys else f"{guards.describe(path)}.{n}" for n in names}
    checks = [e for e in out.named_wholes() if e[0].startswith("absent")]
    assert checks and all(getter(container) is True for _w, container, getter, _v, _p in checks)
    return kept


def test_a_scan_guards_the_probed_names_an_object_and_a_settings_dict_lack():
    """With the names that ran known (here: none of the objects was an argument of the code that ran), a name looked up
    by getattr on an object below the roots and a key looked up in a dict of settings are kept absent; where they are
    not known, only the roots' are (the object below is not guarded: a limit, said in the docstring)."""
    o = _Obj()

    def fn(x):
        return x * getattr(o.cfg, "scale", 1.0) * o.opts.get("k", 1.0)

    src = guards.sources(fn, None)
    known = _kept_absent(guards.scan(src, lambda v: False, set(), by_object={}))
    assert {"closure variable 'o'.opts['k']", "closure variable 'o'.cfg.scale"} <= known
    unknown = _kept_absent(guards.scan(src, lambda v: False, None))
    assert "closure variable 'o'.opts['k']" in unknown and "closure variable 'o'.cfg.scale" not in unknown


def test_a_name_the_object_has_is_a_value_not_an_absence():
    o = _Obj()
    o.cfg.scale = 2.0

    def fn(x):
        return x * getattr(o.cfg, "scale", 1.0)

    out = guards.scan(guards.sources(fn, None), lambda v: False, set(), by_object={})
    assert "closure variable 'o'.cfg.scale" not in _kept_absent(out)


def test_an_environment_variable_is_guarded_where_os_environ_keeps_it(monkeypatch):
    """An absent and a present environment variable are checked in the dict ``os.environ`` reads and writes through
    (one C lookup each, not the mapping's Python methods), and both guards see a change made through ``os.environ``."""
    other = FLAG + "_SET"
    monkeypatch.delenv(FLAG, raising=False)
    monkeypatch.setenv(other, "1")

    def fn(x):
        return x * (2.0 if os.environ.get(FLAG) else 1.0) * float(os.environ.get(other, "0"))

    guard = guards.GuardSet(guards.scan(guards.sources(fn, None), lambda v: False, set(), by_object={}))
    at = {guards.describe(p): c for c, paths in zip(guard.containers, guard.paths) for p in paths}
    for name in (FLAG, other):
        found = [c for p, c in at.items() if f"os.environ[{name!r}]" in p]
        assert found and all(type(c) is dict for c in found), at  # os.environ's own dict, not the mapping
    assert guard.holds()
    monkeypatch.setenv(FLAG, "1")
    assert not guard.holds() and FLAG in guard.change()[0]
    monkeypatch.delenv(FLAG)
    assert guard.holds()
    monkeypatch.setenv(other, "2")
    assert not guard.holds() and other in guard.change()[0]
    assert guard.change()[1:] == ("'1'", "'2'")  # shown as os.environ gives them (str), not as kept (bytes)
