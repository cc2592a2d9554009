"""Type stub of the AVX-512 build of the compiled kernels: the same interface as
kernels_baseline (one Cython source, built once per instruction-set level)."""

from .kernels_baseline import *  # noqa: F403
