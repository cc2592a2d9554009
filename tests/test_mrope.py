"""Multi-axis RoPE: M-RoPE (Qwen2-VL and successors) and 2D vision RoPE.

Truths, independent of the code under test:
- ``rotate_axes`` below: a float64 rotation written from the M-RoPE formula (Qwen2-VL,
  Wang et al. 2024, section 2.1): frequency pair j of a token rotates by
  ``position[axis(j)] * w_j``, with explicit pair indices and np.cos / np.sin;
- the axis of every pair written out by hand for the published layouts (Qwen2-VL's
  contiguous sections, Qwen3-VL's interleaved ones);
- ``fastpe.reference`` (the NumPy backend) for "compiled == reference";
- properties: text positions (one per token) are plain RoPE on every axis, bit for bit;
  shifting each axis by its own constant keeps every q.k product (relative positions);
  ``inverse`` undoes the rotation.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import rope_oracle as oracle
from conftest import (
    COMPILED,
    F32,
    F64,
    FLOAT_DTYPES,
    ISA_NAMES,
    angle_atol,
    as_f64,
    assert_bytes_equal,
    assert_close,
    entry_callers,
    run_python,
    snapshot,
    tolerance,
)
from test_rope import bshd, make, shape_for

import fastpe

LAYOUTS = ("bshd", "bhsd", "shd")
B, S, HQ, HK, D = 2, 45, 3, 2, 32   # 45 tokens: a full 32-token block and a partial one
SECTIONS = [4, 6, 6]                # Qwen2-VL's [16, 24, 24] at a quarter of the width


def vl_positions(batch, seq, axes=3, seed=0):
    """(axes, batch, seq) positions shaped like a vision-language prompt: text (every
    axis equal, consecutive), an image grid (axis 0 constant, the others row and column),
    text again from max + 1, and a far jump, so the angle recurrence of text runs, its
    reseeds and the per-token angles of image tokens all run."""
    rng = np.random.default_rng([seed, batch, seq, axes])
    out = np.empty((axes, batch, seq), np.int64)
    for b in range(batch):
        start = int(rng.integers(0, 50))
        n_text = int(rng.integers(3, 9))
        rows, cols = 3, 4
        col = []
        for i in range(n_text):
            col.append([start + i] * axes)
        base = start + n_text
        for r in range(rows):
            for c in range(cols):
                p = [base] * axes
                p[-2], p[-1] = base + r, base + c
                col.append(p)
        nxt = base + max(rows, cols)
        while len(col) < seq:
            col.append([nxt] * axes)
            nxt += 1 if len(col) != seq - 5 else 3000
        out[:, b, :] = np.array(col[:seq]).T
    return out


def rotate_axes(x, positions, inv_freq, pair_axis, *, style="neox", inverse=False):
    """M-RoPE of x (batch, seq, heads, head_dim) as a new float64 array: pair j rotates by
    positions[pair_axis[j]] * inv_freq[j]; positions (axes, batch or 1, seq)."""
    x = as_f64(x)
    batch, seq = x.shape[:2]
    pos = np.broadcast_to(np.asarray(positions), (positions.shape[0], batch, seq))
    out = x.copy()
    first, second = oracle.pair_indices(2 * len(inv_freq), style)
    for j, (w, ax) in enumerate(zip(inv_freq, pair_axis)):
        ang = pos[ax].astype(np.float64) * w                  # (batch, seq)
        c, s = np.cos(ang)[:, :, None], np.sin(ang)[:, :, None]
        if inverse:
            s = -s
        a, b = x[..., first[j]], x[..., second[j]]
        out[..., first[j]] = a * c - b * s
        out[..., second[j]] = b * c + a * s
    return out


def check(actual, expected, dtype, positions, context):
    mag = max(float(np.abs(expected).max()), 1.0) * np.sqrt(2)
    atol, rtol = tolerance(dtype, mag)
    atol += angle_atol(float(np.max(positions))) * mag
    assert_close(actual, expected, dtype, atol=atol, rtol=rtol, context=context)


def inv_freq(dim, base=10000.0):
    return np.float64(base) ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)


# ---- the layouts of pairs ----------------------------------------------------------------


def test_contiguous_sections_are_qwen2_vl_layout():
    rope = fastpe.RotaryEmbedding(128, base=1e6, mrope_section=[16, 24, 24])
    assert rope.axes == 3
    assert rope._pair_axis.tolist() == [0] * 16 + [1] * 24 + [2] * 24


def test_interleaved_sections_are_qwen3_vl_layout():
    """Qwen3-VL: T H W T H W ... while each axis has pairs left, then T to the end."""
    rope = fastpe.RotaryEmbedding(128, base=5e6, mrope_section=[24, 20, 20],
                                  mrope_interleaved=True)
    expected = [0, 1, 2] * 20 + [0] * 4
    assert rope._pair_axis.tolist() == expected
    # Qwen3.5: [11, 11, 10] over 32 pairs: the last W is at pair 29
    r35 = fastpe.RotaryEmbedding(256, rotary_dim=64, base=1e7, mrope_section=[11, 11, 10],
                                 mrope_interleaved=True)
    assert r35._pair_axis.tolist() == [0, 1, 2] * 10 + [0, 1]


# ---- rotation against the float64 formula and the reference backend --------------------

KINDS = ("contiguous", "transposed", "strided-last", "reversed", "byteswapped")


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("interleaved", [False, True], ids=["contiguous", "interleaved"])
def test_matches_formula_and_reference(layout, kind, dtype, interleaved, both_threads):
    batch = 1 if layout == "shd" else B
    style = "gptj" if interleaved else "neox"
    rope = fastpe.RotaryEmbedding(D, base=10000.0, mrope_section=SECTIONS,
                                  mrope_interleaved=interleaved, style=style)
    pos = vl_positions(batch, S)
    q0 = make(kind, shape_for(layout, batch, S, HQ, D), dtype, seed=1)
    k0 = make(kind, shape_for(layout, batch, S, HK, D), dtype, seed=2)
    expect_q = rotate_axes(bshd(q0, layout), pos, inv_freq(D), rope._pair_axis, style=style)
    expect_k = rotate_axes(bshd(k0, layout), pos, inv_freq(D), rope._pair_axis, style=style)
    arg = pos[:, 0] if layout == "shd" else pos
    results = {}
    for backend in ("numpy", "cython") if COMPILED else ("numpy",):
        q, k = make(kind, q0.shape, dtype, seed=1), make(kind, k0.shape, dtype, seed=2)
        with fastpe.use_backend(backend):
            out = rope(q, k, arg, layout=layout, num_threads=both_threads)
        assert out[0] is q and out[1] is k
        ctx = f"{backend} {layout} {kind} {dtype} interleaved={interleaved}"
        check(bshd(q, layout), expect_q, dtype, pos, ctx + " q")
        check(bshd(k, layout), expect_k, dtype, pos, ctx + " k")
        results[backend] = q


@pytest.mark.parametrize("dtype", [F32, F64], ids=str)
def test_thread_counts_give_identical_bits(dtype, threaded):
    rope = fastpe.RotaryEmbedding(D, mrope_section=SECTIONS)
    pos = vl_positions(3, 200, seed=4)
    outs = []
    for n in (1, 2, 3):
        q = make("contiguous", (3, 200, HQ, D), dtype, seed=5)
        rope(q, None, pos, num_threads=n)
        outs.append(q)
    for other in outs[1:]:
        assert_bytes_equal(other, outs[0], f"{dtype} threads")


@pytest.mark.skipif(not COMPILED, reason="bit identity with the compiled one-axis kernel")
@pytest.mark.parametrize("dtype", [F32, F64], ids=str)
def test_text_positions_are_plain_rope_bit_for_bit(dtype):
    """(seq,), (batch, seq), and per-axis positions that agree on every axis all give
    exactly the one-axis embedding's values."""
    plain = fastpe.RotaryEmbedding(D, base=500.0)
    mrope = fastpe.RotaryEmbedding(D, base=500.0, mrope_section=SECTIONS)
    text = np.stack([np.arange(S) + 7, np.arange(S) * 2]).astype(np.int64)
    q_plain = make("contiguous", (B, S, HQ, D), dtype, seed=3)
    plain(q_plain, None, text)
    for form in (text, np.broadcast_to(text, (3, B, S)).copy()):
        q = make("contiguous", (B, S, HQ, D), dtype, seed=3)
        mrope(q, None, form)
        assert_bytes_equal(q, q_plain, f"{np.shape(form)}")
    q = make("contiguous", (1, S, HQ, D), dtype, seed=3)
    q_none = q.copy()
    mrope(q, None, np.arange(S) + 4)
    plain(q_none, None, offset=4)
    assert_bytes_equal(q, q_none, "offset")
    # decode rows, one token a sequence (one-axis rows take their sines and cosines in
    # float32 there): every axis at the sequence's position, and the same positions
    # given once
    last = np.array([[40], [9], [1 << 19]], np.int64)
    q_plain = make("contiguous", (3, 1, HQ, D), dtype, seed=5)
    q = q_plain.copy()
    plain(q_plain, None, last)
    mrope(q, None, np.broadcast_to(last, (3, 3, 1)).copy())
    assert_bytes_equal(q, q_plain, "decode rows")


def test_float32_decode_rows_turn_by_cos_sin_within_1_5e7_of_exact():
    """Multi-axis decode rows (one token a sequence, each axis at its own position up to
    2**20) turn each pair by the cos and sin of its own axis's angle within 1.5e-7 of the
    exact values, read off by turning unit pairs: (1, 0) -> (cos, sin)."""
    mrope = fastpe.RotaryEmbedding(128, base=1e6, mrope_section=[16, 24, 24])
    half = 64
    pos = np.random.default_rng(7).integers(0, (1 << 20) + 1, (3, 200, 1))
    pos[:, :3, 0] = [[0, 1 << 20, 5], [0, 3, 1 << 20], [0, 7, 999_999]]
    q = np.zeros((200, 1, 1, 128), F32)
    q[..., :half] = 1.0
    mrope(q, None, pos)
    per_pair = pos[:, :, 0][mrope._pair_axis].T          # (tokens, half)
    w = mrope.frequencies().inv_freq
    angles_c = np.empty(per_pair.shape)
    angles_s = np.empty(per_pair.shape)
    for i in range(half):
        c_i, s_i = oracle.exact_cos_sin(per_pair[:, i], w[i:i + 1])
        angles_c[:, i], angles_s[:, i] = c_i[:, 0], s_i[:, 0]
    for part, got, want in (("cos", q[:, 0, 0, :half], angles_c),
                            ("sin", q[:, 0, 0, half:], angles_s)):
        err = np.abs(got.astype(F64) - want)
        assert err.max() <= 1.5e-7, (
            f"{part}: error {err.max():.3g} at {np.unravel_index(err.argmax(), err.shape)}")


def test_shifting_each_axis_keeps_dot_products():
    """Relative: adding a constant per axis to every token's positions changes no q.k."""
    rope = fastpe.RotaryEmbedding(D, mrope_section=SECTIONS)
    pos = vl_positions(1, S, seed=7)
    q0 = make("contiguous", (1, S, 1, D), F64, seed=8)
    k0 = make("contiguous", (1, S, 1, D), F64, seed=9)
    q1, k1 = q0.copy(), k0.copy()
    rope(q1, k1, pos)
    q2, k2 = q0.copy(), k0.copy()
    rope(q2, k2, pos + np.array([5, 300, 41])[:, None, None])
    dots1 = np.einsum("bqhd,bkhd->bhqk", q1, k1)
    dots2 = np.einsum("bqhd,bkhd->bhqk", q2, k2)
    np.testing.assert_allclose(dots2, dots1, rtol=0, atol=1e-11)


@pytest.mark.parametrize("backend", ["numpy", "cython"])
def test_inverse_undoes(backend):
    if backend == "cython" and not COMPILED:
        pytest.skip("no compiled backend")
    rope = fastpe.RotaryEmbedding(D, mrope_section=SECTIONS, mrope_interleaved=True)
    pos = vl_positions(B, S, seed=2)
    q0 = make("contiguous", (B, S, HQ, D), F64, seed=1)
    q = q0.copy()
    with fastpe.use_backend(backend):
        rope(q, None, pos)
        assert not np.allclose(q, q0)
        rope(q, None, pos, inverse=True)
    np.testing.assert_allclose(q, q0, rtol=0, atol=1e-12)


def test_positions_shared_by_the_batch_and_per_sequence():
    """(axes, seq) == (axes, 1, seq) broadcast over the batch == (axes, batch, seq) tiled."""
    rope = fastpe.RotaryEmbedding(D, mrope_section=SECTIONS)
    pos = vl_positions(1, S, seed=3)
    outs = []
    for form in (pos[:, 0], pos, np.repeat(pos, 2, axis=1)):
        q = make("contiguous", (2, S, HQ, D), F32, seed=4)
        rope(q, None, form)
        outs.append(q)
    for q in outs[1:]:
        assert_bytes_equal(q, outs[0])


@pytest.mark.parametrize("backend", ["numpy", "cython"])
@pytest.mark.parametrize("rows", [1, 2])
def test_one_row_of_positions_is_read_by_every_axis(backend, rows):
    """(1, rows, seq) is what Qwen2-VL's and Qwen3-VL's rotary modules broadcast to their
    three axes (position_ids[:, :, None, :] against inv_freq expanded to 3 rows): the
    same as that row given to each axis, bit for bit."""
    if backend == "cython" and not COMPILED:
        pytest.skip("no compiled backend")
    rope = fastpe.RotaryEmbedding(D, mrope_section=SECTIONS, mrope_interleaved=True)
    row = np.random.default_rng(5).integers(0, 1000, (1, rows, S))
    outs = []
    with fastpe.use_backend(backend):
        for form in (row, np.repeat(row, 3, axis=0)):
            q = make("contiguous", (2, S, HQ, D), F32, seed=4)
            k = make("contiguous", (2, S, HK, D), F32, seed=5)
            rope(q, k, form)
            outs.append((q, k))
    assert_bytes_equal(outs[0][0], outs[1][0])
    assert_bytes_equal(outs[0][1], outs[1][1])


def test_one_row_of_real_positions_is_read_by_every_axis():
    rope = fastpe.RotaryEmbedding(D, mrope_section=SECTIONS)
    row = np.random.default_rng(6).uniform(-50, 50, (1, 2, S))
    outs = []
    for form in (row, row[0]):
        q = make("contiguous", (2, S, HQ, D), F64, seed=4)
        rope(q, None, form)
        outs.append(q)
    assert_bytes_equal(outs[0], outs[1])


def test_cos_sin_of_multi_axis_positions():
    rope = fastpe.RotaryEmbedding(D, mrope_section=SECTIONS)
    pos = vl_positions(1, S, seed=3)[:, 0]
    cos, sin = rope.cos_sin(pos, dtype="float64")
    ax = rope._pair_axis
    ang = pos[ax].T.astype(np.float64) * inv_freq(D)
    np.testing.assert_allclose(cos, np.cos(ang), rtol=0, atol=1e-12)
    np.testing.assert_allclose(sin, np.sin(ang), rtol=0, atol=1e-12)


@pytest.mark.parametrize("seq", [1, 2, 3, 4])
def test_cos_sin_of_text_positions_gives_every_axis_the_same(seq):
    """(seq,) positions are text positions for cos_sin as for a call: a row per token,
    also where seq equals the axes (3), which was read as one token's (t, h, w)."""
    rope = fastpe.RotaryEmbedding(D, mrope_section=SECTIONS)
    pos = np.arange(5, 5 + seq)
    cos, sin = rope.cos_sin(pos, dtype="float64")
    assert cos.shape == sin.shape == (seq, D // 2)
    ang = pos[:, None].astype(np.float64) * inv_freq(D)
    np.testing.assert_allclose(cos, np.cos(ang), rtol=0, atol=1e-12)
    np.testing.assert_allclose(sin, np.sin(ang), rtol=0, atol=1e-12)


# ---- refusals: a clear error naming the argument, nothing written ----------------------

BAD = [
    ("axes-mismatch", dict(axes=2, mrope_section=[4, 6, 6]), None, ValueError, "axes=2"),
    ("sections-sum", dict(mrope_section=[4, 6, 5]), None, ValueError, "add up to"),
    ("sections-type", dict(mrope_section=12), None, TypeError, "mrope_section"),
    ("negative-section", dict(mrope_section=[4, -1, 13]), None, ValueError, "mrope_section"),
    ("axes-without-sections", dict(axes=3), None, ValueError, "mrope_section"),
    ("axes-array", dict(axes=np.array([1, 2]), mrope_section=[4, 6, 6]), None, TypeError,
     "axes must be an int"),
    ("interleaved-alone", dict(mrope_interleaved=True), None, ValueError, "mrope_section"),
]


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_constructor_arguments(case):
    _, kw, _, exc, match = case
    with pytest.raises(exc, match=match):
        fastpe.RotaryEmbedding(D, **kw)


BAD_POSITIONS = [
    ("wrong-axes", lambda p: p[:2], "positions must have shape"),
    ("wrong-seq", lambda p: p[:, :, :-1], "positions must have shape"),
    ("wrong-batch", lambda p: p[:, :2], "positions must have shape"),
    ("four-d", lambda p: p[None], "positions must have shape"),
    ("negative", lambda p: p - 10, "positions must be >= 0"),
    ("float-nan", lambda p: np.where(p == p.max(), np.nan, p), "must be finite"),
    ("ambiguous-2d", lambda p: np.zeros((3, S), np.int64), "read both as"),
]


@pytest.mark.parametrize("backend", ["numpy", "cython"])
@pytest.mark.parametrize("case", BAD_POSITIONS, ids=[c[0] for c in BAD_POSITIONS])
def test_bad_positions_leave_buffers_unchanged(case, backend):
    if backend == "cython" and not COMPILED:
        pytest.skip("no compiled backend")
    _, change, match = case
    rope = fastpe.RotaryEmbedding(D, mrope_section=SECTIONS)
    batch = 3  # batch == axes: the ambiguous 2-D form exists
    pos = vl_positions(batch, S, seed=1)
    q = make("contiguous", (batch, S, HQ, D), F32, seed=1)
    k = make("contiguous", (batch, S, HK, D), F32, seed=2)
    before = snapshot(q), snapshot(k)
    exc = TypeError if "integers" in match else ValueError
    with fastpe.use_backend(backend), pytest.raises(exc, match=match):
        rope(q, k, change(pos))
    assert (snapshot(q), snapshot(k)) == before


def test_positions_and_offset_together_are_refused():
    rope = fastpe.RotaryEmbedding(D, mrope_section=SECTIONS)
    q = make("contiguous", (1, S, HQ, D), F32, seed=1)
    before = snapshot(q)
    with pytest.raises(ValueError, match="offset"):
        rope(q, None, vl_positions(1, S), offset=3)
    assert snapshot(q) == before


# ---- from_hf_config never runs a multi-axis model as one-axis RoPE ---------------------

UNSUPPORTED = [
    {"model_type": "some_new_vl", "head_dim": 64,
     "rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [8, 12, 12]}},
    {"model_type": "some_vision", "head_dim": 64,
     "rope_parameters": {"rope_type": "axial", "rope_theta": 1e4}},
]


@pytest.mark.parametrize("config", UNSUPPORTED, ids=lambda c: c["model_type"])
def test_unsupported_multi_axis_configs_raise(config):
    with pytest.raises(ValueError, match="more than one position per token"):
        fastpe.RotaryEmbedding.from_hf_config(config)


# ---- transformers' own code (tests/data/make_hf_mrope_reference.py) ---------------------

DATA = Path(__file__).parent / "data"
HF = json.loads((DATA / "hf_mrope_reference.json").read_text())
HF_ARRAYS = np.load(DATA / "hf_mrope_reference.npz")
HF_CASES = {c["name"]: c for c in HF["cases"]}
BACKENDS = ["numpy", "cython"] if COMPILED else ["numpy"]


def _hf_case_ids(kind):
    return [name for name, c in HF_CASES.items() if c["kind"] == kind]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name, config", [
    (name, key) for name in _hf_case_ids("text") + _hf_case_ids("vision")
    for key in ("config", "typed_config") if key in HF_CASES[name]])
def test_models_match_transformers(name, config, backend):
    """Each family's M-RoPE (text) or 2D RoPE (vision tower) through from_hf_config
    equals its own rotary module and apply function (run in float64) to float64
    rounding, on (axes, batch, seq) positions (text, layout bhsd) or (axes, tokens)
    (vision, layout shd); from the config transformers writes, and for a vision tower
    from the same config.json typed without its base (the class's default)."""
    case = HF_CASES[name]
    rope = fastpe.RotaryEmbedding.from_hf_config(case[config], layer_type=case["layer_type"],
                                                 layer=case.get("layer"))
    rng = np.random.default_rng(case["seed"])
    q = rng.standard_normal(case["q_shape"])
    k = rng.standard_normal(case["k_shape"])
    pos = np.array(case["positions"], dtype=np.int64)
    assert rope.axes == pos.shape[0]
    with fastpe.use_backend(backend):
        rope(q, k, pos, layout=case["layout"])
    if case.get("hf_order") == "deinterleaved":
        # HY-V4-VL's apply function (transformers 5.25) also moves the adjacent pairs it
        # rotates to [even | odd]; the q.k products, all attention sees, are the same
        q, k = (np.concatenate([x[..., 0::2], x[..., 1::2]], axis=-1) for x in (q, k))
    for got, key in ((q, "q"), (k, "k")):
        expected = HF_ARRAYS[f"{name}/{key}"]
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-13,
                                   err_msg=f"{name} {key} ({backend})")


@pytest.mark.parametrize("name", _hf_case_ids("unsupported"))
def test_unsupported_models_raise(name):
    with pytest.raises(ValueError, match=r"not supported|more than one position"):
        fastpe.RotaryEmbedding.from_hf_config(HF_CASES[name]["config"])


@pytest.mark.parametrize("name", _hf_case_ids("model_fails"))
def test_configs_the_models_own_code_fails_on_raise(name):
    """The model raised (the fixture keeps its error), fastpe refuses: a
    partial_rotary_factor with a rope type whose transformers frequencies read it, in a
    family whose attention rotates the whole head (rather than rotate part of it), or a
    rope type the family's module does not take."""
    error = HF_CASES[name]["error"]
    pattern = (r"partial_rotary_factor=0\.5.*own code fails" if error.startswith("RuntimeError")
               else r"default rope type only.*own code fails on rope type 'linear'")
    assert error.startswith("RuntimeError") or "requires the `default` rope type" in error
    with pytest.raises(ValueError, match=pattern):
        fastpe.RotaryEmbedding.from_hf_config(HF_CASES[name]["config"])


def test_hunyuan_vl_checkpoint_dict_reads_as_its_config_class_reads_it():
    """HunYuan-VL's config.json says "xdrope" with the base at the top level; its config
    class makes that "dynamic" with the base inside, which the module reads, with an
    alpha, as a fixed NTK base: the fixture's case (from the class) and the raw dict agree."""
    case = HF_CASES["hunyuan_vl_dynamic_alpha"]["config"]
    rope = dict(case["rope_parameters"])
    raw = dict(case, rope_theta=rope.pop("rope_theta"),
               rope_parameters=dict(rope, rope_type="xdrope"))
    want = fastpe.RotaryEmbedding.from_hf_config(case)
    got = fastpe.RotaryEmbedding.from_hf_config(raw)
    assert got._spec == want._spec and want._spec.rope_type == "default"
    assert want._spec.base == pytest.approx(1e4 * 1000.0 ** (32 / 30), rel=1e-15)


# ---- position helpers against the models' own functions ------------------------------


@pytest.mark.parametrize("name", _hf_case_ids("rope_index"))
def test_mrope_positions_match_get_rope_index(name):
    case = HF_CASES[name]
    segments = [s if isinstance(s, int) else tuple(s) for s in case["segments"]]
    got = fastpe.mrope_positions(segments, spatial_merge_size=case["spatial_merge_size"])
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, np.array(case["positions"]))


@pytest.mark.parametrize("name", _hf_case_ids("vision_grid"))
def test_vision_positions_match_transformers(name):
    case = HF_CASES[name]
    got = fastpe.vision_positions([tuple(g) for g in case["grids"]],
                                  spatial_merge_size=case["spatial_merge_size"],
                                  temporal=case["temporal"])
    np.testing.assert_array_equal(got, np.array(case["positions"]))


def test_vision_positions_llama4_grid_with_cls():
    """Llama 4's own table: patches row-major from (1, 1), the class token last at (0, 0)."""
    case = HF_CASES["llama4_vision"]
    side = math.isqrt(len(case["positions"][0]) - 1)
    got = fastpe.vision_positions((side, side), offset=1, cls=True)
    np.testing.assert_array_equal(got, np.array(case["positions"]))


def test_position_helpers_refuse_bad_grids():
    with pytest.raises(ValueError, match="spatial_merge_size"):
        fastpe.mrope_positions([2, (1, 3, 4)], spatial_merge_size=2)
    with pytest.raises(ValueError, match=r"segments\[1\]"):
        fastpe.mrope_positions([2, (1, 2, 3, 4, 5)])
    with pytest.raises(ValueError, match="grids"):
        fastpe.vision_positions((0, 3))
    assert fastpe.mrope_positions([]).shape == (3, 0)


@pytest.mark.parametrize("dtype", [F32, F64], ids=str)
def test_wide_image_rows_at_long_context(dtype, both_threads):
    """Image rows of 60 tokens (one axis steps, the others hold) across block boundaries,
    after 5000 text tokens: the per-axis angle steps stay within float64 rounding."""
    pos = fastpe.mrope_positions([5000, (1, 4, 120), 7], spatial_merge_size=2)[:, 4990:]
    seq = pos.shape[1]
    rope = fastpe.RotaryEmbedding(D, base=1e6, mrope_section=SECTIONS)
    q0 = make("contiguous", (1, seq, HQ, D), dtype, seed=11)
    expected = rotate_axes(q0, pos[:, None], rope.frequencies().inv_freq, rope._pair_axis)
    for backend in BACKENDS:
        q = q0.copy()
        with fastpe.use_backend(backend):
            rope(q, None, pos, num_threads=both_threads)
        check(q, expected, dtype, pos, f"{backend} {dtype}")


@pytest.mark.parametrize("interleaved", [False, True], ids=["sections", "interleaved"])
def test_axes_moving_in_changing_sets(interleaved):
    """Tokens where a changing subset of the axes steps on by one and the others hold
    (each set's per-pair steps made again when the set changes), with a jump now and
    then: every pair's angle is its own axis's position times its frequency, to float64
    rounding, in float64 and float32."""
    rng = np.random.default_rng(5)
    seq = 300
    pos = np.empty((3, 1, seq), np.int64)
    pos[:, 0, 0] = [10, 20, 30]
    for t in range(1, seq):
        step = rng.integers(0, 2, 3) if t % 37 else rng.integers(2, 50, 3)
        pos[:, 0, t] = pos[:, 0, t - 1] + step
    rope = fastpe.RotaryEmbedding(D, base=1e6, mrope_section=SECTIONS,
                                  mrope_interleaved=interleaved)
    for dtype in (F64, F32):
        q0 = make("contiguous", (1, seq, HQ, D), dtype, seed=12)
        expected = rotate_axes(q0, pos, rope.frequencies().inv_freq, rope._pair_axis)
        for backend in BACKENDS:
            q = q0.copy()
            with fastpe.use_backend(backend):
                rope(q, None, pos)
            check(q, expected, dtype, pos, f"{backend} {dtype}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_gemma4_halves_refuse_before_writing(backend):
    """Gemma 4's tower rotates the two halves of the head separately: a bad argument is
    refused before either half is written."""
    rope = fastpe.RotaryEmbedding.from_hf_config(HF_CASES["gemma4_vision"]["config"])
    q = make("contiguous", (1, 6, 2, rope.head_dim), F32, seed=1)
    k = make("contiguous", (1, 6, 1, rope.head_dim), F32, seed=2)
    before = snapshot(q), snapshot(k)
    good = fastpe.vision_positions((2, 3))
    for bad, exc in ((good - 1, ValueError), (good[:, :5], ValueError),
                     (good.astype(float), TypeError)):
        with fastpe.use_backend(backend), pytest.raises(exc, match="positions"):
            rope(q, k, bad)
        assert (snapshot(q), snapshot(k)) == before
    with pytest.raises(ValueError, match="head_dim"):
        rope(q[..., :-4], None, good)
    with pytest.raises(ValueError, match="cos/sin"):
        rope.cos_sin(good)


def test_flat_qwen2_vl_config_json_loads_and_composites_are_refused():
    """Qwen2-VL's original config.json keeps the text model's keys at the top (rope_scaling
    of type "mrope", which transformers reads as default RoPE); a composite config (text
    and vision sub-configs only) is refused: its two parts rotate differently."""
    flat = {"model_type": "qwen2_vl", "hidden_size": 3584, "num_attention_heads": 28,
            "rope_theta": 1000000.0, "max_position_embeddings": 32768,
            "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
            "vision_config": {"embed_dim": 1280, "num_heads": 16, "spatial_merge_size": 2}}
    rope = fastpe.RotaryEmbedding.from_hf_config(flat)
    assert (rope.axes, rope.head_dim, rope._spec.base) == (3, 128, 1e6)
    assert rope._pair_axis.tolist() == [0] * 16 + [1] * 24 + [2] * 24
    text = HF_CASES["qwen2_vl"]["config"]
    composite = {"model_type": "qwen2_vl", "text_config": text,
                 "vision_config": HF_CASES["qwen2_vl_vision"]["config"]}
    with pytest.raises(ValueError, match=r"composite.*text_config"):
        fastpe.RotaryEmbedding.from_hf_config(composite)


ISA_CHECK = """
import json, sys
import numpy as np
import fastpe
assert fastpe.backend() == "cython"
doc = json.loads(open(sys.argv[1]).read())
arrays = np.load(sys.argv[2])
for case in doc["cases"]:
    if case["kind"] not in ("text", "vision"):
        continue
    rope = fastpe.RotaryEmbedding.from_hf_config(case["config"], layer_type=case["layer_type"],
                                                 layer=case.get("layer"))
    rng = np.random.default_rng(case["seed"])
    q, k = rng.standard_normal(case["q_shape"]), rng.standard_normal(case["k_shape"])
    rope(q, k, np.array(case["positions"]), layout=case["layout"], num_threads=2)
    if case.get("hf_order") == "deinterleaved":  # as test_models_match_transformers
        q, k = (np.concatenate([x[..., 0::2], x[..., 1::2]], axis=-1) for x in (q, k))
    for got, key in ((q, "q"), (k, "k")):
        np.testing.assert_allclose(got, arrays[case["name"] + "/" + key], rtol=0, atol=1e-13,
                                   err_msg=case["name"])
print(fastpe.info()["isa"], "OK")
"""


@pytest.mark.skipif(not COMPILED, reason="the compiled extension is not built")
@pytest.mark.parametrize("isa", ISA_NAMES)
def test_every_isa_variant_matches_transformers(isa):
    """Each kernel variant this CPU runs (FASTPE_ISA=baseline is the SSE2 build)."""
    if isa not in fastpe.info()["isa_available"]:
        pytest.skip(f"this CPU cannot run {isa}")
    proc = run_python(ISA_CHECK, str(DATA / "hf_mrope_reference.json"),
                      str(DATA / "hf_mrope_reference.npz"), FASTPE_ISA=isa)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == f"{isa} OK"


def rotate_two_axes(x, positions, inv_freq, axis1, axis2):
    """HunYuan-VL's turn, from its definition: pair (a, b) = (x_j, x_{j+half}) ->
    (a cos(p[axis1[j]] w_j) - b sin(...), b cos(p[axis2[j]] w_j) + a sin(...))."""
    x = as_f64(x)
    batch, seq = x.shape[:2]
    pos = np.broadcast_to(np.asarray(positions), (positions.shape[0], batch, seq))
    out = x.copy()
    half = len(inv_freq)
    for j, w in enumerate(inv_freq):
        a1 = pos[axis1[j]].astype(np.float64)[:, :, None] * w
        a2 = pos[axis2[j]].astype(np.float64)[:, :, None] * w
        a, b = x[..., j], x[..., j + half]
        out[..., j] = a * np.cos(a1) - b * np.sin(a1)
        out[..., j + half] = b * np.cos(a2) + a * np.sin(a2)
    return out


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_hunyuan_two_axis_pairs_match_formula(layout, kind, dtype, both_threads):
    rope = fastpe.RotaryEmbedding.from_hf_config(HF_CASES["hunyuan_vl"]["config"])
    batch = 1 if layout == "shd" else B
    d = rope.head_dim
    pos = vl_positions(batch, S, axes=4, seed=3)
    q0 = make(kind, shape_for(layout, batch, S, HQ, d), dtype, seed=1)
    k0 = make(kind, shape_for(layout, batch, S, HK, d), dtype, seed=2)
    w = rope.frequencies().inv_freq
    expect_q = rotate_two_axes(bshd(q0, layout), pos, w, rope._pair_axis, rope._pair_axis2)
    expect_k = rotate_two_axes(bshd(k0, layout), pos, w, rope._pair_axis, rope._pair_axis2)
    arg = pos[:, 0] if layout == "shd" else pos
    for backend in BACKENDS:
        q, k = make(kind, q0.shape, dtype, seed=1), make(kind, k0.shape, dtype, seed=2)
        with fastpe.use_backend(backend):
            rope(q, k, arg, layout=layout, num_threads=both_threads)
        ctx = f"{backend} {layout} {kind} {dtype}"
        check(bshd(q, layout), expect_q, dtype, pos, ctx + " q")
        check(bshd(k, layout), expect_k, dtype, pos, ctx + " k")


@pytest.mark.parametrize("backend", BACKENDS)
def test_hunyuan_inverse_and_cache_are_refused(backend):
    """Its turn is not a rotation: no inverse (refused before writing), no cos/sin table;
    text positions (every axis equal) are plain RoPE and invert as usual."""
    rope = fastpe.RotaryEmbedding.from_hf_config(HF_CASES["hunyuan_vl"]["config"])
    q = make("contiguous", (1, S, HQ, rope.head_dim), F64, seed=1)
    before = snapshot(q)
    with fastpe.use_backend(backend), pytest.raises(ValueError, match="inverse"):
        rope(q, None, vl_positions(1, S, axes=4), inverse=True)
    assert snapshot(q) == before
    with pytest.raises(ValueError, match="cos/sin"):
        rope.cos_sin(vl_positions(1, S, axes=4)[:, 0])
    with fastpe.use_backend(backend):
        rope(q, None, np.arange(S))
        rope(q, None, np.arange(S), inverse=True)
    np.testing.assert_allclose(q, make("contiguous", q.shape, F64, seed=1), rtol=0, atol=1e-12)


# ---- what the loaders and position helpers read --------------------------------------


def test_position_helpers_take_grid_thw_arrays_and_tensors():
    """transformers hands image_grid_thw over as an (n, 3) integer tensor: its rows (or
    the whole array) give the same positions as tuples."""
    grids = np.array([[1, 4, 6], [2, 2, 2]], dtype=np.int64)
    want = fastpe.vision_positions([(1, 4, 6), (2, 2, 2)], spatial_merge_size=2)
    np.testing.assert_array_equal(fastpe.vision_positions(grids, spatial_merge_size=2), want)
    np.testing.assert_array_equal(
        fastpe.vision_positions(np.array([4, 6]), spatial_merge_size=2),
        fastpe.vision_positions((4, 6), spatial_merge_size=2))
    want = fastpe.mrope_positions([3, (1, 4, 6), 2, (2, 2, 2)], spatial_merge_size=2)
    got = fastpe.mrope_positions([3, grids[0], 2, grids[1]], spatial_merge_size=2)
    np.testing.assert_array_equal(got, want)
    torch = pytest.importorskip("torch")
    t = torch.from_numpy(grids)
    np.testing.assert_array_equal(fastpe.vision_positions(t, spatial_merge_size=2),
                                  fastpe.vision_positions(grids, spatial_merge_size=2))
    np.testing.assert_array_equal(
        fastpe.mrope_positions([3, t[0], 2, t[1]], spatial_merge_size=2), want)


@pytest.mark.parametrize("call, error, pattern", [
    (lambda: fastpe.vision_positions(5), TypeError, r"grids must be"),
    (lambda: fastpe.vision_positions(np.array([[1.0, 2.0, 2.0]])), TypeError, r"grids must"),
    (lambda: fastpe.vision_positions([]), ValueError, r"grids must hold"),
    (lambda: fastpe.mrope_positions(None), TypeError, r"segments must be"),
    (lambda: fastpe.mrope_positions([2, np.array([[1, 2, 2]])]), TypeError, r"segments\[1\]"),
    (lambda: fastpe.vision_positions((2, 2), offset=2**63 - 1), ValueError,
     r"offset.*int64"),
    (lambda: fastpe.vision_positions((2, 2), offset=2**63), ValueError, r"offset.*int64"),
    (lambda: fastpe.mrope_positions([(3, 2, 2, 1e19)]), ValueError, r"segments\[0\].*int64"),
    (lambda: fastpe.mrope_positions([(3, 2, 2, 2**62)]), ValueError, r"segments\[0\].*int64"),
    (lambda: fastpe.mrope_positions([(3, 2, 2, 1e39)]), ValueError,
     r"segments\[0\] temporal step must be a positive float32"),
    (lambda: fastpe.mrope_positions([(3, 2, 2, 1e-50)]), ValueError,
     r"segments\[0\] temporal step must be a positive float32"),
    (lambda: fastpe.mrope_positions([(3, 2, 2, 0)]), ValueError, r"segments\[0\] temporal step"),
    (lambda: fastpe.mrope_positions([(1, 2, 2), 2**63 - 1]), ValueError,
     r"segments\[1\] brings the tokens"),
    # more tokens than any call takes: refused before a grid of them is made
    (lambda: fastpe.mrope_positions([5, (1, 2**31, 2**31)]), ValueError,
     r"segments\[1\] brings the tokens to \d+, past the 4294967296"),
    (lambda: fastpe.mrope_positions([2**62]), ValueError, r"segments\[0\] brings the tokens"),
    (lambda: fastpe.vision_positions((2**31, 2**31)), ValueError, r"grids brings the tokens"),
], ids=["int-grids", "float-array", "no-grids", "none-segments", "2d-segment",
        "offset-overflow", "offset-past-int64", "temporal-step-overflow",
        "int-temporal-step-overflow", "temporal-step-past-float32",
        "temporal-step-below-float32", "zero-temporal-step", "text-overflow",
        "grid-past-2**32-tokens", "text-past-2**32-tokens", "vision-grid-past-2**32-tokens"])
def test_position_helpers_name_the_argument(call, error, pattern):
    with pytest.raises(error, match=pattern):
        call()


def test_a_temporal_step_held_as_a_0d_array_or_tensor_is_its_value():
    """Qwen2.5-VL forms its step as a float32 tensor (tokens_per_second times an entry
    of second_per_grid_ts): taken as the value it holds."""
    step = np.float32(25) * np.float32(0.1)
    want = fastpe.mrope_positions([(9, 2, 2, float(step))])
    np.testing.assert_array_equal(fastpe.mrope_positions([(9, 2, 2, np.array(step))]), want)
    torch = pytest.importorskip("torch")
    held = 25 * torch.tensor([0.1], dtype=torch.float32)[0]
    np.testing.assert_array_equal(fastpe.mrope_positions([(9, 2, 2, held)]), want)
    np.testing.assert_array_equal(fastpe.mrope_positions([(3, 2, 2, torch.tensor(2))]),
                                  fastpe.mrope_positions([(3, 2, 2, 2)]))


@pytest.mark.parametrize("sections", [{16, 24}, {16: 1, 24: 2}], ids=["set", "dict"])
def test_unordered_mrope_sections_are_refused(sections):
    with pytest.raises(TypeError, match=r"mrope_section must be a sequence"):
        fastpe.RotaryEmbedding(80, mrope_section=sections)


def test_largest_positions_that_fit_are_given():
    top = 2**63 - 2
    got = fastpe.vision_positions((2, 2), offset=top)
    assert got.max() == top + 1 and got.min() == top


@pytest.mark.parametrize("name", ["muse_glimmer_vision", "muse_spark_vision"])
def test_towers_with_their_own_patch_coordinates_are_refused(name):
    # they rotate by (column + 1, row + 1) over one [h | w] table per patch
    with pytest.raises(ValueError, match=rf"'{name}' is not supported.*flipped"):
        fastpe.RotaryEmbedding.from_hf_config(HF_CASES[name]["config"])


def test_style_overrides_are_applied_or_refused():
    # Gemma 4's halves and HunYuan-VL's runs are rotate_half layouts the kernels keep
    # whatever style says: an override is refused rather than dropped
    for name in ("gemma4_vision", "hunyuan_vl"):
        config = HF_CASES[name]["config"]
        with pytest.raises(ValueError, match=r"style='gptj'"):
            fastpe.RotaryEmbedding.from_hf_config(config, style="gptj")
        assert fastpe.RotaryEmbedding.from_hf_config(config, style="neox").style == "neox"
    # elsewhere the override is the embedding's pairing
    rope = fastpe.RotaryEmbedding.from_hf_config(HF_CASES["qwen2_vl"]["config"], style="gptj")
    assert rope.style == "gptj"
    with pytest.raises(ValueError, match="style"):
        fastpe.RotaryEmbedding.from_hf_config(HF_CASES["qwen2_vl"]["config"], style="half")


@pytest.mark.parametrize("backend", BACKENDS)
def test_vision_towers_refuse_text_positions(backend):
    """A vision tower rotates each patch by its own (row, column): text positions that
    every axis shares (None, (seq,), (batch, seq), one row) are no call of its model,
    refused with q untouched; beside a batch of `axes` sequences, (axes, seq) can then
    only be one row per axis. A text model's M-RoPE takes them."""
    names = _hf_case_ids("vision")
    assert "gemma4_vision" in names and "qwen2_vl_vision" in names
    for name in names:
        rope = fastpe.RotaryEmbedding.from_hf_config(HF_CASES[name]["config"])
        axes, seq = rope.axes, 6
        assert axes > 1, name
        q0 = np.random.default_rng(0).standard_normal((axes, seq, 2, rope.head_dim))
        grid = np.arange(axes * seq, dtype=np.int64).reshape(axes, seq) % 5
        for positions in (None, np.arange(seq), np.zeros((axes, seq), np.int64)[:1],
                          np.zeros((1, axes, seq), np.int64), np.arange(seq) / 7.0,
                          np.zeros((axes, seq - 1), np.int64)):   # the message says what fits
            q = q0.copy()
            with fastpe.use_backend(backend), pytest.raises(
                    ValueError, match=r"one row per axis \(this embedding's model"):
                rope(q, None, positions)
            assert_bytes_equal(q, q0)
        shared, per_sequence = q0.copy(), q0.copy()
        with fastpe.use_backend(backend):
            rope(shared, None, grid)
            rope(per_sequence, None, grid[:, None])
        assert_bytes_equal(shared, per_sequence)
        assert not np.array_equal(shared, q0)
        # (Gemma 4's two halves have no one cos/sin table at all)
        with pytest.raises(ValueError, match=r"one row per axis \(this embedding's model|"
                                             r"does not turn each pair by one angle"):
            rope.cos_sin(np.arange(seq))
    text = fastpe.RotaryEmbedding.from_hf_config(HF_CASES[_hf_case_ids("text")[0]]["config"])
    q = np.ones((1, 4, 2, text.head_dim))
    with fastpe.use_backend(backend):
        text(q, None)
        text(q, None, np.arange(4))


def _cfg(name, **changes):
    config = dict(HF_CASES[name]["config"])
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    return config


def _hunyuan(**rope):
    config = _cfg("hunyuan_vl")
    config["rope_parameters"] = {**config["rope_parameters"], **rope}
    return config


@pytest.mark.parametrize("config, error, pattern", [
    (_cfg("qwen2_vl_vision", head_dim=80.5), ValueError, r"head_dim"),
    (_cfg("qwen2_vl_vision", head_dim="80"), TypeError, r"head_dim"),
    (_cfg("qwen2_vl_vision", embed_dim="1280"), TypeError, r"embed_dim"),
    (_cfg("qwen2_vl_vision", num_heads=16.5), ValueError, r"num_heads"),
    (_cfg("qwen2_vl_vision", num_heads=0), ValueError, r"num_heads"),
    (_hunyuan(mrope_section=64), TypeError, r"mrope_section must be a list"),
    (_hunyuan(mrope_section=[16.5, 16, 16, 15.5]), TypeError, r"mrope_section\[0\]"),
    (_hunyuan(mrope_section="16,16"), TypeError, r"mrope_section must be a list"),
    (_hunyuan(mrope_section=[-2, 18, 16, 16]), ValueError, r"mrope_section\[0\]"),
    (_hunyuan(rope_type="ntk_alpha", alpha=None), ValueError, r"alpha"),
    (_hunyuan(rope_type="ntk_alpha", alpha="2"), TypeError, r"alpha"),
    ({"model_type": "qwen2_vl_vision", "head_dim": 80,
      "rope_parameters": {"rope_type": "axial", "rope_theta": None}}, ValueError,
     r"rope_theta is None"),
], ids=["head_dim-fraction", "head_dim-str", "embed_dim-str", "num_heads-fraction",
        "num_heads-zero", "sections-int", "sections-float", "sections-str",
        "sections-negative", "alpha-missing", "alpha-str", "vision-theta-none"])
def test_loaders_name_the_key_they_cannot_read(config, error, pattern):
    with pytest.raises(error, match=pattern):
        fastpe.RotaryEmbedding.from_hf_config(config)


@pytest.mark.skipif(fastpe._backend.compiled is None, reason="needs the compiled kernels")
def test_the_compiled_entry_takes_per_axis_positions_only_as_its_state_says():
    """rope_call with a multi-axis RopeState: (axes, rows, seq) int64 positions of exactly
    the state's axes, each below 2**32, pair axes below that count, no offset, and no
    inverse for a pairing that turns a pair's two features by different angles. It
    declines (0, nothing written) anything else; what it takes matches the reference."""
    kern = fastpe._backend.compiled
    inv_freq = fastpe.rope_frequencies(8).inv_freq
    pair_axis = np.array([0, 1, 2, 2], np.int8)
    rng = np.random.default_rng(3)
    q = rng.standard_normal((2, 5, 3, 8))
    pos = rng.integers(0, 1000, (3, 2, 5))

    def call(state, positions, offset=0, inverse=False, x=None):
        x = q.copy() if x is None else x
        before = x.copy()
        done = kern.rope_call(state, x, None, positions, offset, "neox", "bshd", inverse, None,
                              None, None, 0, 1)
        if not done:
            assert_bytes_equal(x, before)
        return done, x

    state = kern.RopeState(-1, False, inv_freq, 1.0, -1, None, pair_axis, None, 3)
    done, got = call(state, pos)
    assert done == 1
    # the formula: pair i (features i, i + 4) turns by the position on its axis
    angle = np.moveaxis(pos[pair_axis], 0, -1) * inv_freq              # (2, 5, 4)
    c, s = np.cos(angle)[:, :, None], np.sin(angle)[:, :, None]
    a, b = q[..., :4], q[..., 4:]
    want = np.concatenate([a * c - b * s, b * c + a * s], axis=-1)
    assert_close(got, want, np.dtype(np.float64), context="per-axis positions")
    assert call(state, pos[:2])[0] == 0                                 # 2 axes, not 3
    assert call(state, pos[0])[0] == 0                                  # text positions
    assert call(state, pos.astype(np.int32))[0] == 0                    # not int64
    assert call(state, np.where(pos == pos.max(), 2**32, pos))[0] == 0  # past 2**32
    assert call(state, pos, offset=1)[0] == 0                           # with an offset
    assert call(kern.RopeState(-1, False, inv_freq, 1.0, -1, None,
                               np.array([0, 1, 3, 2], np.int8), None, 3), pos)[0] == 0
    two = kern.RopeState(-1, False, inv_freq, 1.0, -1, None, pair_axis,
                         np.array([1, 1, 2, 0], np.int8), 3)
    assert call(two, pos)[0] == 1
    assert call(two, pos, inverse=True)[0] == 0                         # no inverse


@pytest.mark.skipif(not COMPILED, reason="needs the compiled kernels")
@pytest.mark.parametrize("interleaved", [False, True], ids=["contiguous", "interleaved"])
def test_positions_of_every_axis_take_the_compiled_entry_directly(interleaved, monkeypatch):
    """A decode step's (axes, batch, seq) position ids, as arrays or as a model's torch
    tensors, are rotated by the compiled entry from the caller's objects, no validating
    pass first; the result is the formula's, and an attribute changed after a call (the
    rotation's direction) is honoured by the next."""
    rope = fastpe.RotaryEmbedding(D, mrope_section=SECTIONS, mrope_interleaved=interleaved)
    pos = vl_positions(B, 3)
    q0 = make("contiguous", (B, 3, HQ, D), F64, seed=5)
    want = rotate_axes(q0, pos, inv_freq(D), rope._pair_axis)
    callers = entry_callers(monkeypatch, "rope_call")
    with fastpe.use_backend("cython"):
        q = q0.copy()
        rope(q, None, pos)
        assert callers == [("__call__", 1)]
        check(q, want, F64, pos, "arrays")
        rope.reverse = True
        rope(q, None, pos)
        assert_close(q, q0, F64, atol=1e-12, context="reverse after a call: rotated back")
        torch = pytest.importorskip("torch")
        rope.reverse = False
        callers.clear()
        qt = torch.from_numpy(q0.copy())
        version = qt._version
        rope(qt, None, torch.from_numpy(pos), layout="bshd")
        assert callers == [("__call__", 1)]
        assert qt._version == version + 1
        check(qt.numpy(), want, F64, pos, "torch tensors")


@pytest.mark.parametrize("backend", ["cython", "numpy"])
def test_attributes_set_after_construction_are_checked_at_the_call(backend):
    """A RotaryEmbedding's public attributes may change after it is made: axes past what
    the kernels hold or other than its pairs take, a head_dim or axes that is no count, a
    reverse that is no bool, and a pairing HunYuan-VL's per-axis features cannot take are
    refused at the call, by both backends alike, q untouched."""
    if backend == "cython" and not COMPILED:
        pytest.skip("needs the compiled kernels")
    q0 = np.random.default_rng(0).standard_normal((1, 3, 2, 8))
    rope = fastpe.RotaryEmbedding(8, mrope_section=[2, 1, 1])
    rope.axes = 17
    q = q0.copy()
    with fastpe.use_backend(backend), pytest.raises(ValueError, match=r"axes must be in"):
        rope(q, None, np.zeros((17, 1, 3), np.int64))
    assert_bytes_equal(q, q0)
    # fewer axes than the pairs take, or more, or one (a (3, seq) row would read as
    # three sequences' text positions)
    for axes in (2, 4, 1):
        rope.axes = axes
        for positions in (np.zeros((axes, 1, 3), np.int64), np.zeros((axes, 3), np.int64)):
            with fastpe.use_backend(backend), pytest.raises(
                    ValueError, match=rf"^RotaryEmbedding\.axes={axes}: its pairs rotate by 3 "):
                rope(q, None, positions)
            assert_bytes_equal(q, q0)
    for name, value, error, match in [("axes", 0, ValueError, r"axes must be >= 1, got 0"),
                                      ("axes", "3", TypeError, r"axes must be an int"),
                                      ("head_dim", -8, ValueError, r"head_dim must be >= 1"),
                                      ("head_dim", 8.0, TypeError, r"head_dim must be an int"),
                                      ("reverse", "no", TypeError, r"reverse must be a bool"),
                                      ("reverse", np.array([True, False]), TypeError,
                                       r"reverse must be a bool")]:
        changed = fastpe.RotaryEmbedding(8, mrope_section=[2, 1, 1])
        setattr(changed, name, value)
        for positions in (None, np.zeros((3, 1, 3), np.int64)):
            with fastpe.use_backend(backend), pytest.raises(
                    error, match=rf"^RotaryEmbedding\.{match}"):
                changed(q, None, positions)
            assert_bytes_equal(q, q0)
        with pytest.raises(error, match=rf"^RotaryEmbedding\.{match}"):
            changed.cos_sin(np.zeros((3, 3), np.int64))
    one_axis = fastpe.RotaryEmbedding(8)
    one_axis.axes = 2           # (2, seq) positions would read as two sequences' rows
    for positions in (None, np.zeros((2, 3), np.int64), np.zeros((2, 1, 3), np.int64)):
        with fastpe.use_backend(backend), pytest.raises(
                ValueError, match=r"^RotaryEmbedding\.axes=2 needs mrope_section"):
            one_axis(q, None, positions)
        assert_bytes_equal(q, q0)
    hunyuan = fastpe.RotaryEmbedding(8, mrope_section=[2, 1, 1])
    hunyuan._pair_axis2 = np.array([1, 0, 2, 0], np.int8)   # the second feature's axes
    hunyuan.style = "gptj"
    with fastpe.use_backend(backend), pytest.raises(ValueError, match=r"style='gptj'"):
        hunyuan(q, None, np.zeros((3, 1, 3), np.int64))
    assert_bytes_equal(q, q0)


@pytest.mark.parametrize("backend", ["cython", "numpy"])
@pytest.mark.parametrize("positions", [np.zeros((3, 1, 0), np.int64),
                                       np.zeros((3, 0), np.int32),
                                       np.zeros((3, 1, 0))], ids=["3-D", "2-D", "real"])
def test_no_tokens_with_positions_of_every_axis(positions, backend):
    if backend == "cython" and not COMPILED:
        pytest.skip("needs the compiled kernels")
    rope = fastpe.RotaryEmbedding(8, mrope_section=[2, 1, 1])
    with fastpe.use_backend(backend):
        q, _ = rope(np.zeros((1, 0, 2, 8)), None, positions)
    assert q.shape == (1, 0, 2, 8)


@pytest.mark.skipif(not COMPILED, reason="needs the compiled kernels")
def test_a_state_made_while_an_attribute_changes_is_not_kept(monkeypatch):
    """Another thread sets an attribute while a call makes the embedding's compiled
    state from the old value: that state serves the call under way only."""
    rope = fastpe.RotaryEmbedding(8, mrope_section=[2, 1, 1])
    real = fastpe.rope._state

    def racing(*args, **kwargs):
        state = real(*args, **kwargs)
        rope.reverse = True          # "another thread", after the state was made
        return state

    monkeypatch.setattr(fastpe.rope, "_state", racing)
    q0 = np.random.default_rng(0).standard_normal((1, 3, 1, 8))
    positions = np.arange(9).reshape(3, 1, 3)
    with fastpe.use_backend("cython"):
        rope(q0.copy(), None, positions)
    monkeypatch.setattr(fastpe.rope, "_state", real)
    assert rope._compiled_state is None and rope._compiled_axes_state is None
    got, want = q0.copy(), q0.copy()
    with fastpe.use_backend("cython"):
        rope(got, None, positions)
    with fastpe.use_backend("numpy"):
        rope(want, None, positions)
    assert_close(got, want, F64, context="the next call, with reverse=True")
