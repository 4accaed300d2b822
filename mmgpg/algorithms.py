"""The math of GPG, GRPO and their variants, as small pure tensor functions.

An algorithm is a combination of these (see ``configs/algo/*.yaml`` and :class:`mmgpg.config.AlgoConfig`):

* advantages — :func:`group_mean_advantages` (GPG, F_norm = 1), :func:`group_zscore_advantages` (GRPO),
  :func:`group_stabilized_advantages` (the success-amplification paper's sqrt(var + eps)), :func:`rloo_advantages`
  (leave-one-out), :func:`reinforce_pp_advantages` / :func:`reinforce_pp_baseline_advantages` (whitened with
  *global* batch statistics: :func:`batch_moments`, :func:`all_reduce_moments`, :func:`whiten_with_moments`);
* :func:`zero_variance_mask` — the only definition of "this group carries no signal";
* :func:`gpg_alpha` — the bias correction α = B / (B − M); :func:`valid_fraction`, :func:`needs_more_groups` (β_th);
* token losses — :func:`reinforce_token_loss` (GPG), :func:`clipped_ratio_token_loss` (GRPO/PPO; DAPO's clip-higher),
  :func:`gspo_sequence_token_loss` / :func:`gspo_token_level_token_loss` (GSPO, GSPO-token), :func:`cispo_token_loss`;
* DAPO's length handling — :func:`overlong_penalty` (soft overlong punishment), :func:`overlong_filter_mask`;
* KL estimators — :data:`KL_ESTIMATORS`: :func:`kl_k3` (forward-KL gradient), :func:`kl_k2` (reverse-KL
  gradient), :func:`kl_k1` (zero expected gradient);
* :func:`token_loss_sum` / :func:`aggregation_denominator` — how per-token losses become one number
  (``token_mean`` as in the GPG paper and DAPO, ``seq_mean_token_mean`` as in the GPG multimodal code and GSPO,
  ``constant_length`` as in Dr. GRPO), one (numerator, denominator) row per mode in :data:`_AGGREGATION`. The numerator is a plain sum so that micro-batches and ranks can add their parts and divide by
  one global denominator.

Shapes: ``rewards`` is ``[P, G]`` (P groups of G completions); token tensors are ``[N, T]`` with ``N = P * G`` rows in
prompt-major order and a boolean ``mask``.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from mmgpg.registry import (  # noqa: F401  (the names)
    ADVANTAGES,
    AGGREGATIONS,
    KL_ESTIMATORS,
    TOKEN_LOSSES,
)


def bind(fn: Callable, **hyper: Any) -> Callable:
    """``fn`` with those of ``hyper`` that it declares bound by keyword, once (``std_eps`` reaches the whitening
    advantages and not GPG's; ``clip_eps`` the clipped ratio loss and not REINFORCE)."""
    declared = inspect.signature(fn).parameters
    return functools.partial(fn, **{k: v for k, v in hyper.items() if k in declared})


# --------------------------------------------------------------------------------------------------------------------
# Advantages
# --------------------------------------------------------------------------------------------------------------------


def _check_rewards(rewards: torch.Tensor) -> None:
    if rewards.ndim != 2 or rewards.shape[1] < 1:
        raise ValueError(f"rewards must be [groups, group_size]; got shape {tuple(rewards.shape)}")


def group_mean_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """GPG (F_norm = 1): ``A_ij = r_ij - mean_j r_ij``.

    ``[[1, 0, 0, 1]]`` → ``[[0.5, -0.5, -0.5, 0.5]]``.
    """
    _check_rewards(rewards)
    return rewards - rewards.mean(dim=1, keepdim=True)


def group_zscore_advantages(rewards: torch.Tensor, std_eps: float = 1e-4) -> torch.Tensor:
    """GRPO: ``A_ij = (r_ij - mean_j) / (std_j + std_eps)`` with the unbiased (n − 1) group std, as TRL and the GPG
    forks compute it. A group of one has std 0 here (not NaN).

    ``[[1, 0, 0, 1]]``: mean 0.5, std sqrt(1/3) = 0.57735 → ``±0.5 / (0.57735 + 1e-4)`` = ``±0.86588``.
    """
    _check_rewards(rewards)
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    if rewards.shape[1] == 1:
        std = torch.zeros_like(rewards)
    else:
        std = rewards.std(dim=1, unbiased=True, keepdim=True)
    return centred / (std + std_eps)


def group_stabilized_advantages(rewards: torch.Tensor, std_eps: float = 1e-4) -> torch.Tensor:
    """Mroueh's stabilised whitening: ``A_ij = (r_ij - mean_j) / sqrt(var_j + std_eps)`` with the population variance
    (for 0/1 rewards ``var = p (1 - p)``), so the weights are ``ω± = (1-p or p) / sqrt(p(1-p) + ε)``.

    ``[[1, 0, 0, 1]]``, ε = 0.01: var 0.25 → ``±0.5 / sqrt(0.26)`` = ``±0.98058``.
    """
    _check_rewards(rewards)
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    var = (centred**2).mean(dim=1, keepdim=True)
    return centred / torch.sqrt(var + std_eps)


def rloo_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """RLOO (Ahmadian et al. 2024): ``A_ij = r_ij - mean_{k≠j} r_ik = G/(G-1) · (r_ij - mean_j r_ij)``: the baseline
    of each sample leaves that sample out. A group of one has no other sample: A = 0 (as TRL's RLOO).

    ``[[1, 0, 0, 1]]``: sample 0's baseline (0 + 0 + 1)/3 = 1/3 → ``2/3``; sample 1's (1 + 0 + 1)/3 → ``-2/3``:
    ``[[2/3, -2/3, -2/3, 2/3]]`` (= 4/3 · GPG's ±0.5).
    """
    _check_rewards(rewards)
    G = rewards.shape[1]
    if G == 1:
        return torch.zeros_like(rewards)
    return (rewards - rewards.mean(dim=1, keepdim=True)) * (G / (G - 1))


def batch_moments(values: torch.Tensor, weights: torch.Tensor | None = None) -> tuple[float, float, float]:
    """This rank's ``(Σ w v, Σ w v², Σ w)`` of ``values [P, G]`` with ``weights [P, G]`` (completion lengths: every
    token counts, as verl/OpenRLHF whiten over tokens) or 1 per sample. Sum them over ranks
    (:func:`all_reduce_moments`) before :func:`whiten_with_moments`. ``[[1, 0]]`` with lengths ``[[3, 1]]`` → (3, 3, 4).
    """
    v = values.double()
    w = torch.ones_like(v) if weights is None else weights.to(v.dtype)
    return float((w * v).sum()), float((w * v * v).sum()), float(w.sum())


def all_reduce_moments(moments: tuple[float, float, float], device: torch.device | str = "cpu"):
    """The moments summed over all ranks (one all-reduce; the identity on one process). Collective: every rank calls
    it, one with no groups too (its moments are ``(0, 0, 0)``)."""
    from mmgpg import distributed

    return tuple(distributed.all_sum(moments, device))


def whiten_with_moments(values: torch.Tensor, moments: tuple[float, float, float], std_eps: float = 1e-8):
    """``(v - μ) / sqrt(σ² + std_eps)`` with the global ``μ = S1/n`` and the unbiased ``σ² = (S2/n - μ²) · n/(n-1)``
    from ``moments = (S1, S2, n)`` (verl's masked_whiten: token-weighted mean and Bessel-corrected variance, ε = 1e-8
    on the variance). ``[[1, 0]]`` with lengths ``[[3, 1]]``: μ = 3/4, σ² = (3/4 - 9/16) · 4/3 = 1/4 → ``[[0.5, -1.5]]``.
    """
    s1, s2, n = moments
    if n <= 0:
        raise ValueError(f"the moments count no sample (n = {n}): nothing to whiten")
    mean = s1 / n
    var = max(s2 / n - mean * mean, 0.0) * (n / (n - 1) if n > 1 else 0.0)
    return (values - mean) / (var + std_eps) ** 0.5


def whitens_batch(values_of: Callable[[torch.Tensor], torch.Tensor]) -> Callable:
    """Marks an advantage that whitens with the *batch's* moments of ``values_of(rewards)``: the trainer computes
    them on every rank (:func:`batch_moments` weighted by the completions' loss tokens), sums them over ranks
    (:func:`all_reduce_moments`) and passes them as ``moments``. Such advantages give zero-variance groups a
    non-zero advantage too (the baseline is the batch's, not the group's), so those groups are trained."""
    def mark(fn: Callable) -> Callable:
        fn.batch_moments_of = values_of
        return fn
    return mark


def _rewards_themselves(rewards: torch.Tensor) -> torch.Tensor:
    return rewards


@whitens_batch(_rewards_themselves)
def reinforce_pp_advantages(rewards: torch.Tensor, moments: tuple[float, float, float], std_eps: float = 1e-8):
    """REINFORCE++ (Hu 2025) with an outcome reward and γ = 1: every token's return is ``r_i``, whitened with the
    *global* batch statistics: ``A_i = (r_i - μ) / sqrt(σ² + ε)``. ``moments`` must be
    ``all_reduce_moments(batch_moments(rewards, lengths))`` over all ranks: per-rank statistics give another answer.
    Two ranks ``[[1, 0]]``, ``[[1, 1]]`` (one token each): μ = 3/4, σ² = 1/4 → ``[[0.5, -1.5]]``, ``[[0.5, 0.5]]``.
    """
    _check_rewards(rewards)
    return whiten_with_moments(rewards, moments, std_eps)


@whitens_batch(group_mean_advantages)
def reinforce_pp_baseline_advantages(rewards: torch.Tensor, moments: tuple[float, float, float],
                                     std_eps: float = 1e-8) -> torch.Tensor:
    """REINFORCE++-baseline: subtract the group mean, then whiten the centred rewards with the *global* batch
    statistics (verl's compute_reinforce_plus_plus_baseline_outcome_advantage: the token-weighted global mean of the
    centred rewards is subtracted too). ``moments = all_reduce_moments(batch_moments(group_mean_advantages(rewards),
    lengths))``. ``[[1, 0, 0, 0]]`` (one token each): centred [.75, -.25, -.25, -.25], μ = 0, σ² = 0.75/3 = 0.25
    → ``[[1.5, -0.5, -0.5, -0.5]]``.
    """
    return whiten_with_moments(group_mean_advantages(rewards), moments, std_eps)



# --------------------------------------------------------------------------------------------------------------------
# Zero-variance groups, α and β_th
# --------------------------------------------------------------------------------------------------------------------


def zero_variance_mask(rewards: torch.Tensor, tol: float = 0.0) -> torch.Tensor:
    """``[P]`` bool: True where a group carries no learning signal, i.e. ``max_j r_ij - min_j r_ij <= tol``.

    This is the one definition used everywhere (counting for α, resampling, skipping the forward). ``tol = 0`` means
    exactly equal rewards; for continuous rewards (IoU) a small ``tol`` treats near-ties as ties.
    ``[[1, 0, 0, 1], [1, 1, 1, 1]]`` → ``[False, True]``.
    """
    _check_rewards(rewards)
    if tol < 0:
        raise ValueError(f"tol must be >= 0; got {tol}")
    spread = rewards.max(dim=1).values - rewards.min(dim=1).values
    return spread <= tol


def gpg_alpha(num_samples: int | float, num_zero_variance: int | float) -> float:
    """The GPG bias correction ``α = B / (B - M)``.

    ``B`` = samples in the update (all ranks), ``M`` = those in zero-variance groups. The batch-mean gradient equals
    ``(B - M) / B`` times the mean over informative samples; α undoes that shrinkage. ``gpg_alpha(8, 4) == 2.0``.
    Raises when ``B - M <= 0``: a step without any informative sample must be skipped, never divided by ~0.
    """
    if num_samples <= 0 or num_zero_variance < 0 or num_zero_variance > num_samples:
        raise ValueError(f"need 0 <= M <= B and B > 0; got B={num_samples}, M={num_zero_variance}")
    if num_samples - num_zero_variance <= 0:
        raise ValueError("every sample is in a zero-variance group (B == M): skip this step instead of dividing by 0")
    return float(num_samples) / float(num_samples - num_zero_variance)


def valid_fraction(num_samples: int | float, num_zero_variance: int | float) -> float:
    """``(B - M) / B`` = 1/α; 0.0 when ``B == 0``."""
    return 0.0 if num_samples <= 0 else float(num_samples - num_zero_variance) / float(num_samples)


def needs_more_groups(num_samples: int | float, num_zero_variance: int | float, min_valid_fraction: float) -> bool:
    """β_th threshold resampling: draw more prompts while ``(B - M) / B < min_valid_fraction``.

    ``min_valid_fraction = 0`` never resamples. ``needs_more_groups(8, 6, 0.4)`` → True (0.25 < 0.4).
    """
    return valid_fraction(num_samples, num_zero_variance) < min_valid_fraction


# --------------------------------------------------------------------------------------------------------------------
# Token losses
# --------------------------------------------------------------------------------------------------------------------


def reinforce_token_loss(logp: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
    """GPG: ``ℓ_it = -A_i · log π_θ(o_it)``; ``logp [N, T]``, ``advantages [N]``. (No ratio, no clip.)"""
    return -advantages[:, None] * logp


def _clipped_surrogate(ratio: torch.Tensor, a: torch.Tensor, low: float, high: float | None) -> torch.Tensor:
    """``-min(ρ A, clip(ρ, 1 - low, 1 + high) A)``; ``high = None`` is the symmetric ``high = low``."""
    return -torch.minimum(ratio * a, torch.clamp(ratio, 1.0 - low, 1.0 + (low if high is None else high)) * a)


def _per_token(advantages: torch.Tensor) -> torch.Tensor:
    return advantages if advantages.ndim == 2 else advantages[:, None]


def clipped_ratio_token_loss(logp: torch.Tensor, advantages: torch.Tensor, old_logp: torch.Tensor | None = None,
                             clip_eps: float = 0.2, clip_eps_high: float | None = None,
                             dual_clip: float | None = None) -> torch.Tensor:
    """GRPO/PPO: ``ℓ_it = -min(ρ_it A_i, clip(ρ_it, 1-ε, 1+ε_high) A_i)`` with ``ρ = exp(logp - old_logp)``;
    ``clip_eps_high = None`` is the symmetric ``ε_high = ε``, DAPO's clip-higher sets ``ε = 0.2, ε_high = 0.28``.

    With ``old_logp = None`` the ratio is taken against ``logp.detach()`` (one update per rollout batch): its value
    is 1, and its gradient is exactly GPG's ``-A ∇log π``. DAPO, A = +1, ρ = 1.25: ``-1.25`` (symmetric 0.2:
    ``-1.2``); A = -1, ρ = 0.75: ``0.8`` in both (the low side stays at 1 - 0.2).

    ``dual_clip = C`` (dual-clip PPO, Ye et al. 2020, arXiv 1912.09729; verl's ``clip_ratio_c``, 3 by default there):
    for ``A_i < 0`` the loss is also capped, ``ℓ_it = min(ℓ_it, -C A_i)``, so a token whose ratio grew above ``C``
    adds a constant and no gradient. ε = 0.2, C = 3, A = -1: ρ = 5 → ``min(5, 3) = 3``; ρ = 2 → ``2``; A = -2, ρ = 4 →
    ``min(8, 6) = 6``; A = +1, ρ = 5 → ``-1.2`` (unchanged).
    """
    old = logp.detach() if old_logp is None else old_logp
    a = _per_token(advantages)
    loss = _clipped_surrogate(torch.exp(logp - old), a, clip_eps, clip_eps_high)
    if dual_clip is None:
        return loss
    return torch.where(a < 0, torch.minimum(loss, -dual_clip * a), loss)


def _sequence_log_ratio(logp: torch.Tensor, old: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[N, 1]``: ``(1/|o_i|) Σ_t (logp - old)`` over the valid tokens of each row."""
    m = mask.to(logp.dtype)
    return (((logp - old) * m).sum(dim=1) / m.sum(dim=1).clamp(min=1))[:, None]


def gspo_sequence_token_loss(logp: torch.Tensor, advantages: torch.Tensor, old_logp: torch.Tensor | None = None, *,
                             mask: torch.Tensor, clip_eps: float = 3e-4, clip_eps_high: float | None = 4e-4):
    """GSPO (Zheng et al. 2025): the length-normalised sequence ratio ``s_i = exp((1/|o_i|) Σ_t (logp - old_logp))``,
    clipped per sequence, ``ℓ_i = -min(s_i A_i, clip(s_i, 1-ε, 1+ε_high) A_i)`` (GSPO: ε = 3e-4, ε_high = 4e-4),
    returned on every token of row i so that ``seq_mean_token_mean`` gives GSPO's ``(1/B) Σ_i ℓ_i``. ``mask`` is the
    completion mask (the mean runs over valid tokens only).

    Log ratios [0.001, 0.003]: s = e^0.002 = 1.002002; A = +1 → clipped to ``-1.0004``; A = -1 → ``1.002002``.
    """
    old = logp.detach() if old_logp is None else old_logp
    ratio = torch.exp(_sequence_log_ratio(logp, old, mask))
    return _clipped_surrogate(ratio, advantages[:, None], clip_eps, clip_eps_high).expand_as(logp)


def gspo_token_level_token_loss(logp: torch.Tensor, advantages: torch.Tensor, old_logp: torch.Tensor | None = None, *,
                                mask: torch.Tensor, clip_eps: float = 3e-4, clip_eps_high: float | None = 4e-4):
    """GSPO-token: ``s_it = sg[s_i] · π(o_it) / sg[π(o_it)]`` (value s_i, gradient through its own token only), in the
    clipped surrogate with per-token advantages ``A_it`` (``[N, T]``, or ``[N]`` for one per sequence). With
    ``A_it = A_i`` its gradient equals GSPO's. Values as :func:`gspo_sequence_token_loss` (1.002002 → ``-1.0004``).
    """
    old = logp.detach() if old_logp is None else old_logp
    log_s = _sequence_log_ratio(logp, old, mask).detach() + logp - logp.detach()
    return _clipped_surrogate(torch.exp(log_s), _per_token(advantages), clip_eps, clip_eps_high)


def cispo_token_loss(logp: torch.Tensor, advantages: torch.Tensor, old_logp: torch.Tensor | None = None,
                     clip_eps_high: float | None = 4.0, cispo_eps_low: float | None = None) -> torch.Tensor:
    """CISPO (MiniMax-M1): ``ℓ_it = -sg[clip(ρ_it, 1-ε_low, 1+ε_high)] · A_i · log π(o_it)``: the clipped ratio is a
    stop-gradient weight, so clipped tokens still get REINFORCE's gradient. As TRL's ``loss_type="cispo"``
    (``clamp(ρ, max=epsilon_high)``, recommended ``epsilon_high = 5.0``): no lower bound (``cispo_eps_low = None``) and
    ``ε_high = 4.0``. With ``old_logp = None`` (ρ = 1) it is GPG's loss exactly.

    π = 0.6, π_old = 0.1, A = 1: ρ = 6 → weight 5 → ``-5 log 0.6 = 2.55413``; ρ = 0.5 keeps weight 0.5.
    """
    if clip_eps_high is None:
        raise ValueError("CISPO needs an upper bound on its weight: set clip_eps_high (4.0: TRL's epsilon_high = 5)")
    old = logp.detach() if old_logp is None else old_logp
    weight = torch.clamp(torch.exp(logp - old), None if cispo_eps_low is None else 1.0 - cispo_eps_low,
                         1.0 + clip_eps_high).detach()
    return -weight * _per_token(advantages) * logp


# gspo* take the completion mask as well (keyword ``mask``): the trainer passes it with the log-probs.


def overlong_penalty(lengths: torch.Tensor, max_len: int, cache_len: int) -> torch.Tensor:
    """DAPO's soft overlong punishment (eq. 13), added to the reward: 0 while ``L <= L_max - L_cache``, then
    ``((L_max - L_cache) - L) / L_cache`` (linear down to -1 at L_max), -1 beyond (DAPO: L_max = 20480, L_cache = 4096;
    verl's overlong buffer with penalty_factor 1). L_max = 20, L_cache = 4: L = 16, 17, 20, 21 → ``0, -0.25, -1, -1``.
    """
    if not 0 < cache_len <= max_len:
        raise ValueError(f"need 0 < cache_len <= max_len; got cache_len={cache_len}, max_len={max_len}")
    exceed = lengths.double() - (max_len - cache_len)
    return (-exceed / cache_len).clamp(min=-1.0, max=0.0)


def overlong_filter_mask(mask: torch.Tensor, truncated: torch.Tensor) -> torch.Tensor:
    """DAPO's overlong filtering (TRL ``mask_truncated_completions``): the completion mask ``[N, T]`` with the rows of
    truncated completions (``truncated [N]``: no EOS within max_new_tokens) cleared, so they add nothing to the loss
    nor to the token counts of the denominator. ``[[1, 1], [1, 1]]``, truncated ``[False, True]`` → ``[[1, 1], [0, 0]]``.
    """
    return mask & ~truncated.to(torch.bool)[:, None]


def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k1 estimator of KL(π_θ ‖ π_ref): ``logp - ref`` (unbiased, can be negative).

    Gradient as a loss: ``∇k1 = ∇log π_θ(o)``, whose on-policy expectation ``E_π[∇log π] = 0``: differentiated as a
    loss term k1 pulls nothing toward π_ref in expectation (it only adds variance). ``kl_k1(log 0.5, log 0.25)`` =
    ``log 2`` = ``0.69315``.
    """
    return logp - ref_logp


def kl_k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k2 estimator: ``½ (logp - ref)²`` (≥ 0, biased as a KL value).

    Gradient as a loss: ``∇k2 = log(π_θ/π_ref)(o) · ∇log π_θ(o)``, whose on-policy expectation is
    ``E_π[log(π/π_ref) ∇log π] = ∇ KL(π_θ ‖ π_ref)``: the **reverse**-KL gradient that the success-amplification
    paper (Mroueh 2025) analyses; its stationary points are the paper's fixed points ``logit p = logit p_ref + Ω/β``.
    ``kl_k2(log 0.5, log 0.25)`` = ``½ (log 2)²`` = ``0.24023``.
    """
    d = logp - ref_logp
    return 0.5 * d * d


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(π_θ ‖ π_ref): ``exp(ref - logp) - (ref - logp) - 1`` (≥ 0, unbiased).

    Gradient as a loss: ``∇k3 = (1 - π_ref/π_θ)(o) · ∇log π_θ(o)``, whose on-policy expectation is
    ``E_π[∇log π] - E_{π_ref}[∇log π] = ∇ KL(π_ref ‖ π_θ)``: the **forward**-KL gradient (TRL's GRPO, the GPG forks,
    verl's low_var_kl). In a binary-outcome model its stationary point solves ``β (p - p_ref) = p (1-p) Ω(p)``, not
    the paper's recursion (see :mod:`mmgpg.theory.predict`).
    ``kl_k3(log 0.5, log 0.25)``: d = log 0.5 → ``0.5 - log 0.5 - 1`` = ``0.19315``.
    """
    d = ref_logp - logp
    return torch.exp(d) - d - 1.0




# --------------------------------------------------------------------------------------------------------------------
# Aggregation over tokens
# --------------------------------------------------------------------------------------------------------------------

def _token_sum(token_loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (token_loss * mask.to(token_loss.dtype)).sum()


def _sequence_means_sum(token_loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.to(token_loss.dtype)
    return ((token_loss * m).sum(dim=1) / m.sum(dim=1).clamp(min=1)).sum()


@dataclass(frozen=True)
class Aggregation:
    """How per-token losses become one number: ``numerator(token_loss, mask)`` summed over micro-batches and ranks,
    divided by one global ``denominator(num_sequences, num_tokens, max_new_tokens)`` of the whole optimizer step."""

    numerator: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    denominator: Callable[[int, int, int], float]


# The aggregations (registered by name in mmgpg.registry.AGGREGATIONS):
# token_mean (GPG paper, DAPO): Σ_i Σ_t ℓ_it / Σ_i |o_i|
TOKEN_MEAN = Aggregation(_token_sum, lambda sequences, tokens, max_new: float(max(tokens, 1)))
# seq_mean_token_mean (GPG multimodal code, TRL loss_type="grpo"): Σ_i (Σ_t ℓ_it / |o_i|) / N
SEQ_MEAN_TOKEN_MEAN = Aggregation(_sequence_means_sum, lambda sequences, tokens, max_new: float(max(sequences, 1)))
# constant_length (Dr. GRPO): Σ_i Σ_t ℓ_it / (N · max_new_tokens)
CONSTANT_LENGTH = Aggregation(_token_sum, lambda sequences, tokens, max_new: float(max(sequences, 1) * max_new))


def token_loss_sum(token_loss: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    """The numerator of the aggregated loss over these rows; divide by :func:`aggregation_denominator`.

    * ``token_mean`` (GPG paper; Dr. GRPO's ``constant_length`` has the same numerator): ``Σ_i Σ_t ℓ_it``;
    * ``seq_mean_token_mean`` (GPG multimodal code, TRL ``loss_type="grpo"``): ``Σ_i (Σ_t ℓ_it / |o_i|)``.
    """
    return _aggregation(mode).numerator(token_loss, mask)


def aggregation_denominator(mode: str, num_sequences: int, num_tokens: int, max_new_tokens: int) -> float:
    """The global denominator: tokens (``token_mean``), sequences (``seq_mean_token_mean``) or
    sequences × ``max_new_tokens`` (``constant_length``, Dr. GRPO). Counts are over the whole optimizer step."""
    return _aggregation(mode).denominator(num_sequences, num_tokens, max_new_tokens)


def _aggregation(mode: str) -> Aggregation:
    if mode not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {', '.join(AGGREGATIONS)}; got {mode!r}")
    return AGGREGATIONS[mode]


def aggregate_tokens(token_loss: torch.Tensor, mask: torch.Tensor, mode: str,
                     max_new_tokens: int | None = None) -> torch.Tensor:
    """Local aggregation of one batch: ``token_loss_sum / aggregation_denominator`` with this batch's own counts.

    ``[[1, 2, 0], [4, 0, 0]]`` with mask ``[[1, 1, 0], [1, 0, 0]]``: token_mean = 7/3, seq_mean_token_mean =
    (1.5 + 4)/2 = 2.75, constant_length (T = 3) = 7/6.
    """
    num_tokens = int(mask.sum())
    denominator = aggregation_denominator(mode, token_loss.shape[0], num_tokens,
                                          max_new_tokens if max_new_tokens is not None else token_loss.shape[1])
    return token_loss_sum(token_loss, mask, mode) / denominator
