"""The key of a call: which captured graph, if any, can serve it.

A key holds the tree structure of the positional and keyword arguments (lists, tuples, dicts, and
objects that hold tensors, walked attribute by attribute: see :mod:`graphjit.tree`), the framework
modes of the call (grad mode, inference mode, autocast / AMP: ``Backend.modes``) and, for each leaf:

* a tensor: shape (after bucket padding), dtype, device and whether it requires grad;
* any other value: its type and the value itself, which must be hashable (a new value is a new key, because the
  graph froze the old one).  Inside an object, an unhashable leaf is keyed by identity, as a value the function
  closes over would be.  An object whose class is unhashable (``__hash__ = None``, a dataclass with ``eq`` and
  without ``frozen``) is walked only when it holds tensors; passed directly without any, it is refused like any
  other unhashable value.  A ``ContextVar`` or a ``threading.local``: by what the calling context or thread holds.

Bucket padding: a dimension listed in ``buckets`` is rounded up to the next bucket size, so calls of nearby sizes
share one graph.  A size beyond the largest bucket is reported in :attr:`CallSignature.overflow` (the caller runs it
uncaptured, or raises in strict mode).  :meth:`Signer.sign` is on the replay hot path (a C check where it can).
"""

from __future__ import annotations

import bisect
import collections
import inspect
from collections.abc import Callable, Sequence
from typing import Any

from . import backends, bucket_spec, context_values, env, guardable, lane, sign_checks, walk_spec
from .backends.base import Backend
from .binder import Binder, wraps_another
from .bucket_spec import Pad
from .errors import SignatureError
from .tree import MIRROR, Attr, dict_attrs, is_object, object_fields, rebuild, rebuild_call, subscripts

_zero = walk_spec.part  # read once: looked up on the hot path
_SCALARS = frozenset((int, float, bool, str, bytes, type(None), complex))
TENSOR_MARK = ("<tensor>",)
"""A tensor's place in a plain call's layout (:meth:`Signer.sign_plain`); its metadata is the check's."""
_TENSOR = TENSOR_MARK
_MISSING = object()
WALK_CHECKS = 2
"""Walked keys a signer keeps a C check for (a generate() loop's prefill and decode step take turns)."""
MAX_NESTING = 256  # containers in containers: deeper (or one that holds itself) is a SignatureError

BucketsArg = bucket_spec.BucketsArg


class Key(tuple):  # type: ignore[type-arg]
    """A call's key: a tuple whose hash is computed once.  Its parts hash slowly for some frameworks
    (a Paddle dtype hashes in about 0.5 us), and a call that has no graph looks its key up several times."""

    _hash: int

    def __new__(cls, parts: Sequence[Any]) -> Key:
        key = super().__new__(cls, parts)
        key._hash = tuple.__hash__(key)
        return key

    def __hash__(self) -> int:
        return self._hash


_NO_DYNAMIC: dict[str, Any] = {}


class CallSignature:
    """What :meth:`Signer.sign` found in one call.  Built on every call: only the key, the tensors, the backend, the
    labels and the signer are set there (slots); what few calls have (pads, dynamic arguments, guarded values) is the
    class's default until a call sets its own."""

    __slots__ = ("__dict__", "backend", "key", "labels", "signer", "tensors")

    pads: tuple[Pad, ...] = ()  # bucketed dims of this call that are padded: real < padded
    overflow: str | None = None
    bucketed: tuple[tuple[int, int, int], ...] = ()  # (leaf, dim, padded size) of every bucketed dim
    dynamic: dict[str, Any] = _NO_DYNAMIC  # the call's dynamic arguments (graphjit.dynamic), by name
    _paths: list[str] | None = None
    base: tuple[Any, ...] | None = None  # a key for other guarded values: the key of the arguments
    guarded: dict[str, str] | None = None  # and the values (path -> value) that tell it apart

    def __init__(self, key: tuple[Any, ...], tensors: list[Any], backend: Backend | None,
                 labels: list[tuple[Any, ...]], signer: Signer | None = None) -> None:
        self.key = key
        self.tensors = tensors
        self.backend = backend
        self.labels = labels  # raw; formatted on demand by .paths
        self.signer = signer

    def for_values(self, key: tuple[Any, ...], guarded: dict[str, str]) -> CallSignature:
        """This call's signature under ``key``: the key of the same arguments with other values of what the
        function reads (:mod:`graphjit.guards`); ``guarded`` names those values."""
        sig = CallSignature(key, self.tensors, self.backend, self.labels, self.signer)
        sig.__dict__.update(self.__dict__)  # its pads, dynamic arguments and paths, where it has its own
        sig.base = self.key if self.base is None else self.base
        sig.guarded = guarded
        return sig

    @property
    def paths(self) -> list[str]:
        """Human-readable names of the tensor leaves ("argument 'x'", "argument 'kv'[1]", ...)."""
        if self._paths is None:
            fmt = self.signer.describe if self.signer is not None else str
            self._paths = [fmt(label) for label in self.labels]
        return self._paths


class Signer:
    """Computes :class:`CallSignature` for calls of one function.

    Refuses (``ConfigError``, at decoration time) bucket specifications that name a parameter the
    function does not have, a dimension that is not an integer (negative dims count from the end), or
    sizes that are not positive integers or repeat one.  Refuses (``SignatureError``, at call time)
    unhashable non-tensor arguments, tensors of two frameworks in one call, and bucketed tensors with
    fewer dimensions than the bucket names.  A bucketed argument that is not a tensor (an optional
    ``mask=None``) is keyed as a plain argument.

    ``owner``: the object every call is bound to (a graphed Layer/Module object), whose ``training``
    flag is part of the key, as it is for the instance of a method call.
    """

    layout_checks = True  # False (set before the first call): the lane's C check is never made (benchmarks)

    def __init__(self, fn: Callable[..., Any], buckets: BucketsArg, backend: str, fn_name: str,
                 owner: Any = None) -> None:
        self.fn_name = fn_name
        self.forced_backend = backend
        self.owner = owner
        self._plain: tuple[Any, ...] | None = None  # the last plain call (sign_plain)
        # its layout checked in one C call (lane.layout_check): (check, probe type, backend, key, labels, the
        # settings it was made under); None: not made yet, False: none for this layout
        self._fast: Any = None  # a tuple, False or None
        # walked calls' structures checked in one C call each (lane.walk_check, walk_spec.py), the one that served
        # last first: (check, key, labels, backend, probe type, settings) for up to WALK_CHECKS keys; the key of the
        # last walk, which makes one where it repeats; the last such key a check was tried for (by identity)
        self._walked: tuple[Any, ...] = ()
        self._walk_key: Any = None
        self._walk_tried: Any = None
        self._free_tried: Any = None  # the counters' key paths a check was last tried for
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError):
            sig = None
        self.binder = Binder(sig if not wraps_another(fn) else None, fn)
        self.signature = sig
        self._positional: list[str] = []
        self._has_var_pos = self._has_var_kw = False
        self._names: set[str] = set()
        if sig is not None:
            for p in sig.parameters.values():
                if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
                    self._positional.append(p.name)
                if p.kind is p.VAR_POSITIONAL:
                    self._has_var_pos = True
                elif p.kind is p.VAR_KEYWORD:
                    self._has_var_kw = True
                else:
                    self._names.add(p.name)
        self.buckets = bucket_spec.parse(fn_name, buckets, self._positional, self._names, self._has_var_pos,
                                         self._has_var_kw, sig is not None)
        # Positions of bucketed arguments in a plain call and in a method call (self not in args).
        self._bucket_pos: dict[bool, dict[int, bucket_spec.Bucket]] = {False: {}, True: {}}
        for b in self.buckets:
            if b.index is not None:
                self._bucket_pos[False][b.index] = self._bucket_pos[True][b.index] = b
            elif b.position is not None:
                self._bucket_pos[False][b.position] = b
                if b.position > 0:
                    self._bucket_pos[True][b.position - 1] = b
        # By keyword: a named bucket, or an index bucket whose parameter is passed by name.
        self._bucket_by_name: dict[bool, dict[str, bucket_spec.Bucket]] = {False: {}, True: {}}
        params = self._positional
        for b in self.buckets:
            if b.name is not None:
                self._bucket_by_name[False][b.name] = self._bucket_by_name[True][b.name] = b
            elif b.index is not None:
                if b.index < len(params):
                    self._bucket_by_name[False][params[b.index]] = b
                if b.index + 1 < len(params):
                    self._bucket_by_name[True][params[b.index + 1]] = b

    def bucket_targets(self) -> list[str]:
        """The parameter names ``buckets`` pads (an index names the parameter at that position)."""
        names = []
        for b in self.buckets:
            if b.name is not None:
                names.append(b.name)
            elif b.index is not None:
                names.extend(self._positional[i] for i in (b.index, b.index + 1) if i < len(self._positional))
        return names

    # -- call time ------------------------------------------------------------------------
    def describe(self, label: tuple[Any, ...]) -> str:
        """Format a raw leaf label ``(method, position-or-name, *subscripts)`` for messages."""
        method, where, *subs = label
        if isinstance(where, str):
            text = f"argument {where!r}"
        else:
            params = self._positional[1:] if method else self._positional
            text = f"argument {params[where]!r}" if where < len(params) else f"positional argument {where}"
        return text + subscripts(subs)

    def short(self, label: tuple[Any, ...]) -> str:
        """A compact name for a leaf label (``x``, ``kv[1]``, ``args[3]``) for stats and logs."""
        method, where, *subs = label
        if not isinstance(where, str):
            params = self._positional[1:] if method else self._positional
            where = params[where] if where < len(params) else f"args[{where}]"
        return str(where) + subscripts(subs)

    def sign(self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> CallSignature:
        """The call's :class:`CallSignature`.  A call made only of positional tensors of one framework and plain
        scalars, as the last such call was, takes :meth:`sign_plain` (no walk state, and the last call's key
        object, its hash computed once, where the key is the same); any other call walks its arguments."""
        fast = self._fast  # sign_plain's first step, here too: one Python frame less for a call its C check serves
        if fast and not kwargs:
            served = fast[0](instance, args)  # (it checks the backend is still the one cached for fast[1] too)
            if served is not None:
                return CallSignature(fast[3], served, fast[2], fast[4], self)
        sig = self.sign_plain(instance, args) if not kwargs else None
        return sig if sig is not None else self.sign_walk(instance, args, kwargs)

    def sign_walk(self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> CallSignature:
        """:meth:`sign` by walking the arguments (a call :meth:`sign_plain` found not plain); remembers a plain one.

        Where the replay lane is loaded and a call repeats the last walked key, the structure of its arguments
        (:mod:`graphjit.walk_spec`) becomes a C check (:func:`lane.walk_check`): a later call that matches it in every
        container, object attribute, value and tensor type, with the key's owner, modes and tensor metadata, gets
        that key without a walk; anything it refuses is walked (a ``training`` property or a mode then read twice)."""
        checks = self._walked
        for walked in checks:
            served = walked[0](instance, args, kwargs)  # (the backend still the one cached for walked[4] too)
            if served is not None:
                if walked is not checks[0]:  # the other key's turn (a prefill between decode steps): asked first now
                    self._walked = (walked, *(w for w in checks if w is not walked))
                if walked[6] is None:
                    return CallSignature(walked[1], served, walked[3], walked[2], self)
                served, values = served  # a counter's values: the key made with them, as the walk would make it
                return CallSignature(Key(walked[6](values)), served, walked[3], walked[2], self)
        if checks and checks[0][5] is not env.settings():  # settings read again since: each made again under them
            self._walked, self._walk_tried, self._free_tried = (), None, None
        sig = self._sign(instance, args, kwargs)
        if not kwargs and not self.buckets and sig.backend is not None:
            self._remember_plain(instance, args, sig)
        before = self._walk_key
        if sig.key != before:  # another key: its check made once it repeats (the others' kept meanwhile), or at
            self._walk_key = sig.key  # once where it differs from the last only in ints (counters: walk_spec.py)
            if before is not None and self.layout_checks and not self.buckets and lane.module() is not None:
                free = walk_spec.counters(before, sig.key)
                if free is None:  # another structure: its counters may be tried again
                    self._free_tried = None
                elif free != self._free_tried:
                    self._learn(sign_checks.walk_check(self, instance, args, kwargs, sig, free, before), free)
        elif (self._walk_tried is not self._walk_key and lane.module() is not None
              and not any(w[1] == sig.key for w in self._walked)):
            made = sign_checks.walk_check(self, instance, args, kwargs, sig)
            if made is not None:  # None: the lane switched off, tried again at a later call
                self._walk_tried = self._walk_key
                self._learn(made, None)
        return sig

    def _learn(self, made: tuple[Any, ...] | bool | None, free: frozenset[tuple[int, ...]] | None) -> None:
        """Keep a walk check just made (the most recent first); with ``free``, remember that those counters were
        tried (made or not: not tried again for the same paths)."""
        if made is None:
            return
        if free is not None:
            self._free_tried = free
        if made:
            self._walked = (made, *self._walked)[:WALK_CHECKS]

    def sign_plain(self, instance: Any, args: tuple[Any, ...]) -> CallSignature | None:
        """:meth:`sign` of a plain call without keyword arguments (see there), the same key as the walk gives; None
        if the call is not one (then :meth:`sign` walks it).  The first step of a replayed call.

        Where the backend has a check of several tensors' metadata in one call (:meth:`Backend.meta_check`), a call
        whose arguments have the last plain call's layout (the positions of its tensors, its scalars, owner and
        modes) and whose tensors pass the last key's check reuses that key without reading any tensor's metadata
        in Python; anything else reads each tensor's :meth:`Backend.meta_key`, as the check is never looser.  Where
        the replay lane is loaded, that layout is checked in one C call (:func:`lane.layout_check`, made once per
        layout), which refuses exactly what the Python comparison refuses, or more (then the Python one decides: a
        ``training`` property or a mode read twice on such a call)."""
        fast = self._fast
        if fast:
            served = fast[0](instance, args)  # (it checks the backend is still the one cached for fast[1] too)
            if served is not None:
                return CallSignature(fast[3], served, fast[2], fast[4], self)
        plain = self._plain
        if plain is None:
            return None
        backend: Backend = plain[0]
        _b, types, last_key, last_labels, was_method, probe, layout, check = plain
        method = instance is not None
        if method is not was_method or backends.cached_type_lookup(probe, None) is not backend:
            return None  # a bound call where it was not, or the framework's backend replaced since
        parts: list[Any] = [len(args)]
        tensors: list[Any] = []
        scalars = _SCALARS
        for a in args:
            tp = type(a)
            if tp in types:
                tensors.append(a)
                parts.append(_TENSOR)
            elif tp in scalars:
                parts.append((tp, a) if a or tp is not float else (tp, _zero(a)))
            else:
                return None
        if not tensors:
            return None
        owner = instance if method else self.owner
        if owner is not None:
            parts.append(("self", id(owner), getattr(owner, "training", None)))
        parts.append(("modes", backend.modes()))
        if check is not None and parts == layout and check(*tensors):
            # the layout's C check: made once the lane is loaded, made again where the settings were read again since
            if (lane.module() is not None if fast is None else fast and fast[5] is not env.settings()):
                made = sign_checks.layout_check(self, plain)
                if self._plain is plain:  # not replaced by another thread meanwhile
                    self._fast = made
            return CallSignature(last_key, tensors, backend, last_labels, self)
        meta = backend.meta_key
        it = iter(tensors)
        key = tuple(meta(next(it)) if p is _TENSOR else p for p in parts)
        if key != last_key:  # another key: checked in one call once it repeats (keys in turn never build a check)
            sig = CallSignature(Key(key), tensors, backend,
                                [(method, i) for i, a in enumerate(args) if type(a) in types], self)
            self._set_plain((backend, types, sig.key, sig.labels, method, probe, None, None))
            return sig
        # the same key again, without a check or with tensors the last one refused (a Parameter, then a tensor)
        self._set_plain((backend, types, last_key, last_labels, method, probe, parts, backend.meta_check(tensors)))
        return CallSignature(last_key, tensors, backend, last_labels, self)

    def _set_plain(self, plain: tuple[Any, ...] | None) -> None:
        """The last plain call is ``plain`` now; its C check is made at its next call, where the lane is loaded."""
        self._plain = plain
        self._fast = None

    def walk_layout(self, key: Any) -> tuple[Any, ...] | bool | None:
        """:func:`sign_checks.walk_layout` of this signer (the replay lane plans a keyword call's key from it)."""
        return sign_checks.walk_layout(self, key)

    def plain_layout(self, plain: tuple[Any, ...] | None = None) -> tuple[Any, ...] | None:
        """The layout of the last plain call (or of ``plain``, one of them read before), where it has one (it repeated
        with one key): ``(backend, tensor types, key, method, kinds, owner part, modes)``, ``kinds`` per argument None
        for a tensor, else ``(type, value)`` of a scalar; ``owner part`` ``("self", id, training)`` or None.  None
        where there is none."""
        if plain is None:
            plain = self._plain
        if plain is None or plain[6] is None:
            return None
        backend, types, key, _labels, method, _probe, layout, _check = plain
        n = layout[0]
        kinds = tuple(None if p is _TENSOR else p for p in layout[1:1 + n])
        rest = layout[1 + n:]
        owner_part = rest[0] if rest and rest[0][0] == "self" else None
        return backend, types, key, method, kinds, owner_part, rest[-1][1]

    def sign_again(self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> CallSignature:
        """The walk's signature of a call, with no shortcut and nothing remembered (:mod:`graphjit.sign_checks`
        checks a C check against it)."""
        return self._sign(instance, args, kwargs)

    def _remember_plain(self, instance: Any, args: tuple[Any, ...], sig: CallSignature) -> None:
        """After a walk: where the call was plain (see :meth:`sign`), the next such call may skip the walk."""
        types = set()
        for a in args:
            tp = type(a)
            if tp in _SCALARS:
                continue
            if backends.cached_type_lookup(tp, None) is not sig.backend:
                return
            types.add(tp)
        if types:
            # no layout yet: the next plain call reads its tensors' metadata once and makes the check
            self._set_plain((sig.backend, frozenset(types), sig.key, sig.labels, instance is not None,
                             next(iter(types)), None, None))

    def _sign(self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> CallSignature:
        tensors: list[Any] = []
        labels: list[tuple[Any, ...]] = []
        method = instance is not None
        state = _WalkState(self, method)
        parts: list[Any] = [len(args)]
        if not self.buckets:  # the hot path: tensors and scalars inline, containers through leaf()
            leaf = state.leaf
            by_type = backends.cached_type_lookup
            scalars = _SCALARS
            for i, a in enumerate(args):
                tp = type(a)
                if tp in scalars:
                    parts.append((tp, a) if a or tp is not float else (tp, _zero(a)))
                    continue
                b = by_type(tp, _MISSING)
                if b is not _MISSING and b is not None and b is state.backend:
                    assert b is not None  # checked above; `is state.backend` re-widens it to Backend | None
                    tensors.append(a)
                    labels.append((method, i))
                    parts.append(b.meta_key(a))
                else:
                    parts.append(leaf(a, (method, i), tensors, labels))
            if kwargs:
                for name in sorted(kwargs):
                    parts.append((name, leaf(kwargs[name], (method, name), tensors, labels)))
            owner = instance if method else self.owner
            if owner is not None:
                parts.append(("self", id(owner), getattr(owner, "training", None)))
            parts.append(state.modes())
            return CallSignature(Key(parts), tensors, state.backend, labels, self)
        pads: list[Pad] = []
        bucketed: list[tuple[int, int, int]] = []
        overflow: str | None = None
        by_pos = self._bucket_pos[method]
        by_name = self._bucket_by_name[method]
        for i, a in enumerate(args):
            bucket = by_pos.get(i)
            if bucket is not None:
                entry, ovf = self._bucketed(a, bucket, (method, i), tensors, labels, pads, bucketed, state)
                overflow = overflow or ovf
            else:
                entry = state.leaf(a, (method, i), tensors, labels)
            parts.append(entry)
        for name in sorted(kwargs):
            a = kwargs[name]
            bucket = by_name.get(name)
            if bucket is not None:
                entry, ovf = self._bucketed(a, bucket, (method, name), tensors, labels, pads, bucketed, state)
                overflow = overflow or ovf
            else:
                entry = state.leaf(a, (method, name), tensors, labels)
            parts.append((name, entry))
        owner = instance if method else self.owner
        if owner is not None:
            parts.append(("self", id(owner), getattr(owner, "training", None)))
        parts.append(state.modes())
        sig = CallSignature(Key(parts), tensors, state.backend, labels, self)
        sig.pads, sig.overflow, sig.bucketed = tuple(pads), overflow, tuple(bucketed)
        return sig

    def _bucketed(self, a: Any, bucket: bucket_spec.Bucket, label: tuple[Any, ...], tensors: list[Any],
                  labels: list[tuple[Any, ...]], pads: list[Pad], bucketed: list[tuple[int, int, int]],
                  state: _WalkState) -> tuple[Any, str | None]:
        backend = backends.for_type(type(a))
        if backend is None:  # an optional tensor left out (mask=None), or any non-tensor: a plain argument
            return state.leaf(a, label, tensors, labels), None
        state.use(backend, label)
        shape = backend.shape(a)
        padded = list(shape)
        overflow = None
        for given, sizes in bucket.dims:
            dim = given if given >= 0 else len(shape) + given
            if not 0 <= dim < len(shape):
                raise SignatureError(f"{self.fn_name}: buckets names dim {given} of {self.describe(label)}, but it "
                                     f"has {len(shape)} dims (shape {list(shape)})")
            n = shape[dim]
            at = bisect.bisect_left(sizes, n)
            if at == len(sizes):
                overflow = (f"{self.describe(label)} dim {dim} is {n}, larger than the largest bucket {sizes[-1]}; "
                            f"add a larger size to buckets[{bucket.label}][{given}]")
                continue
            padded[dim] = sizes[at]
            bucketed.append((len(tensors), dim, sizes[at]))
            if sizes[at] != n:
                pads.append(Pad(len(tensors), dim, n, sizes[at]))
        meta = backend.meta_key(a)
        tensors.append(a)
        labels.append(label)
        return (tuple(padded), *meta[1:]), overflow


class _WalkState:
    __slots__ = ("backend", "backend_label", "method", "signer", "visiting")

    def __init__(self, signer: Signer, method: bool) -> None:
        self.signer = signer
        self.method = method
        self.backend: Backend | None = None
        self.backend_label: tuple[Any, ...] = ()
        self.visiting: set[int] | None = None

    def modes(self) -> tuple[Any, ...]:
        """The framework modes of the call: of the tensors' framework, else of the forced one, else of
        every framework in use (a call without tensors)."""
        if self.backend is not None:
            return ("modes", self.backend.modes())
        forced = self.signer.forced_backend
        if forced != "auto":
            return ("modes", backends.get(forced).modes())
        return ("modes", tuple(backends.get(n).modes() for n in backends.imported()))

    def use(self, backend: Backend, label: tuple[Any, ...]) -> None:
        if self.backend is None:
            self.backend, self.backend_label = backend, label
        elif backend is not self.backend:
            d = self.signer.describe
            raise SignatureError(
                f"{self.signer.fn_name}: {d(self.backend_label)} is a {self.backend.name} tensor but {d(label)} is a "
                f"{backend.name} tensor; one graphed call takes tensors of one framework only")

    def leaf(self, x: Any, label: tuple[Any, ...], tensors: list[Any], labels: list[tuple[Any, ...]]) -> Any:
        tp = type(x)
        if tp in _SCALARS:
            return (tp, x) if x or tp is not float else (tp, _zero(x))
        if tp is slice:  # unhashable before Python 3.12: keyed by its bounds
            return (slice, (self.leaf(x.start, label, tensors, labels), self.leaf(x.stop, label, tensors, labels),
                            self.leaf(x.step, label, tensors, labels)))
        backend = backends.for_type(tp)
        if backend is not None:
            if backend is not self.backend:
                self.use(backend, label)
            tensors.append(x)
            labels.append(label)
            return backend.meta_key(x)
        if len(label) > MAX_NESTING:  # (the label: method, argument, then one subscript a level)
            raise SignatureError(f"{self.signer.fn_name}: {self.signer.describe(label[:2])} nests containers more than "
                                 f"{MAX_NESTING} deep or holds itself: pass what the function needs of it otherwise")
        if isinstance(x, (tuple, list)):
            return (tp, tuple(self.leaf(e, (*label, i), tensors, labels) for i, e in enumerate(x)))
        if isinstance(x, collections.deque):
            return (tp, x.maxlen, tuple(self.leaf(e, (*label, i), tensors, labels) for i, e in enumerate(x)))
        if isinstance(x, set):  # by its contents, as a frozenset is (a set changed in place is another call)
            return (tp, frozenset((type(e), e) for e in x))
        if isinstance(x, dict):
            items = []
            for k, v in x.items():
                try:
                    hash(k)
                except TypeError:
                    raise SignatureError(f"{self.signer.fn_name}: {self.signer.describe(label)} has an unhashable "
                                         f"key {k!r}") from None
                # (type, key): {True: v} and {1: v} are equal dict keys in Python but different calls
                items.append(((type(k), k), self.leaf(v, (*label, k), tensors, labels)))
            return (tp, tuple(items)) if tp is dict else (tp, tuple(items), self._dict_attrs(x, label, tensors, labels))
        if isinstance(x, guardable.PER_CONTEXT):  # what the calling context or thread holds
            return (tp, guardable.Identity(x), context_values.held(x))
        if is_object(tp):
            if tp.__hash__ is not None or self.visiting:
                return self._object(x, tp, label, tensors, labels)
            held = len(tensors)
            part = self._object(x, tp, label, tensors, labels)
            if len(tensors) == held:  # an unhashable object that holds no tensors, passed directly: a plain value
                raise SignatureError(
                    f"{self.signer.fn_name}: {self.signer.describe(label)} is a {tp.__module__}.{tp.__qualname__} "
                    "with __hash__ = None that holds no tensors, so it is neither a tensor nor hashable. graphjit keys "
                    "graphs on non-tensor arguments by value: make its class hashable (a frozen dataclass, or "
                    "__hash__ with __eq__), pass its values as plain arguments, or close over the object instead of "
                    "passing it")
            return part
        try:
            hash(x)
        except TypeError:
            if self.visiting:  # inside an object that holds tensors: keyed by identity, like a closed-over value
                return (tp, "id", guardable.Identity(x))
            raise SignatureError(
                f"{self.signer.fn_name}: {self.signer.describe(label)} is a {tp.__module__}.{tp.__qualname__}, "
                "which is neither a tensor nor hashable. graphjit keys graphs on non-tensor arguments by value: pass "
                "a tensor (it becomes a graph input), a hashable value (a new value captures a new graph), or close "
                "over the object instead of passing it") from None
        return (tp, x)

    def _dict_attrs(self, x: Any, label: tuple[Any, ...], tensors: list[Any], labels: list[Any]) -> tuple[Any, ...]:
        """A dict subclass's attributes (:func:`tree.dict_attrs`) walked as an object's, a mirror as it is."""
        self.visiting = self.visiting if self.visiting is not None else set()
        if id(x) in self.visiting:
            return ("cycle",)
        self.visiting.add(id(x))
        try:
            return tuple((n, v) if v is MIRROR else (n, self.leaf(v, (*label, Attr(n)), tensors, labels))
                         for n, v in dict_attrs(x))
        finally:
            self.visiting.discard(id(x))

    def _object(self, x: Any, tp: type, label: tuple[Any, ...], tensors: list[Any],
                labels: list[tuple[Any, ...]]) -> Any:
        """An object walked like a container: its attributes (names and leaves) are the key."""
        if self.visiting is None:
            self.visiting = set()
        oid = id(x)
        if oid in self.visiting:  # a reference back to an object on the current path
            return (tp, "cycle")
        self.visiting.add(oid)
        parts: list[Any] = [tp]
        by_type = backends.cached_type_lookup
        try:
            for name, v in object_fields(x):  # the common leaves inline: this is on the replay path
                vt = type(v)
                if vt in _SCALARS:
                    parts.append((name, vt, v) if v or vt is not float else (name, vt, _zero(v)))
                    continue
                b = by_type(vt, _MISSING)
                if b is not _MISSING and b is not None and b is self.backend:
                    assert b is not None  # checked above; `is self.backend` re-widens it to Backend | None
                    tensors.append(v)
                    labels.append((*label, Attr(name)))
                    parts.append((name, b.meta_key(v)))
                    continue
                parts.append((name, self.leaf(v, (*label, Attr(name)), tensors, labels)))
        finally:
            self.visiting.discard(oid)
        return tuple(parts)


__all__ = ["Binder", "CallSignature", "Key", "Pad", "Signer", "rebuild", "rebuild_call"]  # Binder: binder.py
