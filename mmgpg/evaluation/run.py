"""Evaluation of a policy on a task split, greedy or sampled (``K`` completions per problem, pass@k), scored by the
task's own reward functions.

Completions come from a rollout engine (:mod:`mmgpg.rollout`), the same seam training samples through.

Training rewards and evaluation share one implementation: a task's ``rewards`` are the per-sample scores here (and
its :meth:`~mmgpg.task.Task.metrics` adds more). A task with a :meth:`~mmgpg.task.Task.judge` is scored by it (the
anchors' evaluation rule under ``protocol="paper"``); :meth:`~mmgpg.task.Task.aggregate` turns the judged records
into the reported metrics (the mean of each reward for a task without a judge).

:func:`run_evaluation` is the one evaluation of a policy on a task split that ``mmgpg eval``, the trainer and SFT
call: the split's first items under ``data.on_bad_row``, judged, as an :class:`EvalReport`; greedy (:func:`evaluate`)
or, with a :class:`SampledDecoding`, ``K`` samples per problem reported as pass@k (:func:`evaluate_sampled`,
:mod:`mmgpg.evaluation.passk`). Re-judging existing
outputs without a model, and writing a report, are :mod:`mmgpg.evaluation.predictions`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from mmgpg import distributed
from mmgpg.evaluation.budget import check_records, sample_units
from mmgpg.evaluation.passk import pass_at_k_metrics
from mmgpg.rollout import RolloutEngine, Sampling
from mmgpg.rollout.engine import request_seed
from mmgpg.rollout.episode import episode_fields, rollout
from mmgpg.task import Example, Task, good_items
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
    per_sample: list[dict[str, float]] = []
    units = sample_units(len(examples), samples, batch_size)  # calls of at most batch_size sequences
    check_records(len(examples), samples, max_new_tokens)
    for start, n, _, k in units:
        chunk = examples[start : start + n]
        out = rollout(engine, task, chunk, k, Sampling(max_new_tokens, temperature))
        per_sample += [judge_output(task, text, chunk[i // k], protocol) for i, text in enumerate(out.texts)]
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

    Under torchrun every rank calls it (a collective): rank ``r`` of ``W`` decodes and judges batches ``r, r + W,
    ...`` — the same batches as one process, so the same padding and the same greedy outputs — and the records are
    gathered back into the one-process order; every rank returns the same metrics and records.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1; got {batch_size}")
    info = distributed.current()
    starts = list(range(0, len(examples), batch_size))
    mine: list[tuple[int, list[dict[str, Any]]]] = []
    for b in range(info.rank, len(starts), info.world_size):
        chunk = examples[starts[b] : starts[b] + batch_size]
        out = rollout(engine, task, chunk, 1, Sampling.greedy(max_new_tokens))
        mine.append((b, [{"id": ex.id, **task.record_fields(ex), "model_output": text, "tokens": int(mask.sum()),
                          **judge_output(task, text, ex, protocol), **episode_fields(out, i)}
                         for i, (ex, text, mask) in enumerate(zip(chunk, out.texts, out.completion_mask))]))
    batches = dict(pair for part in (distributed.gather_objects(mine) if info.enabled else [mine]) for pair in part)
    records: list[dict[str, Any]] = [rec for b in sorted(batches) for rec in batches[b]]
    metrics = judged_metrics(task, records)
    metrics.update(task.mask_metrics(records, list(examples), protocol))
    metrics["num_samples"] = float(len(records))
    return metrics, records


EVAL_SEED_STREAM = -22
"""The seed stream of sampled evaluation: problem ``i`` of a split is seeded with ``request_seed(seed,
EVAL_SEED_STREAM, i)`` (its ``j``-th sample: that seed ``+ j`` in vLLM); negative, so never a training step
(training seeds with its step, which is >= 0)."""


@dataclass(frozen=True)
class SampledDecoding:
    """How sampled evaluation decodes: ``samples`` completions per problem at ``temperature`` with nucleus ``top_p``
    (and ``top_k``; 0 = off), seeded by ``seed``. ``samples=1, temperature=0`` is greedy decoding; ``temperature=0``
    with more samples is refused (the samples would be identical copies)."""

    samples: int
    temperature: float
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0

    def __post_init__(self):
        problems = []
        if not (isinstance(self.samples, int) and self.samples >= 1):
            problems.append(f"samples must be an integer >= 1 (completions per problem); got {self.samples!r}")
        if not self.temperature >= 0:
            problems.append(f"temperature must be >= 0 (0 = greedy); got {self.temperature!r}")
        elif self.temperature == 0 and isinstance(self.samples, int) and self.samples > 1:
            problems.append(f"temperature 0 is greedy decoding: the {self.samples} samples of a problem would be "
                            "identical; give samples=1 for greedy, or a temperature > 0 (the GPG paper: 0.6)")
        if not 0 < self.top_p <= 1:
            problems.append(f"top_p must be in (0, 1] (a probability mass; 1 = off); got {self.top_p!r}")
        if not (isinstance(self.top_k, int) and self.top_k >= 0):
            problems.append(f"top_k must be an integer >= 0 (0 = off); got {self.top_k!r}")
        if problems:
            raise ValueError("sampled evaluation: " + "; ".join(problems))

    def source(self) -> dict[str, Any]:
        """What the report's ``source`` records about the decoding."""
        return {"decoding": "sampled", "samples": self.samples, "temperature": self.temperature, "top_p": self.top_p,
                "top_k": self.top_k, "seed": self.seed}


def sampled_metrics(task: Task, records: Sequence[dict[str, Any]]) -> dict[str, float]:
    """The metrics of judged sampled records (one per sample, each with ``id``): ``pass@k`` over the problems for
    ``k`` = 1, 2, 4, ... up to the samples per problem (:func:`~mmgpg.evaluation.passk.pass_at_k_metrics`; none when
    the task's ``correct`` is a score, not a 0/1 decision), the task's own aggregate over all samples
    (:func:`judged_metrics`), ``num_problems``, ``samples_per_problem`` (the most of any problem) and
    ``num_samples``. The same function scores a live evaluation and a re-judged predictions file."""
    groups: dict[str, list[float]] = {}
    for r in records:
        groups.setdefault(str(r["id"]), []).append(float(r["correct"]))
    metrics = pass_at_k_metrics(list(groups.values()))
    metrics.update(judged_metrics(task, records))
    metrics.update({"num_problems": float(len(groups)),
                    "samples_per_problem": float(max((len(g) for g in groups.values()), default=0)),
                    "num_samples": float(len(records))})
    return metrics


def _rng_devices() -> list[int]:
    return [torch.cuda.current_device()] if torch.cuda.is_available() and torch.cuda.is_initialized() else []


@torch.no_grad()
def evaluate_sampled(engine: RolloutEngine, task: Task, examples: Sequence[Example], decoding: SampledDecoding, *,
                     batch_size: int = 32, max_new_tokens: int = 64,
                     protocol: str = "paper") -> tuple[dict[str, float], list[dict[str, Any]]]:
    """``decoding.samples`` (K) completions per example, each judged; return ``(metrics, records)`` with one record
    per sample (problem-major, ``sample`` = 0..K-1; the fields of :func:`evaluate`'s records) and
    :func:`sampled_metrics` (plus the task's ``mask_metrics`` over all samples).

    ``batch_size`` counts sequences: each ``generate`` call takes ``batch_size // K`` problems, or with ``K >
    batch_size`` one problem's samples in pieces of ``batch_size`` (:func:`~mmgpg.evaluation.budget.sample_units`);
    ``items · K`` records that would not fit in memory are refused first
    (:func:`~mmgpg.evaluation.budget.check_records`). Under torchrun the calls are split over the ranks as in
    :func:`evaluate` and gathered back into the one-process order. Seeds: problem ``i`` is requested with
    ``request_seed(seed, EVAL_SEED_STREAM, i)`` (``(seed, EVAL_SEED_STREAM, j, i)`` for its ``j``-th piece when its
    samples are split; engines with per-request seeds, vLLM: its samples depend on (seed, problem, sample) only,
    whatever the world size), and torch's RNG is reseeded with ``request_seed(seed, EVAL_SEED_STREAM, -1, b)``
    before call ``b`` (the HF engine draws from it: its samples depend on (seed, batch_size), not on the world
    size). The caller's RNG state is restored afterwards.
    """
    info = distributed.current()
    k = decoding.samples
    units = sample_units(len(examples), k, batch_size)
    check_records(len(examples), k, max_new_tokens)
    mine: list[tuple[int, list[dict[str, Any]]]] = []
    with torch.random.fork_rng(devices=_rng_devices()):
        for b in range(info.rank, len(units), info.world_size):
            start, n, first, kc = units[b]
            chunk = examples[start : start + n]
            torch.manual_seed(request_seed(decoding.seed, EVAL_SEED_STREAM, -1, b))
            piece = () if kc == k else (first // batch_size,)  # a problem's samples in pieces: each its own seeds
            sampling = Sampling(max_new_tokens, decoding.temperature, decoding.top_p, decoding.top_k,
                                seed_key=(decoding.seed, EVAL_SEED_STREAM, *piece), first_prompt=start)
            out = rollout(engine, task, chunk, kc, sampling)
            rows = []
            for i, (text, mask) in enumerate(zip(out.texts, out.completion_mask)):
                ex = chunk[i // kc]
                rows.append({"id": ex.id, **task.record_fields(ex), "sample": first + i % kc, "model_output": text,
                             "tokens": int(mask.sum()), **judge_output(task, text, ex, protocol),
                             **episode_fields(out, i)})
            mine.append((b, rows))
    batches = dict(pair for part in (distributed.gather_objects(mine) if info.enabled else [mine]) for pair in part)
    records: list[dict[str, Any]] = [rec for b in sorted(batches) for rec in batches[b]]
    metrics = sampled_metrics(task, records)
    metrics.update(task.mask_metrics(records, [ex for ex in examples for _ in range(k)], protocol))
    return metrics, records


@dataclass(frozen=True)
class EvalReport:
    """One evaluation of outputs on a task split: what ``metrics.json`` and ``predictions.jsonl`` hold
    (:func:`mmgpg.evaluation.predictions.write_report`).

    ``records`` are the rows of ``predictions.jsonl`` in order: one judged record per evaluated item, then one
    ``{"row", "skipped"}`` record per bad data row (a re-judged file: its rows in line order, a row that could not
    be judged as ``{"line", "id", "skipped"}``); sampled evaluation: one record per sample, with its ``sample``
    index. ``counts``: ``evaluated`` (items), ``skipped``, ``available`` (the split's size) and ``parse_failures``
    (a re-judged file: ``rows`` instead of ``available``; sampled: also ``samples``, the judged samples).
    ``source``: what produced the outputs (``checkpoint``, ``decoding``, ``max_new_tokens``, ``engine``, and for
    sampled decoding ``samples``, ``temperature``, ``top_p``, ``top_k``, ``seed``; or ``predictions``, the file)."""

    task: str
    task_version: str
    protocol: str
    split: str
    limit: int | None
    metrics: dict[str, float]
    records: list[dict[str, Any]]
    counts: dict[str, int]
    source: dict[str, Any]
    examples: list[Example] = field(default_factory=list, repr=False, compare=False)
    """The evaluated items (none for a re-judged file), for another pass on the same items (:func:`sampled_scores`)."""

    @property
    def judged(self) -> list[dict[str, Any]]:
        """The judged records (the skipped rows left out)."""
        return [r for r in self.records if "skipped" not in r]

    def title(self) -> str:
        """The line above the printed metrics table."""
        skipped = self.counts.get("skipped")
        src, sampled = self.source, ""
        if src.get("decoding") == "sampled":
            sampled = f" x {src['samples']} samples" + (f" (temperature {src['temperature']:g}, top_p {src['top_p']:g})"
                                                        if "temperature" in src else "")
        return (f"{self.task} ({self.split}, protocol={self.protocol}, {self.counts['evaluated']} items{sampled}"
                + (f", {skipped} skipped" if skipped else "") + ")")


def parse_failures(records: Sequence[dict[str, Any]]) -> int:
    """How many judged records (the skipped rows left out) the judge could not read an answer from."""
    return int(sum(r.get("parse_failure", 0) for r in records if "skipped" not in r))


def run_evaluation(engine: RolloutEngine, task: Task, split: str, *, limit: int | None, protocol: str = "paper",
                   max_new_tokens: int, batch_size: int = 32, on_bad_row: str = "error", checkpoint: str,
                   engine_name: str, decoding: SampledDecoding | None = None,
                   check_batch: Callable[[int], None] | None = None) -> EvalReport:
    """Greedy-decode the first ``limit`` items of ``split`` (all when None or <= 0) and judge them under ``protocol``;
    with ``decoding``, sample ``decoding.samples`` completions per item instead (:func:`evaluate_sampled`).

    A bad data row raises (``on_bad_row="error"``) or, under ``"skip"``, is left out, warned about on stderr and
    recorded (:func:`mmgpg.task.good_items`). ``checkpoint`` and ``engine_name`` say where the outputs came from
    (the report's ``source``). ``check_batch(sequences)``, when given, may refuse the largest generate call before
    any is made (``mmgpg eval``: :func:`mmgpg.evaluation.budget.check_generation`). The engine stays open: it is the
    caller's."""
    items = task.load(split)
    examples, bad_rows = good_items(items, limit, on_bad_row)
    if check_batch is not None and examples:
        check_batch(min(batch_size, len(examples) * (decoding.samples if decoding else 1)))
    for row, reason in bad_rows.items() if distributed.current().is_main else ():
        print(f"skipped bad data row {row}: {reason}", file=sys.stderr, flush=True)
    if decoding is None:
        metrics, records = evaluate(engine, task, examples, batch_size=batch_size, max_new_tokens=max_new_tokens,
                                    protocol=protocol)
        source = {"checkpoint": checkpoint, "decoding": "greedy", "max_new_tokens": max_new_tokens,
                  "engine": engine_name}
    else:
        metrics, records = evaluate_sampled(engine, task, examples, decoding, batch_size=batch_size,
                                            max_new_tokens=max_new_tokens, protocol=protocol)
        source = {"checkpoint": checkpoint, **decoding.source(), "max_new_tokens": max_new_tokens,
                  "engine": engine_name}
    judged = len(records)
    records += [{"row": row, "skipped": reason} for row, reason in bad_rows.items()]
    counts = {"evaluated": len(examples), "skipped": len(bad_rows), "available": len(items),
              "parse_failures": parse_failures(records), **({"samples": judged} if decoding is not None else {})}
    return EvalReport(task.name, task.version, protocol, split, limit, metrics, records, counts, source, examples)


def report_pass_at_1(report: EvalReport) -> float | None:
    """A report's pass@1: its ``pass@1`` metric (sampled), else the mean 0/1 ``correct`` of its judged records
    (greedy decoding is one sample per item); None when ``correct`` is a score rather than a 0/1 decision."""
    if "pass@1" in report.metrics:
        return report.metrics["pass@1"]
    groups: dict[str, list[float]] = {}
    for r in report.judged:
        groups.setdefault(str(r["id"]), []).append(float(r["correct"]))
    return pass_at_k_metrics(list(groups.values())).get("pass@1")


def benchmark_summary(reports: Sequence[EvalReport]) -> dict[str, float]:
    """Several benchmarks side by side, as the paper's tables report them: ``<task>/pass@1`` of each and
    ``average/pass@1``, their unweighted mean (each benchmark counts once, whatever its size). A benchmark without a
    pass@1 (a continuous score, e.g. LISA's IoU) is left out of the average, and the average is then absent."""
    summary: dict[str, float] = {}
    for report in reports:
        value = report_pass_at_1(report)
        if value is not None:
            summary[f"{report.task}/pass@1"] = value
    if len(summary) == len(reports) and reports:
        summary["average/pass@1"] = sum(summary.values()) / len(reports)
    return summary
