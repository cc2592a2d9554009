# torch CPU tensors as ndarray views, read through DLPack's C exchange API (DLPack 1.3:
# the type's __dlpack_c_exchange_api__ capsule): a model's q, k and positions are viewed
# in a few attribute reads, where Tensor.numpy() costs about 0.8 us each.

cdef extern from *:
    """
    /* the DLPack 1.3 structures this file reads (dlpack.h), by their ABI */
    typedef struct { int32_t device_type; int32_t device_id; } fpe_dl_device;
    typedef struct { uint8_t code; uint8_t bits; uint16_t lanes; } fpe_dl_dtype;
    typedef struct {
        void *data;
        fpe_dl_device device;
        int32_t ndim;
        fpe_dl_dtype dtype;
        int64_t *shape;
        int64_t *strides;
        uint64_t byte_offset;
    } fpe_dl_tensor;
    typedef struct { uint32_t major, minor; } fpe_dl_version;
    typedef int (*fpe_dl_from_py)(void *py_object, fpe_dl_tensor *out);
    typedef struct {
        fpe_dl_version version;
        void *prev_api;
        void *managed_tensor_allocator;
        void *managed_tensor_from_py_object_no_sync;
        void *managed_tensor_to_py_object_no_sync;
        fpe_dl_from_py dltensor_from_py_object_no_sync;
        void *current_work_stream;
    } fpe_dl_exchange_api;
    /* An attribute of torch.Tensor read through its getset descriptor's C getter, found
       once: without the lookup of the name through the type's MRO at every read (a
       decode call on torch tensors reads three per tensor). get is NULL where the
       attribute is not such a descriptor: the caller then reads it by name. */
    typedef struct { getter get; void *closure; } fpe_getset;
    static void fpe_getset_of(PyObject *descr, fpe_getset *out)
    {
        PyGetSetDef *def = NULL;
        if (Py_IS_TYPE(descr, &PyGetSetDescr_Type))
            def = ((PyGetSetDescrObject *)descr)->d_getset;
        out->get = def == NULL ? NULL : def->get;
        out->closure = def == NULL ? NULL : def->closure;
    }
    static PyObject *fpe_getset_read(const fpe_getset *g, PyObject *x)
    {
        return g->get(x, g->closure);
    }
    #define FPE_DL_CPU 1
    #define FPE_DL_INT 0
    #define FPE_DL_UINT 1
    #define FPE_DL_FLOAT 2
    #define FPE_DL_BFLOAT 4
    #define FPE_DL_BOOL 6
    """
    ctypedef struct fpe_dl_dtype:
        uint8_t code
        uint8_t bits
        uint16_t lanes
    ctypedef struct fpe_dl_device:
        int32_t device_type
    ctypedef struct fpe_dl_tensor:
        void *data
        fpe_dl_device device
        int32_t ndim
        fpe_dl_dtype dtype
        int64_t *shape
        int64_t *strides
        uint64_t byte_offset
    ctypedef struct fpe_dl_version:
        uint32_t major
    ctypedef int (*fpe_dl_from_py)(void *py_object, fpe_dl_tensor *out)
    ctypedef struct fpe_dl_exchange_api:
        fpe_dl_version version
        fpe_dl_from_py dltensor_from_py_object_no_sync
    int FPE_DL_CPU, FPE_DL_INT, FPE_DL_UINT, FPE_DL_FLOAT, FPE_DL_BFLOAT, FPE_DL_BOOL
    ctypedef struct fpe_getset:
        void *get
    void fpe_getset_of(object descr, fpe_getset *out)
    object fpe_getset_read(const fpe_getset *g, object x)

cdef extern from "numpy/arrayobject.h":
    # declared here with obj a pointer, so that it can be NULL; descr is stolen
    object fpe_new_from_descr "PyArray_NewFromDescr" (
        type subtype, cnp.dtype descr, int nd, cnp.npy_intp *dims, cnp.npy_intp *strides,
        void *data, int flags, PyObject *obj)

from cpython.exc cimport PyErr_Clear
from cpython.pycapsule cimport PyCapsule_GetPointer, PyCapsule_IsValid
from cpython.ref cimport Py_INCREF


cdef class _TorchViews:
    """What tensor_view needs of the torch this process imported, looked up once."""
    cdef object tensor_type        # torch.Tensor (subclasses take the Python path)
    cdef cnp.dtype bfloat16        # ml_dtypes' bfloat16, or None
    cdef fpe_dl_from_py view
    # torch.Tensor's own is_cpu, requires_grad and _version getters (tensor_attr),
    # and its is_neg method: its descriptor, called with the tensor, or None (then called
    # by name)
    cdef fpe_getset is_cpu, requires_grad, version, dtype
    cdef object is_neg
    # torch.int8 and torch.uint8: DLPack exports torch's sub-byte integers (int1 to
    # int7, uint1 to uint7) as 8-bit ones, whose bytes are not their values
    cdef object int8, uint8
    # torch.autograd.forward_ad: while one of its levels is open (_current_level >= 0)
    # a tensor may carry a tangent, which the Python layer refuses
    cdef object forward_ad
    # torch._C._is_tracing and _len_torch_dispatch_stack (or None): inside
    # torch.jit.trace, and under a dispatch mode (make_fx's, torch.export's), the Python
    # layer takes every tensor (and refuses it inside a trace)
    cdef object is_tracing, dispatch_modes


cdef object _torch_views = None    # a _TorchViews, False where unusable, None before


cdef object torch_views_of():
    """The _TorchViews of the torch in sys.modules, or None where there is none or it
    has no DLPack C exchange API with a non-owning view (torch before 2.10)."""
    global _torch_views
    cdef _TorchViews t
    cdef const fpe_dl_exchange_api *api
    if _torch_views is not None:
        return _torch_views or None
    import inspect
    import sys
    from types import MethodDescriptorType
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    _torch_views = False
    try:
        capsule = torch.Tensor.__dlpack_c_exchange_api__
        if not PyCapsule_IsValid(capsule, b"dlpack_exchange_api"):
            return None
        api = <const fpe_dl_exchange_api *>PyCapsule_GetPointer(capsule, b"dlpack_exchange_api")
        if api.version.major != 1 or api.dltensor_from_py_object_no_sync == NULL:
            return None
        t = _TorchViews()
        t.tensor_type = torch.Tensor
        static = inspect.getattr_static
        fpe_getset_of(static(torch.Tensor, "is_cpu", None), &t.is_cpu)
        fpe_getset_of(static(torch.Tensor, "requires_grad", None), &t.requires_grad)
        fpe_getset_of(static(torch.Tensor, "_version", None), &t.version)
        fpe_getset_of(static(torch.Tensor, "dtype", None), &t.dtype)
        t.int8, t.uint8 = torch.int8, torch.uint8
        t.is_neg = static(torch.Tensor, "is_neg", None)
        if type(t.is_neg) is not MethodDescriptorType:
            t.is_neg = None
        t.view = api.dltensor_from_py_object_no_sync
        t.forward_ad = sys.modules.get("torch.autograd.forward_ad")
        t.is_tracing = getattr(torch._C, "_is_tracing", None)
        t.dispatch_modes = getattr(torch._C, "_len_torch_dispatch_stack", None)
        t.bfloat16 = None
    except Exception:
        return None
    _torch_views = t
    return t


cdef object tensor_views_now():
    """torch_views_of(), or None while a level of torch's forward-mode AD is open (a
    tensor may then carry a tangent) or a trace records torch's operations (fastpe's
    writes would be missing from its graph): the Python layer refuses those. Looked up
    once per call, whatever the number of tensors."""
    cdef object t = torch_views_of()
    if t is None:
        return None
    fwad = (<_TorchViews>t).forward_ad
    try:
        if fwad is None:
            # a torch that does not import it with itself: until something does
            import sys
            fwad = (<_TorchViews>t).forward_ad = sys.modules.get("torch.autograd.forward_ad")
        if fwad is not None and fwad._current_level >= 0:
            return None
        if ((<_TorchViews>t).is_tracing is not None and (<_TorchViews>t).is_tracing()) or (
                (<_TorchViews>t).dispatch_modes is not None
                and (<_TorchViews>t).dispatch_modes()):
            return None
    except Exception:
        PyErr_Clear()
        return None
    return t


cdef inline object tensor_attr(const fpe_getset *g, object x, str name):
    """x.<name>, through the getter found once where there is one."""
    return fpe_getset_read(g, x) if g.get != NULL else getattr(x, name)


cdef inline object tensor_method(object descr, object x, str name):
    """x.<name>(), through the method's descriptor where there is one."""
    return descr(x) if descr is not None else getattr(x, name)()


cdef int dl_typenum(fpe_dl_dtype d) noexcept:
    """The NumPy type number of a DLPack dtype, -1 for one fastpe does not view."""
    if d.lanes != 1:
        return -1
    if d.code == FPE_DL_FLOAT:
        return (cnp.NPY_FLOAT16 if d.bits == 16 else cnp.NPY_FLOAT32 if d.bits == 32
                else cnp.NPY_FLOAT64 if d.bits == 64 else -1)
    if d.code == FPE_DL_INT:
        return (cnp.NPY_INT8 if d.bits == 8 else cnp.NPY_INT16 if d.bits == 16
                else cnp.NPY_INT32 if d.bits == 32 else cnp.NPY_INT64 if d.bits == 64 else -1)
    if d.code == FPE_DL_UINT and d.bits == 8:
        return cnp.NPY_UINT8
    if d.code == FPE_DL_BOOL and d.bits == 8:
        return cnp.NPY_BOOL
    return -1


cdef bint tensor_view(_TorchViews t, object x, bint written, View *v) noexcept:
    """x's View when x is a plain torch CPU tensor; False, having raised nothing, where
    x is anything else or not the common case (a subclass, another device or layout, a
    grad, a negative view, an inference tensor to be written, no elements, a dtype
    NumPy cannot view, more than VIEW_DIMS dimensions), which the Python layer then
    views or refuses. The view lives as long as the caller holds x and no other thread
    gives x other memory (x.set_(), x.data =, x.resize_()), which torch's own in-place
    operations assume too (they crash then)."""
    cdef fpe_dl_tensor d
    cdef int i, typenum
    cdef Py_ssize_t itemsize, expect
    if type(x) is not t.tensor_type:
        return False
    try:
        # the exchange API assumes a CPU tensor (a meta tensor crashes it); it raises
        # for a sparse, mkldnn or nested one
        if tensor_attr(&t.is_cpu, x, "is_cpu") is not True:
            return False
        # before the view: is_neg() releases the GIL (the getters below do not)
        if tensor_method(t.is_neg, x, "is_neg") is not False:
            return False
        if t.view(<void *>x, &d) != 0:
            PyErr_Clear()
            return False
        if d.device.device_type != FPE_DL_CPU or d.ndim < 0 or d.ndim > VIEW_DIMS:
            return False
        if d.dtype.code == FPE_DL_BFLOAT and d.dtype.bits == 16 and d.dtype.lanes == 1:
            if bfloat16_typenum < 0:
                return False  # registered by fastpe._checks once ml_dtypes is imported
            typenum = bfloat16_typenum
        else:
            typenum = dl_typenum(d.dtype)
            if typenum < 0:
                return False
            if typenum == cnp.NPY_INT8 or typenum == cnp.NPY_UINT8:
                dtype = tensor_attr(&t.dtype, x, "dtype")
                if dtype is not (t.int8 if typenum == cnp.NPY_INT8 else t.uint8):
                    return False
        # an integer tensor never requires grad
        if (d.dtype.code != FPE_DL_INT
                and tensor_attr(&t.requires_grad, x, "requires_grad") is not False):
            return False
        if written:
            # an inference tensor, whose writes outside inference mode torch refuses, has
            # no version counter: reading it raises (a getter, where is_inference() is a
            # method call that releases the GIL: 2.5x the time)
            try:
                tensor_attr(&t.version, x, "_version")
            except Exception:
                return False
    except Exception:
        PyErr_Clear()
        return False
    itemsize = d.dtype.bits // 8
    v.data = <char *>d.data + d.byte_offset
    v.ndim = d.ndim
    v.typenum = typenum
    v.itemsize = itemsize
    v.size = 1
    v.writable = v.native = True
    # DLPack's strides count elements: the data pointer decides alignment
    v.aligned = <size_t>v.data % <size_t>itemsize == 0
    v.c_contiguous = True
    expect = itemsize
    for i in range(d.ndim - 1, -1, -1):
        v.shape[i] = <Py_ssize_t>d.shape[i]
        v.strides[i] = <Py_ssize_t>d.strides[i] * itemsize
        v.size *= v.shape[i]
        if v.shape[i] != 1:
            if v.strides[i] != expect:
                v.c_contiguous = False
            expect *= v.shape[i]
    return v.size != 0 and d.data != NULL


cdef object tensor_array(_TorchViews t, object x, bint written):
    """tensor_view of x as an ndarray view of its memory (based on x); None where
    tensor_view does not view it."""
    cdef View v
    cdef cnp.dtype descr
    if not tensor_view(t, x, written, &v):
        return None
    if v.typenum == bfloat16_typenum:
        if t.bfloat16 is None:
            import sys
            t.bfloat16 = cnp.dtype(sys.modules["ml_dtypes"].bfloat16)
        descr = t.bfloat16
    else:
        descr = cnp.PyArray_DescrFromType(v.typenum)
    Py_INCREF(descr)  # PyArray_NewFromDescr steals it
    arr = fpe_new_from_descr(cnp.ndarray, descr, v.ndim, <cnp.npy_intp *>v.shape,
                             <cnp.npy_intp *>v.strides, v.data, cnp.NPY_ARRAY_WRITEABLE,
                             NULL)
    cnp.set_array_base(<cnp.ndarray>arr, x)
    return arr


cdef bint operand_view(object x, object torch_views, bint written, View *v) noexcept:
    """x's View: an exact ndarray, or, with torch_views (a _TorchViews, else None), a
    plain torch CPU tensor (tensor_view); False for anything else."""
    if cnp.PyArray_CheckExact(x):
        return array_view(<cnp.ndarray>x, v)
    return torch_views is not None and tensor_view(<_TorchViews>torch_views, x, written, v)


cdef object _increment_version = None   # torch._C._increment_version, looked up once
cdef object _tensor_type = None         # torch.Tensor


cdef object version_increment():
    """torch._C._increment_version, which bumps the version counters of the tensors it
    is given together, as torch's in-place operations do after writing."""
    global _increment_version, _tensor_type
    if _increment_version is None:
        import sys
        torch = sys.modules["torch"]
        _tensor_type = torch.Tensor
        _increment_version = torch._C._increment_version
    return _increment_version


cdef int bump_tensors(tuple written) except -1:
    """Bump the version counters of the torch tensors among what a call has written
    (the others: None, a RoPE call without k, or the arrays beside a tensor)."""
    increment = version_increment()
    for x in written:
        if not isinstance(x, _tensor_type):
            written = tuple([y for y in written if isinstance(y, _tensor_type)])
            break
    if written:
        increment(written)
    return 0


def torch_bump(tuple written):
    """bump_tensors: fastpe._checks.bump_written without a Python frame, for a decode
    step."""
    bump_tensors(written)


def torch_views(tuple args):
    """fastpe._checks.torch_tensors(*args) where every torch tensor among the (value,
    name, written) triples is a plain CPU tensor (tensor_array): each as its ndarray
    view, the rest as given; None, having touched nothing, where any tensor is not."""
    cdef _TorchViews t = tensor_views_now()
    cdef list out = []
    cdef tuple arg
    if t is None:
        return None
    for arg in args:
        x = arg[0]
        if x is None or type(x) is cnp.ndarray:
            out.append(x)
        elif type(x) is t.tensor_type:
            v = tensor_array(t, x, arg[2] is True)
            if v is None:
                return None
            out.append(v)
        elif isinstance(x, t.tensor_type):
            return None
        else:
            out.append(x)
    return out
