"""A picture of a run without wandb: loss, dev BLEU and tokens/s over steps from RUN_DIR/metrics.jsonl."""
from __future__ import annotations

import io
import os

from data_prep.dataformat import userfiles
from trainer.artifacts.run_dir import METRICS, PLOT


def read_metrics(run_dir: str) -> list[dict]:
    path = os.path.join(run_dir, METRICS)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file (is {run_dir} a run directory written by launch/train.py?)")
    rows = []
    with io.TextIOWrapper(userfiles.open_regular(path, METRICS), encoding="utf-8") as f:  # never a FIFO
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = userfiles.parse_json(line, path, line=n)
            except ValueError:  # a torn, repeated-key or too deeply nested row
                raise ValueError(f"{path}:{n}: not a JSON object") from None
            if not isinstance(row, dict) or not isinstance(row.get("step"), int):
                raise ValueError(f"{path}:{n}: a metrics row needs an integer 'step'")
            rows.append(row)
    if not rows:
        raise ValueError(f"{path}: no rows yet")
    return rows


def plot_run(run_dir: str, out: str | None = None) -> str:
    """Write the PNG (default RUN_DIR/training.png) and return its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(run_dir)
    out = out or os.path.join(run_dir, PLOT)

    def series(key):
        pts = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
        return [p[0] for p in pts], [p[1] for p in pts]

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for key, label in (("loss", "train loss (label-smoothed)"), ("dev_loss", "dev loss")):
        x, y = series(key)
        if x:
            axes[0].plot(x, y, marker="o" if key == "dev_loss" else None, label=label)
    axes[0].set_ylabel("nats per target token")
    for key, label in (("dev_bleu", "dev BLEU"), ("dev_chrf", "dev chrF")):
        x, y = series(key)
        if x:
            axes[1].plot(x, y, marker="o", label=label)
    axes[1].set_ylabel("score")
    x, y = series("tokens_per_s")
    axes[2].plot(x, y, label="src+tgt tokens/s")
    axes[2].set_ylabel("tokens/s")
    for ax, title in zip(axes, ("loss", "dev scores", "throughput")):
        ax.set_xlabel("step")
        ax.set_title(title)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
        ax.grid(alpha=0.3)
    fig.suptitle(os.path.abspath(run_dir), fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
