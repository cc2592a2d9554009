"""Types: fastpe ships as a typed package (PEP 561).

The type checks themselves (mypy --strict over the package, mypy.stubtest of the
compiled kernels' stubs, a user's file seeing typed names) are `.ci/types`, a CI
step of their own, so the test suite does not need mypy.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import fastpe

VARIANTS = ("baseline", "avx2", "avx512")


def test_package_ships_py_typed_and_stubs():
    """py.typed beside fastpe/__init__.py, and a stub for every compiled variant
    that is built (a wheel without them reads as untyped to mypy)."""
    package = Path(fastpe.__file__).parent
    assert (package / "py.typed").is_file(), f"no py.typed in {package}"
    for v in VARIANTS:
        if importlib.util.find_spec(f"fastpe._kernels.kernels_{v}") is not None:
            assert (package / "_kernels" / f"kernels_{v}.pyi").is_file(), (
                f"kernels_{v} is built but kernels_{v}.pyi is not installed beside it")
