"""RoPE (Su et al., 2021): prefill q,k (1, 2048, 32, 128) neox and gptj, decode (1, 1, 32, 128) at
4095 (per call), batched decode (32, 1, 32, 128) at 32 positions, Llama-3-scaled prefill
(GQA), against the best NumPy, Hugging Face's own torch code when installed, and one
streaming pass over q and k.

torch: transformers' ``apply_rotary_pos_emb`` (LLaMA's rotate_half for neox, GPT-J's
rotate_every_two for gptj) on ``torch.from_numpy`` views, with cos/sin computed per call
the way ``LlamaRotaryEmbedding.forward`` does (float32 angles from the model's float32
inv_freq, cos/sin times attention_scaling, cast to the activations' dtype). It returns
new tensors: that is how it works. float32 angles lose about position * 2^-24 radians,
hence its wider check.
"""

import numpy as np
import pytest

pytest.importorskip("pytest_benchmark")

from benchutil import cases, run_case

import fastpe
from fastpe import _bench

WORKLOADS = _bench.rope_workloads(_bench.FULL)
# numba, ONNX Runtime and torch.compile where installed (torch eager is below, in
# transformers' own code)
PEERS_SKIPPED = _bench.attach_peers(WORKLOADS, ("numba", "onnxruntime", "torch.compile"))


def _torch_rope(wl: _bench.Workload):
    import torch
    p = wl.params
    if p["style"] == "neox":
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    else:
        from transformers.models.gptj.modeling_gptj import apply_rotary_pos_emb

    def prepare(arrays, threads):
        torch.set_num_threads(threads)
        freqs = fastpe.rope_frequencies(p["head_dim"], base=p["base"], scaling=p["scaling"])
        inv_freq = torch.from_numpy(freqs.inv_freq.astype(np.float32))
        att = freqs.attention_scaling
        seq = arrays["q"].shape[1]
        pos = (torch.arange(seq)[None] + p["offset"] if p["positions"] is None
               else torch.from_numpy(np.asarray(p["positions"]).reshape(-1, seq)))

        def run(a):
            q, k = torch.from_numpy(a["q"]), torch.from_numpy(a["k"])
            angles = pos[..., None].float() * inv_freq            # (rows, seq, half)
            if p["style"] == "neox":
                emb = torch.cat((angles, angles), dim=-1)
                cos = (emb.cos() * att).to(q.dtype)
                sin = (emb.sin() * att).to(q.dtype)
                qo, ko = apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=2)   # bshd
            else:
                cos = (angles.cos() * att).to(q.dtype)
                sin = (angles.sin() * att).to(q.dtype)
                qo, ko = apply_rotary_pos_emb(q, sin, cos), apply_rotary_pos_emb(k, sin, cos)
            return qo.numpy(), ko.numpy()
        return run
    return prepare


try:
    import torch  # noqa: F401
    import transformers  # noqa: F401
    UNAVAILABLE = {}
    for _wl in WORKLOADS:
        _wl.impls["torch"] = _torch_rope(_wl)
        # |x| up to ~5, float32 angle error up to ~2 ulp of the largest angle
        _wl.atol["torch"] = 5 * 4 * (_wl.params["max_position"] + 1) * 2.0**-24
except ImportError as exc:
    UNAVAILABLE = {"torch": f"torch/transformers not installed ({exc})"}


@pytest.mark.parametrize("wl, dtype, impl, threads",
                         cases(WORKLOADS, {**UNAVAILABLE, **PEERS_SKIPPED}))
def test_rope(benchmark, wl, dtype, impl, threads):
    run_case(benchmark, wl, dtype, impl, threads)


# -- a decode loop whose position advances by one per call ---------------------------------
# Past the original length, dynamic NTK frequencies follow max(positions) + 1, so each step
# of a decode loop has frequencies of its own. Held against the plain decode call (no
# scaling) and dynamic NTK at one fixed position. One thread, one call per round.
LOOP_HEADS, LOOP_DIM, LOOP_BATCH, LOOP_ORIGINAL = 32, 128, 32, 4096
LOOP_DYNAMIC = {"rope_type": "dynamic", "factor": 2.0}
LOOP_START = {"plain": 4095, "dynamic-fixed": 5000}   # else 5001, 5002, ...


def _loop_runner(case: str):
    rope = fastpe.RotaryEmbedding(LOOP_DIM, base=10000.0, scaling=LOOP_DYNAMIC,
                                  max_position_embeddings=LOOP_ORIGINAL)
    if case.startswith("plain"):
        return lambda q, k, pos: fastpe.apply_rope(q, k, pos, base=10000.0, num_threads=1)
    if case.startswith("dynamic-apply_rope"):
        return lambda q, k, pos: fastpe.apply_rope(
            q, k, pos, base=10000.0, scaling=LOOP_DYNAMIC,
            max_position_embeddings=LOOP_ORIGINAL, num_threads=1)
    return lambda q, k, pos: rope(q, k, pos, num_threads=1)


@pytest.mark.parametrize("case", ["plain", "dynamic-fixed", "dynamic-advancing",
                                  "dynamic-apply_rope-advancing", "plain-batched",
                                  "dynamic-advancing-batched"])
def test_rope_decode_loop(benchmark, case):
    batch = LOOP_BATCH if case.endswith("batched") else 1
    rng = np.random.default_rng(0)
    q0 = rng.uniform(-2, 2, (batch, 1, LOOP_HEADS, LOOP_DIM)).astype(np.float32)
    k0 = rng.uniform(-2, 2, (batch, 1, LOOP_HEADS, LOOP_DIM)).astype(np.float32)
    # each sequence of a batch at its own length; the longest sets the frequencies
    rows = np.arange(batch, dtype=np.int64)[:, None] * -97
    start = LOOP_START.get(case.removesuffix("-batched"), 5001)
    run = _loop_runner(case)
    q, k = q0.copy(), k0.copy()
    qr, kr = q0.copy(), k0.copy()
    scaling = None if case.startswith("plain") else LOOP_DYNAMIC
    for got, want in zip(run(q, k, rows + start),
                         fastpe.reference.apply_rope(qr, kr, rows + start, base=10000.0,
                                                     scaling=scaling,
                                                     max_position_embeddings=LOOP_ORIGINAL)):
        msg = _bench.compare(got, want, "float32")
        assert msg is None, f"{case}: {msg}"
    step = [0]

    def setup():
        np.copyto(q, q0)
        np.copyto(k, k0)
        if "advancing" in case:
            step[0] += 1
        return (q, k, rows + (start + step[0])), {}

    benchmark.group = "RoPE decode loop"
    benchmark.extra_info.update(case=case, batch=batch, start=start)
    benchmark.pedantic(run, setup=setup, rounds=2000, iterations=1, warmup_rounds=10)


# -- one prefill in either memory order ----------------------------------------------------
# transformers holds q and k as (batch, heads, seq, dim); a contiguous array of that order
# is rotated several heads a token at a time. The same bytes token by token, and one
# streaming pass over them, beside it.
ORDER_Q, ORDER_K = (1, 2048, 32, 128), (1, 2048, 8, 128)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("order", ["bshd", "bhsd", "floor"])
def test_rope_prefill_memory_order(benchmark, order, dtype):
    rng = np.random.default_rng(0)
    q0 = rng.uniform(-2, 2, ORDER_Q).astype(dtype)
    k0 = rng.uniform(-2, 2, ORDER_K).astype(dtype)
    if order == "bhsd":
        q0, k0 = (np.ascontiguousarray(a.transpose(0, 2, 1, 3)) for a in (q0, k0))
    q, k = q0.copy(), k0.copy()
    if order == "floor":
        words = [a.view(np.uint16 if a.itemsize == 2 else np.uint32) for a in (q, k)]

        def run():
            for w in words:
                np.bitwise_or(w, 0, out=w)
    else:
        def run():
            fastpe.apply_rope(q, k, offset=5, layout=order, num_threads=1)
        run()
        want = fastpe.reference.apply_rope(q0.copy(), k0.copy(), offset=5, layout=order)
        for got, ref in zip((q, k), want):
            assert _bench.compare(got, ref, dtype) is None
    benchmark.group = f"RoPE prefill by memory order, {dtype}"
    benchmark.extra_info.update(order=order, q=ORDER_Q, k=ORDER_K)
    benchmark(run)
