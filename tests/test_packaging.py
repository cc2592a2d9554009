"""Packaging: one source of truth for the version (fastpe/_version.py, read by setuptools
and by fastpe/__init__.py), the installed distribution's metadata agreeing with it, and
every ISA variant of the kernels present where the platform builds it.

Checks of the sdist's and the wheel's contents live in .ci/package, which builds them.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import sys
from pathlib import Path

import pytest
from conftest import COMPILED, PACKAGE_ROOT, TREE_ROOT

import fastpe
import fastpe._version


def test_version_has_one_source():
    assert fastpe.__version__ is fastpe._version.__version__
    assert fastpe.info()["version"] == fastpe.__version__
    packaging_version = pytest.importorskip("packaging.version")
    assert str(packaging_version.Version(fastpe.__version__)) == fastpe.__version__, (
        f"fastpe.__version__ = {fastpe.__version__!r} is not a normalised PEP 440 version")


def _installed_distribution() -> importlib.metadata.Distribution | None:
    """The installed distribution whose files are the fastpe under test, or None (source
    tree, perhaps with a fastpe.egg-info; editable install; another copy of fastpe)."""
    try:
        dist = importlib.metadata.distribution("fastpe")
    except importlib.metadata.PackageNotFoundError:
        return None
    if dist.read_text("RECORD") is None:  # an egg-info in a source tree, not an install
        return None
    init = Path(fastpe.__file__).resolve()
    for f in dist.files or ():
        if f.as_posix() == "fastpe/__init__.py":
            return dist if Path(str(dist.locate_file(f))).resolve() == init else None
    return None


def test_installed_metadata_version_is_fastpe_version():
    """The wheel's METADATA Version (from setuptools' dynamic version) equals
    fastpe.__version__: both come from fastpe/_version.py."""
    dist = _installed_distribution()
    if dist is None:
        pytest.skip("the fastpe under test is not an installed (non-editable) distribution")
    assert dist.version == fastpe.__version__, (
        f"installed metadata says {dist.version}, fastpe.__version__ is {fastpe.__version__}")
    assert dist.metadata["Name"] == "fastpe"


def test_pyproject_reads_the_version_module():
    """Beside the tests (a source tree): pyproject.toml declares the version dynamic, read from
    fastpe._version.__version__, and spells no version of its own."""
    pyproject = TREE_ROOT / "pyproject.toml"
    if not pyproject.is_file():
        pytest.skip("no pyproject.toml beside tests/")
    if sys.version_info < (3, 11):
        pytest.skip("tomllib needs Python 3.11")
    import tomllib

    config = tomllib.loads(pyproject.read_text())
    assert "version" not in config["project"], "pyproject.toml hard-codes a version"
    assert "version" in config["project"]["dynamic"]
    assert config["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "fastpe._version.__version__"}


def _is_x86_64() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64")


@pytest.mark.skipif(not COMPILED, reason="the compiled extension is not built")
def test_every_isa_variant_is_built():
    """setup.py builds kernels_baseline everywhere and kernels_avx2 and kernels_avx512 on
    x86-64; a wheel or build that lost a variant runs slower without any error (or cannot
    honour FASTPE_ISA), so it fails here (unless the build was limited on purpose with
    FASTPE_ISA_VARIANTS, also set for the tests)."""
    expected = ["baseline", "avx2", "avx512"] if _is_x86_64() else ["baseline"]
    limited = os.environ.get("FASTPE_ISA_VARIANTS")
    if limited:
        expected = [v.strip() for v in limited.split(",") if v.strip()]
    missing = [v for v in expected
               if importlib.util.find_spec(f"fastpe._kernels.kernels_{v}") is None]
    assert not missing, (
        f"fastpe from {PACKAGE_ROOT} lacks the kernel variant(s) {missing} "
        f"(machine {platform.machine()}); rebuild, or set FASTPE_ISA_VARIANTS to the "
        "variants built on purpose")


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64")
                    or sys.platform != "linux", reason="x86-64 Linux build lines")
@pytest.mark.parametrize("program", ["sse2_bound.c", "half_decode_bound.c", "angles_bound.c"])
def test_bench_c_programs_build_as_their_comment_says(program, tmp_path):
    """The bound programs the README cites build with the command in their own comment."""
    import shlex
    import shutil
    import subprocess
    if shutil.which("cc") is None:
        pytest.skip("no C compiler named cc")
    source = Path(__file__).resolve().parent.parent / "bench" / program
    if not source.exists():
        pytest.skip("no bench/ beside tests/ (an sdist's tests)")
    text = source.read_text()
    start = text.index("cc -O")
    line = " ".join(part.strip(" *\\") for part in text[start:].split("&&")[0].splitlines())
    args = shlex.split(line)
    args[args.index("-o") + 1] = str(tmp_path / "bound")
    args[args.index(f"bench/{program}")] = str(source)
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{' '.join(args)}:\n{done.stderr}"
