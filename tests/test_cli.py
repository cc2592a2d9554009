"""The command line (python -m fastpe: info, bench, demo) and the benchmark workloads.

The commands run in fresh interpreters with this checkout first on PYTHONPATH and the
caller's environment otherwise (so a FASTPE_BACKEND=numpy run tests the CLI on that
backend). bench runs on tiny arrays (the hidden ``--size tiny``) and one round, so each
call takes about a second. The workloads' NumPy baselines are checked in-process against
fastpe.reference, on the tiny sizes, for every dtype the benchmarks use.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import fastpe
from fastpe import _bench, _cli

# (Not imported from conftest: a run that also collects bench/ would find bench's.)
PACKAGE_ROOT = Path(fastpe.__file__).resolve().parent.parent
# The folder holding tests/: the checkout, or where a wheel's test run copied tests/,
# bench/ and README.md (pyproject.toml's test-sources)
TESTS_ROOT = Path(__file__).resolve().parent.parent

try:
    import matplotlib  # noqa: F401
    HAVE_MPL = True
except ImportError:  # pragma: no cover - matplotlib is in the bench extra
    HAVE_MPL = False

needs_mpl = pytest.mark.skipif(not HAVE_MPL, reason="matplotlib is not installed")
TINY = ["--quick", "--size", "tiny", "--rounds", "1", "--peers", "none"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(PACKAGE_ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["MPLBACKEND"] = "Agg"
    return env


def fastpe_cli(*args: str, cwd=None, timeout: float = 120,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """python -m fastpe ARGS in a fresh interpreter (`env`: variables set besides)."""
    return subprocess.run([sys.executable, "-m", "fastpe", *args], env={**_env(), **(env or {})},
                          capture_output=True, text=True, timeout=timeout,
                          cwd=str(cwd or PACKAGE_ROOT))


def fastpe_cli_without_matplotlib(*args: str, cwd) -> subprocess.CompletedProcess:
    """python -m fastpe ARGS where `import matplotlib` fails (sys.modules entry None)."""
    code = textwrap.dedent(f"""
        import runpy, sys
        sys.modules["matplotlib"] = None
        sys.argv = ["fastpe", *{list(args)!r}]
        runpy.run_module("fastpe", run_name="__main__", alter_sys=True)
    """)
    return subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True,
                          text=True, timeout=120, cwd=str(cwd))


def assert_no_traceback(proc: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stdout, proc.stdout


# ---- info ---------------------------------------------------------------------------------

def test_info_is_the_default_command():
    plain, info = fastpe_cli(), fastpe_cli("info")
    assert plain.returncode == 0 and info.returncode == 0, plain.stderr + info.stderr
    assert plain.stdout == info.stdout
    out = info.stdout
    assert out.startswith(f"fastpe {fastpe.__version__}")
    for label in ("backend", "OpenMP", "threads", "NumPy", "Python", "CPU"):
        assert re.search(rf"^\s+{label}\s", out, re.M), f"no {label!r} line in:\n{out}"
    expected = fastpe.info()
    if expected["compiled"]:
        assert "ISA variant" in out and expected["isa"] in out
        assert expected["compile_flags"] in out


@pytest.mark.parametrize("isa", ["baseline", "avx2", "avx512"])
def test_info_reports_the_variant_running(isa):
    """`python -m fastpe info` names the variant running and whether FASTPE_ISA chose it."""
    if isa not in fastpe.info()["isa_available"]:
        pytest.skip(f"this CPU cannot run {isa} (or the kernels are not built)")
    proc = fastpe_cli("info", env={"FASTPE_ISA": isa})
    if proc.returncode != 0 and f"without kernels_{isa}" in proc.stderr:
        pytest.skip(f"built without kernels_{isa}")
    assert proc.returncode == 0, proc.stderr
    assert re.search(rf"^\s+ISA variant\s+{isa} \(FASTPE_ISA={isa}; this CPU runs: ",
                     proc.stdout, re.M), proc.stdout
    data = json.loads(fastpe_cli("info", "--json", env={"FASTPE_ISA": isa}).stdout)
    assert data["isa"] == isa and isa in data["isa_available"]
    # AVX512_BF16 rounds bfloat16 RoPE rows in the wide variants, where the CPU has it and
    # the OS saves the AVX-512 state (built with GCC or clang: the -m flags)
    features = data["machine_info"]["cpu_features"]
    if features is not None and (isa == "baseline" or "-mavx2" in data["compile_flags"]):
        hardware = (isa != "baseline" and "avx512_bf16" in features
                    and "avx512" in data["isa_available"])
        assert data["bfloat16_narrowing"] == ("hardware" if hardware else "software")
        assert re.search(rf"^\s+bfloat16 rounding\s+{data['bfloat16_narrowing']} ",
                         proc.stdout, re.M), proc.stdout


def test_info_json():
    proc = fastpe_cli("info", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    for key in ("version", "backend", "openmp", "num_threads", "machine_info"):
        assert key in data
    assert data["version"] == fastpe.__version__
    assert isinstance(data["openmp"], bool) and data["num_threads"] >= 1


@pytest.mark.parametrize("args", [["--help"], ["info", "--help"], ["bench", "--help"],
                                  ["demo", "--help"]], ids=" ".join)
def test_help(args):
    proc = fastpe_cli(*args)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: python -m fastpe")


def test_version():
    proc = fastpe_cli("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"fastpe {fastpe.__version__}"


@pytest.mark.parametrize("args", [
    ["nosuch"],
    ["info", "--bogus"],
    ["bench", "--threads", "0"],
    ["bench", "--threads", "many"],
    ["bench", "--dtype", "int8"],
    ["bench", "--only", "no-such-workload"],
    ["bench", "--rounds", "0"],
    ["bench", "--json", "/no/such/directory/out.json"],
    # refused before the run, which would only fail to write them at its end
    ["bench", "--json", "."],
    ["bench", "--plot", "table.txt"],
    ["bench", "--threads", "257"],
    ["bench", "--peers", "no-such-library"],
    # an --only that names nothing, a part of it that matches nothing (a typo), a
    # selection with nothing to run in the dtype, in a run and in a listing
    ["bench", "--only", ""],
    ["bench", "--only", ","],
    ["bench", "--only", "rope-decode,no-such-workload"],
    ["bench", "--list", "--only", "no-such-workload"],
    ["bench", "--dtype", "bfloat16", "--only", "alibi"],
    # outputs that cannot be written, found before the run
    ["bench", "--json", "/proc/fastpe-bench.json"],
    ["bench", "--json", "README.md/out.json"],
    ["bench", "--plot", "-"],
    ["demo", "--plot"],
], ids=" ".join)
def test_usage_errors_exit_2(args):
    proc = fastpe_cli(*args)
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "usage:" in proc.stderr
    if args[0] == "bench":
        # on the bench command's own usage line, as argparse's own errors are
        assert "python -m fastpe bench: error:" in proc.stderr, proc.stderr
    assert_no_traceback(proc)


def test_a_broken_ml_dtypes_is_one_error_line(tmp_path):
    """ml_dtypes installed but failing to import: --dtype bfloat16 says so in one line,
    exit 1, where it was a traceback."""
    (tmp_path / "ml_dtypes").mkdir()
    (tmp_path / "ml_dtypes" / "__init__.py").write_text(
        'raise ImportError("ml_dtypes built for another NumPy")\n')
    proc = fastpe_cli("bench", "--size", "tiny", "--rounds", "1", "--dtype", "bfloat16",
                      "--only", "rope-decode",
                      env={"PYTHONPATH": f"{tmp_path}{os.pathsep}{PACKAGE_ROOT}"})
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "python -m fastpe: error: --dtype bfloat16 needs ml_dtypes, which failed to import " \
           "(ImportError: ml_dtypes built for another NumPy)" in proc.stderr, proc.stderr
    assert_no_traceback(proc)


def test_a_peer_that_fails_to_import_is_skipped(tmp_path):
    """A peer installed but broken (numba built for another NumPy) is skipped with the
    reason, as one not installed is; the run goes on."""
    (tmp_path / "numba").mkdir()
    (tmp_path / "numba" / "__init__.py").write_text(
        'raise ImportError("Numba needs NumPy 2.3 or less")\n')
    proc = fastpe_cli("bench", "--size", "tiny", "--rounds", "1", "--peers", "numba",
                      "--only", "rope-decode", env={"PYTHONPATH": f"{tmp_path}{os.pathsep}{PACKAGE_ROOT}"})
    assert proc.returncode == 0, proc.stderr
    assert "skipped numba: numba failed to import (ImportError: Numba needs NumPy 2.3 or " \
           "less)" in proc.stdout + proc.stderr
    assert_no_traceback(proc)


def test_a_peer_asked_for_that_ran_nowhere_is_said_why():
    """A named peer without a column in the table says why: not for the dtype, or no
    workload of the run it implements (it was dropped without a word)."""
    proc = fastpe_cli("bench", "--size", "tiny", "--rounds", "1", "--only", "rope-decode",
                      "--peers", "jax")
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"^skipped jax: (it implements none of these workloads|.*not installed)",
                     proc.stdout, re.M), proc.stdout
    proc = fastpe_cli("bench", "--size", "tiny", "--rounds", "1", "--only", "rope-prefill-neox",
                      "--dtype", "float16", "--peers", "numba")
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"^skipped numba: (not for float16|.*not installed)", proc.stdout,
                     re.M), proc.stdout


def test_the_numpy_backend_header_names_no_kernels():
    proc = fastpe_cli("bench", "--size", "tiny", "--rounds", "1", "--only", "rope-decode",
                      env={"FASTPE_BACKEND": "numpy"})
    assert proc.returncode == 0, proc.stderr
    head = proc.stdout.splitlines()[0]
    assert "numpy backend (fastpe.reference: no compiled kernel runs)" in head, head
    assert "kernels;" not in head
    proc = fastpe_cli("info", env={"FASTPE_BACKEND": "numpy"})
    assert proc.returncode == 0, proc.stderr
    assert "fastpe.reference runs every call, no compiled kernel" in proc.stdout, proc.stdout


def test_the_numpy_backend_header_says_it_runs_one_thread():
    proc = fastpe_cli("bench", "--size", "tiny", "--rounds", "1", "--only", "rope-decode",
                      "--threads", "2", env={"FASTPE_BACKEND": "numpy"})
    assert proc.returncode == 0, proc.stderr
    head = proc.stdout.splitlines()[0]
    assert "fastpe on 1 thread (the numpy backend runs one; 2 asked)" in head, head


def test_a_plot_without_a_suffix_is_named_as_written():
    assert _cli._plot_path("out") == "out.png"
    assert _cli._plot_path("out.svg") == "out.svg"


def test_plot_paths_are_checked_as_written(tmp_path):
    """--plot NAME writes NAME.png: that file is what is checked before the run (a
    directory NAME.png refused, a directory NAME no obstacle), and --json naming the same
    file is refused (the plot would overwrite it)."""
    (tmp_path / "trap.png").mkdir()
    for args in (["--plot", str(tmp_path / "trap")],
                 ["--json", str(tmp_path / "a.png"), "--plot", str(tmp_path / "a")]):
        proc = fastpe_cli("bench", "--size", "tiny", "--rounds", "1", "--only",
                          "rope-decode", *args)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert "python -m fastpe bench: error: " in proc.stderr
        assert_no_traceback(proc)
    (tmp_path / "results").mkdir()
    _cli._check_output_path(_cli.build_parser(), "--plot", str(tmp_path / "results"))


def test_threads_argument():
    assert _cli._threads_arg("all") == fastpe.get_num_threads()
    assert _cli._threads_arg("-1") == fastpe.get_num_threads()
    assert _cli._threads_arg("3") == 3


# ---- bench --------------------------------------------------------------------------------

RESULT_KEYS = {
    "name": str, "family": str, "title": str, "dtype": str, "shapes": dict, "bytes": int,
    "floor": str, "numpy_baseline": str, "per_call": bool, "threads": dict, "seconds": dict,
    "seconds_min": dict, "samples": dict, "calls_per_sample": dict, "rounds": int,
    "speedup_vs_numpy": float, "check": str, "peers": dict, "skipped": dict,
    "floor_form": str, "floor_noise": bool,
}
# without a floor (a whole program) these are None
FLOOR_KEYS = ("fraction_of_floor", "fastpe_gb_per_s", "floor_gb_per_s")
FLOOR_FORMS = {"floor:numpy", "floor:c", "floor:c-ahead", "floor:c-nt", "floor:c-split",
               "floor:c-split-ahead"}


def check_report(report: dict, *, dtype="float32", threads=1) -> None:
    assert report["schema"] == "fastpe-bench/2"
    assert report["fastpe"]["version"] == fastpe.__version__
    assert report["dtype"] == dtype and report["threads"] == threads
    assert report["mode"] == "quick" and report["size"] == "tiny"
    assert set(report["machine"]) >= {"cpu", "logical_cpus", "platform"}
    names = [w.name for w in _bench.workloads("tiny")]
    assert [r["name"] for r in report["results"]] == names
    for r in report["results"]:
        for key, typ in RESULT_KEYS.items():
            assert isinstance(r[key], typ), f"{r['name']}: {key} = {r[key]!r}"
        assert r["check"] == "ok", r
        assert r["dtype"] == dtype
        t = r["seconds"]
        floors = {n for n in t if n.startswith("floor:")}
        assert set(t) == {"fastpe", "numpy", "floor", *floors, *r["peers"]}
        assert set(r["peers"]) <= set(_bench.PEERS)
        assert r["speedup_vs_numpy"] == pytest.approx(t["numpy"] / t["fastpe"])
        for name, ratio in r["peers"].items():
            assert ratio == pytest.approx(t[name] / t["fastpe"])
        own = {"fastpe", *floors, *_bench.peers.FASTPE_PEERS}
        assert r["threads"] == {n: threads if n in own else 1 for n in r["samples"]
                                if n != "floor"}
        if r["floor"] == "none":
            assert r["name"] == "llama-decode" and not floors and t["floor"] is None
            assert all(r[k] is None for k in FLOOR_KEYS) and not r["floor_noise"]
            inner = r["inner"]
            assert inner["part"] == "RoPE" and set(inner["seconds"]) == {"fastpe", "numpy"}
            # a part of the step, timed inside it
            assert all(0 < inner["seconds"][n] < t[n] for n in ("fastpe", "numpy"))
            continue
        assert r["floor"] in ("stream", "fill")
        assert all(isinstance(r[k], float) for k in FLOOR_KEYS)
        assert "floor:numpy" in floors and floors <= FLOOR_FORMS
        assert all(v > 0 for v in t.values())
        # the floor of a round is its fastest form in that round; fastpe's fraction of it
        # pairs the two round by round
        per_round = [min(r["samples"][n][i] for n in floors) for i in range(r["rounds"])]
        assert r["samples"]["floor"] == per_round
        assert t["floor"] == pytest.approx(np.median(per_round))
        ratios = [f / x for f, x in zip(per_round, r["samples"]["fastpe"])]
        assert r["fraction_of_floor"] == pytest.approx(np.median(ratios))
        assert r["floor_noise"] == (r["fraction_of_floor"] > _bench.NOISE_FRACTION)
        assert f"floor:{r['floor_form']}" in floors
        assert set(r["samples"]) == set(t)
        assert all(len(s) == r["rounds"] for s in r["samples"].values())


def test_bench_quick_table_and_json(tmp_path):
    out = tmp_path / "bench.json"
    proc = fastpe_cli("bench", *TINY, "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    assert_no_traceback(proc)
    report = json.loads(out.read_text())
    check_report(report)
    table = proc.stdout
    assert f"fastpe {fastpe.__version__} bench: float32, fastpe on 1 thread" in table
    header = next(line for line in table.splitlines() if line.startswith("workload"))
    for col in ("fastpe", "numpy", "floor", "vs numpy", "% floor"):
        assert col in header
    for r in report["results"]:
        assert r["title"] in table
    assert "MISMATCH" not in table
    # progress: one line per workload on a non-terminal stderr, never a carriage return
    n = len(report["results"])
    assert f"[1/{n}]" in proc.stderr and f"[{n}/{n}]" in proc.stderr
    assert "\r" not in proc.stderr


def test_bench_json_on_stdout_threads_dtype_only():
    proc = fastpe_cli("bench", *TINY, "--json", "-", "--threads", "all", "--dtype", "float16",
                      "--only", "rope-decode,learned")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)          # stdout holds only the JSON
    assert [r["name"] for r in report["results"]] == ["rope-decode", "learned-add"]
    assert report["dtype"] == "float16" and report["threads"] == fastpe.get_num_threads()
    assert all(r["check"] == "ok" for r in report["results"])
    assert "vs numpy" in proc.stderr          # the table went to stderr


@pytest.mark.skipif(not fastpe.info()["bfloat16"], reason="ml_dtypes is not installed")
def test_bench_bfloat16_rows_of_the_adds_and_rope():
    """--dtype bfloat16 times the sinusoidal and learned adds and the one-axis RoPE
    workloads (checked against the reference, with a fraction of the floor) and lists
    the others as skipped."""
    proc = fastpe_cli("bench", *TINY, "--json", "-", "--dtype", "bfloat16")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["dtype"] == "bfloat16"
    names = [r["name"] for r in report["results"]]
    assert {"sinusoidal-add", "learned-add", "rope-prefill-neox", "rope-decode"} <= set(names)
    for r in report["results"]:
        assert r["check"] == "ok" and r["dtype"] == "bfloat16", r
        assert r["fraction_of_floor"] > 0
    skipped = {s["name"] for s in report["skipped"]}
    assert "rope-prefill-mrope" in skipped and "alibi-decode" in skipped
    assert not skipped & set(names)


PEER_WORKLOADS = {"numba": ("rope-decode", "rope-scaled-decode", "rope-embedding-decode",
                            "rope-cached-decode", "rope-batched-decode", "alibi-prefill",
                            "alibi-decode"),
                  "onnxruntime": ("rope-decode", "rope-batched-decode"),
                  "jax": ("alibi-prefill", "alibi-decode"),
                  "fastpe-torch": ("rope-decode", "rope-batched-decode", "alibi-prefill",
                                   "alibi-decode", "sinusoidal-add")}


@pytest.mark.parametrize("peers", list(PEER_WORKLOADS))
def test_bench_peers_are_timed_and_checked(peers):
    """A peer runs where installed, on the workloads it implements (RoPE, ALiBi), and its
    result is checked against fastpe.reference like every contender's."""
    reason = _bench.peers.missing(peers)
    if reason is not None:
        pytest.skip(reason)
    proc = fastpe_cli("bench", *TINY[:-2], "--peers", peers, "--only", "rope-decode,rope-batched,"
                      "alibi-prefill,alibi-decode,sinusoidal-add", "--json", "-", timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    by_name = {r["name"]: r for r in report["results"]}
    for name, r in by_name.items():
        covered = name in PEER_WORKLOADS[peers]
        assert set(r["peers"]) == ({peers} if covered else set()), name
        assert r["check"] == "ok", (name, r["check"])
    assert f" {peers}" in proc.stderr.splitlines()[next(
        i for i, line in enumerate(proc.stderr.splitlines()) if line.startswith("workload"))]


def test_bench_peers_not_installed_are_skipped_by_name():
    missing = [p for p in _bench.PEERS if _bench.peers.missing(p) is not None]
    if not missing:
        pytest.skip("every peer is installed here")
    proc = fastpe_cli("bench", *TINY[:-2], "--peers", missing[0], "--only", "rope-decode",
                      "--json", "-")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["results"][0]["peers"] == {}
    assert any(s["name"] == missing[0] and "fastpe[peers]" in s["reason"]
               for s in report["skipped"])


def test_bench_list():
    proc = fastpe_cli("bench", "--list")
    assert proc.returncode == 0, proc.stderr
    for wl in _bench.workloads():
        assert wl.name in proc.stdout
    expected = {"rope-prefill-neox", "rope-prefill-gptj", "rope-decode", "rope-scaled-decode",
                "rope-embedding-decode", "rope-cached-decode", "rope-batched-decode",
                "rope-llama3", "rope-prefill-mrope", "rope-vl-decode", "sinusoidal-table",
                "sinusoidal-add", "learned-add", "alibi-prefill", "alibi-bias", "alibi-decode",
                "alibi-padded-decode", "t5-decode", "deberta-bias", "llama-decode"}
    assert {w.name for w in _bench.workloads()} == expected


def test_workload_and_peer_names_are_taken_in_any_case():
    assert _cli._peers_arg("Numba, ONNXRuntime,JAX") == ("numba", "onnxruntime", "jax")
    workloads = _bench.workloads()
    assert ([w.name for w in _bench.select(workloads, "ROPE-Decode")]
            == [w.name for w in _bench.select(workloads, "rope-decode")] != [])
    proc = fastpe_cli("bench", "--list", "--only", "T5-DECODE")
    assert proc.returncode == 0 and proc.stdout.split()[0] == "t5-decode", proc


def test_bench_list_marks_the_workloads_not_run_in_the_dtype():
    proc = fastpe_cli("bench", "--list", "--dtype", "bfloat16")
    assert proc.returncode == 0, proc.stderr
    lines = {line.split()[0]: line for line in proc.stdout.splitlines()}
    for wl in _bench.workloads():
        assert lines[wl.name].endswith("(not in bfloat16)") == ("bfloat16" not in wl.dtypes)
    assert any("bfloat16" not in wl.dtypes for wl in _bench.workloads())
    assert any("bfloat16" in wl.dtypes for wl in _bench.workloads())
    assert "(not in" not in fastpe_cli("bench", "--list").stdout


def test_a_closed_stdout_is_an_error_line():
    """Started with stdout closed (`>&-`), Python has no sys.stdout."""
    proc = subprocess.run([sys.executable, "-c", "import os, sys; os.close(1); "
                           "os.execv(sys.executable, [sys.executable, '-m', 'fastpe', 'info'])"],
                          env=_env(), stderr=subprocess.PIPE, text=True, timeout=120,
                          cwd=str(PACKAGE_ROOT))
    assert proc.returncode == 1
    assert proc.stderr.strip() == "python -m fastpe: error: standard output is closed", proc.stderr


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("buffered", [True, False])
@pytest.mark.parametrize("args", [("bench", "--list"), ("info",), ("demo",), ("--help",),
                                  ("--version",), ("bench", "--help")])
def test_stdout_that_cannot_be_written_is_an_error_not_a_traceback(args, buffered):
    """Buffered (stdout a file, as by default) a short output fails only when flushed;
    unbuffered (PYTHONUNBUFFERED) at its write, which argparse ignores for its --help
    and --version text."""
    env = _env()
    env.pop("PYTHONUNBUFFERED", None)
    if not buffered:
        env["PYTHONUNBUFFERED"] = "1"
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "fastpe", *args], env=env,
                              stdout=full, stderr=subprocess.PIPE, text=True, timeout=120,
                              cwd=str(PACKAGE_ROOT))
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr
    assert "error: cannot write the output: No space left on device" in proc.stderr


@pytest.mark.parametrize("args", [("--version",), ("--help",), ("info",)])
def test_a_reader_gone_before_the_output_is_quiet(args):
    """A closed pipe (`python -m fastpe --version | head -0`) stops quietly, exit 1, where
    a full disk is an error line."""
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run([sys.executable, "-m", "fastpe", *args], env=_env(),
                              stdout=write, stderr=subprocess.PIPE, text=True, timeout=120,
                              cwd=str(PACKAGE_ROOT))
    finally:
        os.close(write)
    assert proc.returncode == 1
    assert proc.stderr == "", proc.stderr


@needs_mpl
def test_bench_plot(tmp_path):
    png = tmp_path / "bench.png"
    proc = fastpe_cli("bench", *TINY, "--only", "rope-decode,sinusoidal", "--plot", str(png))
    assert proc.returncode == 0, proc.stderr
    assert png.read_bytes()[:8] == PNG_MAGIC


@needs_mpl
@pytest.mark.parametrize("command", [["bench", *TINY, "--only", "rope-decode"], ["demo"]],
                         ids=lambda c: c[0])
def test_a_plot_matplotlib_fails_to_write_is_one_error_line(tmp_path, command, monkeypatch,
                                                           capsys):
    """matplotlib's own failure at the end of the run (a .pgf plot without a LaTeX is a
    RuntimeError) is an error line and exit 1, not a traceback; --json was written."""
    def no_latex(*args, **kwargs):
        raise RuntimeError("'xelatex' not found")
    monkeypatch.setattr(_cli, "bench_plot", no_latex)
    monkeypatch.setattr(importlib.import_module("fastpe._demo"), "plot", no_latex)
    out = tmp_path / "run.json"
    extra = ["--json", str(out)] if command[0] == "bench" else []
    assert _cli.main([*command, *extra, "--plot", str(tmp_path / "plot.pgf")]) == 1
    err = capsys.readouterr().err
    assert f"python -m fastpe: error: cannot write --plot {tmp_path / 'plot.pgf'}: 'xelatex' " \
           "not found" in err, err
    assert command[0] == "demo" or json.loads(out.read_text())["results"]


@pytest.mark.parametrize("command", [["bench", *TINY], ["demo"]], ids=lambda c: c[0])
def test_plot_without_matplotlib(tmp_path, command):
    png = tmp_path / "out.png"
    proc = fastpe_cli_without_matplotlib(*command, "--plot", str(png), cwd=tmp_path)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert_no_traceback(proc)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "matplotlib" in lines[0] and "pip install" in lines[0], lines
    assert not png.exists()
    assert "vs numpy" not in proc.stdout      # it failed before running anything


def test_bench_suite_skips_without_pytest_benchmark():
    """bench/ skips each file, cleanly, where pytest-benchmark is not installed."""
    if not (TESTS_ROOT / "bench").is_dir():
        pytest.skip("bench/ is not beside the tests")
    code = textwrap.dedent("""
        import importlib.abc, sys
        class Missing(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name.partition(".")[0] == "pytest_benchmark":
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        sys.meta_path.insert(0, Missing())
        import pytest
        sys.exit(pytest.main(["bench", "-q", "-p", "no:cacheprovider", "-rs"]))
    """)
    env = _env()
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120, cwd=str(TESTS_ROOT))
    # 5: pytest's "no tests collected", as every module skipped itself at import
    assert proc.returncode in (0, 5), proc.stdout + proc.stderr
    assert "error" not in proc.stdout.lower(), proc.stdout
    files = len(list((TESTS_ROOT / "bench").glob("bench_*.py")))
    bench_hf = 1  # bench_hf.py is a script with no tests, not collected
    assert re.search(rf"\b{files - bench_hf} skipped\b", proc.stdout), proc.stdout
    assert "could not import 'pytest_benchmark'" in proc.stdout


def test_bench_file_named_alone_is_collected_once():
    """A bench file given by path collects the same benchmarks as within bench/."""
    if not (TESTS_ROOT / "bench").is_dir():
        pytest.skip("bench/ is not beside the tests")
    pytest.importorskip("pytest_benchmark")

    def collected(*args: str) -> list[str]:
        proc = subprocess.run([sys.executable, "-m", "pytest", *args, "--collect-only", "-q",
                               "-p", "no:cacheprovider"], env=_env(), capture_output=True,
                              text=True, timeout=120, cwd=str(TESTS_ROOT))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return [line for line in proc.stdout.splitlines() if "::" in line]

    alone = collected("bench/bench_alibi.py")
    assert alone and len(alone) == len(set(alone)), alone
    assert alone == [t for t in collected("bench") if t.startswith("bench/bench_alibi.py::")]


# ---- demo ---------------------------------------------------------------------------------

def test_demo():
    proc = fastpe_cli("demo")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    dots = {(int(a), int(b)): float(v) for a, b, v in
            re.findall(r"q at\s+(\d+), k at\s+(\d+).*q\.k = (\S+)", out)}
    assert {(2, 5), (10, 13)} <= set(dots)
    assert dots[2, 5] == pytest.approx(dots[10, 13], abs=1e-9)
    assert dots[10, 12] != pytest.approx(dots[10, 13], abs=1e-3)
    freqs = [float(m) for m in re.findall(r"^\s+\d+\s+\d+, \d+\s+(\S+)\s+\S+ positions$",
                                          out, re.M)]
    assert len(freqs) >= 4 and freqs == sorted(freqs, reverse=True) and freqs[0] == 1.0
    assert "slopes 0.5 0.25 0.125" in out
    rows = re.findall(r"^ +head (\d+):((?: +\S+)+)$", out, re.M)
    assert len(rows) == 8
    first = [float(v) for v in rows[0][1].split()]
    assert first[-1] == 0.0 and first[-2] == -0.5     # slope 1/2, distance 1


@needs_mpl
def test_demo_plot(tmp_path):
    png = tmp_path / "demo.png"
    proc = fastpe_cli("demo", "--plot", str(png))
    assert proc.returncode == 0, proc.stderr
    assert png.read_bytes()[:8] == PNG_MAGIC


# ---- the workloads, in-process ------------------------------------------------------------

TINY_WORKLOADS = _bench.workloads("tiny")
# bfloat16 where ml_dtypes is installed: the workloads that run in it (the embedding adds)
CHECKED_DTYPES = _bench.DTYPES + (("bfloat16",) if fastpe.info()["bfloat16"] else ())


@pytest.mark.parametrize("dtype", CHECKED_DTYPES)
@pytest.mark.parametrize("wl", TINY_WORKLOADS, ids=lambda w: w.name)
def test_every_implementation_matches_the_reference(wl, dtype):
    """The NumPy baselines (and the textbook table) compute what fastpe computes; every
    form of the floor leaves the values unchanged; fastpe is checked on 1 and 2 threads."""
    if dtype not in wl.dtypes:
        pytest.skip(f"{wl.name} runs in {wl.dtypes} only")
    base = wl.make(np.dtype(dtype))
    expected = wl.expected(base)
    for impl, prepare in wl.impls.items():
        for threads in ((1, 2) if impl == "fastpe" else (1,)):
            arrays = _bench.copy_arrays(base, wl.written)
            got = prepare(arrays, threads)(arrays)
            for name, mine, ref in zip(wl.result, got, expected):
                msg = _bench.compare(wl.part(name, mine), ref, dtype,
                                     atol=wl.atol.get(impl, 0.0))
                assert msg is None, f"{wl.name} {dtype} {impl} t{threads}: {name} {msg}"
    if wl.floor == "stream":
        for form, prepare in _bench.floors.forms("stream", wl.result, wl.reads).items():
            arrays = _bench.copy_arrays(base, wl.written)
            run = prepare(arrays, 2)
            assert run is not None, form     # every workload's arrays suit every form
            run(arrays)
            for name in wl.result:
                assert np.array_equal(arrays[name], base[name], equal_nan=True), form


@pytest.mark.parametrize("dtype", CHECKED_DTYPES)
@pytest.mark.parametrize("wl", [w for w in TINY_WORKLOADS if w.family == "rope" and w.per_call],
                         ids=lambda w: w.name)
def test_decode_rotations_timed_in_place_keep_their_size(wl, dtype):
    """A decode is timed by tens of thousands of calls on the same q and k: each call a
    rotation, so the values keep their size (a float16 or bfloat16 cos/sin cache, whose
    rows are no rotations, grew them to inf)."""
    if dtype not in wl.dtypes:
        pytest.skip(f"{wl.name} runs in {wl.dtypes} only")
    arrays = wl.make(np.dtype(dtype))
    size = {n: np.abs(arrays[n].astype(np.float64)).max() for n in wl.result}
    run = wl.impls["fastpe"](arrays, 1)
    for _ in range(3000):
        run(arrays)
    for n in wl.result:
        assert np.abs(arrays[n].astype(np.float64)).max() < 1.25 * size[n], n


@pytest.mark.parametrize("dtype", _bench.DTYPES)
@pytest.mark.parametrize("wl", [w for w in TINY_WORKLOADS if w.check_index],
                         ids=lambda w: w.name)
def test_the_checked_part_is_the_references_part(wl, dtype):
    """A check compares every 4th head, computed by the reference on those heads alone:
    exactly the reference's result over all heads, restricted to them."""
    base = wl.make(np.dtype(dtype))
    arrays = _bench.copy_arrays(base, wl.written)
    whole = wl.impls["reference"](arrays, 1)(arrays)
    for name, full, part in zip(wl.result, whole, wl.expected(base)):
        assert 0 < part.size < np.asarray(full).size
        assert np.array_equal(np.asarray(full)[wl.check_index[name]], part, equal_nan=True)


def _floor_arrays(dtype, offset_words: int) -> np.ndarray:
    """Rows of 8-byte multiples starting `offset_words` words past a 64-byte line: the
    streaming forms' plain prologue and epilogue run too."""
    raw = np.zeros(5 * 300_000 * np.dtype(dtype).itemsize // 8 + 16, np.uint64)
    start = (-raw.ctypes.data % 64) // 8 + offset_words
    words = raw[start:start + raw.size - 16].view(dtype).reshape(5, -1)
    words[...] = _bench.random_array(words.shape, dtype)
    return words


@pytest.mark.parametrize("offset_words", [0, 1, 3])
@pytest.mark.parametrize("kind", ["stream", "fill"])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_every_floor_form_streams_the_same_bytes(kind, dtype, offset_words):
    """Every form of the floor (NumPy's, the C loops with plain stores, with prefetches
    ahead and with streaming stores)
    leaves a stream's values unchanged, and fills a table with ones, on 1 and 2 threads,
    one call over several arrays, touching nothing beside them."""
    forms = _bench.floors.forms(kind, ("a", "b"))
    if fastpe.info()["compiled"]:
        streaming = _backend_kernels().STREAM_STORES
        assert set(forms) == {"numpy", "c", "c-ahead"} | ({"c-nt"} if streaming else set())
    for form, prepare in forms.items():
        for threads in (1, 2):
            a, b = _floor_arrays(dtype, offset_words), _floor_arrays(dtype, 0)[:2]
            before_a, before_b = a.copy(), b.copy()
            base = a.base
            outside = (base[:a.ctypes.data // 8 - base.ctypes.data // 8].copy(),
                       base[(a.ctypes.data + a.nbytes - base.ctypes.data) // 8:].copy())
            run = prepare({"a": a, "b": b}, threads)
            assert run is not None, form
            run({"a": a, "b": b})
            if kind == "stream":
                assert np.array_equal(a.view(np.uint8), before_a.view(np.uint8)), form
                assert np.array_equal(b.view(np.uint8), before_b.view(np.uint8)), form
            else:
                assert (a == 1).all() and (b == 1).all(), form
            assert np.array_equal(base[:outside[0].size], outside[0]), form
            assert np.array_equal(base[base.size - outside[1].size:], outside[1]), form


@pytest.mark.parametrize("same_size", [True, False])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_floor_forms_with_reads(dtype, same_size):
    """A floor that also reads arrays (DeBERTa's logit tables): every form leaves all the
    values unchanged on 1 and 2 threads; the fused C pass needs arrays of one size; the C
    passes really read them (a mask of all ones folds their XOR into the target)."""
    a = _floor_arrays(dtype, 1)
    b = _floor_arrays(dtype, 0) if same_size else _floor_arrays(dtype, 3)[:2]
    c = _floor_arrays(dtype, 3) if same_size else _floor_arrays(dtype, 0)[:3]
    arrays = {"a": a, "b": b, "c": c}
    before = {n: v.copy() for n, v in arrays.items()}
    forms = _bench.floors.forms("stream", ("a",), ("b", "c"))
    if fastpe.info()["compiled"]:
        assert set(forms) == {"numpy", "c", "c-split", "c-split-ahead"}
    for form, prepare in forms.items():
        for threads in (1, 2):
            run = prepare(arrays, threads)
            if run is None:
                assert form == "c" and not same_size
                continue
            run(arrays)
            for n, v in arrays.items():
                assert np.array_equal(v.view(np.uint8), before[n].view(np.uint8)), (form, n)
    kern = _backend_kernels()
    if kern is None:
        return
    flat = {n: np.ascontiguousarray(v).reshape(-1).view(np.uint64) for n, v in arrays.items()}
    if same_size:
        for threads in (1, 2):
            t = flat["a"].copy()
            kern.stream_reads(t, (flat["b"], flat["c"]), threads, True, (1 << 64) - 1)
            assert np.array_equal(t, flat["a"] ^ flat["b"] ^ flat["c"])
    else:
        with pytest.raises(ValueError, match="one size"):
            kern.stream_reads(flat["a"].copy(), (flat["b"], flat["c"]), 1, True)
    acc = kern.stream_reads(flat["a"].copy(), (flat["b"], flat["c"]), 1, False)
    assert acc == int(np.bitwise_xor.reduce(flat["b"]) ^ np.bitwise_xor.reduce(flat["c"]))


@pytest.mark.parametrize("ratio", [1, 3, 8, 9000])
def test_fused_floor_of_a_smaller_read_folds_each_word_into_its_run(ratio):
    """A learned table's rows, `ratio` times smaller than the batch they are added to:
    the fused pass folds read word j into target words j * ratio .. (j + 1) * ratio - 1
    (a mask of all ones shows it), across units of work of 1 and 2 threads; a read
    whose words do not divide the target's is refused."""
    kern = _backend_kernels()
    if kern is None:
        pytest.skip("needs the compiled kernels")
    rng = np.random.default_rng(ratio)
    m = 2 * 8192 // ratio + 5
    target = rng.integers(0, 1 << 63, m * ratio, dtype=np.uint64)
    rows = rng.integers(0, 1 << 63, m, dtype=np.uint64)
    for threads in (1, 2):
        t = target.copy()
        kern.stream_reads(t, (rows,), threads, True, (1 << 64) - 1)
        assert np.array_equal(t, target ^ np.repeat(rows, ratio))
        t = target.copy()
        kern.stream_reads(t, (rows,), threads, True)
        assert np.array_equal(t, target)
    with pytest.raises(ValueError, match="divide"):
        kern.stream_reads(np.append(target, target[:1]), (rows,), 1, True)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_round_trip_leaves_every_value_and_the_bytes_around(dtype):
    """bench/half_precision.py's round trip (widen to float32, narrow back, in place)
    keeps every non-NaN value of the dtype bit for bit, subnormals, zeros and infinities
    included, at every length a vector loop leaves a tail of, and writes nothing
    outside the array; float32 is refused."""
    kern = _backend_kernels()
    if kern is None:
        pytest.skip("needs the compiled kernels")
    if dtype == "bfloat16":
        module = fastpe._checks.ml_dtypes(True)
        if module is None:
            pytest.skip("needs ml_dtypes")
        dt = np.dtype(module.bfloat16)
    else:
        dt = np.dtype(np.float16)
    bits = np.arange(1 << 16, dtype=np.uint16)
    every = bits[~np.isnan(bits.view(dt).astype(np.float32))]
    for n in (1, 15, 16, 17, 31, 33, every.size):
        buf = np.full(n + 2, 0x7E01, np.uint16)   # a NaN each side: it must stay as it is
        buf[1:-1] = every[:n]
        kern.half_round_trip((buf[1:-1].view(dt),))
        assert np.array_equal(buf[1:-1], every[:n]), n
        assert buf[0] == buf[-1] == 0x7E01
    with pytest.raises(TypeError, match="float16 or bfloat16"):
        kern.half_round_trip((np.zeros(4, np.float32),))
    with pytest.raises(TypeError, match="C-contiguous"):
        kern.half_round_trip((every[::2].view(dt),))


def test_half_precision_script_prints_a_row_per_workload():
    """bench/half_precision.py on the tiny workloads: one row per workload and dtype,
    each with fastpe's, the round trip's and float32's fractions of the floor."""
    script = TESTS_ROOT / "bench" / "half_precision.py"
    if not script.is_file():
        pytest.skip("bench/ is not beside the tests")
    if _backend_kernels() is None:
        pytest.skip("needs the compiled kernels")
    dtypes = "float16" + (",bfloat16" if fastpe._checks.ml_dtypes(True) is not None else "")
    proc = subprocess.run([sys.executable, str(script), "--size", "tiny", "--rounds", "2",
                           "--dtype", dtypes, "--only", "rope-prefill-gptj,learned-add"],
                          env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line.split() for line in proc.stdout.splitlines() if line.count("%") == 3]
    expect = 2 * len(dtypes.split(","))   # both workloads take either half dtype
    assert len(rows) == expect, proc.stdout
    for row in rows:
        fastpe_half, trip, f32 = (float(v.rstrip("%")) for v in row[-4:-1])
        assert trip > 0 and fastpe_half >= 0 and f32 >= 0, row   # 0%: the NumPy backend


def _backend_kernels():
    from fastpe import _backend
    return _backend.compiled


def test_threaded_floor_leaves_values_unchanged():
    a = _bench.random_array((3, 1 << 20), np.float16)
    before = a.copy()
    _bench.prepare_floor("stream", ("a",))({"a": a}, 2)({"a": a})
    assert np.array_equal(a.view(np.uint16), before.view(np.uint16))
    _bench.prepare_floor("fill", ("a",))({"a": a}, 2)({"a": a})
    assert (a == 1).all()


def test_compare_catches_differences():
    e = np.linspace(-3, 3, 1000, dtype=np.float32).reshape(10, 100)
    assert _bench.compare(e.copy(), e, "float32") is None
    bad = e.copy()
    bad[7, 3] += 1e-3
    assert "row 7, column 3" in _bench.compare(bad, e, "float32")
    inf = e.copy()
    inf[2, 5] = -np.inf
    assert "infinities" in _bench.compare(inf, e, "float32")
    shifted = e + np.arange(10, dtype=np.float32)[:, None]
    assert _bench.compare(shifted, e, "float32") is not None
    assert _bench.compare(shifted, e, "float32", offset_per_row=True) is None
    assert _bench.compare(e[:, :5], e, "float32").startswith("shape")


def test_measure_interleaves_and_takes_medians():
    calls = []
    runners = {name: (lambda n=name: calls.append(n)) for name in "abc"}
    timings = _bench.measure(runners, rounds=4, min_rounds=4, sample_s=0.0, budget_s=0.0)
    assert set(timings) == set("abc")
    for t in timings.values():
        assert t.number == 1      # sample_s=0: one call per sample
        assert len(t.samples) == 4 and t.median == pytest.approx(np.median(t.samples))
    # one calibration call each, then rounds of every runner once (an untimed call, then
    # its sample), in shuffled orders
    order = "".join(calls)
    assert order[:3] == "abc"
    rounds = [order[i:i + 6] for i in range(3, len(order), 6)]
    assert len(rounds) == 4 and all(sorted(r) == sorted("aabbcc") for r in rounds)
    assert all(r[0] == r[1] and r[2] == r[3] and r[4] == r[5] for r in rounds)
    assert len(set(rounds)) > 1


def test_floor_is_paired_with_fastpe_round_by_round():
    """The floor of each round is its fastest form in that round, and fastpe's fraction of
    it is the median of the rounds' own ratios: a busy round slows both, not one."""
    T = _bench.Timing
    timings = {"fastpe": T(2.0, [1.0, 2.0, 9.0], 1), "numpy": T(5.0, [5.0, 5.0, 5.0], 1),
               "floor:numpy": T(1.0, [0.9, 1.0, 8.0], 1), "floor:c": T(2.0, [0.8, 2.1, 9.9], 1)}
    rec = _bench.timing._floor_record(timings)
    assert rec["samples"] == [0.8, 1.0, 8.0]
    assert rec["seconds"] == 1.0
    assert rec["fraction"] == pytest.approx(np.median([0.8, 0.5, 8.0 / 9.0]))
    assert rec["form"] == "numpy" and rec["noise"] is False
    fast = {**timings, "floor:c": T(0.5, [0.5, 0.5, 0.5], 1)}
    assert _bench.timing._floor_record(fast)["noise"] is False
    faster = {"fastpe": T(1.0, [1.0, 1.0, 1.0], 1), "floor:c": T(1.2, [1.2, 1.06, 1.1], 1)}
    rec = _bench.timing._floor_record(faster)
    assert rec["fraction"] == pytest.approx(1.1) and rec["noise"] is True
    assert _bench.timing._floor_record({"fastpe": T(1.0, [1.0], 1)})["fraction"] is None


def test_table_flags_noise_and_rows_without_a_floor():
    row = {"fraction_of_floor": 0.87, "floor_noise": False}
    assert _cli.floor_cell(row) == "87%"
    assert _cli.floor_cell({"fraction_of_floor": 1.2, "floor_noise": True}) == "noise"
    assert _cli.floor_cell({"fraction_of_floor": None, "floor_noise": False}) == "-"


@needs_mpl
def test_plot_draws_no_bandwidth_for_noise(tmp_path, monkeypatch):
    """A row faster than its floor is annotated as noise on the bandwidth axis, with no
    bar; a program row has no floor; the peers have bars of their own."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def row(name, fraction, noise, peers):
        return {"name": name, "fraction_of_floor": fraction, "floor_noise": noise,
                "speedup_vs_numpy": 2.0, "peers": peers}
    report = {"results": [row("a", 0.9, False, {"torch": 3.0, "fastpe-torch": 1.1}),
                          row("b", 1.3, True, {}), row("c", None, False, {})],
              "fastpe": {"version": fastpe.__version__}, "dtype": "float32", "threads": 1,
              "machine": {"cpu": "x"}}
    saved = []
    monkeypatch.setattr(plt.Figure, "savefig", lambda fig, *a, **k: saved.append(fig))
    monkeypatch.setattr(plt, "close", lambda fig: None)
    _cli.bench_plot(report, str(tmp_path / "p.png"))
    ratios, bandwidth = saved[0].axes
    widths = {t.get_text(): p.get_width() for t, p in
              zip(ratios.get_yticklabels(), bandwidth.patches)}
    assert widths["a"] == pytest.approx(90.0) and widths["b"] == 0 and widths["c"] == 0
    notes = {t.get_text() for t in bandwidth.texts}
    assert {"90%", "noise", "no floor (a program)"} <= notes
    assert {"vs numpy", "vs torch", "vs fastpe-torch"} <= {
        t.get_text() for t in ratios.get_legend().get_texts()}


def test_quick_runs_no_peers_unless_asked():
    parser = _cli.build_parser()
    assert _cli.peers_wanted(parser.parse_args(["bench", "--quick"])) == ()
    assert _cli.peers_wanted(parser.parse_args(["bench"])) == _bench.PEERS
    assert _cli.peers_wanted(parser.parse_args(["bench", "--quick", "--peers", "all"])) \
        == _bench.PEERS
    assert _cli.peers_wanted(parser.parse_args(["bench", "--peers", "numba"])) == ("numba",)
    assert _cli.size_wanted(parser.parse_args(["bench", "--quick"])) == "quick"
    assert _cli.size_wanted(parser.parse_args(["bench"])) == "full"
    # the quick shapes are the canonical ones but for ALiBi's prefill and table
    assert {k for k in _bench.FULL if _bench.FULL[k] != _bench.SIZES["quick"][k]} \
        == {"alibi_seq"}


def test_llama_decode_step_is_repeatable_and_times_its_rope():
    wl = next(w for w in TINY_WORKLOADS if w.name == "llama-decode")
    base = wl.make(np.dtype("float32"))
    for impl in ("fastpe", "numpy"):
        arrays = _bench.copy_arrays(base, wl.written)
        step = wl.impls[impl](arrays, 1)
        first = step(arrays)[0].copy()
        assert step.inner_seconds > 0
        # the step rewrites the cache slots it wrote with the same values
        assert np.array_equal(step(arrays)[0], first)
        cfg = _bench.program.llama_config(_bench.TINY)
        rows, pos = np.arange(cfg.batch), np.asarray(cfg.lengths)
        changed = np.nonzero((arrays["k_cache"] != base["k_cache"]).any(axis=(3, 4)))
        assert set(zip(changed[1], changed[2])) == set(zip(rows, pos))


def test_program_rope_is_the_formula():
    """The program's own NumPy RoPE rotates (x_j, x_{j+d/2}) by p * base^(-2j/d), as the
    float64 formula does, on q and k views of one fused buffer."""
    cfg = _bench.program.llama_config(_bench.TINY)
    rope = _bench.program.NumpyLlamaRope(cfg)
    rng = np.random.default_rng(0)
    qkv = rng.standard_normal((cfg.batch, 1, cfg.heads + 2 * cfg.kv_heads, cfg.head_dim))
    qkv = qkv.astype(np.float32)
    q, k = qkv[:, :, :cfg.heads], qkv[:, :, cfg.heads:cfg.heads + cfg.kv_heads]
    pos = np.asarray(cfg.lengths)[:, None]
    qr, kr = rope(q, k, pos)
    half = cfg.head_dim // 2
    angle = pos[:, :, None, None] * cfg.base ** (-np.arange(half) / half)
    for x, got in ((q, qr), (k, kr)):
        x1, x2 = x[..., :half].astype(np.float64), x[..., half:].astype(np.float64)
        want = np.concatenate((x1 * np.cos(angle) - x2 * np.sin(angle),
                               x2 * np.cos(angle) + x1 * np.sin(angle)), axis=-1)
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-6)


def test_fastpe_on_torch_tensors_is_fastpes_call():
    pytest.importorskip("torch")
    for wl in _bench.workloads("tiny"):
        peer = _bench.peers._peer_for("fastpe-torch", wl)
        if wl.family == "program":
            assert peer is None
            continue
        base = wl.make(np.dtype("float32"))
        arrays = _bench.copy_arrays(base, wl.written)
        got = peer(arrays, 1)(arrays)
        import torch
        assert all(isinstance(g, torch.Tensor) for g in got), wl.name
        mine = _bench.copy_arrays(base, wl.written)
        ref = wl.impls["fastpe"](mine, 1)(mine)
        for g, r in zip(got, ref):
            assert np.array_equal(g.numpy(), np.asarray(r), equal_nan=True), wl.name
        # in place on the arrays' own memory, as fastpe on NumPy
        for name in wl.written:
            assert np.array_equal(arrays[name], mine[name], equal_nan=True), wl.name


def test_a_clone_named_fastpe_run_from_its_parent_folder(tmp_path):
    """Python started in the folder holding a checkout named `fastpe` takes the checkout
    for an empty namespace package, as the README's Quick start says. -S: no
    site-packages, where an installed fastpe could come first."""
    if not (TESTS_ROOT / "setup.py").is_file():
        pytest.skip("not a checkout (an installed-wheel run)")
    clone = tmp_path / "fastpe"
    clone.symlink_to(TESTS_ROOT, target_is_directory=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

    def python(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-S", *args], env=env, capture_output=True,
                              text=True, timeout=60, cwd=str(tmp_path))

    proc = python("-c", "import fastpe; print(fastpe.__file__, list(fastpe.__path__)); "
                        "fastpe.RotaryEmbedding")
    assert proc.stdout.split() == ["None", f"[{str(clone)!r}]"], proc.stdout
    assert "AttributeError: module 'fastpe' has no attribute 'RotaryEmbedding'" in proc.stderr
    proc = python("-m", "fastpe")
    assert proc.returncode == 1
    assert "No module named fastpe.__main__" in proc.stderr, proc.stderr
