"""Training curves as a PNG: loss and per-TTT-step accuracy (train and validation) against steps.

Owns reading the JSON-lines training log and drawing it with matplotlib (Agg backend, no
display needed). matplotlib is the `train` extra; without it `plot_training_log` says so.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["read_log", "plot_training_log"]


def read_log(path) -> list[dict]:
    """Records of a JSON-lines training log (blank lines skipped)."""
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def plot_training_log(log_path, png_path, *, title: str = "EAGLE-3 head training") -> Path:
    """Draw loss (left) and per-step top-1 accuracy (right) from `log_path` into `png_path`."""
    try:
        import matplotlib
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("plotting needs matplotlib: pip install 'specdec[train]'") from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_log(log_path)
    train = [r for r in records if r.get("kind") == "train"]
    val = [r for r in records if r.get("kind") == "val"]
    if not train:
        raise ValueError(f"{log_path} has no train records to plot")
    steps = [r["step"] for r in train]
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(12, 4.5), dpi=110)
    ax_loss.plot(steps, [r["loss"] for r in train], label="train (weighted sum over steps)", color="black")
    n_steps = len(train[0]["step_loss"])
    cmap = plt.get_cmap("viridis")
    for k in range(n_steps):
        ax_loss.plot(steps, [r["step_loss"][k] for r in train], color=cmap(k / max(1, n_steps - 1)), lw=0.8, alpha=0.7,
                     label=f"step {k}" if k in (0, n_steps - 1) else None)
    if val:
        ax_loss.plot([r["step"] for r in val], [r["loss"] for r in val], "o--", color="tab:red", label="validation")
    ax_loss.set_xlabel("optimizer step")
    ax_loss.set_ylabel("soft cross-entropy")
    ax_loss.set_yscale("log")
    ax_loss.legend(fontsize=8)
    ax_loss.grid(alpha=0.3)
    for k in range(n_steps):
        color = cmap(k / max(1, n_steps - 1))
        ax_acc.plot(steps, [r["step_acc"][k] for r in train], color=color, lw=1.0, label=f"TTT step {k}")
        if val:
            ax_acc.plot([r["step"] for r in val], [r["step_acc"][k] for r in val], "o", color=color, ms=3)
    ax_acc.set_xlabel("optimizer step")
    ax_acc.set_ylabel("top-1 == target argmax (response tokens)")
    ax_acc.set_ylim(0, 1)
    ax_acc.grid(alpha=0.3)
    ax_acc.legend(fontsize=7, ncol=2, loc="lower right")
    tau = train[-1].get("est_tau")
    note = "dots: validation; " if val else ""
    ax_acc.set_title(f"{note}est. chain accept length (5 drafts) {tau:.2f}" if tau else note, fontsize=9)
    fig.suptitle(title)
    fig.tight_layout()
    png_path = Path(png_path)
    png_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png_path)
    plt.close(fig)
    return png_path
