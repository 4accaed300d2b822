"""Markdown table of several `mmgpg demo` runs (one per seed): before/after accuracy, greedy and sampled, mean ± std.

    python bench/demo_table.py RUN_DIR [RUN_DIR ...]        # each holds the summary.json that `mmgpg demo` writes
    python bench/demo_table.py docs/demo_runs/text-seed*-summary.json   # or the summary files themselves
    python bench/demo_table.py --metric useful_zoom docs/demo_runs/tools-seed*-summary.json   # the tools demo's zooms

The std is the sample standard deviation over runs (n − 1), the seed-to-seed spread.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def load(run: str) -> dict:
    path = Path(run)
    path = path if path.suffix == ".json" else path / "summary.json"
    if not path.is_file():
        raise SystemExit(f"error: {path} does not exist (run `mmgpg demo --output {run}` first)")
    return json.loads(path.read_text())


def mean_std(values: list[float]) -> str:
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.3f} ± {std:.3f}"


def table(summaries: list[dict], metric: str = "accuracy") -> str:
    """The runs' ``metric`` (``accuracy``; the tools demo also reports ``useful_zoom``) before and after RL."""
    cols = [("greedy before", f"{metric}_before"), ("greedy after", f"{metric}_after"),
            ("sampled before", f"sampled_{metric}_before"), ("sampled after", f"sampled_{metric}_after")]
    head = "| seed | " + " | ".join(c for c, _ in cols[:2]) + " | Δ greedy | " + " | ".join(c for c, _ in cols[2:]) + " | Δ sampled |"
    lines = [head, "|" + "---:|" * 7]
    columns: dict[str, list[float]] = {}
    for s in summaries:
        row = [s[k] for _, k in cols]
        cells = row[:2] + [row[1] - row[0]] + row[2:] + [row[3] - row[2]]
        for name, value in zip(("gb", "ga", "dg", "sb", "sa", "ds"), cells):
            columns.setdefault(name, []).append(value)
        lines.append(f"| {s['settings']['seed']} | " + " | ".join(f"{v:+.3f}" if i in (2, 5) else f"{v:.3f}"
                                                             for i, v in enumerate(cells)) + " |")
    lines.append("| mean ± std | " + " | ".join(
        f"**{mean_std(columns[k])}**" if k in ("dg", "ds") else mean_std(columns[k])
        for k in ("gb", "ga", "dg", "sb", "sa", "ds")) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+")
    parser.add_argument("--metric", default="accuracy", help="accuracy (default), or useful_zoom (mmgpg demo --tools)")
    args = parser.parse_args()
    print(table([load(r) for r in args.runs], args.metric))


if __name__ == "__main__":
    main()
