"""fastpe.info(): what this installation runs."""

from __future__ import annotations

import platform
from typing import TypedDict

import numpy as np

from . import _backend, _checks, _threads
from ._version import __version__

# the kernel variants there are, narrowest first (fastpe._kernels.VARIANTS reversed; named
# here too so that info() works without the compiled extension)
_VARIANTS = ("baseline", "avx2", "avx512")


class _InfoWhenNotCompiled(TypedDict, total=False):
    import_error: str


class Info(_InfoWhenNotCompiled):
    """What :func:`info` returns; ``import_error`` only when the extension did not load."""

    version: str
    backend: str
    openmp: bool
    num_threads: int
    compiled: bool
    isa: str | None
    isa_available: list[str]
    compile_flags: str | None
    half_conversion: str | None
    bfloat16_narrowing: str | None
    bfloat16: bool
    numpy: str
    python: str
    machine: str


def info() -> Info:
    """Version, active backend, OpenMP, threads, and the compiled build's details.

    Keys: version, backend, openmp (bool), num_threads, compiled (bool),
    isa (the compiled kernel variant loaded: baseline, avx2 or avx512; the one calls run
    on under the "cython" backend, none under "numpy"), isa_available
    (the variants this CPU and OS run, narrowest first; avx512 is the default on
    Intel CPUs and AMD's from Zen 5, elsewhere it runs only with FASTPE_ISA=avx512),
    compile_flags, half_conversion, bfloat16_narrowing (how the vector loops round
    bfloat16 results from float32: "hardware", AVX512_BF16 in the wide variants, or
    "software"), bfloat16 (ml_dtypes present), numpy,
    python, machine; import_error when the extension did not load.
    """
    compiled = _backend.compiled
    out: Info = {
        "version": __version__,
        "backend": _backend.backend(),
        "openmp": bool(compiled is not None and compiled.OPENMP),
        "num_threads": _threads.get_num_threads(),
        "compiled": compiled is not None,
        "isa": compiled.ISA if compiled is not None else None,
        "isa_available": (
            [v for v in _VARIANTS if compiled.cpu_supports(v)]
            if compiled is not None else []
        ),
        "compile_flags": compiled.COMPILE_FLAGS if compiled is not None else None,
        "half_conversion": compiled.HALF_CONVERSION if compiled is not None else None,
        "bfloat16_narrowing": (
            ("hardware" if compiled.bf16_hardware_narrowing() else "software")
            if compiled is not None else None
        ),
        "bfloat16": _checks.HAS_ML_DTYPES,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
    }
    if compiled is None:
        out["import_error"] = str(_backend.import_error)
    return out
