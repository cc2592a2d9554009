"""The NumPy baselines: the best NumPy a skilled user would write for each workload's
result, in place, chunked where that keeps temporaries in cache, temporaries allocated
once (outside the timed call), tables a model would cache built once. Each is a
*prepare* function, ``prepare(arrays, threads) -> run``; tests/test_cli.py checks them
against fastpe.reference."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

import fastpe

from .common import Arrays, Prepare, Result, Runner, work_dtype


def chunked_add(x: np.ndarray, addend: np.ndarray, work: np.dtype, buf: np.ndarray,
                 rows: int) -> None:
    """x += addend, addend broadcast over x's leading axes.

    In x's own dtype that is one ufunc call. For float16 NumPy's ufunc loop converts one
    element at a time and is ~40x slower than a stream; converting blocks of `rows` rows to
    float32 in a preallocated buffer, adding there and converting back is the fastest way
    measured (x (8, 2048, 1024): 52 ms, against 97 ms adding a float32 table and 120 ms
    a float16 one in one call), so the baseline does that."""
    if x.dtype == work:
        np.add(x, addend, out=x)
        return
    xs = x.reshape(-1, *x.shape[-2:])
    adds = np.broadcast_to(addend, x.shape).reshape(xs.shape)
    for b in range(xs.shape[0]):
        for r0 in range(0, xs.shape[1], rows):
            part = xs[b, r0:r0 + rows]
            t = buf[:part.shape[0]]
            np.copyto(t, part)
            np.add(t, adds[b, r0:r0 + rows], out=t)
            np.copyto(part, t, casting="same_kind")


# ---- sinusoidal ---------------------------------------------------------------------------

def transformer_div_term(dim: int, dtype: type[np.floating[Any]]) -> np.ndarray:
    """The Transformer's frequencies as its NumPy/PyTorch tutorials write them:
    exp(arange(0, d, 2) * -ln(10000) / d)."""
    div_term: np.ndarray = np.exp(np.arange(0, dim, 2, dtype=dtype) * dtype(-math.log(10000.0) / dim))
    return div_term


def prepare_textbook_table(arrays: Arrays, threads: int) -> Runner:
    """The textbook NumPy construction (Vaswani et al., 2017, as tutorials write it), in
    float32: a fresh zeroed table, whole-table float32 angles, sin into even and cos into
    odd columns."""
    length, dim = arrays["out"].shape
    out_dtype = arrays["out"].dtype

    def run(a: Arrays) -> Result:
        pe = np.zeros((length, dim), dtype=out_dtype)
        position = np.arange(length, dtype=np.float32)[:, np.newaxis]
        div_term = transformer_div_term(dim, np.float32)
        pe[:, 0::2] = np.sin(position * div_term)
        pe[:, 1::2] = np.cos(position * div_term[:dim // 2])
        return (pe,)
    return run


def prepare_numpy_table(arrays: Arrays, threads: int) -> Runner:
    """The best NumPy for a table into a preallocated `out`: the textbook float32 formula,
    but in blocks of 64 rows (the angle block stays in L1/L2), angles into a buffer made
    once, np.sin/np.cos writing straight into out's strided columns. Float32 angles (the
    textbook's choice; float64 angles would be exact but ~2x slower): errors grow with the
    position, ~1e-3 at 8192."""
    out0 = arrays["out"]
    length, dim = out0.shape
    rows = 64
    work = np.float32
    div_term = transformer_div_term(dim, work)
    position = np.arange(length, dtype=work)[:, None]
    angles = np.empty((rows, div_term.size), work)
    half = dim // 2

    def run(a: Arrays) -> Result:
        out = a["out"]
        for r0 in range(0, length, rows):
            r1 = min(length, r0 + rows)
            ang = angles[:r1 - r0]
            np.multiply(position[r0:r1], div_term, out=ang)
            np.sin(ang, out=out[r0:r1, 0::2], casting="same_kind")
            np.cos(ang[:, :half], out=out[r0:r1, 1::2], casting="same_kind")
        return (out,)
    return run




# ---- RoPE ---------------------------------------------------------------------------------

def numpy_add_sinusoidal(arrays: Arrays, threads: int) -> Runner:
    """The best NumPy: the (seq, dim) table built once, as a model caches it at init
    (not timed; exact, from the reference), then one broadcast in-place add per call."""
    x0 = arrays["x"]
    work = work_dtype(x0.dtype)
    pe = fastpe.reference.sinusoidal_table(x0.shape[-2], x0.shape[-1], dtype=work)
    buf = np.empty((64, x0.shape[-1]), work)

    def run(a: Arrays) -> Result:
        chunked_add(a["x"], pe, work, buf, 64)
        return (a["x"],)
    return run


def numpy_add_learned(arrays: Arrays, threads: int) -> Runner:
    """The best NumPy: positions 0..seq-1 are a slice of the table (no gather, no copy),
    added in place with broadcasting over the batch."""
    x0 = arrays["x"]
    work = work_dtype(x0.dtype)
    buf = np.empty((64, x0.shape[-1]), work)

    def run(a: Arrays) -> Result:
        x = a["x"]
        chunked_add(x, a["table"][:x.shape[-2]], work, buf, 64)
        return (x,)
    return run


class NumpyRope:
    """The best NumPy RoPE: in place, in chunks of `chunk` tokens
    so that the temporaries (two (batch, chunk, heads, half) buffers per head count, made
    once) stay in L2; cos/sin computed inside the call, from float64 angles, once per
    token row and broadcast over every head of q and k. Per chunk and array, six ufunc
    calls rotate the pairs (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin): neox pairs are
    the two halves of the head, gptj pairs the even and odd features (strided views).
    float16 arrays compute in float32 (mixed-dtype ufuncs, rounding to float16 on store).

    positions: None (offset + arange) or (seq,) / (batch, seq) integers; chunk 64
    measured best here (8..256 within 10%; 2048, unchunked, 1.5x slower)."""

    def __init__(self, q: np.ndarray, k: np.ndarray | None, inv_freq: np.ndarray, *,
                 neox: bool, attention_scaling: float = 1.0, chunk: int = 64):
        self.inv_freq = np.asarray(inv_freq, np.float64)
        self.neox, self.scale, self.chunk = neox, float(attention_scaling), chunk
        half = self.inv_freq.size
        work = work_dtype(q.dtype)
        c = min(chunk, q.shape[1])
        self.tmp: dict[int, list[np.ndarray]] = {}
        for x in (q, k):
            if x is not None and x.shape[2] not in self.tmp:
                self.tmp[x.shape[2]] = [np.empty((x.shape[0], c, x.shape[2], half), work)
                                        for _ in range(2)]
        rows = q.shape[0]
        self.angles = np.empty((rows, c, half))
        self.trig = np.empty((rows, c, half))
        self.cos = np.empty((rows, c, 1, half), work)
        self.sin = np.empty((rows, c, 1, half), work)
        self.arange = np.arange(q.shape[1], dtype=np.float64)

    def __call__(self, q: np.ndarray, k: np.ndarray | None, positions: ArrayLike | None = None,
                 offset: int = 0) -> Result:
        seq = q.shape[1]
        if positions is None:
            pos = (self.arange[:seq] + offset)[None]
        else:
            pos = np.asarray(positions)
            pos = pos[None] if pos.ndim == 1 else pos
        # (rows, seq, half): a position per frequency pair (M-RoPE), else one per token
        per_pair = pos.ndim == 3
        half = self.inv_freq.size
        for s0 in range(0, seq, self.chunk):
            s1 = min(seq, s0 + self.chunk)
            c, r = s1 - s0, pos.shape[0]
            ang = self.angles[:r, :c]
            np.multiply(pos[:, s0:s1] if per_pair else pos[:, s0:s1, None], self.inv_freq,
                        out=ang)
            cos, sin = self.cos[:r, :c], self.sin[:r, :c]
            np.cos(ang, out=self.trig[:r, :c])
            if self.scale != 1.0:
                self.trig[:r, :c] *= self.scale
            cos[:, :, 0] = self.trig[:r, :c]
            np.sin(ang, out=self.trig[:r, :c])
            if self.scale != 1.0:
                self.trig[:r, :c] *= self.scale
            sin[:, :, 0] = self.trig[:r, :c]
            for x in (q, k):
                if x is None:
                    continue
                xs = x[:, s0:s1]
                if self.neox:
                    x1, x2 = xs[..., :half], xs[..., half:2 * half]
                else:
                    x1, x2 = xs[..., 0:2 * half:2], xs[..., 1:2 * half:2]
                t1, t2 = (t[:, :c] for t in self.tmp[x.shape[2]])
                np.multiply(x1, sin, out=t1)                       # x1 sin, kept for x2
                np.multiply(x1, cos, out=x1, casting="same_kind")  # x1 cos
                np.multiply(x2, sin, out=t2)                       # x2 sin
                np.subtract(x1, t2, out=x1, casting="same_kind")   # x1' = x1 cos - x2 sin
                np.multiply(x2, cos, out=x2, casting="same_kind")  # x2 cos
                np.add(x2, t1, out=x2, casting="same_kind")        # x2' = x2 cos + x1 sin
        return q, k




def slopes_in(heads: int, work: np.dtype) -> np.ndarray:
    """The slopes in the arithmetic dtype (float32, or float64 for float64 data)."""
    return fastpe.alibi_slopes(heads).astype(work)



def numpy_alibi_prefill(arrays: Arrays, threads: int) -> Runner:
    """The best NumPy for a causal prefill: the masked (heads, q, k) bias built once, as
    a model caches it (not timed), then one in-place broadcast add per call: three
    streams (scores in, bias in, scores out). Computing the bias on the fly in 64-row
    blocks instead measured 2x slower."""
    x0 = arrays["scores"]
    work = work_dtype(x0.dtype)
    heads, q, k = x0.shape[-3:]
    kpos = np.arange(k, dtype=work)
    qpos = (np.arange(q, dtype=work) + work.type(k - q))[:, None]
    dist = kpos - qpos                        # k_pos - q_pos: exact integers
    future = dist > 0                         # the causal mask
    bias = np.empty((heads, q, k), work)
    for h, slope in enumerate(slopes_in(heads, work)):
        np.multiply(dist, slope, out=bias[h])
        np.copyto(bias[h], -np.inf, where=future)
    del dist, future
    buf = np.empty((64, k), work)

    def run(a: Arrays) -> Result:
        chunked_add(a["scores"], bias, work, buf, 64)
        return (a["scores"],)
    return run


def numpy_alibi_decode(arrays: Arrays, threads: int) -> Runner:
    """The best NumPy for one query: per call the distances of the k_len keys (a
    subtraction from a cached arange), times the slopes into a preallocated (heads,
    k_len) bias, added in place. Nothing per step is cached beyond what a decode loop
    can keep while k_len grows."""
    x0 = arrays["scores"]
    heads, k = x0.shape[-3], x0.shape[-1]
    work = work_dtype(x0.dtype)
    slopes = slopes_in(heads, work)[:, None]
    keys = np.arange(k, dtype=work)
    dist = np.empty(k, work)
    bias = np.empty((heads, k), work)

    def run(a: Arrays) -> Result:
        scores = a["scores"]
        kk = scores.shape[-1]
        np.subtract(keys[:kk], work.type(kk - 1), out=dist[:kk])  # k_pos - q_pos <= 0
        np.multiply(slopes, dist[:kk], out=bias[:, :kk])
        np.add(scores, bias[:, None, :kk], out=scores, casting="same_kind")
        return (scores,)
    return run


def numpy_alibi_padded_decode(key_mask: np.ndarray) -> Prepare:
    """The best NumPy for one query per sequence of a left-padded batch (BLOOM): per
    call the keys' positions from the mask, (cumsum(mask) - 1) * mask, their distances
    from the query's (the last key's), times the slopes into a preallocated (batch,
    heads, k_len) bias, one add, then -inf written where the mask is 0."""
    def prepare(arrays: Arrays, threads: int) -> Runner:
        x0 = arrays["scores"]
        batch, heads, _, k = x0.shape
        work = work_dtype(x0.dtype)
        slopes = slopes_in(heads, work)[None, :, None]
        counts = np.empty((batch, k), np.int64)
        dist = np.empty((batch, k), work)
        bias = np.empty((batch, heads, k), work)
        padding = (key_mask == 0)[:, None, None, :]

        def run(a: Arrays) -> Result:
            scores = a["scores"]
            np.cumsum(key_mask, axis=1, out=counts)
            np.subtract(counts, 1, out=counts)
            np.multiply(counts, key_mask, out=counts)
            np.subtract(counts, counts[:, -1:], out=dist, casting="unsafe")
            np.multiply(slopes, dist[:, None, :], out=bias)
            np.add(scores, bias[:, :, None, :], out=scores, casting="same_kind")
            np.copyto(scores, -np.inf, where=padding)
            return (scores,)
        return run
    return prepare


def numpy_alibi_bias(arrays: Arrays, threads: int) -> Runner:
    """The best NumPy for the table: per call the (q, k) distances k_pos - q_pos (exact
    integers; 1/heads of the output), then one broadcast multiply by the slopes straight
    into out; float32 arithmetic, float64 for float64 out."""
    out0 = arrays["out"]
    heads, q, k = out0.shape
    work = work_dtype(out0.dtype)
    slopes = slopes_in(heads, work)[:, None, None]
    kpos = np.arange(k, dtype=work)
    qpos = (np.arange(q, dtype=work) + work.type(k - q))[:, None]

    def run(a: Arrays) -> Result:
        dist = kpos - qpos
        np.multiply(slopes, dist, out=a["out"], casting="same_kind")
        return (a["out"],)
    return run


def numpy_t5_decode(table: np.ndarray, max_distance: int) -> Prepare:
    """The best NumPy for a T5 decoder's decode step: the bucket of every (query, key)
    distance over the keys cached as a model would (not timed), then per call the
    query's row of buckets gathered from the table's columns into a preallocated
    (heads, k_len) bias and one in-place add (keys after the query: none in a decode
    step, so no mask)."""
    def prepare(arrays: Arrays, threads: int) -> Runner:
        x0 = arrays["scores"]
        k = x0.shape[-1]
        work = work_dtype(x0.dtype)
        qpos = k - x0.shape[-2]
        rel = np.arange(k)[None, :] - (qpos + np.arange(x0.shape[-2]))[:, None]
        buckets = fastpe.relative_position_bucket(rel, bidirectional=False,
                                                  num_buckets=table.shape[0],
                                                  max_distance=max_distance)
        columns = np.ascontiguousarray(table.T.astype(work))      # (heads, buckets)
        bias = np.empty((x0.shape[-3],) + buckets.shape, work)

        def run(a: Arrays) -> Result:
            scores = a["scores"]
            np.take(columns, buckets, axis=1, out=bias)
            np.add(scores, bias, out=scores, casting="same_kind")
            return (scores,)
        return run
    return prepare


def prepare_numpy_disentangled(position_buckets: int, max_relative_positions: int) -> Any:
    """The best NumPy for DeBERTa's gather-add (the logits already made): the flat gather
    index of each term cached as a model caches its relative positions (not timed; the
    p2c term's already transposed: element (i, j) is key j's row at query i's index),
    then per (batch, head) two ``np.take`` into preallocated buffers, their sum and one
    in-place add: the sum rounds once, as fastpe's and transformers' do. Half floats sum
    and add in float32 buffers."""
    def prepare(arrays: Arrays, threads: int) -> Runner:
        s0 = arrays["scores"]
        q, k = s0.shape[-2:]
        width = arrays["c2p"].shape[-1]
        span = width // 2
        r = fastpe.deberta_relative_positions(q, k, position_buckets=position_buckets,
                                              max_relative_positions=max_relative_positions)
        rows = np.arange(q)[:, None] * width
        ci = rows + np.clip(r + span, 0, width - 1)                       # c2p[i, .]
        pi = np.arange(k)[None, :] * width + np.clip(-r.T + span, 0, width - 1)  # p2c[j, .]
        work = work_dtype(s0.dtype)
        g1, g2 = np.empty((q, k), s0.dtype), np.empty((q, k), s0.dtype)
        w1, w2 = np.empty((q, k), work), np.empty((q, k), work)

        def run(a: Arrays) -> Result:
            s = a["scores"].reshape(-1, q, k)
            c = a["c2p"].reshape(-1, q * width)
            p = a["p2c"].reshape(-1, k * width)
            for h in range(s.shape[0]):
                np.take(c[h], ci, out=g1)
                np.take(p[h], pi, out=g2)
                if work == s.dtype:
                    np.add(g1, g2, out=g1)
                    np.add(s[h], g1, out=s[h])
                else:
                    np.add(g1, g2, out=w1, dtype=work)
                    np.add(s[h], w1, out=w2, dtype=work)
                    np.copyto(s[h], w2, casting="same_kind")
            return (a["scores"],)
        return run
    return prepare
