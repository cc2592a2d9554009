"""torch CPU tensors as first-class inputs: every operation takes a model's own tensors
(float32, float16, bfloat16; contiguous or strided), converts each once, and writes them
in place as torch's own in-place operations do (version counter bumped, inference
tensors only inside inference mode, tensors that require grad refused)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import BF16, run_python

import fastpe

torch = pytest.importorskip("torch", reason="torch interop needs torch")

DTYPES = ["float32", "float16"] + (["bfloat16"] if BF16 is not None else [])


def _tensor(shape, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).to(getattr(torch, dtype))


def _numpy_twin(t):
    """A NumPy copy of t's values in t's dtype (bfloat16 through ml_dtypes)."""
    if t.dtype is torch.bfloat16:
        import ml_dtypes
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16).copy()
    return t.numpy().copy()


def _same(t, a):
    np.testing.assert_array_equal(_numpy_twin(t).astype(np.float64), a.astype(np.float64))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_rope_on_tensors_equals_the_call_on_arrays(dtype, layout):
    """Bit for bit the NumPy call's result (itself held to fastpe.reference elsewhere),
    for the plain call, a RotaryEmbedding, positions as a tensor and apply_rope_cached;
    and within float32 rounding of the float64 reference."""
    q = _tensor((2, 5, 4, 32), dtype, 0)
    k = _tensor((2, 5, 2, 32), dtype, 1)
    if layout == "bhsd":
        q, k = q.transpose(1, 2), k.transpose(1, 2)
    pos = torch.tensor([[3, 4, 5, 6, 7], [0, 1, 2, 3, 4]])
    qa, ka = _numpy_twin(q), _numpy_twin(k)
    rope = fastpe.RotaryEmbedding(32, base=5e5, scaling={"rope_type": "linear", "factor": 2.0})
    assert rope(q, k, pos, layout=layout) == (q, k)
    rope(qa, ka, pos.numpy(), layout=layout)
    _same(q, qa)
    _same(k, ka)
    expect = _numpy_twin(_tensor((2, 5, 4, 32), dtype, 0)).astype(np.float64)
    if layout == "bhsd":
        expect = expect.transpose(0, 2, 1, 3)
    fastpe.reference.apply_rope(expect, None, pos.numpy(), base=5e5, layout=layout,
                                scaling={"rope_type": "linear", "factor": 2.0})
    tol = {"float32": 1e-5, "float16": 4e-3, "bfloat16": 3e-2}[dtype]
    np.testing.assert_allclose(_numpy_twin(q).astype(np.float64), expect, atol=tol * 4)

    freqs = fastpe.rope_frequencies(32)
    cos, sin = fastpe.rope_cos_sin(np.arange(16), freqs)
    q2 = _tensor((2, 5, 4, 32), dtype, 2)
    q2a = _numpy_twin(q2)
    fastpe.apply_rope_cached(q2, None, torch.from_numpy(cos), torch.from_numpy(sin), pos,
                             layout="bshd")
    fastpe.apply_rope_cached(q2a, None, cos, sin, pos.numpy())
    _same(q2, q2a)


@pytest.mark.parametrize("dtype", DTYPES)
def test_adds_on_tensors_equal_the_calls_on_arrays(dtype):
    x = _tensor((2, 6, 16), dtype, 3)
    xa = _numpy_twin(x)
    assert fastpe.add_sinusoidal(x, torch.arange(4, 10)) is x
    fastpe.add_sinusoidal(xa, np.arange(4, 10))
    _same(x, xa)
    table = _tensor((12, 16), dtype, 4)
    assert fastpe.add_learned(x, table, offset=2) is x
    fastpe.add_learned(xa, _numpy_twin(table), offset=2)
    _same(x, xa)
    scores = _tensor((2, 4, 3, 6), dtype, 5)
    sa = _numpy_twin(scores)
    mask = torch.tensor([[True] * 6, [False, True, True, True, True, True]])
    assert fastpe.add_alibi(scores, causal=True, key_mask=mask) is scores
    fastpe.add_alibi(sa, causal=True, key_mask=mask.numpy())
    _same(scores, sa)


def test_q_and_k_views_of_one_fused_tensor():
    """q and k sliced from one fused QKV projection, as a model makes them."""
    qkv = _tensor((3, 4, (4 + 2 + 2) * 16), "float32", 6)
    q = qkv[..., :64].view(3, 4, 4, 16)
    k = qkv[..., 64:96].view(3, 4, 2, 16)
    v_before = qkv[..., 96:].clone()
    qa, ka = _numpy_twin(q), _numpy_twin(k)
    fastpe.apply_rope(q, k, torch.arange(4), layout="bshd")
    fastpe.reference.apply_rope(qa, ka, np.arange(4))
    np.testing.assert_allclose(q.numpy(), qa, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(k.numpy(), ka, rtol=1e-6, atol=1e-6)
    assert torch.equal(qkv[..., 96:], v_before)  # v untouched


def test_every_written_tensor_has_its_version_bumped():
    q = _tensor((1, 3, 2, 8), "float32", 7)
    k = _tensor((1, 3, 2, 8), "float32", 8)
    pos = torch.arange(3)
    before = q._version, k._version, pos._version
    fastpe.apply_rope(q, k, pos, layout="bshd")
    assert q._version > before[0] and k._version > before[1]
    assert pos._version == before[2]  # only read
    x = _tensor((3, 8), "float32", 9)
    v = x._version
    fastpe.add_sinusoidal(x)
    assert x._version > v


def _entries(m=fastpe):
    """(name, call(written tensor, good), the tensors it writes) for every entry point
    of module m (fastpe or fastpe.reference) that writes torch tensors: good=False makes
    the call refuse (bad positions, a table of the wrong head count)."""
    cos, sin = fastpe.rope_cos_sin(np.arange(16), fastpe.rope_frequencies(8))
    table = torch.zeros(16, 8)
    t5 = torch.ones(32, 3)

    def bad(good):
        return torch.arange(3) if good else torch.tensor([0, -1, 2])

    def heads(good):
        return t5 if good else t5[:, :2]

    entries = {
        "apply_rope": lambda q, k, good: m.apply_rope(q, k, bad(good), layout="bshd"),
        "apply_rope of an ndarray q": lambda q, k, good: m.apply_rope(
            q.numpy().copy(), k, bad(good), layout="bshd"),
        "apply_rope_cached": lambda q, k, good: m.apply_rope_cached(
            q, k, torch.from_numpy(cos), torch.from_numpy(sin), bad(good), layout="bshd"),
        "a memoryview k beside apply_rope_cached's tensor q": lambda q, k, good:
            m.apply_rope_cached(q, memoryview(k.numpy().copy()), torch.from_numpy(cos),
                                torch.from_numpy(sin), bad(good), layout="bshd"),
        "add_sinusoidal": lambda q, k, good: m.add_sinusoidal(q[0, :, 0], bad(good)),
        "add_learned": lambda q, k, good: m.add_learned(q[0, :, 0], table, bad(good)),
        "add_alibi": lambda q, k, good: m.add_alibi(q, q_offset=0 if good else -1),
        "add_relative_bias": lambda q, k, good: m.add_relative_bias(q, heads(good)),
        "add_disentangled_bias": lambda q, k, good: m.add_disentangled_bias(
            q, c2p=torch.ones(1, 3, 2, 8 if good else 7), max_relative_positions=4),
        "sinusoidal_table": lambda q, k, good: m.sinusoidal_table(
            3, 8, out=q[0, :, 0], offset=0 if good else -1),
        "alibi_bias": lambda q, k, good: m.alibi_bias(
            3, 2, 8, out=q[0], q_offset=0 if good else -1),
        "relative_bias": lambda q, k, good: m.relative_bias(heads(good), 2, 8, out=q[0]),
    }
    if m is fastpe:
        rope = fastpe.RotaryEmbedding(8)
        entries["RotaryEmbedding"] = lambda q, k, good: rope(q, k, bad(good), layout="bshd")
    return entries


@pytest.mark.parametrize(("entry", "api"), [
    (entry, api) for api in ("cython", "numpy", "fastpe.reference")
    for entry in _entries(fastpe.reference if api == "fastpe.reference" else fastpe)])
def test_version_bumped_after_a_write_and_only_then(entry, api):
    """As torch's in-place operations: a call that writes bumps the version counters of
    what it wrote; a call refused before writing leaves them (and the data) as they
    were, and the tensors it only reads are never bumped."""
    if api == "cython" and not fastpe._backend.compiled:
        pytest.skip("the compiled extension is not built")
    call = _entries(fastpe.reference if api == "fastpe.reference" else fastpe)[entry]
    with fastpe.use_backend("numpy" if api == "fastpe.reference" else api):
        q = _tensor((1, 3, 2, 8), "float32", 7)
        k = _tensor((1, 3, 2, 8), "float32", 8)
        before, data = (q._version, k._version), (q.clone(), k.clone())
        with pytest.raises((ValueError, IndexError)):
            call(q, k, False)
        assert (q._version, k._version) == before, "refused, yet bumped"
        assert torch.equal(q, data[0]) and torch.equal(k, data[1])
        call(q, k, True)
        if entry.endswith("ndarray q"):
            assert torch.equal(q, data[0])
        else:
            assert q._version > before[0], "written, not bumped"
        if entry.startswith(("apply_rope", "Rotary")):
            assert k._version > before[1], "k written, not bumped"
        else:
            assert k._version == before[1]


def test_autograd_refuses_a_backward_through_a_rotated_tensor():
    """As after torch's own in-place operations: a saved tensor rewritten by fastpe."""
    w = torch.randn(8, requires_grad=True)
    q = torch.randn(1, 2, 1, 8)
    y = (q * w).sum()  # saves q for the backward pass
    fastpe.apply_rope(q, layout="bshd")
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()


def test_inference_tensors_are_written_only_in_inference_mode():
    """torch refuses in-place updates of inference tensors outside inference mode, and
    reads them anywhere: q or k to be rotated by each RoPE entry, x to be added to."""
    with torch.inference_mode():
        q = _tensor((1, 3, 2, 8), "float32", 10)
        cos, sin = (torch.from_numpy(a) for a in
                    fastpe.rope_cos_sin(np.arange(4), fastpe.rope_frequencies(8)))
    plain = _tensor((1, 3, 2, 8), "float32", 11)
    calls = {"apply_rope": lambda q, k: fastpe.apply_rope(q, k, layout="bshd"),
             "RotaryEmbedding": lambda q, k: fastpe.RotaryEmbedding(8)(q, k, layout="bshd"),
             "apply_rope_cached": lambda q, k: fastpe.apply_rope_cached(q, k, cos, sin,
                                                                        layout="bshd")}
    before = q.clone(), plain.clone()
    for name, call in calls.items():
        with pytest.raises(TypeError, match=r"\bq\b is an inference tensor"):
            call(q, plain)
        with pytest.raises(TypeError, match=r"\bk\b is an inference tensor"):
            call(plain, q)
        assert torch.equal(q, before[0]) and torch.equal(plain, before[1]), name
    with pytest.raises(TypeError, match=r"\bx\b is an inference tensor"):
        fastpe.add_sinusoidal(q[0, :, 0])
    assert torch.equal(q, before[0])
    expected = plain.numpy().copy()
    fastpe.apply_rope_cached(expected, None, cos.numpy(), sin.numpy())
    fastpe.apply_rope_cached(plain, None, cos, sin, layout="bshd")  # inference tensors read
    np.testing.assert_array_equal(plain.numpy(), expected)
    with torch.inference_mode():
        fastpe.apply_rope(q, layout="bshd")
    assert not torch.equal(q, before[0])


_GRAD_CALLS = {
    "q": lambda t: fastpe.apply_rope(t["q"], t["k"], layout="bhsd"),
    "k": lambda t: fastpe.RotaryEmbedding(16)(t["q"], t["k"], layout="bhsd"),
    "sin": lambda t: fastpe.apply_rope_cached(t["q"], None, t["cos"], t["sin"], layout="bhsd"),
    "x": lambda t: fastpe.add_learned(t["x"], t["table"]),
    "table": lambda t: fastpe.add_learned(t["x"], t["table"]),
    "scores": lambda t: fastpe.add_alibi(t["scores"]),
    "out": lambda t: fastpe.sinusoidal_table(8, 16, out=t["out"]),
    "p2c": lambda t: fastpe.add_disentangled_bias(
        t["scores"], c2p=t["c2p"], p2c=t["p2c"], position_buckets=8, max_relative_positions=64),
}


@pytest.mark.parametrize("dtype", ["float32", pytest.param("bfloat16", marks=pytest.mark.skipif(
    BF16 is None, reason="needs ml_dtypes"))])
@pytest.mark.parametrize("name", list(_GRAD_CALLS))
def test_tensors_that_require_grad_are_refused_by_name(name, dtype):
    """Written or read, in every dtype (bfloat16 is viewed through an int16 view, which
    never requires grad), and left as they were."""
    cos, sin = fastpe.rope_cos_sin(np.arange(8), fastpe.rope_frequencies(16))
    shapes = {"q": (1, 2, 8, 16), "k": (1, 2, 8, 16), "cos": cos.shape, "sin": sin.shape,
              "x": (1, 3, 16), "table": (4, 16), "scores": (1, 2, 8, 8), "out": (8, 16),
              "c2p": (1, 2, 8, 16), "p2c": (1, 2, 8, 16)}
    tensors = {what: _tensor(shape, dtype, seed) for seed, (what, shape) in enumerate(shapes.items())}
    tensors[name].requires_grad_(True)
    before = {what: t.detach().clone() for what, t in tensors.items()}
    versions = {what: t._version for what, t in tensors.items()}
    with pytest.raises(TypeError, match=rf"\b{name}\b.*requires grad"):
        _GRAD_CALLS[name](tensors)
    for what, t in tensors.items():
        assert torch.equal(t.detach(), before[what]) and t._version == versions[what], what


def test_tensors_that_require_grad_are_written_under_no_grad_as_torch_writes_them():
    """Under torch.no_grad() torch's in-place ops write a leaf that requires grad (an
    optimizer's step): so does fastpe, bumping its version counter, and reads one."""
    x = torch.zeros(1, 3, 8, requires_grad=True)
    table = torch.ones(4, 8, requires_grad=True)
    with torch.no_grad():
        fastpe.add_learned(x, table)
    assert x._version == 1 and (x == 1).all() and x.requires_grad


@pytest.mark.parametrize("dtype", ["float32", pytest.param("bfloat16", marks=pytest.mark.skipif(
    BF16 is None, reason="needs ml_dtypes"))])
def test_tensors_that_require_grad_are_written_in_inference_mode_with_grad_enabled(dtype):
    """Inference mode records no autograd even with torch.enable_grad() inside it, where
    torch's in-place ops write a leaf that requires grad: so does fastpe (it refused it
    as if grad mode recorded it), reading one too."""
    x = torch.zeros(1, 3, 8, dtype=getattr(torch, dtype), requires_grad=True)
    table = torch.ones(4, 8, dtype=getattr(torch, dtype), requires_grad=True)
    with torch.inference_mode(), torch.enable_grad():
        fastpe.add_learned(x, table)
    assert x._version == 1 and (x == 1).all() and x.requires_grad


def test_negated_views_are_refused_as_targets_and_read_as_values():
    q = torch.zeros(1, 2, 1, 8)
    with pytest.raises(TypeError, match=r"\bq\b.*negative or conjugate bit"):
        fastpe.apply_rope(torch._neg_view(q), layout="bshd")
    x = torch.zeros(2, 8)
    table = torch.ones(4, 8)
    fastpe.add_learned(x, torch._neg_view(table))
    assert (x == -1).all()


@pytest.mark.parametrize("call", ["apply_rope", "RotaryEmbedding", "apply_rope_cached"])
def test_tensors_must_say_their_layout(call):
    """transformers holds q and k as (batch, heads, seq, head_dim), other code as (batch,
    seq, heads, head_dim): with equal head counts a misread layout rotates by the wrong
    positions without an error, so a call on tensors names its layout."""
    q = _tensor((1, 4, 4, 16), "float32", 11)
    k = _tensor((1, 4, 4, 16), "float32", 12)
    before = q.clone(), k.clone()
    cos, sin = fastpe.rope_cos_sin(np.arange(8), fastpe.rope_frequencies(16))
    run = {"apply_rope": lambda: fastpe.apply_rope(q, k),
           "RotaryEmbedding": lambda: fastpe.RotaryEmbedding(16)(q, k),
           "apply_rope_cached": lambda: fastpe.apply_rope_cached(q, k, cos, sin)}[call]
    with pytest.raises(ValueError, match=r"torch tensor: pass layout= \('bhsd' for transformers"):
        run()
    assert torch.equal(q, before[0]) and torch.equal(k, before[1])


class _Sub(torch.Tensor):
    pass


def _unusual(kind):
    q = _tensor((1, 3, 2, 8), "float32", 10)
    return {
        "meta": lambda: torch.empty(1, 3, 2, 8, device="meta"),
        "sparse": lambda: q.to_sparse(),
        "mkldnn": lambda: q.to_mkldnn(),
        "nested": lambda: torch.nested.nested_tensor([q[0], q[0, :2]]),
        "complex": lambda: q.to(torch.complex64),
        "int": lambda: q.to(torch.int32),
        "expanded": lambda: q[:, :, :1].expand(1, 3, 2, 8),
        "parameter": lambda: torch.nn.Parameter(q, requires_grad=False),
        "subclass": lambda: q.as_subclass(_Sub),
        "empty": lambda: q[:, :0],
        "transposed": lambda: q.transpose(1, 2),
        "sliced": lambda: _tensor((1, 3, 4, 16), "float32", 11)[:, :, 1:3, ::2],
    }[kind]()


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("kind", ["meta", "sparse", "mkldnn", "nested", "complex", "int",
                                  "expanded", "parameter", "subclass", "empty",
                                  "transposed", "sliced"])
def test_unusual_tensors_are_refused_or_rotated_right_on_both_backends(kind):
    """Tensors the compiled views do not take (another device or layout, a subclass,
    no elements) reach torch's own conversion: both backends give the same error,
    leaving the tensor's values as they were, or the reference's rotation."""
    outcomes = []
    for backend in ("cython", "numpy"):
        q = _unusual(kind)
        plain = q.layout is torch.strided and q.device.type == "cpu" and not q.is_nested
        before = _numpy_twin(q) if plain else None
        with fastpe.use_backend(backend):
            try:
                fastpe.apply_rope(q, None, offset=2, layout="bshd")
            except (TypeError, ValueError) as exc:
                outcomes.append((type(exc), str(exc)))
                if plain:
                    np.testing.assert_array_equal(_numpy_twin(q), before)
                continue
        expect = before.astype(np.float64)
        fastpe.reference.apply_rope(expect, None, offset=2)
        np.testing.assert_allclose(_numpy_twin(q).astype(np.float64), expect, atol=1e-5)
        outcomes.append("rotated")
    assert outcomes[0] == outcomes[1]
    refused = {"meta", "sparse", "mkldnn", "nested", "complex", "int", "expanded"}
    assert (outcomes[0] != "rotated") == (kind in refused)


@pytest.mark.skipif(fastpe._backend.compiled is None, reason="needs the compiled kernels")
@pytest.mark.parametrize("dtype", DTYPES + ["float64"])
def test_compiled_views_are_the_tensors_memory(dtype):
    """The compiled kernels view a plain tensor through DLPack's C exchange API: the
    same memory, shape and strides as torch's own .numpy() (bfloat16 as ml_dtypes'),
    based on the tensor, which is the one bumped."""
    kern = fastpe._backend.compiled
    qkv = _tensor((2, 3, 48), dtype, 12)
    q = qkv[..., :32].view(2, 3, 2, 16).transpose(1, 2)
    k = qkv[..., 32:].view(2, 3, 1, 16)
    pos = torch.tensor([[0, 1, 2]], dtype=torch.int32)
    versions = q._version, k._version
    views = kern.torch_views(((q, "q", True), (k, "k", True), (pos, "positions", False)))
    if views is None:
        pytest.skip("this torch has no DLPack C exchange API (torch before 2.10)")
    for v, t in zip(views, (q, k, pos)):
        assert v.base is t
        assert v.shape == tuple(t.shape)
        assert v.strides == tuple(s * t.element_size() for s in t.stride())
        assert v.ctypes.data == t.data_ptr()
        np.testing.assert_array_equal(v.astype(np.float64), _numpy_twin(t).astype(np.float64))
    assert views[2].dtype == np.int32
    # viewing writes nothing: the entry bumps the counters once it has written
    assert (q._version, k._version) == versions
    grad = torch.ones(2, 16, requires_grad=True)
    assert kern.torch_views(((q, "q", True), (grad, "table", False))) is None
    assert (q._version, k._version) == versions


def _decode_call(api, q, k, layout):
    """(call, positions, cos, sin): a rotation of q and k (head_dim 16) by a model's
    (2, 3) torch position ids through `api`, with a float32 torch cos/sin cache for
    apply_rope_cached."""
    pos = torch.tensor([[5, 6, 7], [100, 101, 102]])
    cos, sin = fastpe.rope_cos_sin(np.arange(128), fastpe.rope_frequencies(16))
    tcos, tsin = torch.from_numpy(cos), torch.from_numpy(sin)
    emb = fastpe.RotaryEmbedding(16)
    call = {
        "apply_rope": lambda: fastpe.apply_rope(q, k, pos, layout=layout),
        "apply_rope_cached": lambda: fastpe.apply_rope_cached(q, k, tcos, tsin, pos,
                                                              layout=layout),
        "RotaryEmbedding": lambda: emb(q, k, pos, layout=layout),
    }[api]
    return call, pos, tcos, tsin


@pytest.mark.skipif(fastpe._backend.compiled is None, reason="needs the compiled kernels")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("api", ["apply_rope", "apply_rope_cached", "RotaryEmbedding"])
def test_a_models_tensors_take_the_compiled_entry_directly(api, dtype, monkeypatch):
    """A decode step on a transformers model's own tensors (q and k transposed views of
    a fused projection, (batch, seq) position ids, a float32 cos/sin cache) reaches the
    compiled entry once, from the public function, with no validating pass: the
    formula's rotation, each written tensor's version bumped once, the read ones
    never."""
    from conftest import entry_callers
    qkv = _tensor((2, 3, 48), dtype, 21)
    q = qkv[..., :32].view(2, 3, 2, 16).transpose(1, 2)
    k = qkv[..., 32:].view(2, 3, 1, 16).transpose(1, 2)
    want = [_numpy_twin(t).astype(np.float64).transpose(0, 2, 1, 3) for t in (q, k)]
    call, pos, tcos, tsin = _decode_call(api, q, k, "bhsd")
    fastpe.reference.apply_rope(want[0], want[1], pos.numpy())
    if dtype == "bfloat16":
        call()  # the first bfloat16 tensor registers ml_dtypes' type with the kernels
        qkv.copy_(_tensor((2, 3, 48), dtype, 21))
    callers = entry_callers(monkeypatch, "rope_call")
    read = (pos, tcos, tsin)
    versions = [t._version for t in (q, k, *read)]
    with fastpe.use_backend("cython"):
        call()
    assert callers == [({"RotaryEmbedding": "__call__"}.get(api, api), 1)]
    after = [t._version for t in (q, k, *read)]
    # q and k, views of one projection, share its counter: bumped once for each
    assert after == [versions[0] + 2, versions[1] + 2, *versions[2:]]
    tol = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}[dtype]
    for t, w in zip((q, k), want):
        np.testing.assert_allclose(_numpy_twin(t).astype(np.float64).transpose(0, 2, 1, 3),
                                   w, atol=tol * 4, rtol=tol)


@pytest.mark.skipif(fastpe._backend.compiled is None, reason="needs the compiled kernels")
@pytest.mark.parametrize("api", ["apply_rope", "apply_rope_cached", "RotaryEmbedding"])
def test_arrays_rotated_by_torch_positions_take_the_compiled_entry(api, monkeypatch):
    """NumPy q and k with a model's torch position ids (and torch cos and sin) are
    rotated by the compiled entry at its first call, as all arrays or all tensors are:
    the formula's rotation, the read tensors' versions untouched."""
    from conftest import entry_callers
    rng = np.random.default_rng(5)
    q = rng.standard_normal((2, 3, 2, 16)).astype(np.float32)
    k = rng.standard_normal((2, 3, 1, 16)).astype(np.float32)
    want = [t.astype(np.float64) for t in (q, k)]
    call, pos, tcos, tsin = _decode_call(api, q, k, "bshd")
    fastpe.reference.apply_rope(want[0], want[1], pos.numpy(), layout="bshd")
    callers = entry_callers(monkeypatch, "rope_call")
    versions = [t._version for t in (pos, tcos, tsin)]
    with fastpe.use_backend("cython"):
        call()
    assert callers == [({"RotaryEmbedding": "__call__"}.get(api, api), 1)]
    assert [t._version for t in (pos, tcos, tsin)] == versions
    for t, w in zip((q, k), want):
        np.testing.assert_allclose(t, w, atol=4e-5, rtol=1e-5)


@pytest.mark.skipif(fastpe._backend.compiled is None, reason="needs the compiled kernels")
@pytest.mark.parametrize("op", ["add_learned", "add_sinusoidal", "add_alibi"])
def test_arrays_beside_torch_positions_or_masks_skip_the_validating_path(op, monkeypatch):
    """An array added to by a model's torch positions (or attention mask) is viewed
    once and written by the compiled entry, never the validating path: the same bits
    as the call on arrays, the read tensors' versions untouched."""
    import fastpe._args
    rng = np.random.default_rng(11)
    x = rng.standard_normal({"add_alibi": (2, 4, 3, 8)}.get(op, (2, 3, 16))).astype(np.float32)
    table = rng.standard_normal((64, 16)).astype(np.float32)
    positions = np.array([[4, 5, 6], [30, 31, 32]])
    mask = np.array([[0, 1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 1]])
    call = {
        "add_learned": lambda p, m: fastpe.add_learned(x, table, p),
        "add_sinusoidal": lambda p, m: fastpe.add_sinusoidal(x, p),
        "add_alibi": lambda p, m: fastpe.add_alibi(x, causal=True, key_mask=m),
    }[op]
    given = x.copy()
    call(positions, mask)
    want, x[...] = x.copy(), given
    tensors = torch.from_numpy(positions), torch.from_numpy(mask)
    versions = [t._version for t in tensors]

    def validating(*args, **kwargs):
        raise AssertionError("the validating path ran")
    monkeypatch.setattr(fastpe._args, op, validating)
    with fastpe.use_backend("cython"):
        call(*tensors)
    np.testing.assert_array_equal(x, want)
    assert [t._version for t in tensors] == versions


@pytest.mark.parametrize("backend", ["cython", "numpy"])
def test_a_misaligned_tensor_is_rotated_right(backend):
    """A float32 tensor whose data starts two bytes into its buffer: the compiled views
    see the address, not only the strides, and the rotation is the formula's."""
    if backend == "cython" and fastpe._backend.compiled is None:
        pytest.skip("needs the compiled kernels")
    raw = bytearray(2 + 4 * 2 * 3 * 8)
    values = _tensor((2, 3, 8), "float32", 22).numpy()
    raw[2:] = values.tobytes()
    q = torch.frombuffer(raw, dtype=torch.float32, offset=2).view(2, 3, 8)
    assert q.data_ptr() % 4 == 2
    want = values.astype(np.float64)
    fastpe.reference.apply_rope(want, None, offset=3, layout="shd")
    with fastpe.use_backend(backend):
        fastpe.apply_rope(q, None, offset=3, layout="shd")
    np.testing.assert_allclose(np.frombuffer(raw, np.uint8)[2:].view(np.float32)
                               .reshape(2, 3, 8), want, atol=1e-5)


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
@pytest.mark.parametrize(("entry", "api"), [
    (entry, api) for api in ("cython", "numpy", "fastpe.reference")
    for entry in _entries(fastpe.reference if api == "fastpe.reference" else fastpe)
    if not entry.endswith("ndarray q")])
def test_dual_tensors_of_forward_mode_ad_are_refused(entry, api):
    """Inside torch.autograd.forward_ad.dual_level, a written tensor with a tangent is
    refused (fastpe would write its values and drop the tangent, which torch's own
    operations carry), leaving its values and version as they were; the same tensor
    without a tangent is written as outside the level."""
    if api == "cython" and not fastpe._backend.compiled:
        pytest.skip("the compiled extension is not built")
    import torch.autograd.forward_ad as fwad
    call = _entries(fastpe.reference if api == "fastpe.reference" else fastpe)[entry]
    with fastpe.use_backend("numpy" if api == "fastpe.reference" else api), fwad.dual_level():
        q = _tensor((1, 3, 2, 8), "float32", 7)
        k = _tensor((1, 3, 2, 8), "float32", 8)
        dual = fwad.make_dual(q, torch.ones_like(q))
        version, data = dual._version, q.clone()
        with pytest.raises(TypeError, match="forward-mode AD"):
            call(dual, k, True)
        assert torch.equal(fwad.unpack_dual(dual).primal, data)
        assert dual._version == version
        call(q, k, True)   # no tangent: written
        assert q._version > version


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("backend", ["cython", "numpy"])
@pytest.mark.parametrize("entry", [e for e in _entries() if not e.endswith("ndarray q")
                                   and "memoryview" not in e])
def test_functional_tensors_are_refused_not_written_to_a_copy(entry, backend):
    """torch.func.functionalize's tensors are plain torch.Tensors without memory of their
    own (data_ptr() is 0) whose numpy() is a fresh array of other values: fastpe refuses
    them by name instead of reading those values and writing where nothing reads."""
    if backend == "cython" and not fastpe._backend.compiled:
        pytest.skip("the compiled extension is not built")
    from torch.func import functionalize
    call = _entries()[entry]
    outcome = []

    def step(q, k):
        q, k = q * 1, k * 1   # the transform's own (functional) tensors
        with pytest.raises(TypeError, match=r"^(q|x|scores|out) is a torch tensor without "
                                            r"memory of its own \(a functional tensor"):
            call(q, k, True)
        outcome.append("refused")
        return q

    q = _tensor((1, 3, 2, 8), "float32", 12)
    with fastpe.use_backend(backend):
        assert torch.equal(functionalize(step)(q, _tensor((1, 3, 2, 8), "float32", 13)), q)
    assert outcome == ["refused"]


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
@pytest.mark.parametrize("backend", ["cython", "numpy"])
@pytest.mark.parametrize("transform", ["vmap", "jvp", "grad"])
@pytest.mark.parametrize("entry", [e for e in _entries() if not e.endswith("ndarray q")
                                   and "memoryview" not in e])
def test_tensors_of_torch_func_transforms_are_refused_by_name(entry, transform, backend):
    """vmap's batched tensors have no memory of their own, and grad and jvp would
    follow neither fastpe's writes nor what they depend on: refused naming the
    transform (vmap's said a data pointer was missing, jvp's named forward_ad's
    unpack_dual, grad's asked for a detach), the tensor given to it untouched."""
    if backend == "cython" and not fastpe._backend.compiled:
        pytest.skip("the compiled extension is not built")
    call = _entries()[entry]
    refused = []
    k = _tensor((1, 3, 2, 8), "float32", 18)

    def step(q):
        with pytest.raises(TypeError, match=r"^(q|x|scores|out|table) is a tensor of a "
                                            r"torch\.func transform \(vmap, grad, jvp"):
            call(q, k, True)
        refused.append(transform)
        return q.sum()

    q = _tensor((1, 3, 2, 8), "float32", 17)
    before, version = q.clone(), q._version
    with fastpe.use_backend(backend):
        if transform == "vmap":
            torch.func.vmap(lambda row: step(row[None])[None])(q)
        elif transform == "jvp":
            torch.func.jvp(step, (q,), (torch.ones_like(q),))
        else:
            torch.func.grad(step)(q)
    assert refused == [transform]
    assert torch.equal(q, before) and q._version == version


@pytest.mark.parametrize("backend", ["cython", "numpy"])
@pytest.mark.parametrize("transform", ["vmap", "grad"])
def test_a_plain_tensor_inside_a_torch_func_transform_is_written(transform, backend):
    """A tensor the transform does not hold (made outside it) is written as outside,
    by both backends (numpy() refuses every tensor there)."""
    if backend == "cython" and not fastpe._backend.compiled:
        pytest.skip("the compiled extension is not built")
    x, want = torch.zeros(4, 8), torch.zeros(4, 8)
    fastpe.reference.add_sinusoidal(want)

    def step(q):
        fastpe.add_sinusoidal(x)
        return q.sum()

    with fastpe.use_backend(backend):
        (torch.func.vmap(step) if transform == "vmap" else torch.func.grad(step))(torch.ones(3))
    assert torch.allclose(x, want)   # once: vmap runs step once over the batch


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("backend", ["cython", "numpy"])
def test_functional_tensors_read_beside_plain_ones_are_refused(backend):
    """A functional tensor only read (positions, a learned table) is refused by name
    too: its numpy() holds other values than it shows; the plain tensor beside it is
    left as it was, its version too."""
    if backend == "cython" and not fastpe._backend.compiled:
        pytest.skip("the compiled extension is not built")
    from torch.func import functionalize
    q, x = _tensor((1, 3, 2, 8), "float32", 14), _tensor((3, 8), "float32", 15)
    before, version = (q.clone(), x.clone()), (q._version, x._version)

    def step(positions, table):
        positions, table = positions * 1, table * 1
        with pytest.raises(TypeError, match=r"^positions is a torch tensor without memory"):
            fastpe.apply_rope(q, None, positions, layout="bshd")
        with pytest.raises(TypeError, match=r"^table is a torch tensor without memory"):
            fastpe.add_learned(x, table)
        return positions

    with fastpe.use_backend(backend):
        functionalize(step)(torch.arange(3), _tensor((16, 8), "float32", 16))
    assert torch.equal(q, before[0]) and torch.equal(x, before[1])
    assert (q._version, x._version) == version


class _CopyingNumpy(torch.Tensor):
    """A subclass whose numpy() (through __torch_function__) answers with a copy."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        out = super().__torch_function__(func, types, args, kwargs or {})
        return out.copy() if getattr(func, "__name__", "") == "numpy" else out


@pytest.mark.parametrize("backend", ["cython", "numpy"])
@pytest.mark.parametrize("entry", [e for e in _entries() if not e.endswith("ndarray q")
                                   and "memoryview" not in e])
def test_a_subclass_whose_numpy_is_a_copy_is_refused_not_written_to_it(entry, backend):
    """A tensor subclass whose NumPy conversion is not its memory: refused by name, the
    tensor and its version as they were (fastpe wrote the copy and returned, the tensor
    unchanged); its plain twin is written (add_learned's table is zeros)."""
    if backend == "cython" and not fastpe._backend.compiled:
        pytest.skip("the compiled extension is not built")
    call = _entries()[entry]
    q = _tensor((1, 3, 2, 8), "float32", 17).as_subclass(_CopyingNumpy)
    k = _tensor((1, 3, 2, 8), "float32", 18)
    before, version = q.as_subclass(torch.Tensor).clone(), q._version
    with fastpe.use_backend(backend), pytest.raises(
            TypeError, match=r"^(q|x|scores|out) is a torch tensor subclass \(_CopyingNumpy\) "
                             r"whose NumPy conversion is not its memory"):
        call(q, k, True)
    assert torch.equal(q.as_subclass(torch.Tensor), before) and q._version == version
    plain = before.clone()
    with fastpe.use_backend(backend):
        call(plain, k.clone(), True)
    assert torch.equal(plain, before) == (entry == "add_learned")


_INT_ARGS = {
    "apply_rope offset": lambda n, q: fastpe.apply_rope(q, offset=n, layout="bshd"),
    "RotaryEmbedding offset": lambda n, q: fastpe.RotaryEmbedding(8)(q, offset=n,
                                                                    layout="bshd"),
    "add_sinusoidal offset": lambda n, q: fastpe.add_sinusoidal(q[0, :, 0], offset=n),
    "add_alibi q_offset": lambda n, q: fastpe.add_alibi(q, q_offset=n),
    "add_relative_bias q_offset": lambda n, q: fastpe.add_relative_bias(
        q, torch.ones(32, 3), q_offset=n),
    "sinusoidal_table length": lambda n, q: fastpe.sinusoidal_table(n, 8, out=q[0, :1, 0]),
}


@pytest.mark.parametrize("backend", ["cython", "numpy"])
@pytest.mark.parametrize("arg", list(_INT_ARGS))
def test_integer_arguments_take_0d_integer_tensors_only(arg, backend):
    """An int argument takes a 0-d integer tensor as its value, as it takes NumPy's 0-d
    integer array; a bool tensor and a one-element tensor of more dimensions, which
    torch's __index__ takes but NumPy refuses for its arrays, are TypeErrors naming the
    argument, the written tensor left as it was."""
    if backend == "cython" and not fastpe._backend.compiled:
        pytest.skip("the compiled extension is not built")
    call = _INT_ARGS[arg]
    name = arg.split()[-1]
    with fastpe.use_backend(backend):
        for bad in (torch.tensor(True), torch.tensor([1]), torch.tensor([[1]])):
            q = _tensor((1, 3, 2, 8), "float32", 17)
            before, version = q.clone(), q._version
            with pytest.raises(TypeError, match=f"^{name} must be an int, got a "):
                call(bad, q)
            assert torch.equal(q, before) and q._version == version
        q, twin = _tensor((1, 3, 2, 8), "float32", 17), _tensor((1, 3, 2, 8), "float32", 17)
        call(torch.tensor(1), q)
        call(1, twin)
        assert torch.equal(q, twin)


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
@pytest.mark.filterwarnings("ignore:`torch.jit.trace` is deprecated")
@pytest.mark.parametrize("backend", ["cython", "numpy"])
@pytest.mark.parametrize("trace", ["torch.jit.trace", "make_fx"])
@pytest.mark.parametrize("entry", list(_entries()))
def test_a_trace_of_a_call_is_refused_not_recorded_without_it(entry, trace, backend):
    """A trace records torch's operations, not fastpe's C call on the tensors' memory:
    torch.jit.trace (and the ONNX exporter built on it) would replay its graph without
    the call, make_fx's graph would not hold it. Every entry refuses its first tensor by
    name inside one, the tensors left as they were, their versions too."""
    if backend == "cython" and not fastpe._backend.compiled:
        pytest.skip("the compiled extension is not built")
    from torch.fx.experimental.proxy_tensor import make_fx
    call = _entries()[entry]
    q, k = _tensor((1, 3, 2, 8), "float32", 18), _tensor((1, 3, 2, 8), "float32", 19)
    before, version = (q.clone(), k.clone()), (q._version, k._version)

    def step(q, k):
        call(q, k, True)
        return q * 1

    how = r"torch\.jit\.trace" if trace == "torch.jit.trace" else r"torch\.export or make_fx"
    with fastpe.use_backend(backend), pytest.raises(
            RuntimeError, match=rf"^\w+ is a torch tensor inside {how}"):
        if trace == "torch.jit.trace":
            torch.jit.trace(step, (q, k), check_trace=False)
        else:
            make_fx(step)(q, k)
    assert torch.equal(q, before[0]) and torch.equal(k, before[1])
    assert (q._version, k._version) == version


_COMPILED_CALLS = """
import sys, numpy as np
{first}
import torch
cos, sin = fastpe.rope_cos_sin(np.arange(8), fastpe.rope_frequencies(64))
ct, st = torch.from_numpy(np.asarray(cos)), torch.from_numpy(np.asarray(sin))
calls = {{
    "RotaryEmbedding": lambda q, k: fastpe.RotaryEmbedding(64)(q, k, layout="bshd", offset=3),
    "apply_rope_cached": lambda q, k: fastpe.apply_rope_cached(q, k, ct, st, layout="bshd"),
    "add_alibi": lambda q, k: fastpe.add_alibi(q),
}}
args = (torch.randn(1, 8, 4, 64), torch.randn(1, 8, 2, 64))
bad = []
for name, call in calls.items():
    def step(q, k):
        q, k = q * 1, k * 1
        call(q, k)
        return q + 0, k + 0
    for backend in ("cython", "numpy"):
        with fastpe.use_backend(backend):
            want = step(*args)
            torch._dynamo.reset()
            try:
                got = torch.compile(step, backend="eager")(*args)
                if not all(torch.allclose(a, b, atol=1e-6) for a, b in zip(got, want)):
                    bad.append(f"{{name}} {{backend}}: other numbers")
            except Exception as exc:
                bad.append(f"{{name}} {{backend}}: {{type(exc).__name__}} {{exc}}"[:300])
print(bad)
"""


@pytest.mark.parametrize("first", ["import fastpe", "import torch._dynamo, fastpe"])
def test_calls_inside_a_compiled_function_run_between_its_graphs(first):
    """torch.compile's tracer (TorchDynamo) rewrites the NumPy it meets into torch
    operations on copies: fastpe's Python, traced, wrote into those (apply_rope_cached
    on the NumPy backend: other numbers, silently) or failed inside dynamo. fastpe is in
    dynamo's skip list, added when dynamo loads (fastpe imported first) or at fastpe's
    import (dynamo loaded first), so its calls run as written, between the graphs, with
    the numbers of the same calls uncompiled."""
    pytest.importorskip("torch._dynamo")
    proc = run_python(_COMPILED_CALLS.format(first=first), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]", proc.stdout[-3000:]


@pytest.mark.parametrize("backend", ["cython", "numpy"])
def test_a_models_inv_freq_tensor_is_taken_as_freqs(backend):
    """A bare torch tensor of inverse frequencies (a rotary module's inv_freq buffer)
    rotates as the same frequencies as an ndarray, and rope_cos_sin takes it too."""
    if backend == "cython" and not fastpe._backend.compiled:
        pytest.skip("the compiled extension is not built")
    inv = torch.from_numpy(fastpe.rope_frequencies(16).inv_freq.astype(np.float32))
    q = _tensor((1, 5, 2, 16), "float32", 21)
    want = q.clone()
    with fastpe.use_backend(backend):
        fastpe.apply_rope(want, positions=torch.arange(5), freqs=inv.numpy(), layout="bshd")
        fastpe.apply_rope(q, positions=torch.arange(5), freqs=inv, layout="bshd")
        assert torch.equal(q, want)
        for got, expected in zip(fastpe.rope_cos_sin(np.arange(5), inv),
                                 fastpe.rope_cos_sin(np.arange(5), inv.numpy())):
            np.testing.assert_array_equal(got, expected)
        with pytest.raises(TypeError, match=r"^freqs is a torch tensor that requires grad.*"
                                             r"pass freqs\.detach\(\)"):
            fastpe.apply_rope(q, positions=torch.arange(5), layout="bshd",
                              freqs=inv.clone().requires_grad_(True))
        assert torch.equal(q, want)
