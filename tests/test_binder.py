"""``keys.Binder``: a call's arguments put in parameter order with the defaults applied, equal to what ``inspect``
binds for every signature and call, the fast paths (plain parameters, plain parameters and ``**kwargs``) included;
a call that does not bind is passed on as it is, for the function to raise Python's own error."""

from __future__ import annotations

import inspect
import itertools
import random

import pytest

from graphjit.keys import Binder, Signer

EMPTY = inspect.Parameter.empty


def _reference(sig, args, kwargs):
    try:
        bound = sig.bind(*args, **kwargs)
    except TypeError:
        return args, kwargs
    bound.apply_defaults()
    return bound.args, bound.kwargs


def _signature(rng, varkw):
    params = []
    for i in range(rng.randint(0, 5)):
        default = EMPTY if rng.random() < 0.4 and all(p.default is EMPTY for p in params) else i * 10
        params.append(inspect.Parameter(f"p{i}", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default))
    if varkw:
        params.append(inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD))
    return inspect.Signature(params)


@pytest.mark.parametrize("varkw", [False, True])
def test_binding_equals_inspect_for_every_call_of_random_signatures(varkw):
    rng = random.Random(varkw)
    checked = 0
    for _ in range(300):
        sig = _signature(rng, varkw)
        names = [p.name for p in sig.parameters.values() if p.kind is p.POSITIONAL_OR_KEYWORD]
        binder = Binder(sig)
        pool = [*names, "extra", "kwargs", "other"]
        for n_args in range(len(names) + 2):
            for k in range(3):
                for chosen in itertools.combinations(pool, k):
                    args = tuple(f"a{i}" for i in range(n_args))
                    kwargs = {name: f"k_{name}" for name in rng.sample(chosen, len(chosen))}  # any order
                    got = binder.bind(False, args, kwargs)
                    assert got == _reference(sig, args, kwargs), (sig, args, kwargs)
                    assert list(got[1]) == list(_reference(sig, args, kwargs)[1])  # the extras in the call's order
                    checked += 1
    assert checked > 10_000


def test_a_method_binds_without_self_and_a_hugging_face_forward_binds_its_keywords():
    class Model:
        def forward(self, input_ids=None, attention_mask=None, past_key_values=None, use_cache=None,
                    logits_to_keep=0, **kwargs):
            return input_ids

    binder = Binder(inspect.signature(Model.forward))
    args, kwargs = binder.bind(True, (), {"input_ids": 1, "past_key_values": 2, "use_cache": True,
                                          "return_dict": True})
    assert args == (1, None, 2, True, 0) and kwargs == {"return_dict": True}
    assert binder.bind(True, (1,), {"input_ids": 1}) == ((1,), {"input_ids": 1})  # two values: Python says so
    assert binder.bind(True, (1, 2, 3, 4, 5, 6), {}) == ((1, 2, 3, 4, 5, 6), {})  # too many: passed on


def test_other_signatures_bind_as_inspect_does():
    def f(a, /, b, *args, c=3, **kw):
        return a

    binder = Binder(inspect.signature(f))
    for args, kwargs in [((1, 2), {}), ((1,), {"b": 2, "c": 4, "z": 5}), ((1, 2, 3, 4), {}), ((), {"a": 1})]:
        assert binder.bind(False, args, kwargs) == _reference(inspect.signature(f), args, kwargs)


def test_a_wrapper_that_renames_a_keyword_gets_its_call_as_written():
    """A decorator's wrapper (``functools.wraps``) reads its keywords by name: transformers renames a deprecated
    ``past_key_values=`` to ``cache=``.  The signature ``inspect`` reports is the wrapped function's; bound with
    defaults applied, the call would pass ``cache`` twice.  graphed passes such a call as written."""
    import functools

    def renaming(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if "past_key_values" in kwargs:
                kwargs["cache"] = kwargs.pop("past_key_values")
            return fn(*args, **kwargs)

        return wrapper

    class Model:
        @renaming
        def forward(self, input_ids=None, cache=None, **kwargs):
            return (input_ids, cache, kwargs)

    m = Model()
    want = m.forward(input_ids=1, past_key_values="c")
    assert want == (1, "c", {})
    binder = Signer(m.forward, None, "auto", "forward").binder
    for args, kwargs in [((), {"input_ids": 1, "past_key_values": "c"}), ((1,), {"cache": "c"})]:
        assert binder.bind(False, args, kwargs) == (args, kwargs)
        assert m.forward(*args, **kwargs) == want
    assert Signer(Model.forward.__wrapped__, None, "auto", "forward").binder.bind(False, ("m", 1), {}) == (
        ("m", 1, None), {})  # the function itself binds as before


def test_defaults_replaced_after_the_first_call_are_the_ones_applied():
    """``f.__defaults__`` replaced, ``f.__kwdefaults__`` changed in place: a call that omits them gets the current
    values, as Python gives them.  Before, the binder applied the defaults it read when the function was wrapped,
    so every call that omitted them (eager runs included) got the old ones."""

    def f(x, scale=2.0, *, shift=0.0):
        return x * scale + shift

    binder = Binder(inspect.signature(f), f)
    assert binder.bind(False, (1.0,), {}) == ((1.0, 2.0), {"shift": 0.0})
    f.__defaults__ = (3.0,)
    assert binder.bind(False, (1.0,), {}) == ((1.0, 3.0), {"shift": 0.0})
    f.__kwdefaults__["shift"] = 1.0
    assert binder.bind(False, (1.0,), {}) == ((1.0, 3.0), {"shift": 1.0})


def test_a_graphed_function_whose_default_changed_runs_and_replays_the_new_value(emu):
    """Through ``@graphed`` (graph emulator): the default is part of the key as the binder applies it, so a replaced
    default is a new key whose graph replays the new value, lane or not."""
    torch = pytest.importorskip("torch")
    import graphjit

    w = torch.randn(4, 4)

    def step(x, scale=2.0, *, shift=0.0):
        return (x @ w) * scale + shift

    g = graphjit.graphed(step)
    x = torch.randn(4, 4)
    with torch.no_grad():
        for i in range(12):
            if i == 5:
                step.__defaults__ = (3.0,)
            if i == 8:
                step.__kwdefaults__["shift"] = 1.0
            torch.testing.assert_close(g(x), step(x), rtol=0, atol=0)
    assert g.stats()["graphs"] == 3, g.report()
