"""Greedy evaluation of a policy on a task split, scored by the task's own reward functions.

Completions come from a rollout engine (:mod:`mmgpg.rollout`), the same seam training samples through.

Training rewards and evaluation share one implementation: a task's ``rewards`` are the per-sample scores here (and
its :meth:`~mmgpg.task.Task.metrics` adds more). A task with a :meth:`~mmgpg.task.Task.judge` is scored by it (the
anchors' evaluation rule under ``protocol="paper"``); :meth:`~mmgpg.task.Task.aggregate` turns the judged records
into the reported metrics (the mean of each reward for a task without a judge).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from mmgpg.jsonl import finite_json, write_jsonl_atomic, write_text_atomic
from mmgpg.rollout import RolloutEngine, Sampling
from mmgpg.task import Example, Task
from mmgpg.task.judges import Judgement


def score_sample(task: Task, completion: str, example: Example) -> dict[str, float]:
    """Every reward of the task plus its extra ``metrics`` for one completion."""
    scores = {name: float(fn(completion, example)) for name, fn in task.rewards.items()}
    scores.update({k: float(v) for k, v in task.metrics(completion, example).items()})
    return scores


@torch.no_grad()
def sampled_scores(engine: RolloutEngine, task: Task, examples: Sequence[Example], *, samples: int,
                   temperature: float = 1.0,
                   batch_size: int = 32, max_new_tokens: int = 64, protocol: str = "paper") -> dict[str, float]:
    """Mean of each score over ``samples`` completions per example at ``temperature`` (mean@k: the success rate of
    the sampling policy that RL optimises, estimated without the variance of a single sample)."""
    if samples < 1 or batch_size < 1:
        raise ValueError(f"samples and batch_size must be >= 1; got {samples}, {batch_size}")
    per_sample: list[dict[str, float]] = []
    per_batch = max(1, batch_size // samples)
    for start in range(0, len(examples), per_batch):
        chunk = examples[start : start + per_batch]
        out = engine.generate([task.prompt(ex) for ex in chunk], samples, Sampling(max_new_tokens, temperature))
        per_sample += [judge_output(task, text, chunk[i // samples], protocol) for i, text in enumerate(out.texts)]
    return judged_metrics(task, per_sample)


def judge_output(task: Task, completion: str, example: Example, protocol: str) -> dict[str, Any]:
    """One output's record: the task judge's decision under ``protocol`` (``correct``, ``extracted``, ...) and every
    training reward under ``rewards``. A task without a judge is judged by its rewards (``correct`` = ``accuracy``)."""
    rewards = score_sample(task, completion, example)
    decision = task.judge(completion, example, protocol)
    if decision is None:
        return {"correct": rewards.get("accuracy", rewards.get(next(iter(rewards), ""), 0.0)), "extracted": "",
                "rewards": rewards}
    return {**Judgement.check(decision, f"task {task.name!r} judge()").record(), "rewards": rewards}


def judged_metrics(task: Task, records: Sequence[dict[str, Any]]) -> dict[str, float]:
    """The task's :meth:`~mmgpg.task.Task.aggregate` of the judged records, plus, for a task with a judge, the mean
    of every training reward as ``reward/<name>``."""
    if not records:
        return {}
    metrics = dict(task.aggregate(list(records)))
    if task.overrides("judge"):
        rewards = [r["rewards"] for r in records]
        metrics.update({f"reward/{k}": sum(s[k] for s in rewards) / len(rewards) for k in rewards[0]})
    return metrics


@torch.no_grad()
def evaluate(engine: RolloutEngine, task: Task, examples: Sequence[Example], *, batch_size: int = 32,
             max_new_tokens: int = 64, protocol: str = "paper") -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Greedy-decode every example (batched) and judge it; return ``(metrics, per-sample records)``.

    Each record holds ``id``, ``model_output``, the judge's fields (``correct``, ``extracted``, ``parse_failure``,
    task extras), ``rewards`` (every training reward) and the fields the task needs to re-score it later
    (``record_fields``: ``question``, ``ground_truth``, ...).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1; got {batch_size}")
    records: list[dict[str, Any]] = []
    for start in range(0, len(examples), batch_size):
        chunk = examples[start : start + batch_size]
        out = engine.generate([task.prompt(ex) for ex in chunk], 1, Sampling.greedy(max_new_tokens))
        for ex, text, mask in zip(chunk, out.texts, out.completion_mask):
            records.append({"id": ex.id, **task.record_fields(ex), "model_output": text, "tokens": int(mask.sum()),
                            **judge_output(task, text, ex, protocol)})
    metrics = judged_metrics(task, records)
    metrics.update(task.mask_metrics(records, list(examples), protocol))
    metrics["num_samples"] = float(len(records))
    return metrics, records


def rescore(task: Task, rows: Sequence[dict[str, Any]], protocol: str, *,
            lines: Sequence[int] | None = None) -> tuple[dict[str, float], list[dict], int]:
    """Judge existing outputs without a model: each row needs ``id``, ``model_output`` and the fields of the task's
    ``example_from_record`` (``ground_truth``, and e.g. ``choices``/``category`` for CV-Bench). A row that cannot be
    judged (wrong types, a judge that fails on it, ...) is skipped and counted, never dropped silently: its record
    holds the line, the id and the reason (``skipped``). ``lines`` are the rows' line numbers in the file."""
    if not task.overrides("example_from_record"):
        raise ValueError(f"task {task.name!r} cannot re-score predictions: it has no example_from_record(record)")
    records, skipped = [], 0
    for number, row in zip(lines or range(1, len(rows) + 1), rows):
        try:
            problem = prediction_row_problem(row, task)
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
    metrics = judged_metrics(task, judged_records)
    metrics["num_samples"] = float(len(judged_records))
    return metrics, records, skipped


_SCALAR = (str, int, float)


def prediction_row_problem(row: Any, task: Task) -> str:
    """Why a predictions row cannot be judged, or ``""``: the generic type checks every task relies on."""
    import math

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
    syntax, NaN/Infinity, not UTF-8) become skip records; an empty file and duplicate ids are errors."""
    from mmgpg.jsonl import read_jsonl

    read = read_jsonl(path, on_error="skip", strict=True)
    skips = [{"line": n, "id": None, "skipped": reason} for n, reason in read.skipped]
    if not read.rows and not skips:
        raise ValueError(f"{path} holds no predictions (the file is empty); give a JSONL file with one object per line")
    seen: dict[Any, list[int]] = {}
    for number, row in zip(read.lines, read.rows):
        if isinstance(row, dict) and isinstance(row.get("id"), (str, int)):
            seen.setdefault(str(row["id"]), []).append(number)
    dupes = {k: v for k, v in seen.items() if len(v) > 1}
    if dupes:
        shown = "; ".join(f"{k!r} at lines {', '.join(map(str, v))}" for k, v in list(dupes.items())[:3])
        raise ValueError(f"{path}: {len(dupes)} id(s) appear more than once ({shown}); each item must be judged "
                         "once: remove the duplicate rows")
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
