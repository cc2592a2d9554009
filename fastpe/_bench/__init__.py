"""The canonical workloads of ``python -m fastpe bench`` and of ``bench/``.

Every workload is one call of a fastpe function on model-sized arrays, with
implementations of the same call side by side:

- ``fastpe``: the fastpe function (the compiled kernels unless the NumPy
  backend was asked for);
- ``reference``: ``fastpe.reference``, the pure-NumPy oracle every other
  result is checked against;
- ``numpy``: the best NumPy a skilled user would write for the same result
  (``baselines``);
- peers: other libraries' implementations, where installed (``peers``: numba,
  ONNX Runtime, torch eager, ``torch.compile``, jax, and fastpe itself on torch
  tensors);
- ``floor``: the fastest way to move the same bytes, round by round: in-place
  streaming passes, or a fill with streaming stores for workloads that write a
  table: the machine's memory bandwidth for those bytes, so ``floor / fastpe``
  is the fraction of it fastpe reaches (``floors``). A whole program (the NumPy
  Llama decode step, ``program``) has none.

A workload builds its input arrays once (``make``); an implementation is
*prepared* for those arrays and a thread count (temporaries, cached tables,
frequencies, compilation: all untimed) and returns a *runner*
``run(arrays) -> results``, the timed call. Runners write in place, so bench/
hands them a fresh copy of the ``inplace`` arrays each round; ``python -m
fastpe bench`` lets them work on the same arrays round after round (every
workload keeps its values finite and bounded that way), as the floor does.

The modules: ``common`` (sizes, data, the Workload record, comparing results),
``workloads`` (one function per workload), ``baselines`` (NumPy), ``program``
(the NumPy Llama), ``peers``,
``floors``, ``timing`` (the interleaved timing of the command line). ``FULL``
are the canonical shapes, ``TINY`` the same workloads in a few kilobytes, for
the tests.
"""

from . import floors, peers
from .baselines import NumpyRope, chunked_add
from .common import (
    DTYPES,
    FULL,
    LLAMA3_BASE,
    LLAMA3_SCALING,
    SIZES,
    TINY,
    TOLERANCE,
    Arrays,
    Prepare,
    Runner,
    Workload,
    compare,
    copy_arrays,
    random_array,
)
from .floors import prepare_floor
from .peers import PEERS
from .peers import attach as attach_peers
from .timing import MODES, NOISE_FRACTION, Timing, measure, run_workload
from .workloads import (
    alibi_workloads,
    deberta_workload,
    rope_workloads,
    select,
    t5_decode_workload,
    workloads,
)

__all__ = [
    "DTYPES",
    "FULL",
    "LLAMA3_BASE",
    "LLAMA3_SCALING",
    "MODES",
    "NOISE_FRACTION",
    "PEERS",
    "SIZES",
    "TINY",
    "TOLERANCE",
    "Arrays",
    "NumpyRope",
    "Prepare",
    "Runner",
    "Timing",
    "Workload",
    "alibi_workloads",
    "attach_peers",
    "chunked_add",
    "compare",
    "copy_arrays",
    "deberta_workload",
    "floors",
    "measure",
    "peers",
    "prepare_floor",
    "random_array",
    "rope_workloads",
    "run_workload",
    "select",
    "t5_decode_workload",
    "workloads",
]
