"""``buckets=`` of :func:`graphjit.graphed`, checked once at decoration: which argument and dims it pads, to which
sizes (:func:`parse`).  The padding itself happens at call time, in :mod:`graphjit.keys`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .errors import ConfigError

BucketsArg = Mapping[str | int, Mapping[int, Sequence[int]]] | None


@dataclass(frozen=True)
class Pad:
    """A bucketed dimension of one tensor leaf: its real size and the size it is padded to (``keys.Signer`` records
    one per padded dimension of a call, ``buffers.StaticOutputs`` cuts the outputs back by them)."""

    leaf: int
    dim: int
    real: int
    padded: int


@dataclass(frozen=True)
class Bucket:
    """One entry of ``buckets=``: which argument (by index, position or name) and its dims' sizes, sorted."""

    label: str
    index: int | None  # an explicit positional index (self excluded)
    position: int | None  # the parameter's position in the signature (self included)
    name: str | None
    dims: tuple[tuple[int, tuple[int, ...]], ...]


def parse(fn_name: str, buckets: BucketsArg, params: list[str], names: set[str], has_var_pos: bool,
          has_var_kw: bool, known: bool) -> tuple[Bucket, ...]:
    """``buckets=`` checked against the function's parameters (``params``: its positional ones in order; ``names``:
    all it names; ``known``: whether its signature could be read), as :class:`Bucket` records.  Raises ConfigError
    naming the key or dim at fault."""
    if buckets is None:
        return ()
    if not isinstance(buckets, Mapping):
        raise ConfigError(f"{fn_name}: buckets must be a dict {{argument: {{dim: [sizes]}}}}, "
                          f"got {type(buckets).__name__}")
    out = []
    for target, dims in buckets.items():
        index: int | None = None
        position: int | None = None
        name: str | None = None
        if isinstance(target, bool) or not isinstance(target, (str, int)):
            raise ConfigError(f"{fn_name}: buckets key {target!r} must be a parameter name or a "
                              "positional index")
        if isinstance(target, int):
            if target < 0:
                raise ConfigError(f"{fn_name}: buckets key {target} must be a positional index >= 0")
            if known and not has_var_pos and target >= len(params):
                raise ConfigError(f"{fn_name}: buckets names positional argument {target}, but the "
                                  f"function takes {len(params)} positional arguments ({', '.join(params)})")
            index = target
        else:
            if known and target not in names and not has_var_kw:
                raise ConfigError(f"{fn_name}: buckets names argument {target!r}, which the function "
                                  f"does not have; its parameters are: {', '.join(sorted(names))}")
            name = target
            position = params.index(target) if target in params else None
        if not isinstance(dims, Mapping) or not dims:
            raise ConfigError(f"{fn_name}: buckets[{target!r}] must be a non-empty dict "
                              f"{{dim: [sizes]}}, got {dims!r}")
        parsed = []
        for dim, sizes in dims.items():
            if isinstance(dim, bool) or not isinstance(dim, int):
                raise ConfigError(f"{fn_name}: buckets[{target!r}] dim {dim!r} must be an integer (negative "
                                  "dims count from the end)")
            if isinstance(sizes, (str, bytes)) or not isinstance(sizes, Sequence) or not sizes:
                raise ConfigError(f"{fn_name}: buckets[{target!r}][{dim}] must be a non-empty list "
                                  f"of sizes, got {sizes!r}")
            if any(isinstance(s, bool) or not isinstance(s, int) or s <= 0 for s in sizes):
                raise ConfigError(f"{fn_name}: buckets[{target!r}][{dim}] sizes must be positive "
                                  f"integers, got {list(sizes)!r}")
            if len(set(sizes)) != len(sizes):
                twice = sorted({n for n in sizes if list(sizes).count(n) > 1})
                raise ConfigError(f"{fn_name}: buckets[{target!r}][{dim}] lists {twice} more than once")
            parsed.append((dim, tuple(sorted(sizes))))  # any order: a call pads up to the next larger size
        label = repr(target)
        out.append(Bucket(label, index, position, name, tuple(sorted(parsed))))
    return tuple(out)
