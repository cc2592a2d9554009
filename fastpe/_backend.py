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
import warnings
from collections.abc import Callable
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


def use_backend(name: str) -> _Using:
    """Run the enclosed block on backend `name` ("cython" or "numpy"): a context
    manager (reusable, reentrant, one object usable by several threads at once) or a
    function decorator, whose name is checked when it is made. Made and never entered
    it changes nothing, and says so (a RuntimeWarning): FASTPE_BACKEND sets the
    process's default.

    For example::

        with fastpe.use_backend("numpy"):
            fastpe.apply_rope(q, k)        # the pure-NumPy loops
    """
    if name not in BACKENDS:
        raise ValueError(f"name must be 'cython' or 'numpy', got {name!r}")
    if name == "cython" and compiled is None:
        raise ImportError(f"the compiled kernels did not import ({import_error}); " + BUILD_HINT)
    return _Using(name)


_F = TypeVar("_F", bound=Callable[..., Any])


# What each use_backend block found on entry, innermost last, per thread and task (a
# context variable: blocks nest within a context, whichever objects they are, so its
# exits restore in that order whatever other threads enter and leave meanwhile)
_entered: contextvars.ContextVar[tuple[ModuleType | None, ...]] = contextvars.ContextVar(
    "fastpe_backend_entered", default=())


class _Using(contextlib.ContextDecorator):
    """use_backend's block: each entry sets the context variable, its exit restores what
    that entry found, so one object can be entered again (nested, later, or by several
    threads at once)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._kernels = compiled if name == "cython" else None
        self._used = False

    def __call__(self, func: _F) -> _F:
        self._used = True
        return super().__call__(func)

    def __enter__(self) -> None:
        self._used = True
        _entered.set(_entered.get() + (_current.get(),))
        _current.set(self._kernels)

    def __exit__(self, *exc: object) -> None:
        found = _entered.get()
        if not found:
            # the context variables are the entering context's: a generator's block
            # resumed and left on another thread leaves that thread with nothing to restore
            raise RuntimeError(
                f"fastpe.use_backend({self._name!r}): the block is left in another thread "
                f"(or context) than the one that entered it, as a generator's block resumed "
                f"on another thread is; the thread that entered it keeps the backend set")
        _current.set(found[-1])
        _entered.set(found[:-1])

    def __del__(self) -> None:
        if not self._used:
            # a statement `fastpe.use_backend("numpy")` reads as a switch and is not one
            warnings.warn(
                f"fastpe.use_backend({self._name!r}) was made and never entered, so it "
                f"changed nothing: it applies inside `with fastpe.use_backend("
                f"{self._name!r}):` or to a function it decorates (FASTPE_BACKEND="
                f"{self._name} sets the process's default)", RuntimeWarning, stacklevel=2)


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
