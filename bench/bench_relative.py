"""Relative-position biases of encoders, float32, one thread, (1, 12, 512, 512) scores.

T5 (``add_relative_bias``, bidirectional, 32 buckets, max_distance 128): against
transformers' ``T5Attention.compute_bias`` plus the add in torch eager (the bias built
per call, as T5's first layer does per forward), the best NumPy (the buckets of the
(q, k) distances cached; per call one gather of the table and an in-place add), and a
streaming floor (``np.add(scores, 0, out=scores)``: read and write the scores once).

T5 decode: the ``t5-decode`` workload of ``python -m fastpe bench`` (a decoder's step,
scores (4, 12, 1, 512), causal) against the best NumPy (buckets cached, one gather and one
add), the same in torch eager, and fastpe on torch tensors.

DeBERTa (``add_disentangled_bias``, DeBERTa-v3's 256 buckets over 512 positions, c2p and
p2c given): the ``deberta-bias`` workload of ``python -m fastpe bench``
(fastpe._bench.deberta_workload) through benchutil, against transformers' gather-and-add
in torch eager (``transformers``: ``build_relative_position``, its clamps, gathers,
transpose and adds, as ``disentangled_attention_bias`` runs them on logits already made),
the same steps with the relative positions made once (``torch``, the bench's peer), the
best NumPy (both flat gather indices cached; per head two ``np.take`` and adds), and the
floor: every byte of both logit tables read and of the scores read and written, in the
fastest of NumPy's and the C forms (fastpe._bench.floors).

Each round works on a fresh copy of the scores. ``pytest bench/bench_relative.py
--benchmark-only``; the torch rows are skipped where torch and transformers are not
installed.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("pytest_benchmark")

from benchutil import cases, run_case

import fastpe
from fastpe import _bench

SHAPE = (1, 12, 512, 512)


def _arrays():
    rng = np.random.default_rng(0)
    scores = rng.standard_normal(SHAPE).astype(np.float32)
    table = rng.standard_normal((32, SHAPE[1])).astype(np.float32)
    return scores, table


SCORES, TABLE = _arrays()
Q, K = SHAPE[-2:]


def _time(benchmark, run, check=None):
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


def _close(want):
    def check(got):
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-5)
    return check


# ---- T5 ------------------------------------------------------------------------------------

@pytest.mark.benchmark(group="t5 add_relative_bias (1, 12, 512, 512) float32")
def test_t5_fastpe(benchmark):
    _time(benchmark, lambda s: fastpe.add_relative_bias(s, TABLE, num_threads=1),
           _close(_t5_expected()))


@pytest.mark.benchmark(group="t5 add_relative_bias (1, 12, 512, 512) float32")
def test_t5_numpy(benchmark):
    buckets = fastpe.relative_position_bucket(np.arange(K)[None] - np.arange(Q)[:, None])
    columns = np.ascontiguousarray(TABLE.T)                  # (heads, buckets)

    def run(s):
        np.add(s, columns[:, buckets], out=s)
        return s
    _time(benchmark, run, _close(_t5_expected()))


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
    _time(benchmark, run, _close(_t5_expected()))


@pytest.mark.benchmark(group="t5 add_relative_bias (1, 12, 512, 512) float32")
def test_t5_floor(benchmark):
    def run(s):
        np.add(s, np.float32(0), out=s)
        return s
    _time(benchmark, run)


# ---- DeBERTa -------------------------------------------------------------------------------

DEBERTA = [_bench.deberta_workload(_bench.FULL)]
PEERS_SKIPPED = _bench.attach_peers(DEBERTA, ("torch",))

# ---- T5 decode: the t5-decode workload of python -m fastpe bench ---------------------------

T5_DECODE = [_bench.t5_decode_workload(_bench.FULL)]
T5_PEERS_SKIPPED = _bench.attach_peers(T5_DECODE, ("torch", "fastpe-torch"))


@pytest.mark.parametrize("wl, dtype, impl, threads", cases(T5_DECODE, T5_PEERS_SKIPPED))
def test_t5_decode(benchmark, wl, dtype, impl, threads):
    run_case(benchmark, wl, dtype, impl, threads)



def _transformers_disentangled(wl: _bench.Workload):
    """transformers' own steps after the two matrix products, its relative positions
    built per call (build_relative_position)."""
    import torch
    from transformers.models.deberta_v2.modeling_deberta_v2 import build_relative_position

    def prepare(arrays, threads):
        if arrays["scores"].dtype != np.float32:
            return None
        torch.set_num_threads(1)
        q, k = arrays["scores"].shape[-2:]
        span = arrays["c2p"].shape[-1] // 2
        c2p_att = torch.from_numpy(arrays["c2p"]).reshape(-1, q, 2 * span)
        p2c_att = torch.from_numpy(arrays["p2c"]).reshape(-1, k, 2 * span)
        layer = torch.zeros(c2p_att.shape[0], q, 1)
        bucket, most = wl.params["position_buckets"], wl.params["max_relative_positions"]

        def run(a):
            with torch.no_grad():
                rel = build_relative_position(layer, layer, bucket_size=bucket,
                                              max_position=most)
                rel = rel.unsqueeze(0)
                c2p_pos = torch.clamp(rel + span, 0, span * 2 - 1)
                c2p = torch.gather(c2p_att, dim=-1,
                                   index=c2p_pos.squeeze(0).expand([c2p_att.shape[0], q, k]))
                p2c_pos = torch.clamp(-rel + span, 0, span * 2 - 1)
                p2c = torch.gather(p2c_att, dim=-1, index=p2c_pos.squeeze(0).expand(
                    [p2c_att.shape[0], k, k])).transpose(-1, -2)
                score = 0
                score += c2p
                score += p2c
                torch.from_numpy(a["scores"]).view(-1, q, k).add_(score)
            return (a["scores"],)
        return run
    return prepare


try:
    import torch  # noqa: F401
    import transformers  # noqa: F401
    UNAVAILABLE = {}
    for _wl in DEBERTA:
        _wl.impls["transformers"] = _transformers_disentangled(_wl)
except ImportError as exc:
    UNAVAILABLE = {"transformers": f"torch/transformers not installed ({exc})"}


@pytest.mark.parametrize("wl, dtype, impl, threads",
                         cases(DEBERTA, {**UNAVAILABLE, **PEERS_SKIPPED}))
def test_deberta(benchmark, wl, dtype, impl, threads):
    run_case(benchmark, wl, dtype, impl, threads)
