"""``python -m graphjit``: the command line.

    python -m graphjit env                       # the GRAPHJIT_* variables (markdown table)
    python -m graphjit doctor [--framework paddle|torch|all] [--collectives] [--json PATH]
    python -m graphjit bench dispatch [--iters N --repeats R --backend auto|torch|paddle]
    python -m graphjit bench decode [--backend torch|paddle --layers 8,32 --hidden 1024 --batch 1,8 ...]
    python -m graphjit bench allreduce [--sizes 4K,1M,64M --dtype bf16 --variants ... --allow-cpu]

Every ``bench`` writes a JSON file and a PNG plot under ``--out`` (default ``benchmarks/results``)
and prints a short table.  Benchmarks live in :mod:`graphjit.bench` (one module each, registered in
``graphjit.bench.REGISTRY``); other commands are added to :data:`COMMANDS`.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from . import __version__
from .errors import GraphjitError

Handler = Callable[[argparse.Namespace], int]


def _cmd_env(args: argparse.Namespace) -> int:
    from . import env

    print(env.table_markdown(), flush=True)
    return 0


def _add_env(sub: argparse._SubParsersAction, argv: Sequence[str]) -> None:
    p = sub.add_parser("env", help="print the GRAPHJIT_* environment variables (markdown table)",
                       description="Print every GRAPHJIT_* environment variable, its values, default and effect.")
    p.set_defaults(handler=_cmd_env)


def _add_doctor(sub: argparse._SubParsersAction, argv: Sequence[str]) -> None:
    from . import doctor

    p = sub.add_parser("doctor", help="check what works on this machine (GPUs, builds, capture) and why not",
                       description="Check Python, the frameworks and their builds, the GPUs, a tiny capture and "
                                   "replay per framework, Paddle's capture flags, nvcc, P2P/NVLink and CUDA IPC. "
                                   "Exits non-zero when something you asked for cannot work.")
    doctor.add_arguments(p)
    p.set_defaults(handler=doctor.run)


def _add_bench(sub: argparse._SubParsersAction, argv: Sequence[str]) -> None:
    """``bench NAME``: only the benchmark ``argv`` names is imported (for its options); the others are listed
    with their one-line help."""
    from . import bench
    from .bench import common

    p = sub.add_parser("bench", help="run a benchmark (JSON plus a PNG plot)",
                       description="Run a benchmark; results go to --out as JSON plus a PNG plot.")
    names = p.add_subparsers(dest="benchmark", metavar="{" + ",".join(bench.REGISTRY) + "}")
    names.required = True
    words = [a for a in argv if not a.startswith("-")]
    wanted = words[words.index("bench") + 1] if "bench" in words[:1] and len(words) > 1 else None
    for b in bench.REGISTRY.values():
        q = names.add_parser(b.name, help=b.help, description=b.help)
        if b.name == wanted:
            module = b.load()
            module.add_arguments(q)
            q.set_defaults(handler=module.run)
        common.add_common_arguments(q)


# Top-level commands: each entry adds one subparser (with set_defaults(handler=...)).  Adding a command is a
# function and a line here; adding a benchmark is a line in graphjit.bench.REGISTRY.
COMMANDS: list[Callable[[argparse._SubParsersAction, Sequence[str]], None]] = [_add_bench, _add_doctor, _add_env]


def _add_build(sub: argparse._SubParsersAction, argv: Sequence[str]) -> None:
    p = sub.add_parser("build", help="compile csrc (the replay lane, the custom all-reduce and batch copies) ahead of "
                                     "time into GRAPHJIT_CACHE_DIR",
                       description="Compile the replay lane (csrc/lane.c, with the C compiler) for this Python, then "
                                   "csrc/ with nvcc for each GPU architecture, into the cache directory, under a file "
                                   "lock, as the first capture and collectives.init() would on first use.")
    _build_arguments(p)
    p.set_defaults(handler=_cmd_build)


def _build_arguments(p: Any) -> None:
    p.add_argument("--arch", default=None,
                   help="comma-separated GPU architectures, e.g. sm_80,sm_90 (default: the GPUs of this machine)")
    p.add_argument("--cache-dir", default=None, help="where to put the libraries (default: GRAPHJIT_CACHE_DIR)")
    p.add_argument("--nvcc", default=None, help="the nvcc to use (default: GRAPHJIT_NVCC, PATH, CUDA_HOME)")
    p.add_argument("--force", action="store_true", help="rebuild even if the cached library exists")


def _cmd_build(args: Any) -> int:
    """The ``build`` command: compile the replay lane, then csrc for each architecture; prints one line per
    library."""
    from . import lane
    from .collectives import csrc_build

    try:
        t0 = time.perf_counter()
        existed = (not args.force) and lane.library_path(args.cache_dir).is_file()
        path = lane.build(force=args.force, cache=args.cache_dir)
        state = "cached" if existed else f"built in {time.perf_counter() - t0:.1f} s"
        sys.stdout.write(f"replay lane: {path} ({state})\n")
    except lane.LaneBuildError as exc:
        sys.stdout.write(f"graphjit build: replay lane: {exc}\n")
    sys.stdout.flush()
    try:
        given = [a for a in args.arch.split(",") if a.strip()] if args.arch else []
        archs = [csrc_build.normalize_arch(a) for a in given] if given else csrc_build.detect_archs()
        if not archs:
            raise csrc_build.BuildError("no GPU found on this machine (nvidia-smi); pass --arch, e.g. "
                                        "--arch sm_80,sm_90")
        for arch in archs:
            t0 = time.perf_counter()
            existed = (not args.force) and csrc_build.library_path(arch, args.cache_dir).is_file()
            if not existed:
                sys.stderr.write(f"graphjit build: compiling csrc for {arch} with nvcc (about 10 s) ...\n")
                sys.stderr.flush()
            path = csrc_build.build(arch, cache=args.cache_dir, nvcc=args.nvcc, force=args.force)
            state = "cached" if existed else f"built in {time.perf_counter() - t0:.1f} s"
            sys.stdout.write(f"{arch}: {path} ({state})\n")
            sys.stdout.flush()
    except csrc_build.BuildError as exc:
        sys.stdout.write(f"graphjit build: {exc}\n")
        sys.stdout.flush()
        return 1
    return 0


COMMANDS.append(_add_build)


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The command line; a benchmark's options are added only when ``argv`` names it."""
    parser = argparse.ArgumentParser(prog="python -m graphjit",
                                     description="graphjit: automatic, safe CUDA graphs for Paddle and PyTorch.")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="log graphjit's decisions (-v: info, -vv: debug)")
    parser.add_argument("--version", action="version", version=f"graphjit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in COMMANDS:
        add(sub, argv)
    return parser


@contextlib.contextmanager
def _logging(verbose: int) -> Iterator[None]:
    """Show graphjit's log on stderr for the duration of the command (warnings by default)."""
    logger = logging.getLogger("graphjit")
    level = logging.WARNING if verbose <= 0 else (logging.INFO if verbose == 1 else logging.DEBUG)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))  # the messages name graphjit
    handler.setLevel(level)
    previous = logger.level
    if logger.getEffectiveLevel() > level or logger.level == logging.NOTSET:
        logger.setLevel(level)
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (``--hard-exit`` ends the process instead)."""
    words = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(words)
    args = parser.parse_args(words)
    args.argv = words
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    try:
        with _logging(args.verbose):
            code = int(handler(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr, flush=True)
        code = 130
    except (GraphjitError, OSError) as exc:  # a setting or a path the user gave: one line that names it
        if args.verbose:
            traceback.print_exc()
        print(f"graphjit: {exc}", file=sys.stderr, flush=True)
        code = 2 if isinstance(exc, GraphjitError) else 1
    except Exception:  # a bug in a command: show it, and still reach the --hard-exit below
        traceback.print_exc()
        code = 1
    if getattr(args, "hard_exit", False):
        sys.stdout.flush()
        sys.stderr.flush()
        logging.shutdown()
        os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
