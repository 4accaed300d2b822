"""Exact identities between the project's own loss code and mmgpg.theory.predict, in a one-token outcome model.

The policy has one parameter z, p = σ(z): a completion is one token, "success" (log σ(z)) or "failure" (log σ(-z)),
and its reward is the success indicator. The expected gradient of a training step is computed *exactly*: for every
configuration of successes (k_1..k_P) over P groups of G, weighted by its binomial probability, the step's loss is
built the way Trainer.update builds it — mmgpg.algorithms' advantage, zero-variance mask, α, token loss, KL estimator,
token_loss_sum / aggregation_denominator — and differentiated by autograd. No sampling; tolerances are floating-point
ones (1e-12 relative for identities, 1e-6 on root locations as the issue asks).
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from scipy.optimize import brentq

from mmgpg import algorithms as A
from mmgpg.theory.predict import (
    batch_weight,
    binomial_pmf,
    group_weight,
    k3_stationary_points,
    logit,
    omega_group,
    reverse_kl_fixed_points,
    zero_variance_probability,
)


def expected_ascent(z: float, G: int, *, P: int = 1, advantage: str = "group_mean", std_eps: float = 1e-4,
                    token_loss: str = "reinforce", aggregation: str = "seq_mean_token_mean", alpha: bool = False,
                    beta: float = 0.0, estimator: str = "k3", p_ref: float = 0.5) -> float:
    """E[-dLoss/dz] over k_j ~ Bin(G, σ(z)), j = 1..P, with the trainer's loss composition."""
    zt = torch.tensor(z, dtype=torch.float64, requires_grad=True)
    p = 1.0 / (1.0 + math.exp(-z))
    pmf = binomial_pmf(G, p)
    ref_s, ref_f = math.log(p_ref), math.log1p(-p_ref)
    total = 0.0
    for ks in itertools.product(range(G + 1), repeat=P):
        weight = float(math.prod(pmf[k] for k in ks))
        rewards = torch.tensor([[1.0] * k + [0.0] * (G - k) for k in ks], dtype=torch.float64)
        num_samples, num_zero = P * G, G * int(A.zero_variance_mask(rewards).sum())
        fn = A.ADVANTAGES[advantage]
        whitened = getattr(fn, "batch_moments_of", None)  # REINFORCE++: the batch's moments, one token per sample
        signal = bool(rewards.max() > rewards.min()) if whitened else num_samples > num_zero
        if not signal and beta == 0:
            continue  # the trainer skips the step
        moments = (A.batch_moments(whitened(rewards)),) if whitened else ()
        adv = A.bind(fn, std_eps=std_eps)(rewards, *moments).reshape(-1)
        a = A.gpg_alpha(num_samples, num_zero) if alpha and num_samples > num_zero else 1.0
        success = rewards.reshape(-1, 1) == 1.0
        logp = torch.where(success, torch.nn.functional.logsigmoid(zt), torch.nn.functional.logsigmoid(-zt))
        ref = torch.where(success, torch.tensor(ref_s, dtype=torch.float64), torch.tensor(ref_f, dtype=torch.float64))
        mask = torch.ones_like(logp, dtype=torch.bool)
        den = A.aggregation_denominator(aggregation, num_samples, num_samples, 1)
        loss = a * A.token_loss_sum(A.bind(A.TOKEN_LOSSES[token_loss], clip_eps=0.2)(logp, adv), mask, aggregation) / den
        if beta > 0:
            loss = loss + beta * A.token_loss_sum(A.KL_ESTIMATORS[estimator](logp, ref), mask, aggregation) / den
        (g,) = torch.autograd.grad(loss, zt)
        total += weight * -float(g)
    return total


@pytest.mark.parametrize("G", [2, 4, 8])
@pytest.mark.parametrize("p", [0.03, 0.3, 0.5, 0.85])
def test_gpg_expected_gradient(G, p):
    """GPG (A = r - mean, α = 1): E[grad] = (1 - 1/G) p (1 - p)."""
    got = expected_ascent(logit(p), G)
    assert got == pytest.approx((1 - 1 / G) * p * (1 - p), rel=1e-12)


@pytest.mark.parametrize("P", [1, 2, 3])
@pytest.mark.parametrize("p", [0.1, 0.6])
def test_gpg_alpha_expected_gradient(P, p):
    """GPG with α = B/(B-M) over P groups: (1 - 1/G) p(1-p) (1 - P0^P)/(1 - P0), P0 = p^G + (1-p)^G."""
    G = 4
    p0 = zero_variance_probability(p, G)
    got = expected_ascent(logit(p), G, P=P, alpha=True)
    assert got == pytest.approx((1 - 1 / G) * p * (1 - p) * (1 - p0**P) / (1 - p0), rel=1e-12)


@pytest.mark.parametrize("advantage", ["group_zscore", "group_stabilized"])
@pytest.mark.parametrize("p", [0.01, 0.2, 0.5, 0.9])
def test_grpo_omega_matches_closed_form(advantage, p):
    """GRPO's expected gradient / (p(1-p)) is theory.omega_group (TRL-style std + 1e-4 and sqrt(var + eps))."""
    G = 8
    got = expected_ascent(logit(p), G, advantage=advantage, token_loss="clipped_ratio") / (p * (1 - p))
    assert got == pytest.approx(omega_group(p, G, advantage, 1e-4), rel=1e-10)


@pytest.mark.parametrize(("estimator", "theory_fn"), [("k3", k3_stationary_points), ("k2", reverse_kl_fixed_points)])
@pytest.mark.parametrize(("beta", "p_ref"), [(0.5, 0.2), (2.0, 0.05)])
def test_grpo_kl_stationary_point(estimator, theory_fn, beta, p_ref):
    """The root of the code's exact expected GRPO + KL gradient equals theory's k3 formula (β(p - p_ref) =
    p(1-p)Ω_G(p)) for k3 and the reverse-KL recursion (logit p = logit p_ref + Ω_G(p)/β) for k2, to 1e-6."""
    G = 8
    kwargs = dict(advantage="group_zscore", token_loss="clipped_ratio", beta=beta, estimator=estimator, p_ref=p_ref)
    predicted = theory_fn(p_ref, beta, group_weight(G, "group_zscore", 1e-4))
    assert len(predicted) == 1
    z_ref = logit(p_ref)
    assert expected_ascent(z_ref, G, **kwargs) > 0  # pushed up at p_ref
    z_star = brentq(lambda z: expected_ascent(z, G, **kwargs), z_ref, 15.0, xtol=1e-12)
    p_star = 1 / (1 + math.exp(-z_star))
    assert p_star == pytest.approx(predicted[0]["p"], abs=1e-6)
    other = (reverse_kl_fixed_points if estimator == "k3" else k3_stationary_points)(
        p_ref, beta, group_weight(G, "group_zscore", 1e-4))
    assert abs(p_star - other[0]["p"]) > 1e-3  # the two KL conventions are distinguishable here


@pytest.mark.parametrize("G", [2, 4, 8])
@pytest.mark.parametrize("p", [0.05, 0.5, 0.8])
def test_rloo_omega_is_one(G, p):
    """RLOO (A = r - mean of the others = G/(G-1) (r - mean)): E[grad] = p(1-p) exactly, Ω_G ≡ 1."""
    assert expected_ascent(logit(p), G, advantage="rloo") == pytest.approx(p * (1 - p), rel=1e-12)
    assert omega_group(p, G, "rloo", 0.0) == pytest.approx(1.0, rel=1e-12)


@pytest.mark.parametrize("advantage", ["reinforce_pp", "reinforce_pp_baseline"])
@pytest.mark.parametrize(("P", "G"), [(3, 2), (2, 4)])
@pytest.mark.parametrize("p", [0.03, 0.4, 0.9])
def test_batch_whitened_omega_matches_the_code(advantage, P, G, p):
    """REINFORCE++(-baseline) over a batch of P groups of one prompt: the code's exact expected gradient (moments of
    the whole batch, clipped ratio at ratio 1, token mean) / (p(1-p)) is theory's batch weight Ω_B."""
    got = expected_ascent(logit(p), G, P=P, advantage=advantage, std_eps=1e-8, token_loss="clipped_ratio",
                          aggregation="token_mean") / (p * (1 - p))
    assert got == pytest.approx(batch_weight(G, P, advantage, 1e-8).omega(p, 1 - p), rel=1e-10)


def test_batch_whitened_k3_stationary_point():
    """REINFORCE++ + k3 (β = 0.5, p_ref = 0.2, P = 2 groups of 3): the root of the code's expected gradient is
    theory's k3 point with Ω_B, to 1e-6."""
    G, P, beta, p_ref = 3, 2, 0.5, 0.2
    kwargs = dict(P=P, advantage="reinforce_pp", std_eps=1e-8, token_loss="clipped_ratio", aggregation="token_mean",
                  beta=beta, estimator="k3", p_ref=p_ref)
    predicted = k3_stationary_points(p_ref, beta, batch_weight(G, P, "reinforce_pp", 1e-8))
    z_star = brentq(lambda z: expected_ascent(z, G, **kwargs), logit(p_ref), 15.0, xtol=1e-12)
    assert 1 / (1 + math.exp(-z_star)) == pytest.approx(predicted[0]["p"], abs=1e-6)
