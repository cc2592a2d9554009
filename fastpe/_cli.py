"""The command line: ``python -m fastpe [info | bench | demo]``.

Exit codes: 0 success; 1 the command ran but failed (a result check, a missing optional
dependency such as matplotlib for --plot, a file whose writing fails); 2 usage errors
(argparse's convention), an output path that cannot be written among them (checked
before the run); 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, TextIO

import fastpe

from . import _bench, _checks, _threads

PROG = "python -m fastpe"


class CommandError(Exception):
    """A failure to report in one line, exit code 1."""


# ---- info ---------------------------------------------------------------------------------

def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# The instruction-set extensions that matter to fastpe's kernels (AVX2 + FMA + F16C + BMI2 for
# the avx2 variant, AVX-512 F/BW/DQ/VL besides for the avx512 one; avx512_bf16 and
# avx512_fp16 for reference: no variant uses them).
CPU_FEATURES = ("sse4_2", "avx", "avx2", "fma", "f16c", "bmi2", "avx512f", "avx512bw",
                "avx512dq", "avx512vl", "avx512_bf16", "avx512_fp16")


def cpu_features() -> list[str] | None:
    """Which of CPU_FEATURES this CPU has, from /proc/cpuinfo (None elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return [name for name in CPU_FEATURES if name in flags]
    except OSError:
        pass
    return None


def machine_info() -> dict[str, Any]:
    return {"cpu": cpu_model(), "logical_cpus": os.cpu_count(),
            "cpu_features": cpu_features(), "platform": platform.platform()}


def _yes(flag: object) -> str:
    return "yes" if flag else "no"


def info_text(info: Mapping[str, Any]) -> str:
    rows = [("version", info.get("version"))]
    backend = info.get("backend")
    if info.get("compiled"):
        rows.append(("backend", f"{backend} (compiled kernels loaded" + (
            "; fastpe.reference runs every call, no compiled kernel)" if backend == "numpy"
            else ")")))
    else:
        rows.append(("backend", f"{backend} (compiled kernels NOT loaded: "
                                f"{info.get('import_error', 'unknown reason')})"))
    rows.append(("OpenMP", _yes(info.get("openmp"))))
    rows.append(("threads", f"{info.get('num_threads')} (fastpe.get_num_threads(); "
                            "OMP_NUM_THREADS or fastpe.set_num_threads() change it)"))
    if info.get("compiled"):
        forced = os.environ.get("FASTPE_ISA", "").strip()
        how = f"FASTPE_ISA={forced}" if forced else "chosen by default"
        rows.append(("ISA variant", f"{info.get('isa')} ({how}; this CPU runs: "
                                    f"{', '.join(info.get('isa_available') or []) or '-'})"))
        rows.append(("compile flags", info.get("compile_flags")))
        rows.append(("float16", f"{info.get('half_conversion')} conversion"))
        rows.append(("bfloat16 rounding", f"{info.get('bfloat16_narrowing')} (RoPE, the "
                                          "sinusoidal and learned adds, ALiBi)"))
    rows.append(("bfloat16", "yes (ml_dtypes)" if info.get("bfloat16")
                 else "no (pip install ml_dtypes)"))
    rows.append(("NumPy", info.get("numpy")))
    rows.append(("Python", f"{info.get('python')} on {info.get('machine')}"))
    rows.append(("CPU", f"{cpu_model()} ({os.cpu_count()} logical CPUs)"))
    features = cpu_features()
    if features is not None:
        rows.append(("CPU features", " ".join(features) or "-"))
    shown = {"version", "backend", "compiled", "import_error", "openmp", "num_threads", "isa",
             "isa_available", "compile_flags", "half_conversion", "bfloat16_narrowing",
             "bfloat16", "numpy",
             "python", "machine"}
    rows += [(k, v) for k, v in info.items() if k not in shown]
    width = max(len(k) for k, _ in rows)
    lines = [f"fastpe {info.get('version')} ({Path(fastpe.__file__).parent})"]
    lines += [f"  {k:<{width}}  {v}" for k, v in rows[1:]]
    return "\n".join(lines) + "\n"


def cmd_info(args: argparse.Namespace) -> int:
    info = fastpe.info()
    if args.json:
        print(json.dumps({**info, "machine_info": machine_info()}, indent=2))
    else:
        sys.stdout.write(info_text(info))
    return 0


# ---- bench --------------------------------------------------------------------------------

class Progress:
    """A progress line on stderr: overwritten in place on a terminal; elsewhere (logs,
    CI, pipes) one plain line per workload."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.prefix = ""

    def workload(self, text: str) -> None:
        self.prefix = text
        if self.tty:
            self._show(text)
        else:
            self.stream.write(text + "\n")
            self.stream.flush()

    def step(self, text: str) -> None:
        if self.tty:
            self._show(f"{self.prefix}: {text}")

    def _show(self, text: str) -> None:
        self.stream.write("\r\x1b[K" + text[:200])
        self.stream.flush()

    def done(self) -> None:
        if self.tty:
            self.stream.write("\r\x1b[K")
            self.stream.flush()


def format_time(s: float) -> str:
    if s < 1e-3:
        return f"{s * 1e6:.3g} us"
    if s < 1.0:
        return f"{s * 1e3:.3g} ms"
    return f"{s:.3g} s"


class _Limits(Protocol):
    def restore_original_limits(self) -> None: ...


def _limit_blas_threads() -> _Limits | None:
    """NumPy's OpenBLAS threads busy-wait for a while after a BLAS call; on a small
    machine one can steal the core a measurement runs on. OPENBLAS_NUM_THREADS must be
    set before NumPy is imported, which `python -m fastpe` has already done (importing
    the package), so unless the user set it, limit them now through threadpoolctl when
    it is installed. (The workloads call no BLAS; this guards against surprises.)"""
    if "OPENBLAS_NUM_THREADS" in os.environ:
        return None
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return None
    limits: _Limits = threadpool_limits(limits=1, user_api="blas")
    return limits


def _threads_arg(text: str) -> int:
    if text.strip().lower() in ("all", "-1"):
        return fastpe.get_num_threads()
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a positive integer, 'all' or -1, got {text!r}") from None
    if n <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, 'all' or -1, got {n}")
    if n > _threads.MAX_THREADS:
        raise argparse.ArgumentTypeError(f"expected at most {_threads.MAX_THREADS} threads "
                                         f"(fastpe.set_num_threads' cap), got {n}")
    return n


def _peers_arg(text: str) -> tuple[str, ...]:
    if text.strip().lower() == "all":
        return _bench.PEERS
    if text.strip().lower() == "none":
        return ()
    # once each; the names are lower case (Numba, ONNXRuntime and JAX as well)
    names = tuple(dict.fromkeys(n.strip().lower() for n in text.split(",") if n.strip()))
    unknown = [n for n in names if n not in _bench.PEERS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"expected 'all', 'none' or names from "
                                         f"{', '.join(_bench.PEERS)}; got {text!r}")
    return names


def _need_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise CommandError("--plot needs matplotlib, which is not installed "
                           "(pip install matplotlib, or pip install 'fastpe[bench]')") from None


# what matplotlib's savefig writes, by the file name's suffix (none: PNG, FILE.png)
PLOT_FORMATS = (".png", ".pdf", ".svg", ".svgz", ".eps", ".ps", ".jpg", ".jpeg", ".tif",
                ".tiff", ".webp", ".pgf", ".raw", ".rgba")


def _check_output_path(parser: argparse.ArgumentParser, option: str, path: str | None) -> None:
    """Refuse, before anything runs, an output the run could not write at its end."""
    if path is None or (path == "-" and option == "--json"):
        return
    if option == "--plot" and path == "-":
        parser.error("--plot -: a plot is a file (--json - is standard output)")
    # the file savefig writes: a name without a suffix gets .png
    target = Path(_plot_path(path) if option == "--plot" else path).expanduser().resolve()
    if target.parent.exists() and not target.parent.is_dir():
        parser.error(f"{option} {path}: {target.parent} is not a directory")
    if not target.parent.is_dir():
        parser.error(f"{option} {path}: directory {target.parent} does not exist")
    if target.is_dir():
        parser.error(f"{option} {path}: {target} is a directory, not a file")
    if option == "--plot" and target.suffix and target.suffix.lower() not in PLOT_FORMATS:
        parser.error(f"--plot {path}: matplotlib writes {', '.join(PLOT_FORMATS)} files "
                     f"(by the suffix), not {target.suffix}")
    # opened now (and left as it was), so that a run of minutes is not lost at its end
    existed = target.exists()
    try:
        with open(target, "a"):
            pass
    except OSError as exc:
        parser.error(f"{option} {path}: cannot be written ({exc.strerror or exc})")
    if not existed:
        target.unlink(missing_ok=True)


def _plot_path(path: str) -> str:
    """Where savefig writes `path`: a name without a suffix gets .png."""
    return path if Path(path).suffix else path + ".png"


def _peer_names(rows: list[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(n for r in rows for n in r.get("peers", {})))


def floor_cell(row: Mapping[str, Any]) -> str:
    """The % floor cell: "-" without a floor, "noise" past NOISE_FRACTION."""
    if row["fraction_of_floor"] is None:
        return "-"
    if row["floor_noise"]:
        return "noise"
    return f"{100 * row['fraction_of_floor']:.0f}%"


def bench_table(report: dict[str, Any]) -> str:
    rows = report["results"]
    info = report["fastpe"]
    threads = report["threads"]
    peers = _peer_names(rows)
    ran_on = (f"{threads} thread{'s' if threads != 1 else ''} (of {info['num_threads']})"
              if info["backend"] != "numpy" or threads == 1 else
              f"1 thread (the numpy backend runs one; {threads} asked)")
    head = [
        f"fastpe {info['version']} bench: {report['dtype']}, fastpe on {ran_on}; "
        f"{info['backend']} backend"
        + (f", {info['isa']} kernels" if info.get("isa") and info["backend"] == "cython"
           else " (fastpe.reference: no compiled kernel runs)" if info["backend"] == "numpy"
           else "")
        + f"; {report['machine']['cpu']}, {report['machine']['logical_cpus']} CPUs",
        f"Medians of up to {report['rounds']} round{'s' if report['rounds'] != 1 else ''}, "
        "every contender in each round in a "
        f"random order, each sample after one untimed call ({report['mode']} mode).",
        "floor: the fastest way to move the same bytes, round by round (in-place passes: "
        "NumPy's, C loops with plain stores, prefetches ahead or streaming stores; a fill "
        "with streaming stores for tables);",
        "% floor = floor time / fastpe time in the same round (median), fastpe's fraction of "
        "memory bandwidth; GB/s: the floor's bytes moved / fastpe time.",
        f"noise: fastpe measured faster than {100 * _bench.NOISE_FRACTION:.0f}% of its floor, "
        "which no pass over those bytes can be: the machine was busy; run again.",
    ]
    if peers:
        head.append("Peers (" + ", ".join(peers) + "): their time / fastpe's, one thread"
                    + (" (fastpe-torch: fastpe's threads)" if "fastpe-torch" in peers
                       and threads != 1 else "")
                    + ", each result checked against fastpe.reference; above 1x fastpe is "
                    "faster.")
    if not info.get("compiled"):
        head.append("WARNING: the compiled kernels are not loaded: 'fastpe' is the NumPy "
                    "fallback here. In a source checkout, python -m puts ./fastpe (not built) "
                    "first on sys.path: install with `pip install -e .`, or run elsewhere.")
    title_w = max([len("workload")] + [len(r["title"]) for r in rows])
    cols = ["fastpe", "numpy", "floor", "vs numpy", "% floor", "GB/s"] + peers
    width = max(9, *(len(c) for c in cols))
    lines = head + ["", f"{'workload':<{title_w}}  " + "  ".join(f"{c:>{width}}" for c in cols)]
    for r in rows:
        t = r["seconds"]
        cells = [format_time(t["fastpe"]), format_time(t["numpy"]),
                 "-" if t["floor"] is None else format_time(t["floor"]),
                 f"{r['speedup_vs_numpy']:.1f}x", floor_cell(r),
                 "-" if r["fastpe_gb_per_s"] is None else f"{r['fastpe_gb_per_s']:.1f}"]
        cells += [f"{r['peers'][n]:.2f}x" if n in r.get("peers", {}) else "-" for n in peers]
        mark = "" if r["check"] == "ok" else "  MISMATCH"
        lines.append(f"{r['title']:<{title_w}}  " + "  ".join(f"{c:>{width}}" for c in cells)
                     + mark)
    lines.append("")
    lines.append("numpy: the best NumPy a careful user writes, single-threaded, "
                 "temporaries preallocated:")
    name_w = max(len(r["name"]) for r in rows) if rows else 0
    for r in rows:
        lines.append(f"  {r['name']:<{name_w}}  {r['numpy_baseline']}")
    for r in rows:
        if "inner" in r:
            inner = r["inner"]
            sec = inner["seconds"]
            lines.append(f"{r['name']}: {inner['part']} timed inside the step: fastpe "
                         f"{format_time(sec['fastpe'])}, numpy {format_time(sec['numpy'])} "
                         f"({inner['speedup_vs_numpy']:.1f}x); the rest of the step is the "
                         "same code")
    for s in report["skipped"]:
        lines.append(f"skipped {s['name']}: {s['reason']}")
    # a peer asked for that has no column: why (it ran in no workload of the run)
    noted = {s["name"] for s in report["skipped"]}
    for name in report.get("peers", []):
        if name not in peers and name not in noted:
            why = sorted({r["skipped"][name] for r in rows if name in r.get("skipped", {})})
            lines.append(f"skipped {name}: " + ("; ".join(why) if why else
                                                 "it implements none of these workloads"))
    for r in rows:
        if r["check"] != "ok":
            lines.append(f"MISMATCH {r['name']}: {r['check']}")
    lines.append(f"({report['elapsed_s']:.0f} s)")
    return "\n".join(lines) + "\n"


def bench_plot(report: dict[str, Any], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["results"]
    names = [r["name"] for r in rows][::-1]
    against = ["numpy"] + _peer_names(rows)
    # only rows whose fraction is a measure of bandwidth: not a program, not noise
    frac = [None if r["fraction_of_floor"] is None or r["floor_noise"]
            else 100 * r["fraction_of_floor"] for r in rows][::-1]
    notes = ["no floor (a program)" if r["fraction_of_floor"] is None else "noise"
             for r in rows][::-1]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 0.5 * len(rows) * len(against) ** 0.5 + 2),
                                 sharey=True)
    # Ratio bars start at 1.0 (no difference), so a loss (below 1x) points left.
    height = 0.8 / len(against)
    ratios = []
    for i, other in enumerate(against):
        vals = [(r["speedup_vs_numpy"] if other == "numpy" else r.get("peers", {}).get(other))
                for r in rows][::-1]
        ys = [y - 0.4 + height * (i + 0.5) for y in range(len(rows))]
        pts = [(y, v) for y, v in zip(ys, vals) if v is not None]
        if not pts:
            continue
        a1.barh([y for y, _ in pts], [v - 1.0 for _, v in pts], left=1.0, height=height,
                label=f"vs {other}")
        for y, v in pts:
            a1.annotate(f"{v:.2g}x", (v, y), xytext=(3 if v >= 1 else -3, 0),
                        textcoords="offset points", va="center",
                        ha="left" if v >= 1 else "right", fontsize=7)
        ratios += [v for _, v in pts]
    a1.set_yticks(range(len(rows)), names)
    a1.set_xscale("log")
    lo, hi = min(ratios + [1.0]), max(ratios + [1.0])
    a1.set_xlim(lo / 1.6, hi * 1.6)
    a1.axvline(1.0, color="k", lw=0.8)
    a1.set_xlabel("their time / fastpe's (log scale; right of 1: fastpe faster)")
    a1.legend(fontsize=7, loc="lower right")
    a2.barh(names, [0.0 if v is None else v for v in frac], color="tab:green")
    a2.axvline(100.0, color="k", lw=0.8, ls="--")
    a2.set_xlabel("% of memory bandwidth (floor time / fastpe time)")
    for y, (v, note) in enumerate(zip(frac, notes)):
        a2.annotate(note if v is None else f"{v:.0f}%", (0.0 if v is None else v, y),
                    xytext=(3, 0), textcoords="offset points", va="center", fontsize=8,
                    color="tab:gray" if v is None else "k")
    a2.set_xlim(0, 110.0)
    info = report["fastpe"]
    fig.suptitle(f"fastpe {info['version']} bench, {report['dtype']}, "
                 f"{report['threads']} thread(s), {report['machine']['cpu']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def peers_wanted(args: argparse.Namespace) -> tuple[str, ...]:
    """--peers, or its default: every peer for the full run, none for --quick (the peers'
    set-up, torch.compile's above all, takes longer than the quick run itself)."""
    if args.peers is not None:
        return tuple(args.peers)
    return () if args.quick else _bench.PEERS


def size_wanted(args: argparse.Namespace) -> str:
    """--size, or its default: the canonical shapes, their quick variant with --quick."""
    if args.size is not None:
        return str(args.size)
    return "quick" if args.quick else "full"


def run_bench(args: argparse.Namespace, progress: Progress) -> dict[str, Any]:
    # before the peers load: torch sets the OpenMP runtime it shares with fastpe to
    # one thread
    info = fastpe.info()
    wls = _bench.select(_bench.workloads(size_wanted(args)), args.only)
    skipped = [{"name": wl.name, "reason": f"runs in {', '.join(wl.dtypes)} only"}
               for wl in wls if args.dtype not in wl.dtypes]
    wls = [wl for wl in wls if args.dtype in wl.dtypes]
    peers = peers_wanted(args)
    for name, reason in _bench.attach_peers(wls, peers).items():
        hint = " (pip install 'fastpe[peers]')" if reason.endswith("not installed") else ""
        skipped.append({"name": name, "reason": reason + hint})
    mode_name = "quick" if args.quick else "default"
    mode = _bench.MODES[mode_name].copy()
    if args.rounds is not None:
        mode["rounds"] = args.rounds
        mode["min_rounds"] = min(mode["min_rounds"], args.rounds)
    start = time.perf_counter()
    results = []
    for i, wl in enumerate(wls):
        progress.workload(f"fastpe bench: [{i + 1}/{len(wls)}] {wl.name}")
        results.append(_bench.run_workload(wl, args.dtype, args.threads, mode=mode,
                                           progress=progress.step,
                                           own_threads=_bench.peers.FASTPE_PEERS))
    progress.done()
    return {
        # 2: the floor per round and its noise flag, rows without a floor (None), the
        # program's inner part
        "schema": "fastpe-bench/2",
        "fastpe": info,
        "machine": machine_info(),
        "dtype": args.dtype,
        "threads": args.threads,
        "mode": mode_name,
        "size": size_wanted(args),
        "rounds": mode["rounds"],
        "peers": list(peers),
        "elapsed_s": time.perf_counter() - start,
        "results": results,
        "skipped": skipped,
    }


def _check_only(parser: argparse.ArgumentParser,
                args: argparse.Namespace) -> list[_bench.Workload]:
    """The workloads --only selects; refused: an --only that names nothing, a part of it
    that matches no workload (a typo would drop silently), and a selection none of whose
    workloads runs in --dtype."""
    every = _bench.workloads(size_wanted(args))
    if args.only is not None:
        parts = [p.strip() for p in args.only.split(",")]
        if not any(parts):
            parser.error(f"--only {args.only!r} names no workload (see --list)")
        for part in filter(None, parts):
            if not _bench.select(every, part):
                parser.error(f"--only {part!r} matches no workload (see --list)")
    chosen = _bench.select(every, args.only)
    if not args.list and not any(args.dtype in wl.dtypes for wl in chosen):
        runs_in = sorted({d for wl in chosen for d in wl.dtypes})
        parser.error(f"no workload selected runs in --dtype {args.dtype} (they run in "
                     f"{', '.join(runs_in)})")
    return chosen


def cmd_bench(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    chosen = _check_only(parser, args)
    if args.list:
        for wl in chosen:
            runs = args.dtype in wl.dtypes
            print(f"{wl.name:<22} {wl.title}" + ("" if runs else f" (not in {args.dtype})"))
        return 0
    _check_output_path(parser, "--json", args.json)
    _check_output_path(parser, "--plot", args.plot)
    if (args.json and args.plot and args.json != "-" and Path(args.json).expanduser().resolve()
            == Path(_plot_path(args.plot)).expanduser().resolve()):
        parser.error(f"--json {args.json} and --plot {args.plot} name the same file")
    if args.plot:
        _need_matplotlib()
    if args.dtype == "bfloat16":
        try:
            loaded = _checks.ml_dtypes(load=True)
        except Exception as exc:  # installed but broken (built for another NumPy)
            raise CommandError(f"--dtype bfloat16 needs ml_dtypes, which failed to import "
                               f"({type(exc).__name__}: {exc})") from None
        if loaded is None:
            raise CommandError("--dtype bfloat16 needs ml_dtypes (pip install ml_dtypes)")
    limits = _limit_blas_threads()
    try:
        report = run_bench(args, Progress())
    finally:
        if limits is not None:
            limits.restore_original_limits()
    text = bench_table(report)
    if args.json == "-":
        json.dump(report, sys.stdout, indent=1)
        sys.stdout.write("\n")
        sys.stderr.write(text)
    else:
        sys.stdout.write(text)
        if args.json:
            try:
                with open(args.json, "w") as f:
                    json.dump(report, f, indent=1)
                    f.write("\n")
            except OSError as exc:
                raise CommandError(f"cannot write --json {args.json}: {exc}") from None
    if args.plot:
        try:
            bench_plot(report, args.plot)
        except (OSError, RuntimeError, ValueError) as exc:
            # matplotlib's own failures too (.pgf without a LaTeX: a RuntimeError)
            raise CommandError(f"cannot write --plot {args.plot}: {exc}") from None
        print(f"plot written to {_plot_path(args.plot)}", file=sys.stderr)
    bad = [r["name"] for r in report["results"] if r["check"] != "ok"]
    if bad:
        raise CommandError(f"results differ from fastpe.reference on: {', '.join(bad)}")
    return 0


# ---- demo ---------------------------------------------------------------------------------

def cmd_demo(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from . import _demo
    if args.plot:
        _check_output_path(parser, "--plot", args.plot)
        _need_matplotlib()
    sys.stdout.write(_demo.demo_text())
    if args.plot:
        try:
            _demo.plot(args.plot)
        except (OSError, RuntimeError, ValueError) as exc:
            raise CommandError(f"cannot write --plot {args.plot}: {exc}") from None
        print(f"plot written to {_plot_path(args.plot)}", file=sys.stderr)
    return 0


# ---- parser -------------------------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose --help and --version text that stdout cannot take is an
    OSError (main's error line, exit 1), where argparse ignores it and exits 0."""

    def _print_message(self, message: str, file: Any = None) -> None:
        if message and file is sys.stdout:
            file.write(message)
            file.flush()   # buffered, the failure would come only at exit's flush
        else:
            super()._print_message(message, file)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="fastpe: fast, exact transformer positional encodings. Without a "
                    "command, prints `info`.",
        epilog="exit codes: 0 ok, 1 failed (a result check, a missing optional "
               "dependency, a file whose writing fails), 2 usage error (an output "
               "path that cannot be written included)")
    parser.add_argument("--version", action="version", version=f"fastpe {fastpe.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="{info,bench,demo}")

    p = sub.add_parser("info", help="version, backend, OpenMP, threads, ISA variant, "
                                    "compiler flags",
                       description="What this installation of fastpe runs (fastpe.info()).")
    p.add_argument("--json", action="store_true", help="print fastpe.info() as JSON")

    p = sub.add_parser(
        "bench", help="the canonical workloads: fastpe vs NumPy, other libraries and memory "
                      "bandwidth",
        description="Time the canonical workloads (LLaMA-7B-like RoPE prefill and decode, "
                    "batched decode, Llama-3-scaled RoPE, Qwen2-VL-like M-RoPE, a "
                    "sinusoidal table, sinusoidal and learned adds, BLOOM-like ALiBi "
                    "prefill, bias table and decode, a T5 decoder step's bucketed bias, "
                    "DeBERTa-v3's disentangled bias, and a decode step of a small NumPy "
                    "Llama with RoPE timed inside it): fastpe, the best single-threaded "
                    "NumPy, other libraries where installed (numba, ONNX Runtime, torch, "
                    "torch.compile, fastpe on torch tensors, jax) and the floor (the "
                    "fastest way to move the same bytes: in-place passes, or a fill with "
                    "streaming stores for tables), all measured side by side in the same "
                    "shuffled rounds; prints medians, the speedups and fastpe's fraction "
                    "of the floor (of memory bandwidth), flagging as noise a row measured "
                    "past 105% of its floor. A few minutes with every peer; --quick (no "
                    "peers unless --peers asks) under 20 seconds on two cores.")
    p.add_argument("--quick", action="store_true",
                   help="fewer, shorter rounds, ALiBi prefill and bias over 1024 tokens "
                        "instead of 2048, no peers unless --peers names them: under 20 "
                        "seconds")
    # Default 1: NumPy's ufuncs are single-threaded, so speedups compare like with like;
    # the speed targets are single-threaded; and on a small shared machine an
    # OpenMP team stalls whenever another process holds one of its cores (measured here:
    # 2-thread RoPE prefill 2 ms -> 20 ms, batched decode 16 us -> 24 ms, with one core
    # busy), which would make the default table a measure of the neighbours.
    p.add_argument("--threads", type=_threads_arg, default=1, metavar="N",
                   help="threads for fastpe and the floor: a positive count or 'all' "
                        f"(-1 too, as set_num_threads reads it; = {fastpe.get_num_threads()} "
                        "here); default 1, like NumPy's "
                        "single-threaded ufuncs")
    p.add_argument("--dtype", choices=("float32", "float16", "bfloat16", "float64"),
                   default="float32",
                   help="dtype of the arrays (default float32; bfloat16 needs ml_dtypes and "
                        "runs the one-axis RoPE workloads, the sinusoidal and learned adds "
                        "and DeBERTa's bias)")
    p.add_argument("--only", metavar="NAMES",
                   help="comma-separated parts of workload names (e.g. rope,alibi-decode)")
    p.add_argument("--list", action="store_true", help="list the workloads and exit")
    p.add_argument("--peers", type=_peers_arg, default=None, metavar="NAMES",
                   help="other libraries timed beside fastpe where installed: "
                        f"comma-separated from {', '.join(_bench.PEERS)}, 'all' or 'none' "
                        "(default: all, or none with --quick)")
    p.add_argument("--json", metavar="FILE",
                   help="also write every number (all samples, shapes, fastpe.info()) as "
                        "JSON to FILE; '-' prints JSON on stdout and the table on stderr")
    p.add_argument("--plot", metavar="FILE.png",
                   help="draw speedups and %% of floor to FILE.png (needs matplotlib)")
    # For the tests: tiny arrays and a fixed number of rounds.
    p.add_argument("--size", choices=tuple(_bench.SIZES), default=None, help=argparse.SUPPRESS)
    p.add_argument("--rounds", type=int, default=None, help=argparse.SUPPRESS)
    p.set_defaults(bench_parser=p)

    p = sub.add_parser("demo", help="RoPE's relative positions, sinusoidal frequencies, "
                                    "ALiBi slopes, with numbers",
                       description="The encodings' defining properties with numbers: equal RoPE "
                                   "dot products at positions (2, 5) and (10, 13), "
                                   "sinusoidal frequencies falling across dimensions, ALiBi "
                                   "slopes and one bias row per head.")
    p.add_argument("--plot", metavar="FILE.png",
                   help="draw RoPE's q.k by position, a sinusoidal table and ALiBi's "
                        "per-head biases (needs matplotlib)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    if sys.stdout is None:
        # started with stdout closed (`>&-`): Python then has no sys.stdout at all
        if sys.stderr is not None:
            print(f"{PROG}: error: standard output is closed", file=sys.stderr)
        return 1
    try:
        args = parser.parse_args(argv)   # --help and --version write here (_Parser)
        if args.command == "bench" and args.rounds is not None and args.rounds < 1:
            args.bench_parser.error("--rounds must be at least 1")
        status = _run(args, parser)
        # stdout written to a file or a pipe is buffered: a short output fails to be
        # written only at exit's flush, which Python reports as an ignored exception
        sys.stdout.flush()
        return status
    except CommandError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"\n{PROG}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`python -m fastpe bench --list | head -1`): stop quietly,
        # and keep Python from complaining again when it flushes stdout at exit.
        _drop_stdout()
        return 1
    except OSError as exc:
        # Output files are probed and reported by the commands themselves; what is left
        # is stdout itself failing (a full disk, `> /dev/full`).
        _drop_stdout()
        print(f"{PROG}: error: cannot write the output: {exc.strerror or exc}", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.command in (None, "info"):
        if args.command is None:
            args.json = False
        return cmd_info(args)
    if args.command == "bench":
        # its errors on its own usage line, as argparse's are
        return cmd_bench(args, args.bench_parser)
    return cmd_demo(args, parser)


def _drop_stdout() -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
