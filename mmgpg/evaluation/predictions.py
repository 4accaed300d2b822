"""Judging existing outputs without a model (``mmgpg eval --predictions``) and writing an evaluation.

:func:`rescore_predictions` reads a predictions file (:func:`read_predictions`: strict JSON, no duplicate ids),
re-judges every row that can be judged (:func:`rescore`, checked by :func:`prediction_row_problem`) and returns the
same :class:`~mmgpg.evaluation.run.EvalReport` a model's evaluation gives; :func:`write_report` writes either as
``predictions.jsonl`` and ``metrics.json`` (:func:`write_evaluation`). A file of sampled evaluation (rows with a
``sample`` index, several per id) is re-judged into the same pass@k metrics
(:func:`~mmgpg.evaluation.run.sampled_metrics`).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mmgpg.evaluation.run import EvalReport, judge_output, judged_metrics, parse_failures, sampled_metrics
from mmgpg.jsonl import finite_json, read_jsonl, write_jsonl_atomic, write_text_atomic
from mmgpg.task import Task


def rescore_predictions(task: Task, path: str | Path, protocol: str, *, split: str,
                        limit: int | None) -> EvalReport:
    """Re-judge the predictions file ``path`` under ``protocol``: every row in line order, the rows that could not
    be read or judged as skip records (counted in ``skipped``). ``split`` and ``limit`` are recorded as given (what
    the outputs were made on)."""
    rows, lines, unreadable = read_predictions(path)
    metrics, records, skipped = rescore(task, rows, protocol, lines=lines)
    ordered = sorted([*zip(lines, records), *((u["line"], u) for u in unreadable)], key=lambda pair: pair[0])
    records = [r for _, r in ordered]
    skipped += len(unreadable)
    total = len(rows) + len(unreadable)
    counts = {"rows": total, "evaluated": total - skipped, "skipped": skipped, "parse_failures": parse_failures(records)}
    source = {"predictions": str(Path(path).resolve())}
    if is_sampled(rows):
        source.update(decoding="sampled", samples=int(metrics.get("samples_per_problem", 0)))
    return EvalReport(task.name, task.version, protocol, split, limit, metrics, records, counts, source)


def is_sampled(rows: Sequence[Any]) -> bool:
    """Whether a predictions file comes from sampled evaluation: its rows carry a ``sample`` index."""
    return any(isinstance(r, dict) and "sample" in r for r in rows)


def rescore(task: Task, rows: Sequence[dict[str, Any]], protocol: str, *,
            lines: Sequence[int] | None = None) -> tuple[dict[str, float], list[dict], int]:
    """Judge existing outputs without a model: each row needs ``id``, ``model_output`` and the fields of the task's
    ``example_from_record`` (``ground_truth``, and e.g. ``choices``/``category`` for CV-Bench). A row that cannot be
    judged (wrong types, a judge that fails on it, ...) is skipped and counted, never dropped silently: its record
    holds the line, the id and the reason (``skipped``). ``lines`` are the rows' line numbers in the file.

    Rows with a ``sample`` index (sampled evaluation: several per id) are scored as
    :func:`~mmgpg.evaluation.run.sampled_metrics` (pass@k over the ids); every row then needs one."""
    if not task.overrides("example_from_record"):
        raise ValueError(f"task {task.name!r} cannot re-score predictions: it has no example_from_record(record)")
    sampled = is_sampled(rows)
    records, skipped = [], 0
    for number, row in zip(lines or range(1, len(rows) + 1), rows):
        if isinstance(row, dict) and isinstance(row.get("skipped"), str) and "model_output" not in row:
            # a row a previous evaluation skipped (a bad data row, an unjudgeable output): it stays skipped with
            # its original reason, not "model_output is missing"
            skipped += 1
            records.append({"line": number, "id": row.get("id"), "skipped": f"skipped when written: {row['skipped']}"})
            continue
        try:
            problem = prediction_row_problem(row, task) or (sample_index_problem(row) if sampled else "")
            if problem:
                raise ValueError(problem)
            example = task.example_from_record(row)
            judged = judge_output(task, row["model_output"], example, protocol)
        except Exception as err:  # noqa: BLE001 - a task's parser or judge failing on one row skips that row only
            skipped += 1
            reason = str(err) if isinstance(err, ValueError) else f"the judge failed: {type(err).__name__}: {err}"
            records.append({"line": number, "id": row.get("id") if isinstance(row, dict) else None, "skipped": reason})
            continue
        records.append({**row, **judged})
    judged_records = [r for r in records if "skipped" not in r]
    if sampled:
        return sampled_metrics(task, judged_records) if judged_records else {}, records, skipped
    metrics = judged_metrics(task, judged_records)
    metrics["num_samples"] = float(len(judged_records))
    return metrics, records, skipped


def sample_index_problem(row: dict[str, Any]) -> str:
    """Why a row of a sampled predictions file has no usable ``sample`` index, or ``""``."""
    sample = row.get("sample")
    if "sample" not in row:
        return ("sample is missing: the other rows of this file carry a sample index (sampled evaluation), so each "
                "row needs one")
    if not isinstance(sample, int) or isinstance(sample, bool) or sample < 0:
        return f"sample must be an integer >= 0 (the sample's index within its problem); got {sample!r}"
    return ""


_SCALAR = (str, int, float)


def prediction_row_problem(row: Any, task: Task) -> str:
    """Why a predictions row cannot be judged, or ``""``: the generic type checks every task relies on."""
    if not isinstance(row, dict):
        return f"a row must be a JSON object; got {type(row).__name__}"
    output = row.get("model_output", None)
    if "model_output" not in row or output is None:
        return "model_output is missing or null"
    if not isinstance(output, str):
        return f"model_output must be a string; got {type(output).__name__}"
    if not isinstance(row.get("id"), (str, int)) or isinstance(row.get("id"), bool):
        return "id must be a string or an integer"
    gold = row.get("ground_truth")
    golds = gold if isinstance(gold, list) else [gold]
    if gold is not None and not all(isinstance(g, _SCALAR) and not isinstance(g, bool) for g in golds):
        return "ground_truth must be a string, a number or a list of numbers; got a nested object"
    if any(isinstance(g, float) and not math.isfinite(g) for g in golds):
        return "ground_truth is not a finite number"
    if "question" in row and not isinstance(row["question"], str):
        return f"question must be a string; got {type(row['question']).__name__}"
    if "choices" in row and not (isinstance(row["choices"], list) and all(isinstance(c, str) for c in row["choices"])):
        return f"choices must be a list of strings; got {type(row['choices']).__name__}"
    known = tuple(task.categories)
    if "category" in row and (not isinstance(row["category"], str) or (known and row["category"] not in known)):
        return f"unknown category {row['category']!r}; {task.name} has " + ", ".join(known or ("text categories",))
    for key in ("width", "height"):
        if key in row and not (isinstance(row[key], int) and not isinstance(row[key], bool) and row[key] > 0):
            return f"{key} must be a positive integer (pixels); got {row[key]!r}"
    return ""


def read_predictions(path: str | Path) -> tuple[list[Any], list[int], list[dict[str, Any]]]:
    """``(rows, their line numbers, skip records)`` of a predictions file. Lines that are not strict JSON (bad
    syntax, NaN/Infinity, not UTF-8) become skip records; an empty file and duplicate ids are errors (in a sampled
    file, rows with a ``sample`` index: duplicate ``(id, sample)`` pairs)."""
    read = read_jsonl(path, on_error="skip", strict=True)
    skips = [{"line": n, "id": None, "skipped": reason} for n, reason in read.skipped]
    if not read.rows and not skips:
        raise ValueError(f"{path} holds no predictions (the file is empty); give a JSONL file with one object per line")
    seen: dict[Any, list[int]] = {}
    for number, row in zip(read.lines, read.rows):
        if isinstance(row, dict) and isinstance(row.get("id"), (str, int)):
            key = str(row["id"]) if "sample" not in row else f"{row['id']}, sample {row['sample']!r}"
            seen.setdefault(key, []).append(number)
    dupes = {k: v for k, v in seen.items() if len(v) > 1}
    if dupes:
        what = "(id, sample) pair(s)" if is_sampled(read.rows) else "id(s)"
        shown = "; ".join(f"{k!r} at lines {', '.join(map(str, v))}" for k, v in list(dupes.items())[:3])
        raise ValueError(f"{path}: {len(dupes)} {what} appear more than once ({shown}); each item (each sample of "
                         "an item) must be judged once: remove the duplicate rows")
    return read.rows, read.lines, skips


def write_evaluation(output: str | Path, metrics: dict[str, float], records: list[dict[str, Any]],
                     meta: dict[str, Any]) -> None:
    """``predictions.jsonl`` (one object per sample) and ``metrics.json`` (metrics + how they were made)."""
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    # strict JSON: a non-finite number is written as null; each file replaced atomically (a kill keeps the old one)
    write_jsonl_atomic(output / "predictions.jsonl",
                       (json.dumps(finite_json(r), default=str, allow_nan=False) for r in records))
    payload = {"metrics": metrics, **meta, "written": time.strftime("%Y-%m-%d %H:%M:%S")}
    write_text_atomic(output / "metrics.json", json.dumps(finite_json(payload), indent=2, default=str, allow_nan=False)
                      + "\n")


def write_report(output: str | Path, report: EvalReport, config: dict[str, Any]) -> None:
    """``report`` as ``predictions.jsonl`` and ``metrics.json``; ``config``: the task's resolved options and the model
    settings, recorded beside the metrics."""
    write_evaluation(output, report.metrics, report.records,
                     {"task": report.task, "task_version": report.task_version, "protocol": report.protocol,
                      "split": report.split, "limit": report.limit, "counts": report.counts, "config": config,
                      **report.source})


def write_summary(output: str | Path, summary: dict[str, float], reports: Sequence[EvalReport]) -> None:
    """``metrics.json`` of several benchmarks evaluated in one command (each in its own folder, ``<task>/``): the
    :func:`~mmgpg.evaluation.run.benchmark_summary`, each benchmark's folder, version and counts, and how the outputs
    were made (the first report's ``source``: one model and decoding for all)."""
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    first = reports[0]
    payload = {"metrics": summary,
               "benchmarks": {r.task: {"dir": r.task, "task_version": r.task_version, "counts": r.counts}
                              for r in reports},
               "protocol": first.protocol, "split": first.split, "limit": first.limit, **first.source,
               "written": time.strftime("%Y-%m-%d %H:%M:%S")}
    write_text_atomic(output / "metrics.json", json.dumps(finite_json(payload), indent=2, default=str, allow_nan=False)
                      + "\n")
