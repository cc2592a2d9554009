"""Type aliases of the public API."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, TypeVar

import numpy as np
from numpy.typing import ArrayLike, DTypeLike

# In-place functions return the very object they were given (an ndarray, or
# a torch tensor or other DLPack/buffer-protocol array viewed in place).
InPlace = TypeVar("InPlace")

PositionsLike = ArrayLike | None
ScalingDict = Mapping[str, Any]
Style = Literal["neox", "gptj"]
RopeLayout = Literal["bshd", "bhsd", "shd"]
SinusoidalLayout = Literal["interleaved", "split", "split_cos"]
SinusoidalFrequencies = Literal["transformer", "fairseq"]

__all__ = ["ArrayLike", "DTypeLike", "InPlace", "PositionsLike",
           "RopeLayout", "ScalingDict", "SinusoidalFrequencies", "SinusoidalLayout", "Style",
           "np"]
