"""Arrays that are not NumPy's: written in place through DLPack or the buffer
protocol, never through a silent copy; and torch's OpenMP runtime beside ours."""

import array
import threading

import numpy as np
import pytest

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


@pytest.mark.parametrize("kind, why", [("requires_grad", "require gradient"),
                                       ("bfloat16", "Unsupported dtype")])
def test_torch_tensors_that_cannot_be_shared_are_refused(torch, kind, why):
    if kind == "requires_grad":
        q = torch.zeros(1, 4, 2, 8, requires_grad=True)
    else:
        q = torch.zeros(1, 4, 2, 8, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match=why):
        fastpe.apply_rope(q)


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
