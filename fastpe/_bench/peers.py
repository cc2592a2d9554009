"""Other libraries' RoPE and ALiBi, timed beside fastpe on those workloads (float32).

What a user would pick instead of fastpe, each written as its users write it and each
exact in the same sense as fastpe (angles formed in float64; ALiBi biases rounded once):

- ``numba``: hand-written numba kernels, in place. RoPE: one pass, the token's cos/sin
  computed once in float64 and used for every head of q and k, rotation in float32.
  ALiBi: one pass over each row of scores, the float64 slope times the integer distance
  rounded once to float32 and added, the causal mask fused (keys past the query are
  written -inf, never read);
- ``jax``: ALiBi only, ``jax.jit`` of the textbook expression (float32 slopes times the
  exact distances, ``jnp.where`` for the mask), which XLA fuses into one loop. It is
  functional: each call returns a new array, here with the scores donated so that XLA
  writes it into their buffer (the scores live on the device, uploaded once);
- ``onnxruntime``: ONNX Runtime's ``RotaryEmbedding`` contrib operator (com.microsoft),
  one graph of two nodes (q and k) built in memory with ``onnx.helper``, with a float32
  cos/sin cache made from float64 angles; it writes new arrays;
- ``torch``: PyTorch eager in Hugging Face's form (``q * cos + rotate_half(q) * sin``,
  GPT-J's ``rotate_every_two`` for gptj), cos/sin per call from float64 angles; for
  DeBERTa the steps of DebertaV2's ``disentangled_attention_bias`` after its two matrix
  products (the relative positions made once, as its encoder makes them once per
  forward; per call the clamps, both gathers, the transpose and the adds);
- ``torch.compile``: the same function through ``torch.compile``;
- ``fastpe-torch``: fastpe itself, the very call of the ``fastpe`` column, on torch CPU
  tensors sharing the arrays' memory (``torch.from_numpy``, made once): what a torch
  user gets, beside the torch columns, on every workload but the NumPy program. It runs
  on fastpe's thread count.

Each is skipped when its packages are not installed (``pip install 'fastpe[peers]'``)
or fail to import.
Every other peer runs on one thread (ONNX Runtime and torch are told so; XLA's CPU client is
made with one CPU in view when fastpe is the first to import jax), like the NumPy
baseline and the default ``--threads 1``.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import numpy as np

import fastpe

from .common import Arrays, MaybePrepare, Result, Runner, Workload

if TYPE_CHECKING:  # an optional peer
    import torch

PEERS = ("numba", "onnxruntime", "torch", "torch.compile", "fastpe-torch", "jax")
# peers that are fastpe called another way: timed on fastpe's thread count
FASTPE_PEERS = ("fastpe-torch",)
_NEEDS = {"numba": ("numba",), "onnxruntime": ("onnxruntime", "onnx"), "torch": ("torch",),
          "torch.compile": ("torch",), "fastpe-torch": ("torch",), "jax": ("jax",)}
# the workload families each peer has an implementation for
_FAMILIES = {"numba": ("rope", "alibi"), "onnxruntime": ("rope",), "torch": ("rope", "relative"),
             "torch.compile": ("rope",),
             "fastpe-torch": ("rope", "sinusoidal", "learned", "alibi", "relative"),
             "jax": ("alibi",)}


def missing(name: str) -> str | None:
    """Why peer `name` cannot run here, or None when it can: not installed, or installed
    but failing to import (numba built for another NumPy, say)."""
    lacking = [m for m in _NEEDS[name] if importlib.util.find_spec(m) is None]
    if lacking:
        return f"{', '.join(lacking)} not installed"
    for module in _NEEDS[name]:
        try:
            importlib.import_module(module)
        except Exception as exc:  # whatever a broken install raises
            first = str(exc).splitlines()[0] if str(exc) else ""
            return f"{module} failed to import ({type(exc).__name__}: {first})"
    return None


def _positions(wl: Workload, arrays: Arrays) -> np.ndarray:
    """The workload's positions as a (rows, seq) int64 array."""
    p = wl.params
    seq = arrays["q"].shape[1]
    if p["positions"] is None:
        pos: np.ndarray = p["offset"] + np.arange(seq, dtype=np.int64)
        return pos[None]
    pos = np.asarray(p["positions"], np.int64)
    return pos.reshape(-1, seq)


def _frequencies(wl: Workload) -> fastpe.RopeFrequencies:
    p = wl.params
    return fastpe.rope_frequencies(p["head_dim"], base=p["base"], scaling=p["scaling"])


# ---- numba --------------------------------------------------------------------------------

@functools.cache
def _numba_kernel() -> Callable[..., None]:
    import numba
    jit: Callable[[Callable[..., None]], Callable[..., None]] = numba.njit(nogil=True, cache=False)

    @jit
    def rotate(x: np.ndarray, row: int, t: int, c: np.ndarray, s: np.ndarray, half: int,
               neox: bool) -> None:
        for h in range(x.shape[2]):
            if neox:
                for j in range(half):
                    a = x[row, t, h, j]
                    b = x[row, t, h, j + half]
                    x[row, t, h, j] = a * c[j] - b * s[j]
                    x[row, t, h, j + half] = b * c[j] + a * s[j]
            else:
                for j in range(half):
                    a = x[row, t, h, 2 * j]
                    b = x[row, t, h, 2 * j + 1]
                    x[row, t, h, 2 * j] = a * c[j] - b * s[j]
                    x[row, t, h, 2 * j + 1] = b * c[j] + a * s[j]

    @jit
    def rope(q: np.ndarray, k: np.ndarray, pos: np.ndarray, inv_freq: np.ndarray, att: float,
             neox: bool, c: np.ndarray, s: np.ndarray) -> None:
        half = inv_freq.shape[0]
        for b in range(q.shape[0]):
            prow = b if pos.shape[0] > 1 else 0
            for t in range(q.shape[1]):
                p = np.float64(pos[prow, t])
                for j in range(half):
                    angle = p * inv_freq[j]              # float64, as fastpe
                    c[j] = np.float32(math.cos(angle) * att)
                    s[j] = np.float32(math.sin(angle) * att)
                rotate(q, b, t, c, s, half, neox)
                rotate(k, b, t, c, s, half, neox)
    return rope


def _numba(wl: Workload) -> MaybePrepare:
    def prepare(arrays: Arrays, threads: int) -> Runner | None:
        if arrays["q"].dtype != np.float32:
            return None
        kernel = _numba_kernel()
        freqs = _frequencies(wl)
        pos = _positions(wl, arrays)
        half = freqs.inv_freq.size
        c, s = np.empty(half, np.float32), np.empty(half, np.float32)
        neox = wl.params["style"] == "neox"
        att = float(freqs.attention_scaling)
        q0 = arrays["q"][:1, :1].copy()
        kernel(q0, q0.copy(), pos, freqs.inv_freq, att, neox, c, s)  # compiles: not timed

        def run(a: Arrays) -> Result:
            kernel(a["q"], a["k"], pos, freqs.inv_freq, att, neox, c, s)
            return a["q"], a["k"]
        return run
    return prepare


@functools.cache
def _numba_alibi_kernel() -> Callable[..., None]:
    import numba
    jit: Callable[[Callable[..., None]], Callable[..., None]] = numba.njit(nogil=True, cache=False)

    @jit
    def alibi(scores: np.ndarray, slopes: np.ndarray, q_offset: int, causal: bool) -> None:
        heads, q_len, k_len = scores.shape[1], scores.shape[2], scores.shape[3]
        for b in range(scores.shape[0]):
            for h in range(heads):
                m = slopes[h]                                    # float64
                for i in range(q_len):
                    row = scores[b, h, i]
                    qp = q_offset + i
                    end = min(k_len, qp + 1) if causal else k_len
                    for j in range(end):
                        # float64 product of exact integers, rounded once
                        row[j] += np.float32(m * np.float64(j - qp))
                    for j in range(max(end, 0), k_len):
                        row[j] = -np.inf
    return alibi


def _alibi_call(wl: Workload, arrays: Arrays) -> tuple[np.ndarray, int, bool]:
    """The default slopes (float64), q_offset and causal flag of an ALiBi workload."""
    heads, q_len, k_len = arrays["scores"].shape[-3:]
    return fastpe.alibi_slopes(heads), k_len - q_len, bool(wl.params["causal"])


def _numba_alibi(wl: Workload) -> MaybePrepare:
    def prepare(arrays: Arrays, threads: int) -> Runner | None:
        x = arrays["scores"]
        if x.dtype != np.float32 or x.ndim != 4:
            return None
        kernel = _numba_alibi_kernel()
        slopes, q_offset, causal = _alibi_call(wl, arrays)
        kernel(x[:1, :1, :1].copy(), slopes, q_offset, causal)  # compiles: not timed

        def run(a: Arrays) -> Result:
            kernel(a["scores"], slopes, q_offset, causal)
            return (a["scores"],)
        return run
    return prepare


# ---- JAX ----------------------------------------------------------------------------------

def _jax_one_thread() -> Any:
    """jax, its CPU client made while this thread may run on one CPU only: XLA sizes
    its thread pool by the CPUs the process may use (and its flags have no switch for
    the fused loops). The pool's threads keep that one CPU; this thread gets its CPUs
    back. When something imported jax first, its client is as that left it."""
    if "jax" in sys.modules or not hasattr(os, "sched_setaffinity"):
        import jax
        return jax
    cpus = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cpus)})
    try:
        import jax
        jax.devices()               # makes the CPU client and its thread pool
    finally:
        os.sched_setaffinity(0, cpus)
    return jax


def _jax_alibi(wl: Workload) -> MaybePrepare:
    def prepare(arrays: Arrays, threads: int) -> Runner | None:
        x0 = arrays["scores"]
        if x0.dtype != np.float32:
            return None
        jax = _jax_one_thread()
        import jax.numpy as jnp

        q_len, k_len = x0.shape[-2:]
        slopes, q_offset, causal = _alibi_call(wl, arrays)
        slopes32 = jnp.asarray(slopes.astype(np.float32))[:, None, None]

        def alibi(scores: Any) -> Any:
            dist = (jnp.arange(k_len, dtype=jnp.int32)[None, :]
                    - jnp.arange(q_offset, q_offset + q_len, dtype=jnp.int32)[:, None])
            out = scores + slopes32 * dist.astype(jnp.float32)   # exact below 2**24
            return jnp.where(dist <= 0, out, -jnp.inf) if causal else out

        # the scores donated: XLA writes the new array into their buffer, as a model
        # whose scores are not needed again does (a fresh 512 MiB result per call
        # measured 5x slower, most of it page faults)
        fn = jax.jit(alibi, donate_argnums=0)
        held: dict[str, Any] = {}

        def run(a: Arrays) -> Result:
            if held.get("source") is not a["scores"]:
                # the scores as a model holds them: on the device, uploaded once
                held["source"], held["scores"] = a["scores"], jax.device_put(a["scores"])
            held["scores"] = fn(held["scores"]).block_until_ready()
            return cast(Result, (held["scores"],))
        return run  # compiled by its first call, the untimed check
    return prepare


# ---- ONNX Runtime -------------------------------------------------------------------------

def _onnxruntime(wl: Workload) -> MaybePrepare:
    def prepare(arrays: Arrays, threads: int) -> Runner | None:
        q0, k0 = arrays["q"], arrays["k"]
        if q0.dtype != np.float32:
            return None
        import onnxruntime as ort
        from onnx import TensorProto, helper, numpy_helper

        b, seq, hq, d = q0.shape
        hk = k0.shape[2]
        freqs = _frequencies(wl)
        pos = _positions(wl, arrays)
        rows = int(pos.max()) + 1
        angles = np.arange(rows, dtype=np.float64)[:, None] * freqs.inv_freq
        att = freqs.attention_scaling
        cos = (np.cos(angles) * att).astype(np.float32)
        sin = (np.sin(angles) * att).astype(np.float32)
        interleaved = 0 if wl.params["style"] == "neox" else 1
        nodes = [helper.make_node("RotaryEmbedding", [x, "pos", "cos", "sin"], [x + "_out"],
                                  domain="com.microsoft", interleaved=interleaved,
                                  num_heads=heads)
                 for x, heads in (("q", hq), ("k", hk))]
        graph = helper.make_graph(
            nodes, "rope",
            [helper.make_tensor_value_info("q", TensorProto.FLOAT, [b, seq, hq * d]),
             helper.make_tensor_value_info("k", TensorProto.FLOAT, [b, seq, hk * d]),
             helper.make_tensor_value_info("pos", TensorProto.INT64, list(pos.shape))],
            [helper.make_tensor_value_info("q_out", TensorProto.FLOAT, [b, seq, hq * d]),
             helper.make_tensor_value_info("k_out", TensorProto.FLOAT, [b, seq, hk * d])],
            initializer=[numpy_helper.from_array(cos, "cos"), numpy_helper.from_array(sin, "sin")])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                        helper.make_opsetid("com.microsoft", 1)])
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        session = ort.InferenceSession(model.SerializeToString(), options,
                                       providers=["CPUExecutionProvider"])
        if pos.shape[0] != b:
            pos = np.ascontiguousarray(np.broadcast_to(pos, (b, seq)))

        def run(a: Arrays) -> Result:
            qo, ko = session.run(None, {"q": a["q"].reshape(b, seq, -1),
                                        "k": a["k"].reshape(b, seq, -1), "pos": pos})
            return qo.reshape(a["q"].shape), ko.reshape(a["k"].shape)
        return run
    return prepare


# ---- torch --------------------------------------------------------------------------------

def _torch_rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                neox: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Hugging Face's apply_rotary_pos_emb: cos and sin (rows, seq, 1, width)."""
    import torch
    if neox:
        def rot(x: torch.Tensor) -> torch.Tensor:
            x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
            return torch.cat((-x2, x1), dim=-1)
    else:
        def rot(x: torch.Tensor) -> torch.Tensor:
            x1, x2 = x[..., ::2], x[..., 1::2]
            return torch.stack((-x2, x1), dim=-1).flatten(-2)
    return q * cos + rot(q) * sin, k * cos + rot(k) * sin


def _torch(wl: Workload, compiled: bool) -> MaybePrepare:
    def prepare(arrays: Arrays, threads: int) -> Runner | None:
        if arrays["q"].dtype != np.float32:
            return None
        import torch
        torch.set_num_threads(1)
        freqs = _frequencies(wl)
        neox = wl.params["style"] == "neox"
        pos = torch.from_numpy(_positions(wl, arrays))
        inv_freq = torch.from_numpy(freqs.inv_freq.copy())   # float64: exact angles
        att = freqs.attention_scaling
        fn: Callable[..., tuple[torch.Tensor, torch.Tensor]] = functools.partial(_torch_rope,
                                                                                  neox=neox)
        if compiled:
            fn = torch.compile(fn, dynamic=False)

        def run(a: Arrays) -> Result:
            q, k = torch.from_numpy(a["q"]), torch.from_numpy(a["k"])
            angles = pos[..., None].double() * inv_freq          # (rows, seq, half)
            emb = torch.cat((angles, angles), -1) if neox else angles.repeat_interleave(2, -1)
            cos = (emb.cos() * att).float()[:, :, None]
            sin = (emb.sin() * att).float()[:, :, None]
            qo, ko = fn(q, k, cos, sin)
            return qo.numpy(), ko.numpy()
        run(arrays)  # torch.compile compiles on the first call: not timed
        return run
    return prepare


def _torch_t5(wl: Workload) -> MaybePrepare:
    """T5's bias in torch eager as a decode loop keeps it: the bucket of every distance
    cached, per call one gather of the table's columns and an in-place add."""
    def prepare(arrays: Arrays, threads: int) -> Runner | None:
        if arrays["scores"].dtype != np.float32:
            return None
        import torch
        torch.set_num_threads(1)
        q, k = arrays["scores"].shape[-2:]
        table = wl.params["table"]
        rel = np.arange(k)[None, :] - (k - q + np.arange(q))[:, None]
        buckets = torch.from_numpy(fastpe.relative_position_bucket(
            rel, bidirectional=wl.params["bidirectional"], num_buckets=table.shape[0],
            max_distance=wl.params["max_distance"]))
        columns = torch.from_numpy(np.ascontiguousarray(table.T))

        def run(a: Arrays) -> Result:
            with torch.no_grad():
                torch.from_numpy(a["scores"]).add_(columns[:, buckets])
            return (a["scores"],)
        return run
    return prepare


def _torch_disentangled(wl: Workload) -> MaybePrepare:
    def prepare(arrays: Arrays, threads: int) -> Runner | None:
        if arrays["scores"].dtype != np.float32:
            return None
        import torch
        torch.set_num_threads(1)
        q, k = arrays["scores"].shape[-2:]
        span = arrays["c2p"].shape[-1] // 2
        rel = torch.from_numpy(fastpe.deberta_relative_positions(q, k, **wl.params))[None]
        c2p_att = torch.from_numpy(arrays["c2p"]).reshape(-1, q, 2 * span)
        p2c_att = torch.from_numpy(arrays["p2c"]).reshape(-1, k, 2 * span)
        n = c2p_att.shape[0]

        def run(a: Arrays) -> Result:
            with torch.no_grad():
                c2p_pos = torch.clamp(rel + span, 0, span * 2 - 1)
                c2p = torch.gather(c2p_att, dim=-1, index=c2p_pos.squeeze(0).expand([n, q, k]))
                p2c_pos = torch.clamp(-rel + span, 0, span * 2 - 1)
                p2c = torch.gather(p2c_att, dim=-1,
                                   index=p2c_pos.squeeze(0).expand([n, k, k])).transpose(-1, -2)
                score = c2p + p2c
                torch.from_numpy(a["scores"]).view(n, q, k).add_(score)
            return (a["scores"],)
        return run
    return prepare


# ---- fastpe on torch tensors ---------------------------------------------------------------

def _fastpe_torch(wl: Workload) -> MaybePrepare:
    def prepare(arrays: Arrays, threads: int) -> Runner | None:
        import torch

        def tensor(v: np.ndarray) -> Any:
            if v.dtype.name == "bfloat16":  # ml_dtypes' bfloat16, which torch does not take
                return torch.from_numpy(v.view(np.uint16)).view(torch.bfloat16)
            return torch.from_numpy(v)
        tensors = {n: tensor(v) for n, v in arrays.items()}
        run_tensors = wl.impls["fastpe"](cast(Arrays, tensors), threads)
        if not any(v.dtype.name == "bfloat16" for v in arrays.values()):
            # nothing timed beside fastpe's call that the fastpe column does not do too
            def run(a: Arrays) -> Result:
                if a is not arrays:  # pragma: no cover - the bench runs it on its own arrays
                    raise ValueError("fastpe-torch runs on the arrays it was prepared for")
                return run_tensors(cast(Arrays, tensors))
            return run

        def run_bf16(a: Arrays) -> Result:
            if a is not arrays:  # pragma: no cover - the bench runs it on its own arrays
                raise ValueError("fastpe-torch runs on the arrays it was prepared for")
            out = run_tensors(cast(Arrays, tensors))
            # a bfloat16 tensor has no .numpy(): the array it shares its memory with
            bf16 = torch.bfloat16
            return tuple(arrays[n] if n in arrays and getattr(o, "dtype", None) == bf16 else o
                         for n, o in zip(wl.result, out))
        return run_bf16
    return prepare


def _peer_for(name: str, wl: Workload) -> MaybePrepare | None:
    """Peer `name`'s implementation of `wl`, or None when it has none."""
    if wl.family not in _FAMILIES[name]:
        return None
    if name == "fastpe-torch":
        return _fastpe_torch(wl)
    if wl.family == "relative":
        if name != "torch":
            return None
        return _torch_t5(wl) if "bidirectional" in wl.params else _torch_disentangled(wl)
    if wl.family == "rope":
        if "style" not in wl.params:
            return None
        if name in ("torch", "torch.compile"):
            return _torch(wl, compiled=name == "torch.compile")
        return {"numba": _numba, "onnxruntime": _onnxruntime}[name](wl)
    if "causal" not in wl.params:  # an ALiBi call on scores
        return None
    return {"numba": _numba_alibi, "jax": _jax_alibi}[name](wl)


def attach(workloads: list[Workload], wanted: tuple[str, ...] = PEERS) -> dict[str, str]:
    """Add the wanted peers that can run here to every workload they implement (RoPE
    prefill and decode; ALiBi on scores; DeBERTa's bias); returns the skipped ones with
    the reason."""
    skipped = {}
    for name in wanted:
        reason = missing(name)
        if reason is not None:
            skipped[name] = reason
            continue
        for wl in workloads:
            peer = _peer_for(name, wl)
            if peer is not None:
                wl.peers[name] = peer
    return skipped
