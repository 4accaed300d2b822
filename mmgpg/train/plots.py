"""PNG plots of a run's metrics.jsonl: reward, valid fraction, alpha and evaluation scores against the step."""

from __future__ import annotations

from pathlib import Path

from mmgpg.jsonl import atomic_writer
from mmgpg.rundir import read_metrics

PANELS = (
    ("reward/total", "reward (sampled, all attempts)"),
    ("gpg/valid_fraction", "valid fraction (B-M)/B"),
    ("gpg/alpha", "alpha = B/(B-M)"),
    ("eval/", "evaluation (greedy; sampled_*: mean of the samples)"),
)
COUNTS = ("eval/num_samples", "parse_failures")
"""Evaluation keys that are counts, not rates (left out of the evaluation panel, whose scale is 0–1)."""


def panel_series(rows: list[dict]) -> list[tuple[str, dict[str, tuple[list[int], list[float]]]]]:
    """``[(title, {metric: (steps, values)})]`` for each panel of :data:`PANELS` that has data in ``rows``."""
    series = []
    for key, title in PANELS:
        lines: dict[str, tuple[list[int], list[float]]] = {}
        for r in rows:
            for k, v in r.items():
                if (k == key or (key.endswith("/") and k.startswith(key) and not k.endswith(COUNTS))) \
                        and isinstance(v, (int, float)):
                    xs, ys = lines.setdefault(k, ([], []))
                    xs.append(r["step"])
                    ys.append(v)
        if lines:
            series.append((title, lines))
    return series


def plot_run(run_dir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Write one PNG per panel that has data (plus ``training.png`` with all of them); return the paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(run_dir)
    out = Path(out_dir) if out_dir else Path(run_dir) / "plots"
    out.mkdir(parents=True, exist_ok=True)
    series = panel_series(rows)
    written = []
    for title, lines in series:
        fig, ax = plt.subplots(figsize=(5, 3.2))
        _draw(ax, title, lines)
        path = out / (title.split(" ")[0].replace("/", "_") + ".png")
        fig.tight_layout()
        with atomic_writer(path, "wb") as f:
            fig.savefig(f, format="png", dpi=120)
        plt.close(fig)
        written.append(path)
    if series:
        fig, axes = plt.subplots(1, len(series), figsize=(4.2 * len(series), 3.2), squeeze=False)
        for ax, (title, lines) in zip(axes[0], series):
            _draw(ax, title, lines)
        fig.tight_layout()
        path = out / "training.png"
        with atomic_writer(path, "wb") as f:
            fig.savefig(f, format="png", dpi=120)
        plt.close(fig)
        written.append(path)
    return written


def _draw(ax, title: str, lines: dict[str, tuple[list[int], list[float]]]) -> None:
    for name, (xs, ys) in lines.items():
        ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, markersize=3, label=name)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    if len(lines) > 1:
        ax.legend(fontsize=7)
