"""ALiBi (Press et al., 2022): add_alibi into causal (1, 32, 2048, 2048) scores, alibi_bias(32, 2048,
2048) into a buffer, decode add_alibi into (1, 32, 1, 4096) and into a left-padded batch's
(4, 32, 1, 4096) with its attention mask, against the best NumPy,
BLOOM's torch code and a hand-written numba kernel when installed, and one streaming pass
(a fill for the table).

torch: transformers' BLOOM ``build_alibi_tensor`` (the key-position form
``slope_h * k_pos``, (batch * heads, 1, k_len)) added with broadcasting in place, then
BLOOM's causal mask (``masked_fill_`` with -inf) for prefill, its padding mask for the
padded batch. It equals fastpe's bias up
to a constant per row (softmax ignores it), so its check allows that constant. The bias
is built per call, as BLOOM's forward does.
"""

import pytest

pytest.importorskip("pytest_benchmark")

from benchutil import cases, run_case

from fastpe import _bench

WORKLOADS = _bench.alibi_workloads(_bench.FULL)
if not WORKLOADS:
    pytest.skip("this fastpe has no add_alibi", allow_module_level=True)
# numba where installed (jax's runner holds its scores on the device, uploaded once per
# input array: here every round brings a fresh copy, so it would time the upload)
PEERS_SKIPPED = _bench.attach_peers(WORKLOADS, ("numba",))


def _torch_alibi(wl: _bench.Workload):
    import torch
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor
    causal = wl.params.get("causal", False)
    key_mask = wl.params.get("key_mask")

    def prepare(arrays, threads):
        torch.set_num_threads(threads)
        batch, heads, q_len, k_len = arrays["scores"].shape
        mask = (torch.ones(batch, k_len, dtype=torch.int64) if key_mask is None
                else torch.from_numpy(key_mask))
        future = torch.ones(q_len, k_len, dtype=torch.bool).triu(1 + k_len - q_len)
        padding = (mask == 0)[:, None, None, :]

        def run(a):
            s = torch.from_numpy(a["scores"])
            alibi = build_alibi_tensor(mask, heads, s.dtype).view(batch, heads, 1, k_len)
            s.add_(alibi)
            if causal:
                s.masked_fill_(future, float("-inf"))
            if key_mask is not None:
                s.masked_fill_(padding, float("-inf"))
            return (a["scores"],)
        return run
    return prepare


try:
    import torch  # noqa: F401
    import transformers  # noqa: F401
    UNAVAILABLE = {}
    for _wl in WORKLOADS:
        if _wl.name != "alibi-bias":       # BLOOM has no (heads, q, k) table to compare
            _wl.impls["torch"] = _torch_alibi(_wl)
            _wl.offset_per_row.add("torch")
except ImportError as exc:
    UNAVAILABLE = {"torch": f"torch/transformers not installed ({exc})"}


@pytest.mark.parametrize("wl, dtype, impl, threads", cases(WORKLOADS, {**UNAVAILABLE, **PEERS_SKIPPED}))
def test_alibi(benchmark, wl, dtype, impl, threads):
    if impl == "torch" and impl not in wl.impls:
        pytest.skip("BLOOM builds no (heads, q, k) table")
    run_case(benchmark, wl, dtype, impl, threads)
