"""Sampling scored groups (the one encode → generate → score path) and the β_th collection loop.

:func:`sample_groups` is what training, evaluation and ``mmgpg sample`` call: the engine generates ``G`` completions
per prompt and the task's rewards (and binary success) score each one. :func:`collate_groups` puts groups back into
one :class:`~mmgpg.models.batch.CompletionBatch` and :func:`group_logprobs` scores its completion tokens: the update
and ``mmgpg sample`` compute log-probs through these two.

:func:`collect_groups` samples until the update's valid fraction reaches ``min_valid_fraction``.

One step's update holds exactly ``per_rank`` groups on every rank (at most that many with ``drop_zero_variance``).
Each attempt samples ``per_rank`` new prompt groups per rank; after each attempt the ranks sum how many informative
groups would enter the update (``min(valid so far, per_rank)`` per rank) and stop when ``(B - M) / B >=
min_valid_fraction`` over all ranks, or after ``max_attempts`` attempts. The update is then assembled per rank by
:func:`assemble_update`: informative groups first (earliest attempt first), then zero-variance groups (earliest
attempt first) as filler; informative groups beyond ``per_rank`` are dropped and counted. DAPO's dynamic sampling is
this loop with ``min_valid_fraction = 1`` and the filler left out (``drop_zero_variance``): then the update may hold
fewer groups.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import torch

from mmgpg import algorithms, distributed
from mmgpg.models import Policy
from mmgpg.models.batch import CompletionBatch, PromptBatch
from mmgpg.models.logprobs import pad_completions
from mmgpg.rollout.engine import RolloutEngine, Sampling
from mmgpg.task import Example, task_rewards, task_success


@dataclass
class Group:
    """One prompt with its ``G`` sampled completions, their rewards and what became of the group."""

    example: Example
    completion_ids: list[list[int]]
    texts: list[str]
    rewards: list[float]  # total reward per completion
    components: dict[str, list[float]]
    attempt: int = 0
    zero_variance: bool = False
    success: list[bool] | None = None  # the task's binary success per completion (None: the task declares none)
    in_update: bool = False  # set by assemble_update
    advantages: list[float] = field(default_factory=list)
    prompts: PromptBatch | None = None  # the rollout's encoded prompts; this group's is row `prompt_index`
    prompt_index: int = 0
    sampled_logprobs: list[list[float]] | None = None  # the engine's log-prob of each completion token, if it gives them
    policy_version: int = 0  # training steps the weights that sampled it had taken (mmgpg.rollout.producer)
    episodes: list | None = None  # a task with tools: each completion's mmgpg.rollout.episode.Episode

    @property
    def num_tokens(self) -> int:
        """The tokens the policy generated for this group (an episode's observations not counted)."""
        return sum(self.policy_tokens())

    def policy_tokens(self) -> list[int]:
        """Per completion: the tokens the policy generated (all of a single-turn completion; an episode's turns
        without its observations)."""
        if self.episodes is None:
            return [len(c) for c in self.completion_ids]
        return [sum(e.policy) for e in self.episodes]

    def truncated(self, eos_token_ids: Sequence[int]) -> list[bool]:
        """Per completion: cut at ``max_new_tokens`` (it does not end with any EOS id; an empty one counts too)."""
        eos = set(eos_token_ids)
        return [not ids or ids[-1] not in eos for ids in self.completion_ids]


def score_group(task, example: Example, out: CompletionBatch, p: int, *, attempt: int = 0,
                zero_variance_tol: float = 0.0) -> Group:
    """Group ``p`` of ``out`` with the task's rewards, binary success and zero-variance flag."""
    G = out.group_size
    ids, texts, rewards, success, logprobs = [], [], [], [], []
    components: dict[str, list[float]] = {}
    for g in range(G):
        row = p * G + g
        n = int(out.present_mask[row].sum())
        ids.append(out.completion_ids[row, :n].tolist())
        if out.sampled_logprobs is not None:
            logprobs.append(out.sampled_logprobs[row, :n].tolist())
        texts.append(out.texts[row])
        scores = task_rewards(task, out.texts[row], example)
        success.append(task_success(task, out.texts[row], example, scores))
        rewards.append(scores.pop("total"))
        for k, v in scores.items():
            components.setdefault(k, []).append(v)
    zero = bool(algorithms.zero_variance_mask(torch.tensor([rewards], dtype=torch.float64), zero_variance_tol)[0])
    declared = None if any(s is None for s in success) else [bool(s) for s in success]
    return Group(example, ids, texts, rewards, components, attempt, zero, declared, prompts=out.prompts, prompt_index=p,
                 sampled_logprobs=logprobs if out.sampled_logprobs is not None else None,
                 episodes=None if out.episodes is None else out.episodes[p * G : (p + 1) * G])


def sample_groups(engine: RolloutEngine, task, examples: Sequence[Example], group_size: int, sampling: Sampling, *,
                  attempt: int = 0, zero_variance_tol: float = 0.0) -> list[Group]:
    """Encode → generate → score: ``group_size`` completions (or episodes, for a task with tools:
    :func:`mmgpg.rollout.episode.rollout`) for each example, scored by the task."""
    from mmgpg.rollout.episode import rollout

    out = rollout(engine, task, examples, group_size, sampling)
    return [score_group(task, ex, out, p, attempt=attempt, zero_variance_tol=zero_variance_tol)
            for p, ex in enumerate(examples)]


def collate_groups(policy: Policy, task, groups: Sequence[Group], group_size: int) -> CompletionBatch:
    """The groups' prompts (reused from the rollout's encoding when the engine made one) and completions as one
    batch, with the engine's sampled log-probs when every group has them (for the post-sync check)."""
    if all(g.prompts is not None for g in groups):
        batch = policy.gather_prompts([(g.prompts, g.prompt_index) for g in groups])
    else:
        from mmgpg.rollout.episode import episode_prompt

        batch = policy.encode_prompts([episode_prompt(task, g.example) for g in groups])
    if any(g.episodes is not None for g in groups):
        from mmgpg.rollout.episode import episode_batch

        if not all(g.episodes is not None for g in groups):
            raise ValueError("a micro-batch mixes episodes and single-turn completions")
        return episode_batch(policy, batch, group_size, [e for g in groups for e in g.episodes])
    ids, mask = pad_completions([ids for g in groups for ids in g.completion_ids], policy.pad_token_id)
    sampled = None
    if all(g.sampled_logprobs is not None for g in groups):
        sampled = torch.zeros(ids.shape, dtype=torch.float32)
        for i, lp in enumerate(lp for g in groups for lp in g.sampled_logprobs):
            sampled[i, : len(lp)] = torch.tensor(lp, dtype=torch.float32)
    return CompletionBatch(batch, group_size, ids, mask, sampled_logprobs=sampled)


def padded_length(group: Group) -> tuple[int, int]:
    """``(longest completion, prompt tokens)`` of ``group`` (prompt 0 when the rollout kept no encoding): what a
    micro-batch pads its rows to at least. Prompts are left-padded and completions right-padded separately, so a
    micro-batch's width is its longest prompt plus its longest completion."""
    prompt = int(group.prompts.attention_mask[group.prompt_index].sum()) if group.prompts is not None else 0
    return max([0, *(len(c) for c in group.completion_ids)]), prompt


def length_ordered(groups: Sequence[Group]) -> list[Group]:
    """``groups`` longest first by :func:`padded_length` (longest completion, then prompt; a stable sort), so that
    the groups of one micro-batch have similar lengths and each micro-batch is padded only to its own longest row.
    The update's sums have global denominators, so the order of the micro-batches does not change the gradient
    (beyond float rounding); longest first also puts the step's peak memory into its first micro-batch. (The key
    is the completion first: sorting by prompt + completion pairs a long prompt with a long completion less often
    but pads more on average, 0.361 vs 0.341 padding over 10 seeds of bench/padding.py's length mix.)

    >>> class G:  # the two fields padded_length reads
    ...     def __init__(self, n): self.prompts, self.completion_ids = None, [[1] * n]
    >>> [padded_length(g)[0] for g in length_ordered([G(3), G(9), G(1), G(9)])]
    [9, 9, 3, 1]
    """
    return sorted(groups, key=padded_length, reverse=True)


def plan_micro_batches(groups: Sequence[Group], size: int) -> list[list[Group]]:
    """The update's forward passes: ``groups`` :func:`length_ordered`, ``size`` groups per micro-batch.

    >>> class G:
    ...     def __init__(self, n): self.prompts, self.completion_ids = None, [[1] * n]
    >>> [[len(g.completion_ids[0]) for g in mb] for mb in plan_micro_batches([G(3), G(9), G(1)], 2)]
    [[9, 3], [1]]
    """
    ordered = length_ordered(groups)
    return [ordered[i : i + size] for i in range(0, len(ordered), size)]


def padding_counts(batch: CompletionBatch, *, packed: bool = False) -> tuple[int, int]:
    """``(computed, padding)`` token positions of one forward over ``batch``: rows × (prompt width + completion
    width) are computed, of which ``padding`` are pad positions (prompt rows are repeated ``group_size`` times, as the
    forward repeats them). A packed forward (``model.packed_sequences``, :func:`packs`) computes the real tokens only.

    >>> from mmgpg.models.batch import PromptBatch
    >>> p = PromptBatch(torch.zeros(1, 4, dtype=torch.long), torch.tensor([[0, 1, 1, 1]]), torch.zeros(1, 4), [{}], [[]], [''])
    >>> b = CompletionBatch(p, 2, torch.zeros(2, 5, dtype=torch.long), torch.tensor([[1] * 5, [1, 1, 0, 0, 0]]).bool())
    >>> padding_counts(b), padding_counts(b, packed=True)
    ((18, 5), (13, 0))
    """
    G = batch.group_size
    real = int(batch.prompts.attention_mask.sum()) * G + int(batch.completion_mask.sum())
    computed = real if packed else batch.num_sequences * (batch.prompts.input_ids.shape[1] + batch.completion_ids.shape[1])
    return computed, computed - real


def group_logprobs(policy: Policy, batch: CompletionBatch, model: Any, rollout: Any,
                   autocast: Callable[[], AbstractContextManager] = contextlib.nullcontext) -> torch.Tensor:
    """Per-token log-probs ``[rows, T]`` of ``batch``'s completions as a training step computes them: at the
    sampling temperature (``rollout.temperature``), in chunks of ``model.logprob_chunk_size`` tokens, images encoded
    once per prompt under ``model.encode_images_once`` (``model``, ``rollout``: the config's sections)."""
    with autocast():
        return policy.completion_logprobs(batch, chunk_size=model.logprob_chunk_size, temperature=rollout.temperature,
                                          encode_images_once=model.encode_images_once,
                                          packed=packs(policy, model))


def packs(policy: Policy, model: Any) -> bool:
    """Whether ``policy`` scores packed rows under ``model.packed_sequences`` (``always`` with a policy that cannot pack
    is refused when the trainer starts: :func:`check_packing`)."""
    mode = model.packed_sequences
    if mode == "auto":
        return policy.supports_packing and model.attn_implementation == "flash_attention_2"
    return mode == "always"


def check_packing(policy: Policy, model: Any) -> None:
    """``model.packed_sequences=always`` with a family that cannot pack: its refusal, saying why."""
    if model.packed_sequences == "always":
        policy.check_packing(True)


@dataclass(frozen=True)
class Collected:
    """What one step's rollout phase hands to the advantages phase."""

    update: list[Group]  # this rank's update batch (per_rank groups; fewer with drop_zero_variance)
    generated: list[Group]  # every group sampled on this rank, all attempts (logged and recorded)
    attempts: int
    dropped_valid_groups: int  # informative groups beyond per_rank on this rank

    def metrics(self) -> dict[str, float]:
        return {"rollout/resample_attempts": float(self.attempts),
                "rollout/dropped_valid_groups": float(self.dropped_valid_groups)}


def assemble_update(generated: Sequence[Group], per_rank: int, *,
                    drop_zero_variance: bool = False) -> tuple[list[Group], int]:
    """This rank's update: informative groups first, then zero-variance filler (none with ``drop_zero_variance``:
    DAPO's dynamic sampling), both in generation (attempt) order; marks ``in_update`` on the chosen groups and returns
    ``(update, informative groups dropped)``.

    ``[v0, z0, v1]`` (attempt order) with ``per_rank = 2`` → ``[v0, v1]``, 0 dropped;
    ``[z0, z1, v0]`` with ``per_rank = 2`` → ``[v0, z0]`` (``[v0]`` with ``drop_zero_variance``).
    """
    valid = [g for g in generated if not g.zero_variance]
    zero = [] if drop_zero_variance else [g for g in generated if g.zero_variance]
    update = valid[:per_rank] + zero[: max(per_rank - len(valid), 0)]
    for g in generated:
        g.in_update = False
    for g in update:
        g.in_update = True
    return update, max(len(valid) - per_rank, 0)


def collect_groups(sample: Callable[[int], list[Group]], per_rank: int, *, min_valid_fraction: float,
                   max_attempts: int, comm_device=None, drop_zero_variance: bool = False, group=None) -> Collected:
    """Run ``sample(attempt)`` (which returns this rank's ``per_rank`` new groups) until the global valid fraction
    of the update reaches ``min_valid_fraction`` or ``max_attempts`` attempts were made; ``drop_zero_variance``
    leaves the zero-variance filler out of the update (:func:`assemble_update`).

    Collective: every rank must call it (the stopping rule uses a sum over ranks, so all ranks stop together), over
    ``group`` (default: the default process group).
    """
    generated: list[Group] = []
    total = per_rank * distributed.current().world_size
    attempts = 0
    while True:
        generated += sample(attempts)
        attempts += 1
        in_update = min(sum(not g.zero_variance for g in generated), per_rank)
        (global_valid,) = distributed.all_sum([in_update], comm_device or "cpu", group)
        if attempts >= max_attempts or not algorithms.needs_more_groups(total, total - global_valid,
                                                                        min_valid_fraction):
            break
    update, dropped = assemble_update(generated, per_rank, drop_zero_variance=drop_zero_variance)
    return Collected(update, generated, attempts, dropped)
