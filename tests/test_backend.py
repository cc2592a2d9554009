"""Backends and build: the guard against a silent NumPy fallback, use_backend,
FASTPE_BACKEND, info(), OpenMP in the build, and the FASTPE_ISA variants."""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import warnings

import numpy as np
import pytest
from conftest import (
    COMPILED,
    ISA_NAMES,
    PACKAGE_ROOT,
    REQUESTED_BACKEND,
    clean_env,
    cpu_family_id,
    cpu_runs,
    cpu_vendor_id,
    needs_compiled,
    run_python,
)

import fastpe


def test_compiled_backend_guard():
    """A run that did not ask for the NumPy backend must be running the compiled one: an
    import of ./fastpe without a built extension must never pass silently."""
    info = fastpe.info()
    if REQUESTED_BACKEND == "numpy":
        assert fastpe.backend() == "numpy" and info["backend"] == "numpy"
        return
    assert fastpe.backend() == "cython", (
        f"fastpe runs on the NumPy fallback (backend {fastpe.backend()!r}) although "
        f"FASTPE_BACKEND=numpy was not asked for; the compiled kernels did not import: "
        f"{info.get('import_error')}. Build them (`pip install -e .` or "
        f"`python setup.py build_ext --inplace`) or run with FASTPE_BACKEND=numpy.")
    assert info["backend"] == "cython" and info["compiled"] is True


# ---- use_backend -----------------------------------------------------------------------------


def _other(name):
    return "numpy" if name == "cython" else "cython"


def test_use_backend_left_on_another_thread_says_so():
    """A generator's block entered on one thread and left on another (the generator
    resumed there): the leaving thread's context has no entry to restore, a RuntimeError
    naming the block, where it was a bare IndexError; the entering thread keeps the
    backend set, as a context variable set in a generator does."""
    start = fastpe.backend()
    seen: dict[str, object] = {}

    def gen():
        with fastpe.use_backend(_other(start)):
            yield fastpe.backend()
            yield fastpe.backend()

    def run(name, work):
        def body():
            try:
                seen[name] = work()
            except BaseException as exc:
                seen[name] = exc
        t = threading.Thread(target=body)
        t.start()
        t.join(20)

    g = gen()
    run("entered", lambda: (next(g), fastpe.backend()))
    run("left", lambda: [next(g), next(g, None)])
    assert seen["entered"] == (_other(start), _other(start))
    assert isinstance(seen["left"], RuntimeError), seen["left"]
    assert re.search(r"use_backend\('\w+'\): the block is left in another thread",
                     str(seen["left"]))
    assert fastpe.backend() == start


@pytest.mark.skipif(not COMPILED, reason="needs both backends")
def test_use_backend_switches_and_restores():
    start = fastpe.backend()
    for name in ("numpy", "cython"):
        with fastpe.use_backend(name):
            assert fastpe.backend() == name
            assert fastpe.info()["backend"] == name
        assert fastpe.backend() == start


@pytest.mark.skipif(not COMPILED, reason="needs both backends")
def test_use_backend_restores_on_exception():
    start = fastpe.backend()
    with pytest.raises(RuntimeError, match="boom"):
        with fastpe.use_backend(_other(start)):
            assert fastpe.backend() == _other(start)
            raise RuntimeError("boom")
    assert fastpe.backend() == start


@pytest.mark.skipif(not COMPILED, reason="needs both backends")
def test_use_backend_nests():
    start = fastpe.backend()
    with fastpe.use_backend("numpy"):
        with fastpe.use_backend("cython"):
            assert fastpe.backend() == "cython"
            with fastpe.use_backend("numpy"):
                assert fastpe.backend() == "numpy"
            assert fastpe.backend() == "cython"
        assert fastpe.backend() == "numpy"
    assert fastpe.backend() == start


@pytest.mark.skipif(not COMPILED, reason="needs both backends")
def test_use_backend_one_object_entered_again():
    """One object serves several blocks, nested or one after another, each exit
    restoring what its entry found."""
    start = fastpe.backend()
    other = fastpe.use_backend(_other(start))
    same = fastpe.use_backend(start)
    with other:
        assert fastpe.backend() == _other(start)
        with same:
            assert fastpe.backend() == start
            with other:
                assert fastpe.backend() == _other(start)
            assert fastpe.backend() == start
        assert fastpe.backend() == _other(start)
    assert fastpe.backend() == start
    with other:
        assert fastpe.backend() == _other(start)
    assert fastpe.backend() == start


@pytest.mark.skipif(not COMPILED, reason="needs both backends")
def test_use_backend_one_object_in_two_threads_at_once():
    """Blocks of one object in two threads, the first to enter leaving first: each
    thread's exit restores its own backend, the other thread's block holds."""
    start = fastpe.backend()
    shared = fastpe.use_backend(_other(start))
    step = [threading.Event() for _ in range(3)]
    seen, errors = {}, []

    def first():
        try:
            with shared:
                step[0].set()
                assert step[1].wait(10)
            seen["first after"] = fastpe.backend()
        except BaseException as exc:
            errors.append(exc)
        finally:
            step[2].set()

    def second():
        try:
            assert step[0].wait(10)
            with shared:
                step[1].set()
                assert step[2].wait(10)
                seen["second inside"] = fastpe.backend()
            seen["second after"] = fastpe.backend()
        except BaseException as exc:
            errors.append(exc)
            step[1].set()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert errors == []
    assert seen == {"first after": start, "second inside": _other(start),
                    "second after": start}
    assert fastpe.backend() == start


@pytest.mark.skipif(not COMPILED, reason="needs both backends")
def test_use_backend_decorates_functions():
    start = fastpe.backend()
    seen = []

    @fastpe.use_backend(_other(start))
    def run(depth):
        seen.append(fastpe.backend())
        if depth:
            run(depth - 1)
        seen.append(fastpe.backend())

    run(1)
    assert seen == [_other(start)] * 4
    assert fastpe.backend() == start


def test_use_backend_made_and_never_entered_warns():
    """A statement `fastpe.use_backend("numpy")` reads as a switch: it changes nothing,
    and says so where it is written; entered or decorating, it says nothing."""
    start = fastpe.backend()
    with pytest.warns(RuntimeWarning, match=r"never entered.*FASTPE_BACKEND=numpy") as got:
        fastpe.use_backend("numpy")
    assert got[0].filename == __file__
    assert fastpe.backend() == start
    with warnings.catch_warnings(record=True) as quiet:
        warnings.simplefilter("always")
        with fastpe.use_backend("numpy"):
            pass
        fastpe.use_backend("numpy")(lambda: None)
        gc.collect()
    assert [str(w.message) for w in quiet] == []
    assert fastpe.backend() == start


@pytest.mark.parametrize("name", ["bogus", "", "NUMPY", None])
def test_use_backend_rejects_unknown_names(name):
    start = fastpe.backend()
    with pytest.raises(ValueError, match=r"\bname\b"):
        with fastpe.use_backend(name):
            pass
    with pytest.raises(ValueError, match=r"\bname\b"):
        fastpe.use_backend(name)    # when it is made, not only when entered
    assert fastpe.backend() == start


@pytest.mark.skipif(not COMPILED, reason="needs both backends")
def test_use_backend_selects_the_loops(monkeypatch):
    """"numpy" runs fastpe.reference's loops, "cython" never does; both give the same
    numbers within tolerance."""
    calls = []
    for fn in ("run_sinusoidal", "run_learned"):
        real = getattr(fastpe.reference, fn)
        monkeypatch.setattr(fastpe.reference, fn,
                            lambda plan, real=real, fn=fn: (calls.append(fn), real(plan))[1])
    x = np.random.default_rng(0).uniform(-2, 2, (2, 64, 16))
    table = np.ones((64, 16))
    out = {}
    for name in ("cython", "numpy"):
        calls.clear()
        y = x.copy()
        with fastpe.use_backend(name):
            fastpe.add_sinusoidal(y, scale=1.3)
            fastpe.add_learned(y, table)
        assert calls == ([] if name == "cython" else ["run_sinusoidal", "run_learned"]), name
        out[name] = y
    np.testing.assert_allclose(out["cython"], out["numpy"], rtol=1e-12, atol=1e-12)


@pytest.mark.skipif(not COMPILED, reason="needs both backends")
def test_numpy_backend_never_calls_compiled_code(monkeypatch):
    """fastpe.reference, and every public function on the NumPy backend, validates and
    computes in NumPy: each compiled function raises if called."""
    kern = fastpe._backend.compiled
    cos, sin = fastpe.rope_cos_sin(np.arange(700), fastpe.rope_frequencies(16))

    def forbidden(name):
        def call(*args, **kwargs):
            raise AssertionError(f"the NumPy backend called kernels.{name}")
        return call

    for name in dir(kern):
        if not name.startswith("_") and callable(getattr(kern, name)) and not isinstance(
                getattr(kern, name), type):
            monkeypatch.setattr(kern, name, forbidden(name))
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((2, 9, 4, 16)), rng.standard_normal((2, 9, 2, 16))
    pos = np.arange(9) + 600   # past 512: converted, ranged and checked in Python
    x = rng.standard_normal((2, 700, 16))
    scores = rng.standard_normal((2, 4, 9, 9))
    for run in (fastpe.reference, fastpe):
        ctx = fastpe.use_backend("numpy") if run is fastpe else contextlib.nullcontext()
        with ctx:
            run.apply_rope(q, k, pos, scaling={"rope_type": "dynamic", "factor": 2.0},
                           max_position_embeddings=16)
            run.apply_rope_cached(q, k, cos, sin, pos)
            run.add_sinusoidal(x, positions=np.arange(700))
            run.add_learned(x, np.ones((800, 16)), positions=np.arange(700))
            run.add_alibi(scores)


# ---- FASTPE_BACKEND (read at import: fresh interpreters) ------------------------------------

# Makes the compiled extension unimportable, as in a source tree that was never built.
NO_EXTENSION = "import sys; sys.modules['fastpe._kernels'] = None\n"

REPORT = """
import json, fastpe
print(json.dumps({"backend": fastpe.backend(), "info": fastpe.info()}))
"""


def _report(proc):
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_fastpe_backend_cython_without_extension_says_how_to_build():
    proc = run_python(NO_EXTENSION + "import fastpe", FASTPE_BACKEND="cython")
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError"), proc.stderr[-3000:]
    assert "FASTPE_BACKEND" in last and "pip install" in last, last


def test_missing_extension_falls_back_to_numpy():
    report = _report(run_python(NO_EXTENSION + REPORT))
    assert report["backend"] == "numpy"
    info = report["info"]
    assert info["compiled"] is False and info["openmp"] is False and info["num_threads"] == 1
    assert info.get("import_error"), info


def test_a_checkout_without_its_built_kernels_says_so(tmp_path):
    """The package's files without the extension modules (a checkout never built): the
    NumPy backend, and an import error that says the kernels are not built."""
    shutil.copytree(PACKAGE_ROOT / "fastpe", tmp_path / "fastpe",
                    ignore=shutil.ignore_patterns("*.so", "*.pyd", "__pycache__"))
    proc = subprocess.run([sys.executable, "-c", REPORT], cwd=tmp_path, env=clean_env(),
                          capture_output=True, text=True, timeout=60)
    report = _report(proc)
    assert report["backend"] == "numpy"
    error = report["info"]["import_error"]
    assert "not built" in error and "circular" not in error, error


def test_use_backend_cython_without_extension_is_an_import_error():
    code = NO_EXTENSION + """
import fastpe
try:
    with fastpe.use_backend("cython"):
        pass
except ImportError as exc:
    print("ImportError", exc)
"""
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ImportError") and "pip install" in proc.stdout


def test_fastpe_backend_numpy():
    report = _report(run_python(REPORT, FASTPE_BACKEND="numpy"))
    assert report["backend"] == "numpy" and report["info"]["backend"] == "numpy"


@needs_compiled
def test_fastpe_backend_cython():
    report = _report(run_python(REPORT, FASTPE_BACKEND="cython"))
    assert report["backend"] == "cython"


def test_default_backend_is_cython_when_built():
    report = _report(run_python(REPORT))
    assert report["backend"] == ("cython" if COMPILED else "numpy")


@pytest.mark.parametrize("value", ["bogus", "c"])
def test_fastpe_backend_unknown_is_an_import_error(value):
    proc = run_python("import fastpe", FASTPE_BACKEND=value)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError") and "FASTPE_BACKEND" in last, last


# ---- info() and the build ------------------------------------------------------------------


def test_info_keys():
    info = fastpe.info()
    assert {"version", "backend", "openmp", "num_threads"} <= info.keys()
    assert info["version"] == fastpe.__version__
    assert info["backend"] == fastpe.backend()
    assert type(info["openmp"]) is bool
    assert isinstance(info["num_threads"], int) and info["num_threads"] >= 1
    assert info["num_threads"] == fastpe.get_num_threads()
    fastpe.set_num_threads(1)
    assert fastpe.info()["num_threads"] == 1


@pytest.mark.skipif(REQUESTED_BACKEND == "numpy", reason="FASTPE_BACKEND=numpy run")
@pytest.mark.skipif(os.environ.get("FASTPE_REQUIRE_OPENMP") == "0",
                    reason="FASTPE_REQUIRE_OPENMP=0: a deliberately serial build")
def test_build_has_openmp():
    """Like scikit-learn's test_build.py: fails when the build lost OpenMP (setup.py then
    only warns unless FASTPE_FAIL_NO_OPENMP=1). FASTPE_REQUIRE_OPENMP=0 skips it."""
    info = fastpe.info()
    assert info["compiled"], f"the compiled extension is not built: {info.get('import_error')}"
    assert info["openmp"] is True, (
        "fastpe was built without OpenMP: every kernel runs on one thread. Rebuild with an "
        "OpenMP-capable compiler (FASTPE_FAIL_NO_OPENMP=1 makes that an error). "
        f"compile flags: {info.get('compile_flags')}")


_H, _K = 8, 96
_TYPED_CALLS = {
    # (a call with a program's argument types, the same call with Python's)
    "alibi q_offset np.int64": (
        lambda a: fastpe.add_alibi(a["s"], q_offset=np.int64(95)),
        lambda a: fastpe.add_alibi(a["s"], q_offset=95)),
    "alibi max_bias": (lambda a: fastpe.add_alibi(a["s"], max_bias=np.float32(6)),
                       lambda a: fastpe.add_alibi(a["s"], slopes=fastpe.alibi_slopes(
                           _H, max_bias=6.0))),
    # transformers' slopes are float32
    "alibi float32 slopes": (
        lambda a: fastpe.add_alibi(a["s"], slopes=fastpe.alibi_slopes(_H).astype(np.float32)),
        lambda a: fastpe.add_alibi(a["s"], slopes=fastpe.alibi_slopes(_H).astype(
            np.float32).astype(np.float64))),
    "t5 np.int64": (
        lambda a: fastpe.add_relative_bias(a["s"], a["table"], bidirectional=False,
                                           max_distance=np.int64(128), q_offset=np.int32(95)),
        lambda a: fastpe.add_relative_bias(a["s"], a["table"], bidirectional=False,
                                           max_distance=128, q_offset=95)),
    "RelativeBias np.int64": (
        lambda a: fastpe.RelativeBias(32, causal=True)(a["s"], a["table"],
                                                       q_offset=np.int64(95)),
        lambda a: fastpe.RelativeBias(32, causal=True)(a["s"], a["table"], q_offset=95)),
    "learned np.int64": (lambda a: fastpe.add_learned(a["x"], a["wpe"], offset=np.int64(95)),
                         lambda a: fastpe.add_learned(a["x"], a["wpe"], offset=95)),
    "sinusoidal np scalars": (
        lambda a: fastpe.add_sinusoidal(a["x"], offset=np.uint32(95), scale=np.float32(22.5),
                                        base=10000),
        lambda a: fastpe.add_sinusoidal(a["x"], offset=95, scale=22.5, base=10000.0)),
    # the table's rows added as a learned table's: the same bits, by another path
    "sinusoidal split": (
        lambda a: fastpe.add_sinusoidal(a["x"], layout="split"),
        lambda a: fastpe.add_learned(a["x"], fastpe.sinusoidal_table(1, 512, layout="split"))),
    "sinusoidal split_cos": (
        lambda a: fastpe.add_sinusoidal(a["x"], layout="split_cos"),
        lambda a: fastpe.add_learned(a["x"], fastpe.sinusoidal_table(1, 512,
                                                                     layout="split_cos"))),
}


@pytest.mark.skipif(fastpe.backend() != "cython", reason="the compiled backend's entries")
@pytest.mark.parametrize("name", list(_TYPED_CALLS))
def test_a_programs_argument_types_take_the_compiled_entry(name, monkeypatch):
    """NumPy's scalars (an offset from array arithmetic, a float32 scale), float32 slopes,
    max_bias and the split layouts of a decode step are taken by the compiled entry, not
    the validating path (5-15x the call's time), with the bits of the plain call."""
    def inputs():
        rng = np.random.default_rng(0)
        return {"s": rng.random((4, _H, 1, _K), np.float32),
                "table": rng.random((32, _H), np.float32),
                "x": rng.random((4, 1, 512), np.float32),
                "wpe": rng.random((1024, 512), np.float32)}

    typed, plain = _TYPED_CALLS[name]
    want = inputs()
    plain(want)
    validating = ("_args.add_alibi", "_args.add_learned", "_args.add_sinusoidal",
                  "_relative_args.add_relative_bias")
    for where in validating:
        module, function = where.split(".")
        monkeypatch.setattr(getattr(fastpe, module), function,
                            lambda *a, **k: pytest.fail("the validating path ran"))
    got = inputs()
    typed(got)
    for key in got:
        np.testing.assert_array_equal(got[key], want[key], err_msg=f"{name}: {key}")


@pytest.mark.skipif(fastpe.backend() != "cython", reason="the compiled backend's entries")
@pytest.mark.parametrize("kwargs", [{}, {"causal": True, "key_mask": np.arange(96) % 7 > 0},
                                    {"symmetric": True, "q_offset": np.int64(40)},
                                    {"max_bias": 6, "k_positions": np.arange(96) * 2}],
                         ids=["plain", "mask", "symmetric", "positions"])
def test_a_decode_steps_alibi_bias_takes_the_compiled_entry(kwargs, monkeypatch):
    """alibi_bias of a decode step's shape through the compiled entry (the validating
    path took 5-15x its time), a dtype or an out given too, with the validating path's
    bits (that path's: a dtype of another byte order)."""
    wants = {dt: fastpe.alibi_bias(16, 1, 96, dtype=np.dtype(dt).newbyteorder(), **kwargs)
             for dt in ("float32", "float16", "float64")}
    monkeypatch.setattr(fastpe._args, "alibi_bias",
                        lambda *a, **k: pytest.fail("the validating path ran"))
    got = fastpe.alibi_bias(16, 1, 96, **kwargs)
    assert got.dtype == np.float32 and got.shape == (16, 1, 96)
    np.testing.assert_array_equal(got, wants["float32"])
    for dt, want in wants.items():
        got = fastpe.alibi_bias(16, 1, 96, dtype=dt, **kwargs)
        assert got.dtype == dt
        np.testing.assert_array_equal(got, want)
        out = np.full((16, 1, 96), np.nan, dt)
        assert fastpe.alibi_bias(16, 1, 96, out=out, **kwargs) is out
        np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("sizes", [(0, 2**63, 1), (4, 0, 2**63), (2**62, 0, 1)])
def test_alibi_bias_of_no_elements_but_sizes_past_memory_is_named(sizes):
    """A size past what an array holds beside a zero one: refused by name by every path
    (the compiled entry's gate bounds each size, not only their product)."""
    with pytest.raises(ValueError, match=r"num_heads, q_len and k_len give a table of shape"):
        fastpe.alibi_bias(*sizes)


# ---- FASTPE_ISA ----------------------------------------------------------------------------


@pytest.mark.skipif(not COMPILED, reason="the compiled extension is not built")
@pytest.mark.parametrize("isa", ISA_NAMES)
def test_each_isa_variant_imports_and_reports_itself(isa, isa_runs):
    """Every variant built (fastpe/_kernels/kernels_<isa>.so) that this CPU runs (by
    /proc/cpuinfo) imports under FASTPE_ISA=<isa> and reports itself in info()."""
    if cpu_runs(isa) is False:
        proc = run_python("import fastpe._kernels", FASTPE_ISA=isa)
        assert proc.returncode != 0 and "ImportError" in proc.stderr
        pytest.skip(f"this CPU cannot run {isa} (an ImportError, as it should be)")
    run = isa_runs[isa]
    assert not isinstance(run, str), f"{isa} is built and the CPU runs it, yet: {run}"
    info, _ = run
    assert info["isa"] == isa and info["backend"] == "cython" and info["compiled"]


@pytest.mark.skipif(not COMPILED, reason="the compiled extension is not built")
def test_default_isa_is_the_first_automatic_variant_the_cpu_runs():
    """Without FASTPE_ISA: on an Intel CPU or an AMD one from Zen 5 (family 26; by
    /proc/cpuinfo's vendor_id and cpu family) avx512 where the CPU runs it, then avx2,
    then baseline; on any other avx2, then baseline, and avx512 runs only when
    FASTPE_ISA asks for it (it measured faster only where 512-bit vectors run at full
    width, README)."""
    from fastpe import _kernels

    vendor, family = cpu_vendor_id(), cpu_family_id()
    if vendor is not None:
        assert _kernels._baseline.cpu_vendor() == vendor
    if family is not None:
        assert _kernels._baseline.cpu_family() == family
    vendor, family = _kernels._baseline.cpu_vendor(), _kernels._baseline.cpu_family()
    wide = vendor == "GenuineIntel" or (vendor == "AuthenticAMD" and family >= 26)
    assert _kernels.AUTO == (("avx512", "avx2", "baseline") if wide else ("avx2", "baseline"))
    assert set(_kernels.VARIANTS) >= set(ISA_NAMES), ISA_NAMES
    runnable = [v for v in _kernels.AUTO if v in ISA_NAMES and cpu_runs(v) is not False]
    proc = run_python(REPORT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["info"]["isa"] == runnable[0]


# The kernels' import with the CPU check answering no for every variant but baseline, as
# on a CPU without AVX2 or AVX-512: fastpe imports (unforced) first, then the variant
# choice runs again under FASTPE_ISA=argv[1].
NO_WIDE_CPU = """
import os, sys
import fastpe
from fastpe import _kernels
_kernels._baseline.cpu_supports = lambda isa: isa == "baseline"
print(_kernels._load().ISA)
os.environ["FASTPE_ISA"] = sys.argv[1]
try:
    _kernels._load()
except ImportError as exc:
    print("ImportError:", exc)
"""


@pytest.mark.skipif(not COMPILED, reason="the compiled extension is not built")
@pytest.mark.parametrize("isa", ["avx2", "avx512"])
def test_forced_variant_the_cpu_cannot_run_is_a_clear_import_error(isa):
    """FASTPE_ISA=avx512 (or avx2) on a CPU without it: an ImportError that names the
    variant and what it needs, never a fallback; unforced, such a CPU gets baseline."""
    proc = run_python(NO_WIDE_CPU, isa)
    assert proc.returncode == 0, proc.stderr[-2000:]
    chosen, error = proc.stdout.strip().splitlines()[-2:]
    assert chosen == "baseline"
    assert error.startswith(f"ImportError: FASTPE_ISA='{isa}': this CPU cannot run that "
                            "variant (it needs "), error
    assert ("AVX-512" in error) == (isa == "avx512"), error


@pytest.mark.skipif(not COMPILED, reason="the compiled extension is not built")
def test_avx512_without_its_half_precision_loops_is_not_the_default():
    """An avx512 build without its 512-bit half-precision loops (a compiler without the
    FMA and F16C macros: MSVC) is passed over on Intel for the next variant; asked for,
    it loads."""
    code = """
    import fastpe, importlib, os, types
    from fastpe import _kernels
    real = importlib.import_module
    def without_loops(name, *args):
        if name.endswith(".kernels_avx512"):
            return types.SimpleNamespace(ISA="avx512", HALF_RUNS_512=False)
        return real(name, *args)
    _kernels._importlib.import_module = without_loops
    _kernels._baseline.cpu_supports = lambda isa: True
    _kernels.AUTO = _kernels.AUTO_WIDE
    print(_kernels._load().ISA)
    os.environ["FASTPE_ISA"] = "avx512"
    print(_kernels._load().ISA)
    """
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # the next variant built: avx2, or baseline where only it is (FASTPE_ISA_VARIANTS)
    after = "avx2" if importlib.util.find_spec("fastpe._kernels.kernels_avx2") else "baseline"
    assert proc.stdout.split()[-2:] == [after, "avx512"]


@pytest.mark.skipif(not COMPILED, reason="the compiled extension is not built")
def test_forced_variant_that_was_not_built_is_a_clear_import_error():
    code = """
    import fastpe, importlib, os
    from fastpe import _kernels
    real = importlib.import_module
    def missing(name, *args):
        if name.endswith(".kernels_avx512"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real(name, *args)
    _kernels._importlib.import_module = missing
    _kernels._baseline.cpu_supports = lambda isa: True
    os.environ["FASTPE_ISA"] = "avx512"
    try:
        _kernels._load()
    except ImportError as exc:
        print("ImportError:", exc)
    """
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == (
        "ImportError: FASTPE_ISA='avx512': this fastpe was built without kernels_avx512 "
        "(FASTPE_ISA_VARIANTS at build time)")


@pytest.mark.skipif(not COMPILED, reason="the compiled extension is not built")
@pytest.mark.skipif(cpu_runs("avx512") is not True, reason="this CPU has no AVX-512")
def test_avx512_variant_is_built_and_runs_here():
    """On a CPU with AVX-512 the x86-64 build has kernels_avx512, the CPU check agrees
    with /proc/cpuinfo, and FASTPE_ISA=avx512 runs it (isa in info(), its flags)."""
    if "avx512" not in ISA_NAMES:
        pytest.skip("built without kernels_avx512 (FASTPE_ISA_VARIANTS)")
    assert "avx512" in fastpe.info()["isa_available"]
    proc = run_python(REPORT, FASTPE_ISA="avx512")
    assert proc.returncode == 0, proc.stderr[-2000:]
    info = json.loads(proc.stdout)["info"]
    assert info["isa"] == "avx512" and info["backend"] == "cython"
    assert "-mavx512f" in info["compile_flags"] or "/arch:AVX512" in info["compile_flags"]


@pytest.mark.skipif(not COMPILED, reason="the compiled extension is not built")
def test_isa_available_matches_the_cpu():
    if cpu_runs("avx2") is None:
        pytest.skip("no /proc/cpuinfo here")
    available = fastpe.info()["isa_available"]
    assert "baseline" in available
    for isa in ISA_NAMES:
        assert (isa in available) == cpu_runs(isa), (isa, available)


@pytest.mark.parametrize("value", ["bogus", "avx1024"])
def test_fastpe_isa_unknown_is_an_import_error_of_the_kernels(value):
    proc = run_python("import fastpe._kernels", FASTPE_ISA=value)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError") and "FASTPE_ISA" in last, proc.stderr[-2000:]


@pytest.mark.parametrize("value", ["bogus", "avx1024"])
def test_fastpe_isa_unknown_with_fastpe_backend_cython(value):
    proc = run_python("import fastpe", FASTPE_ISA=value, FASTPE_BACKEND="cython")
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError") and "FASTPE_ISA" in last, proc.stderr[-2000:]


def test_fastpe_isa_unknown_is_an_import_error():
    """A forced variant that cannot load is never silently replaced by NumPy."""
    proc = run_python(REPORT, FASTPE_ISA="bogus")
    assert proc.returncode != 0 and "ImportError" in proc.stderr, proc.stdout


@pytest.mark.skipif(not COMPILED, reason="the compiled extension is not built")
@pytest.mark.parametrize("vendor, family, wide", [
    ("GenuineIntel", 6, True), ("AuthenticAMD", 25, False), ("AuthenticAMD", 26, True),
    ("AuthenticAMD", 23, False), ("AuthenticAMD", 27, True), ("HygonGenuine", 24, False),
    ("", 0, False)])
def test_avx512_first_where_512_bit_vectors_run_at_full_width(vendor, family, wide):
    """Intel's CPUs and AMD's from Zen 5 (family 26) put avx512 first; Zen 4 (25) and
    older, and any other vendor, avx2."""
    from fastpe import _kernels

    assert _kernels.full_width_512(vendor, family) is wide
