"""The configured algorithm as the trainer applies it to one step's update (``algo.*``):

* the **rewards** that make the advantages: the task's total, plus DAPO's soft overlong punishment
  (``algo.overlong_buffer_fraction``) — zero-variance groups stay judged on the task's reward alone;
* the **advantages** (:meth:`Objective.advantages`, collective): group-relative ones (GPG, GRPO, RLOO: a zero-variance
  group's advantages are 0 and it is not trained) or batch-whitened ones (REINFORCE++: the moments of the whole step
  are summed over ranks first, and every group is trained), with the global counts B, M and tokens → α and the
  aggregation's denominator (:class:`StepCounts`);
* the **loss mask** (DAPO's overlong filter leaves truncated completions out of the loss and of the token counts) and
  the **token loss** with its hyper-parameters bound once (clip ranges, CISPO's bounds, GSPO's mask);
* the **rollout correction** (``algo.rollout_correction``): detached importance weights of the trainer's policy
  against the engine's behaviour log-probs, multiplied into the token loss (:meth:`Objective.rollout_weights`).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from mmgpg import algorithms, correction, distributed
from mmgpg.models.batch import CompletionBatch
from mmgpg.registry import ROLLOUT_CORRECTIONS
from mmgpg.rollout.collect import Group


@dataclass(frozen=True)
class StepCounts:
    """The global (all-rank) counts of one step's update and what follows from them."""

    num_samples: float  # B: samples in the update
    num_zero_variance: float  # M: those in zero-variance groups
    num_tokens: float  # completion tokens in the update that enter the loss
    alpha: float | None  # B / (B - M) with algo.alpha_correction, 1.0 without; None when nothing has signal
    denominator: float  # the aggregation's global denominator
    skip: bool  # no sample with signal and no KL term: the step has nothing to learn

    @property
    def valid_fraction(self) -> float:
        return algorithms.valid_fraction(self.num_samples, self.num_zero_variance)


class Objective:
    """``algo`` bound once: advantages, loss mask and token loss of the trainer's update."""

    def __init__(self, algo, max_new_tokens: int, eos_token_ids: Sequence[int]):
        self.algo, self.max_new_tokens, self.eos = algo, max_new_tokens, list(eos_token_ids)
        self.overlong_cache = round(algo.overlong_buffer_fraction * max_new_tokens)  # DAPO's L_cache (0: off)
        advantage = algorithms.ADVANTAGES[algo.advantage]
        # REINFORCE++: the advantage whitens with the moments of these values over the whole batch (all ranks).
        self.batch_values = getattr(advantage, "batch_moments_of", None)
        self.advantage_fn = algorithms.bind(advantage, std_eps=algo.std_eps)
        loss = algorithms.TOKEN_LOSSES[algo.token_loss]
        self.loss_takes_mask = "mask" in inspect.signature(loss).parameters  # GSPO's per-sequence mean
        self.token_loss_fn = algorithms.bind(loss, clip_eps=algo.clip_eps, clip_eps_high=algo.clip_eps_high,
                                             cispo_eps_low=algo.cispo_eps_low, dual_clip=algo.dual_clip)
        corrects = algo.rollout_correction != "none"
        self.correction = ROLLOUT_CORRECTIONS[algo.rollout_correction] if corrects else None
        self.correction_level = ROLLOUT_CORRECTIONS.facts(algo.rollout_correction).get("level", "token")

    # ---- rewards and token counts -----------------------------------------------------------------------------------

    def rewards(self, groups: Sequence[Group]) -> torch.Tensor:
        """``[P, G]`` float64: the task's rewards, plus DAPO's overlong penalty of each completion's length."""
        rewards = torch.tensor([g.rewards for g in groups], dtype=torch.float64)
        if self.overlong_cache:
            lengths = torch.tensor([g.policy_tokens() for g in groups], dtype=torch.float64)
            rewards = rewards + algorithms.overlong_penalty(lengths, self.max_new_tokens, self.overlong_cache)
        return rewards

    def loss_tokens(self, group: Group) -> list[int]:
        """Tokens of each completion that enter the loss: all of them, or none of a truncated one under
        ``algo.overlong_filter``."""
        if not self.algo.overlong_filter:
            return group.policy_tokens()
        return [0 if cut else n for n, cut in zip(group.policy_tokens(), group.truncated(self.eos))]

    def loss_mask(self, batch: CompletionBatch) -> torch.Tensor:
        """The completion mask of a micro-batch with the rows of truncated completions cleared under
        ``algo.overlong_filter`` (:func:`mmgpg.algorithms.overlong_filter_mask`); the same rule as :meth:`loss_tokens`."""
        mask = batch.completion_mask
        if not self.algo.overlong_filter:
            return mask
        lengths = batch.present_mask.sum(dim=1)  # an episode's last token is its last turn's
        last = batch.completion_ids.gather(1, (lengths - 1).clamp(min=0)[:, None])[:, 0]
        truncated = (lengths == 0) | ~torch.isin(last, torch.tensor(self.eos, dtype=last.dtype))
        return algorithms.overlong_filter_mask(mask, truncated)

    # ---- phase 2: advantages ------------------------------------------------------------------------------------------

    def trains(self, groups: Sequence[Group]) -> list[Group]:
        """The groups whose log-probs the update needs: all of them with a KL term or batch-whitened advantages,
        else the informative ones (a zero-variance group's group-relative advantages are 0)."""
        if self.algo.kl_coef > 0 or self.batch_values is not None:
            return list(groups)
        return [g for g in groups if not g.zero_variance]

    def advantages(self, groups: Sequence[Group], comm_device) -> StepCounts:
        """Set ``g.advantages`` of this rank's groups (one call on the stacked ``[P, G]`` rewards) and return the
        global counts. Collective: every rank calls it, a rank without groups too."""
        a, G = self.algo, len(groups[0].rewards) if groups else 0
        tokens = [self.loss_tokens(g) for g in groups]
        rewards = self.rewards(groups) if groups else None
        moments = signal = None
        if self.batch_values is not None:  # REINFORCE++: the batch's moments over all ranks, before any advantage
            values = self.batch_values(rewards) if groups else None
            local = algorithms.batch_moments(values, torch.tensor(tokens)) if groups else (0.0, 0.0, 0.0)
            moments = algorithms.all_reduce_moments(local, comm_device)
            high = distributed.all_max(float(values.max()) if groups else -math.inf, comm_device)
            low = -distributed.all_max(-float(values.min()) if groups else -math.inf, comm_device)
            signal = high - low > a.zero_variance_tol
        if groups:
            if moments is None:
                adv = self.advantage_fn(rewards)
            else:  # no token of the batch enters the loss (all filtered): nothing to whiten, nothing to learn
                adv = self.advantage_fn(rewards, moments) if moments[2] > 0 else torch.zeros_like(rewards)
            for g, row in zip(groups, adv.tolist()):
                g.advantages = [0.0] * G if g.zero_variance and self.batch_values is None else row
        total = distributed.sum_counts({"num_samples": sum(len(g.rewards) for g in groups),
                                        "num_zero_variance": sum(len(g.rewards) for g in groups if g.zero_variance),
                                        "num_tokens": sum(map(sum, tokens))}, comm_device)
        num_samples, num_zero, num_tokens = total["num_samples"], total["num_zero_variance"], total["num_tokens"]
        if signal is None:
            signal = num_samples - num_zero > 0
        alpha = None
        if signal:
            alpha = algorithms.gpg_alpha(num_samples, num_zero) if a.alpha_correction and num_zero < num_samples else 1.0
        denominator = algorithms.aggregation_denominator(a.aggregation, int(num_samples), int(num_tokens),
                                                         self.max_new_tokens)
        return StepCounts(num_samples, num_zero, num_tokens, alpha, denominator,
                          skip=num_samples == 0 or (not signal and a.kl_coef == 0))

    # ---- phase 3: the policy term ---------------------------------------------------------------------------------

    def policy_loss_sum(self, logp: torch.Tensor, advantages: torch.Tensor, old_logp: torch.Tensor | None,
                        mask: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
        """The aggregation's numerator of the token loss over these rows (divide by the global denominator);
        ``weights`` (:meth:`rollout_weights`) multiply each token's loss."""
        kwargs = {} if old_logp is None else {"old_logp": old_logp}
        if self.loss_takes_mask:
            kwargs["mask"] = mask
        per_token = self.token_loss_fn(logp, advantages, **kwargs)
        if weights is not None:
            per_token = per_token * weights.to(per_token.dtype)
        return algorithms.token_loss_sum(per_token, mask, self.algo.aggregation)

    def rollout_weights(self, batch: CompletionBatch, logp_prox: torch.Tensor, mask: torch.Tensor, *, engine: str,
                        step: int) -> tuple[torch.Tensor, tuple[float, ...]]:
        """``algo.rollout_correction``'s detached weights ``[N, T]`` for these rows and their statistics
        (:func:`mmgpg.correction.rollout_correction_stats`). ``logp_prox``: the trainer's log-probs at the weights the
        update starts from. The behaviour log-probs are the ones the engine returned with the samples."""
        a = self.algo
        if batch.sampled_logprobs is None:
            raise ValueError(f"step {step + 1}: algo.rollout_correction={a.rollout_correction} needs the log-prob "
                             f"the rollout engine gave each sampled token, and the {engine} engine returned none for "
                             f"these {batch.num_sequences} completions (the first of prompt "
                             f"{(batch.prompts.texts or [''])[0][-80:]!r}; engines return them when they sample, not "
                             "for greedy decoding). Set algo.rollout_correction=none, or sample with "
                             "rollout.temperature > 0.")
        mask = mask.to(logp_prox.device).bool()
        try:
            log_ratio = correction.rollout_log_ratio(logp_prox, batch.sampled_logprobs, mask)
        except ValueError as err:
            raise ValueError(f"step {step + 1} ({engine} engine): {err}") from None
        weights = self.correction(log_ratio, mask, a.rollout_correction_bound)
        stats = correction.rollout_correction_stats(log_ratio, weights, mask, level=self.correction_level,
                                                    bound=a.rollout_correction_bound)
        return weights.to(logp_prox.dtype), stats
