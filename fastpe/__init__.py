"""fastpe: fast, exact transformer positional encodings for NumPy.

Sinusoidal tables, learned position tables, RoPE (with linear, dynamic NTK,
YaRN, LongRoPE and Llama 3 scaling) and ALiBi, computed in place on NumPy
arrays by compiled OpenMP kernels, with a pure-NumPy twin of every function in
``fastpe.reference``.
"""

from . import reference
from ._backend import backend, use_backend
from ._coordinates import (
    dinov3_positions,
    efficientloftr_positions,
    sam2_memory_positions,
    sam3_vit_positions,
)
from ._grids import mrope_positions, vision_positions
from ._info import info
from ._threads import get_num_threads, set_num_threads
from ._version import __version__
from .alibi import add_alibi, alibi_bias, alibi_slopes
from .learned import add_learned
from .rope import (
    RopeFrequencies,
    RotaryEmbedding,
    apply_rope,
    apply_rope_cached,
    rope_cos_sin,
    rope_frequencies,
)
from .sinusoidal import add_sinusoidal, sinusoidal_table

__all__ = [
    "RopeFrequencies",
    "RotaryEmbedding",
    "__version__",
    "add_alibi",
    "add_learned",
    "add_sinusoidal",
    "alibi_bias",
    "alibi_slopes",
    "apply_rope",
    "apply_rope_cached",
    "backend",
    "dinov3_positions",
    "efficientloftr_positions",
    "get_num_threads",
    "info",
    "mrope_positions",
    "reference",
    "rope_cos_sin",
    "rope_frequencies",
    "sam2_memory_positions",
    "sam3_vit_positions",
    "set_num_threads",
    "sinusoidal_table",
    "use_backend",
    "vision_positions",
]
