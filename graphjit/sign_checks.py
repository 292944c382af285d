"""The replay lane's C checks that sign a call like the last one (``csrc/lane_checks.c``), made here for a
:class:`keys.Signer`: :func:`layout_check` for a plain positional call (:meth:`Signer.sign_plain`), :func:`walk_check`
for a walked one (:meth:`Signer.sign_walk`: keyword arguments, containers, objects holding tensors).

Each is made once per layout or key, only where the lane is loaded, and only from what the Python path decided for
the call it is made from; each refuses exactly what that path would sign differently, or more (the Python path then
signs the call).  A check is only ever a shortcut to the key the Python path gives."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from . import env, lane, walk_spec

if TYPE_CHECKING:
    from .keys import CallSignature, Signer

log = logging.getLogger("graphjit")


def layout_check(signer: Signer, plain: tuple[Any, ...]) -> tuple[Any, ...] | bool | None:
    """The C check of ``plain``'s layout (everything in it read from ``plain``, which another thread may have replaced
    as the signer's last plain call since) for :meth:`Signer.sign_plain` (see :func:`lane.layout_check`):
    ``(check, tensor type, backend, key, labels, settings)``; None where the lane is not loaded (made at a later
    call), False where this layout has none (``layout_checks`` off, the lane switched off: made again only for another
    layout)."""
    if not signer.layout_checks:
        return False
    mod = lane.module()
    if mod is None:
        return None
    made = signer.plain_layout(plain)
    if made is None:
        return False
    backend, types, key, method, kinds, owner_part, modes = made
    check = lane.layout_check(mod, backend, types, method, kinds, owner_part, modes,
                              None if method else signer.owner, plain[7], plain[5])
    return (check, plain[5], backend, key, plain[3], env.settings()) if check is not None else False


def walk_check(signer: Signer, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any], sig: CallSignature,
               free: frozenset[tuple[int, ...]] = frozenset(),
               before: tuple[Any, ...] | None = None) -> tuple[Any, ...] | bool | None:
    """The C check of the structure of the call just walked as ``sig`` (see :meth:`Signer.sign_walk` and
    :func:`lane.walk_check`): ``(check, key, labels, backend, tensor type, settings, key maker, made of)``, ``made of``
    the check's own arguments (:meth:`Signer.walk_layout`); None where the lane
    is not loaded or switched off (made at a later call); False where this key has none: ``layout_checks`` off,
    buckets, a part :mod:`graphjit.walk_spec` does not describe, no metadata check (a tensor passed twice, say), a
    check that does not give this very call its own tensors back in the walk's order, a walk made again after the
    spec that gives another key, or an error while making it (the call itself was signed by its walk: it goes on).

    ``free``: the key paths of ints in which ``sig.key`` differs from the key walked ``before`` it and in nothing else
    (:func:`walk_spec.counters`): the check takes any int there, and the key maker (None without ``free``) makes the
    key with the call's values.  It must give both walked keys back from their values, or there is no check."""
    backend = sig.backend
    mod = lane.module()
    if mod is None or env.settings().lane == "off":
        return None
    if not signer.layout_checks or signer.buckets or backend is None or not sig.tensors:
        return False
    try:
        spec = walk_spec.spec_of_call(args, kwargs, backend, free)
        if spec is None or set(spec[2]) != free:
            return False
        method = instance is not None
        owner = instance if method else signer.owner
        owner_part = ("self", id(owner), getattr(owner, "training", None)) if owner is not None else None
        made_of = (backend, spec, method, owner_part, sig.key[-1][1], None if method else signer.owner)
        check = lane.walk_check(mod, *made_of, backend.meta_check(sig.tensors), type(sig.tensors[0]))
        if check is None:
            return False
        served = check(instance, args, kwargs)
        maker = None
        if free:
            if served is None or before is None:
                return False
            served, values = served
            maker = walk_spec.key_maker(tuple(sig.key), spec[2])
            earlier = [_at(before, path) for path in spec[2]]
            if not (_same_key(maker(values), sig.key) and _same_key(maker(earlier), before)):
                return False
        if not _same_tensors(served, sig.tensors):
            return False
        # walked again after the spec was read: the spec and the key describe one state of the arguments (another
        # thread may change an object the call holds meanwhile; the check is then not made)
        again = signer.sign_again(instance, args, kwargs)
        if again.key != sig.key or not _same_tensors(again.tensors, sig.tensors):
            return False
    except Exception as exc:
        log.debug("graphjit: no C walk check for %s: %s", signer.fn_name, exc)
        return False
    return (check, sig.key, sig.labels, backend, type(sig.tensors[0]), env.settings(), maker, made_of)



def walk_layout(signer: Signer, key: Any) -> tuple[Any, ...] | bool | None:
    """What the C walk check that signs calls of ``key`` (that very key object) was made of: ``(backend, spec,
    method, owner part, modes, owner)`` (:func:`lane.walk_check`'s arguments but its tensor check), where there is
    one without free values under the current settings and the call was signed by it (its key is that object: the plan
    is made from the call's tensors); False where the key's check takes counters (its keys change from call to
    call) or one was tried for this key and none made; else None (none yet, or this call was walked: a key equal
    to the check's, another object)."""
    settings = env.settings()
    for w in signer._walked:
        if w[5] is not settings:
            continue
        if w[1] is key:  # the call was signed by this check: its tensors are what the check gives
            return w[7] if w[6] is None else False  # (a check of counters: its keys change, never planned)
        if w[1] == key:  # signed by the walk this time (the check refused it): a later call may be the check's
            return None if w[6] is None else False
    return False if signer._walk_tried is not None and signer._walk_tried == key else None


def _at(key: tuple[Any, ...], path: tuple[int, ...]) -> Any:
    for i in path:
        key = key[i]
    return key


def _same_key(parts: tuple[Any, ...], key: tuple[Any, ...]) -> bool:
    return parts == tuple(key) and hash(parts) == hash(tuple(key))


def _same_tensors(got: list[Any] | None, want: list[Any]) -> bool:
    return got is not None and len(got) == len(want) and all(a is b for a, b in zip(got, want))
