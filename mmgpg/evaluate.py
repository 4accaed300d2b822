"""Greedy evaluation of a policy on a task split, scored by the task's own reward functions.

Completions come from a rollout engine (:mod:`mmgpg.rollout`), the same seam training samples through.

Training rewards and evaluation share one implementation: a task's ``rewards`` are the per-sample scores here (and
its optional ``metrics(completion, example)`` adds more). A task with a ``judge(completion, example, protocol)``
is scored by it (the anchors' evaluation rule under ``protocol="paper"``), and its ``aggregate`` turns the judged
records into the reported metrics; a task without one is scored by the mean of each reward.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from mmgpg.rollout import RolloutEngine, Sampling
from mmgpg.task import Example


def score_sample(task: Any, completion: str, example: Example) -> dict[str, float]:
    """Every reward of the task plus its extra ``metrics`` for one completion."""
    scores = {name: float(fn(completion, example)) for name, fn in task.rewards.items()}
    extra = getattr(task, "metrics", None)
    if callable(extra):
        scores.update({k: float(v) for k, v in extra(completion, example).items()})
    return scores


def aggregate_scores(task: Any, per_sample: Sequence[dict[str, float]]) -> dict[str, float]:
    """For a task without a judge: its ``aggregate`` of the reward dicts if it has one, else the mean of every score."""
    custom = getattr(task, "aggregate", None)
    if callable(custom) and not callable(getattr(task, "judge", None)):
        return dict(custom(list(per_sample)))
    if not per_sample:
        return {}
    return {k: sum(s[k] for s in per_sample) / len(per_sample) for k in per_sample[0]}


@torch.no_grad()
def sampled_scores(engine: RolloutEngine, task: Any, examples: Sequence[Example], *, samples: int,
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


def judge_output(task: Any, completion: str, example: Example, protocol: str) -> dict[str, Any]:
    """One output's record: the task judge's decision under ``protocol`` (``correct``, ``extracted``, ...) and every
    training reward under ``rewards``. A task without a judge is judged by its rewards (``correct`` = ``accuracy``)."""
    rewards = score_sample(task, completion, example)
    judge = getattr(task, "judge", None)
    if callable(judge):
        decision = dict(judge(completion, example, protocol))
    else:
        decision = {"correct": rewards.get("accuracy", rewards.get(next(iter(rewards), ""), 0.0)), "extracted": ""}
    return {**decision, "rewards": rewards}


def judged_metrics(task: Any, records: Sequence[dict[str, Any]]) -> dict[str, float]:
    """The task's metrics over judged records: its ``aggregate`` of the judge decisions when it has a judge, else the
    mean of each reward; plus the mean of every training reward as ``reward/<name>`` for judged tasks."""
    if not records:
        return {}
    rewards = [r["rewards"] for r in records]
    if not callable(getattr(task, "judge", None)):
        return aggregate_scores(task, rewards)
    metrics = dict(task.aggregate(list(records)))
    metrics.update({f"reward/{k}": sum(s[k] for s in rewards) / len(rewards) for k in rewards[0]})
    return metrics


@torch.no_grad()
def evaluate(engine: RolloutEngine, task: Any, examples: Sequence[Example], *, batch_size: int = 32,
             max_new_tokens: int = 64, protocol: str = "paper") -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Greedy-decode every example (batched) and judge it; return ``(metrics, per-sample records)``.

    Each record holds ``id``, ``model_output``, the judge's fields (``correct``, ``extracted``, ``parse_failure``,
    task extras), ``rewards`` (every training reward) and the fields the task needs to re-score it later
    (``record_fields``: ``question``, ``ground_truth``, ...).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1; got {batch_size}")
    records: list[dict[str, Any]] = []
    fields = getattr(task, "record_fields", None)
    for start in range(0, len(examples), batch_size):
        chunk = examples[start : start + batch_size]
        out = engine.generate([task.prompt(ex) for ex in chunk], 1, Sampling.greedy(max_new_tokens))
        for ex, text, mask in zip(chunk, out.texts, out.completion_mask):
            extra = fields(ex) if callable(fields) else {"question": ex.question, "ground_truth": ex.answer}
            records.append({"id": ex.id, **extra, "model_output": text, "tokens": int(mask.sum()),
                            **judge_output(task, text, ex, protocol)})
    metrics = judged_metrics(task, records)
    mask_metrics = getattr(task, "mask_metrics", None)
    if callable(mask_metrics):
        metrics.update(mask_metrics(records, list(examples), protocol))
    metrics["num_samples"] = float(len(records))
    return metrics, records


def rescore(task: Any, rows: Sequence[dict[str, Any]], protocol: str) -> tuple[dict[str, float], list[dict], int]:
    """Judge existing outputs without a model: each row needs ``id``, ``model_output`` and the fields of the task's
    ``example_from_record`` (``ground_truth``, and e.g. ``choices``/``category`` for CV-Bench). Rows that cannot be
    read are skipped and counted (``skipped``), never silently dropped: each skip is listed in its record."""
    build = getattr(task, "example_from_record", None)
    if not callable(build):
        raise ValueError(f"task {task.name!r} cannot re-score predictions: it has no example_from_record(record)")
    records, skipped = [], 0
    for number, row in enumerate(rows, 1):
        try:
            if not isinstance(row, dict) or "model_output" not in row:
                raise ValueError("needs a model_output field")
            example = build(row)
            output = row["model_output"] if isinstance(row["model_output"], str) else str(row["model_output"])
        except (ValueError, KeyError, TypeError) as err:
            skipped += 1
            records.append({"line": number, "id": row.get("id") if isinstance(row, dict) else None, "skipped": str(err)})
            continue
        records.append({**row, **judge_output(task, output, example, protocol)})
    judged = [r for r in records if "skipped" not in r]
    metrics = judged_metrics(task, judged)
    metrics["num_samples"] = float(len(judged))
    return metrics, records, skipped


def write_evaluation(output: str | Path, metrics: dict[str, float], records: list[dict[str, Any]],
                     meta: dict[str, Any]) -> None:
    """``predictions.jsonl`` (one object per sample) and ``metrics.json`` (metrics + how they were made)."""
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    with open(output / "predictions.jsonl", "w") as f:
        for r in records:
            f.write(json.dumps(r, default=str) + "\n")
    payload = {"metrics": metrics, **meta, "written": time.strftime("%Y-%m-%d %H:%M:%S")}
    (output / "metrics.json").write_text(json.dumps(payload, indent=2, default=str) + "\n")
