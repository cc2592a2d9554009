"""The one place that decides which backend runs the loops.

"cython" is the compiled extension (``fastpe._kernels``), used whenever it
imports; "numpy" is ``fastpe.reference``. ``FASTPE_BACKEND=numpy|cython`` sets
the process default; ``use_backend`` overrides it for a block of code (per
thread and per asyncio task: it is a context variable).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any, TypeVar

BACKENDS = ("cython", "numpy")

BUILD_HINT = (
    "build it with `pip install .` (or `pip install -e .`) from a source checkout, "
    "which needs a C compiler; or set FASTPE_BACKEND=numpy to use the pure-NumPy backend"
)

compiled: ModuleType | None
import_error: ImportError | None
try:
    from ._kernels import kernels as compiled
except ImportError as exc:  # not built, or a variant that cannot load
    if os.environ.get("FASTPE_ISA", "").strip():
        raise  # an explicit variant request is never silently replaced by NumPy
    compiled = None
    import_error = exc
else:
    import_error = None


def _initial_backend() -> str:
    requested = os.environ.get("FASTPE_BACKEND", "").strip().lower()
    if requested and requested not in BACKENDS:
        raise ImportError(f"FASTPE_BACKEND={requested!r}: expected 'cython' or 'numpy'")
    if requested == "cython" and compiled is None:
        raise ImportError(
            f"FASTPE_BACKEND=cython but the compiled kernels did not import ({import_error}); "
            + BUILD_HINT
        )
    if requested:
        return requested
    return "cython" if compiled is not None else "numpy"


# The compiled kernel module while the cython backend is active, else None: the
# variable holds the module itself, so that finding it costs every call one C method
# call (kernels below) rather than a Python function's frame and a comparison.
_current: contextvars.ContextVar[ModuleType | None] = contextvars.ContextVar(
    "fastpe_backend",
    default=compiled if _initial_backend() == "cython" else None,
)

kernels: Callable[[], ModuleType | None] = _current.get
"""The compiled kernel module when the cython backend is active, else None."""


def backend() -> str:
    """The backend that runs the loops here and now: "cython" or "numpy"."""
    return "numpy" if _current.get() is None else "cython"


def use_backend(name: str) -> contextlib.AbstractContextManager[None]:
    """Run the enclosed block on backend `name` ("cython" or "numpy"): a context
    manager, whose name is checked when it is made.

    >>> with fastpe.use_backend("numpy"):
    ...     fastpe.apply_rope(q, k)        # the pure-NumPy loops
    """
    if name not in BACKENDS:
        raise ValueError(f"name must be 'cython' or 'numpy', got {name!r}")
    if name == "cython" and compiled is None:
        raise ImportError(f"the compiled kernels did not import ({import_error}); " + BUILD_HINT)
    return _using(compiled if name == "cython" else None)


@contextlib.contextmanager
def _using(kernels: Any) -> Iterator[None]:
    token = _current.set(kernels)
    try:
        yield
    finally:
        _current.reset(token)


_F = TypeVar("_F", bound=Callable[..., Any])


def numpy_only(fn: _F) -> _F:
    """Run fn with the NumPy backend active: fastpe.reference's functions, which share
    the validating layer with the compiled backend, so never reach compiled code."""
    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        token = _current.set(None)
        try:
            return fn(*args, **kwargs)
        finally:
            _current.reset(token)
    return run  # type: ignore[return-value]
