"""``graph_generation(model)``: one line that graphs a generating model's decode step for its own ``generate()``.

transformers' ``generate()`` with a static cache compiles the decode step itself
(``torch.compile(mode="reduce-overhead")``, seconds on its first call), and builds a new cache for every call.
For graphjit both get in the way: compiling around the graphed ``forward`` buys nothing (Dynamo steps around it),
and a new cache is a new set of addresses (a recapture, then a copy of the whole cache in and out of the graph
on every step).  :func:`graph_generation` sets the model up once:

* its ``forward`` becomes ``graphjit.graphed(model.forward, **options)``: every call with the shapes of a decode
  step replays one graph (one per batch size), the prefill of a new prompt length runs uncaptured until that
  length repeats.  A cache that counts its length in a Python int (Gemma 2 and 3's sliding-window layers) makes
  one graph per position, each replay advancing the int as the call would (:mod:`graphjit.advances`), so
  ``max_graphs`` is :data:`MAX_GRAPHS` unless given.  With ``tracer="compile"`` only the decode step is compiled
  (as transformers' compiled ``generate()`` does): calls of several new tokens (a prefill) run the eager tracer
  (:class:`_Phases`).
  ``prefill_buckets`` pads prompts into a few lengths (:mod:`graphjit.prompt_buckets`), so the prefill of many
  prompt lengths is graphed too;
* its ``generate`` runs with ``disable_compile=True`` (transformers' own compilation off, said once in graphjit's
  log) and ``cache_implementation="static"`` where the call names no cache and the model's generation config
  chose none; the caller's own arguments win, and the model's ``generation_config`` is left as it is;
* the static cache one ``generate()`` builds is kept and handed, reset in place, to a later ``generate()`` that
  asks for one of the same kind, batch size and length (transformers already sizes a new cache to the longest
  length seen, so this is the same cache it would build, at the same addresses): the decode graph stays valid
  across calls and nothing is copied.  transformers' ``reset()`` zeroes every layer in place.  A cache is never
  handed to two running calls, nor again once a call returned it to its caller.

Guarantees: ``generate()`` returns what ``generate(cache_implementation="static")`` returns without graphjit (greedy
tokens equal; sampling draws from the same generator).  A static cache is the default graphjit sets: in bf16 its
kernels may pick other greedy tokens than transformers' dynamic cache would, as they do without graphjit.  Anything
graphjit cannot graph runs uncaptured, counted with its reason in ``model.forward.report()``.  Calling it twice on
one model does nothing the second time.  Refuses (ConfigError) an object without ``generate``, ``forward`` and
``generation_config``.  It imports no framework: it works on the attributes transformers' generation API defines
(and reads the modes of torch's backend where torch is imported: a kept cache is one autocast state's).
"""

from __future__ import annotations

import inspect
import logging
import sys
import threading
from collections.abc import Callable
from typing import Any

from . import env, prompt_buckets
from .api import graphed
from .errors import ConfigError

log = logging.getLogger("graphjit")

_MARK = "_graphjit_generation"
_CACHE_ARGUMENTS = frozenset(("past_key_values", "cache", "cache_params", "cache_implementation"))
"""Arguments of generate() that choose its cache (``cache_params`` is an old name of ``cache``)."""
MAX_GRAPHS = 512
"""``max_graphs`` of the graphed ``forward`` unless the call or ``GRAPHJIT_MAX_GRAPHS`` sets it: a cache that counts
its length in a Python int (Gemma 2 and 3's sliding-window layers) makes one key per position (graphjit/advances.py),
each with its own output buffers (the logits of one step)."""
_KEPT_MAX = 8
"""Kept caches at most (one per batch size, length and encoder length): the oldest go first."""



class _Running(threading.local):
    """What a thread's running ``generate()`` took (``taken``: the caches; ``first``: its prefill still to come); the
    class's values are what a thread reads before its first call (no AttributeError raised and caught)."""

    taken: list[Any] | None = None
    first = False

class _Generation:
    """What :func:`graph_generation` puts around one model's ``generate()``: the per-call defaults (transformers'
    compilation off, a static cache where the call names no cache), and the static caches earlier calls built,
    handed, reset in place, to a later call that asks for the same through the model's
    ``_prepare_static_cache(cache_implementation, batch_size, max_cache_len, prefill_chunk_size, model_kwargs)``.

    A kept cache is never handed to two calls at once (a cache in use by a running ``generate()``, in this thread
    or another, is skipped: that call gets a new one), nor again once a call returned it to its caller
    (``return_dict_in_generate``): the caller's cache stays theirs.  A longer cache of the same kind replaces the
    shorter ones (transformers sizes every later cache to the longest length seen, so they are never asked for
    again).  A call of ``_prepare_static_cache`` it cannot read (another signature) goes to the model's own."""

    def __init__(self, model: Any, generate: Any, prepare: Any,
                 bucketing: prompt_buckets.Bucketing | None = None) -> None:
        self.model = model
        self.bucketing = bucketing  # prefill_buckets: prompts padded on the left to a bucket's length
        self.generate = generate  # the model's own bound methods
        self.prepare = prepare
        try:
            self.signature: inspect.Signature | None = inspect.signature(prepare) if prepare is not None else None
        except (TypeError, ValueError):
            self.signature = None
        self.lock = threading.Lock()
        self.kept: dict[tuple[Any, ...], Any] = {}
        self.busy: set[int] = set()  # id() of the kept caches running generate() calls hold
        self.local = _Running()  # the caches this thread's running generate() took
        self.reused = 0
        try:  # where generate() takes its generation_config positionally (after the inputs)
            names = list(inspect.signature(generate).parameters)
            self.config_position: int | None = names.index("generation_config")
        except (TypeError, ValueError):
            self.config_position = None

    def generate_call(self, *args: Any, **kwargs: Any) -> Any:
        """``model.generate`` with graphjit's defaults where the call and its generation config leave them open:
        ``disable_compile=True``, and ``cache_implementation="static"`` where no cache is named.  An assistant
        model's (assisted decoding: transformers gives it its own cache across rounds) gets none."""
        config = kwargs.get("generation_config")
        if config is None and self.config_position is not None and len(args) > self.config_position:
            config = args[self.config_position]
        given = config if config is not None else getattr(self.model, "generation_config", None)
        if not getattr(given, "is_assistant", False):
            if "disable_compile" not in kwargs and getattr(given, "disable_compile", None) is None:
                kwargs["disable_compile"] = True
            if (not _CACHE_ARGUMENTS & kwargs.keys() and getattr(given, "cache_implementation", None) is None):
                kwargs["cache_implementation"] = "static"
        pad = 0
        if self.bucketing is not None and not getattr(given, "is_assistant", False):
            args, kwargs, pad = self.bucketing.pad(args, kwargs, config)
        taken: list[Any] = []
        outer, outer_first = self.local.taken, self.local.first
        self.local.taken = taken
        self.local.first = True  # the call's first forward is its prefill (take_first)
        out: Any = None
        try:
            out = self.generate(*args, **kwargs)
        finally:
            self.local.taken = outer
            self.local.first = outer_first
            returned = getattr(out, "past_key_values", None)
            if returned is None:
                returned = getattr(out, "cache", None)
            with self.lock:  # one step: a cache the caller got back is never free for another thread's call
                if returned is not None:  # the caller holds it now: theirs, never handed to a later call
                    for key in [k for k, c in self.kept.items() if c is returned]:
                        del self.kept[key]
                for cache in taken:
                    self.busy.discard(id(cache))
        return prompt_buckets.strip(out, pad) if pad else out

    def take_first(self) -> bool:
        """True for the first forward call of this thread's running ``generate()`` (its prefill, as transformers
        counts it: an encoder-decoder's first decoder step too, whose cross-attention cache is still empty), False
        for every later one and outside ``generate()``."""
        first = self.local.first
        if first:
            self.local.first = False
        return bool(first)

    def key(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...] | None:
        """What the cache's shapes depend on, or None where the call cannot be read."""
        if self.signature is None:
            return None
        try:
            bound = self.signature.bind(*args, **kwargs).arguments
            impl, batch, length = bound["cache_implementation"], bound["batch_size"], bound["max_cache_len"]
        except (TypeError, KeyError):
            return None
        model = self.model
        length = max(length, getattr(model, "_previous_max_cache_length", -1))  # as transformers sizes it
        encoder = (bound.get("model_kwargs") or {}).get("encoder_outputs")
        cross = None
        if encoder is not None:
            try:
                cross = tuple(encoder[0].shape)
            except (TypeError, IndexError, KeyError, AttributeError):
                return None
        return (impl, batch, length, bound.get("prefill_chunk_size"), cross, str(getattr(model, "dtype", "")),
                str(getattr(model, "device", "")), _modes())

    def prepare_call(self, *args: Any, **kwargs: Any) -> Any:
        """``model._prepare_static_cache``: a kept cache, reset, where one fits and is free; else the model's."""
        key = self.key(args, kwargs)
        taken = self.local.taken
        with self.lock:
            old = self.kept.get(key) if key is not None and taken is not None else None
            if old is not None and (id(old) in self.busy or not callable(getattr(old, "reset", None))):
                old = None
            if old is not None:
                self.busy.add(id(old))
        if old is not None:
            taken.append(old)  # type: ignore[union-attr]  # set with old above; released even if reset() raises
            old.reset()  # zeroes every layer in place: the addresses the decode graph reads stay
            self.reused += 1
            return old
        fresh = self.prepare(*args, **kwargs)
        if key is not None and taken is not None:
            with self.lock:
                if key not in self.kept or id(self.kept[key]) not in self.busy:
                    for k in [k for k in self.kept if k[2] < key[2] and id(self.kept[k]) not in self.busy]:
                        del self.kept[k]  # shorter: transformers sizes every later cache to the longest seen
                    self.kept[key] = fresh
                    for k in list(self.kept)[:-_KEPT_MAX]:
                        if id(self.kept[k]) not in self.busy:
                            del self.kept[k]
                self.busy.add(id(fresh))
            taken.append(fresh)
        return fresh


_STEP_INPUTS = ("decoder_input_ids", "input_ids", "decoder_inputs_embeds", "inputs_embeds")
"""The arguments of a generating model's forward whose second dim is the call's new tokens (an encoder-decoder's
decoder first: its ``input_ids`` are the encoder's)."""


def _one_token(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a forward call decodes one token per sequence (not a prefill, nor assisted decoding's check of
    several candidates): judged by the first of :data:`_STEP_INPUTS` the call passes, else its first positional
    argument; a call where none has a shape counts as a decode step."""
    for name in _STEP_INPUTS:
        x = kwargs.get(name)
        if x is not None:
            break
    else:
        x = args[0] if args else None
    shape = getattr(x, "shape", None)
    return shape is None or len(shape) < 2 or shape[1] == 1


class _Phases:
    """``model.forward`` after ``graph_generation(model, tracer="compile")``: the decode step (one new token per
    sequence) through ``graphed(forward, tracer="compile")``, every other call (a prefill, assisted decoding's
    multi-token check) through ``graphed(forward, tracer="eager")``, as transformers' own compiled ``generate()``
    compiles the decode step only.  The first forward call of each ``generate()`` is its prefill whatever its length,
    as transformers counts it: an encoder-decoder's first decoder step (one token, its cross-attention cache still
    to fill) would otherwise be compiled once more in every later ``generate()``.  Compiling the prefill would cost
    seconds for every new prompt length, and once more when the cache's counters move to the GPU after its first
    update; its graph (once a length repeats) holds the same launches either way.

    :meth:`stats`, :meth:`report` and :meth:`reset` cover both (``stats()["phases"]`` keeps them apart); anything
    else (``static_inputs``, ``graphjit_options``) is the decode step's."""

    def __init__(self, decode: Any, prefill: Any) -> None:
        self.decode = decode
        self.prefill = prefill
        self.first_call: Callable[[], bool] | None = None  # _Generation.take_first, once graph_generation set it up

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        first = self.first_call is not None and self.first_call()
        return (self.prefill if first or not _one_token(args, kwargs) else self.decode)(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name in ("decode", "prefill", "first_call"):  # not set yet (copy.copy makes the object without __init__)
            raise AttributeError(name)
        return getattr(self.decode, name)

    def stats(self) -> dict[str, Any]:
        """The counters of both phases summed (keys, fallback reasons and pool bytes together), and each in
        ``phases``."""
        d, p = self.decode.stats(), self.prefill.stats()
        out = dict(d)
        for k in ("calls", "disabled_calls", "nested_calls", "graphs", "captures", "replays"):
            out[k] = d[k] + p[k]
        for k in ("fallbacks", "verify_skipped"):
            merged = dict(d[k])
            for reason, n in p[k].items():
                merged[reason] = merged.get(reason, 0) + n
            out[k] = merged
        out["pool_bytes"] = d["pool_bytes"] + p["pool_bytes"]  # a pool each
        out["keys"] = [*d["keys"], *p["keys"]]
        out["phases"] = {"decode": d, "prefill": p}
        return out

    def report(self) -> str:
        return (f"decode step (tracer=\"compile\"): {self.decode.report()}\n"
                f"prefill and other calls of several tokens (tracer=\"eager\"): {self.prefill.report()}")

    def reset(self) -> None:
        self.decode.reset()
        self.prefill.reset()


def _modes() -> tuple[Any, ...]:
    """The framework's modes (autocast among them: a cache's dtype is its first writer's) where torch is in use."""
    if "torch" not in sys.modules:
        return ()
    from . import backends

    return tuple(backends.get("torch").modes())


def graph_generation(model: Any, *, prefill_buckets: Any = None, **options: Any) -> Any:
    """Graph ``model``'s decode step for its ``generate()`` (see the module docstring); returns ``model``.

    ``options`` are :func:`graphjit.graphed`'s (``tracer``, ``warmup``, ``outputs``, ...), for its ``forward``.
    ``prefill_buckets`` (prompt lengths, for example ``(16, 32, 64, 128)``): a decoder-only model's prompt is padded
    on the left to the smallest bucket that holds it, with its attention mask, and the padding is taken off the
    returned sequences (:mod:`graphjit.prompt_buckets`): the prefill of every length in one bucket is one key, graphed
    once it repeats.  Its logits may then differ from the unpadded call's by floating-point rounding.
    Raises :class:`~graphjit.errors.ConfigError` for an object that is not a generating model or bad
    ``prefill_buckets``, and whatever :func:`graphjit.graphed` raises for a bad option.  Called again on a model it
    prepared, with the same options or none, it returns the model as it is; with others it raises ConfigError."""
    missing = [a for a in ("generate", "forward", "generation_config") if getattr(model, a, None) is None]
    if missing:
        raise ConfigError(f"graph_generation(model={type(model).__name__}): expected a model with generate(), "
                          f"forward() and a generation_config (a transformers generating model); it has no "
                          f"{', '.join(missing)}")
    buckets = None if prefill_buckets is None else prompt_buckets.parse(prefill_buckets)
    asked = repr((sorted(options.items()), prefill_buckets))
    done = getattr(model, _MARK, None)
    if done is not None:
        if done != asked and (options or prefill_buckets is not None):  # (none asked: the model as it is)
            raise ConfigError(f"graph_generation({type(model).__name__}): the model was prepared with other options "
                              f"({done}); they cannot change on a prepared model (make the model anew)")
        return model
    if "max_graphs" not in options and env.settings().max_graphs is None:
        options = {**options, "max_graphs": MAX_GRAPHS}
    forward: Any = graphed(model.forward, **options)  # options checked before anything changes
    if options.get("tracer") == "compile":
        forward = _Phases(forward, graphed(model.forward, **{**options, "tracer": "eager"}))
    prepare = getattr(model, "_prepare_static_cache", None)
    around = _Generation(model, model.generate, prepare if callable(prepare) else None,
                         None if buckets is None else prompt_buckets.Bucketing(model, buckets))
    if isinstance(forward, _Phases):
        forward.first_call = around.take_first
    model.forward = forward
    # bound methods: graphjit's walks do not enter them (the caches are reached as the forward's arguments)
    model.generate = around.generate_call
    if around.prepare is not None:
        model._prepare_static_cache = around.prepare_call
    setattr(model, _MARK, asked)
    log.info("graphjit: graph_generation(%s): forward graphed%s; its generate() runs without transformers' own "
             "compilation (disable_compile=True) and with a static cache unless told otherwise%s", type(model).__name__,
             " (tracer='compile' for the decode step only: calls of several new tokens, a prefill, run the eager "
             "tracer, as transformers' compiled generate() does)" if isinstance(forward, _Phases) else "",
             ", kept across generate() calls" if around.prepare is not None else
             " (this transformers has no _prepare_static_cache: each generate() builds its own, recaptured)")
    return model


__all__ = ["graph_generation"]
