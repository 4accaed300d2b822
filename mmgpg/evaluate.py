"""Greedy evaluation of a policy on a task split, scored by the task's own reward functions.

Training rewards and evaluation share one implementation: a task's ``rewards`` are the per-sample scores here (and
its optional ``metrics(completion, example)`` adds more). ``aggregate`` defaults to the mean of each score.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from mmgpg.policy import Policy
from mmgpg.task import Example


def score_sample(task: Any, completion: str, example: Example) -> dict[str, float]:
    """Every reward of the task plus its extra ``metrics`` for one completion."""
    scores = {name: float(fn(completion, example)) for name, fn in task.rewards.items()}
    extra = getattr(task, "metrics", None)
    if callable(extra):
        scores.update({k: float(v) for k, v in extra(completion, example).items()})
    return scores


def aggregate_scores(task: Any, per_sample: Sequence[dict[str, float]]) -> dict[str, float]:
    """The task's ``aggregate`` if it has one, else the mean of every score."""
    custom = getattr(task, "aggregate", None)
    if callable(custom):
        return dict(custom(list(per_sample)))
    if not per_sample:
        return {}
    return {k: sum(s[k] for s in per_sample) / len(per_sample) for k in per_sample[0]}


@torch.no_grad()
def sampled_scores(policy: Policy, task: Any, examples: Sequence[Example], *, samples: int, temperature: float = 1.0,
                   batch_size: int = 32, max_new_tokens: int = 64) -> dict[str, float]:
    """Mean of each score over ``samples`` completions per example at ``temperature`` (mean@k: the success rate of
    the sampling policy that RL optimises, estimated without the variance of a single sample)."""
    if samples < 1 or batch_size < 1:
        raise ValueError(f"samples and batch_size must be >= 1; got {samples}, {batch_size}")
    per_sample: list[dict[str, float]] = []
    per_batch = max(1, batch_size // samples)
    for start in range(0, len(examples), per_batch):
        chunk = examples[start : start + per_batch]
        out = policy.generate(policy.encode_prompts([task.prompt(ex) for ex in chunk]), samples,
                              max_new_tokens=max_new_tokens, temperature=temperature)
        per_sample += [score_sample(task, text, chunk[i // samples]) for i, text in enumerate(out.texts)]
    return aggregate_scores(task, per_sample)


@torch.no_grad()
def evaluate(policy: Policy, task: Any, examples: Sequence[Example], *, batch_size: int = 32,
             max_new_tokens: int = 64) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Greedy-decode every example (batched) and score it; return ``(aggregate metrics, per-sample records)``."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1; got {batch_size}")
    records: list[dict[str, Any]] = []
    for start in range(0, len(examples), batch_size):
        chunk = examples[start : start + batch_size]
        batch = policy.encode_prompts([task.prompt(ex) for ex in chunk])
        out = policy.generate(batch, 1, max_new_tokens=max_new_tokens, temperature=0.0)
        for ex, text, mask in zip(chunk, out.texts, out.completion_mask):
            records.append({"id": ex.id, "answer": ex.answer, "model_output": text, "tokens": int(mask.sum()),
                            "scores": score_sample(task, text, ex)})
    metrics = aggregate_scores(task, [r["scores"] for r in records])
    metrics["num_samples"] = float(len(records))
    return metrics, records


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
