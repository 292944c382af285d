"""Prompt lengths in buckets for ``graph_generation(model, prefill_buckets=...)``: a ``generate()`` call's prompt is
padded on the left to the smallest bucket that holds it (its attention mask zero there), and the padding is taken
off the returned sequences, so that prompts of many lengths share one prefill graph per bucket.

Transformers' decoder-only models take padding on the left as their batched generation does: the attention mask
hides the padded positions and the position ids count from each sequence's first real token (``generate()`` makes
them from the mask).  The prefill then attends over a longer, masked prompt: its kernels see other shapes, so the
logits can differ from the unpadded call's by floating-point rounding (greedy tokens equal in the fp32 tests).

A call is padded only where padding cannot change what it returns or what the caller's code sees.  It is left as
it is (:meth:`Bucketing.pad` returns no padding) for: an encoder-decoder model (its encoder's input is not the
decoded prompt); a call without ``max_new_tokens`` (in its arguments, its generation config or the model's: a
length bound that counts the prompt would have to be rewritten); ``return_dict_in_generate`` (the returned cache and
the prefill's hidden states would hold the padding); a call that passes ``inputs_embeds``, a cache to continue, a
streamer, an assistant model, stopping criteria, logits processors or ``prefix_allowed_tokens_fn`` (they see the
token ids), or any other tensor (``position_ids``, ``token_type_ids``: per prompt token); a generation config that
reads the prompt's tokens (``repetition_penalty``, ``no_repeat_ngram_size``, ``bad_words_ids``, ``sequence_bias``);
a prompt that is not a 2-D tensor, already fills its bucket or is longer than the largest; and a prompt without an
attention mask that holds the pad token (``generate()`` would infer its mask from it).  Settings are read as
``generate()`` reads them: the call's arguments, then the generation config it passes, then the model's.  Imports
no framework: the padded tensors are made with the prompt's own methods (``new_full``, ``new_zeros``).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from typing import Any

from .errors import ConfigError

log = logging.getLogger("graphjit")

_KEEPS_PROMPT = frozenset(("inputs_embeds", "past_key_values", "cache", "streamer", "assistant_model",
                           "stopping_criteria", "logits_processor", "prefix_allowed_tokens_fn"))
"""Arguments of ``generate()`` with which a call is not padded (see the module docstring)."""
_READS_TOKENS = (("repetition_penalty", 1.0), ("no_repeat_ngram_size", 0), ("bad_words_ids", None),
                 ("sequence_bias", None), ("encoder_no_repeat_ngram_size", 0))
"""Generation settings (with their neutral values) whose logits processors read the prompt's token ids."""
_PROMPT_ARGUMENTS = ("inputs", "input_ids")


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
        self.why_kept: Counter[str] = Counter()  # those calls by why (each said once in graphjit's log, at INFO)

    def pad(self, args: tuple[Any, ...], kwargs: dict[str, Any],
            config: Any) -> tuple[tuple[Any, ...], dict[str, Any], int]:
        """The call's arguments with its prompt padded on the left to its bucket, and the padding's length (0: the
        call as it was).  ``config``: the generation config the call passes (None: the model's)."""
        ids, name = (args[0], None) if args else next(
            ((kwargs[k], k) for k in _PROMPT_ARGUMENTS if kwargs.get(k) is not None), (None, None))
        setting = _Settings(kwargs, config, getattr(self.model, "generation_config", None))
        pad, why = self._padding(ids, kwargs, setting)
        if pad == 0 or ids is None:
            self.kept += 1
            if why not in self.why_kept:
                log.info("graphjit: graph_generation(prefill_buckets=%s): a generate() call's prompt is not padded "
                         "into a bucket: %s (its prefill is a key of its own length)", list(self.buckets), why)
            self.why_kept[why] += 1
            return args, kwargs, 0
        batch, length = ids.shape
        fill = _token(setting("pad_token_id"))
        if fill is None:
            fill = _token(setting("eos_token_id")) or 0  # any id: the mask hides it
        padded = ids.new_full((batch, length + pad), fill)
        padded[:, pad:] = ids
        mask = ids.new_zeros((batch, length + pad))
        given = kwargs.get("attention_mask")
        mask[:, pad:] = given if given is not None else 1
        kwargs = {**kwargs, "attention_mask": mask}
        min_length = setting("min_length") or 0
        if min_length:
            kwargs["min_length"] = min_length + pad  # it counts the prompt (min_new_tokens does not)
        if name is None:
            args = (padded, *args[1:])
        else:
            kwargs[name] = padded
        self.padded += 1
        return args, kwargs, pad

    def _padding(self, ids: Any, kwargs: dict[str, Any], setting: _Settings) -> tuple[int, str]:
        """The columns of padding the call gets, and why it gets none (see the module docstring)."""
        if getattr(getattr(self.model, "config", None), "is_encoder_decoder", False):
            return 0, "an encoder-decoder model (its encoder's input is not the decoded prompt)"
        keeps = sorted(_KEEPS_PROMPT & kwargs.keys())
        if keeps:
            return 0, f"the call passes {keeps[0]!r}"
        shape = getattr(ids, "shape", None)
        if shape is None or len(shape) != 2 or not hasattr(ids, "new_full"):
            return 0, "its prompt is not a 2-D tensor of token ids"
        other = next((k for k, v in kwargs.items() if k not in (*_PROMPT_ARGUMENTS, "attention_mask")
                      and hasattr(v, "shape")), None)
        if other is not None:  # per prompt token, most likely (position_ids, token_type_ids)
            return 0, f"the call passes the tensor {other!r}"
        if setting("max_new_tokens") is None:
            return 0, "no max_new_tokens (a length bound that counts the prompt)"
        if setting("return_dict_in_generate"):
            return 0, "return_dict_in_generate (the returned cache would hold the padding)"
        reads = next((name for name, neutral in _READS_TOKENS if setting(name) not in (None, neutral)), None)
        if reads is not None:
            return 0, f"{reads!r} reads the prompt's tokens"
        bucket = next((b for b in self.buckets if b >= shape[1]), None)
        if bucket is None:
            return 0, f"its prompt ({shape[1]} tokens) is longer than the largest bucket"
        if bucket == shape[1]:
            return 0, "its prompt fills its bucket"
        if kwargs.get("attention_mask") is None:
            pad_id = _token(setting("pad_token_id"))
            if pad_id is not None and bool((ids == pad_id).any()):
                return 0, "its prompt holds the pad token and no attention_mask (generate() infers the mask from it)"
        return bucket - shape[1], ""


class _Settings:
    """One generation setting as ``generate()`` reads it: the call's keyword argument, else the generation config
    the call passes (where it sets the value), else the model's."""

    __slots__ = ("configs", "kwargs")

    def __init__(self, kwargs: dict[str, Any], *configs: Any) -> None:
        self.kwargs = kwargs
        self.configs = [c for c in configs if c is not None]

    def __call__(self, name: str) -> Any:
        value = self.kwargs.get(name)
        if value is not None:  # an explicit None leaves the setting to the configs, as generate() does
            return value
        for config in self.configs:
            value = getattr(config, name, None)
            if value is not None:
                return value
        return None


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
