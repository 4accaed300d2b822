"""Rollout correction (``algo.rollout_correction``): importance weights of the trained policy against the rollout
engine's behaviour log-probs, as small pure functions (selected by name in :data:`mmgpg.registry.ROLLOUT_CORRECTIONS`),
and the step's ``rollout_is/*`` metrics over all ranks.

The engine samples o ~ μ (its own weights, kernels and precision; weights one or more versions old in an
asynchronous run); the trainer's gradient is for π. With d_it = log π_prox(o_it) − log μ(o_it), where π_prox is the
trainer's policy at the weights the update starts from (detached: the current log-probs on the only update, the old
log-probs when algo.updates_per_batch > 1 — the proximal policy of decoupled PPO), each per-token loss ℓ_it is
multiplied by a detached weight w_it before aggregation:

* ``token_tis``  w_it = min(exp(d_it), C): truncated IS per token (Yao et al. 2025, "Your efficient RL framework
  secretly brings you off-policy RL training"; verl ``rollout_is=token``);
* ``seq_tis``    w_it = min(exp(Σ_t d_it), C): truncated IS per sequence (verl ``rollout_is=sequence``);
* ``seq_mis``    w_it = exp(Σ_t d_it) · 1[exp(Σ_t d_it) ≤ C]: masked IS, a sequence whose ratio exceeds C is left out
  (Liu, Li et al. 2025, "When speed kills stability").

C = ``algo.rollout_correction_bound`` > 1. GPG's α = B/(B − M) multiplies the whole policy term, so the loss is
α · Σ w_it ℓ_it / denominator: α rescales for the zero-variance groups of the batch, w reweights single samples; the
two commute and neither changes the denominator.
"""

from __future__ import annotations

import math

import torch

from mmgpg import distributed


def rollout_log_ratio(logp_prox: torch.Tensor, logp_behaviour: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``d = log π_prox − log μ`` per token in float64, 0 outside ``mask`` (both ``[N, T]``, detached). A NaN or
    infinite value inside the mask is an error naming its rows (a NaN ratio would silently zero or explode a loss).

    ``log π_prox = [[-1.0, -2.0]]``, ``log μ = [[-1.5, -2.0]]``, mask ``[[1, 1]]`` → ``[[0.5, 0.0]]``.
    """
    d = (logp_prox.detach().double() - logp_behaviour.detach().to(logp_prox.device).double())
    d = torch.where(mask, d, torch.zeros_like(d))
    bad = ~torch.isfinite(d) & mask
    if bad.any():
        rows = sorted(set(bad.nonzero()[:, 0].tolist()))
        raise ValueError(f"rollout correction: the log-prob ratio of rows {rows[:10]} is NaN or infinite (the "
                         "engine's or the trainer's log-prob of a sampled token is NaN/inf, or the engine sampled a "
                         "token the trainer gives probability 0)")
    return d


def _sequence_log_ratios(log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (log_ratio * mask).sum(dim=1, keepdim=True)


def no_rollout_correction(log_ratio: torch.Tensor, mask: torch.Tensor, bound: float) -> torch.Tensor:
    """Weight 1 on every masked-in token (today's loss)."""
    return mask.to(log_ratio.dtype)


def token_tis_weights(log_ratio: torch.Tensor, mask: torch.Tensor, bound: float) -> torch.Tensor:
    """``w_it = min(exp(d_it), C)``, 0 outside the mask.

    ``d = [[ln 2, ln 0.5, 0], [ln 3, 0, 0]]``, mask ``[[1, 1, 0], [1, 0, 0]]``, C = 2.5 →
    ``[[2, 0.5, 0], [2.5, 0, 0]]``.
    """
    return log_ratio.exp().clamp(max=bound) * mask


def seq_tis_weights(log_ratio: torch.Tensor, mask: torch.Tensor, bound: float) -> torch.Tensor:
    """``w_it = min(exp(Σ_t d_it), C)`` on every token of sequence i.

    The example of :func:`token_tis_weights`: row 0's ratio 2 · 0.5 = 1, row 1's 3 → C → ``[[1, 1, 0], [2.5, 0, 0]]``.
    """
    return _sequence_log_ratios(log_ratio, mask).exp().clamp(max=bound) * mask


def seq_mis_weights(log_ratio: torch.Tensor, mask: torch.Tensor, bound: float) -> torch.Tensor:
    """``w_it = ρ_i · 1[ρ_i ≤ C]``, ``ρ_i = exp(Σ_t d_it)``: a sequence above the bound is masked out, the others
    keep their ratio. The example of :func:`token_tis_weights` → ``[[1, 1, 0], [0, 0, 0]]``.
    """
    ratio = _sequence_log_ratios(log_ratio, mask).exp()
    return torch.where(ratio <= bound, ratio, torch.zeros_like(ratio)) * mask


def rollout_correction_stats(log_ratio: torch.Tensor, weights: torch.Tensor, mask: torch.Tensor, *, level: str,
                             bound: float) -> tuple[float, float, float, float, float]:
    """This rank's ``(Σ w, Σ w², n, n above C, max log ratio)`` over the correction's units: the masked-in tokens
    (``level="token"``) or the sequences with at least one (``"sequence"``). Sum the first four over ranks and take
    the max of the last; then mean = Σw / n, effective sample size ESS = (Σw)² / (n Σw²) ∈ (0, 1] (1: all weights
    equal), the bounded share = n above C / n.

    Token level, the example of :func:`token_tis_weights`: w = 2, 0.5, 2.5 → (5, 10.5, 3, 1, ln 3).
    """
    if level == "token":
        w, d = weights[mask], log_ratio[mask]
    else:
        rows = mask.any(dim=1)
        w, d = weights[rows, mask[rows].long().argmax(dim=1)], _sequence_log_ratios(log_ratio, mask)[rows, 0]
    w = w.double()
    return (float(w.sum()), float((w * w).sum()), float(w.numel()), float((d > math.log(bound)).sum()),
            float(d.max()) if d.numel() else -math.inf)


def step_metrics(stats: list[tuple[float, ...]], comm_device) -> dict[str, float]:
    """``rollout_is/*`` of the step from each micro-batch's :func:`rollout_correction_stats`, over
    all ranks (collective): mean weight, the largest raw ratio (before the bound), the share of units (tokens or
    sequences) above the bound (truncated, or masked by seq_mis) and the normalised effective sample size."""
    sums = [sum(s[k] for s in stats) for k in range(4)]
    total, squares, n, above = distributed.all_sum(sums, comm_device)
    most = distributed.all_max(max((s[4] for s in stats), default=-math.inf), comm_device)
    return {"rollout_is/mean": total / n if n else float("nan"),
            "rollout_is/max": math.exp(min(most, 700.0)) if most > -math.inf else float("nan"),
            "rollout_is/truncated_fraction": above / n if n else float("nan"),
            "rollout_is/ess": total * total / (n * squares) if n and squares else float("nan")}
