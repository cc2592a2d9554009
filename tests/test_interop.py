"""Arrays that are not NumPy's: written in place through DLPack or the buffer
protocol, never through a silent copy; and torch's OpenMP runtime beside ours."""

import array
import importlib.util
import threading

import numpy as np
import pytest
from conftest import run_python

import fastpe


def test_buffer_protocol_object_is_written_in_place():
    buf = array.array("f", [0.0] * (3 * 4))
    view = np.frombuffer(buf, dtype=np.float32).reshape(3, 4)  # shares buf's memory
    fastpe.add_sinusoidal(memoryview(buf).cast("B").cast("f", (3, 4)))
    assert np.array_equal(view, fastpe.sinusoidal_table(3, 4))


def test_read_only_buffer_is_refused_not_copied():
    data = np.zeros((3, 4), np.float32).tobytes()
    with pytest.raises(TypeError, match="x is read-only"):
        fastpe.add_sinusoidal(memoryview(data).cast("f", (3, 4)))


def test_object_without_a_shareable_buffer_is_refused():
    with pytest.raises(TypeError, match=r"q must be a numpy\.ndarray, or an array exposing DLPack"):
        fastpe.apply_rope([[[[1.0, 2.0]]]])


@pytest.fixture
def torch():
    return pytest.importorskip("torch", reason="torch interop needs torch")


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_torch_tensors_rotate_in_place(torch, layout):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 16, 4, 64, generator=gen)
    k = torch.randn(2, 16, 2, 64, generator=gen).transpose(1, 2).contiguous().transpose(1, 2)
    if layout == "bhsd":
        q, k = q.transpose(1, 2), k.transpose(1, 2)
    expect_q, expect_k = q.numpy().copy(), k.numpy().copy()
    fastpe.reference.apply_rope(expect_q, expect_k, layout=layout)
    out_q, out_k = fastpe.apply_rope(q, k, layout=layout)
    assert out_q is q and out_k is k  # the caller's tensors, not copies
    np.testing.assert_allclose(q.numpy(), expect_q, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(k.numpy(), expect_k, rtol=1e-6, atol=1e-6)


def test_torch_out_buffer_is_filled_and_returned(torch):
    out = torch.empty(10, 6, dtype=torch.float64)
    assert fastpe.sinusoidal_table(10, 6, out=out) is out
    np.testing.assert_allclose(out.numpy(), fastpe.reference.sinusoidal_table(10, 6, dtype="float64"))


def test_torch_tensors_that_cannot_be_shared_are_refused(torch):
    q = torch.zeros(1, 4, 2, 8, requires_grad=True)
    with pytest.raises(TypeError, match=r"\bq\b.*requires grad"):
        fastpe.apply_rope(q, layout="bshd")


def test_two_openmp_runtimes_in_one_process(torch):
    """torch brings its own OpenMP runtime; both must run threaded side by side."""
    torch.set_num_threads(2)
    a = torch.randn(512, 512)
    x = np.random.default_rng(0).standard_normal((8, 1024, 256)).astype(np.float32)
    expect = x.copy()
    fastpe.reference.add_sinusoidal(expect)
    errors = []

    def torch_work():
        try:
            for _ in range(20):
                a @ a
        except Exception as exc:  # pragma: no cover - only on failure
            errors.append(exc)

    t = threading.Thread(target=torch_work)
    t.start()
    fastpe.add_sinusoidal(x, num_threads=2)
    (a @ a).sum()
    t.join()
    assert not errors
    np.testing.assert_allclose(x, expect, rtol=1e-6, atol=1e-6)


# ---- torch views, autograd, tensors as read inputs --------------------------------------------


def _rope_q(torch):
    return torch.randn(1, 6, 2, 8, generator=torch.Generator().manual_seed(1))


# every function that writes a tensor in place: (name, call on the tensor)
WRITERS = {
    "add_sinusoidal": (lambda t: t.zeros(3, 6, 8), lambda x: fastpe.add_sinusoidal(x)),
    "sinusoidal_table": (lambda t: t.zeros(6, 8), lambda x: fastpe.sinusoidal_table(6, 8, out=x)),
    "add_learned": (lambda t: t.zeros(3, 6, 8),
                    lambda x: fastpe.add_learned(x, np.ones((6, 8), np.float32))),
    "apply_rope": (_rope_q, lambda x: fastpe.apply_rope(x, layout="bshd")),
    "apply_rope_cached": (_rope_q, lambda x: fastpe.apply_rope_cached(
        x, None, *fastpe.rope_cos_sin(np.arange(6), fastpe.rope_frequencies(8)),
        layout="bshd")),
    "RotaryEmbedding": (_rope_q, lambda x: fastpe.RotaryEmbedding(8)(x, layout="bshd")),
    "add_alibi": (lambda t: t.zeros(2, 3, 4, 6), lambda x: fastpe.add_alibi(x)),
    "alibi_bias": (lambda t: t.zeros(3, 4, 6), lambda x: fastpe.alibi_bias(3, 4, 6, out=x)),
}


@pytest.mark.parametrize("name", WRITERS)
def test_negative_bit_views_are_refused(torch, name):
    """x.conj().imag of a complex tensor is a real view whose memory holds -x.imag; writing
    it as if it held its values would store the wrong sign."""
    make, call = WRITERS[name]
    shape = make(torch).shape
    base = torch.zeros(*shape, dtype=torch.complex64)
    view = base.conj().imag
    assert view.is_neg()
    with pytest.raises(TypeError, match=r"negative or conjugate bit"):
        call(view)
    assert not base.imag.any() and not base.real.any()


@pytest.mark.parametrize("name", WRITERS)
def test_in_place_writes_bump_the_version_counter(torch, name):
    """A tensor saved for backward and then written by fastpe makes backward raise, as
    torch's own in-place operations do; without the bump the gradient would silently use
    the new values."""
    make, call = WRITERS[name]
    x = make(torch) + 0.5
    w = torch.ones_like(x, requires_grad=True)
    loss = (x * w).sum()                  # saves x for the gradient of w
    before = x._version
    call(x)
    assert x._version > before
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_writes_through_detach_bump_the_original_too(torch):
    """detach() shares the version counter: writing the detached tensor is seen by
    the graph that saved the original."""
    x = torch.zeros(3, 6, 8) + 0.5
    w = torch.ones_like(x, requires_grad=True)
    loss = (x * w).sum()
    fastpe.add_sinusoidal(x.detach())
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


@pytest.mark.parametrize("arg", ["table", "cos", "slopes"])
def test_read_inputs_that_require_grad_are_refused_by_name(torch, arg):
    """fastpe's result would not carry their gradient: a TypeError naming the argument,
    not torch's RuntimeError."""
    x = np.zeros((1, 6, 8), np.float32)
    q = np.zeros((1, 6, 2, 8), np.float32)
    grad = {"table": torch.ones(6, 8, requires_grad=True),
            "cos": torch.ones(6, 4, requires_grad=True),
            "slopes": torch.ones(3, dtype=torch.float64, requires_grad=True)}[arg]
    call = {"table": lambda: fastpe.add_learned(x, grad),
            "cos": lambda: fastpe.apply_rope_cached(q, None, grad, np.ones((6, 4), np.float32)),
            "slopes": lambda: fastpe.add_alibi(np.zeros((3, 4, 6)), slopes=grad)}[arg]
    with pytest.raises(TypeError, match=rf"\b{arg}\b.*requires grad.*detach"):
        call()
    assert not x.any() and not q.any()


def test_read_inputs_with_negative_bit_are_read_as_their_values(torch):
    """A lazily negated table is resolved when read (a copy): x gets -values, as torch
    itself would add it."""
    values = torch.randn(6, 8, dtype=torch.complex64, generator=torch.Generator().manual_seed(2))
    table = values.conj().imag
    assert table.is_neg()
    x = np.zeros((1, 6, 8), np.float32)
    fastpe.add_learned(x, table)
    np.testing.assert_array_equal(x[0], -values.imag.numpy())


def test_positions_on_another_device_are_refused_by_name(torch):
    q = np.zeros((1, 4, 2, 8))
    with pytest.raises(TypeError, match=r"\bpositions\b.*device 'meta'"):
        fastpe.apply_rope(q, None, torch.arange(4, device="meta"))
    assert not q.any()


def test_tensor_inputs_sharing_memory_with_the_output_are_refused(torch):
    """The overlap check sees through tensors: a table that is x's own storage, slopes
    that are a row of the scores."""
    buf = torch.zeros(12, 8)
    with pytest.raises(ValueError, match=r"table overlaps x"):
        fastpe.add_learned(buf[None, :4], buf)
    assert not buf.any()
    scores = torch.full((3, 4, 6), 0.25, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"slopes overlaps scores"):
        fastpe.add_alibi(scores, slopes=scores[0, 0, :3])
    assert (scores == 0.25).all()


def test_bfloat16_without_importing_ml_dtypes_at_import():
    """ml_dtypes' import takes most of a second: `import fastpe` leaves it alone, and
    bfloat16 still works wherever it arrives: the dtype by name, an array of the
    caller's ml_dtypes imported after fastpe (compiled kernels included, against the
    float32 arithmetic rounded once), and a bfloat16 torch tensor."""
    pytest.importorskip("ml_dtypes")
    code = """
        import sys
        import numpy as np
        import fastpe
        assert "ml_dtypes" not in sys.modules, "imported by import fastpe"
        assert fastpe.info()["bfloat16"]
        t = fastpe.sinusoidal_table(6, 8, dtype="bfloat16")
        want = fastpe.sinusoidal_table(6, 8, dtype="float64").astype(t.dtype)
        assert str(t.dtype) == "bfloat16" and np.array_equal(t, want)
        import ml_dtypes
        x = np.zeros((3, 5, 8), ml_dtypes.bfloat16)
        for _ in range(2):  # the first call registers the dtype, the second is compiled
            x[:] = 0
            fastpe.add_sinusoidal(x)
            assert np.array_equal(x[1], want[:5])
        try:
            import torch
        except ImportError:
            print("ok, no torch")
            raise SystemExit
        q = torch.ones(1, 4, 2, 8, dtype=torch.bfloat16)
        fastpe.apply_rope(q, layout="bshd")
        r = np.ones((1, 4, 2, 8), np.float32)
        fastpe.apply_rope(r)
        assert np.array_equal(q.float().numpy(), r.astype(ml_dtypes.bfloat16).astype(np.float32))
        print("ok")
    """
    fresh = """
        import sys, torch, fastpe
        q = torch.ones(1, 4, 2, 8, dtype=torch.bfloat16)
        fastpe.apply_rope(q, layout="bshd")
        assert "ml_dtypes" in sys.modules
        print("ok")
    """
    for c in (code, fresh):
        if c is fresh and importlib.util.find_spec("torch") is None:
            continue
        r = run_python(c)
        assert r.returncode == 0 and r.stdout.startswith("ok"), r.stderr
