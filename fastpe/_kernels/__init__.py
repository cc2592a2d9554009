"""The compiled kernels: the variant of ``kernels`` chosen for this CPU.

One Cython source is built once per instruction-set level (setup.py): kernels_baseline
(SSE2 on x86-64; every other platform's only variant), kernels_avx2 (AVX2 + FMA + F16C +
BMI2) and kernels_avx512 (those plus AVX-512 F, BW, DQ and VL). Without ``FASTPE_ISA``
the first variant of ``AUTO`` that was built and that this CPU and OS run is imported:
kernels_avx512 comes first on the CPUs that execute 512-bit vectors at full width, Intel's
and AMD's from Zen 5 (family 26): there it measured level with kernels_avx2 where the
work is memory-bound and faster where it is arithmetic (half-precision conversions, RoPE
rows in the caches, the sinusoid of a table: up to 22% less time on an Intel Xeon, 42% on
a Zen 5).
Not on AMD's Zen 4 and older, which execute them as two 256-bit halves: there it
measured 3-19% faster in half-precision RoPE but 1.4x slower on the float32 ALiBi decode
and unsteady on some float32 prefills (README, "Backends and threads"), so it runs there
only when asked for.

``FASTPE_ISA=baseline|avx2|avx512`` forces one variant: an ImportError when it was not
built or this CPU cannot run it (never a silent fallback); tests use it to check each one.
"""

import importlib as _importlib
import importlib.util as _importlib_util
import os as _os
from types import ModuleType as _ModuleType

try:
    from . import kernels_baseline as _baseline
except ImportError:
    # Python's own message names a "partially initialized module" and a circular import
    if _importlib_util.find_spec(__name__ + ".kernels_baseline") is None:
        raise ImportError("the compiled kernels are not built here: no extension module "
                          "fastpe._kernels.kernels_baseline") from None
    raise

# every variant there is, widest first
VARIANTS = ("avx512", "avx2", "baseline")
# the variants chosen without FASTPE_ISA, in order of preference, by the CPU
AUTO_WIDE = ("avx512", "avx2", "baseline")
AUTO_OTHER = ("avx2", "baseline")
# AMD's first family whose cores execute 512-bit vectors at full width (Zen 5)
AMD_FULL_WIDTH_FAMILY = 26


def full_width_512(vendor: str, family: int) -> bool:
    """Whether a CPU of this vendor (CPUID's string) and family executes 512-bit vectors
    at full width: Intel's that have AVX-512, AMD's from Zen 5."""
    return vendor == "GenuineIntel" or (vendor == "AuthenticAMD"
                                        and family >= AMD_FULL_WIDTH_FAMILY)


# (getattr: a stale build of the baseline variant, from before cpu_vendor or cpu_family,
# still imports)
AUTO = (AUTO_WIDE if full_width_512(getattr(_baseline, "cpu_vendor", lambda: "")(),
                                    getattr(_baseline, "cpu_family", lambda: 0)())
        else AUTO_OTHER)
# what a variant needs of the CPU, for the error of a forced variant it cannot run
NEEDS = {
    "avx2": "AVX2, FMA, F16C and BMI2",
    "avx512": "AVX-512 F, BW, DQ and VL (with the OS saving the opmask and ZMM registers) "
              "besides AVX2, FMA, F16C and BMI2",
}


def _load() -> _ModuleType:
    forced = _os.environ.get("FASTPE_ISA", "").strip().lower()
    if forced and forced not in VARIANTS:
        raise ImportError(f"FASTPE_ISA={forced!r}: expected one of {', '.join(VARIANTS)}")
    for isa in (forced,) if forced else AUTO:
        if not _baseline.cpu_supports(isa):
            if forced:
                raise ImportError(f"FASTPE_ISA={forced!r}: this CPU cannot run that variant "
                                  f"(it needs {NEEDS[isa]})")
            continue
        try:
            module = _importlib.import_module(f"{__name__}.kernels_{isa}")
            # chosen for its 512-bit half-precision loops, which a compiler without the
            # FMA and F16C macros (MSVC) leaves out: there the next variant
            if isa == "avx512" and not forced and not getattr(module, "HALF_RUNS_512", False):
                continue
            return module
        except ModuleNotFoundError as exc:
            if forced and exc.name == f"{__name__}.kernels_{isa}":
                raise ImportError(f"FASTPE_ISA={forced!r}: this fastpe was built without "
                                  f"kernels_{isa} (FASTPE_ISA_VARIANTS at build time)") from exc
            if forced:
                raise
        except ImportError:
            if forced:
                raise
    return _baseline


kernels = _load()
