"""The loss plot of a training run: train loss (raw and a moving mean) and held-out loss against
the tokens trained; needs matplotlib (skipped with a line without it)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def plot(history: dict, path: Path, title: str) -> bool:
    """Write the plot of ``history`` (train.py's) to ``path``; False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("loss plot skipped: matplotlib is not installed", flush=True)
        return False
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    tokens = np.asarray(history["train_tokens"], dtype=float) / 1e6
    loss = np.asarray(history["train_loss"], dtype=float)
    if len(loss):
        ax.plot(tokens, loss, color="tab:blue", alpha=0.25, lw=0.8)
        w = max(1, len(loss) // 40) * 2 + 1  # centered moving mean over ~5 % of the points
        if len(loss) > w:
            mean = np.convolve(loss, np.ones(w) / w, mode="valid")
            ax.plot(tokens[w // 2:len(loss) - w // 2], mean, color="tab:blue", lw=1.5,
                    label=f"train (mean of {w} points)")
        else:
            ax.plot(tokens, loss, color="tab:blue", lw=1.5, label="train")
    if history["eval_loss"]:
        ax.plot(np.asarray(history["eval_tokens"], dtype=float) / 1e6, history["eval_loss"], "o-", color="tab:orange",
                lw=1.5, ms=3, label="held-out")
    ax.set_xlabel("training tokens (millions)")
    ax.set_ylabel("loss (nats per token)")
    ax.set_title(title, fontsize=10)
    if len(loss):
        low = min(loss.min(), min(history["eval_loss"] or [9e9]))
        ax.set_ylim(max(0.0, low - 0.2), min(float(loss.max()), 10.0) + 0.1)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True
