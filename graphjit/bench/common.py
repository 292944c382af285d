"""What every benchmark shares: common options, output paths, environment info, JSON, plots, tables.

Nothing here imports a framework; :func:`environment` describes only the frameworks the benchmark
already imported (``sys.modules``, through their ``device`` modules: :func:`graphjit.backends.load`), plus the installed
versions read from package metadata.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import importlib
import importlib.metadata
import importlib.util
import math
import os
import platform
import re
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..records import clean, git_commit, write_json

__all__ = ["clean", "git_commit", "write_json"]  # the benchmarks' JSON helpers are the doctor's too (records.py)

DEFAULT_OUT = Path("benchmarks") / "results"
SCHEMA_VERSION = 1


# -- command line ---------------------------------------------------------------------------------
def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    """Options every ``bench`` subcommand takes."""
    g = parser.add_argument_group("output")
    g.add_argument("--out", default=None, metavar="PATH",
                   help=f"folder for the JSON and PNG (default: {DEFAULT_OUT} under the current folder, created if "
                        "missing); a path ending in .json names the JSON file itself (the PNG goes next to it)")
    g.add_argument("--tag", default=None,
                   help="short machine tag used in the file name (default: this host's name, sanitised)")
    g.add_argument("--no-plot", action="store_true", help="write the JSON only")
    g.add_argument("--hard-exit", action="store_true",
                   help="end the process with os._exit(status) after flushing output (Paddle can hang at "
                        "interpreter exit on some GPU machines)")


def int_list(text: str) -> list[int]:
    """``"8,32"`` -> ``[8, 32]`` (argparse type)."""
    try:
        values = [int(v) for v in text.replace(" ", "").split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}")
    return values


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def sanitize_tag(text: str | None) -> str:
    """A string safe for a file name: letters, digits, ``.``, ``_`` and ``-``."""
    tag = re.sub(r"[^A-Za-z0-9_.-]+", "-", text or "").strip("-.")
    return tag[:64] or "unknown"


def machine_tag(args: argparse.Namespace) -> str:
    return sanitize_tag(args.tag if args.tag else platform.node())


def today() -> str:
    return _dt.date.today().isoformat()


def output_paths(out: str | None, default_name: str) -> tuple[Path, Path]:
    """``(json_path, png_path)``: ``out`` is a folder, or a ``.json`` file path; folders are created."""
    base = Path(out) if out else DEFAULT_OUT
    json_path = base if base.suffix.lower() == ".json" else base / default_name
    json_path.parent.mkdir(parents=True, exist_ok=True)
    return json_path, json_path.with_suffix(".png")


# -- environment ----------------------------------------------------------------------------------
def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment() -> dict[str, Any]:
    """Python, platform, CPU count, package versions, git commit, and the imported frameworks' devices."""
    from .. import __version__

    env: dict[str, Any] = {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "node": platform.node(),
        "cpu_count": os.cpu_count(),
        "graphjit": __version__,
        "git_commit": git_commit(),
        "graphjit_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("GRAPHJIT_")},
        "packages": {name: _dist_version(name) for name in
                     ("torch", "paddlepaddle", "paddlepaddle-gpu", "numpy", "matplotlib", "triton", "wrapt",
                      "transformers", "paddleformers")},
        "host_speed": host_speed(),
    }
    from .. import backends

    for framework in backends.NAMES:
        if framework in sys.modules:
            env[framework] = backends.load(framework, "device").describe()
    return env


class _Probe:
    __slots__ = ("n",)

    def __init__(self) -> None:
        self.n = 0

    def step(self, k: int) -> int:
        self.n += k
        return self.n


def host_speed(iterations: int = 20_000, repeats: int = 5) -> dict[str, Any]:
    """How fast this host runs Python just now, and how busy it is: ``python_ns`` is the best of ``repeats`` timings
    of a fixed loop of method calls, attribute writes and dict stores (nanoseconds an iteration), ``load`` the
    1-minute load average over the CPU count.  Host-bound timings (eager steps, a graphed call's host cost, a first
    ``generate()``) from two runs compare only where these are close; the same code took 1.2-2x longer on one H100
    lease than on another."""
    probe, table = _Probe(), {}
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        for i in range(iterations):
            table[i & 255] = probe.step(i & 7)
        best = min(best, (time.perf_counter_ns() - t0) / iterations)
    try:
        load = round(os.getloadavg()[0] / (os.cpu_count() or 1), 3)
    except OSError:  # (no load average on this platform)
        load = None
    return {"python_ns": round(best, 1), "load": load}


def gpu_or_exit(bench: str, framework: str, allow_cpu: bool, needs: str | None = None) -> tuple[bool, int | None]:
    """``(on_gpu, None)``: the benchmark runs on a GPU, or as the CPU smoke run with ``--allow-cpu``; or
    ``(False, exit status)`` after a one-line error on stderr: ``framework`` (or ``needs``) cannot be
    imported, or there is no GPU and no ``--allow-cpu``."""
    try:
        reason = gpu_unavailable(framework)
        if needs is not None and importlib.util.find_spec(needs) is None:
            raise ImportError(f"No module named {needs!r}")
    except ImportError as exc:
        what = framework if needs is None else f"{framework} and {needs}"
        print(f"graphjit bench {bench}: needs {what}, which cannot be imported ({exc})", file=sys.stderr, flush=True)
        return False, 1
    if reason is not None and not allow_cpu:
        print(f"graphjit bench {bench}: needs a CUDA GPU ({reason}); run it on a GPU machine, or pass --allow-cpu "
              "for a tiny CPU smoke run", file=sys.stderr, flush=True)
        return False, 1
    return reason is None, None


def gpu_unavailable(framework: str) -> str | None:
    """None when ``framework`` can run CUDA work here, else why not (imports it: ImportError if it is not
    installed)."""
    from .. import backends

    return backends.load(framework, "device").cuda_unavailable()  # type: ignore[no-any-return]


def header(benchmark: str, args: argparse.Namespace, tag: str) -> dict[str, Any]:
    return {
        "benchmark": benchmark,
        "schema": SCHEMA_VERSION,
        "created": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "tag": tag,
        "argv": list(getattr(args, "argv", []) or sys.argv[1:]),
    }


def prepare_lane() -> dict[str, Any]:
    """graphjit's replay lane built and loaded before anything is timed (a graphed function made afterwards enters it
    from its wrapper, and signing asks its C checks), and what :func:`graphjit.lane.status` says; a machine that
    cannot build it takes the Python path, as the status says."""
    from graphjit import lane

    try:
        lane.build()
        lane.prepare()
    except Exception as exc:
        return {"error": error_text(exc), **lane.status()}
    return lane.status()


# -- results --------------------------------------------------------------------------------------
def error_text(exc: BaseException) -> str:
    """``Type: first line of the message`` (at most 500 characters)."""
    msg = str(exc).strip().splitlines()
    first = next((line for line in msg if line.strip()), "")
    return f"{type(exc).__name__}: {first}"[:500]


def traceback_tail(exc: BaseException, lines: int = 12) -> str:
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return "\n".join(text.rstrip().splitlines()[-lines:])


def framework_half(module: str, name: str) -> Any:
    """``name`` from ``graphjit.bench.<module>`` (``"torch.capture"``), imported now: a benchmark's framework half,
    which imports its framework (never at the command's import)."""
    return getattr(importlib.import_module(f"{__package__}.{module}"), name)


def start(bench: str, data: dict[str, Any], json_path: Path, make: Callable[[], Any], what: str = "torch") -> Any:
    """A benchmark's framework half, made by ``make()``; the JSON's ``env`` is read again after it (now with the
    framework's devices).  Where it cannot be made, the error and its traceback's tail go into the JSON, one line
    says so, and None is returned: the command then exits 1."""
    try:
        half = make()
    except Exception as exc:
        data["error"] = error_text(exc)
        data["traceback"] = traceback_tail(exc)
        write_json(json_path, data)
        say(f"{bench}: could not start {what}: {data['error']}")
        return None
    data["env"] = environment()
    return half


def guard_cost(fn: Any, iters: int = 20000) -> dict[str, Any] | None:
    """What checking a graphed function's guards costs on the host before each replay (:mod:`graphjit.guards`):
    for its most replayed graph, the containers and values checked and the microseconds per check (median of
    5 timings of ``iters`` checks), or None if nothing is captured."""
    import time

    state = getattr(fn, "_self_state", None)
    if state is not None:
        state.flush_lane()  # the replay lane's counts (its replays) moved into the stats first
    entries = list(getattr(state, "entries", {}).values())
    if not entries:
        return None
    entry = max(entries, key=lambda e: e.stats.replays)
    guard = entry.guards
    containers, values = guard.size if guard is not None else (0, 0)
    check = entry.check
    if check is None:
        return {"containers": containers, "values": values, "tracer_guard": False, "us": 0.0}
    runs = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(iters):
            check()
        runs.append((time.perf_counter() - t0) / iters * 1e6)
    return {"containers": containers, "values": values, "tracer_guard": guard is not None and guard.extra is not None,
            "us": round(statistics.median(runs), 3)}


def median(values: Sequence[float]) -> float | None:
    return float(statistics.median(values)) if values else None


def bar_plot(path: Path, title: str, groups: Sequence[str], series: Mapping[str, Sequence[float | None]],
             ylabel: str, notes: Sequence[str] = ()) -> str | None:
    """Grouped bar chart (one group per entry of ``groups``, one bar per series) written to ``path``
    with matplotlib's Agg canvas.  Returns None on success, else why no plot was written."""
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        return f"matplotlib is not importable ({exc}); pip install 'graphjit[bench]'"
    try:
        names = list(series)
        n = max(1, len(names))
        width = 0.8 / n
        fig = Figure(figsize=(max(6.0, 1.2 + len(groups) * (0.45 * n + 0.5)), 4.8), layout="constrained")
        ax = fig.subplots()
        top = max((v for vals in series.values() for v in vals if v is not None), default=1.0)
        for j, name in enumerate(names):
            xs, ys = [], []
            for i, v in enumerate(series[name]):
                x = i - 0.4 + width * (j + 0.5)
                if v is None:
                    ax.text(x, top * 0.01, "n/a", ha="center", va="bottom", rotation=90, fontsize=7, color="grey")
                    continue
                xs.append(x)
                ys.append(v)
            bars = ax.bar(xs, ys, width=width * 0.95, label=name, color=f"C{j % 10}")
            ax.bar_label(bars, labels=[f"{y:.4g}" for y in ys], fontsize=6, rotation=90, padding=2)
        ax.set_xticks(range(len(groups)), list(groups))
        ax.set_ylabel(ylabel)
        ax.set_ylim(0, top * 1.18)
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=7, ncol=min(n, 3))
        if notes:
            fig.text(0.01, 0.005, "  ".join(notes), fontsize=6, color="dimgrey", va="bottom")
        fig.savefig(path, dpi=120)
    except Exception as exc:  # a plot is a convenience; the JSON is the result
        return error_text(exc)
    return None


def line_plot(path: Path, title: str, x: Sequence[float], series: Mapping[str, Sequence[float | None]], xlabel: str,
              ylabel: str, *, log_x: bool = False, log_y: bool = False, x_labels: Sequence[str] | None = None,
              styles: dict[str, dict[str, Any]] | None = None, notes: Sequence[str] = ()) -> str | None:
    """One line per series over ``x`` (None values leave a gap; a series with no value is left out),
    written to ``path`` with matplotlib's Agg canvas.  ``styles[name]`` adds keyword arguments to
    that series' ``ax.plot`` (``linestyle``, ``marker``, ``color``).  Returns None on success, else
    why no plot was written."""
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        return f"matplotlib is not importable ({exc}); pip install 'graphjit[bench]'"
    try:
        fig = Figure(figsize=(9.0, 5.6), layout="constrained")
        ax = fig.subplots()
        drawn = 0
        for j, (name, values) in enumerate(series.items()):
            ys = [float("nan") if v is None else float(v) for v in values]
            if all(v is None for v in values):
                continue
            kwargs: dict[str, Any] = {"marker": "o", "markersize": 3, "linewidth": 1.2, "color": f"C{j % 10}"}
            kwargs.update((styles or {}).get(name, {}))
            ax.plot(list(x), ys, label=name, **kwargs)
            drawn += 1
        if log_x:
            ax.set_xscale("log", base=2)
        if log_y:
            ax.set_yscale("log")
        if x_labels is not None:
            from matplotlib.ticker import NullLocator

            ax.set_xticks(list(x), list(x_labels), rotation=45, fontsize=7)
            ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", linewidth=0.3, alpha=0.6)
        if drawn:
            ax.legend(fontsize=7, ncol=2)
        if notes:
            with contextlib.suppress(Exception):  # keep the notes clear of the axis label (matplotlib >= 3.6)
                engine: Any = fig.get_layout_engine()  # a ConstrainedLayoutEngine, whose set() takes rect
                engine.set(rect=(0, 0.03, 1, 0.97))
            fig.text(0.01, 0.005, "  ".join(notes), fontsize=6, color="dimgrey", va="bottom")
        fig.savefig(path, dpi=120)
    except Exception as exc:  # a plot is a convenience; the JSON is the result
        return error_text(exc)
    return None


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain fixed-width table."""
    text_rows = [[_cell(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in text_rows)) if text_rows else len(h) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths))
    sep = "  ".join("-" * w for w in widths)
    body = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in text_rows]
    return "\n".join([line, sep, *body])


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
    return str(value)


def pick(bench: str, what: str, text: str, allowed: Sequence[str]) -> list[str] | None:
    """The comma-separated names of ``text``; None (after a one-line error on stderr) if any is not in
    ``allowed`` or there are none."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in allowed]
    if unknown or not names:
        print(f"graphjit bench {bench}: unknown {what} {', '.join(unknown) or '(none)'}; expected some of "
              f"{', '.join(allowed)}", file=sys.stderr, flush=True)
        return None
    return names


def say(*parts: Any) -> None:
    """print + flush (benchmarks run for minutes; output must show up as it happens)."""
    print(*parts, flush=True)


class TimeBudget:
    """A run's seconds (None: no limit): :meth:`spent` once the next step would end past them, going by the longest
    step :meth:`timed` so far."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self.start = time.perf_counter()
        self.longest = 0.0

    def spent(self) -> bool:
        return self.seconds is not None and time.perf_counter() - self.start + self.longest > self.seconds

    def skipped(self) -> dict[str, Any]:
        return {"status": "skipped", "reason": f"--time-budget of {self.seconds} s: the longest step so far "
                                              f"({self.longest:.1f} s) would end past it"}

    @contextlib.contextmanager
    def timed(self) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.longest = max(self.longest, time.perf_counter() - t0)


class GcClock:
    """The cyclic collector's automatic collections while the block runs (``gc.callbacks``): how many of each
    generation (``collections``: young, middle, old) and the seconds they took (``seconds``), as :meth:`record`
    gives them.  A benchmark's time includes these pauses; this says how much of it they were."""

    def __init__(self) -> None:
        self.collections = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self._t0 = 0.0

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
            return
        g = int(info.get("generation", 2))
        self.collections[g] += 1
        self.seconds[g] += time.perf_counter() - self._t0

    def __enter__(self) -> GcClock:
        import gc

        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        import gc

        gc.callbacks.remove(self._callback)

    def record(self) -> dict[str, Any]:
        return {"collections": list(self.collections), "seconds": [round(s, 6) for s in self.seconds],
                "total_s": round(sum(self.seconds), 6)}


def guarded(fn: Callable[..., dict[str, Any]]) -> dict[str, Any]:
    """Run one variant; an exception becomes ``{"status": "error", "error": ..., "traceback": ...}``."""
    try:
        return fn()
    except Exception as exc:
        return {"status": "error", "error": error_text(exc), "traceback": traceback_tail(exc)}


# -- a grid of sizes x variants (bench hf, bench piecewise) ----------------------------------------
def run_grid(bench: str, data: dict[str, Any], json_path: Path, layers: Sequence[int], batches: Sequence[int],
             variants: Sequence[str], run_variant: Callable[[str, int, int], dict[str, Any]],
             ratios: Callable[[dict[str, Any]], dict[str, float]]) -> list[str]:
    """Every variant at every ``layers`` x ``batch`` size into ``data["results"]["L.. B.."]`` (each guarded,
    the JSON rewritten after each), then each size's ``ratios``; returns the size names in order."""
    groups = []
    for n_layers in layers:
        for batch in batches:
            name = f"L{n_layers} B{batch}"
            groups.append(name)
            entry: dict[str, Any] = {"layers": n_layers, "batch": batch, "variants": {}}
            data["results"][name] = entry
            for v in variants:
                say(f"{bench}: {name}: {v} ...")
                entry["variants"][v] = guarded(lambda v=v, n=n_layers, b=batch: run_variant(v, n, b))
                write_json(json_path, data)
            entry["ratios"] = ratios(entry)
    return groups


def us_per_step(entry: dict[str, Any], variant: str) -> float | None:
    """A grid entry's median microseconds per step for ``variant`` (None unless it ran ok)."""
    v = entry.get("variants", {}).get(variant) or {}
    return v.get("us_per_step") if v.get("status") == "ok" else None


def plot_grid(data: dict[str, Any], png_path: Path, no_plot: bool, title: str, groups: Sequence[str],
              variants: Sequence[str], ylabel: str) -> None:
    """The grid's bar plot (unless ``no_plot``); sets ``data["plot"]`` (and ``data["plot_error"]``)."""
    note = None
    if not no_plot:
        note = bar_plot(png_path, title, groups,
                        {v: [us_per_step(data["results"][g], v) for g in groups] for v in variants}, ylabel)
    data["plot"] = None if (no_plot or note) else png_path.name
    if note:
        data["plot_error"] = note


def grid_options(bench: str, args: argparse.Namespace, on_gpu: bool, gpu_defaults: Mapping[str, Any],
                 cpu_defaults: Mapping[str, Any], allowed: Sequence[str], warmup_why: str) -> list[str] | None:
    """Fill the options left unset from the GPU or CPU defaults and check ``--variants`` and ``--warmup`` (at
    least 3: ``warmup_why``); returns the variants, or None after a one-line error on stderr (exit status 2)."""
    for key, value in (gpu_defaults if on_gpu else cpu_defaults).items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    variants = pick(bench, "variant(s)", args.variants, allowed)
    if variants is None:
        return None
    if args.warmup < 3:
        print(f"graphjit bench {bench}: --warmup {args.warmup}: expected at least 3 ({warmup_why})", file=sys.stderr,
              flush=True)
        return None
    return variants


def ratios(entry: dict[str, Any], pairs: Mapping[str, tuple[str, str]]) -> dict[str, float]:
    """``{name: us(a) / us(b)}`` for each ``name: (a, b)`` of ``pairs`` where both variants ran ok."""
    out = {}
    for name, (a, b) in pairs.items():
        x, y = us_per_step(entry, a), us_per_step(entry, b)
        if x and y:
            out[name] = x / y
    return out


def grid_problems(data: dict[str, Any], wrong: Callable[[str, dict[str, Any]], str | None]) -> list[str]:
    """``size/variant: ...`` for every variant that did not run ok (nor was skipped), and for every ok one
    that ``wrong(variant, result)`` finds wrong (its text)."""
    problems = []
    for name, entry in data["results"].items():
        for v, res in entry["variants"].items():
            if res.get("status") not in ("ok", "skipped"):
                problems.append(f"{name}/{v}: {res.get('status')}: {res.get('error') or res.get('stats')}")
            elif res.get("status") == "ok":
                why = wrong(v, res)
                if why:
                    problems.append(f"{name}/{v}: {why}")
    return problems


def finish(bench: str, data: dict[str, Any], json_path: Path, png_path: Path) -> int:
    """Print the summary's problems and the files written; the exit status (0: no problem)."""
    for problem in data["summary"]["problems"]:
        say(f"{bench}: {problem}")
    say(f"wrote {json_path}" + (f" and {png_path}" if data["plot"] else ""))
    return 0 if data["summary"]["ok"] else 1


def grid_header(bench: str, args: argparse.Namespace, tag: str, on_gpu: bool, config: dict[str, Any],
                timer: str | None = None) -> dict[str, Any]:
    """The JSON record of a torch benchmark before its results (``config`` plus the timer used: ``timer``, or CUDA
    events on a GPU and the host clock on the CPU)."""
    data = header(bench, args, tag)
    data.update({"backend": "torch", "device": "cuda" if on_gpu else "cpu", "smoke": not on_gpu,
                 "config": {**config, "timer": timer or ("cuda_events" if on_gpu else "host")}, "env": environment(),
                 "results": {}, "complete": False})
    return data
