#!/usr/bin/env python
"""Render the GPG paper's tables (multimodal and math) with our ``mmgpg eval`` results beside them (tables.md and tables.png).

    python eval/render.py RESULT[=LABEL] [RESULT[=LABEL] ...] --out DIR [--label-for RESULT=LABEL] [--all]

Each RESULT is an evaluation directory written by ``mmgpg eval`` (holding ``metrics.json``) or a ``metrics.json``
path. The paper's numbers live in ``eval/paper_tables.yaml``; see ``eval/README.md`` for how results map to cells.
Runs as a plain script (no import of ``mmgpg`` needed); exit status 2 on a bad RESULT or paper-table file.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PAPER_TABLES = HERE / "paper_tables.yaml"
MISSING = "—"
MARKERS = ("†", "‡", "§", "¶", "#")

# task name -> table key in paper_tables.yaml (identical today, kept explicit)
TASK_TABLE = {"cv_bench": "cv_bench", "geoqa": "geoqa", "fine_grained": "fine_grained",
              "lisa_grounding": "lisa_grounding"}
CV_BENCH_METRICS = {"total": "Total", "count": "Count", "relation": "Relation", "depth": "Depth",
                    "distance": "Distance"}
FINE_GRAINED_DATASETS = {"oxford_flowers": "Flower102", "pets": "Pets37", "fgvc_aircraft": "FGVC",
                         "stanford_cars": "Cars196"}
LISA_METRICS = {("miou", "test"): "mIoU_test", ("miou", "val"): "mIoU_val", ("giou", "test"): "gIoU_test"}


class RenderError(Exception):
    """A problem with an input file; the CLI prints ``error: <message>`` and exits 2."""


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


# ----------------------------------------------------------------------------------------------------------------
# Loading


def load_paper_tables(path: str | Path = PAPER_TABLES) -> dict[str, dict[str, Any]]:
    """The tables of ``paper_tables.yaml`` keyed by name (cv_bench, lisa_grounding, fine_grained, geoqa, math_1p5b,
    math_7b, math_7b_ablation). A table is filled by one ``task`` or, one column per task, by ``tasks`` with their
    ``metric``."""
    import yaml

    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError as e:
        raise RenderError(f"{path}: paper-table file not found") from e
    except yaml.YAMLError as e:
        raise RenderError(f"{path}: invalid YAML: {e}") from e
    if not isinstance(data, dict) or not isinstance(data.get("tables"), dict):
        raise RenderError(f"{path}: expected a mapping with a `tables` key")
    for key, table in data["tables"].items():
        for required in ("title", "model", "columns", "decimals", "rounding", "source", "rows"):
            if required not in table:
                raise RenderError(f"{path}: table {key!r} lacks {required!r}")
        if ("task" in table) == ("tasks" in table):
            raise RenderError(f"{path}: table {key!r} needs exactly one of `task` and `tasks`")
        if "tasks" in table:
            if "metric" not in table:
                raise RenderError(f"{path}: table {key!r} has `tasks` but no `metric`")
            bad = set(table["tasks"]) - set(table["columns"])
            if bad:
                raise RenderError(f"{path}: table {key!r}: `tasks` names unknown columns {sorted(bad)}")
        for row in table["rows"]:
            unknown = set(row["values"]) - set(table["columns"])
            if unknown:
                raise RenderError(f"{path}: table {key!r}, row {row['name']!r}: unknown columns {sorted(unknown)}")
    return data["tables"]


@dataclass
class Result:
    """One metrics.json written by ``mmgpg eval``."""

    path: Path
    task: str
    metrics: dict[str, Any]
    label: str
    protocol: str | None = None
    split: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    counts: dict[str, Any] = field(default_factory=dict)
    limit: Any = None


def metrics_path(path: str | Path) -> Path:
    """``path/metrics.json`` for an evaluation directory, else ``path`` itself."""
    path = Path(path)
    return path / "metrics.json" if path.is_dir() else path


def default_label(checkpoint: Any, path: Path) -> str:
    """The checkpoint's basename (``parent/final`` for a run's ``final`` dir); the result dir name without one."""
    if not checkpoint:
        return path.parent.name or str(path)
    parts = [p for p in str(checkpoint).replace("\\", "/").split("/") if p]
    if not parts:
        return str(checkpoint)
    if len(parts) > 1 and parts[-1] in ("final", "model", "hf"):
        return "/".join(parts[-2:])
    return parts[-1]


def find_limit(payload: dict[str, Any]) -> Any:
    """A ``limit`` at the top level, in ``counts`` or in ``config`` / ``config.task`` (None when absent)."""
    config = payload.get("config") if isinstance(payload.get("config"), dict) else {}
    task_cfg = config.get("task") if isinstance(config.get("task"), dict) else {}
    counts = payload.get("counts") if isinstance(payload.get("counts"), dict) else {}
    for place in (payload, counts, config, task_cfg):
        if place.get("limit") is not None:
            return place["limit"]
    return None


def read_payload(path: str | Path) -> tuple[Path, dict[str, Any]]:
    """``(file, JSON object)`` of one RESULT's metrics.json (an evaluation directory or the file itself); a missing,
    unreadable or non-object file is a :class:`RenderError` naming it."""
    given = Path(path)
    file = metrics_path(given)
    if given.is_dir() and not file.exists():
        raise RenderError(f"{given}: directory has no metrics.json (give an mmgpg eval output dir)")
    if not file.exists():
        raise RenderError(f"{file}: no such file or directory")
    try:
        payload = json.loads(file.read_text())
    except json.JSONDecodeError as e:
        raise RenderError(f"{file}: invalid JSON ({e})") from e
    except (OSError, UnicodeDecodeError) as e:
        raise RenderError(f"{file}: cannot read ({e})") from e
    if not isinstance(payload, dict):
        raise RenderError(f"{file}: expected a JSON object, got {type(payload).__name__}")
    return file, payload


def load_results(path: str | Path, label: str | None = None) -> list[Result]:
    """The results of one RESULT: its metrics.json, or, for the summary of several benchmarks evaluated in one
    command (``mmgpg eval --task a,b``: a metrics.json with ``benchmarks``), each benchmark's folder (all with the same
    label: they are one model)."""
    file, payload = read_payload(path)
    if not (isinstance(payload.get("benchmarks"), dict) and "task" not in payload):
        return [result_of(file, payload, label)]
    label = label or default_label(payload.get("checkpoint"), file)
    results = []
    for task, info in payload["benchmarks"].items():
        folder = info.get("dir", task) if isinstance(info, dict) else task
        results.append(load_result(file.parent / str(folder), label))
    return results


def load_result(path: str | Path, label: str | None = None) -> Result:
    """Read and check one metrics.json (or an evaluation directory holding one)."""
    return result_of(*read_payload(path), label)


def result_of(file: Path, payload: dict[str, Any], label: str | None = None) -> Result:
    """Check one metrics.json's payload and make its :class:`Result`."""
    for key in ("metrics", "task"):
        if key not in payload:
            raise RenderError(f"{file}: no {key!r} key (not a metrics.json written by mmgpg eval)")
    if not isinstance(payload["metrics"], dict):
        raise RenderError(f"{file}: 'metrics' must be an object of name -> number")
    if not isinstance(payload["task"], str):
        raise RenderError(f"{file}: 'task' must be a string")
    return Result(
        path=file,
        task=payload["task"],
        metrics=payload["metrics"],
        label=label or default_label(payload.get("checkpoint"), file),
        protocol=payload.get("protocol"),
        split=payload.get("split"),
        config=payload.get("config") if isinstance(payload.get("config"), dict) else {},
        counts=payload.get("counts") if isinstance(payload.get("counts"), dict) else {},
        limit=find_limit(payload),
    )


# ----------------------------------------------------------------------------------------------------------------
# Results -> cells


def fraction(result: Result, key: str) -> float | None:
    """``metrics[key]`` as a checked fraction in [0, 1]; None (with a warning) when absent."""
    if key not in result.metrics:
        warn(f"{result.path}: no metric {key!r} for task {result.task!r}; its cell stays {MISSING}")
        return None
    value = result.metrics[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RenderError(f"{result.path}: metric {key!r} = {value!r} is not a finite number")
    if not 0.0 <= value <= 1.0:
        raise RenderError(f"{result.path}: metric {key!r} = {value!r} is not a fraction in [0, 1]")
    return float(value)


def result_cells(result: Result) -> dict[str, float]:
    """Which cells of its table one result fills: ``{column: fraction}`` (empty, with a warning, if none)."""
    cells: dict[str, float] = {}
    if result.task == "cv_bench":
        for key, col in CV_BENCH_METRICS.items():
            if (v := fraction(result, key)) is not None:
                cells[col] = v
    elif result.task == "geoqa":
        if (v := fraction(result, "accuracy")) is not None:
            cells["GEOQA_test"] = v
    elif result.task == "fine_grained":
        task_cfg = result.config.get("task") if isinstance(result.config.get("task"), dict) else {}
        options = task_cfg.get("options") if isinstance(task_cfg.get("options"), dict) else {}
        dataset = task_cfg.get("dataset", options.get("dataset"))
        if dataset not in FINE_GRAINED_DATASETS:
            warn(f"{result.path}: fine_grained result with config.task.dataset = {dataset!r} (expected one of "
                 f"{', '.join(FINE_GRAINED_DATASETS)}); skipped")
            return {}
        if (v := fraction(result, "accuracy")) is not None:
            cells[FINE_GRAINED_DATASETS[dataset]] = v
    elif result.task == "lisa_grounding":
        if result.split not in ("test", "val"):
            warn(f"{result.path}: lisa_grounding on split {result.split!r}; the paper reports test and val only; "
                 "skipped")
            return {}
        for key in ("miou", "giou"):
            col = LISA_METRICS.get((key, result.split))
            if key == "giou" and key not in result.metrics:
                continue  # gIoU needs a SAM checkpoint; its absence is normal
            if col is None:
                warn(f"{result.path}: {key} on split {result.split!r} has no column in the paper's table; ignored")
                continue
            if (v := fraction(result, key)) is not None:
                cells[col] = v
    return cells


def table_tasks(table: dict[str, Any]) -> set[str]:
    """The mmgpg tasks whose results fill a paper table."""
    return set(table["tasks"].values()) if "tasks" in table else {TASK_TABLE.get(table["task"], table["task"])}


def column_cells(result: Result, table: dict[str, Any]) -> dict[str, float]:
    """The one cell a result fills in a per-task-column table (the math tables): its task's column, with the table's
    ``metric`` (sampled pass@1); a result without it but with greedy ``accuracy`` fills the cell with that (and is
    footnoted by :func:`result_footnote`)."""
    column = next(col for col, task in table["tasks"].items() if task == result.task)
    key = table["metric"] if table["metric"] in result.metrics or "accuracy" not in result.metrics else "accuracy"
    value = fraction(result, key)
    return {} if value is None else {column: value}


def result_footnote(result: Result, table: dict[str, Any], cells: dict[str, float]) -> str | None:
    """Why this result is not on the paper's full evaluation set, or None when it is (as far as we can tell)."""
    parts = []
    evaluated = result.counts.get("evaluated")
    denominator = table.get("denominator")
    if "tasks" in table and len(cells) == 1:
        denominator = (table.get("items") or {}).get(next(iter(cells)))
        if table["metric"] not in result.metrics:
            parts.append(f"greedy accuracy (the paper reports {table['metric']} over sampled completions)")
    if isinstance(evaluated, (int, float)) and denominator and evaluated < denominator:
        parts.append(f"evaluated on {int(evaluated)} of {denominator} items")
    elif result.limit is not None and isinstance(evaluated, (int, float)):
        parts.append(f"evaluated on {int(evaluated)} items")
    if result.limit is not None:
        parts.append(f"limit={result.limit}")
    if table.get("split") and result.split and result.split != table["split"]:
        parts.append(f"split {result.split} (the paper reports {table['split']})")
    if not parts:
        return None
    data_columns = [c for c in table["columns"] if c != "Average"]
    prefix = "" if sorted(cells) == sorted(data_columns) else ", ".join(c for c in table["columns"] if c in cells)
    return f"{prefix}: {'; '.join(parts)}" if prefix else "; ".join(parts)


def fill_tables(results: list[Result], paper: dict[str, dict[str, Any]] | None = None, *,
                include_all: bool = False, only: list[str] | None = None) -> list[dict[str, Any]]:
    """Paper rows plus one row per (label, protocol) of ours, for each table that has a result (all with
    ``include_all``). ``only``: the tables results may go to (needed when a task fills several, as the math
    benchmarks do). Each table: its spec keys plus ``rows`` = [{name, kind, values: {col: percent | None},
    footnotes: [text]}]; ours are unrounded percents (formatting is the renderers' job)."""
    paper = load_paper_tables() if paper is None else paper
    unknown = sorted(set(only or ()) - set(paper))
    if unknown:
        raise RenderError(f"--table {', '.join(unknown)}: no such table (tables: {', '.join(paper)})")
    allowed = [key for key in paper if not only or key in only]
    ours: dict[str, dict[tuple[str, str | None], dict[str, Any]]] = {key: {} for key in paper}
    for result in results:
        task = TASK_TABLE.get(result.task, result.task)
        keys = [key for key in allowed if task in table_tasks(paper[key])]
        if not keys:
            every = sorted({t for spec in paper.values() for t in table_tasks(spec)})
            warn(f"{result.path}: task {result.task!r} has no table in the GPG paper"
                 + (f" among --table {', '.join(only)}" if only else "") + f" (tasks with a table: "
                 f"{', '.join(every)}); skipped")
            continue
        if len(keys) > 1:
            raise RenderError(f"{result.path}: task {result.task!r} fills several of the paper's tables "
                              f"({', '.join(keys)}): choose one with --table")
        key = keys[0]
        cells = column_cells(result, paper[key]) if "tasks" in paper[key] else result_cells(result)
        if not cells:
            warn(f"{result.path}: fills no cell of the {paper[key]['title']} table; skipped")
            continue
        row = ours[key].setdefault((result.label, result.protocol),
                                   {"label": result.label, "protocol": result.protocol, "values": {},
                                    "sources": {}, "footnotes": []})
        for col, value in cells.items():
            if col in row["values"]:
                warn(f"{result.path}: cell {col!r} of row {result.label!r} was already filled by "
                     f"{row['sources'][col]}; the later file wins")
            row["values"][col] = 100.0 * value
            row["sources"][col] = result.path
        note = result_footnote(result, paper[key], cells)
        if note and note not in row["footnotes"]:
            row["footnotes"].append(note)
    tables = []
    for key, spec in paper.items():
        if not ours[key] and not (include_all and key in allowed):
            continue
        rows = [{"name": r["name"], "kind": "paper", "values": dict(r["values"]), "footnotes": []}
                for r in spec["rows"]]
        for row in ours[key].values():
            values = {col: row["values"].get(col) for col in spec["columns"] if col != "Average"}
            if "Average" in spec["columns"]:
                present = [v for v in values.values() if v is not None]
                values["Average"] = sum(present) / len(present) if len(present) == len(values) else None
            protocol = row["protocol"] or "protocol unknown"
            rows.append({"name": f"ours: {row['label']} ({protocol})", "kind": "ours", "values": values,
                         "footnotes": row["footnotes"]})
        tables.append({"key": key, **{k: v for k, v in spec.items() if k != "rows"}, "rows": rows})
    return tables


# ----------------------------------------------------------------------------------------------------------------
# Rendering


def format_percent(value: float | None, decimals: int, rounding: str = "round") -> str:
    """A percent as the paper prints it: ``decimals`` places, rounded or truncated; None -> ``—``."""
    if value is None:
        return MISSING
    if rounding == "truncate":
        scale = 10**decimals
        value = math.floor(round(value * scale, 6)) / scale  # the round() absorbs float noise (29.0 * 100 = 2899.99..)
    elif rounding != "round":
        raise ValueError(f"rounding must be 'round' or 'truncate'; got {rounding!r}")
    return f"{value:.{decimals}f}"


def footnote_markers(table: dict[str, Any]) -> dict[str, str]:
    """One marker per distinct footnote text of a table, in row order."""
    markers: dict[str, str] = {}
    for row in table["rows"]:
        for note in row["footnotes"]:
            if note not in markers:
                i = len(markers)
                markers[note] = MARKERS[i % len(MARKERS)] * (1 + i // len(MARKERS))
    return markers


def row_name(row: dict[str, Any], markers: dict[str, str]) -> str:
    return row["name"] + "".join(markers[n] for n in row["footnotes"])


def render_markdown(tables: list[dict[str, Any]]) -> str:
    """One markdown table per entry of ``fill_tables``: source caption, paper rows then ours, footnotes."""
    out = ["# GPG paper tables and our evaluations", "",
           "Percent. Paper rows are copied from `eval/paper_tables.yaml`; `ours:` rows come from `mmgpg eval` "
           "(label, then protocol: only `paper`-protocol rows are comparable with the paper).", ""]
    if not tables:
        out += ["No result maps to a paper table (pass `--all` to print the paper's tables anyway).", ""]
    for table in tables:
        markers = footnote_markers(table)
        cols = table["columns"]
        out += [f"## {table['title']} ({table['model']})", "", f"*Source: {' '.join(table['source'].split())}*", ""]
        out.append("| Model | " + " | ".join(cols) + " |")
        out.append("|:--|" + "--:|" * len(cols))
        for row in table["rows"]:
            cells = [format_percent(row["values"].get(c), table["decimals"], table["rounding"]) for c in cols]
            out.append("| " + row_name(row, markers).replace("|", "\\|") + " | " + " | ".join(cells) + " |")
        if markers:
            out.append("")
            out += [f"{marker}: {note}  " for note, marker in markers.items()]
            out[-1] = out[-1].rstrip()
        out.append("")
    return "\n".join(out)


def render_png(tables: list[dict[str, Any]], path: str | Path) -> Path:
    """One grouped bar chart per table (columns on x, one bar per row; paper rows grey-blue, ours warm)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    path = Path(path)
    panels = max(1, len(tables))
    fig, axes = plt.subplots(panels, 1, figsize=(11, 4.2 * panels), squeeze=False)
    if not tables:
        axes[0][0].text(0.5, 0.5, "no result maps to a paper table", ha="center", va="center")
        axes[0][0].set_axis_off()
    paper_colors = ["#c7d0dc", "#9aabc2", "#6b84a6", "#2f4f7f"]
    ours_colors = ["#e6550d", "#d62728", "#fdae6b", "#8c2d04", "#f781bf", "#a63603"]
    for ax, table in zip((a[0] for a in axes), tables):
        cols, rows = table["columns"], table["rows"]
        markers = footnote_markers(table)
        width = 0.84 / max(1, len(rows))
        n_paper = n_ours = 0
        handles = []
        for i, row in enumerate(rows):
            if row["kind"] == "paper":
                color = paper_colors[min(n_paper, len(paper_colors) - 1)]
                n_paper += 1
            else:
                color = ours_colors[n_ours % len(ours_colors)]
                n_ours += 1
            edge = "black" if row["kind"] == "ours" else "none"
            xs = [j - 0.42 + (i + 0.5) * width for j in range(len(cols))]
            values = [row["values"].get(c) for c in cols]
            bars = ax.bar([x for x, v in zip(xs, values) if v is not None], [v for v in values if v is not None],
                          width, color=color, edgecolor=edge, linewidth=0.6)
            handles.append(Patch(facecolor=color, edgecolor=edge, linewidth=0.6, label=row_name(row, markers)))
            labels = [format_percent(v, table["decimals"], table["rounding"]) for v in values if v is not None]
            ax.bar_label(bars, labels=labels, fontsize=6.5, rotation=90, padding=2)
            for x, v in zip(xs, values):
                if v is None:
                    ax.text(x, 1, MISSING, ha="center", va="bottom", fontsize=7, color="grey")
        ax.set_xticks(range(len(cols)), cols)
        pad = max(0.0, (3 - len(cols)) / 2)  # keep a one-column table's bars as narrow as the others'
        ax.set_xlim(-0.5 - pad, len(cols) - 0.5 + pad)
        ax.set_ylim(0, 112)
        ax.set_ylabel("%")
        ax.set_title(f"{table['title']} ({table['model']})", fontsize=11, loc="left")
        ax.grid(axis="y", alpha=0.3)
        ax.set_axisbelow(True)
        ax.legend(handles=handles, fontsize=7.5, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
        if markers:
            ax.text(1.01, 0.0, "\n".join(f"{m}: {n}" for n, m in markers.items()), transform=ax.transAxes,
                    fontsize=6.5, va="bottom", wrap=True)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130, bbox_inches="tight")
    plt.close(fig)
    return path


# ----------------------------------------------------------------------------------------------------------------
# Command line


def split_labelled(arg: str, known: list[Path] | None = None) -> tuple[str, str | None]:
    """``RESULT=LABEL`` -> (RESULT, LABEL). The longest prefix before an ``=`` that names an existing path (or, with
    ``known``, one of those metrics.json files) is the RESULT, so paths that contain ``=`` still work."""
    def matches(candidate: str) -> bool:
        if known is None:
            return Path(candidate).exists()
        return metrics_path(candidate).resolve() in known

    if matches(arg):
        return arg, None
    cuts = [i for i, ch in enumerate(arg) if ch == "="]
    for i in reversed(cuts):
        if matches(arg[:i]):
            return arg[:i], arg[i + 1:] or None
    if known is None and cuts:
        return arg[: cuts[0]], arg[cuts[0] + 1:] or None
    return arg, None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="eval/render.py",
        description="Render the GPG paper's tables (four multimodal: CV-Bench, LISA grounding, fine-grained 4-shot\n"
                    "classification, GEOQA; three math: the 1.5B and 7B tables and the Qwen2.5-Math-7B ablations)\n"
                    "with our mmgpg eval results as extra rows. Writes DIR/tables.md and\n"
                    "DIR/tables.png and prints the markdown. Paper numbers: eval/paper_tables.yaml; mapping and\n"
                    "conventions: eval/README.md.",
        epilog="examples:\n"
               "  python eval/render.py runs/eval_cvb runs/eval_geoqa --out report\n"
               "  python eval/render.py runs/fg_flowers=gpg-2b runs/fg_pets=gpg-2b --out report\n"
               "  python eval/render.py runs/eval_cvb --label-for runs/eval_cvb='GPG seed 0' --out report\n"
               "  python eval/render.py runs/aime24=rs1 runs/math500=rs1 --table math_1p5b --out report\n\n"
               "Rows are labelled 'ours: LABEL (PROTOCOL)'; LABEL defaults to the basename of metrics.json's\n"
               "checkpoint. Results on fewer items than the paper (counts.evaluated, a limit) or on another split\n"
               "get a footnote. Other tasks are skipped with a warning. Exit status 2 on a missing file, invalid\n"
               "JSON or a metrics.json without metrics/task.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("results", nargs="*", metavar="RESULT[=LABEL]",
                        help="an mmgpg eval output directory or a metrics.json path, optionally with =LABEL (the "
                             "row label; results sharing a label fill one row, e.g. several fine_grained datasets)")
    parser.add_argument("--out", required=True, metavar="DIR", help="where tables.md and tables.png are written")
    parser.add_argument("--label-for", action="append", default=[], metavar="RESULT=LABEL",
                        help="set the row label of one RESULT (repeatable; same effect as RESULT=LABEL)")
    parser.add_argument("--all", action="store_true", help="also render tables that no result fills")
    parser.add_argument("--table", action="append", default=None, metavar="KEY",
                        help="put results in this table only (repeatable; needed for the math benchmarks, which fill "
                             "math_1p5b, math_7b and math_7b_ablation alike); with --all, render only these")
    parser.add_argument("--paper", default=str(PAPER_TABLES), metavar="YAML",
                        help="the paper-table file (default: eval/paper_tables.yaml next to this script)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_intermixed_args(argv)
    if not args.results and not args.all:
        parser.error("give at least one RESULT (or --all to render the paper's tables alone)")
    try:
        paper = load_paper_tables(args.paper)
        given = [split_labelled(arg) for arg in args.results]
        resolved = [metrics_path(path).resolve() for path, _ in given]
        labels = {file: label for file, (_, label) in zip(resolved, given) if label}
        for arg in args.label_for:
            path, label = split_labelled(arg, known=resolved)
            if label is None:
                raise RenderError(f"--label-for {arg!r}: expected RESULT=LABEL with RESULT one of the RESULT arguments")
            labels[metrics_path(path).resolve()] = label
        results = [r for (path, _), file in zip(given, resolved) for r in load_results(path, labels.get(file))]
        tables = fill_tables(results, paper, include_all=args.all, only=args.table)
    except RenderError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    markdown = render_markdown(tables)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tables.md").write_text(markdown)
    render_png(tables, out / "tables.png")
    print(markdown, end="")
    print(f"wrote {out / 'tables.md'} and {out / 'tables.png'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
