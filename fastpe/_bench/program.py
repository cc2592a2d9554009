"""A real program for the bench: one decode step of a small Llama written in NumPy.

Llama's decoder (Touvron et al., 2023) as NumPy inference code writes it: RMSNorm, one
fused QKV projection whose output q, k and v are views of, RoPE on q and k at each
sequence's own position (neox pairs), a KV cache written in place, grouped-query
attention over the cached keys, a SwiGLU MLP, the logits of the next token. The weights
are random (nothing is downloaded); the batch decodes four sequences at different
lengths.

The program's own RoPE is the one such code carries: a float32 cos/sin table made at
start-up from float64 angles, its rows gathered at the positions, the halves rotated
into new arrays. The fastpe version calls ``fastpe.apply_rope`` on the q and k views in
place. The step times both, and inside the step the RoPE call alone (``inner_seconds``):
what RoPE costs where a program runs it, between matrix products that fill the caches
with weights.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import numpy as np

import fastpe

from .common import Arrays, Result, Runner, Size


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    max_len: int
    batch: int
    lengths: tuple[int, ...]      # tokens already in each sequence's cache
    base: float = 10000.0
    eps: float = 1e-5


def llama_config(size: Size) -> LlamaConfig:
    return LlamaConfig(**size["llama"])


def make_model(cfg: LlamaConfig) -> Arrays:
    """Random weights (scaled so activations stay of order one through the layers), a
    KV cache holding `lengths` tokens per sequence, the step's input tokens."""
    rng = np.random.default_rng(20240601)
    d, h, kvh, hd, f, n = (cfg.hidden, cfg.heads, cfg.kv_heads, cfg.head_dim,
                           cfg.intermediate, cfg.layers)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape, np.float32) / np.float32(np.sqrt(shape[-2])))

    cache = (n, cfg.batch, cfg.max_len, kvh, hd)
    return {
        "embed": rng.standard_normal((cfg.vocab, d), np.float32),
        "wqkv": w(n, d, (h + 2 * kvh) * hd),
        "wo": w(n, h * hd, d),
        "w_gate_up": w(n, d, 2 * f),
        "w_down": w(n, f, d),
        "norms": (1.0 + 0.1 * rng.standard_normal((n, 2, d))).astype(np.float32),
        "final_norm": np.ones(d, np.float32),
        "lm_head": w(d, cfg.vocab),
        "k_cache": rng.standard_normal(cache, np.float32),
        "v_cache": rng.standard_normal(cache, np.float32),
        "tokens": rng.integers(0, cfg.vocab, cfg.batch),
        "logits": np.zeros((cfg.batch, cfg.vocab), np.float32),
    }


def _rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    scale = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(eps))
    out: np.ndarray = x * scale * weight
    return out


class NumpyLlamaRope:
    """The program's own RoPE: cos/sin tables made once, gathered and applied per step
    into new arrays, as hand-written NumPy Llama code does."""

    def __init__(self, cfg: LlamaConfig) -> None:
        half = cfg.head_dim // 2
        inv_freq = cfg.base ** (-np.arange(half, dtype=np.float64) / half)
        angles = np.arange(cfg.max_len, dtype=np.float64)[:, None] * inv_freq
        self.cos = np.cos(angles).astype(np.float32)
        self.sin = np.sin(angles).astype(np.float32)
        self.half = half

    def __call__(self, q: np.ndarray, k: np.ndarray,
                 positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        cos = self.cos[positions][:, :, None]          # (batch, seq, 1, half)
        sin = self.sin[positions][:, :, None]
        out = []
        for x in (q, k):
            x1, x2 = x[..., :self.half], x[..., self.half:]
            out.append(np.concatenate((x1 * cos - x2 * sin, x2 * cos + x1 * sin), axis=-1))
        return out[0], out[1]


Rope = Callable[[np.ndarray, np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]


class DecodeStep:
    """One decode step of the model in `arrays` with RoPE `rope`; a runner of the bench.
    It writes the step's keys and values into the cache at each sequence's position and
    the next-token logits into arrays["logits"]; the same step again gives the same
    logits (the cache slots are rewritten with the same values). `inner_seconds`
    accumulates the time spent in RoPE."""

    def __init__(self, cfg: LlamaConfig, rope: Rope) -> None:
        self.cfg, self.rope = cfg, rope
        self.inner_seconds = 0.0
        self.positions = np.asarray(cfg.lengths, np.int64)[:, None]      # (batch, 1)
        keys = np.arange(cfg.max_len)
        # a sequence attends to its cached tokens and the new one
        self.mask = np.where(keys[None, :] <= self.positions, 0.0, -np.inf).astype(np.float32)

    def __call__(self, a: Arrays) -> Result:
        cfg = self.cfg
        b, h, kvh, hd = cfg.batch, cfg.heads, cfg.kv_heads, cfg.head_dim
        rows = np.arange(b)
        pos = self.positions
        x = a["embed"][a["tokens"]][:, None]                               # (b, 1, d)
        for layer in range(cfg.layers):
            y = _rms_norm(x, a["norms"][layer, 0], cfg.eps)
            qkv = (y @ a["wqkv"][layer]).reshape(b, 1, h + 2 * kvh, hd)
            q, k, v = qkv[:, :, :h], qkv[:, :, h:h + kvh], qkv[:, :, h + kvh:]
            t0 = time.perf_counter()
            q, k = self.rope(q, k, pos)
            self.inner_seconds += time.perf_counter() - t0
            a["k_cache"][layer, rows, pos[:, 0]] = k[:, 0]
            a["v_cache"][layer, rows, pos[:, 0]] = v[:, 0]
            keys, values = a["k_cache"][layer], a["v_cache"][layer]      # (b, T, kvh, hd)
            qg = q[:, 0].reshape(b, kvh, h // kvh, hd)
            scores = qg @ keys.transpose(0, 2, 3, 1) / np.float32(np.sqrt(hd))  # (b, kvh, r, T)
            scores += self.mask[:, None, None]
            scores -= scores.max(axis=-1, keepdims=True)
            np.exp(scores, out=scores)
            scores /= scores.sum(axis=-1, keepdims=True)
            attn = (scores @ values.transpose(0, 2, 1, 3)).reshape(b, 1, h * hd)
            x = x + attn @ a["wo"][layer]
            y = _rms_norm(x, a["norms"][layer, 1], cfg.eps)
            gate, up = np.split(y @ a["w_gate_up"][layer], 2, axis=-1)
            x = x + (gate / (1.0 + np.exp(-gate)) * up) @ a["w_down"][layer]
        logits = _rms_norm(x[:, 0], a["final_norm"], cfg.eps) @ a["lm_head"]
        a["logits"][...] = logits
        return (a["logits"],)


def fastpe_rope(reference: bool, threads: int) -> Rope:
    """fastpe's RoPE (or the reference's) on the q and k views of the fused QKV output,
    in place."""
    def rope(q: np.ndarray, k: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if reference:
            fastpe.reference.apply_rope(q, k, positions, layout="bshd")
        else:
            fastpe.apply_rope(q, k, positions, layout="bshd", num_threads=threads)
        return q, k
    return rope


def prepare_step(kind: str, size: Size) -> Callable[[Arrays, int], Runner]:
    """A decode step with the program's NumPy RoPE (`kind` "numpy") or fastpe's
    ("fastpe", or "reference" for the oracle)."""
    cfg = llama_config(size)

    def prepare(arrays: Arrays, threads: int) -> Runner:
        rope = NumpyLlamaRope(cfg) if kind == "numpy" else fastpe_rope(kind == "reference", threads)
        return DecodeStep(cfg, rope)
    return prepare
