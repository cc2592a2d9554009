"""The compiled kernels: the best variant of ``kernels`` this CPU runs.

``FASTPE_ISA=baseline|avx2`` forces one variant (an ImportError when
it was not built or this CPU cannot run it); tests use it to check each one.
"""

import importlib as _importlib
import os as _os
from types import ModuleType as _ModuleType

from . import kernels_baseline as _baseline

_ORDER = ("avx2", "baseline")


def _load() -> _ModuleType:
    forced = _os.environ.get("FASTPE_ISA", "").strip().lower()
    if forced and forced not in _ORDER:
        raise ImportError(f"FASTPE_ISA={forced!r}: expected one of {', '.join(_ORDER)}")
    for isa in (forced,) if forced else _ORDER:
        if not _baseline.cpu_supports(isa):
            if forced:
                raise ImportError(f"FASTPE_ISA={forced!r}: this CPU cannot run that variant")
            continue
        try:
            return _importlib.import_module(f"{__name__}.kernels_{isa}")
        except ImportError:
            if forced:
                raise
    return _baseline


kernels = _load()
