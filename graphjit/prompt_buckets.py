"""Prompt lengths in buckets for ``graph_generation(model, prefill_buckets=...)``: a ``generate()`` call's prompt is
padded on the left to the smallest bucket that holds it (its attention mask zero there), and the padding is taken
off the returned sequences, so that prompts of many lengths share one prefill graph per bucket.

Transformers' decoder-only models take padding on the left as their batched generation does: the attention mask
hides the padded positions and the position ids count from each sequence's first real token (``generate()`` makes
them from the mask).  The prefill then attends over a longer, masked prompt: its kernels see other shapes, so the
logits can differ from the unpadded call's by floating-point rounding (greedy tokens equal in the fp32 tests).

A call is left as it is (:meth:`Bucketing.pad` returns no padding) where padding could change what it means: an
encoder-decoder model (its encoder's input is not the decoded prompt), a call that passes ``inputs_embeds``, a
cache to continue, a streamer (it would see the padding) or an assistant model; a prompt that is not a 2-D tensor,
that already fills its bucket, or is longer than the largest bucket; and a prompt without an attention mask that
holds the pad token (``generate()`` would infer its mask from it).  Imports no framework: the padded tensors are
made with the prompt's own methods (``new_full``, ``new_zeros``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .errors import ConfigError

_KEEPS_PROMPT = frozenset(("inputs_embeds", "past_key_values", "cache", "streamer", "assistant_model"))
"""Arguments of ``generate()`` with which a call is not padded (see the module docstring)."""


def parse(buckets: Any) -> tuple[int, ...]:
    """``prefill_buckets`` as sorted distinct sizes; raises :class:`ConfigError` naming the argument otherwise."""
    if isinstance(buckets, (str, bytes)) or not isinstance(buckets, Sequence) or not buckets:
        raise ConfigError(f"graph_generation(prefill_buckets={buckets!r}): expected a non-empty list of prompt lengths "
                          "(positive ints), for example (16, 32, 64, 128)")
    bad = [b for b in buckets if not isinstance(b, int) or isinstance(b, bool) or b <= 0]
    if bad or len(set(buckets)) != len(buckets):
        raise ConfigError(f"graph_generation(prefill_buckets={list(buckets)!r}): expected distinct positive ints; "
                          f"{'not positive ints: ' + repr(bad) if bad else 'a length repeats'}")
    return tuple(sorted(buckets))


class Bucketing:
    """Pads one model's ``generate()`` prompts into ``buckets`` (see the module docstring)."""

    def __init__(self, model: Any, buckets: tuple[int, ...]) -> None:
        self.model = model
        self.buckets = buckets
        self.padded = 0  # calls padded
        self.kept = 0  # calls left as they were

    def pad(self, args: tuple[Any, ...], kwargs: dict[str, Any],
            config: Any) -> tuple[tuple[Any, ...], dict[str, Any], int]:
        """The call's arguments with its prompt padded on the left to its bucket, and the padding's length (0: the
        call as it was).  ``config``: the generation config the call runs with."""
        ids, name = (args[0], None) if args else next(
            ((kwargs[k], k) for k in ("inputs", "input_ids") if kwargs.get(k) is not None), (None, None))
        pad = self._padding(ids, kwargs)
        if pad == 0 or not self._mask_known(ids, kwargs, config):
            self.kept += 1
            return args, kwargs, 0
        batch, length = ids.shape
        fill = _token(kwargs.get("pad_token_id", getattr(config, "pad_token_id", None)))
        if fill is None:
            fill = _token(getattr(config, "eos_token_id", None)) or 0  # any id: the mask hides it
        padded = ids.new_full((batch, length + pad), fill)
        padded[:, pad:] = ids
        mask = ids.new_zeros((batch, length + pad))
        given = kwargs.get("attention_mask")
        mask[:, pad:] = given if given is not None else 1
        kwargs = {**kwargs, "attention_mask": mask}
        if kwargs.get("max_new_tokens") is None and getattr(config, "max_new_tokens", None) is None:
            kwargs["max_length"] = (kwargs.get("max_length") or getattr(config, "max_length", None) or 20) + pad
        min_length = kwargs.get("min_length") or getattr(config, "min_length", 0) or 0
        if min_length:
            kwargs["min_length"] = min_length + pad  # both count the prompt
        if name is None:
            args = (padded, *args[1:])
        else:
            kwargs[name] = padded
        self.padded += 1
        return args, kwargs, pad

    def _padding(self, ids: Any, kwargs: dict[str, Any]) -> int:
        if getattr(getattr(self.model, "config", None), "is_encoder_decoder", False) or _KEEPS_PROMPT & kwargs.keys():
            return 0
        shape = getattr(ids, "shape", None)
        if shape is None or len(shape) != 2 or not hasattr(ids, "new_full"):
            return 0
        bucket = next((b for b in self.buckets if b >= shape[1]), None)
        return 0 if bucket is None else bucket - shape[1]

    @staticmethod
    def _mask_known(ids: Any, kwargs: dict[str, Any], config: Any) -> bool:
        """False for a prompt without a mask that holds the pad token: ``generate()`` infers that mask itself."""
        if kwargs.get("attention_mask") is not None:
            return True
        pad = _token(kwargs.get("pad_token_id", getattr(config, "pad_token_id", None)))
        return pad is None or not bool((ids == pad).any())


def strip(out: Any, pad: int) -> Any:
    """``generate()``'s result without the ``pad`` columns of padding in front of its sequences."""
    if hasattr(out, "shape"):
        return out[:, pad:]
    sequences = getattr(out, "sequences", None)
    if sequences is not None:
        out.sequences = sequences[:, pad:]
    return out


def _token(value: Any) -> int | None:
    """One token id out of an int, a list of ints (the first) or a one-element tensor; None if none."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return _token(value[0]) if value else None
    try:
        return int(value) if not hasattr(value, "numel") or value.numel() == 1 else int(value.reshape(-1)[0])
    except (TypeError, ValueError):
        return None
