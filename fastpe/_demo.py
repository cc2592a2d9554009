"""``python -m fastpe demo``: the seed notes' properties, shown with numbers."""

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

    def rotated(x, pos):
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
    if not hasattr(fastpe, "alibi_slopes"):
        return ["3. ALiBi: not in this fastpe build"]
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
             "the properties from the seed notes, with numbers", ""]
    for block in (_rope_lines(), _sinusoidal_lines(), _alibi_lines()):
        parts.extend(block)
        parts.append("")
    return "\n".join(parts).rstrip() + "\n"


def plot(path: str) -> None:
    """Heatmaps of a sinusoidal table and of causal ALiBi biases, saved to `path`."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    alibi = hasattr(fastpe, "alibi_bias")
    ncols = 3 if alibi else 1
    fig, axes = plt.subplots(1, ncols, figsize=(5.5 * ncols, 4.6), squeeze=False)
    axes = axes[0]
    table = fastpe.sinusoidal_table(128, 128)
    im = axes[0].imshow(table, aspect="auto", cmap="RdBu_r", vmin=-1, vmax=1,
                        interpolation="nearest")
    axes[0].set_title("sinusoidal_table(128, 128)")
    axes[0].set_xlabel("feature (even: sin, odd: cos)")
    axes[0].set_ylabel("position")
    fig.colorbar(im, ax=axes[0])
    if alibi:
        n, heads = 32, 8
        bias = fastpe.alibi_bias(heads, n, n, causal=True)
        for ax, h in zip(axes[1:], (0, heads - 1)):
            shown = np.where(np.isfinite(bias[h]), bias[h], np.nan)  # masked: blank
            im = ax.imshow(shown, aspect="auto", cmap="viridis", interpolation="nearest")
            ax.set_title(f"alibi_bias({heads}, {n}, {n}, causal=True)[{h}]\n"
                         f"slope {fastpe.alibi_slopes(heads)[h]:g}; blank = -inf")
            ax.set_xlabel("key position")
            ax.set_ylabel("query position")
            fig.colorbar(im, ax=ax)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
