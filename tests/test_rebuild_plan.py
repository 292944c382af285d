"""``tree.rebuilder``: the output tree of a replay, planned once, gives what ``tree.rebuild`` gives (CPU).

A replay hands back its outputs through a plan made at capture: only the containers and the objects above a fresh
leaf are rebuilt; an object with no fresh leaf under it (a transformers cache handed back as the caller's own) is
returned as it is without a walk.  Checked here against the walk it replaces, on every mask of fresh leaves of
trees with containers of every kind, objects, a cycle and a repeated tensor.  An output that is one of the call's
own tensors or argument objects comes back as the call's own (``tree.places``), as an eager call returns it.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
from typing import Any, NamedTuple

import pytest

torch = pytest.importorskip("torch")

from graphjit.rebuild_plan import FRESH, KEEP, rebuilder  # noqa: E402
from graphjit.tree import collect_tensors, is_object, object_fields, places, rebuild  # noqa: E402

pytestmark = pytest.mark.torch


def is_tensor(x: Any) -> bool:
    return isinstance(x, torch.Tensor)


class Pair(NamedTuple):
    a: Any
    b: Any


@dataclasses.dataclass
class Layer:
    keys: Any
    values: Any
    length: int = 0


class Cache:
    def __init__(self, layers: list[Layer]) -> None:
        self.layers = layers
        self.name = "static"


class Slotted:
    __slots__ = ("extra", "t")

    def __init__(self, t: Any) -> None:
        self.t = t


class Output(collections.OrderedDict):  # a ModelOutput-like dict subclass
    pass


def trees() -> list[Any]:
    t = [torch.full((2,), float(i)) for i in range(6)]
    cache = Cache([Layer(t[1], t[2]), Layer(t[3], t[4], 5)])
    cyclic = Cache([Layer(t[0], t[5])])
    cyclic.me = cyclic  # type: ignore[attr-defined]
    fed = collections.defaultdict(list, {"x": [t[0], 3]})
    return [
        Output(logits=t[0], cache=cache),
        [t[0], (t[1], None), {"k": t[2], "s": "text"}, Pair(t[3], 7)],
        (cache, t[5]),
        {"slot": Slotted(t[0]), "deque": collections.deque([t[1], t[2]], maxlen=4), "fed": fed},
        [t[0], t[0], cyclic],  # one tensor twice; an object that holds itself
        Pair(a=[Layer(t[0], t[1])], b=collections.OrderedDict(z=t[2])),
    ]


def form(x: Any, originals: set[int], visiting: set[int] | None = None) -> Any:
    """What a caller can tell about a returned tree: its types, keys and values, which tensors it holds (by
    identity), which objects are the template's own, and that no container is the template's own."""
    visiting = set() if visiting is None else visiting
    if is_tensor(x):
        return ("tensor", id(x))
    if isinstance(x, dict):
        return (type(x), id(x) in originals, tuple((k, form(v, originals, visiting)) for k, v in x.items()),
                getattr(x, "default_factory", None))
    if isinstance(x, (list, tuple, collections.deque)):
        return (type(x), id(x) in originals, tuple(form(e, originals, visiting) for e in x),
                getattr(x, "maxlen", None))
    if is_object(type(x)):
        if id(x) in visiting:
            return ("cycle", type(x))
        visiting.add(id(x))
        out = (type(x), id(x) if id(x) in originals else None,
               tuple((n, form(v, originals, visiting)) for n, v in object_fields(x)))
        visiting.discard(id(x))
        return out
    return ("value", x)


def all_ids(x: Any, seen: set[int]) -> set[int]:
    if id(x) in seen:
        return seen
    seen.add(id(x))
    if isinstance(x, dict):
        for v in x.values():
            all_ids(v, seen)
    elif isinstance(x, (list, tuple, collections.deque)):
        for e in x:
            all_ids(e, seen)
    elif is_object(type(x)):
        for _n, v in object_fields(x):
            all_ids(v, seen)
    return seen


@pytest.mark.parametrize("index", range(len(trees())))
def test_the_plan_gives_what_the_walk_gives_for_every_mask(index: int) -> None:
    template = trees()[index]
    leaves = collect_tensors(template, is_tensor)
    originals = all_ids(template, set())
    before = form(template, set())
    distinct = list({id(t): t for t in leaves})  # a tensor at two places changes at both (one fresh tensor)
    for changes in itertools.product((False, True), repeat=len(distinct)):
        new = {i: torch.zeros(1) for i, changed in zip(distinct, changes) if changed}
        mask = [id(t) in new for t in leaves]
        fresh = list(new.values())
        full = [new.get(id(leaf), leaf) for leaf in leaves]
        want = rebuild(template, full, is_tensor)
        got = rebuilder(template, [FRESH if changed else KEEP for changed in mask], is_tensor)(fresh)
        assert form(got, originals) == form(want, originals), mask
    assert form(template, set()) == before  # the template itself is never changed


def test_an_untouched_object_is_returned_without_a_walk() -> None:
    """The cache of a decode step's output comes back as the caller's own object; the output dict is a new one."""
    template = trees()[0]
    plan = rebuilder(template, [FRESH, KEEP, KEEP, KEEP, KEEP], is_tensor)
    logits = torch.ones(2)
    template["cache"].layers.append("added after the plan")  # a plan does not walk the untouched object again
    out = plan([logits])
    assert type(out) is Output and out is not template
    assert out["logits"] is logits and out["cache"] is template["cache"]


def test_a_plan_with_no_fresh_leaf_still_copies_the_containers() -> None:
    template = trees()[1]
    out = rebuilder(template, [KEEP] * len(collect_tensors(template, is_tensor)), is_tensor)(())
    assert out is not template and out[2] is not template[2] and out[1] is not template[1]
    assert out[0] is template[0] and out[3].a is template[3].a


def test_inputs_and_argument_objects_come_back_as_the_calls_own() -> None:
    """The capture's arguments hold a cache; the output holds that cache, one of its tensors, and a fresh tensor.
    A later call of the same layout passes other objects: it gets its own cache object back (not the capture's,
    not a copy), its own tensor where an output was an input, and the fresh tensor it is given."""
    t = [torch.full((2,), float(i)) for i in range(4)]
    cache = Cache([Layer(t[0], t[1]), Layer(t[2], t[3], 5)])
    args, kwargs = (torch.zeros(1),), {"cache": cache}
    where = places(args, kwargs, is_tensor)
    assert where[id(cache)] == (("cache", None), 1, 5) and where[id(cache.layers[1])][0][-2:] == (
        (True, "layers"), (False, 1))
    template = Output(logits=torch.ones(3), cache=cache, keys=t[2])
    argument = lambda x, leaves: where[id(x)][0] if id(x) in where else None  # noqa: E731
    plan = rebuilder(template, [FRESH, 1, 2, 3, 4, 3], is_tensor, argument)
    other = Cache([Layer(torch.zeros(2), torch.zeros(2)), Layer(torch.zeros(2), torch.zeros(2))])
    call_tensors = [torch.zeros(1)] + [x for layer in other.layers for x in (layer.keys, layer.values)]
    logits = torch.zeros(3)
    out = plan([logits], call_tensors, ((call_tensors[0],), {"cache": other}))
    assert type(out) is Output and out["logits"] is logits
    assert out["cache"] is other and out["keys"] is other.layers[1].keys
    # without the call (verify compares the graph's own buffers): the template's tensors
    out = plan([logits])
    assert out["keys"] is t[2] and out["cache"].layers[1].keys is t[2] and out["cache"].layers[0].values is t[1]


def test_an_object_passed_twice_has_no_place() -> None:
    """The same object at two places of the capturing call: a later call may pass two objects there, so an output
    that is it cannot be said to be either; it is rebuilt as before (``places`` leaves it out)."""
    shared = Cache([Layer(torch.zeros(1), torch.zeros(1))])
    where = places((shared, shared), {}, is_tensor)
    assert id(shared) not in where and id(shared.layers) not in where


def test_a_place_a_later_call_does_not_have_falls_back_to_the_rebuild() -> None:
    """Where the call's own object cannot be found at its place (a call of the key built otherwise: an argument equal
    by an odd ``__eq__``), the output is rebuilt from the template as before, never an exception after the replay."""
    t = [torch.zeros(2), torch.ones(2)]
    cache = Cache([Layer(t[0], t[1])])
    where = places((), {"cache": cache}, is_tensor)
    argument = lambda x, leaves: where[id(x)][0] if id(x) in where else None  # noqa: E731
    plan = rebuilder((torch.ones(1), cache), [FRESH, 0, 1], is_tensor, argument)
    logits = torch.zeros(1)
    out = plan([logits], t, ((), {"other": cache}))  # no 'cache' in this call
    assert out[0] is logits and type(out[1]) is Cache and out[1].layers[0].keys is t[0]


def test_a_transformers_model_output_is_rebuilt_as_its_constructor_builds_it() -> None:
    """transformers' ``ModelOutput`` (an OrderedDict mirroring its non-None fields as attributes) is rebuilt from its
    state after the first call (its constructor took a third of a decode replay): each call a new object, the same
    keys, items and attributes as the constructor gives, the fresh tensor in both places, None fields as None."""
    outputs = pytest.importorskip("transformers.modeling_outputs")
    cache = Cache([])
    template = outputs.CausalLMOutputWithPast(logits=torch.zeros(2), past_key_values=cache)
    plan = rebuilder(template, [FRESH], is_tensor)
    made = []
    for i in range(3):
        logits = torch.full((2,), float(i))
        out = plan([logits])
        want = type(template)([(k, logits if k == "logits" else v) for k, v in template.items()])
        assert type(out) is type(template) and out is not template and all(out is not m for m in made)
        assert list(out.keys()) == list(want.keys()) and list(vars(out)) == list(vars(want))
        assert all(out[k] is want[k] for k in want.keys()) and all(getattr(out, k) is v for k, v in vars(want).items())
        assert out.logits is logits and out["logits"] is logits and out[0] is logits and out.loss is None
        assert out.to_tuple() == (logits, cache)
        made.append(out)
    assert template.logits is not logits and template["logits"] is template.logits  # the template is not touched


class _Stamped(dict):
    """A dict that refuses ``update`` (as ``ModelOutput`` does) and stamps each instance with a new object."""

    def __init__(self, items: Any = ()) -> None:
        super().__init__(items)
        self.stamp = object()

    def update(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("no update")


def test_a_dict_subclass_whose_constructor_makes_new_objects_keeps_its_constructor() -> None:
    """Where the state copy would share an object the constructor makes anew, the type keeps being rebuilt by its
    constructor: no two outputs share it."""
    template = _Stamped([("x", torch.zeros(1))])
    plan = rebuilder(template, [FRESH], is_tensor)
    first, second, third = (plan([torch.full((1,), float(i))]) for i in range(3))
    stamps = {id(first.stamp), id(second.stamp), id(third.stamp), id(template.stamp)}
    assert type(first) is _Stamped and len(stamps) == 4
    assert [float(o["x"]) for o in (first, second, third)] == [0.0, 1.0, 2.0]


class _Slotted(dict):
    __slots__ = ("__dict__", "mark")

    def __init__(self, items: Any = ()) -> None:
        super().__init__(items)
        self.mark = "set by the constructor"
        self.note = None  # an attribute of its own, the same object every time: only the slot tells a copy apart


def test_a_dict_subclass_with_slots_keeps_its_constructor() -> None:
    """A slot's value is neither an item nor an attribute of ``__dict__``: such a type is never state-copied."""
    template = _Slotted([("x", torch.zeros(1))])
    plan = rebuilder(template, [FRESH], is_tensor)
    for i in range(3):
        out = plan([torch.full((1,), float(i))])
        assert type(out) is _Slotted and out.mark == "set by the constructor" and float(out["x"]) == i


class _Aliased(dict):
    """A dict that refuses ``update`` and keeps its item under an attribute of another name."""

    def __init__(self, items: Any = ()) -> None:
        super().__init__(items)
        self.main = self["a"]

    def update(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("no update")


def _aliased_model_output() -> Any:
    outputs = pytest.importorskip("transformers.utils")

    @dataclasses.dataclass
    class Scored(outputs.ModelOutput):
        a: Any = None

        def __post_init__(self) -> None:
            super().__post_init__()
            object.__setattr__(self, "main", self.a)  # the field again, under another name

    return Scored


@pytest.mark.parametrize("kind", ["dict", "model_output"])
def test_an_output_whose_constructor_keeps_an_item_under_another_name_is_built_by_it(emu, kind) -> None:
    """The first replay hands back the graph's own buffers: a copy of the template would then look right and later
    hand out the buffer the next replay overwrites.  Such types keep their constructor: each output's attribute is its
    own item."""
    import graphjit

    scored = _aliased_model_output() if kind == "model_output" else None
    g = graphjit.graphed(lambda x: _Aliased([("a", x * 2)]) if scored is None else scored(a=x * 2), warmup=1)
    outs = [g(torch.full((2,), float(v))) for v in range(1, 5)]
    assert g.stats()["replays"] >= 2
    for v, out in zip(range(1, 5), outs):
        assert out.main is out["a"] and out["a"].tolist() == [2.0 * v] * 2


def test_a_plain_model_output_is_state_copied_and_others_are_not() -> None:
    outputs = pytest.importorskip("transformers.modeling_outputs")
    from graphjit.tree import plain_model_output as _plain_model_output

    assert _plain_model_output(outputs.CausalLMOutputWithPast) and _plain_model_output(outputs.Seq2SeqLMOutput)
    assert not _plain_model_output(_aliased_model_output()) and not _plain_model_output(_Aliased)
    assert not _plain_model_output(_Stamped) and not _plain_model_output(collections.OrderedDict)


def test_a_model_output_with_keyword_only_fields_is_rebuilt(emu) -> None:
    """Its constructor takes no items positionally and ``ModelOutput`` refuses ``update``: it is made from the items as
    keywords, then state-copied (it used to raise SignatureError after the replay)."""
    import graphjit

    outputs = pytest.importorskip("transformers.utils")

    @dataclasses.dataclass(kw_only=True)
    class KwOnly(outputs.ModelOutput):
        logits: Any = None
        loss: Any = None

    g = graphjit.graphed(lambda x: KwOnly(logits=x * 2), warmup=1)
    outs = [g(torch.full((2,), float(v))) for v in range(1, 5)]
    assert g.stats()["replays"] >= 2
    for v, out in zip(range(1, 5), outs):
        assert type(out) is KwOnly and list(out.keys()) == ["logits"] and out.loss is None
        assert out.logits is out["logits"] and out.logits.tolist() == [2.0 * v] * 2
    assert len({id(o.logits) for o in outs}) == 4
