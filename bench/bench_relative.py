"""Relative-position biases of encoders, float32, one thread, (1, 12, 512, 512) scores.

T5 (``add_relative_bias``, bidirectional, 32 buckets, max_distance 128): against
transformers' ``T5Attention.compute_bias`` plus the add in torch eager (the bias built
per call, as T5's first layer does per forward), the best NumPy (the buckets of the
(q, k) distances cached; per call one gather of the table and an in-place add), and a
streaming floor (``np.add(scores, 0, out=scores)``: read and write the scores once).

DeBERTa (``add_disentangled_bias``, DeBERTa-v3's 256 buckets over 512 positions, c2p and
p2c given): against transformers' gather-and-add in torch eager (``build_relative_position``,
its clamps, gathers, transpose and adds, as ``disentangled_attention_bias`` runs them on
logits already made), the best NumPy (both gather indices cached; two
``take_along_axis`` and adds), and the floor the call cannot beat:
``np.add(c2p, p2c, out=scores)`` on same-sized arrays (it reads both logit tables and
writes the scores).

Each round works on a fresh copy of the scores. ``pytest bench/bench_relative.py
--benchmark-only``; the torch rows are skipped where torch and transformers are not
installed.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("pytest_benchmark")

import fastpe

SHAPE = (1, 12, 512, 512)
SPAN = 256


def _arrays():
    rng = np.random.default_rng(0)
    scores = rng.standard_normal(SHAPE).astype(np.float32)
    table = rng.standard_normal((32, SHAPE[1])).astype(np.float32)
    c2p = rng.standard_normal(SHAPE[:-1] + (2 * SPAN,)).astype(np.float32)
    p2c = rng.standard_normal(SHAPE[:-2] + (SHAPE[-1], 2 * SPAN)).astype(np.float32)
    return scores, table, c2p, p2c


SCORES, TABLE, C2P, P2C = _arrays()
Q, K = SHAPE[-2:]


def _bench(benchmark, run, check=None):
    """Time run(scores) on fresh copies of SCORES; check the first result."""
    work = np.empty_like(SCORES)

    def setup():
        np.copyto(work, SCORES)
        return (work,), {}

    if check is not None:
        np.copyto(work, SCORES)
        check(run(work))
    benchmark.pedantic(run, setup=setup, rounds=20, warmup_rounds=1)


def _t5_expected():
    return fastpe.reference.add_relative_bias(SCORES.copy(), TABLE)


def _deberta_expected():
    return fastpe.reference.add_disentangled_bias(SCORES.copy(), c2p=C2P, p2c=P2C,
                                                  position_buckets=256,
                                                  max_relative_positions=512)


def _close(want):
    def check(got):
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-5)
    return check


# ---- T5 ------------------------------------------------------------------------------------

@pytest.mark.benchmark(group="t5 add_relative_bias (1, 12, 512, 512) float32")
def test_t5_fastpe(benchmark):
    _bench(benchmark, lambda s: fastpe.add_relative_bias(s, TABLE, num_threads=1),
           _close(_t5_expected()))


@pytest.mark.benchmark(group="t5 add_relative_bias (1, 12, 512, 512) float32")
def test_t5_numpy(benchmark):
    buckets = fastpe.relative_position_bucket(np.arange(K)[None] - np.arange(Q)[:, None])
    columns = np.ascontiguousarray(TABLE.T)                  # (heads, buckets)

    def run(s):
        np.add(s, columns[:, buckets], out=s)
        return s
    _bench(benchmark, run, _close(_t5_expected()))


@pytest.mark.benchmark(group="t5 add_relative_bias (1, 12, 512, 512) float32")
def test_t5_torch(benchmark):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.models.t5.modeling_t5 import T5Attention
    torch.set_num_threads(1)
    cfg = transformers.T5Config(num_heads=SHAPE[1], d_model=768, d_kv=64)
    attn = T5Attention(cfg, has_relative_attention_bias=True).eval()
    with torch.no_grad():
        attn.relative_attention_bias.weight.copy_(torch.from_numpy(TABLE))

    def run(s):
        with torch.no_grad():
            torch.from_numpy(s).add_(attn.compute_bias(Q, K))
        return s
    _bench(benchmark, run, _close(_t5_expected()))


@pytest.mark.benchmark(group="t5 add_relative_bias (1, 12, 512, 512) float32")
def test_t5_floor(benchmark):
    def run(s):
        np.add(s, np.float32(0), out=s)
        return s
    _bench(benchmark, run)


# ---- DeBERTa -------------------------------------------------------------------------------

@pytest.mark.benchmark(group="deberta add_disentangled_bias (1, 12, 512, 512) float32")
def test_deberta_fastpe(benchmark):
    _bench(benchmark, lambda s: fastpe.add_disentangled_bias(
        s, c2p=C2P, p2c=P2C, position_buckets=256, max_relative_positions=512,
        num_threads=1), _close(_deberta_expected()))


@pytest.mark.benchmark(group="deberta add_disentangled_bias (1, 12, 512, 512) float32")
def test_deberta_numpy(benchmark):
    r = fastpe.deberta_relative_positions(Q, K, position_buckets=256, max_relative_positions=512)
    ci = np.broadcast_to(np.clip(r + SPAN, 0, 2 * SPAN - 1), SHAPE)
    pi = np.broadcast_to(np.clip(-r + SPAN, 0, 2 * SPAN - 1), SHAPE)   # rows: keys

    def run(s):
        s += np.take_along_axis(C2P, ci, axis=-1)
        s += np.swapaxes(np.take_along_axis(P2C, pi, axis=-1), -1, -2)
        return s
    _bench(benchmark, run, _close(_deberta_expected()))


@pytest.mark.benchmark(group="deberta add_disentangled_bias (1, 12, 512, 512) float32")
def test_deberta_torch(benchmark):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.models.deberta_v2.modeling_deberta_v2 import build_relative_position
    torch.set_num_threads(1)
    c2p_att, p2c_att = (torch.from_numpy(a).reshape(-1, *a.shape[-2:]) for a in (C2P, P2C))
    layer = torch.zeros(c2p_att.shape[0], Q, 1)

    def run(s):
        # disentangled_attention_bias's steps after its two matrix products
        with torch.no_grad():
            rel = build_relative_position(layer, layer, bucket_size=256, max_position=512)
            rel = rel.unsqueeze(0)
            c2p_pos = torch.clamp(rel + SPAN, 0, SPAN * 2 - 1)
            c2p = torch.gather(c2p_att, dim=-1,
                               index=c2p_pos.squeeze(0).expand([c2p_att.shape[0], Q, K]))
            p2c_pos = torch.clamp(-rel + SPAN, 0, SPAN * 2 - 1)
            p2c = torch.gather(p2c_att, dim=-1, index=p2c_pos.squeeze(0).expand(
                [p2c_att.shape[0], K, K])).transpose(-1, -2)
            score = 0
            score += c2p
            score += p2c
            torch.from_numpy(s).view(-1, Q, K).add_(score)
        return s
    _bench(benchmark, run, _close(_deberta_expected()))


@pytest.mark.benchmark(group="deberta add_disentangled_bias (1, 12, 512, 512) float32")
def test_deberta_floor(benchmark):
    def run(s):
        np.add(C2P, P2C, out=s)
        return s
    _bench(benchmark, run)
