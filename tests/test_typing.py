"""Types: the stubs of the compiled kernels match the built modules (mypy.stubtest, as
pykdtree runs it), and fastpe is a typed package for mypy (py.typed ships beside it).

The mypy checks run in a fresh interpreter from a temporary directory, so they check the
fastpe under test (the installed wheel, or the source tree when that is what runs) and
nothing in the current directory. They are skipped with a reason when mypy is not
installed (it is in the `test` extra) or the compiled extension is not built.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import COMPILED, PACKAGE_ROOT, clean_env

import fastpe

needs_mypy = pytest.mark.skipif(
    importlib.util.find_spec("mypy") is None,
    reason="mypy is not installed (it comes with the test extra: pip install 'fastpe[test]')")

ALLOWLIST = Path(__file__).with_name("stubtest_allowlist.txt")
VARIANTS = ("baseline", "avx2")

# follow_imports = silent: stubtest type-checks the stub *and* everything it imports
# (the fastpe package itself); this test is about the stubs, so errors elsewhere in
# fastpe are for test_the_package_type_checks, not for this test.
MYPY_CONFIG = """\
[mypy]
follow_imports = silent
cache_dir = {cache}

# optional dependencies (plots, bfloat16): absent from a plain test install
[mypy-matplotlib.*,ml_dtypes.*]
ignore_missing_imports = True
"""


def _built_variants() -> list[str]:
    """The kernel variants built here that this CPU can import."""
    from fastpe._kernels import kernels_baseline

    return [v for v in VARIANTS
            if importlib.util.find_spec(f"fastpe._kernels.kernels_{v}") is not None
            and kernels_baseline.cpu_supports(v)]


def _run_mypy(tool: str, args: list[str], tmp_path: Path, request) -> subprocess.CompletedProcess:
    """`python -m <tool> <config> *args` (tool: mypy or mypy.stubtest) in tmp_path, with
    the environment of conftest.clean_env (the fastpe under test first on the path)."""
    pytest_cache = getattr(request.config, "cache", None)  # None under -p no:cacheprovider
    cache = pytest_cache.mkdir("fastpe-mypy") if pytest_cache is not None else tmp_path
    config = tmp_path / "mypy.ini"
    config.write_text(MYPY_CONFIG.format(cache=cache))
    option = "--config-file" if tool == "mypy" else "--mypy-config-file"
    return subprocess.run([sys.executable, "-m", tool, option, str(config), *args],
                          env=clean_env(), cwd=str(tmp_path), capture_output=True, text=True,
                          timeout=600)


@needs_mypy
@pytest.mark.skipif(not COMPILED, reason="the compiled extension is not built")
def test_stubs_match_the_compiled_modules(tmp_path, request):
    """mypy.stubtest on every kernels_<variant> module built here: every runtime name has a
    stub (bar tests/stubtest_allowlist.txt, Cython artefacts), every stub name exists at
    runtime, and the signatures agree."""
    modules = [f"fastpe._kernels.kernels_{v}" for v in _built_variants()]
    assert modules, "kernels_baseline is built but not importable"
    proc = _run_mypy("mypy.stubtest", ["--allowlist", str(ALLOWLIST), *modules],
                     tmp_path, request)
    assert proc.returncode == 0, (
        f"stubtest {' '.join(modules)} (fastpe from {PACKAGE_ROOT}) failed; update "
        f"fastpe/_kernels/kernels_baseline.pyi to match kernels.pyx and its .pxi files:\n"
        f"{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}")


def test_package_ships_py_typed_and_stubs():
    """PEP 561: py.typed beside fastpe/__init__.py, and a stub for every compiled variant
    that is built (a wheel without them reads as untyped to mypy)."""
    package = Path(fastpe.__file__).parent
    assert (package / "py.typed").is_file(), f"no py.typed in {package}"
    for v in VARIANTS:
        if importlib.util.find_spec(f"fastpe._kernels.kernels_{v}") is not None:
            assert (package / "_kernels" / f"kernels_{v}.pyi").is_file(), (
                f"kernels_{v} is built but kernels_{v}.pyi is not installed beside it")


USER_CODE = """\
import numpy as np
import fastpe
import fastpe._kernels.kernels_baseline as k

version: str = fastpe.__version__
info: dict = fastpe.info()
openmp: bool = k.OPENMP
table = fastpe.sinusoidal_table(4, 8)
reveal_type(k.cpu_supports)
"""


@needs_mypy
def test_mypy_sees_a_typed_package(tmp_path, request):
    """mypy resolves `import fastpe` to the package under test as a typed package: no
    'missing library stubs or py.typed marker', and the compiled module's names come
    from its stub."""
    (tmp_path / "user.py").write_text(USER_CODE)
    proc = _run_mypy("mypy", ["user.py"], tmp_path, request)
    out = proc.stdout + proc.stderr
    assert "py.typed" not in out and "import-untyped" not in out and "import-not-found" \
        not in out, out
    signature = r"def \(isa: (builtins\.)?str\) -> (builtins\.)?bool"
    assert re.search(f'Revealed type is "{signature}"', out), out
    assert proc.returncode == 0, out


@needs_mypy
def test_the_package_type_checks(tmp_path, request):
    """fastpe's own annotations hold together: mypy over the package under test
    (-p fastpe, with its stubs for the compiled modules) reports nothing."""
    proc = _run_mypy("mypy", ["-p", "fastpe"], tmp_path, request)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
