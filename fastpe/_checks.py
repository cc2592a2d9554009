"""Argument validation and normalisation shared by both backends.

Everything here runs before anything is written, so a rejected call leaves
the caller's arrays exactly as they were. Messages name the argument and what
was expected. Errors follow one rule: TypeError for a wrong type or dtype or a
read-only buffer, ValueError for shapes and values, IndexError for a position
outside a table.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import numbers
import operator
import sys
from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

import numpy as np

from . import _backend, _constants

try:  # NumPy >= 2.0 (before: the top-level names)
    from numpy.lib.array_utils import byte_bounds as _byte_bounds
except ImportError:  # pragma: no cover - NumPy 1.x
    _byte_bounds = np.byte_bounds  # type: ignore[attr-defined]  # noqa: NPY201
_TooHardError = getattr(np, "exceptions", np).TooHardError

# bfloat16 is an optional dtype (ml_dtypes'), taken once ml_dtypes is imported: its
# import takes most of a second, more than the rest of fastpe's, so fastpe imports it
# itself only for what needs it (a bfloat16 torch tensor, the dtype named "bfloat16");
# an array of ml_dtypes' bfloat16 exists only once its caller has imported it.
HAS_ML_DTYPES = importlib.util.find_spec("ml_dtypes") is not None
_ml_dtypes: Any = None

# Storage codes the compiled kernels switch on (defined in fastpe._constants).
F32, F64, F16, BF16 = (_constants.STORAGE_CODES[n]
                       for n in ("float32", "float64", "float16", "bfloat16"))
DTYPE_CODES: dict[np.dtype, int] = {
    np.dtype(np.float32): F32,
    np.dtype(np.float64): F64,
    np.dtype(np.float16): F16,
}
SUPPORTED_DTYPES = "float32, float64, float16" + (", bfloat16" if HAS_ML_DTYPES else "")


def ml_dtypes(load: bool) -> Any:
    """ml_dtypes with its bfloat16 registered as a storage dtype (for the compiled
    kernels too), once imported: by the caller, or here when `load`; None without it."""
    global _ml_dtypes
    if _ml_dtypes is None:
        module = sys.modules.get("ml_dtypes")
        if module is None and load and HAS_ML_DTYPES:
            import ml_dtypes as module
        if module is not None:
            bfloat16 = np.dtype(module.bfloat16)
            DTYPE_CODES[bfloat16] = BF16
            if _backend.compiled is not None:
                _backend.compiled.register_bfloat16(bfloat16.num)
            _ml_dtypes = module
    return _ml_dtypes

INT64_MAX = np.iinfo(np.int64).max

# Sinusoidal and rotary encodings form the angle position * frequency in float64, so
# it carries a rounding error of about position * frequency * 2**-53 radians: 5e-7
# at 2**32 (positions past every model's context). Larger positions are refused
# rather than given with errors that grow to whole radians (2**52 and up).
MAX_ANGLE_POSITION = _constants.MAX_ANGLE_POSITION


def compute_dtype(dtype: np.dtype) -> np.dtype:
    """Arithmetic dtype for a storage dtype: float64 for float64 (either byte
    order), else float32."""
    return np.dtype(np.float64) if dtype.itemsize == 8 else np.dtype(np.float32)


def same_storage(a: np.dtype, b: np.dtype) -> bool:
    """Whether two dtypes hold the same numbers, whatever their byte orders."""
    return a.newbyteorder("=") == b.newbyteorder("=")


def _storage_code(dtype: np.dtype) -> int | None:
    code = DTYPE_CODES.get(dtype)
    if code is None and not dtype.isnative:
        code = DTYPE_CODES.get(dtype.newbyteorder("="))
    return code


def real_dtype(dtype: np.dtype) -> bool:
    """Whether values of `dtype` are real numbers: integers, or floats (bfloat16 too)."""
    if dtype.kind in "fiu":
        return True
    if _ml_dtypes is None:
        ml_dtypes(load=False)  # the caller's bfloat16, registered now
    return _storage_code(dtype) is not None


def dtype_code(dtype: np.dtype, name: str) -> int:
    code = _storage_code(dtype)
    if code is None and _ml_dtypes is None and ml_dtypes(load=False) is not None:
        code = _storage_code(dtype)  # the caller's bfloat16, registered now
    if code is None:
        hint = "" if HAS_ML_DTYPES else " (bfloat16 needs the ml_dtypes package)"
        raise TypeError(f"{name} must have a floating dtype ({SUPPORTED_DTYPES}){hint}; "
                        f"got {dtype}")
    return code


def float_dtype(dtype: Any, name: str) -> np.dtype:
    """A supported storage dtype from anything np.dtype() takes; None is float32."""
    if dtype is None:
        return np.dtype(np.float32)
    try:
        dt: np.dtype = np.dtype(dtype)
    except TypeError:
        if not (isinstance(dtype, str) and dtype == "bfloat16"
                and ml_dtypes(load=True) is not None):
            raise TypeError(f"{name} must be a dtype ({SUPPORTED_DTYPES}), "
                            f"got {dtype!r}") from None
        dt = np.dtype(dtype)
    dtype_code(dt, name)
    return dt


def torch_tensors(*args: tuple[object, str, bool]) -> list[Any]:
    """The arguments (value, name, written), each torch tensor among them as its
    NumPy view, so that a call on a model's own tensors takes the path of NumPy
    arrays, converted once: by the compiled kernels where every tensor is a plain
    CPU tensor (through DLPack's C exchange API), else here (tensor_view). The
    caller bumps the written tensors' version counters once the call has written them
    (bump_written), as torch's own in-place operations do: a call refused before
    writing leaves them as they were."""
    kern = _backend.kernels()
    views: list[Any] | None = kern.torch_views(args) if kern is not None else None
    if views is not None:
        return views
    tensor = _torch()[0].Tensor
    dual = forward_ad_on()
    out: list[Any] = []
    trace_checked = False
    for x, name, w in args:
        if not isinstance(x, tensor):
            out.append(x)
            continue
        if not trace_checked:   # once, at the first tensor
            refuse_traced(name)
            trace_checked = True
        if dual:
            refuse_functorch(x, name)   # torch.func.jvp's tensors are duals too
            refuse_dual(x, name)
        if not (w and x.is_inference()):
            try:
                # the common case, in one call (bfloat16, a grad or a device raise here)
                out.append(own_memory(x, x.numpy(), name))
                continue
            except (RuntimeError, TypeError):
                pass
        out.append(tensor_view(x, name, writable=w))
    return out


def bump_written(*written: object) -> None:
    """Bump the version counters of the torch tensors among what a call has written
    (the others: None, a RoPE call without k, or ndarrays beside a tensor), together,
    once: what torch's in-place operations do after writing. One call into torch: a
    decode step takes a few microseconds."""
    if len(written) == 1:  # one tensor (an add's x, a bias's scores): no generator
        if type(written[0]) is not np.ndarray and is_tensor(written[0]):
            (_TORCH or _torch())[2](written)
        return
    tensors = tuple(x for x in written if type(x) is not np.ndarray and is_tensor(x))
    if tensors:
        (_TORCH or _torch())[2](tensors)


def torch_rope(q: Any, k: Any, positions: Any) -> list[Any]:
    """torch_tensors((q, "q", True), (k, "k", True), (positions, "positions", False)),
    in fewer steps for the common case: q and k (or None) float32/16/64 tensors outside
    inference, positions None or a tensor (a decode step of a transformers model)."""
    try:
        if forward_ad_on() or torch_trace() is not None:
            raise TypeError  # each tensor checked (for a tangent, a trace) on the way below
        if k is None:
            if q.is_inference():
                raise TypeError
            qv, kv = own_memory(q, q.numpy(), "q"), None
        else:
            if q.is_inference() or k.is_inference():
                raise TypeError
            qv, kv = own_memory(q, q.numpy(), "q"), own_memory(k, k.numpy(), "k")
        pv = positions if positions is None or type(positions) is np.ndarray else (
            own_memory(positions, positions.numpy(), "positions"))
    except (AttributeError, RuntimeError, TypeError):
        pass  # the general path names what is wrong, outside this handler
    else:
        return [qv, kv, pv]
    return torch_tensors((q, "q", True), (k, "k", True), (positions, "positions", False))


def own_memory(x: Any, view: np.ndarray, name: str) -> np.ndarray:
    """view, torch's NumPy conversion of the tensor x, when it is x's memory; a TypeError
    naming x where it is not: a functional tensor of torch.func.functionalize (a null
    data pointer) converts to a fresh array of other values, and a subclass's own
    ``numpy`` (or ``__torch_function__``) may answer with a copy: writes to either would
    be lost and values read from it wrong, without an error from torch."""
    if view.size and not x.data_ptr():
        raise TypeError(f"{name} is a torch tensor without memory of its own (a functional "
                        f"tensor of torch.func.functionalize, or another wrapper): its NumPy "
                        f"conversion is not its memory, so fastpe would read and write other "
                        f"values; call fastpe outside the transform")
    if view.size and type(x) is not _torch()[0].Tensor:
        _subclass_memory(x, view, name)
    return view


def _subclass_memory(x: Any, view: np.ndarray, name: str) -> None:
    """Refuse the NumPy conversion of a tensor subclass that is not a view of the
    tensor's own elements, read as torch.Tensor reads them (the subclass's overrides
    off). A subclass that overrides none of what the conversion calls (nn.Parameter,
    whose __torch_function__ is off) converts as torch.Tensor does."""
    torch = _torch()[0]
    cls = type(x)
    function = getattr(cls.__torch_function__, "__func__", cls.__torch_function__)
    if (function in (torch.Tensor.__torch_function__.__func__,
                     torch._C._disabled_torch_function_impl)
            and cls.numpy is torch.Tensor.numpy and cls.view is torch.Tensor.view
            and cls.data_ptr is torch.Tensor.data_ptr):
        return
    with torch._C.DisableTorchFunctionSubclass():
        ptr, shape, strides = x.data_ptr(), tuple(x.shape), x.stride()
        itemsize = x.element_size()
    if (view.__array_interface__["data"][0] != ptr or view.shape != shape
            or view.strides != tuple(s * itemsize for s in strides)):
        raise TypeError(f"{name} is a torch tensor subclass ({type(x).__name__}) whose NumPy "
                        f"conversion is not its memory, so fastpe would read and write other "
                        f"values; pass {name}.as_subclass(torch.Tensor)")


_Layout = TypeVar("_Layout")


def tensor_layout(layout: _Layout | None, name: str = "q") -> _Layout:
    """The layout of a RoPE call on torch tensors, which must be given: a model's q
    and k are (batch, heads, seq, head_dim) in transformers but (batch, seq, heads,
    head_dim) in others, and a misread layout rotates by the wrong positions without
    an error whenever q and k have the same head count."""
    if layout is None:
        raise ValueError(f"{name} is a torch tensor: pass layout= ('bhsd' for transformers' "
                         "(batch, heads, seq, head_dim) q and k, 'bshd' for (batch, seq, "
                         "heads, head_dim), 'shd' for (tokens, heads, head_dim)); fastpe "
                         "does not guess a model tensor's layout")
    return layout


_TORCH: tuple[Any, ...] | None = None


def _torch() -> tuple[Any, ...]:
    """(torch, torch.bfloat16, the version-counter bump of a tuple of tensors, whether
    inference mode is on), looked up once: the torch of a process that made a tensor."""
    global _TORCH
    if _TORCH is None:
        torch = sys.modules["torch"]
        # torch._C._increment_version takes a tuple (a bare tensor it iterates, slowly);
        # torch.autograd.graph.increment_version wraps it since torch 2.1
        _TORCH = (torch, torch.bfloat16, torch._C._increment_version,
                  torch.is_inference_mode_enabled)
    return _TORCH


def is_tensor(x: object) -> bool:
    """Whether x is a torch tensor (without importing torch: a process that made
    one has imported it)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def is_plain_tensor(x: object) -> bool:
    """Whether x is a torch.Tensor, not a subclass (whose attributes may answer
    otherwise)."""
    torch = sys.modules.get("torch")
    return torch is not None and type(x) is torch.Tensor


def forward_ad_on() -> bool:
    """Whether a level of torch's forward-mode AD is open (torch.autograd.forward_ad.
    dual_level): only then can a tensor carry a tangent."""
    fwad = sys.modules.get("torch.autograd.forward_ad")
    return fwad is not None and fwad._current_level >= 0


def functorch_off() -> contextlib.AbstractContextManager[Any]:
    """Where a torch.func transform is running, a context without it (torch's own
    _DisableFuncTorch); else a no-op one."""
    functorch = getattr(sys.modules["torch"]._C, "_functorch", None)
    peek = getattr(functorch, "peek_interpreter_stack", None)
    disable = getattr(sys.modules["torch"]._C, "_DisableFuncTorch", None)
    if peek is None or disable is None or peek() is None:
        return contextlib.nullcontext()
    return disable()  # type: ignore[no-any-return]


def refuse_functorch(x: Any, name: str) -> None:
    """Refuse a tensor of a torch.func transform: a batched one (vmap) has no memory of
    its own, and a transform would see neither fastpe's writes nor what they depend on
    (grad, jvp: their tangents)."""
    functorch = getattr(sys.modules["torch"]._C, "_functorch", None)
    wrapped = getattr(functorch, "is_functorch_wrapped_tensor", None)
    functional = getattr(functorch, "is_functionaltensor", None)
    # functionalize's tensors are named as such by own_memory
    if wrapped is not None and wrapped(x) and not (functional is not None and functional(x)):
        raise TypeError(f"{name} is a tensor of a torch.func transform (vmap, grad, jvp, "
                        f"jacrev, ...): fastpe works on a tensor's memory, which the "
                        f"transform neither exposes nor follows; call fastpe outside it (a "
                        f"model patched by fastpe.hf runs stock after fastpe.hf.unpatch(model))")


def refuse_dual(x: Any, name: str) -> None:
    """Refuse a dual tensor of forward-mode AD: fastpe computes its values, not their
    tangent, and torch's own operations would carry it."""
    if sys.modules["torch.autograd.forward_ad"].unpack_dual(x).tangent is not None:
        raise TypeError(f"{name} is a dual tensor of torch's forward-mode AD: fastpe's "
                        f"result would not carry its tangent; pass its primal "
                        f"(torch.autograd.forward_ad.unpack_dual({name}).primal) and apply "
                        f"the same operation to the tangent")


def torch_trace() -> str | None:
    """The trace recording torch's operations now, if any: torch.jit.trace (and the
    ONNX exporter built on it) records them and not fastpe's C call on a tensor's memory,
    so its graph would run without it; torch.export's and make_fx's graphs would not
    hold fastpe's writes either."""
    torch = sys.modules["torch"]
    if torch._C._is_tracing():
        return "torch.jit.trace (or an exporter built on it)"
    # looked up: torch before 2.3 has no torch.compiler.is_compiling
    proxy = getattr(getattr(torch._C, "_TorchDispatchModeKey", None), "PROXY", None)
    compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    if ((proxy is not None and torch._C._get_dispatch_mode(proxy) is not None)
            or (compiling is not None and compiling())):
        return "torch.export or make_fx"
    return None


def refuse_traced(name: str) -> None:
    """A RuntimeError naming the torch tensor `name` inside a trace (torch_trace)."""
    how = torch_trace()
    if how is not None:
        raise RuntimeError(f"{name} is a torch tensor inside {how}: a trace records torch's "
                           f"operations, not fastpe's C call on the tensor's memory, so its "
                           f"graph would run without it; call fastpe outside the trace")


def tensor_name(q: object, k: object) -> str | None:
    """"q" or "k", whichever is a torch tensor first, or None: the argument a RoPE
    call's messages name when it is a call on torch tensors."""
    if type(q) is not np.ndarray and is_tensor(q):
        return "q"
    if type(k) is not np.ndarray and is_tensor(k):
        return "k"
    return None


def _torch_usable(x: Any, name: str) -> None:
    """Refuse a tensor whose memory does not hold its values as NumPy would
    read them, or whose gradient a NumPy result would lose."""
    if x.requires_grad:
        raise TypeError(f"{name} is a torch tensor that requires grad: fastpe's result would "
                        f"not be part of the autograd graph; pass {name}.detach()")
    if x.device.type != "cpu":
        raise TypeError(f"{name} is a torch tensor on device {x.device.type!r}; fastpe works "
                        f"on CPU memory: pass {name}.cpu()")


def tensor_view(x: Any, name: str, *, writable: bool) -> np.ndarray:
    """The memory of the torch CPU tensor x as an ndarray view, never a copy.

    bfloat16 tensors, which NumPy cannot view, are viewed as ml_dtypes' bfloat16.
    A tensor to be written (writable) follows torch's own rule for in-place
    operations: an inference tensor only inside inference mode. The caller bumps
    a written tensor's version counter once it has written it, so that autograd
    refuses a backward pass that saved its old values. A tensor only read with
    its negative or conjugate bit set is read as its values (a copy)."""
    torch, bfloat16, _, inference_mode = _torch()
    refuse_traced(name)
    refuse_functorch(x, name)
    if forward_ad_on():
        refuse_dual(x, name)
    if x.requires_grad and inference_mode():
        # inference mode records no autograd, grad mode on or not: torch's in-place
        # operations take such a tensor there (its detached view shares memory and version)
        x = x.detach()
    try:
        # inside a torch.func transform numpy() refuses every tensor: a plain one (not the
        # transform's, refused above) is viewed as outside it, as the compiled entries do
        with functorch_off():
            if x.dtype is bfloat16:
                module = ml_dtypes(load=True)
                if module is None:
                    raise TypeError(f"{name} is a bfloat16 tensor, which needs the ml_dtypes "
                                    f"package (pip install 'fastpe[bfloat16]')")
                if x.requires_grad and torch.is_grad_enabled():
                    _torch_usable(x, name)  # x.numpy()'s refusal, which the int16 view escapes
                view: np.ndarray = x.view(torch.int16).numpy().view(module.bfloat16)
            else:
                view = x.numpy()
        own_memory(x, view, name)
    except (RuntimeError, TypeError) as exc:
        if str(exc).startswith(name):
            raise
        _torch_usable(x, name)
        if x.is_neg() or x.is_conj():
            if not writable:
                return tensor_view(x.resolve_conj().resolve_neg(), name, writable=False)
            raise TypeError(f"{name} is a torch view with its negative or conjugate bit set: "
                            f"its memory holds other values than it shows; writing it in "
                            f"place would store the wrong sign (pass a tensor without lazy "
                            f"negation, e.g. {name}.resolve_neg() kept as a new tensor)"
                            ) from None
        raise TypeError(f"{name} ({x.dtype}) cannot be viewed as a NumPy array: {exc}"
                        ) from None
    if writable and x.is_inference() and not inference_mode():
        raise TypeError(f"{name} is an inference tensor, which torch writes in place only "
                        f"inside torch.inference_mode(); call fastpe there, or pass "
                        f"{name}.clone()")
    return view


def plain_array(x: np.ndarray, name: str) -> np.ndarray:
    """An ndarray subclass as a plain ndarray of the same memory; refused when
    the subclass changes what the elements mean (a masked array's mask, a
    matrix's 2-D-only algebra), which the loops would ignore."""
    if isinstance(x, (np.matrix, np.ma.MaskedArray)):
        raise TypeError(f"{name} must be a plain numpy.ndarray, not {type(x).__name__}: "
                        f"fastpe would ignore what the subclass adds (pass np.asarray({name}) "
                        f"for its raw data)")
    return x.view(np.ndarray)


def in_place_view(x: object, name: str) -> np.ndarray:
    """A NumPy view of the memory of `x`, for writing in place: x itself, or a
    zero-copy view through DLPack (torch CPU tensors, JAX, CuPy refuse) or the
    buffer protocol. Never a copy: a copy would be written and thrown away.

    A torch tensor's version counter is not bumped here: the public function bumps
    it once the call has written (bump_written), as torch's in-place operations do,
    so that a refused call leaves it as it was."""
    if isinstance(x, np.ndarray):
        return x if type(x) is np.ndarray else plain_array(x, name)
    if isinstance(x, (np.generic, numbers.Number)):
        raise TypeError(f"{name} must be an array (it is written in place), got a "
                        f"{type(x).__name__} scalar")
    if is_tensor(x):
        view: np.ndarray = torch_tensors((x, name, True))[0]
        return view
    if hasattr(x, "__dlpack__"):
        try:
            return np.from_dlpack(x)
        except (BufferError, RuntimeError, TypeError, ValueError) as exc:
            raise TypeError(f"{name} ({type(x).__name__}) cannot be viewed in place through "
                            f"DLPack: {exc}") from None
    try:
        return np.asarray(memoryview(x))  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{name} must be a numpy.ndarray, or an array exposing DLPack or the "
                        f"buffer protocol (it is written in place), got {type(x).__name__}"
                        ) from None


def as_array(x: object, name: str) -> np.ndarray:
    """An input that is only read, as an ndarray (a view where one exists, else a
    copy). torch tensors are read as their values (negative and conjugate bits
    resolved); ragged nesting and unconvertible objects name the argument."""
    if type(x) is np.ndarray:
        return x
    if isinstance(x, np.ndarray):
        return plain_array(x, name)
    if is_tensor(x):
        return tensor_view(x, name, writable=False)
    try:
        return np.asarray(x)
    except ValueError as exc:
        raise ValueError(f"{name} must be a rectangular array (every row the same length): "
                         f"{exc}") from None
    except (TypeError, RuntimeError) as exc:
        raise TypeError(f"{name} cannot be read as an array: {exc}") from None


def array(x: object, name: str, ndims: Sequence[int], *, writable: bool) -> np.ndarray:
    """x as an ndarray of a supported float dtype with one of `ndims` dimensions.

    Outputs (writable=True) are viewed in place (in_place_view); inputs that
    are only read may be any array-like.
    """
    x = in_place_view(x, name) if writable else as_array(x, name)
    dtype_code(x.dtype, name)
    if x.ndim not in ndims:
        want = " or ".join(str(n) for n in ndims)
        raise ValueError(f"{name} must have {want} dimensions, got shape {x.shape}")
    if writable:
        writable_array(x, name)
    return x


def elements_disjoint(x: np.ndarray) -> bool:
    """Whether no two elements of x share memory, by the nesting rule: sorted by
    stride, each axis steps past everything the smaller axes span. Exact for the
    layouts slicing, transposing and reshaping make; an exotic layout that is
    disjoint without nesting is (conservatively) refused."""
    span = x.itemsize
    for stride, n in sorted((abs(s), n) for s, n in zip(x.strides, x.shape) if n > 1):
        if stride < span:
            return False
        span += stride * (n - 1)
    return True


def writable_array(x: np.ndarray, name: str) -> None:
    if not x.flags.writeable:
        raise TypeError(f"{name} is read-only; fastpe writes it in place")
    if x.size and not elements_disjoint(x):
        raise ValueError(f"{name} has overlapping elements, or strides whose elements "
                         f"fastpe cannot prove distinct (a broadcast's zero strides map several "
                         f"elements to the same memory; as_strided axes that do not nest, "
                         f"each stepping past the smaller ones, are not proven apart): "
                         f"in-place results would be ill-defined; pass a copy")


def lattice_apart(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether no element of a shares a byte with one of b, proven on a period:
    when the strides of both arrays at or above some threshold are multiples of
    R and the shorter strides of each span less than R, the bytes of each fall,
    modulo R, in one interval; disjoint intervals prove the arrays apart (q and
    k sliced from one fused QKV row). False when no threshold proves it, which
    does not mean they overlap. The compiled kernels' lattice_apart in NumPy."""
    if a.size == 0 or b.size == 0:
        return True
    axes = [[(abs(s), n) for s, n in zip(x.strides, x.shape) if n > 1] for x in (a, b)]
    lows = [_byte_bounds(x)[0] for x in (a, b)]
    for threshold in {s for side in axes for s, _ in side}:
        period = math.gcd(*(s for side in axes for s, _ in side if s >= threshold))
        spans = [x.itemsize + sum((n - 1) * s for s, n in side if s < threshold)
                 for x, side in zip((a, b), axes)]
        if period == 0 or spans[0] + spans[1] > period:
            continue
        d = (lows[1] - lows[0]) % period
        if d >= spans[0] and period - d >= spans[1]:
            return True
    return False


# candidate solutions np.shares_memory may try before a proof counts as too costly
# (about a millisecond); views that interleave past it are refused, not searched
SHARES_MEMORY_WORK = 100_000


def share_memory(a: np.ndarray, b: np.ndarray, a_name: str, b_name: str) -> bool:
    """Whether a and b share memory, decided exactly and in bounded time: a
    ValueError naming both when neither the byte ranges, the lattice proof nor a
    bounded search decides it."""
    if not np.may_share_memory(a, b) or lattice_apart(a, b):
        return False
    try:
        # NumPy's stubs allow only -1 and 0, its function any bound
        return bool(np.shares_memory(a, b, max_work=SHARES_MEMORY_WORK))  # type: ignore[arg-type]
    except _TooHardError:
        raise ValueError(f"{a_name} and {b_name} interleave in memory in a way fastpe cannot "
                         f"prove disjoint quickly; pass a copy of one of them") from None


def memory_of(a: object) -> np.ndarray | None:
    """A zero-copy ndarray view of the memory `a` exposes (ndarray, torch
    tensor, DLPack or buffer-protocol object), or None when it has none (a list,
    a scalar): the memory a kernel would read if validation keeps it a view."""
    if isinstance(a, np.ndarray):
        return a
    if a is None or isinstance(a, (list, tuple, int, float, str)):
        return None
    try:
        if is_tensor(a):
            return tensor_view(a.detach(), "", writable=False)  # type: ignore[attr-defined]
        if hasattr(a, "__dlpack__"):
            return np.from_dlpack(a)
        if hasattr(a, "__array_interface__") or hasattr(a, "__array__"):
            return np.asarray(a)  # a view of the memory it exposes, or a fresh array
        return np.asarray(memoryview(a))  # type: ignore[arg-type]
    except (BufferError, RuntimeError, TypeError, ValueError):
        return None


def disjoint(out: np.ndarray, out_name: str, *inputs: tuple[object, str]) -> None:
    """An array written in place must not share memory with one it reads: the
    kernels would read values they have already overwritten. `inputs` are the
    caller's arguments as given, seen through memory_of, so the rule does not depend
    on their layout or on whether a conversion happened to copy; and the arrays
    validation made of them where the kernel reads those: an object whose
    conversions differ (a lying __array__) may give other memory each time."""
    for a, name in inputs:
        m = memory_of(a)
        if m is not None and share_memory(out, m, out_name, name):
            raise ValueError(f"{name} overlaps {out_name} in memory: it is read while "
                             f"{out_name} is written; pass a copy")


def count(n: Any, name: str, *, minimum: int | None = 0, whole_float: bool = False) -> int:
    """n as a Python int (bools refused); at least `minimum` unless it is None.
    With `whole_float`, a float of integral value (4096.0, as a JSON config may
    hold it) is taken as that int."""
    if isinstance(n, (bool, np.bool_)):
        raise TypeError(f"{name} must be an int, got bool")
    if type(n) is not int and is_tensor(n):
        # torch's __index__ takes a bool tensor and any one-element tensor, which
        # NumPy's arrays refuse (np.array(True), np.array([3])): a 0-d integer one only
        if n.dtype is sys.modules["torch"].bool:
            raise TypeError(f"{name} must be an int, got a bool tensor")
        if n.ndim != 0:
            raise TypeError(f"{name} must be an int, got a tensor of shape {tuple(n.shape)}")
    try:
        value = operator.index(n)
    except TypeError:
        if not (whole_float and isinstance(n, (float, np.floating))):
            raise TypeError(f"{name} must be an int, got {type(n).__name__}") from None
        if not float(n).is_integer():
            raise ValueError(f"{name} must be a whole number, got {n!r}") from None
        value = int(n)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


# Python's and NumPy's own number types: their int() and float() are their values (a
# subclass's __index__ or __float__ may answer otherwise than the value a check read)
_PLAIN_INTS = frozenset({int, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
                         np.uint32, np.uint64, np.longlong, np.ulonglong})
_PLAIN_REALS = _PLAIN_INTS | {float, np.float16, np.float32, np.float64}


def plain_int(v: object) -> object:
    """v as a Python int where it is a NumPy integer scalar, else v as given: the
    compiled entries take Python ints, and send anything else down the validating path."""
    return int(v) if type(v) in _PLAIN_INTS else v  # type: ignore[call-overload]


def plain_real(v: object) -> float | None:
    """float(v) where v is a Python or NumPy number (not a bool, not a subclass), else
    None (an int too large for a float too): what the compiled entries take as a real
    setting, every other value going the validating path."""
    if type(v) not in _PLAIN_REALS:
        return None
    try:
        return float(v)  # type: ignore[arg-type]
    except OverflowError:
        return None


def real(v: object, name: str, *, positive: bool = False) -> float:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number, got {type(v).__name__}")
    try:
        value = float(v)
    except OverflowError:
        raise ValueError(f"{name} must be a finite number, got an int too large for a "
                         f"float ({v.bit_length()} bits)") from None  # type: ignore[union-attr]
    if not math.isfinite(value) or (positive and value <= 0):
        kind = "a finite number > 0" if positive else "a finite number"
        raise ValueError(f"{name} must be {kind}, got {v!r}")
    return value


def flag(value: object, name: str) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)) and value in (0, 1):
        return bool(value)
    raise TypeError(f"{name} must be a bool, got {value!r}")


def choice(value: object, name: str, options: Sequence[str]) -> str:
    if not isinstance(value, str) or value not in options:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, options))}, got {value!r}")
    return value


class Positions:
    """Normalised token positions: either `offset + t` (array None) or an
    int64 C-contiguous (rows, seq) array with rows 1 (shared) or batch."""

    __slots__ = ("array", "max", "offset", "source")

    def __init__(self, array: np.ndarray | None, offset: int, maximum: int,
                 source: np.ndarray | None = None):
        self.array = array
        self.offset = offset
        self.max = maximum  # largest position, -1 when there are none
        # the caller's positions as converted (array is the call's own copy of them):
        # what an overlap check with the output looks at
        self.source = source

    def as_array(self, seq: int) -> np.ndarray:
        """The positions as a (rows, seq) int64 array, whichever form they came in."""
        if self.array is not None:
            return self.array
        return (self.offset + np.arange(seq, dtype=np.int64))[None, :]


def repeated_halves(a: np.ndarray, neox: bool) -> bool:
    """Whether each row of a holds each frequency's value twice, bit for bit (one compiled
    pass; False on the NumPy backend, which never calls compiled code, and for arrays
    the pass does not walk: the caller then compares values)."""
    compiled = _backend.kernels()
    return compiled is not None and bool(compiled.repeated_halves(a, neox))


def int64_range(a: np.ndarray) -> tuple[int, int]:
    """(min, max) of a non-empty C-contiguous int64 array (one compiled pass, except
    on the NumPy backend, which never calls compiled code)."""
    compiled = _backend.kernels()
    if compiled is not None:
        lo_hi: tuple[int, int] = compiled.int64_range(a)
        return lo_hi
    return int(a.min()), int(a.max())


def refuse_past_int64(a: np.ndarray, name: str) -> None:
    """Refuse unsigned 64-bit integers (of either byte order) that int64 cannot hold,
    which a cast to it would wrap to negative values."""
    if a.dtype.kind == "u" and a.dtype.itemsize == 8 and a.size and int(a.max()) > INT64_MAX:
        raise ValueError(f"{name} must be < 2**63, got {int(a.max())}")


def position_array(positions: object, name: str,
                   converted: np.ndarray | None = None) -> tuple[np.ndarray, int]:
    """Integer positions of any shape as a C-contiguous int64 array, all >= 0,
    and the largest (-1 when empty). `converted` is as_array(positions) when
    the caller has it.

    The array is always the call's own copy: the kernels read it without the GIL,
    and a table or cache row looked up by a position that another thread (or an
    in-place write through an alias of the caller's array) rewrote after this
    check would be read past its end."""
    pos = as_array(positions, name) if converted is None else converted
    if pos.size == 0 and not isinstance(positions, np.ndarray):
        pos = pos.astype(np.int64)  # [] is float64 to NumPy, but holds no non-integer
    if pos.dtype.kind not in "iu":
        raise TypeError(f"{name} must be integers, got dtype {pos.dtype}")
    refuse_past_int64(pos, name)
    pos = np.array(pos, np.int64, order="C")  # a copy; keeps 0-d arrays 0-d
    if pos.size == 0:
        return pos, -1
    lo, hi = int64_range(pos)
    if lo < 0:
        raise ValueError(f"{name} must be >= 0, got {lo}")
    return pos, hi


def positions(positions: Any, offset: object, batch: int, seq: int,
              name: str = "positions", converted: np.ndarray | None = None) -> Positions:
    """Validate `positions` for a (batch, seq, ...) input, or `offset` when None;
    `converted` is as_array(positions) when the caller has it."""
    offset = count(offset, "offset")
    if positions is None:
        if offset + max(seq - 1, 0) > INT64_MAX:
            raise ValueError(f"offset {offset} + seq {seq} is past the int64 range")
        return Positions(None, offset, offset + seq - 1 if seq else -1)
    if offset:
        raise ValueError(f"give either {name} or offset, not both (offset={offset})")
    if converted is None:
        converted = as_array(positions, name)
    shape = converted.shape
    if not (shape == (seq,) or (len(shape) == 2 and shape[0] in (1, batch) and shape[1] == seq)):
        shapes = (f"({seq},), (1, {seq}) or ({batch}, {seq})" if batch != 1
                  else f"({seq},) or (1, {seq})")
        raise ValueError(f"{name} must have shape {shapes}, got {shape}")
    pos, hi = position_array(positions, name, converted)
    return Positions(pos.reshape(shape[0] if len(shape) == 2 else 1, seq), 0, hi, converted)


def real_positions(converted: np.ndarray, name: str) -> np.ndarray:
    """Real-valued positions (DINOv3's patch centres, SAM's grids; negative ones too) as
    the call's own float64 copy, finite and of magnitude below 2**32 (the float64 angle
    position * frequency keeps float32 precision, as for integer positions)."""
    pos = np.array(converted, np.float64, order="C")
    if pos.size and not (np.isfinite(pos).all() and np.abs(pos).max() < MAX_ANGLE_POSITION):
        raise ValueError(f"{name} must be finite and of magnitude below 2**32 when "
                         f"real-valued (the float64 angle position * frequency keeps "
                         f"float32 precision)")
    return pos


def angle_positions(maximum: int, name: str) -> None:
    """Refuse positions whose float64 angles would not be accurate (see
    MAX_ANGLE_POSITION); `maximum` is the largest position, `name` the argument
    it came from."""
    if maximum >= MAX_ANGLE_POSITION:
        raise ValueError(f"{name} must keep every position below 2**32 for sinusoidal and "
                         f"rotary encodings, got position {maximum}: the float64 angle "
                         f"position * frequency would carry a rounding error above float32 "
                         f"precision")


def new_array(shape: tuple[int, ...], dtype: np.dtype, names: str,
              what: str = "a table") -> np.ndarray:
    """np.empty(shape, dtype); past what an array's size can hold (not a lack of memory,
    which stays a MemoryError) a ValueError naming `names`, the arguments that gave the
    shape, before anything that size is made."""
    try:
        return np.empty(shape, dtype=dtype)
    except ValueError:
        raise ValueError(f"{names} give {what} of shape {shape}: more {dtype} elements "
                         f"than an array can hold") from None


def output(out: object, shape: tuple[int, ...], dtype: object, names: str) -> np.ndarray:
    """The `out` argument of a table-producing function, validated, or a new
    array of `dtype` (None: float32) when out is None (`names`: the arguments that
    gave its shape, for the message when NumPy cannot describe an array that large). A
    dtype given beside out must agree with it."""
    if out is None:
        return new_array(shape, float_dtype(dtype, "dtype"), names)
    out = array(out, "out", (len(shape),), writable=True)
    if out.shape != shape:
        raise ValueError(f"out must have shape {shape}, got {out.shape}")
    if dtype is not None and not same_storage(float_dtype(dtype, "dtype"), out.dtype):
        raise TypeError(f"dtype {dtype} contradicts out.dtype {out.dtype}; give one of them")
    return out


# the largest table (alibi_bias, relative_bias) made through a compiled entry directly,
# and its largest size on each axis: larger ones, whose allocation dwarfs the checks, go
# the validating path, which names sizes past memory (checked inline at each gate: a
# function call was 8% of a decode step's bias)
COMPILED_TABLE_ELEMENTS = 1 << 24


def compiled_output(out: object, dtype: object, shape: tuple[int, ...],
                    default: np.dtype) -> np.ndarray | None:
    """The array a compiled entry writes a table into: out where it is an exact ndarray
    of that shape and no dtype is given, else a new array of dtype (default when None),
    a float dtype of NumPy's; None for anything else, which the validating path (output)
    judges and names."""
    if out is not None:
        return out if type(out) is np.ndarray and out.shape == shape and dtype is None else None
    if dtype is None:
        return np.empty(shape, default)
    try:
        dt = np.dtype(dtype)  # type: ignore[call-overload]
    except Exception:
        return None
    return np.empty(shape, dt) if dt.kind == "f" or dt.name == "bfloat16" else None


def entry_declined(entry: str) -> RuntimeError:
    """The error of a compiled entry that declined the call its validating path made:
    a bug in fastpe, never the caller's input."""
    return RuntimeError(f"fastpe: the compiled {entry} entry declined a validated call "
                        f"(a bug: please report it)")


def rows_read(pos: Positions, *tables: np.ndarray
              ) -> tuple[list[np.ndarray], np.ndarray | None, int]:
    """Tables looked up by position (a learned table, a cos/sin cache), the positions and
    the offset, for the compiled entries: where any table cannot be addressed (another
    byte order, unaligned), only the rows the positions read, copied, the positions
    shifted to them (a decode call copied a whole table of thousands of rows: 4 ms)."""
    if all(kernel_addressable(t) for t in tables) or pos.max < 0:
        return [kernel_view(t) for t in tables], pos.array, pos.offset
    low = pos.offset if pos.array is None else int64_range(pos.array)[0]
    views = [kernel_view(t[low:pos.max + 1]) for t in tables]
    if pos.array is None:
        return views, None, 0
    return views, pos.array - low, pos.offset


def kernel_addressable(x: np.ndarray) -> bool:
    """Whether the compiled loops can address x: native byte order, aligned, strides a
    multiple of the item size."""
    return bool(x.dtype.isnative and x.flags.aligned
                and all(s % x.itemsize == 0 for s in x.strides))


def kernel_view(x: np.ndarray) -> np.ndarray:
    """x itself when the compiled loops can address it, else an aligned native copy the
    caller writes back with ``x[...] = copy``."""
    if kernel_addressable(x):
        return x
    return np.array(x, dtype=x.dtype.newbyteorder("="), order="C")


@contextlib.contextmanager
def kernel_views(*arrays: np.ndarray | None) -> Iterator[list[Any]]:
    """kernel_view() of each array (None stays None) for the block; copies are
    written back into the caller's arrays when it ends."""
    views = [None if a is None else kernel_view(a) for a in arrays]
    yield views
    for a, v in zip(arrays, views):
        if a is not None and v is not a:
            a[...] = v
