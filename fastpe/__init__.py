"""fastpe: fast, exact transformer positional encodings for NumPy.

Sinusoidal tables, learned position tables, RoPE (with linear, dynamic NTK,
YaRN, LongRoPE and Llama 3 scaling), ALiBi, and the relative biases of T5 and
DeBERTa, computed in place on NumPy arrays (and torch CPU tensors) by compiled
OpenMP kernels, with a pure-NumPy twin of every function that runs a kernel in
``fastpe.reference``.
"""

from typing import TYPE_CHECKING

from . import (
    _dynamo,  # noqa: F401  (fastpe opaque to torch.compile's tracer)
    _fork,  # noqa: F401  (before the kernels load: it reads the process as it was)
    reference,
)
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
from .relative import (
    DisentangledBias,
    RelativeBias,
    add_disentangled_bias,
    add_relative_bias,
    deberta_relative_positions,
    relative_bias,
    relative_position_bucket,
)
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
    "DisentangledBias",
    "RelativeBias",
    "RopeFrequencies",
    "RotaryEmbedding",
    "__version__",
    "add_alibi",
    "add_disentangled_bias",
    "add_learned",
    "add_relative_bias",
    "add_sinusoidal",
    "alibi_bias",
    "alibi_slopes",
    "apply_rope",
    "apply_rope_cached",
    "backend",
    "deberta_relative_positions",
    "dinov3_positions",
    "efficientloftr_positions",
    "get_num_threads",
    "info",
    "mrope_positions",
    "reference",
    "relative_bias",
    "relative_position_bucket",
    "rope_cos_sin",
    "rope_frequencies",
    "sam2_memory_positions",
    "sam3_vit_positions",
    "set_num_threads",
    "sinusoidal_table",
    "use_backend",
    "vision_positions",
]


if TYPE_CHECKING:
    from . import hf as hf


def __getattr__(name: str) -> object:
    # fastpe.hf on first use: it imports torch, which `import fastpe` must not
    if name == "hf":
        import importlib

        return importlib.import_module(".hf", __name__)
    raise AttributeError(f"module 'fastpe' has no attribute {name!r}")
