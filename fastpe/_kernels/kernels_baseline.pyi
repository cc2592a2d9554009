"""Type stub of the compiled kernels (fastpe/_kernels/kernels.pyx and its .pxi files).

The same Cython source is built once per instruction-set level, so every variant
(kernels_baseline, kernels_avx2, kernels_avx512) has this interface; kernels_avx2.pyi and
kernels_avx512.pyi re-export it.
tests/test_typing.py checks it against each built module with mypy.stubtest.

Storage codes (`code`, `cache_code`): 0 float32, 1 float64, 2 float16, 3 bfloat16.
One front door per operation (rope_call, alibi_call, learned_call, sinusoidal_call,
t5_call) takes the caller's objects, checks them in C and returns False (0), having
written nothing, for anything but the case it documents; fastpe's Python layer then
validates the call in full and calls the same entry again with the normalised
arguments. None of them raises on data or calls back into fastpe's Python. rope_call
and t5_call also take plain torch CPU tensors, alone or beside arrays (q and k tensors
with the layout given), read through DLPack's C exchange API without an ndarray, and
bump the version counters of those they wrote; they return the bytes a call touches
(past a serial size) for the caller to choose a team. stream, stream_reads and
half_round_trip serve the bench's floor.
"""

from typing import Any, Final, final

import numpy as np
from numpy.typing import NDArray

ISA: Final[str]
"""The variant: "baseline", "avx2" or "avx512"."""
COMPILE_FLAGS: Final[str]
"""The compiler flags this variant was built with."""
OPENMP: Final[bool]
"""Whether this build has OpenMP threads."""
HALF_CONVERSION: Final[str]
"""float16 conversion: "hardware" (F16C / NEON) or "software"."""
HALF_RUNS_512: Final[bool]
"""Whether the 512-bit float16/bfloat16 loops are built in (the avx512 variant, with GCC
or clang)."""
STREAM_STORES: Final[bool]
"""Whether stream(nontemporal=True) has streaming (non-temporal) stores here."""

def cpu_supports(isa: str) -> bool: ...
def cpu_vendor() -> str: ...
def cpu_family() -> int: ...
def rope_cached_bytes(limit: int | None = None) -> int: ...
def rotate_half_lines(on: bool | None = None) -> bool: ...
def bf16_hardware_narrowing(on: bool | None = None) -> bool: ...
def row_prefetch(on: bool | None = None) -> bool: ...
def sinusoidal_staging(
    chunk_bytes: int | None = None, late_rows: int | None = None, early_rows: int | None = None
) -> tuple[int, int, int]: ...
def openmp_max_threads() -> int: ...
def int64_range(a: NDArray[np.int64]) -> tuple[int, int]: ...
def repeated_halves(a: NDArray[Any], neox: bool) -> bool: ...
def dynamic_ntk_frequencies(
    plain: object, factor: float, original: int, length: int, out: NDArray[np.float64]
) -> bool: ...
@final
class RopeState:
    """One RoPE configuration as rope_call reads it (see rope.pxi)."""

    @property
    def head_dim(self) -> int: ...
    @property
    def flip(self) -> bool: ...
    @property
    def inv_freq(self) -> object: ...
    @property
    def att(self) -> float: ...
    @property
    def switch(self) -> int: ...
    @property
    def past(self) -> object: ...
    @property
    def pair_axis(self) -> object: ...
    @property
    def pair_axis2(self) -> object: ...
    @property
    def axes(self) -> int: ...
    def __init__(
        self,
        head_dim: int,
        flip: bool,
        inv_freq: object,
        att: float,
        switch: int = -1,
        past: object = None,
        pair_axis: object = None,
        pair_axis2: object = None,
        axes: int = 1,
    ) -> None: ...

@final
class RopeStates:
    """RopeStates by the arguments that define them, compared by value."""

    def __init__(self, plain: frozenset[type]) -> None: ...
    def get(
        self,
        q: object,
        rotary_dim: object,
        base: object,
        scaling: object,
        max_position_embeddings: object,
    ) -> RopeState | None: ...
    def keep(
        self,
        head_dim: int,
        rotary_dim: object,
        base: object,
        scaling: object,
        max_position_embeddings: object,
        state: RopeState,
    ) -> None: ...

def rope_call(
    state: RopeState | None,
    q: object,
    k: object,
    positions: object,
    offset: object,
    style: object,
    layout: object,
    inverse: object,
    num_threads: object,
    cos: object,
    sin: object,
    serial_bytes: int,
    threads: int,
    token: bool = ...,
) -> int: ...
def torch_views(args: tuple[tuple[object, str, bool], ...]) -> list[Any] | None: ...
def torch_bump(written: tuple[Any, ...]) -> None: ...
def register_bfloat16(typenum: int) -> None: ...
def stream(
    arrays: tuple[NDArray[Any], ...],
    fill: bool,
    word: int,
    num_threads: int,
    nontemporal: bool = ...,
    ahead: bool = ...,
) -> None: ...
def stream_reads(
    target: NDArray[Any],
    reads: tuple[NDArray[Any], ...],
    num_threads: int,
    fused: bool = ...,
    mask: int = ...,
    ahead: bool = ...,
) -> int: ...
def half_round_trip(arrays: tuple[NDArray[Any], ...]) -> None: ...
def sinusoidal_call(
    x: object,
    inv_freq: object,
    positions: object,
    offset: object,
    scale: float,
    split: bool,
    cos_first: bool,
    accumulate: bool,
    num_threads: int,
) -> bool: ...
def learned_call(
    x: object, table: object, positions: object, offset: object, num_threads: int
) -> bool: ...
def alibi_call(
    scores: object,
    slopes: object,
    q_positions: object,
    q_offset: object,
    k_positions: object,
    key_mask: object,
    causal: object,
    symmetric: object,
    accumulate: object,
    num_threads: int,
) -> bool: ...
def t5_call(
    scores: object,
    table: object,
    bidirectional: object,
    max_distance: object,
    q_offset: object,
    causal: object,
    key_mask: object,
    num_threads: object,
    specs: dict[tuple[int, int, bool], Any],
    num_buckets: int,
    serial_bytes: int,
    threads: int,
    accumulate: bool,
) -> int: ...
def deberta_disentangled(
    scores: NDArray[Any],
    code: int,
    c2p: NDArray[Any] | None,
    p2c: NDArray[Any] | None,
    c2p_index: NDArray[np.int32],
    p2c_index: NDArray[np.int32],
    reach: int,
    linear: int,
    span: int,
    num_threads: int,
) -> None: ...

@final
class Scratch:
    """Per-thread work space of the kernels (internal)."""

    def __new__(cls, per_thread_bytes: int, nthreads: int, shared_bytes: int = 0) -> Scratch: ...
