"""``python -m fastpe demo``: the defining properties of each encoding, with numbers.

RoPE makes q.k depend only on the distance (Su et al., 2021); sinusoidal frequencies
fall geometrically across the dimensions (Vaswani et al., 2017); ALiBi adds a per-head
slope times the distance (Press et al., 2022)."""

from __future__ import annotations

import math

import numpy as np

import fastpe

ROPE_DIM = 64
ROPE_PAIRS = ((2, 5), (10, 13), (100, 103), (10, 12))
TABLE_DIM = 512
ALIBI_HEADS = (8, 12)
ALIBI_KEYS = 8


def _rope_lines() -> list[str]:
    rng = np.random.default_rng(0)
    q0 = rng.standard_normal((1, 1, 1, ROPE_DIM))
    k0 = rng.standard_normal((1, 1, 1, ROPE_DIM))

    def rotated(x: np.ndarray, pos: int) -> np.ndarray:
        y = x.copy()
        fastpe.apply_rope(y, positions=np.array([pos]))
        return y

    lines = [f"1. RoPE puts relative position into q.k (head_dim {ROPE_DIM}, base 10000, "
             "neox style, float64)",
             "   the same q and k vectors, each rotated to its position:"]
    dots = {}
    for qp, kp in ROPE_PAIRS:
        dots[qp, kp] = float((rotated(q0, qp) * rotated(k0, kp)).sum())
        lines.append(f"     q at {qp:>3}, k at {kp:>3}  (distance {kp - qp}):  "
                     f"q.k = {dots[qp, kp]: .12f}")
    equal = [d for (qp, kp), d in dots.items() if kp - qp == 3]
    spread = max(equal) - min(equal)
    lines.append(f"   equal distances give equal scores (spread {spread:.1e}); "
                 f"distance 2 differs by {abs(dots[10, 12] - dots[10, 13]):.3f}")
    q = rotated(q0, 1000)
    pairs = q0.reshape(-1, 2, ROPE_DIM // 2)
    norm_change = np.abs(np.hypot(*pairs[0]) - np.hypot(*q.reshape(2, -1))).max()
    back = q.copy()
    fastpe.apply_rope(back, positions=np.array([1000]), inverse=True)
    lines.append(f"   a rotation keeps every pair's norm (max change {norm_change:.1e}); "
                 f"inverse=True undoes it (max error {np.abs(back - q0).max():.1e})")
    return lines


def _sinusoidal_lines() -> list[str]:
    inv = np.exp(np.arange(0, TABLE_DIM, 2) * (-math.log(10000.0) / TABLE_DIM))
    lines = [f"2. Sinusoidal frequencies fall across the dimensions (dim {TABLE_DIM}, "
             "base 10000): w_i = 10000^(-2i/d)",
             "     pair i   columns      frequency w_i    wavelength 2*pi/w_i"]
    for i in (0, 1, 2, 8, 32, 64, 128, 255):
        lines.append(f"     {i:>6}   {2 * i:>3}, {2 * i + 1:<4}   {inv[i]:>14.6g}    "
                     f"{2 * math.pi / inv[i]:>12.1f} positions")
    table = fastpe.sinusoidal_table(4, TABLE_DIM, dtype="float64")
    lines.append("   the first columns of the table: sin, cos of the fastest frequency, "
                 "then slower ones")
    lines.append("     position " + " ".join(f"{f'PE[:, {c}]':>9}" for c in range(6)))
    for p in range(4):
        lines.append(f"     {p:>8} " + " ".join(f"{v:>9.5f}" for v in table[p, :6]))
    return lines


def _alibi_lines() -> list[str]:
    lines = ["3. ALiBi: a per-head slope times the distance, added to the attention "
             "scores (max_bias 8)"]
    for heads in ALIBI_HEADS:
        slopes = fastpe.alibi_slopes(heads)
        kind = "a power of two" if heads & (heads - 1) == 0 else "not a power of two"
        lines.append(f"   {heads} heads ({kind}): slopes "
                     + " ".join(f"{s:.4g}" for s in slopes))
    heads = ALIBI_HEADS[0]
    bias = fastpe.alibi_bias(heads, 1, ALIBI_KEYS, dtype="float64")
    lines.append(f"   the bias row of the newest query (position {ALIBI_KEYS - 1}) over keys "
                 f"0..{ALIBI_KEYS - 1}, one row per head:")
    for h in range(heads):
        lines.append(f"     head {h}: " + " ".join(f"{v:>9.5f}" for v in bias[h, 0]))
    return lines


def demo_text() -> str:
    parts = [f"fastpe {fastpe.__version__} demo ({fastpe.backend()} backend): "
             "each encoding's defining property, with numbers", ""]
    for block in (_rope_lines(), _sinusoidal_lines(), _alibi_lines()):
        parts.extend(block)
        parts.append("")
    return "\n".join(parts).rstrip() + "\n"


def _rope_scores(n: int) -> np.ndarray:
    """q_m . k_n for one fixed q and k vector rotated to every pair of positions < n."""
    rng = np.random.default_rng(0)
    q = np.repeat(rng.standard_normal((1, 1, 1, ROPE_DIM)), n, axis=1)
    k = np.repeat(rng.standard_normal((1, 1, 1, ROPE_DIM)), n, axis=1)
    fastpe.apply_rope(q, k)
    scores: np.ndarray = np.einsum("md,nd->mn", q[0, :, 0], k[0, :, 0])
    return scores


def plot(path: str) -> None:
    """Three panels, saved to `path`: RoPE's q.k over query and key positions (constant
    along each diagonal: it depends only on the distance), a sinusoidal table, and the
    ALiBi bias of the newest query for every head on one colour scale (the slopes)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_rope, ax_sin, ax_alibi) = plt.subplots(1, 3, figsize=(16.5, 4.6))
    n = 64
    im = ax_rope.imshow(_rope_scores(n), aspect="auto", cmap="RdBu_r", interpolation="nearest")
    ax_rope.set_title(f"RoPE: q.k of the same vectors at every position pair\n"
                      f"(head_dim {ROPE_DIM}; equal along each diagonal)")
    ax_rope.set_xlabel("key position")
    ax_rope.set_ylabel("query position")
    fig.colorbar(im, ax=ax_rope)

    table = fastpe.sinusoidal_table(128, 128)
    im = ax_sin.imshow(table, aspect="auto", cmap="RdBu_r", vmin=-1, vmax=1,
                       interpolation="nearest")
    ax_sin.set_title("sinusoidal_table(128, 128)")
    ax_sin.set_xlabel("feature (even: sin, odd: cos)")
    ax_sin.set_ylabel("position")
    fig.colorbar(im, ax=ax_sin)

    heads, keys = 8, 32
    bias = fastpe.alibi_bias(heads, 1, keys, dtype="float64")[:, 0]
    im = ax_alibi.imshow(bias, aspect="auto", cmap="viridis", interpolation="nearest")
    ax_alibi.set_title(f"ALiBi: bias of the newest query (position {keys - 1})\n"
                       f"per head, slopes {fastpe.alibi_slopes(heads)[0]:g} .. "
                       f"{fastpe.alibi_slopes(heads)[-1]:g}")
    ax_alibi.set_xlabel("key position")
    ax_alibi.set_ylabel("head")
    fig.colorbar(im, ax=ax_alibi)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
