"""Training curves as a PNG: loss and per-TTT-step accuracy (train and validation) against steps,
and, when validation records carry categories, one line per category of validation accuracy
(TTT step 0) and of the estimated chain acceptance length.

Owns reading the JSON-lines training log and drawing it with matplotlib (Agg backend, no
display needed). matplotlib is the `train` extra; without it `plot_training_log` says so.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["CATEGORY_TITLES", "draw_training_log", "read_log", "plot_training_log"]

CATEGORY_TITLES = ("validation top-1 accuracy (TTT step 0) per category", "validation est. chain accept length per category")


def read_log(path) -> list[dict]:
    """Records of a JSON-lines training log (blank lines skipped)."""
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def _matplotlib():
    try:  # here, not at the top: matplotlib is optional (specdec[train]), only plotting needs it
        import matplotlib
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("plotting needs matplotlib: pip install 'specdec[train]'") from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_training_log(log_path, png_path, *, title: str = "EAGLE-3 head training") -> Path:
    """Draw the curves of `log_path` (`draw_training_log`) into `png_path`."""
    plt = _matplotlib()
    records = read_log(log_path)
    if not any(r.get("kind") == "train" for r in records):
        raise ValueError(f"{log_path} has no train records to plot")
    fig = draw_training_log(records, title=title)
    png_path = Path(png_path)
    png_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png_path)
    plt.close(fig)
    return png_path


def draw_training_log(records: list[dict], *, title: str = "EAGLE-3 head training"):
    """A matplotlib Figure: loss (top left) and per-step top-1 accuracy (top right); with
    per-category validation records, a second row (`CATEGORY_TITLES`) of one line per category."""
    plt = _matplotlib()
    train = [r for r in records if r.get("kind") == "train"]
    val = [r for r in records if r.get("kind") == "val"]
    if not train:
        raise ValueError("no train records to plot")
    cats = _categories(val)
    rows = 2 if cats else 1
    fig, axes = plt.subplots(rows, 2, figsize=(12, 4.5 * rows), dpi=110, squeeze=False)
    _draw_loss(axes[0][0], train, val, plt)
    _draw_accuracy(axes[0][1], train, val, plt)
    if cats:
        _draw_categories(axes[1][0], axes[1][1], val, cats, plt)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def _categories(val: list[dict]) -> list[str]:
    """The categories of the validation records, in the order they first appear."""
    seen: dict[str, None] = {}
    for r in val:
        for c in r.get("categories", {}):
            seen.setdefault(c, None)
    return list(seen)


def _draw_loss(ax, train, val, plt) -> None:
    steps = [r["step"] for r in train]
    ax.plot(steps, [r["loss"] for r in train], label="train (weighted sum over steps)", color="black")
    n_steps = len(train[0]["step_loss"])
    cmap = plt.get_cmap("viridis")
    for k in range(n_steps):
        ax.plot(steps, [r["step_loss"][k] for r in train], color=cmap(k / max(1, n_steps - 1)), lw=0.8, alpha=0.7,
                label=f"step {k}" if k in (0, n_steps - 1) else None)
    if val:
        ax.plot([r["step"] for r in val], [r["loss"] for r in val], "o--", color="tab:red", label="validation")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("soft cross-entropy")
    ax.set_yscale("log")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)


def _draw_accuracy(ax, train, val, plt) -> None:
    steps = [r["step"] for r in train]
    n_steps = len(train[0]["step_loss"])
    cmap = plt.get_cmap("viridis")
    for k in range(n_steps):
        color = cmap(k / max(1, n_steps - 1))
        ax.plot(steps, [r["step_acc"][k] for r in train], color=color, lw=1.0, label=f"TTT step {k}")
        if val:
            ax.plot([r["step"] for r in val], [r["step_acc"][k] for r in val], "o", color=color, ms=3)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("top-1 == target argmax (response tokens)")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2, loc="lower right")
    tau = train[-1].get("est_tau")
    note = "dots: validation; " if val else ""
    ax.set_title(f"{note}est. chain accept length (5 drafts) {tau:.2f}" if tau else note, fontsize=9)


def _draw_categories(ax_acc, ax_tau, val, cats, plt) -> None:
    """One line per category: validation step-0 accuracy (left) and est. tau (right)."""
    cmap = plt.get_cmap("tab10")
    for i, c in enumerate(cats):
        rs = [r for r in val if c in r.get("categories", {})]
        steps = [r["step"] for r in rs]
        ax_acc.plot(steps, [r["categories"][c]["step_acc"][0] for r in rs], "o-", color=cmap(i % 10), ms=3, label=c)
        ax_tau.plot(steps, [r["categories"][c]["est_tau"] for r in rs], "o-", color=cmap(i % 10), ms=3, label=c)
    means = [r for r in val if "mean_est_tau" in r]
    if len(cats) > 1 and means:
        ax_tau.plot([r["step"] for r in means], [r["mean_est_tau"] for r in means], "k--", lw=1.2,
                    label="mean (early stopping)")
    for ax, name, ylabel in ((ax_acc, CATEGORY_TITLES[0], "top-1 == target argmax"),
                             (ax_tau, CATEGORY_TITLES[1], "1 + sum_k prod_{j<=k} acc_j (5 drafts)")):
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("optimizer step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    ax_acc.set_ylim(0, 1)
