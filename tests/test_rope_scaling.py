"""RoPE frequencies and scaling: published formulas, Hugging Face's own numbers, pinned details, errors.

The reference implementations below are loops over Python ``math`` written from the
papers / reference code of each method, not from fastpe; ``tests/data/hf_rope_reference.json``
holds what transformers itself returns (see ``tests/data/make_hf_rope_reference.py``).
"""

import dataclasses
import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import fastpe
from fastpe._rope_scaling import (
    SUPPORTED_ROPE_TYPES,
    RopeFrequencies,
    hf_rope_config,
    parse_rope_spec,
    rope_frequencies,
)

EXACT = 1e-12  # float64 vs float64: the same formula evaluated in a different order
HF_REFERENCE = Path(__file__).parent / "data" / "hf_rope_reference.json"

LLAMA31 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


# -- reference formulas, one pair (j) at a time --------------------------------------------


def ref_plain(d, base):
    """RoFormer: theta_j = base^(-2j/d) for j in [0, d/2)."""
    return [base ** (-2.0 * j / d) for j in range(d // 2)]


def ref_linear(d, base, factor):
    """Position interpolation (kaiokendev; Chen et al. 2023): positions / factor."""
    return [theta / factor for theta in ref_plain(d, base)]


def ref_dynamic(d, base, factor, seq_len, original):
    """Dynamic NTK (bloc97 / emozilla): grow the base once the sequence passes the original."""
    if seq_len > original:
        base = base * ((factor * seq_len / original) - (factor - 1)) ** (d / (d - 2))
    return ref_plain(d, base)


def ref_yarn(d, base, factor, original, beta_fast=32.0, beta_slow=1.0, truncate=True):
    """YaRN "NTK-by-parts" (Peng et al. 2023, sec. 3.2), ramp over pair indices as in its code.

    Pair j turns r_j = original / (2 pi base^(2j/d)) times over the original context.
    Pairs turning more than beta_fast times keep theta_j, pairs turning fewer than
    beta_slow times are interpolated (theta_j / factor), linearly in j in between.
    """

    def pair_index(rotations):  # solve r_j = rotations for j
        return d * math.log(original / (2 * math.pi * rotations)) / (2 * math.log(base))

    lo, hi = pair_index(beta_fast), pair_index(beta_slow)
    if truncate:
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, d - 1)
    out = []
    for j, theta in enumerate(ref_plain(d, base)):
        if j <= lo:
            interpolation = 0.0
        elif j >= hi:
            interpolation = 1.0
        else:
            interpolation = (j - lo) / (hi - lo)
        out.append(interpolation * theta / factor + (1 - interpolation) * theta)
    return out


def ref_yarn_attention(factor, mscale=None, mscale_all_dim=None):
    """sqrt(1/t) = 0.1 ln(s) + 1 (YaRN eq. 22); DeepSeek-V2 divides two such terms."""

    def m(s, k=1.0):
        return 1.0 if s <= 1 else 0.1 * k * math.log(s) + 1.0

    if mscale and mscale_all_dim:
        return m(factor, mscale) / m(factor, mscale_all_dim)
    return m(factor)


def ref_longrope(d, base, rescale):
    """LongRoPE (Ding et al. 2024): theta_j / lambda_j with a searched lambda per pair."""
    return [theta / lam for theta, lam in zip(ref_plain(d, base), rescale, strict=True)]


def ref_longrope_attention(factor, original):
    return 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))


def ref_llama3(d, base, factor, low_freq_factor, high_freq_factor, old_context_len):
    """Meta's llama-models apply_scaling for Llama 3.1, one frequency at a time."""
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    out = []
    for freq in ref_plain(d, base):
        wavelen = 2 * math.pi / freq
        if wavelen < high_freq_wavelen:
            out.append(freq)
        elif wavelen > low_freq_wavelen:
            out.append(freq / factor)
        else:
            smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            out.append((1 - smooth) * freq / factor + smooth * freq)
    return out


def assert_freqs(freqs, expected_inv_freq, expected_attention=1.0):
    assert isinstance(freqs, RopeFrequencies)
    assert freqs.inv_freq.dtype == np.float64
    assert freqs.inv_freq.shape == (len(expected_inv_freq),)
    np.testing.assert_allclose(freqs.inv_freq, expected_inv_freq, rtol=EXACT, atol=0)
    assert isinstance(freqs.attention_scaling, float)
    assert freqs.attention_scaling == pytest.approx(expected_attention, rel=EXACT)


def longrope_factors(n, top):
    return [1.0 + (top - 1.0) * (i / (n - 1)) ** 2 for i in range(n)]


# -- 1. published formulas -----------------------------------------------------------------

DIMS_BASES = [(8, 10000.0), (64, 10000.0), (128, 500000.0), (256, 1000000.0), (96, 150000.0)]


@pytest.mark.parametrize("d, base", DIMS_BASES)
def test_default_matches_roformer(d, base):
    assert_freqs(rope_frequencies(d, base=base), ref_plain(d, base))
    assert_freqs(rope_frequencies(d, base=base, scaling={"rope_type": "default"}), ref_plain(d, base))


@pytest.mark.parametrize("d, base", DIMS_BASES)
@pytest.mark.parametrize("factor", [1.0, 2.0, 4.0])  # below 1: test_frequencies_above_one
def test_linear_matches_position_interpolation(d, base, factor):
    freqs = rope_frequencies(d, base=base, scaling={"rope_type": "linear", "factor": factor})
    assert_freqs(freqs, ref_linear(d, base, factor))


@pytest.mark.parametrize("d, base", DIMS_BASES)
@pytest.mark.parametrize("seq_len", [None, 1, 4095, 4096, 4097, 8192, 100000])
def test_dynamic_matches_ntk_formula(d, base, seq_len):
    scaling = {"rope_type": "dynamic", "factor": 2.0}
    freqs = rope_frequencies(d, base=base, scaling=scaling, seq_len=seq_len, max_position_embeddings=4096)
    assert_freqs(freqs, ref_dynamic(d, base, 2.0, seq_len or 0, 4096))


DYNAMIC_LENGTHS = [17, 18, 31, 4095, 4097, 5001, 65536, 10**6, 2**32]


@pytest.mark.parametrize("d", [4, 6, 18, 64, 128, 256, 1024])
@pytest.mark.parametrize("factor", [2.0, 0.5, 8.0, 1.0 + 2**-40, 37.3])
def test_dynamic_frequencies_of_the_compiled_decode_path_are_rope_frequencies(d, factor):
    """The compiled decode path forms dynamic NTK frequencies itself, one length per
    step: the same bits as rope_frequencies at every length past the original, and
    within EXACT of the NTK formula."""
    compiled = fastpe._backend.compiled
    if compiled is None:
        pytest.skip("no compiled kernels in this build")
    scaling = {"rope_type": "dynamic", "factor": factor}
    spec = parse_rope_spec(d, base=10000.0, scaling=scaling, max_position_embeddings=16)
    plain = spec.frequencies().inv_freq
    for seq_len in DYNAMIC_LENGTHS:
        want = spec.frequencies(seq_len).inv_freq
        out = np.full(d // 2, np.nan)
        assert compiled.dynamic_ntk_frequencies(plain, factor, 16, seq_len, out)
        assert out.tobytes() == want.tobytes(), (d, factor, seq_len, out - want)
        assert_freqs(spec.frequencies(seq_len), ref_dynamic(d, 10000.0, factor, seq_len, 16))


def test_dynamic_frequencies_refuse_a_growth_rounded_away():
    """factor * seq_len / original - (factor - 1) rounds to 0 when factor and the
    original length pass 2**53: an error naming the factor, not log(0)."""
    scaling = {"rope_type": "dynamic", "factor": 2.0**60}
    with pytest.raises(ValueError, match=r"scaling\['factor'\].*too large.*rounds to 0.0"):
        rope_frequencies(64, scaling=scaling, seq_len=2**54 + 1, max_position_embeddings=2**54)


def test_dynamic_with_two_features_keeps_unit_frequency():
    freqs = rope_frequencies(2, scaling={"rope_type": "dynamic", "factor": 4.0}, seq_len=10**6,
                             max_position_embeddings=16)
    assert_freqs(freqs, [1.0])


YARN_CASES = [
    # d, base, factor, original, extra keys
    (128, 1000000.0, 4.0, 32768, {}),
    (128, 10000.0, 8.0, 4096, {"beta_fast": 16.0, "beta_slow": 2.0}),
    (64, 150000.0, 32.0, 4096, {"truncate": False}),
    (64, 10000.0, 40.0, 4096, {"mscale": 1.0, "mscale_all_dim": 1.0}),
    (64, 10000.0, 40.0, 4096, {"mscale": 0.707, "mscale_all_dim": 1.0}),
    (32, 10000.0, 2.0, 2048, {"truncate": True}),
    (16, 10000.0, 4.0, 64, {}),  # correction range collapses to one index
]


@pytest.mark.parametrize("d, base, factor, original, extra", YARN_CASES)
def test_yarn_matches_paper(d, base, factor, original, extra):
    scaling = dict(rope_type="yarn", factor=factor, original_max_position_embeddings=original, **extra)
    freqs = rope_frequencies(d, base=base, scaling=scaling)
    betas = {k: extra[k] for k in ("beta_fast", "beta_slow", "truncate") if k in extra}
    expected = ref_yarn(d, base, factor, original, **betas)
    attention = ref_yarn_attention(factor, extra.get("mscale"), extra.get("mscale_all_dim"))
    assert_freqs(freqs, expected, attention)


def test_yarn_keeps_fast_pairs_and_interpolates_slow_pairs():
    plain = rope_frequencies(128, base=10000.0).inv_freq
    yarn = rope_frequencies(128, base=10000.0, scaling={
        "rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 4096}).inv_freq
    assert yarn[0] == plain[0]
    assert yarn[-1] == pytest.approx(plain[-1] / 8.0, rel=EXACT)
    assert np.all(np.diff(yarn / plain) <= 0)  # monotone from 1 down to 1/factor


def test_yarn_attention_factor_overrides_formula():
    scaling = {"rope_type": "yarn", "factor": 8.0, "attention_factor": 0.9,
               "original_max_position_embeddings": 4096}
    assert rope_frequencies(64, scaling=scaling).attention_scaling == 0.9


def test_yarn_mscale_zero_falls_back_to_plain_attention_factor():
    scaling = {"rope_type": "yarn", "factor": 8.0, "mscale": 0.0, "mscale_all_dim": 1.0,
               "original_max_position_embeddings": 4096}
    assert rope_frequencies(64, scaling=scaling).attention_scaling == pytest.approx(
        ref_yarn_attention(8.0), rel=EXACT)


@pytest.mark.parametrize("seq_len", [None, 0, 100, 4096, 4097, 131072])
def test_longrope_matches_paper(seq_len):
    short, long = longrope_factors(48, 1.2), longrope_factors(48, 60.0)
    scaling = {"rope_type": "longrope", "short_factor": short, "long_factor": long,
               "original_max_position_embeddings": 4096}
    freqs = rope_frequencies(96, scaling=scaling, seq_len=seq_len, max_position_embeddings=131072)
    use_long = seq_len is not None and seq_len > 4096
    expected = ref_longrope(96, 10000.0, long if use_long else short)
    assert_freqs(freqs, expected, ref_longrope_attention(131072 / 4096, 4096))


@pytest.mark.parametrize("d, base", [(128, 500000.0), (64, 500000.0), (128, 10000.0), (32, 10000.0)])
# (8.0, 1.0, 1.0, 8192): Llama 4 Scout's, equal factors and no band between them
@pytest.mark.parametrize("factor, low, high, original", [(8.0, 1.0, 4.0, 8192), (32.0, 1.0, 4.0, 8192),
                                                         (4.0, 2.0, 8.0, 2048), (8.0, 1.0, 1.0, 8192)])
def test_llama3_matches_meta_reference(d, base, factor, low, high, original):
    scaling = {"rope_type": "llama3", "factor": factor, "low_freq_factor": low,
               "high_freq_factor": high, "original_max_position_embeddings": original}
    freqs = rope_frequencies(d, base=base, scaling=scaling)
    assert_freqs(freqs, ref_llama3(d, base, factor, low, high, original))


@pytest.mark.parametrize("head_dim, partial, rotary", [(80, 0.4, 32), (96, 0.25, 24), (128, 0.5, 64),
                                                       (64, 1.0, 64), (100, 0.3, 30)])
def test_partial_rotary_factor_sets_rotary_width(head_dim, partial, rotary):
    freqs = rope_frequencies(head_dim, scaling={"partial_rotary_factor": partial})
    assert_freqs(freqs, ref_plain(rotary, 10000.0))
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048,
            "partial_rotary_factor": partial}
    assert_freqs(rope_frequencies(head_dim, scaling=yarn), ref_yarn(rotary, 10000.0, 4.0, 2048),
                 ref_yarn_attention(4.0))
    assert parse_rope_spec(head_dim, scaling={"partial_rotary_factor": partial}).dim == rotary


# -- 2. agreement with Hugging Face transformers ------------------------------------------------


def _hf_cases():
    return json.loads(HF_REFERENCE.read_text())["cases"]


def _hf_tolerance(base):
    """Relative error allowed between fastpe (float64) and transformers (float32).

    transformers rounds the exponent 2j/d to float32 (relative error <= u = 2^-24), and
    base ** exponent turns that into a relative error of up to ln(base) * u; pow,
    the divisions by factors and the blends of yarn / llama3 add a few more roundings
    of u each. u * (ln(base) + 8) covers both (1.7e-6 for base 1e6, 1e-6 for 1e4);
    a wrong formula is off by far more. attention_scaling is a Python float in
    transformers, so it is compared exactly (1e-12).
    """
    return 2.0**-24 * (math.log(base) + 8)


@pytest.mark.parametrize("case", _hf_cases(), ids=lambda c: c["name"])
def test_agrees_with_hugging_face(case):
    scaling = case["scaling"]
    base = scaling["rope_theta"]
    freqs = rope_frequencies(case["dim"], scaling=scaling, seq_len=case["seq_len"],
                             max_position_embeddings=case["max_position_embeddings"])
    np.testing.assert_allclose(freqs.inv_freq, case["inv_freq"], rtol=_hf_tolerance(base), atol=0)
    assert freqs.attention_scaling == pytest.approx(case["attention_scaling"], rel=EXACT)

    # The same with the base as a keyword instead of inside the dict.
    without_theta = {k: v for k, v in scaling.items() if k != "rope_theta"}
    again = rope_frequencies(case["dim"], base=base, scaling=without_theta, seq_len=case["seq_len"],
                             max_position_embeddings=case["max_position_embeddings"])
    np.testing.assert_array_equal(again.inv_freq, freqs.inv_freq)


def test_hugging_face_reference_covers_every_type():
    document = json.loads(HF_REFERENCE.read_text())
    assert document["transformers_version"]
    types = {c["scaling"].get("rope_type", c["scaling"].get("type")) for c in document["cases"]}
    assert types == set(SUPPORTED_ROPE_TYPES)


# -- 3. pinned details -------------------------------------------------------------------------


def test_base_defaults_to_rope_theta_then_10000():
    assert_freqs(rope_frequencies(64), ref_plain(64, 10000.0))
    assert_freqs(rope_frequencies(64, scaling={"rope_theta": 500000.0}), ref_plain(64, 500000.0))
    assert_freqs(rope_frequencies(64, scaling={"rope_theta": None}), ref_plain(64, 10000.0))
    assert_freqs(rope_frequencies(64, base=500000, scaling={"rope_theta": 500000.0}),
                 ref_plain(64, 500000.0))


def test_base_contradicting_rope_theta_is_an_error():
    with pytest.raises(ValueError, match=r"base=10000\.0.*rope_theta.*500000\.0"):
        rope_frequencies(64, base=10000.0, scaling={"rope_type": "linear", "factor": 2.0,
                                                    "rope_theta": 500000.0})


def test_original_length_from_dict_wins_over_keyword():
    scaling = dict(LLAMA31)
    freqs = rope_frequencies(128, base=500000.0, scaling=scaling, max_position_embeddings=131072)
    assert_freqs(freqs, ref_llama3(128, 500000.0, 8.0, 1.0, 4.0, 8192))

    dynamic = {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 2048}
    freqs = rope_frequencies(64, scaling=dynamic, seq_len=3000, max_position_embeddings=4096)
    assert_freqs(freqs, ref_dynamic(64, 10000.0, 2.0, 3000, 2048))


def test_original_length_falls_back_to_keyword():
    scaling = {k: v for k, v in LLAMA31.items() if k != "original_max_position_embeddings"}
    freqs = rope_frequencies(128, base=500000.0, scaling=scaling, max_position_embeddings=4096)
    assert_freqs(freqs, ref_llama3(128, 500000.0, 8.0, 1.0, 4.0, 4096))

    yarn = {"rope_type": "yarn", "factor": 4.0}
    assert_freqs(rope_frequencies(64, scaling=yarn, max_position_embeddings=2048),
                 ref_yarn(64, 10000.0, 4.0, 2048), ref_yarn_attention(4.0))


@pytest.mark.parametrize("scaling", [
    {"rope_type": "dynamic", "factor": 2.0},
    {"rope_type": "yarn", "factor": 2.0},
    {"rope_type": "longrope", "short_factor": [1.0] * 4, "long_factor": [2.0] * 4, "factor": 2.0},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0},
])
def test_missing_original_length_names_both_keys(scaling):
    with pytest.raises(ValueError, match=r"original_max_position_embeddings.*max_position_embeddings="):
        rope_frequencies(8, scaling=scaling)


def test_longrope_factor_defaults_to_length_ratio():
    short, long = [1.0] * 8, [4.0] * 8
    scaling = {"rope_type": "longrope", "short_factor": short, "long_factor": long,
               "original_max_position_embeddings": 4096}
    freqs = rope_frequencies(16, scaling=scaling, max_position_embeddings=65536)
    assert freqs.attention_scaling == pytest.approx(ref_longrope_attention(16.0, 4096), rel=EXACT)
    assert parse_rope_spec(16, scaling=scaling, max_position_embeddings=65536).factor == 16.0

    explicit = dict(scaling, factor=4.0)
    freqs = rope_frequencies(16, scaling=explicit, max_position_embeddings=65536)
    assert freqs.attention_scaling == pytest.approx(ref_longrope_attention(4.0, 4096), rel=EXACT)

    # Without max_position_embeddings the ratio is unknown, unless attention_factor makes
    # factor unnecessary.
    with pytest.raises(ValueError, match=r"factor.*max_position_embeddings"):
        rope_frequencies(16, scaling=scaling)
    assert rope_frequencies(16, scaling=dict(scaling, attention_factor=1.5)).attention_scaling == 1.5


def test_longrope_without_original_in_dict_has_unit_factor():
    scaling = {"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [4.0] * 8}
    freqs = rope_frequencies(16, scaling=scaling, max_position_embeddings=4096)
    assert freqs.attention_scaling == 1.0


def test_yarn_factor_defaults_to_length_ratio():
    scaling = {"rope_type": "yarn", "original_max_position_embeddings": 4096}
    freqs = rope_frequencies(64, scaling=scaling, max_position_embeddings=32768)
    assert_freqs(freqs, ref_yarn(64, 10000.0, 8.0, 4096), ref_yarn_attention(8.0))


def test_yarn_explicit_factor_wins_over_length_ratio():
    scaling = {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
               "mscale": 0.707, "mscale_all_dim": 1.0}
    freqs = rope_frequencies(64, scaling=scaling, max_position_embeddings=131072)
    assert_freqs(freqs, ref_yarn(64, 10000.0, 40.0, 4096), ref_yarn_attention(40.0, 0.707, 1.0))


def test_dynamic_switches_strictly_above_original():
    spec = parse_rope_spec(64, scaling={"rope_type": "dynamic", "factor": 4.0}, max_position_embeddings=1024)
    plain = rope_frequencies(64)
    for seq_len in (None, 0, 1, 1023, 1024):
        np.testing.assert_array_equal(spec.frequencies(seq_len).inv_freq, plain.inv_freq)
    assert spec.frequencies(None) is spec.frequencies(1024)
    above = spec.frequencies(1025)
    assert above is not spec.frequencies(1024)
    assert np.all(above.inv_freq[1:] < plain.inv_freq[1:])
    assert spec.depends_on_seq_len


def test_longrope_switches_strictly_above_original():
    scaling = {"rope_type": "longrope", "short_factor": [1.0] * 4, "long_factor": [3.0] * 4,
               "original_max_position_embeddings": 100, "factor": 2.0}
    spec = parse_rope_spec(8, scaling=scaling)
    short = spec.frequencies(None)
    assert spec.frequencies(100) is short
    assert spec.frequencies(0) is short
    long = spec.frequencies(101)
    assert long is spec.frequencies(10**6)
    np.testing.assert_allclose(long.inv_freq, short.inv_freq / 3.0, rtol=EXACT)
    assert spec.depends_on_seq_len


PHIMOE_MSCALES = {"short_mscale": 1.243, "long_mscale": 1.118,
                  "original_max_position_embeddings": 100}


@pytest.mark.parametrize("rope_type, extra, short_freqs", [
    ("linear", {"factor": 4.0}, lambda: ref_linear(16, 10000.0, 4.0)),
    ("dynamic", {"factor": 4.0}, lambda: ref_plain(16, 10000.0)),
    ("yarn", {"factor": 4.0}, lambda: ref_yarn(16, 10000.0, 4.0, 100)),
    ("llama3", {"factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0},
     lambda: ref_llama3(16, 10000.0, 4.0, 1.0, 4.0, 100)),
    ("longrope", {"short_factor": [1.5] * 8, "long_factor": [3.0] * 8, "factor": 2.0},
     lambda: ref_longrope(16, 10000.0, [1.5] * 8)),
])
@pytest.mark.parametrize("seq_len", [None, 100, 101, 10**6])
def test_phimoe_mscales_replace_the_attention_factor_by_side(rope_type, extra, short_freqs,
                                                             seq_len):
    """Phi-3.5-MoE's rotary module, for every rope type but default: the frequencies
    formed without a sequence length at every length (dynamic NTK never grows, longrope
    keeps its short factors), cos and sin multiplied by short_mscale, or long_mscale
    past original_max_position_embeddings, in place of the type's attention factor."""
    scaling = {"rope_type": rope_type, **extra, **PHIMOE_MSCALES}
    freqs = rope_frequencies(16, scaling=scaling, seq_len=seq_len)
    long = seq_len is not None and seq_len > 100
    assert_freqs(freqs, short_freqs(), 1.118 if long else 1.243)


def test_phimoe_mscales_rotate_by_side_in_the_compiled_and_reference_backends():
    """A decode step past the original length takes long_mscale on both backends, with
    the frequencies of a short call (no dynamic NTK growth)."""
    scaling = {"rope_type": "dynamic", "factor": 4.0, **PHIMOE_MSCALES}
    w = np.array(ref_plain(16, 10000.0))
    rng = np.random.default_rng(7)
    q0 = rng.standard_normal((1, 1, 2, 16))
    for position, att in ((50, 1.243), (100, 1.118), (5000, 1.118)):
        angle = position * w
        x1, x2 = q0[..., :8], q0[..., 8:]
        c, s = np.cos(angle) * att, np.sin(angle) * att
        want = np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)
        for backend in ("cython", "numpy") if fastpe.info()["compiled"] else ("numpy",):
            with fastpe.use_backend(backend):
                for _ in range(2):  # the second call finds the kept state
                    q = q0.copy()
                    fastpe.apply_rope(q, positions=[position], scaling=scaling)
                    np.testing.assert_allclose(q, want, rtol=1e-13, atol=1e-13,
                                               err_msg=f"{backend} {position}")


def test_phimoe_mscales_need_the_original_length_and_each_other():
    with pytest.raises(ValueError, match=r"original_max_position_embeddings"):
        parse_rope_spec(16, scaling={"rope_type": "linear", "factor": 2.0,
                                     "short_mscale": 1.2, "long_mscale": 1.1})
    with pytest.raises(ValueError, match=r"short_mscale.*long_mscale.*together"):
        parse_rope_spec(16, scaling={"rope_type": "linear", "factor": 2.0, "short_mscale": 1.2,
                                     "original_max_position_embeddings": 100})
    # the module multiplies by neither with the default type
    spec = parse_rope_spec(16, scaling={"rope_type": "default", **PHIMOE_MSCALES})
    assert not spec.depends_on_seq_len and spec.frequencies(10**6).attention_scaling == 1.0


@pytest.mark.parametrize("scaling", [None, {"rope_type": "linear", "factor": 2.0}, dict(LLAMA31),
                                     {"rope_type": "yarn", "factor": 4.0,
                                      "original_max_position_embeddings": 1024}])
def test_seq_len_is_ignored_by_other_types(scaling):
    spec = parse_rope_spec(64, scaling=scaling)
    assert not spec.depends_on_seq_len
    assert spec.frequencies(10**7) is spec.frequencies(None)


def test_results_are_cached_and_read_only():
    first = rope_frequencies(128, base=10000.0)
    assert rope_frequencies(128, base=10000.0) is first
    assert rope_frequencies(128) is first  # equal specs share one cache
    assert rope_frequencies(128, scaling={"rope_type": "default", "rope_theta": 10000}) is first
    assert not first.inv_freq.flags.writeable
    with pytest.raises(ValueError):
        first.inv_freq[0] = 2.0

    # dict scalings are keyed by their contents, not their identity
    a = rope_frequencies(128, scaling=dict(LLAMA31, rope_theta=500000.0))
    b = rope_frequencies(128, scaling=dict(LLAMA31, rope_theta=500000.0))
    assert a is b
    assert not a.inv_freq.flags.writeable

    scaling = {"rope_type": "linear", "factor": 2.0}
    before = rope_frequencies(64, scaling=scaling)
    scaling["factor"] = 4.0
    after = rope_frequencies(64, scaling=scaling)
    np.testing.assert_allclose(after.inv_freq, before.inv_freq / 2.0, rtol=EXACT)


def test_cache_keeps_bool_and_int_apart():
    rope_frequencies(8, scaling={"rope_type": "linear", "factor": 1})
    with pytest.raises(TypeError, match="factor"):
        rope_frequencies(8, scaling={"rope_type": "linear", "factor": True})
    longrope = dict(LONGROPE, short_factor=[1, 1, 1, 1])
    rope_frequencies(8, scaling=longrope)
    with pytest.raises(TypeError, match=r"short_factor.*\[0\]"):
        rope_frequencies(8, scaling=dict(longrope, short_factor=[True, 1, 1, 1]))


def test_unhashable_scaling_values_still_work():
    scaling = {"rope_type": "longrope", "short_factor": np.ones(4), "long_factor": np.full(4, 2.0),
               "original_max_position_embeddings": 16, "factor": 2.0, "notes": {"a": [1]}}
    freqs = rope_frequencies(8, scaling=scaling, seq_len=17)
    assert_freqs(freqs, ref_longrope(8, 10000.0, [2.0] * 4), ref_longrope_attention(2.0, 16))


def test_dynamic_cache_recomputes_after_many_lengths():
    spec = parse_rope_spec(32, scaling={"rope_type": "dynamic", "factor": 2.0}, max_position_embeddings=16)
    first = spec.frequencies(17).inv_freq.copy()
    for seq_len in range(18, 400):
        spec.frequencies(seq_len)
    np.testing.assert_array_equal(spec.frequencies(17).inv_freq, first)


def test_spec_is_immutable_hashable_and_shared():
    spec = parse_rope_spec(64, scaling=dict(LLAMA31))
    assert parse_rope_spec(64, scaling=dict(LLAMA31)) is spec
    assert parse_rope_spec(64, base=10000.0, scaling=dict(LLAMA31, notes="x")) is spec
    assert hash(spec) == hash(parse_rope_spec(64, base=10000, scaling=dict(LLAMA31)))
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.base = 2.0
    assert (spec.rope_type, spec.dim, spec.base, spec.original_max_position_embeddings) == (
        "llama3", 64, 10000.0, 8192)


def test_old_type_key_and_rope_type_precedence():
    old = rope_frequencies(64, scaling={"type": "linear", "factor": 2.0})
    assert_freqs(old, ref_linear(64, 10000.0, 2.0))
    both = rope_frequencies(64, scaling={"type": "dynamic", "rope_type": "linear", "factor": 2.0})
    assert_freqs(both, ref_linear(64, 10000.0, 2.0))


def test_unknown_keys_are_ignored():
    scaling = dict(LLAMA31, rope_theta=500000.0, mrope_section=[1, 2], foo={"bar": 1})
    assert_freqs(rope_frequencies(128, scaling=scaling), ref_llama3(128, 500000.0, 8.0, 1.0, 4.0, 8192))


def test_numpy_scalars_are_accepted():
    freqs = rope_frequencies(np.int64(64), base=np.float32(10000.0), seq_len=np.int32(5),
                             scaling={"rope_type": "linear", "factor": np.float64(2.0)})
    assert_freqs(freqs, ref_linear(64, 10000.0, 2.0))


# -- 4. errors ------------------------------------------------------------------------------

LONGROPE = {"rope_type": "longrope", "short_factor": [1.0] * 4, "long_factor": [2.0] * 4,
            "original_max_position_embeddings": 64, "factor": 2.0}
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}

ERRORS = [
    # (kwargs, exception, message pattern)
    (dict(dim="64"), TypeError, r"\bdim\b must be an int"),
    (dict(dim=True), TypeError, r"\bdim\b"),
    (dict(dim=0), ValueError, r"\bdim\b.*>= 1"),
    (dict(dim=-8), ValueError, r"\bdim\b"),
    (dict(dim=63), ValueError, r"\bdim\b.*even"),
    (dict(dim=64.5), ValueError, r"\bdim\b.*whole"),
    (dict(base="1e4"), TypeError, r"\bbase\b"),
    (dict(base=0.0), ValueError, r"\bbase\b.*> 0"),
    (dict(base=-1.0), ValueError, r"\bbase\b"),
    (dict(base=float("inf")), ValueError, r"\bbase\b.*finite"),
    (dict(base=float("nan")), ValueError, r"\bbase\b.*finite"),
    (dict(scaling=[("rope_type", "linear")]), TypeError, r"\bscaling\b.*dict"),
    (dict(scaling="linear"), TypeError, r"\bscaling\b.*dict"),
    (dict(scaling={"rope_type": "ntk", "factor": 2.0}), ValueError,
     r"'ntk'.*rope_type.*default, linear, dynamic, yarn, longrope, llama3"),
    (dict(scaling={"type": "su"}), ValueError, r"'su'.*supported"),
    (dict(scaling={"rope_type": 3}), TypeError, r"rope_type.*string"),
    (dict(scaling={"rope_theta": "1e4"}), TypeError, r"rope_theta"),
    (dict(scaling={"rope_theta": -5.0}), ValueError, r"rope_theta.*> 0"),
    (dict(scaling={"partial_rotary_factor": 0.0}), ValueError, r"partial_rotary_factor.*> 0"),
    (dict(scaling={"partial_rotary_factor": 1.5}), ValueError, r"partial_rotary_factor.*\(0, 1\]"),
    (dict(scaling={"partial_rotary_factor": "half"}), TypeError, r"partial_rotary_factor"),
    (dict(dim=64, scaling={"partial_rotary_factor": 0.3}), ValueError, r"partial_rotary_factor.*19.*even"),
    (dict(dim=4, scaling={"partial_rotary_factor": 0.25}), ValueError, r"partial_rotary_factor.*even"),
    (dict(scaling={"rope_type": "linear"}), ValueError, r"factor.*required.*linear"),
    (dict(scaling={"rope_type": "linear", "factor": None}), ValueError, r"factor.*required"),
    (dict(scaling={"rope_type": "linear", "factor": 0.0}), ValueError, r"factor.*> 0"),
    (dict(scaling={"rope_type": "linear", "factor": -2.0}), ValueError, r"factor.*> 0"),
    (dict(scaling={"rope_type": "linear", "factor": float("inf")}), ValueError, r"factor.*finite"),
    (dict(scaling={"rope_type": "linear", "factor": "2"}), TypeError, r"factor"),
    (dict(scaling={"rope_type": "dynamic"}, max_position_embeddings=64), ValueError,
     r"factor.*required.*dynamic"),
    (dict(scaling={"rope_type": "dynamic", "factor": 2.0}), ValueError,
     r"original_max_position_embeddings.*max_position_embeddings"),
    (dict(scaling=dict(YARN, beta_fast=0.0)), ValueError, r"beta_fast.*> 0"),
    (dict(scaling=dict(YARN, beta_slow=-1.0)), ValueError, r"beta_slow.*> 0"),
    (dict(scaling=dict(YARN, beta_fast=1.0, beta_slow=2.0)), ValueError, r"beta_fast.*beta_slow"),
    (dict(scaling=dict(YARN, truncate="no")), TypeError, r"truncate.*bool"),
    (dict(scaling=dict(YARN, attention_factor=0.0)), ValueError, r"attention_factor.*> 0"),
    (dict(scaling=dict(YARN, mscale="1")), TypeError, r"mscale"),
    (dict(scaling=dict(YARN, mscale=-20.0, mscale_all_dim=1.0)), ValueError, r"mscale.*mscale_all_dim"),
    (dict(scaling={"rope_type": "yarn", "original_max_position_embeddings": 64}), ValueError,
     r"factor.*required.*max_position_embeddings"),
    (dict(scaling=dict(YARN, original_max_position_embeddings=0)), ValueError,
     r"original_max_position_embeddings.*>= 1"),
    (dict(scaling=dict(YARN, original_max_position_embeddings="4096")), TypeError,
     r"original_max_position_embeddings"),
    (dict(scaling=dict(YARN, original_max_position_embeddings=4096.5)), ValueError,
     r"original_max_position_embeddings.*whole"),
    (dict(base=1.0, scaling=YARN), ValueError, r"yarn.*base"),
    (dict(scaling={k: v for k, v in LONGROPE.items() if k != "short_factor"}), ValueError,
     r"short_factor.*required"),
    (dict(scaling=dict(LONGROPE, short_factor=[1.0] * 5)), ValueError, r"short_factor.*4.*got 5"),
    (dict(scaling=dict(LONGROPE, long_factor="abcd")), TypeError, r"long_factor.*list"),
    (dict(scaling=dict(LONGROPE, long_factor=3.0)), TypeError, r"long_factor.*list"),
    (dict(scaling=dict(LONGROPE, long_factor=[1.0, "x", 1.0, 1.0])), TypeError, r"long_factor.*\[1\]"),
    (dict(scaling=dict(LONGROPE, long_factor=[1.0, 1.0, 0.0, 1.0])), ValueError, r"long_factor.*\[2\].*> 0"),
    (dict(scaling=dict(LONGROPE, attention_factor=-1.0)), ValueError, r"attention_factor"),
    (dict(scaling=dict(LONGROPE, factor=None)), ValueError, r"factor.*max_position_embeddings"),
    (dict(scaling=dict(LONGROPE, original_max_position_embeddings=1)), ValueError,
     r"original_max_position_embeddings.*>= 2"),
    (dict(scaling={k: v for k, v in LLAMA31.items() if k != "low_freq_factor"}), ValueError,
     r"low_freq_factor.*required.*llama3"),
    (dict(scaling={k: v for k, v in LLAMA31.items() if k != "factor"}), ValueError, r"factor.*required"),
    (dict(scaling=dict(LLAMA31, low_freq_factor=5.0)), ValueError, r"low_freq_factor.*high_freq_factor"),
    # equal factors: transformers' blend gives NaN where a wavelength is the boundary's
    (dict(scaling=dict(LLAMA31, low_freq_factor=8192 / (2 * math.pi),
                       high_freq_factor=8192 / (2 * math.pi))), ValueError,
     r"wavelength equal to original_max_position_embeddings"),
    (dict(scaling=dict(LLAMA31, high_freq_factor=0.0)), ValueError, r"high_freq_factor.*> 0"),
    (dict(seq_len=-1), ValueError, r"seq_len.*>= 0"),
    (dict(seq_len=1.5), ValueError, r"seq_len.*whole"),
    (dict(seq_len="10"), TypeError, r"seq_len"),
    (dict(max_position_embeddings=0), ValueError, r"max_position_embeddings.*>= 1"),
    (dict(max_position_embeddings="4k"), TypeError, r"max_position_embeddings"),
]


@pytest.mark.parametrize("kwargs, exception, pattern", ERRORS, ids=lambda v: None)
def test_errors_name_the_field(kwargs, exception, pattern):
    kwargs = dict({"dim": 8}, **kwargs)
    dim = kwargs.pop("dim")
    for _ in range(2):  # errors must not be cached
        with pytest.raises(exception, match=pattern):
            rope_frequencies(dim, **kwargs)


def test_errors_from_parse_rope_spec():
    with pytest.raises(ValueError, match="factor"):
        parse_rope_spec(8, scaling={"rope_type": "linear"})
    spec = parse_rope_spec(8)
    with pytest.raises(TypeError, match="seq_len"):
        spec.frequencies("5")


# -- 5. Hugging Face configs ---------------------------------------------------------------------

LLAMA31_8B = {
    "model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
    "max_position_embeddings": 131072, "rope_theta": 500000.0,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
}
GPT_NEOX_20B = {"model_type": "gpt_neox", "hidden_size": 6144, "num_attention_heads": 64,
                "rotary_pct": 0.25, "rotary_emb_base": 10000, "max_position_embeddings": 2048}
GPT_J_6B = {"model_type": "gptj", "n_embd": 4096, "n_head": 16, "rotary_dim": 64, "n_positions": 2048}
PHI_2 = {"model_type": "phi", "hidden_size": 2560, "num_attention_heads": 32, "partial_rotary_factor": 0.4,
         "rope_theta": 10000.0, "rope_scaling": None, "max_position_embeddings": 2048}
QWEN2_7B = {"model_type": "qwen2", "hidden_size": 3584, "num_attention_heads": 28,
            "num_key_value_heads": 4, "rope_theta": 1000000.0, "rope_scaling": None,
            "max_position_embeddings": 32768}
LLAMA32_1B_V5 = {
    "model_type": "llama", "hidden_size": 2048, "num_attention_heads": 32, "head_dim": 64,
    "max_position_embeddings": 131072,
    "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                        "original_max_position_embeddings": 8192},
}


@pytest.mark.parametrize("config, expected", [
    (LLAMA31_8B, dict(head_dim=128, rotary_dim=128, base=500000.0, max_position_embeddings=131072,
                      style="neox", scaling={k: v for k, v in LLAMA31_8B["rope_scaling"].items()})),
    (GPT_NEOX_20B, dict(head_dim=96, rotary_dim=24, base=10000.0, max_position_embeddings=2048,
                        style="neox", scaling=None)),
    (GPT_J_6B, dict(head_dim=256, rotary_dim=64, base=10000.0, max_position_embeddings=2048,
                    style="gptj", scaling=None)),
    (PHI_2, dict(head_dim=80, rotary_dim=32, base=10000.0, max_position_embeddings=2048,
                 style="neox", scaling=None)),
    (QWEN2_7B, dict(head_dim=128, rotary_dim=128, base=1000000.0, max_position_embeddings=32768,
                    style="neox", scaling=None)),
    (LLAMA32_1B_V5, dict(head_dim=64, rotary_dim=64, base=500000.0, max_position_embeddings=131072,
                         style="neox", scaling={k: v for k, v in LLAMA32_1B_V5["rope_parameters"].items()
                                                if k != "rope_theta"})),
])
def test_hf_rope_config_on_real_config_dicts(config, expected):
    snapshot = json.dumps(config, sort_keys=True)
    got = hf_rope_config(config)
    # these families rotate the leading features of the whole head, forwards
    assert got == dict(expected, features=(0, expected["head_dim"]), inverse=False)
    assert isinstance(got["base"], float)
    assert json.dumps(config, sort_keys=True) == snapshot  # the caller's config is untouched


def test_hf_rope_config_feeds_rope_frequencies():
    c = hf_rope_config(LLAMA31_8B)
    freqs = rope_frequencies(c["rotary_dim"], base=c["base"], scaling=c["scaling"],
                             max_position_embeddings=c["max_position_embeddings"])
    assert_freqs(freqs, ref_llama3(128, 500000.0, 8.0, 1.0, 4.0, 8192))

    c = hf_rope_config(PHI_2)
    assert_freqs(rope_frequencies(c["rotary_dim"], base=c["base"], scaling=c["scaling"]),
                 ref_plain(32, 10000.0))


def test_hf_rope_config_v5_partial_rotary_in_rope_parameters():
    config = {"model_type": "phi", "hidden_size": 2560, "num_attention_heads": 32,
              "max_position_embeddings": 2048,
              "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                  "partial_rotary_factor": 0.4}}
    c = hf_rope_config(config)
    assert (c["rotary_dim"], c["base"], c["scaling"]) == (32, 10000.0, None)


def test_hf_rope_config_rope_dict_wins_over_top_level():
    # Phi's rotary module reads partial_rotary_factor (Llama's would not)
    config = dict(LLAMA32_1B_V5, model_type="phi", rope_theta=10000.0,
                  partial_rotary_factor=0.5)
    config["rope_parameters"] = dict(config["rope_parameters"], partial_rotary_factor=0.25)
    c = hf_rope_config(config)
    assert (c["base"], c["rotary_dim"]) == (500000.0, 16)
    assert "partial_rotary_factor" not in c["scaling"]


def test_hf_rope_config_refuses_a_partial_width_llamas_attention_cannot_apply():
    # transformers' llama3 frequencies would cover a quarter of the head, which Llama's
    # attention rotates whole: its own code fails
    config = dict(LLAMA32_1B_V5)
    config["rope_parameters"] = dict(config["rope_parameters"], partial_rotary_factor=0.25)
    with pytest.raises(ValueError, match=r"rotates the whole head.*'llama3'"):
        hf_rope_config(config)
    # the default type ignores it, as LlamaRotaryEmbedding does
    config["rope_parameters"] = {"rope_type": "default", "rope_theta": 500000.0,
                                 "partial_rotary_factor": 0.25}
    assert hf_rope_config(config)["rotary_dim"] == 64


def test_hf_rope_config_dynamic_grows_past_max_position_embeddings():
    # transformers' dynamic NTK ignores the dict's original length (it warns of the key);
    # rope_frequencies itself still reads it (test_original_length_from_dict_wins_over_keyword)
    config = {"model_type": "llama", "hidden_size": 256, "num_attention_heads": 4,
              "max_position_embeddings": 4096,
              "rope_scaling": {"type": "dynamic", "factor": 2.0,
                               "original_max_position_embeddings": 2048}}
    c = hf_rope_config(config)
    assert "original_max_position_embeddings" not in c["scaling"]
    freqs = rope_frequencies(c["rotary_dim"], base=c["base"], scaling=c["scaling"],
                             max_position_embeddings=c["max_position_embeddings"], seq_len=5000)
    assert_freqs(freqs, ref_dynamic(64, 10000.0, 2.0, 5000, 4096))


@pytest.mark.parametrize("backend", ["cython", "numpy"])
@pytest.mark.parametrize("kwargs, names", [
    (dict(base=1e-320), r"check base \("),
    (dict(base=1e-3), r"check base \("),
    (dict(scaling={"rope_type": "linear", "factor": 0.1}), r"check base, scaling\['factor'\]"),
    (dict(scaling={"rope_type": "longrope", "short_factor": [0.1] * 4, "long_factor": [1.0] * 4,
                   "original_max_position_embeddings": 16}), r"short_factor"),
], ids=["base-denormal", "base-far-below-1", "linear-far-below-1", "longrope-far-below-1"])
def test_frequencies_above_the_limit_are_refused(kwargs, names, backend):
    """Past 8 rad per position the angle of a position below the 2**32 limit is not
    accurate to float32 precision in float64 (base=1e-320 gives inverse frequencies up
    to 1e280); DINOv3's 2 pi per unit stays within it."""
    if backend == "cython" and fastpe.info()["backend"] != "cython":
        pytest.skip("compiled backend not built")
    q = np.ones((1, 4, 1, 8))
    with fastpe.use_backend(backend), pytest.raises(ValueError, match=names):
        fastpe.apply_rope(q, max_position_embeddings=64, **kwargs)
    assert (q == 1).all()
    with pytest.raises(ValueError, match=r"outside \[0, 8\.0\]"):
        rope_frequencies(8, max_position_embeddings=64, **kwargs)
    # the edge: a base just above 1 keeps every frequency at most 1
    assert rope_frequencies(8, base=1.0 + 2**-40).inv_freq.max() == 1.0


def test_hf_rope_config_phi3_top_level_original_length():
    config = {"model_type": "phi3", "hidden_size": 3072, "num_attention_heads": 32,
              "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
              "rope_theta": 10000.0,
              "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 48, "long_factor": [2.0] * 48}}
    c = hf_rope_config(config)
    assert c["scaling"]["original_max_position_embeddings"] == 4096
    freqs = rope_frequencies(c["rotary_dim"], base=c["base"], scaling=c["scaling"],
                             max_position_embeddings=c["max_position_embeddings"], seq_len=5000)
    assert_freqs(freqs, ref_longrope(96, 10000.0, [2.0] * 48), ref_longrope_attention(32.0, 4096))


def test_hf_rope_config_on_config_object():
    config = SimpleNamespace(model_type="codegen", hidden_size=4096, num_attention_heads=16,
                             rotary_dim=64, max_position_embeddings=2048, head_dim=None)
    assert hf_rope_config(config) == dict(head_dim=256, rotary_dim=64, base=10000.0, scaling=None,
                                          max_position_embeddings=2048, style="gptj",
                                          features=(0, 256), inverse=False)

    llama = SimpleNamespace(model_type="llama", hidden_size=4096, num_attention_heads=32,
                            head_dim=128, max_position_embeddings=131072,
                            rope_parameters=dict(LLAMA31, rope_theta=500000.0))
    c = hf_rope_config(llama)
    assert (c["base"], c["rotary_dim"], c["scaling"]) == (500000.0, 128, LLAMA31)


def test_hf_rope_config_styles():
    base = {"hidden_size": 512, "num_attention_heads": 8}
    for model_type in ("gptj", "codegen", "cohere", "glm", "glm4"):
        assert hf_rope_config(dict(base, model_type=model_type))["style"] == "gptj"
    for model_type in ("llama", "gpt_neox", "phi", "qwen2", "mistral", None):
        assert hf_rope_config(dict(base, model_type=model_type))["style"] == "neox"
    deepseek = dict(base, model_type="deepseek_v3", rope_interleave=True, qk_rope_head_dim=64,
                    qk_nope_head_dim=128)
    assert hf_rope_config(deepseek)["style"] == "gptj"
    assert hf_rope_config(dict(deepseek, rope_interleave=False))["style"] == "neox"


def test_hf_rope_config_per_layer_type_parameters():
    config = {"model_type": "gemma3_text", "hidden_size": 2560, "num_attention_heads": 8, "head_dim": 256,
              "max_position_embeddings": 131072,
              "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                  "full_attention": {"rope_type": "linear", "factor": 8.0,
                                                     "rope_theta": 1000000.0}}}
    with pytest.raises(ValueError, match=r"rope_parameters.*sliding_attention.*layer_type"):
        hf_rope_config(config)
    full = hf_rope_config(config, layer_type="full_attention")
    assert (full["base"], full["scaling"]) == (1000000.0, {"rope_type": "linear", "factor": 8.0})
    local = hf_rope_config(config, layer_type="sliding_attention")
    assert (local["base"], local["scaling"]) == (10000.0, None)
    with pytest.raises(ValueError, match=r"layer_type='chunked'"):
        hf_rope_config(config, layer_type="chunked")


@pytest.mark.parametrize("config, exception, pattern", [
    ({"model_type": "llama", "hidden_size": 4096}, ValueError, r"head_dim.*hidden_size.*num_attention_heads"),
    ({"num_attention_heads": 32}, ValueError, r"head_dim"),
    ({"head_dim": "128"}, TypeError, r"head_dim"),
    ({"model_type": "gptj", "head_dim": 64, "rotary_dim": 65}, ValueError, r"rotary_dim.*even"),
    ({"model_type": "gptj", "head_dim": 64, "rotary_dim": 128}, ValueError,
     r"rotary_dim.*head_dim=64"),
    ({"head_dim": 63}, ValueError, r"head_dim.*even"),
    ({"model_type": "gpt_neox", "head_dim": 64, "rotary_pct": 1.5}, ValueError,
     r"rotary_pct must be in"),
    # a custom model: Llama's code ignores the key, others read it
    ({"head_dim": 64, "rotary_pct": 0.5}, ValueError, r"rotary_pct=0\.5.*cannot tell"),
    ({"head_dim": 64, "rope_scaling": "linear"}, TypeError, r"rope_scaling.*dict"),
    ({"head_dim": 64, "rope_theta": -1.0}, ValueError, r"rope_theta"),
    ({"head_dim": 64, "max_position_embeddings": 0}, ValueError, r"max_position_embeddings"),
])
def test_hf_rope_config_errors(config, exception, pattern):
    with pytest.raises(exception, match=pattern):
        hf_rope_config(config)


def _transformers_of_version(monkeypatch, version):
    """A stand-in transformers of `version` in sys.modules (none need be installed): its
    configuration_utils.PretrainedConfig, a config class holding its keys as attributes."""
    import sys
    import types

    class PretrainedConfig:
        def __init__(self, **keys):
            self.__dict__.update(keys, transformers_version=version)

        def to_dict(self):
            return dict(self.__dict__)

    utils = types.ModuleType("transformers.configuration_utils")
    utils.PretrainedConfig = PretrainedConfig
    transformers = types.ModuleType("transformers")
    transformers.__version__ = version
    monkeypatch.setitem(sys.modules, "transformers", transformers)
    monkeypatch.setitem(sys.modules, "transformers.configuration_utils", utils)
    return PretrainedConfig


TRANSFORMERS_4_ROPES = {
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
    "longrope": {"rope_type": "longrope", "factor": 8.0, "original_max_position_embeddings": 8,
                 "short_factor": [1.0 + 0.1 * i for i in range(8)],
                 "long_factor": [2.0 + 0.3 * i for i in range(8)]},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
    "linear": {"type": "linear", "factor": 2.0},
}


@pytest.mark.parametrize("version", ["4.57.6", "4.46.3", "5.25.0"])
@pytest.mark.parametrize("rope", list(TRANSFORMERS_4_ROPES))
def test_a_transformers_4_config_object_of_yarn_or_longrope_is_refused(monkeypatch, version,
                                                                       rope):
    """transformers 4's YaRN and LongRoPE read their original context length from other
    keys than 5's (LongRoPE never from rope_scaling, YaRN from max_position_embeddings),
    so a model of 4 rotates otherwise than fastpe's reading of its config: a config object
    of 4 with them is refused by name; its other rope types, a config of 5 and any
    config.json dict are read as transformers 5 reads them."""
    config_class = _transformers_of_version(monkeypatch, version)
    keys = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
            "max_position_embeddings": 64, "rope_theta": 10000.0,
            "rope_scaling": TRANSFORMERS_4_ROPES[rope]}
    config = config_class(**keys)
    as_dict = fastpe.RotaryEmbedding.from_hf_config(config.to_dict())
    if version < "5" and rope in ("yarn", "longrope"):
        with pytest.raises(ValueError, match=rf"transformers {version} config with rope_type "
                                             rf"'{rope}'.*upgrade transformers"):
            fastpe.RotaryEmbedding.from_hf_config(config)
        return
    got = fastpe.RotaryEmbedding.from_hf_config(config)
    positions = np.array([0, 5, 40, 90])
    for a, b in zip(got.cos_sin(positions, dtype="float64"),
                    as_dict.cos_sin(positions, dtype="float64")):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("case", ["phi3-su", "rope_parameters"])
def test_a_transformers_4_config_object_read_otherwise_is_refused(monkeypatch, case):
    """Phi-3's "su", which fastpe reads as LongRoPE, is refused from transformers 4 as
    LongRoPE is; so is a config of 4 holding rope_parameters (a config.json of 5 loaded
    by 4), which 4's model never reads: it rotates by rope_scaling and rope_theta."""
    config_class = _transformers_of_version(monkeypatch, "4.41.2")
    keys = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
            "max_position_embeddings": 64, "rope_theta": 10000.0}
    if case == "phi3-su":
        su = {**TRANSFORMERS_4_ROPES["longrope"], "type": "su"}
        del su["rope_type"]
        keys.update(model_type="phi3", rope_scaling=su)
        match = r"transformers 4\.41\.2 config with rope_type 'longrope'"
    else:
        keys.update(rope_scaling=None, rope_parameters={**TRANSFORMERS_4_ROPES["yarn"],
                                                        "rope_theta": 10000.0})
        match = r"transformers 4\.41\.2 config holding rope_parameters"
    with pytest.raises(ValueError, match=match):
        fastpe.RotaryEmbedding.from_hf_config(config_class(**keys))
