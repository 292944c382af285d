"""``graph_generation(model)``: one line that graphs a generating model's decode step for its own ``generate()``.

transformers' ``generate()`` with a static cache compiles the decode step itself
(``torch.compile(mode="reduce-overhead")``, seconds on its first call), and builds a new cache for every call.
For graphjit both get in the way: compiling around the graphed ``forward`` buys nothing (Dynamo steps around it),
and a new cache is a new set of addresses (a recapture, then a copy of the whole cache in and out of the graph
on every step).  :func:`graph_generation` sets the model up once:

* its ``forward`` becomes ``graphjit.graphed(model.forward, **options)``: every call with the shapes of a decode
  step replays one graph (one per batch size), the prefill of a new prompt length runs uncaptured until that
  length repeats;
* ``generation_config.disable_compile = True``: transformers' own compilation is off for this model (said once in
  graphjit's log);
* ``generation_config.cache_implementation = "static"`` where the user chose none;
* the static cache one ``generate()`` builds is kept and handed, reset in place, to the next ``generate()`` that
  asks for one of the same kind, batch size and length (transformers already sizes a new cache to the longest
  length seen, so this is the same cache it would build, at the same addresses): the decode graph stays valid
  across calls and nothing is copied.  transformers' ``reset()`` zeroes every layer in place.

Guarantees: ``generate()`` returns what it returns without graphjit (greedy tokens equal; sampling draws from the
same generator); anything graphjit cannot graph runs uncaptured, counted with its reason in
``model.forward.report()``.  Calling it twice on one model does nothing the second time.  Refuses (ConfigError)
an object without ``generate``, ``forward`` and ``generation_config``.  Nothing here imports a framework: it
works on the attributes transformers' generation API defines.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

from .api import graphed
from .errors import ConfigError

log = logging.getLogger("graphjit")

_MARK = "_graphjit_generation"


class _KeptCaches:
    """The static caches earlier ``generate()`` calls built, by what their shapes depend on, reused after ``reset()``
    when a later call asks for the same: stands in for the model's ``_prepare_static_cache(cache_implementation,
    batch_size, max_cache_len, prefill_chunk_size, model_kwargs)``.  A call it cannot read (another signature) goes
    to the model's own method unchanged."""

    def __init__(self, model: Any, prepare: Any) -> None:
        self.model = model
        self.prepare = prepare  # the model's own bound method
        try:
            self.signature: inspect.Signature | None = inspect.signature(prepare)
        except (TypeError, ValueError):
            self.signature = None
        self.kept: dict[tuple[Any, ...], Any] = {}
        self.reused = 0

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
                str(getattr(model, "device", "")))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        key = self.key(args, kwargs)
        old = self.kept.get(key) if key is not None else None
        if old is not None and callable(getattr(old, "reset", None)):
            old.reset()  # zeroes every layer in place: the addresses the decode graph reads stay
            self.reused += 1
            return old
        fresh = self.prepare(*args, **kwargs)
        if key is not None:
            self.kept[key] = fresh
        return fresh


def graph_generation(model: Any, **options: Any) -> Any:
    """Graph ``model``'s decode step for its ``generate()`` (see the module docstring); returns ``model``.

    ``options`` are :func:`graphjit.graphed`'s (``tracer``, ``warmup``, ``outputs``, ...), for its ``forward``.
    Raises :class:`~graphjit.errors.ConfigError` for an object that is not a generating model, and whatever
    :func:`graphjit.graphed` raises for a bad option."""
    missing = [a for a in ("generate", "forward", "generation_config") if getattr(model, a, None) is None]
    if missing:
        raise ConfigError(f"graph_generation(model={type(model).__name__}): expected a model with generate(), "
                          f"forward() and a generation_config (a transformers generating model); it has no "
                          f"{', '.join(missing)}")
    if getattr(model, _MARK, False):
        return model
    forward = graphed(model.forward, **options)  # options checked before anything changes
    config = model.generation_config
    config.disable_compile = True
    if getattr(config, "cache_implementation", None) is None:
        config.cache_implementation = "static"
    prepare = getattr(model, "_prepare_static_cache", None)
    kept = _KeptCaches(model, prepare) if callable(prepare) else None
    model.forward = forward
    if kept is not None:  # a bound method: graphjit's walks do not enter it (the caches are reached as arguments)
        model._prepare_static_cache = kept.__call__
    setattr(model, _MARK, True)
    log.info("graphjit: graph_generation(%s): forward graphed; transformers' own compilation of generate() is off "
             "for it (disable_compile=True); cache %s%s", type(model).__name__, config.cache_implementation,
             ", kept across generate() calls" if kept is not None else
             " (this transformers has no _prepare_static_cache: each generate() builds its own, recaptured)")
    return model


__all__ = ["graph_generation"]
