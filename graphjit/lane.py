"""The replay lane: a call of a key that replays through its graph's feed nodes, served in C.

On the replay path a call is signed (``keys.Signer.sign_plain``), its key's entry looked up, its guards checked and
its tensors handed to the graph (``handoff.Handoff.replay``): Python, about 3.3 us a call on a development CPU with
nothing to copy, three times that on an H200's host. Once a key has replayed that way twice in a row, its plan for
the next calls is made here, once per key (:func:`plan`): the call's layout (the positions of its tensors, its plain
scalars, its owner's training flag; for a keyword call, the C walk check its signer signs it with,
:meth:`keys.Signer.walk_layout`, made again with the plan's tensor check), the framework's modes as C probes with
the values they must give (:meth:`Backend.lane_parts`), a metadata check of its tensors that includes their strides,
the key's handoff (which inputs are adopted, which copied in, where each buffer is, which outputs come out fresh)
and the graph's launch. The compiled plan (``csrc/lane.c``, ``Plan.run``) serves a later call in one C function:
checked as the Python path would check it, launched as :meth:`Handoff.replay` would launch it, its result built as
that gives it.

Guarantees: a call the lane serves acts as the Python path's replay of it: the same checks (each of them at least as
strict: strides are fixed, and a torch function mode sends back a call of a key signed outside one), the same table
written, the same launch, the same result and the same counts (kept in the plan until :func:`flush` moves them into
the stats, which every read of them does first). Anything else is a miss: ``Plan.run`` returns :data:`MISS` having
changed nothing, and the Python path decides the call. The lane never serves a keyword call its signer has no walk
check for (one whose key holds counters that change from call to call among them), ``dynamic=`` arguments, buckets,
a step context (training), a recheck to make, inputs the graph writes back, tensors fed at places the caller rebinds
(:mod:`graphjit.renewals`), settings read again since the plan (``env.refresh``), ``GRAPHJIT_DEBUG`` or
``GRAPHJIT_CHECK_OUTPUTS``, nor a call inside another graphed call.

Refuses nothing: where the C compiler or Python's headers are missing, the build fails, or ``GRAPHJIT_LANE=off``,
every call takes the Python path (:func:`status` says why). ``auto`` builds the lane once, in a background thread,
where a key first replays twice in a row and it is not built yet; ``python -m graphjit build`` builds it ahead of
time. A function decorated while the lane is loaded enters it from C (its wrapper is the lane's ``Front``); one
decorated before enters it from ``api._State.call``, one Python frame more.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import logging
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import threading
import weakref
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from . import backends, env, scope
from .errors import GraphjitError, UnrecoverableCaptureError

if TYPE_CHECKING:
    from .buffers import KeyEntry
    from .keys import CallSignature, Signer
    from .stats import FunctionStats, KeyStats

__all__ = ["MISS", "LaneHolder", "build", "flush", "front", "layout_check", "module", "plan", "prepare", "status",
           "walk_check"]

log = logging.getLogger("graphjit")

SOURCES = ("lane.c", "lane_checks.c", "lane_guards.c")  # compiled together into one library
HEADERS = ("lane.h",)
ABI = 6
FLAGS = ("-O2", "-shared", "-fPIC", "-fvisibility=hidden")

PLAN_TRIES = 8
"""Replays of a key whose plan :func:`plan` could not make yet ("not now": the first replay through the feed nodes
still to come, a walk check not made yet) after which the key is served by the Python path for good: a key signed by
a counter's check, or by the Python path only, would otherwise be planned again at every call."""

MISS: Any = object()
"""What ``Plan.run`` returns where the Python path must serve the call (nothing was changed)."""

_lock = threading.Lock()
_module: ModuleType | None = None
_building = False
_failed: str | None = None  # why there is no lane in this process (said once in the log)


class LaneBuildError(GraphjitError, RuntimeError):
    """The replay lane could not be built or loaded (no C compiler, no Python headers, a compile error)."""


# -- building and loading ----------------------------------------------------------------------
def sources() -> list[Path]:
    """``csrc/``'s lane sources of this checkout or installation: the C files, then the headers they include."""
    from .collectives import csrc_build  # on first use: graphjit.collectives is imported lazily

    folder = csrc_build.csrc_dir()
    paths = [folder / name for name in (*SOURCES, *HEADERS)] if folder is not None else []
    if not paths or not all(p.is_file() for p in paths):
        raise LaneBuildError(f"the replay lane's sources ({', '.join((*SOURCES, *HEADERS))}) are missing from this "
                             "graphjit installation")
    return paths


def compiler() -> list[str]:
    """The C compiler Python was built with (``sysconfig``'s ``CC``), else ``cc``."""
    cc = sysconfig.get_config_var("CC") or "cc"
    return shlex.split(str(cc))


def missing_tools() -> str | None:
    """What this machine lacks to build the lane (the C compiler, Python's C headers), or None where it has both."""
    if shutil.which(compiler()[0]) is None:
        return f"no C compiler ({compiler()[0]})"
    headers = Path(sysconfig.get_paths().get("include") or "") / "Python.h"
    if not headers.is_file():
        return f"Python's C headers are not installed (no {headers})"
    return None


_paths: dict[Path, Path] = {}


def library_path(cache: str | os.PathLike[str] | None = None) -> Path:
    """Where the lane built from the current source for this Python is (or will be) cached: keyed by the source's
    bytes, the lane's ABI, the flags and the interpreter (``EXT_SUFFIX`` and its version)."""
    from .collectives import csrc_build

    folder = csrc_build.cache_dir(cache)
    known = _paths.get(folder)
    if known is not None:  # the source does not change under a running process
        return known
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    h = hashlib.sha256()
    h.update(f"graphjit-lane abi={ABI} python={sys.version} flags={' '.join(FLAGS)} suffix={suffix}\n".encode())
    for path in sources():
        h.update(path.name.encode() + b"\n" + path.read_bytes())
    path = _paths[folder] = folder / f"graphjit_lane-{h.hexdigest()[:16]}{suffix}"
    return path


def build(force: bool = False, cache: str | os.PathLike[str] | None = None) -> Path:
    """Compile ``csrc/lane.c``, ``csrc/lane_checks.c`` and ``csrc/lane_guards.c`` into one library in the cache (under
    a file lock; the result renamed into place) and return its path; an up-to-date library is kept unless ``force``.
    Raises :class:`LaneBuildError` saying why it cannot."""
    from .collectives import csrc_build

    path = library_path(cache)
    include = sysconfig.get_paths().get("include") or ""
    if not (Path(include) / "Python.h").is_file():
        raise LaneBuildError(f"{missing_tools()}: install the Python development package to build the replay lane")
    path.parent.mkdir(parents=True, exist_ok=True)
    with csrc_build.FileLock(str(path) + ".lock"):
        if path.is_file() and not force:
            return path
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
        c_files = [str(p) for p in sources() if p.suffix == ".c"]
        cmd = [*compiler(), *FLAGS, f"-I{include}", *c_files, "-o", str(tmp)]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.SubprocessError) as exc:
            raise LaneBuildError(f"the C compiler could not run ({shlex.join(cmd)}): {exc}") from exc
        if done.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise LaneBuildError(f"building the replay lane failed ({shlex.join(cmd)}):\n{done.stderr[-4000:]}")
        os.replace(tmp, path)
    return path


def _load(path: Path) -> ModuleType:
    loader = importlib.machinery.ExtensionFileLoader("graphjit._lane", str(path))
    spec = importlib.util.spec_from_file_location("graphjit._lane", str(path), loader=loader)
    if spec is None:
        raise LaneBuildError(f"{path}: not loadable")
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    if getattr(mod, "ABI", None) != ABI:
        raise LaneBuildError(f"{path}: lane ABI {getattr(mod, 'ABI', None)}, graphjit expects {ABI}")
    return mod


def module() -> ModuleType | None:
    """The loaded lane, or None (not built yet, being built, switched off or failed): a replay's read, loads
    nothing."""
    return _module


def loaded_if_built() -> ModuleType | None:
    """The lane, loaded here where it is built already (never building it); None where it is not, or is off."""
    global _module
    if env.settings().lane == "off":
        return None
    if _module is not None or _failed is not None or _building:
        return _module
    try:
        if not library_path().is_file():
            return None
    except Exception:
        return None
    return prepare()


def front(state: Any, unbound: Any) -> Any:
    """The wrapper a graphed function's calls enter by (``state``: its ``api._State``; ``unbound``: the instance
    wrapt hands an unbound call, which the state takes as None): where the lane is loaded, its C ``Front``, which
    runs the plan ``state.lane`` and, where that misses, ``state.decide`` with no Python frame in between; else
    ``state.call``, which does the same in Python (a lane loaded later serves it too)."""
    mod = loaded_if_built()
    return mod.Front(state, state.decide, unbound) if mod is not None else state.call


def prepare() -> ModuleType | None:
    """Where a key has replayed twice in a row: the lane loaded where it is built; else, with ``GRAPHJIT_LANE=auto``,
    its build started in a background thread (a later call loads it), with ``on`` built here.  None where there is
    none yet."""
    global _module, _building
    mode = env.settings().lane
    if mode == "off":
        return None
    if _module is not None:
        return _module
    with _lock:
        if _failed is not None or _building:
            return None
        try:
            built = library_path().is_file()
        except Exception as exc:  # the source is missing
            _fail(str(exc))
            return None
        if not built:
            _building = True
            if mode == "auto":
                threading.Thread(target=_build, name="graphjit-lane-build", daemon=True).start()
                return None
    if not built:
        _build()
    with _lock:
        if _failed is not None or _module is not None:
            return _module
        try:
            _module = _load(library_path())
        except Exception as exc:
            _fail(str(exc))
            return None
    log.debug("graphjit: the replay lane is %s", getattr(_module, "__file__", "?"))
    return _module


def _build() -> None:
    global _building
    log.info("graphjit: building the replay lane (the C compiler, about a second; calls take the Python path until it "
             "is ready; `python -m graphjit build` builds it ahead of time)")
    try:
        build()
    except Exception as exc:
        with _lock:
            _fail(str(exc))
    finally:
        with _lock:
            _building = False


def _fail(why: str) -> None:
    global _failed
    if _failed is None:
        _failed = why
        log.info("graphjit: no replay lane (every call takes the Python path): %s", why.splitlines()[0])


def status() -> dict[str, Any]:
    """What the lane is in this process: ``loaded`` (its path), ``building``, ``failed`` (why), the setting."""
    return {"setting": env.settings().lane, "loaded": getattr(_module, "__file__", None), "building": _building,
            "failed": _failed}


# -- plans -------------------------------------------------------------------------------------
def plan(state: Any, entry: KeyEntry, sig: CallSignature) -> Any:
    """The compiled plan of ``entry``'s key for calls like the one just signed as ``sig`` (``state``: the function's
    ``api._State``); None where there is none now (the lane not loaded, the call signed neither by the plain path nor
    by a walk check), False where the key never has one (see the module docstring)."""
    mod = module()
    if mod is None:
        return None
    handoff = entry.handoff
    settings = env.settings()
    if settings.debug or settings.check_outputs:
        return None  # not under these settings (a call's plan is made again once they are read again)
    if (handoff is None or handoff.store_back is not None or handoff.broken or entry.recheck is not None
            or entry.feed is not None
            or entry.feeds is not None or state.dynamic is not None or len(sig.tensors) > mod.MAX_TENSORS):
        return False
    if not entry.stats.fed_replays:
        return None  # the first replay through the feed nodes decides who launches (Handoff.launcher)
    signer: Signer = state.signer
    last = signer.plain_layout()
    walked = None
    if last is None or last[2] is not sig.key:  # not the plain path's key: a keyword call's, signed by a walk check
        walked = signer.walk_layout(sig.key)
        if not isinstance(walked, tuple):
            return walked  # None: no check signs this key yet (a later call may have one); False: none ever will
        backend, spec, method, owner_part, modes, walk_owner = walked
    else:
        backend, types, _key, method, kinds, owner_part, modes = last
    # the tensors' strides as the handoff requires them (its buffers', an adopted input's own), not the call's
    parts = backend.lane_parts(modes, sig.tensors, entry.inputs.strides)
    feed = handoff.feed
    launch = getattr(feed, "lane_launch", None)
    launch = launch() if launch is not None else None
    if parts is None:
        return False
    owner = None if method else signer.owner  # a bound call's owner is its instance, checked by id
    if method:
        if owner_part is None:
            return None
    elif (owner is None) != (owner_part is None) or (owner_part is not None and id(owner) != owner_part[1]):
        return None
    if walked is not None:  # the signer's own check made again with the plan's tensor check (strides included)
        walk = walk_check(mod, backend, spec, method, owner_part, modes, walk_owner, parts.check)
        if walk is None:
            return False
        signing: dict[str, Any] = {"walk": walk, "n_tensors": len(sig.tensors)}
    else:
        signing = {"method": int(method), "kinds": kinds, "types": tuple(types),
                   "owner": owner, "owner_id": owner_part[1] if method and owner_part else 0,
                   "training": owner_part[2] if owner_part else None,
                   "probes": parts.probes, "expected": parts.expected, "check": parts.check}
    outputs = handoff.outputs
    lock = state.lock
    return mod.Plan({
        "miss": MISS,
        "env_dict": vars(env), "settings": settings, "tls": scope.thread_state(),
        "prebound": int(state.prebound), **signing,
        # weakly: a plan is held by its entry and by the function; it never keeps either alive (their graphs' memory)
        "state": weakref.ref(state), "key": sig.key, "entry": weakref.ref(entry),
        "entry_check": entry.check, "recheck": entry.recheck, "feeds": entry.feeds, "advances": entry.advances,
        "handoff": handoff, "acquire": lock.acquire, "release": lock.release,
        "ptr": parts.data_ptr, "negated": handoff.negated, "adopted_ptrs": set(handoff.adopted_ptrs),
        "inside_owned": handoff.inside_owned, "empty": handoff.empty,
        "adopted": tuple((i, p) for i, p, _s in handoff.adopted),
        "aliases": tuple((i, o) for i, o in handoff.aliases),
        "moved": tuple((i, static, sp, nbytes) for i, static, sp, _ss, nbytes, _wide in handoff.moved),
        "fresh": tuple(handoff.fresh),
        "table": handoff.table.buffer_info()[0],
        "in_dst": handoff.in_dst, "in_src": handoff.in_src, "in_bytes": handoff.in_bytes, "out_dst": handoff.out_dst,
        "dirty": getattr(feed, "dirty_word", -1),
        "copy": int(state.copy_outputs),
        "single_source": -1 if handoff.single_source is None else handoff.single_source,
        "rebuild": handoff.rebuild, "result": outputs.result,
        "single_output": outputs.tensors[0] if outputs.single else None,
        "fn": launch[0] if launch else 0, "stream_fn": launch[1] if launch else None,
        "stream_arg": launch[2] if launch else None, "launch_py": None if launch else feed.launch,
        "launch_failed": _launch_failed(state.name, entry.inputs.backend),
    })


def layout_check(mod: ModuleType, backend: Any, types: Any, method: bool, kinds: tuple[Any, ...],
                 owner_part: tuple[Any, ...] | None, modes: tuple[Any, ...], owner: Any,
                 check: Any, probe: type | None = None) -> Any:
    """The C check of a plain call's layout (``csrc/lane_checks.c``'s ``LayoutCheck``) for
    :meth:`keys.Signer.sign_plain`: called with ``(instance, args)``, it gives the call's tensors where graphjit's
    settings are still the current ones (not read again since, ``GRAPHJIT_LANE=off`` included), the call has
    ``kinds`` (None: a tensor of one of ``types``; else the scalar's ``(type, value)``), a bound call's instance is
    the one of ``owner_part`` (else ``owner``) with its training flag, the backend's :meth:`~Backend.mode_probes`
    give what they gave for ``modes``, the tensors pass ``check`` (the key's :meth:`~Backend.meta_check`) and, with
    ``probe`` (a tensor type), :mod:`graphjit.backends` still gives ``backend`` for it (not replaced since); else
    None, having read only. None where there is no such check (no ``check``, more tensors than the lane takes, a
    layout it cannot hold)."""
    if not 0 < kinds.count(None) <= mod.MAX_TENSORS:
        return None
    return _check(mod.LayoutCheck, backend, method, owner_part, modes, owner, check,
                  {"kinds": kinds, "types": tuple(types)}, probe)


def walk_check(mod: ModuleType, backend: Any, spec: tuple[Any, ...], method: bool,
               owner_part: tuple[Any, ...] | None, modes: tuple[Any, ...], owner: Any, check: Any,
               probe: type | None = None) -> Any:
    """The C check of a walked call's structure (``csrc/lane_checks.c``'s ``WalkCheck``) for
    :meth:`keys.Signer.sign_walk`: called with ``(instance, args, kwargs)``, it gives the call's tensors in the
    walk's order where graphjit's settings are still the current ones, every argument matches ``spec``
    (:func:`walk_spec.spec_of_call`: its positional arguments' specs, its keyword arguments' by name, the key paths
    of its free values), the owner, modes and ``probe`` are as in :func:`layout_check`, and the tensors pass
    ``check``; with free values, ``(tensors, free values)``; else None, having read only. None where there is no such
    check (no ``check``, the lane switched off, a spec the lane refuses)."""
    return _check(mod.WalkCheck, backend, method, owner_part, modes, owner, check,
                  {"args": spec[0], "kwargs": spec[1], "free": bool(spec[2])}, probe)


def _check(kind: Any, backend: Any, method: bool, owner_part: tuple[Any, ...] | None, modes: tuple[Any, ...],
           owner: Any, check: Any, parts: dict[str, Any], probe: type | None = None) -> Any:
    """A check of ``kind`` (``LayoutCheck``, ``WalkCheck``) made of ``parts`` and what both hold (the settings, the
    owner, the modes' probes, the tensors' ``check``; with ``probe``, the backend's registration for that type); None
    where there is none: no ``check``, the lane switched off, or an error while making it (a backend's probes that
    fail, parts the lane refuses: the Python path signs)."""
    if check is None or env.settings().lane == "off":
        return None
    if probe is not None:
        parts = {**parts, "by_type": backends.type_cache, "probe": probe, "backend": backend}
    try:
        probes, expected = backend.mode_probes(modes)
        return kind({
            "env_dict": vars(env), "settings": env.settings(), "method": int(method), "owner": owner,
            "owner_id": owner_part[1] if method and owner_part else 0,
            "training": owner_part[2] if owner_part else None,
            "probes": tuple(probes), "expected": tuple(expected), "check": check, **parts})
    except Exception as exc:
        log.debug("graphjit: no C %s: %s", getattr(kind, "__name__", kind), exc)
        return None


def _launch_failed(name: str, backend: Any) -> Any:
    """What a plan calls with the exception of a launch that raised: ``_State.replay``'s error for it."""

    def raise_as_the_python_path(exc: BaseException) -> None:
        poisoned = backend.poisoned
        if poisoned is not None:
            raise UnrecoverableCaptureError(f"{name}: {poisoned}") from exc
        raise exc

    return raise_as_the_python_path


def flush(plan: Any, kstats: KeyStats, fstats: FunctionStats) -> None:
    """Move the calls ``plan`` served since the last flush into the stats (``kstats``: its key's, ``fstats``: the
    function's) as the Python path counts them."""
    hits, copies, raised = plan.take()
    fstats.calls += hits + raised
    kstats.replays += hits
    kstats.fed_replays += hits
    kstats.input_copies += copies


class LaneHolder:
    """The lane of one graphed function (a mixin of ``api._State``): the plan serving its calls now, which is the
    plan of the key last replayed twice in a row by the Python path, and that key's counters (the plan holds the
    key's entry; the function holds only the plan, which a released entry retires)."""

    lane: Any = None
    lane_stats: KeyStats | None = None
    lane_settings: Any = None  # the settings the current plan was made under (env.refresh makes another)
    lane_allowed = True  # False: every call takes the Python path (benchmarks compare the two)

    def wants_lane(self, entry: KeyEntry, settings: Any) -> bool:
        """Whether a call of ``entry`` that the lane did not serve should make its plan current: not where it is
        already, unless the settings were read again since (then it misses every call)."""
        plan_ = entry.lane
        return plan_ is not False and (plan_ is None or plan_ is not self.lane or settings is not self.lane_settings)

    def arm_lane(self, entry: KeyEntry, sig: CallSignature) -> None:
        """Make ``entry``'s plan (made here once per entry and settings) the one serving calls, where it has one;
        a plan made under other settings is retired first.  Installed under the function's lock, only while
        ``entry`` is still the key's (not released meanwhile by another thread)."""
        if not self.lane_allowed or prepare() is None:
            return
        settings = env.settings()
        plan_ = entry.lane
        fresh = plan_ is None or (plan_ is not False and entry.lane_settings is not settings)
        if fresh:
            plan_ = plan(self, entry, sig)
            if plan_ is None and not (settings.debug or settings.check_outputs):
                entry.lane_tries += 1  # not now: asked again at the key's next replay, at most PLAN_TRIES times
                if entry.lane_tries >= PLAN_TRIES:
                    plan_ = False
        with self.lock:  # type: ignore[attr-defined]
            if self.entries.get(sig.key) is not entry:  # type: ignore[attr-defined]
                if fresh and plan_:
                    plan_.retire()  # released meanwhile: nothing may keep its buffers
                return
            handoff = entry.handoff
            # no handoff (none ever: a Paddle key, a piecewise one; or broken since): never a plan, noted once so
            # that its replays stop asking
            if (handoff is None or handoff.broken) and plan_ is not False:
                if fresh and plan_:
                    plan_.retire()
                plan_, fresh = False, True
            if fresh:
                old = entry.lane
                if old:
                    if old is self.lane:
                        self.drop_lane()
                    old.retire()
                entry.lane, entry.lane_settings = plan_, settings
            if not plan_:
                return  # None: not now; False: never
            self.flush_lane()
            self.lane, self.lane_stats, self.lane_settings = plan_, entry.stats, settings

    def flush_lane(self) -> None:
        """The calls the current plan served, counted in the stats (before anything reads them)."""
        with self.lock:  # type: ignore[attr-defined]
            current, kstats = self.lane, self.lane_stats
            if current is not None and kstats is not None and (current.hits or current.raised):
                flush(current, kstats, self.stats)  # type: ignore[attr-defined]

    def drop_lane(self) -> None:
        """No plan serves calls any more (its counts flushed first)."""
        with self.lock:  # type: ignore[attr-defined]
            self.flush_lane()
            self.lane = self.lane_stats = self.lane_settings = None
