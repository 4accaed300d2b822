"""The rollout producer: what the trainer consumes each step, ``next_batch`` in, :class:`~mmgpg.rollout.collect.Collected`
out.

It owns the step's whole rollout: the prompts drawn from the deterministic stream (:mod:`mmgpg.rollout.stream`), the
engine's completions and the task's scores (:func:`~mmgpg.rollout.collect.sample_groups`), and β_th resampling
(:func:`~mmgpg.rollout.collect.collect_groups`). Each :class:`~mmgpg.rollout.collect.Group` it returns carries the
policy version that sampled it (the number of training steps the weights had taken). The trainer never calls back
into the rollout: it hands over the step and the version, and gets the update's groups.

This is the seam the asynchronous rollout uses (:mod:`mmgpg.rollout.pipeline`, ``rollout.max_staleness``): a thread
calls ``next_batch`` for the next steps while the trainer updates, with older policy versions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from mmgpg.rollout.collect import Collected, Group, collect_groups, sample_groups
from mmgpg.rollout.engine import RolloutEngine, Sampling
from mmgpg.rollout.stream import PromptStream
from mmgpg.task import Example


@dataclass(frozen=True)
class ProducerSettings:
    """The rollout's settings (``rollout.*`` and the β_th keys of ``algo.*``), and this rank's share of a step."""

    group_size: int
    per_rank: int  # prompt groups in this rank's update (train.prompts_per_step / world size)
    sampling: Sampling
    min_valid_fraction: float  # β_th
    max_attempts: int
    drop_zero_variance: bool
    zero_variance_tol: float
    seed: int
    rank: int = 0

    @classmethod
    def from_config(cls, cfg: Any, per_rank: int, rank: int) -> ProducerSettings:
        a = cfg.algo
        return cls(cfg.rollout.group_size, per_rank, Sampling.from_config(cfg.rollout), a.min_valid_fraction,
                   a.max_resample_attempts, a.drop_zero_variance, a.zero_variance_tol, cfg.seed, rank)


class RolloutProducer:
    """This rank's rollout: ``engine`` generates, ``task`` scores, ``dataset[stream.next(...)]`` are the prompts."""

    def __init__(self, engine: RolloutEngine, task: Any, dataset: Sequence[Example], stream: PromptStream,
                 settings: ProducerSettings, comm_device: Any = None):
        self.engine, self.task, self.dataset, self.stream = engine, task, dataset, stream
        self.settings, self.comm_device = settings, comm_device
        self.group = None  # the process group of the stopping rule's sum (a thread of its own needs its own group)

    def next_batch(self, step: int, policy_version: int) -> Collected:
        """The update of training step ``step + 1``: sample until its valid fraction reaches β_th (or the attempt
        cap), every group stamped with ``policy_version``. Collective: every rank calls it (the stopping rule sums
        over ranks)."""
        s = self.settings

        def attempt(number: int) -> list[Group]:
            groups = self._sample(step, number)
            for g in groups:
                g.policy_version = policy_version
            return groups

        return collect_groups(attempt, s.per_rank, min_valid_fraction=s.min_valid_fraction,
                              max_attempts=s.max_attempts, comm_device=self.comm_device,
                              drop_zero_variance=s.drop_zero_variance, group=self.group)

    def _sample(self, step: int, attempt: int) -> list[Group]:
        """One attempt: the next ``per_rank`` prompts of the stream, ``group_size`` completions each, scored. Engines
        with per-request seeds (vLLM) seed each prompt from (seed, step, attempt, rank, prompt index)."""
        s = self.settings
        examples = [self.dataset[i] for i in self.stream.next(s.per_rank)]
        sampling = replace(s.sampling, seed_key=(s.seed, step, attempt, s.rank))
        return sample_groups(self.engine, self.task, examples, s.group_size, sampling, attempt=attempt,
                             zero_variance_tol=s.zero_variance_tol)
