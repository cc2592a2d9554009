"""The canonical workloads: one function per workload, returning its Workload (the call,
its input arrays, and the fastpe, reference and NumPy implementations of it).

Adding a workload is adding one such function and listing it in ``workloads()``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

import fastpe

from .._typing import Style
from .baselines import (
    NumpyRope,
    numpy_add_learned,
    numpy_add_sinusoidal,
    numpy_alibi_bias,
    numpy_alibi_decode,
    numpy_alibi_padded_decode,
    numpy_alibi_prefill,
    numpy_t5_decode,
    prepare_numpy_disentangled,
    prepare_numpy_table,
    prepare_textbook_table,
)
from .common import (
    LLAMA3_BASE,
    LLAMA3_SCALING,
    SIZES,
    Arrays,
    Prepare,
    Result,
    Runner,
    Size,
    Workload,
    random_array,
)
from .program import llama_config, make_model, prepare_step

# The checked part of q and k (batch, seq, heads, head_dim): RoPE turns every head alike.
EVERY_4TH_HEAD = {"q": (slice(None), slice(None), slice(None, None, 4)),
                  "k": (slice(None), slice(None), slice(None, None, 4))}


# The checked part of x (batch, seq, dim): every sequence of the batch gets the same rows.
EVERY_4TH_SEQUENCE = {"x": (slice(None, None, 4),)}

# The embedding adds and the one-axis RoPE workloads run in bfloat16 too (--dtype
# bfloat16, with ml_dtypes installed).
HALF_DTYPES = ("float16", "bfloat16", "float32", "float64")


# ---- sinusoidal ---------------------------------------------------------------------------

def _table_workload(size: Size) -> Workload:
    length, dim = size["table"]

    def make(dtype: np.dtype) -> Arrays:
        return {"out": np.zeros((length, dim), dtype)}

    def fastpe_(arrays: Arrays, threads: int) -> Runner:
        def run(a: Arrays) -> Result:
            return (fastpe.sinusoidal_table(length, dim, out=a["out"], num_threads=threads),)
        return run

    def reference(arrays: Arrays, threads: int) -> Runner:
        def run(a: Arrays) -> Result:
            return (fastpe.reference.sinusoidal_table(length, dim, out=a["out"]),)
        return run

    # float32 angles: the angle's absolute error is a few float32 ulp of position * w,
    # up to about 2 * length * 2^-23 (measured: 8.5e-4 at length 8192).
    float32_atol = 2.0 * length * 2.0**-23 + 1e-6
    return Workload(
        name="sinusoidal-table", family="sinusoidal",
        title=f"sinusoidal_table({length}, {dim}, out=buf)",
        make=make, inplace=(), result=("out",), floor="fill",
        impls={"fastpe": fastpe_, "reference": reference, "numpy": prepare_numpy_table,
               "textbook": prepare_textbook_table},
        numpy_note="the textbook float32 formula in 64-row blocks, sin/cos straight into out",
        atol={"numpy": float32_atol, "textbook": float32_atol})


def _add_sinusoidal_workload(size: Size) -> Workload:
    shape = size["embed"]

    def make(dtype: np.dtype) -> Arrays:
        return {"x": random_array(shape, dtype)}

    def fastpe_(arrays: Arrays, threads: int) -> Runner:
        def run(a: Arrays) -> Result:
            return (fastpe.add_sinusoidal(a["x"], num_threads=threads),)
        return run

    def reference(arrays: Arrays, threads: int) -> Runner:
        def run(a: Arrays) -> Result:
            return (fastpe.reference.add_sinusoidal(a["x"]),)
        return run

    return Workload(
        name="sinusoidal-add", family="sinusoidal",
        title=f"add_sinusoidal(x {shape})",
        make=make, inplace=("x",), result=("x",), floor="stream",
        impls={"fastpe": fastpe_, "reference": reference, "numpy": numpy_add_sinusoidal},
        numpy_note="x += a cached table (built once, untimed): one in-place broadcast add",
        check_index=EVERY_4TH_SEQUENCE, dtypes=HALF_DTYPES)


# ---- learned ------------------------------------------------------------------------------

def _learned_workload(size: Size) -> Workload:
    shape, max_len = size["embed"], size["max_len"]

    def make(dtype: np.dtype) -> Arrays:
        table = random_array((max_len, shape[-1]), dtype, scale=0.02)
        # the rows a call adds (positions 0 .. seq - 1), a view: the floor reads them too
        return {"x": random_array(shape, dtype), "table": table,
                "table_rows": table[:shape[-2]]}

    def fastpe_(arrays: Arrays, threads: int) -> Runner:
        def run(a: Arrays) -> Result:
            return (fastpe.add_learned(a["x"], a["table"], num_threads=threads),)
        return run

    def reference(arrays: Arrays, threads: int) -> Runner:
        def run(a: Arrays) -> Result:
            return (fastpe.reference.add_learned(a["x"], a["table"]),)
        return run

    return Workload(
        name="learned-add", family="learned",
        title=f"add_learned(x {shape}, table ({max_len}, {shape[-1]}))",
        make=make, inplace=("x",), result=("x",), floor="stream",
        impls={"fastpe": fastpe_, "reference": reference, "numpy": numpy_add_learned},
        numpy_note="x += table[:seq]: one in-place broadcast add of a table slice",
        check_index=EVERY_4TH_SEQUENCE, dtypes=HALF_DTYPES, reads=("table_rows",))


def _rope_workload(name: str, title: str, q_shape: tuple[int, ...], k_shape: tuple[int, ...],
                   *, style: Style = "neox", positions: np.ndarray | None = None,
                   offset: int = 0, base: float | None = None,
                   scaling: dict[str, Any] | None = None, per_call: bool = False,
                   entry: str | None = None,
                   note: str = "64-token chunks in place, 2 preallocated temporaries, cos/sin "
                        "inside") -> Workload:
    """A RoPE workload; `entry` is the public entry fastpe's contender calls:
    "apply_rope" (the arguments every call), "embedding" (a RotaryEmbedding parsed once,
    the way a model applies it) or "cached" (apply_rope_cached on a cos/sin cache made
    once); default apply_rope without scaling, the embedding with it."""
    neox = style == "neox"
    head_dim = q_shape[-1]
    entry = entry or ("apply_rope" if scaling is None else "embedding")

    def make(dtype: np.dtype) -> Arrays:
        return {"q": random_array(q_shape, dtype), "k": random_array(k_shape, dtype, 0.5)}

    def fastpe_(arrays: Arrays, threads: int) -> Runner:
        if entry == "apply_rope":
            def run(a: Arrays) -> Result:
                return fastpe.apply_rope(a["q"], a["k"], positions, offset=offset, base=base,
                                         scaling=scaling, style=style, layout="bshd",
                                         num_threads=threads)
        elif entry == "embedding":
            rope = fastpe.RotaryEmbedding(head_dim, base=base, scaling=scaling, style=style)

            def run(a: Arrays) -> Result:
                return rope(a["q"], a["k"], positions, offset=offset, layout="bshd",
                            num_threads=threads)
        else:
            freqs = fastpe.rope_frequencies(head_dim, base=base, scaling=scaling)
            top = int(offset + q_shape[1] if positions is None else np.max(positions) + 1)
            # q's dtype (of a NumPy array, or a torch tensor's name for it); a float16 or
            # bfloat16 cache's rows are no rotations (cos**2 + sin**2 off by up to 2**-8),
            # and thousands of timed calls in place on the same q and k grew them to inf
            dtype = np.dtype(str(arrays["q"].dtype).removeprefix("torch."))
            if dtype.itemsize < 4:
                dtype = np.dtype(np.float32)
            cos, sin = fastpe.rope_cos_sin(np.arange(top), freqs, dtype=dtype)

            def run(a: Arrays) -> Result:
                return fastpe.apply_rope_cached(a["q"], a["k"], cos, sin, positions,
                                                offset=offset, style=style, layout="bshd",
                                                num_threads=threads)
        return run

    def reference(arrays: Arrays, threads: int) -> Runner:
        def run(a: Arrays) -> Result:
            return fastpe.reference.apply_rope(a["q"], a["k"], positions, offset=offset,
                                               base=base, scaling=scaling, style=style)
        return run

    def numpy_(arrays: Arrays, threads: int) -> Runner:
        # The frequencies (and any scaling) are per-model constants, computed at init.
        freqs = fastpe.rope_frequencies(head_dim, base=base, scaling=scaling)
        impl = NumpyRope(arrays["q"], arrays["k"], freqs.inv_freq, neox=neox,
                         attention_scaling=freqs.attention_scaling)

        def run(a: Arrays) -> Result:
            return impl(a["q"], a["k"], positions, offset)
        return run

    return Workload(
        name=name, family="rope", title=title, make=make, inplace=("q", "k"),
        result=("q", "k"), floor="stream",
        impls={"fastpe": fastpe_, "reference": reference, "numpy": numpy_},
        numpy_note=note, per_call=per_call, check_index=EVERY_4TH_HEAD, dtypes=HALF_DTYPES,
        params=dict(style=style, positions=positions, offset=offset, base=base,
                    scaling=scaling, head_dim=head_dim,
                    max_position=int(offset + q_shape[1] - 1 if positions is None
                                     else np.max(positions))))


def rope_workloads(size: Size) -> list[Workload]:
    b, s, h, kvh, d = size["batch"], size["seq"], size["heads"], size["kv_heads"], size["head_dim"]
    nb, pos = size["decode_batch"], size["decode_pos"]
    shape = (b, s, h, d)
    # batched decode: one new token per sequence, each sequence at its own length
    batch_pos = (np.arange(nb, dtype=np.int64) * 97 + pos - 97 * nb).reshape(nb, 1)
    return [
        _rope_workload("rope-prefill-neox", f"RoPE prefill q,k {shape} neox (LLaMA)",
                       shape, shape),
        _rope_workload("rope-prefill-gptj", f"RoPE prefill q,k {shape} gptj",
                       shape, shape, style="gptj"),
        _rope_workload("rope-decode", f"RoPE decode q,k {(1, 1, h, d)} at {pos}",
                       (1, 1, h, d), (1, 1, h, d), offset=pos, per_call=True,
                       note="the same code: cos/sin of the token, six in-place ufuncs per "
                            "array"),
        _rope_workload("rope-scaled-decode",
                       f"RoPE decode q,k {(1, 1, h, d)} at {pos}, apply_rope(scaling=llama3)",
                       (1, 1, h, d), (1, 1, h, d), offset=pos, per_call=True,
                       base=LLAMA3_BASE, scaling=LLAMA3_SCALING, entry="apply_rope",
                       note="the same code, llama3 frequencies computed once"),
        _rope_workload("rope-embedding-decode",
                       f"RoPE decode q,k {(1, 1, h, d)} at {pos}, RotaryEmbedding (llama3)",
                       (1, 1, h, d), (1, 1, h, d), offset=pos, per_call=True,
                       base=LLAMA3_BASE, scaling=LLAMA3_SCALING, entry="embedding",
                       note="the same code, llama3 frequencies computed once"),
        _rope_workload("rope-cached-decode",
                       f"RoPE decode q,k {(1, 1, h, d)} at {pos}, apply_rope_cached",
                       (1, 1, h, d), (1, 1, h, d), offset=pos, per_call=True, entry="cached",
                       note="the same code: cos/sin of the token, six in-place ufuncs per "
                            "array"),
        _rope_workload("rope-batched-decode",
                       f"RoPE batched decode q,k {(nb, 1, h, d)}, {nb} positions",
                       (nb, 1, h, d), (nb, 1, h, d), positions=batch_pos, per_call=True,
                       note="the same code: (batch, 1) cos/sin rows, six in-place ufuncs "
                            "per array"),
        _rope_workload("rope-llama3", f"RoPE llama3-scaled q {shape} k {(b, s, kvh, d)}",
                       shape, (b, s, kvh, d), base=LLAMA3_BASE, scaling=LLAMA3_SCALING),
    ]


def _mrope_workload(name: str, title: str, q_shape: tuple[int, ...], k_shape: tuple[int, ...],
                    positions: np.ndarray, per_call: bool = False) -> Workload:
    """RoPE of a Qwen2-VL-like model (M-RoPE sections [16, 24, 24] scaled to the head)
    on (3, seq) or (3, 1, seq) position ids, against the plain NumPy baseline on each
    pair's own position, gathered once. The reference is that NumPy computation, its
    pairs' axes and frequencies formed from the sections and the base alone (Qwen2-VL's
    split: the first sections[0] frequencies on time, then height, then width), so that
    it checks RotaryEmbedding's own M-RoPE code too."""
    d = q_shape[-1]
    sections = [d // 8, 3 * d // 16, d // 2 - d // 8 - 3 * d // 16]
    rope = fastpe.RotaryEmbedding(d, base=1e6, mrope_section=sections)
    inv_freq = 1.0 / 1e6 ** (np.arange(0, d, 2, dtype=np.float64) / d)
    # (1, seq, half): each pair's position on its own axis
    per_pair = positions.reshape(3, -1)[np.repeat(np.arange(3), sections)].T[None].astype(
        np.float64)

    def make(dtype: np.dtype) -> Arrays:
        return {"q": random_array(q_shape, dtype), "k": random_array(k_shape, dtype, 0.5)}

    def fastpe_(arrays: Arrays, threads: int) -> Runner:
        def run(a: Arrays) -> Result:
            return rope(a["q"], a["k"], positions, layout="bshd", num_threads=threads)
        return run

    def numpy_(arrays: Arrays, threads: int) -> Runner:
        impl = NumpyRope(arrays["q"], arrays["k"], inv_freq, neox=True)

        def run(a: Arrays) -> Result:
            return impl(a["q"], a["k"], per_pair)
        return run

    return Workload(
        name=name, family="rope", title=title, make=make, inplace=("q", "k"),
        result=("q", "k"), floor="stream",
        impls={"fastpe": fastpe_, "reference": numpy_, "numpy": numpy_},
        numpy_note="the plain baseline on each pair's own position, gathered once",
        per_call=per_call, check_index=EVERY_4TH_HEAD,
        params=dict(positions=positions, mrope_section=sections, head_dim=d))


def mrope_prefill_workload(size: Size) -> Workload:
    """Qwen2-VL-like prefill: the plain prefill's shapes (GQA k), positions of a prompt
    that is mostly one image (text, a merged patch grid, text), as get_rope_index gives
    them."""
    b, s, h, kvh, d = size["batch"], size["seq"], size["heads"], size["kv_heads"], size["head_dim"]
    q_shape, k_shape = (b, s, h, d), (b, s, kvh, d)
    text = max(1, s // 32)
    w = min(32, s - 2 * text)
    rows = (s - 2 * text) // w
    positions = fastpe.mrope_positions([text, (1, 2 * rows, 2 * w), s - text - rows * w],
                                       spatial_merge_size=2)
    return _mrope_workload(
        "rope-prefill-mrope",
        f"M-RoPE prefill q {q_shape} k {k_shape}, 3-axis image prompt (Qwen2-VL)",
        q_shape, k_shape, positions)


def mrope_decode_workload(size: Size) -> Workload:
    """Qwen2-VL-like decode: one token after an image prompt, its (3, 1, 1) position ids
    (the text token's three axes past the image's)."""
    h, d, pos = size["heads"], size["head_dim"], size["decode_pos"]
    shape = (1, 1, h, d)
    positions = np.array([pos, pos - 40, pos - 40], np.int64).reshape(3, 1, 1)
    return _mrope_workload(
        "rope-vl-decode", f"M-RoPE decode q,k {shape}, (3, 1, 1) position ids (Qwen2-VL)",
        shape, shape, positions, per_call=True)


# ---- ALiBi --------------------------------------------------------------------------------

def _make_scores(shape: tuple[int, ...]) -> Callable[[np.dtype], Arrays]:
    def make(dtype: np.dtype) -> Arrays:
        return {"scores": random_array(shape, dtype)}
    return make


def _fastpe_add_alibi(causal: bool) -> Prepare:
    def prepare(arrays: Arrays, threads: int) -> Runner:
        def run(a: Arrays) -> Result:
            return (fastpe.add_alibi(a["scores"], causal=causal, num_threads=threads),)
        return run
    return prepare


def _reference_add_alibi(causal: bool, heads: int | None = None) -> Prepare:
    """The reference; with `heads`, of every 4th of those heads (scores holding only
    them): each head's bias depends on its own slope alone."""
    def prepare(arrays: Arrays, threads: int) -> Runner:
        slopes = None if heads is None else fastpe.alibi_slopes(heads)[::4]

        def run(a: Arrays) -> Result:
            return (fastpe.reference.add_alibi(a["scores"], slopes=slopes, causal=causal),)
        return run
    return prepare


# the checked part of ALiBi's scores (..., heads, q_len, k_len) and tables
EVERY_4TH_SCORES_HEAD = {"scores": (slice(None), slice(None, None, 4))}


def alibi_prefill_workload(size: Size) -> Workload:
    shape = (1, size["alibi_heads"], size["alibi_seq"], size["alibi_seq"])
    return Workload(
        name="alibi-prefill", family="alibi", title=f"add_alibi(scores {shape}, causal) (BLOOM)",
        make=_make_scores(shape), inplace=("scores",), result=("scores",), floor="stream",
        impls={"fastpe": _fastpe_add_alibi(True), "reference": _reference_add_alibi(True),
               "numpy": numpy_alibi_prefill},
        numpy_note="scores += a cached masked (heads, q, k) bias: one in-place add",
        params=dict(causal=True), check_index=EVERY_4TH_SCORES_HEAD,
        check_reference=_reference_add_alibi(True, shape[1]))


def alibi_bias_workload(size: Size) -> Workload:
    h, s = size["alibi_heads"], size["alibi_seq"]

    def fastpe_(arrays: Arrays, threads: int) -> Runner:
        def run(a: Arrays) -> Result:
            return (fastpe.alibi_bias(h, s, s, out=a["out"], num_threads=threads),)
        return run

    def reference(arrays: Arrays, threads: int) -> Runner:
        def run(a: Arrays) -> Result:
            return (fastpe.reference.alibi_bias(h, s, s, out=a["out"]),)
        return run

    def reference_part(arrays: Arrays, threads: int) -> Runner:
        slopes = fastpe.alibi_slopes(h)[::4]

        def run(a: Arrays) -> Result:
            return (fastpe.reference.alibi_bias(slopes.size, s, s, slopes=slopes, out=a["out"]),)
        return run

    return Workload(
        name="alibi-bias", family="alibi", title=f"alibi_bias({h}, {s}, {s}, out=buf)",
        make=lambda dtype: {"out": np.zeros((h, s, s), dtype)}, inplace=(), result=("out",),
        floor="fill", impls={"fastpe": fastpe_, "reference": reference,
                             "numpy": numpy_alibi_bias},
        numpy_note="(q, k) distances, then one broadcast multiply by the slopes into out",
        check_index={"out": (slice(None, None, 4),)}, check_reference=reference_part)


def alibi_decode_workload(size: Size) -> Workload:
    shape = (1, size["alibi_heads"], 1, size["alibi_keys"])
    return Workload(
        name="alibi-decode", family="alibi", title=f"add_alibi(scores {shape})",
        make=_make_scores(shape), inplace=("scores",), result=("scores",), floor="stream",
        impls={"fastpe": _fastpe_add_alibi(False), "reference": _reference_add_alibi(False),
               "numpy": numpy_alibi_decode},
        numpy_note="distances from a cached arange, times the slopes into a preallocated "
                   "bias, one add",
        per_call=True, params=dict(causal=False))


def alibi_padded_decode_workload(size: Size) -> Workload:
    """A left-padded batch's decode step (BLOOM): four sequences of different lengths,
    one query each, the keys' positions and padding from the attention mask."""
    h, k = size["alibi_heads"], size["alibi_keys"]
    shape = (4, h, 1, k)
    key_mask = np.ones((4, k), np.int64)
    for row, pad in enumerate((0, k // 8, k // 3, k // 2)):
        key_mask[row, :pad] = 0

    def fastpe_(arrays: Arrays, threads: int) -> Runner:
        def run(a: Arrays) -> Result:
            return (fastpe.add_alibi(a["scores"], key_mask=key_mask, num_threads=threads),)
        return run

    def reference(arrays: Arrays, threads: int) -> Runner:
        def run(a: Arrays) -> Result:
            return (fastpe.reference.add_alibi(a["scores"], key_mask=key_mask),)
        return run

    return Workload(
        name="alibi-padded-decode", family="alibi",
        title=f"add_alibi(scores {shape}, key_mask=left padding)",
        make=_make_scores(shape), inplace=("scores",), result=("scores",), floor="stream",
        impls={"fastpe": fastpe_, "reference": reference,
               "numpy": numpy_alibi_padded_decode(key_mask)},
        numpy_note="key positions from the mask's cumsum, distances to the last key times "
                   "the slopes, one add, -inf where padded",
        per_call=True, params=dict(key_mask=key_mask))


def alibi_workloads(size: Size) -> list[Workload]:
    return [alibi_prefill_workload(size), alibi_bias_workload(size),
            alibi_decode_workload(size), alibi_padded_decode_workload(size)]


# ---- relative positions --------------------------------------------------------------------

def t5_decode_workload(size: Size) -> Workload:
    """A T5 decoder's self-attention decode step: a batch of one query per sequence at
    the last of k_len positions, 32 unidirectional buckets (max_distance 128), causal."""
    d = size["t5"]
    shape = (d["batch"], d["heads"], 1, d["keys"])
    table = np.random.default_rng(5).standard_normal((32, d["heads"])).astype(np.float32)
    settings = dict(bidirectional=False, max_distance=128, causal=True)

    def fastpe_(arrays: Arrays, threads: int) -> Runner:
        def run(a: Arrays) -> Result:
            return (fastpe.add_relative_bias(a["scores"], table, bidirectional=False,
                                             max_distance=128, causal=True,
                                             num_threads=threads),)
        return run

    def reference(arrays: Arrays, threads: int) -> Runner:
        def run(a: Arrays) -> Result:
            return (fastpe.reference.add_relative_bias(a["scores"], table, bidirectional=False,
                                                       max_distance=128, causal=True),)
        return run

    return Workload(
        name="t5-decode", family="relative",
        title=f"add_relative_bias(scores {shape}, causal) (T5 decoder)",
        make=_make_scores(shape), inplace=("scores",), result=("scores",), floor="stream",
        impls={"fastpe": fastpe_, "reference": reference,
               "numpy": numpy_t5_decode(table, settings["max_distance"])},
        numpy_note="the bucket of every distance cached; per step one gather of the "
                   "table's columns and one add",
        per_call=True, params={**settings, "table": table})


def deberta_workload(size: Size) -> Workload:
    """DeBERTa-v2/v3's disentangled attention: both logit tables given, their gathers
    added into the scores. The floor reads both tables and reads and writes the scores."""
    d = size["deberta"]
    heads, seq = d["heads"], d["seq"]
    settings = dict(position_buckets=d["position_buckets"],
                    max_relative_positions=d["max_relative_positions"])
    span = settings["position_buckets"]
    shape = (1, heads, seq, seq)

    def make(dtype: np.dtype) -> Arrays:
        return {"scores": random_array(shape, dtype),
                "c2p": random_array(shape[:-1] + (2 * span,), dtype, 0.5),
                "p2c": random_array(shape[:-1] + (2 * span,), dtype, 0.25)}

    def fastpe_(arrays: Arrays, threads: int) -> Runner:
        def run(a: Arrays) -> Result:
            return (fastpe.add_disentangled_bias(a["scores"], c2p=a["c2p"], p2c=a["p2c"],
                                                 num_threads=threads, **settings),)
        return run

    def reference(arrays: Arrays, threads: int) -> Runner:
        def run(a: Arrays) -> Result:
            return (fastpe.reference.add_disentangled_bias(a["scores"], c2p=a["c2p"],
                                                           p2c=a["p2c"], **settings),)
        return run

    return Workload(
        name="deberta-bias", family="relative",
        title=f"add_disentangled_bias(scores {shape}, c2p, p2c) (DeBERTa-v3)",
        make=make, inplace=("scores",), result=("scores",), floor="stream",
        reads=("c2p", "p2c"),
        impls={"fastpe": fastpe_, "reference": reference,
               "numpy": prepare_numpy_disentangled(**settings)},
        numpy_note="both flat gather indices cached; per head two np.take into buffers, "
                   "their sum, one in-place add",
        params=settings, dtypes=HALF_DTYPES)


# ---- a real program ------------------------------------------------------------------------

def llama_decode_workload(size: Size) -> Workload:
    """One decode step of a small NumPy Llama (program.py): the step with the program's
    own NumPy RoPE against the same step with fastpe's, and RoPE's part timed inside."""
    cfg = llama_config(size)
    return Workload(
        name="llama-decode", family="program",
        title=f"NumPy Llama decode step (batch {cfg.batch}, {cfg.layers} layers, "
              f"{cfg.heads}x{cfg.head_dim} heads, fused QKV, KV cache)",
        make=lambda dtype: make_model(cfg), inplace=("k_cache", "v_cache"),
        result=("logits",), floor="none",
        impls={"fastpe": prepare_step("fastpe", size),
               "reference": prepare_step("reference", size),
               "numpy": prepare_step("numpy", size)},
        numpy_note="the program's own RoPE: a float32 cos/sin table made at start-up, its "
                   "rows gathered per step, the halves rotated into new arrays",
        per_call=True, dtypes=("float32",), inner="RoPE")


def workloads(size: str = "full") -> list[Workload]:
    """Every workload, in the order the command line prints them."""
    sz = SIZES[size]
    rope = [*rope_workloads(sz), mrope_prefill_workload(sz), mrope_decode_workload(sz)]
    return [*rope, _table_workload(sz), _add_sinusoidal_workload(sz), _learned_workload(sz),
            *alibi_workloads(sz), t5_decode_workload(sz), deberta_workload(sz),
            llama_decode_workload(sz)]


def select(all_workloads: list[Workload], only: str | None) -> list[Workload]:
    """Workloads whose name contains any of the comma-separated patterns (the names are
    lower case; so are the patterns taken)."""
    if not only:
        return all_workloads
    pats = [p.strip().lower() for p in only.split(",") if p.strip()]
    return [w for w in all_workloads if any(p in w.name for p in pats)]
