"""A dict subclass's own attributes and one container met twice, in a graphed call's outputs and arguments (CPU, the
graph emulator and the replay lane's C check).

transformers' ``ModelOutput`` keeps each field that is not None as an item and as an attribute (a mirror); an
attribute set after construction (``out.extra = t``), or a field set to None after it (its item stays), lives in its
``__dict__`` alone.  Every replay must hand back what the eager call gives: those attributes with this call's values,
an object made anew by the constructor still the instance's own, and an output container returned twice (``return
out, out``) one object.  As an argument, such an attribute is keyed and its tensors fed like an object's: a call
that changes one is signed again (by the walk, the C check refusing it), never replayed with the old value.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import graphjit  # noqa: E402
from graphjit.keys import Signer  # noqa: E402
from graphjit.rebuild_plan import FRESH, KEEP, rebuilder  # noqa: E402
from graphjit.tree import MIRROR, collect_tensors, dict_attrs, structure  # noqa: E402

pytestmark = pytest.mark.torch


def is_tensor(x: Any) -> bool:
    return isinstance(x, torch.Tensor)


def _outputs() -> Any:
    return pytest.importorskip("transformers.modeling_outputs")


def test_dict_attrs_tells_mirrors_from_attributes_of_their_own() -> None:
    out = _outputs().CausalLMOutputWithPast(logits=torch.zeros(2))
    fields = [f.name for f in dataclasses.fields(out)]
    assert dict_attrs(out) == [(f, MIRROR if f == "logits" else None) for f in fields]
    out.extra = t = torch.ones(1)
    out.logits = None  # an attribute now; the item stays (ModelOutput sets an item only for a value)
    assert dict_attrs(out)[1] == ("logits", None) and dict_attrs(out)[-1][1] is t
    assert dict_attrs({"a": 1}) == [] and dict_attrs(collections_ordered()) == []


def collections_ordered() -> Any:
    import collections

    return collections.OrderedDict(a=1)


def _eager_and_graphed(fn: Any, calls: int = 5) -> list[tuple[Any, Any]]:
    g = graphjit.graphed(fn, warmup=1)
    pairs = []
    for v in range(1, calls + 1):
        x = torch.full((3,), float(v))
        pairs.append((g(x), fn(x)))
    assert g.stats()["replays"] >= 2, g.report()
    return pairs


def _same(got: Any, want: Any) -> None:
    """The same output: type, items, attributes (a tensor by value, anything else by identity or equality)."""
    assert type(got) is type(want)
    assert list(got.keys()) == list(want.keys())
    for k in want.keys():
        assert torch.equal(got[k], want[k])
    assert list(vars(got)) == list(vars(want))
    for name, w in vars(want).items():
        g = vars(got)[name]
        assert (w is None and g is None) or (is_tensor(w) and torch.equal(g, w)) or (not is_tensor(w) and g == w), name
        assert (g is got[name]) == (w is want[name]) if name in want.keys() else True, name  # mirrors stay mirrors


def test_an_attribute_set_after_construction_comes_back_with_each_replays_value(emu) -> None:
    outputs = _outputs()

    def step(x: Any) -> Any:
        out = outputs.CausalLMOutputWithPast(logits=x * 2)
        out.extra = x + 1
        out.note = "set after"
        return out

    for got, want in _eager_and_graphed(step):
        _same(got, want)
        assert got.extra is not want.extra


def test_a_field_set_to_none_after_construction_stays_none_and_keeps_its_item(emu) -> None:
    outputs = _outputs()

    def step(x: Any) -> Any:
        out = outputs.CausalLMOutputWithPast(loss=x.sum(), logits=x * 2)
        out.loss = None  # ModelOutput leaves the item: out["loss"] is still the tensor, out.loss is None
        return out

    for got, want in _eager_and_graphed(step):
        _same(got, want)
        assert got.loss is None and torch.equal(got["loss"], want["loss"])


@dataclasses.dataclass
class _Holder:
    t: Any


@pytest.mark.parametrize("kind", ["list", "dict", "model_output", "object"])
def test_an_output_returned_twice_is_one_object_in_every_replay(emu, kind) -> None:
    outputs = _outputs()

    def make(x: Any) -> Any:
        y = x * 3
        return {"list": lambda: [y], "dict": lambda: {"y": y},
                "model_output": lambda: outputs.BaseModelOutput(last_hidden_state=y),
                "object": lambda: _Holder(y)}[kind]()

    def step(x: Any) -> Any:
        out = make(x)
        return out, [out, x + 1]

    for got, want in _eager_and_graphed(step):
        assert got[0] is got[1][0] and want[0] is want[1][0]
        assert torch.equal(collect_tensors(got, is_tensor)[0], collect_tensors(want, is_tensor)[0])
        assert torch.equal(got[1][1], want[1][1])


def test_a_container_met_twice_with_other_leaves_is_not_shared() -> None:
    """A plan shares one container's rebuild only where both places take the same leaves (a tensor kept at one place
    and fresh at the other keeps two objects)."""
    t = torch.zeros(1)
    inner = [t]

    plan = rebuilder((inner, inner), [FRESH, KEEP], is_tensor)
    a, b = plan([torch.ones(1)])
    assert a is not b and a[0] is not t and b[0] is t
    shared = rebuilder((inner, inner), [FRESH, FRESH], is_tensor)
    for v in range(3):
        a, b = shared([torch.full((1,), float(v))])
        assert a is b and float(a[0]) == v


class _Stamped(dict):
    def __init__(self, items: Any = ()) -> None:
        super().__init__(items)
        self.stamp = object()  # made anew for each instance: each output has its own

    def update(self, *args: Any, **kwargs: Any) -> None:  # as ModelOutput: rebuilt by its constructor
        raise TypeError("no update")


def test_an_attribute_the_constructor_makes_anew_stays_each_outputs_own_while_others_follow_the_template() -> None:
    template = _Stamped([("x", torch.zeros(1))])
    template.later = torch.zeros(2)  # set after construction: the plan's
    plan = rebuilder(template, [FRESH, FRESH], is_tensor)
    made = [plan([torch.full((1,), float(v)), torch.full((2,), float(v))]) for v in range(3)]
    assert len({id(m.stamp) for m in made} | {id(template.stamp)}) == 4
    assert [float(m["x"]) for m in made] == [0.0, 1.0, 2.0] and [m.later.tolist() for m in made][2] == [2.0, 2.0]


def test_structure_tells_an_attribute_apart() -> None:
    outputs = _outputs()
    a, b = outputs.BaseModelOutput(last_hidden_state=torch.zeros(1)), outputs.BaseModelOutput(
        last_hidden_state=torch.zeros(1))
    assert structure(a, is_tensor) == structure(b, is_tensor)
    b.extra = 1
    assert structure(a, is_tensor) != structure(b, is_tensor)


def _read_extra(x: Any, enc: Any) -> Any:
    return enc.last_hidden_state * x + (enc.extra if getattr(enc, "extra", None) is not None else 0)


def test_an_argument_attribute_is_keyed_and_fed(emu) -> None:
    """An attribute of a dict-subclass argument is part of the key and, a tensor, an input of the graph: a later
    call's own value is read, never the capture's."""
    outputs = _outputs()
    g = graphjit.graphed(_read_extra, warmup=1)
    for v in range(1, 6):
        enc = outputs.BaseModelOutput(last_hidden_state=torch.full((2,), float(v)))
        enc.extra = torch.full((2,), 10.0 * v)
        x = torch.full((2,), 2.0)
        assert torch.equal(g(x, enc), _read_extra(x, enc)), v
    assert g.stats()["replays"] >= 2
    plain = outputs.BaseModelOutput(last_hidden_state=torch.ones(2))
    assert torch.equal(g(torch.ones(2), plain), torch.ones(2))  # no extra: another key, not the first graph


def _signers() -> tuple[Signer, Signer]:
    fast = Signer(_read_extra, None, "auto", "f")
    reference = Signer(_read_extra, None, "auto", "f")
    reference.layout_checks = False
    return fast, reference


def _mutations() -> list[Any]:
    def add_tensor(enc: Any) -> None:
        enc.extra = torch.zeros(2)

    def break_mirror(enc: Any) -> None:
        vars(enc)["last_hidden_state"] = torch.zeros(2)  # the attribute is no longer the item

    def field_to_none(enc: Any) -> None:
        enc.last_hidden_state = None

    def scalar(enc: Any) -> None:
        enc.hidden_states = 3

    def shape(enc: Any) -> None:
        enc["last_hidden_state"] = enc.last_hidden_state = torch.zeros(3)

    return [add_tensor, break_mirror, field_to_none, scalar, shape]


@pytest.mark.parametrize("mutate", _mutations(), ids=lambda f: f.__name__)
def test_the_c_check_serves_a_model_output_argument_and_refuses_any_change_of_its_attributes(lane_on, mutate) -> None:
    """T5's decode steps pass ``encoder_outputs``, a ``BaseModelOutput`` whose None fields are attributes only: the C
    check serves those calls, and gives the walk's key and tensors after any change of an attribute."""
    outputs = _outputs()
    fast, reference = _signers()
    enc = outputs.BaseModelOutput(last_hidden_state=torch.ones(2))
    x = torch.ones(2)

    def both() -> int:
        checks = [c[0] for c in fast._walked]
        before = sum(getattr(c, "served", 0) for c in checks)
        got, want = fast.sign(None, (x, enc), {}), reference.sign(None, (x, enc), {})
        assert got.key == want.key and [id(t) for t in got.tensors] == [id(t) for t in want.tensors]
        return before

    for _ in range(3):
        both()
    assert fast._walked, "the walked call has its C check"
    check = fast._walked[0][0]
    served = []
    original = check

    def counted(*a: Any) -> Any:
        out = original(*a)
        served.append(out is not None)
        return out

    fast._walked = ((counted, *fast._walked[0][1:]), *fast._walked[1:])
    both()
    assert served == [True]
    mutate(enc)
    both()
    assert served[-1] is False, "a changed attribute is refused by the C check"


def test_containers_met_twice_inside_each_other_take_slots_of_their_own(emu) -> None:
    """``b = (a,); return b, b, a``: both ``b`` and the ``a`` inside it are met twice; each is one object in every
    replay, of its own type (a slot given to the outer one first was given again to the inner one)."""

    def step(x: Any) -> Any:
        a = [x * 2]
        b = (a,)
        return b, b, a

    g = graphjit.graphed(step, warmup=1, verify=False)
    for v in range(1, 5):
        got = g(torch.full((2,), float(v)))
        assert type(got[2]) is list and got[0] is got[1] and got[0][0] is got[2]
        assert got[2][0].tolist() == [2.0 * v] * 2
    assert g.stats()["replays"] >= 2


def _aux_output() -> Any:
    outputs = pytest.importorskip("transformers.utils")

    @dataclasses.dataclass
    class WithAux(outputs.ModelOutput):
        h: Any = None

        def __post_init__(self) -> None:
            super().__post_init__()
            self.aux = []  # a new list for each instance: made anew

    return WithAux


def test_an_attribute_the_constructor_makes_anew_keeps_what_the_call_put_in_it(emu) -> None:
    """An attribute made anew by the constructor keeps the constructor's own only where nothing of the graph's is
    under it; a list the call filled with a tensor comes back with each replay's tensor (as output and argument)."""
    with_aux = _aux_output()

    def step(x: Any) -> Any:
        out = with_aux(h=x * 2)
        out.aux.append(x + 1)
        return out

    g = graphjit.graphed(step, warmup=1)
    for v in range(1, 5):
        x = torch.full((3,), float(v))
        got = g(x)
        assert len(got.aux) == 1 and got.aux[0].tolist() == [v + 1.0] * 3
    assert g.stats()["replays"] >= 2

    def read(x: Any, enc: Any) -> Any:
        return x * enc.h + enc.aux[0]

    r = graphjit.graphed(read, warmup=1)
    for v in range(1, 5):
        enc = with_aux(h=torch.full((2,), float(v)))
        enc.aux.append(torch.full((2,), 100.0 * v))
        assert r(torch.ones(2), enc).tolist() == [101.0 * v] * 2
    assert r.stats()["replays"] >= 2


class _Numbered(dict):
    count = 0

    def __init__(self, items: Any = ()) -> None:
        super().__init__(items)
        type(self).count += 1
        self.uid = type(self).count  # a new value for each instance

    def update(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("no update")


def test_an_output_whose_constructor_stamps_each_instance_is_graphed(emu) -> None:
    """Verify compares such an attribute by its type: each output is its own instance, as eager's are."""
    g = graphjit.graphed(lambda x: _Numbered([("x", x * 2)]), warmup=1)
    outs = [g(torch.full((2,), float(v))) for v in range(1, 5)]
    assert g.stats()["replays"] >= 2, g.report()
    assert len({o.uid for o in outs}) == 4 and [o["x"].tolist() for o in outs][3] == [8.0, 8.0]


def test_an_attribute_holding_an_equals_sign_is_no_mirror(emu) -> None:
    def step(x: Any) -> Any:
        out = _Plain(h=x * 2)
        out.op = "".join(["="])  # CPython's one-character strings are one object
        return out

    g = graphjit.graphed(step, warmup=1)
    for v in range(1, 4):
        got = g(torch.full((2,), float(v)))
        assert got.op == "=" and got["h"].tolist() == [2.0 * v] * 2
    assert g.stats()["replays"] >= 1


class _Plain(dict):
    pass


def test_the_c_check_refuses_a_value_attribute_that_became_a_mirror(lane_on) -> None:
    def read(x: Any, d: Any) -> Any:
        return d["t"] * x

    fast, reference = Signer(read, None, "auto", "f"), Signer(read, None, "auto", "f")
    reference.layout_checks = False
    d = _Plain(t=torch.ones(2), n=10**6)
    d.n = int("1000000")  # equal to the item, another object: an attribute of its own
    x = torch.ones(2)
    for _ in range(3):
        assert fast.sign(None, (x, d), {}).key == reference.sign(None, (x, d), {}).key
    assert fast._walked
    d.n = d["n"]  # the item itself now: the walk keys a mirror
    assert fast.sign(None, (x, d), {}).key == reference.sign(None, (x, d), {}).key
