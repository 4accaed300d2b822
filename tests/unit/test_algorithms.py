"""mmgpg.algorithms against hand-computed numbers (worked in the comments) and analytic gradients."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mmgpg.algorithms import (
    aggregate_tokens,
    aggregation_denominator,
    clipped_ratio_token_loss,
    gpg_alpha,
    group_mean_advantages,
    group_stabilized_advantages,
    group_zscore_advantages,
    kl_k3,
    needs_more_groups,
    reinforce_token_loss,
    token_loss_sum,
    valid_fraction,
    zero_variance_mask,
)

# The issue's example: two groups of G=4, rewards [1,0,0,1 | 1,1,1,1].
R = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]])


def test_issue_example_advantages_mask_alpha():
    # group 0: mean 0.5 -> A = r - 0.5; group 1: mean 1 -> A = 0
    assert group_mean_advantages(R).tolist() == [[0.5, -0.5, -0.5, 0.5], [0.0, 0.0, 0.0, 0.0]]
    assert zero_variance_mask(R).tolist() == [False, True]
    # B = 8 samples, M = 4 in the zero-variance group -> alpha = 8 / 4 = 2, valid fraction 1/2
    assert gpg_alpha(8, 4) == 2.0
    assert valid_fraction(8, 4) == 0.5
    assert needs_more_groups(8, 4, 0.4) is False  # 0.5 >= 0.4
    assert needs_more_groups(8, 6, 0.4) is True  # 0.25 < 0.4
    assert needs_more_groups(8, 8, 0.0) is False  # beta_th = 0 never resamples


def test_alpha_is_b_over_b_minus_m_in_an_asymmetric_case():
    # B = 12, M = 3: alpha = 12 / (12 - 3) = 4/3 = 1.3333; B/M would give 4 and (B-M)/B 0.75 (the B = 2M case
    # above cannot tell B/(B-M) from B/M: both are 2).
    assert gpg_alpha(12, 3) == pytest.approx(4 / 3, abs=1e-15)
    assert valid_fraction(12, 3) == 0.75
    assert gpg_alpha(12, 0) == 1.0  # no zero-variance group: no correction


def test_zscore_uses_unbiased_std_plus_eps():
    # group 0: std (n-1) = sqrt(((0.5^2) * 4) / 3) = sqrt(1/3) = 0.577350; A = +-0.5 / (0.577350 + 1e-4)
    a = group_zscore_advantages(R, std_eps=1e-4)
    expected = 0.5 / (math.sqrt(1 / 3) + 1e-4)  # 0.865875
    assert a[0].tolist() == pytest.approx([expected, -expected, -expected, expected], abs=1e-6)
    assert a[1].tolist() == [0.0, 0.0, 0.0, 0.0]  # zero-variance group: 0 / (0 + eps)
    assert group_zscore_advantages(torch.tensor([[3.0]])).tolist() == [[0.0]]  # G = 1: no NaN


def test_stabilized_uses_population_variance():
    # p = 0.5: var = p(1-p) = 0.25; eps 0.01 -> 0.5 / sqrt(0.26) = 0.980581
    a = group_stabilized_advantages(R, std_eps=0.01)
    assert a[0, 0].item() == pytest.approx(0.5 / math.sqrt(0.26), abs=1e-6)
    # binary rewards with p = 1/4: omega+ = (1-p)/sqrt(p(1-p)+eps) = 0.75/sqrt(0.1875+0.01)
    b = group_stabilized_advantages(torch.tensor([[1.0, 0.0, 0.0, 0.0]]), std_eps=0.01)
    assert b[0, 0].item() == pytest.approx(0.75 / math.sqrt(0.1975), abs=1e-6)
    assert b[0, 1].item() == pytest.approx(-0.25 / math.sqrt(0.1975), abs=1e-6)


def test_zero_variance_tolerance_and_errors():
    near = torch.tensor([[0.5, 0.5 + 1e-7, 0.5]])
    assert zero_variance_mask(near).tolist() == [False]
    assert zero_variance_mask(near, tol=1e-6).tolist() == [True]
    with pytest.raises(ValueError):
        zero_variance_mask(torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError):
        zero_variance_mask(near, tol=-1)
    with pytest.raises(ValueError, match="skip this step"):
        gpg_alpha(8, 8)
    with pytest.raises(ValueError):
        gpg_alpha(0, 0)
    with pytest.raises(ValueError):
        gpg_alpha(4, 5)
    assert valid_fraction(0, 0) == 0.0


def test_token_losses_hand_computed():
    logp = torch.tensor([[math.log(0.5), math.log(0.25)]])
    adv = torch.tensor([2.0])
    # reinforce: -A * logp = [2 log 2, 2 log 4]
    assert reinforce_token_loss(logp, adv)[0].tolist() == pytest.approx([2 * math.log(2), 4 * math.log(2)])
    # clipped ratio with old = log(0.25) everywhere: ratio = [2, 1]; eps 0.2 -> min(2*2, 1.2*2) = 2.4 ; min(2, 2) = 2
    old = torch.full_like(logp, math.log(0.25))
    assert clipped_ratio_token_loss(logp, adv, old, clip_eps=0.2)[0].tolist() == pytest.approx([-2.4, -2.0])
    # negative advantage: ratio 2 -> min(2*-2, 1.2*-2) = -4 -> loss 4
    assert clipped_ratio_token_loss(logp, -adv, old, 0.2)[0, 0].item() == pytest.approx(4.0)
    # k3: d = log .25 - log .5 = -log 2 -> 0.5 + log 2 - 1 = 0.193147
    assert kl_k3(logp[:, :1], torch.tensor([[math.log(0.25)]])).item() == pytest.approx(0.5 + math.log(2) - 1)
    assert kl_k3(logp, logp).abs().max().item() == 0.0


def test_aggregations_hand_computed():
    loss = torch.tensor([[1.0, 2.0, 9.0], [4.0, 9.0, 9.0]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    assert aggregate_tokens(loss, mask, "token_mean").item() == pytest.approx(7 / 3)
    assert aggregate_tokens(loss, mask, "seq_mean_token_mean").item() == pytest.approx((1.5 + 4) / 2)
    assert aggregate_tokens(loss, mask, "constant_length").item() == pytest.approx(7 / 6)
    assert aggregate_tokens(loss, mask, "constant_length", max_new_tokens=7).item() == pytest.approx(7 / 14)
    assert token_loss_sum(loss, mask, "seq_mean_token_mean").item() == pytest.approx(5.5)
    assert aggregation_denominator("token_mean", 2, 0, 8) == 1.0  # never 0
    with pytest.raises(ValueError):
        aggregate_tokens(loss, mask, "sum")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        aggregation_denominator("sum", 1, 1, 1)  # type: ignore[arg-type]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(st.integers(0, 1), min_size=4, max_size=4), min_size=1, max_size=6))
def test_micro_batch_sums_add_up_to_the_global_loss(rows):
    """Micro-batch numerators over the global denominator equal the aggregation computed independently with plain
    Python loops over rows and tokens."""
    g = torch.Generator().manual_seed(len(rows))
    loss = torch.randn(len(rows), 4, generator=g, dtype=torch.float64)
    mask = torch.tensor(rows, dtype=torch.bool)
    values = [[float(loss[i, t]) for t in range(4) if rows[i][t]] for i in range(len(rows))]
    tokens = sum(len(v) for v in values)
    expected = {
        "token_mean": sum(sum(v) for v in values) / max(tokens, 1),
        "seq_mean_token_mean": sum(sum(v) / len(v) for v in values if v) / len(rows),
        "constant_length": sum(sum(v) for v in values) / (len(rows) * 4),
    }
    for mode, want in expected.items():
        den = aggregation_denominator(mode, len(rows), int(mask.sum()), 4)
        parts = sum(token_loss_sum(loss[i : i + 1], mask[i : i + 1], mode) for i in range(len(rows))) / den
        assert parts.item() == pytest.approx(want, abs=1e-12)
        assert aggregate_tokens(loss, mask, mode).item() == pytest.approx(want, abs=1e-12)


def test_gpg_gradient_on_a_toy_softmax_policy_is_the_analytic_reinforce_gradient():
    """One prompt, a categorical policy over 5 actions (logits θ), G = 4 sampled actions plus a second, zero-variance
    group. GPG loss with α and token_mean (1 token per sequence):
        L = -α / B · Σ_i A_i log π(a_i),   ∂L/∂θ = -α / B · Σ_i A_i (onehot(a_i) - π)
    where the zero-variance group has A = 0 and B counts all 8 samples, so α / B = 1 / 4."""
    theta = torch.tensor([0.3, -1.0, 0.5, 0.0, 2.0], dtype=torch.float64, requires_grad=True)
    actions = torch.tensor([0, 2, 2, 4, 1, 1, 3, 3])
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]], dtype=torch.float64)
    logp = torch.log_softmax(theta, -1)[actions][:, None]  # [8, 1]: one token each
    adv = group_mean_advantages(rewards).flatten()
    alpha = gpg_alpha(8, int(zero_variance_mask(rewards).sum()) * 4)
    loss = alpha * aggregate_tokens(reinforce_token_loss(logp, adv), torch.ones(8, 1, dtype=torch.bool), "token_mean")
    loss.backward()
    pi = torch.softmax(theta.detach(), -1)
    analytic = -(alpha / 8) * sum(adv[i] * (torch.nn.functional.one_hot(actions[i], 5) - pi) for i in range(8))
    torch.testing.assert_close(theta.grad, analytic, atol=1e-12, rtol=0)
    # hand check of one coordinate: A = [.5,-.5,-.5,.5]; d/dθ_4 = -(1/4)[.5(0-π4) -.5(0-π4)... ] only sample 3 has a=4
    manual = -(1 / 4) * (0.5 * (0 - pi[4]) - 0.5 * (0 - pi[4]) - 0.5 * (0 - pi[4]) + 0.5 * (1 - pi[4]))
    assert theta.grad[4].item() == pytest.approx(manual.item(), abs=1e-12)


def test_grpo_single_update_gradient_is_gpg_with_zscored_advantages_plus_kl():
    """With one update per batch the ratio is 1, so ∇ GRPO = ∇[-A_z log π] + β ∇ KL_k3 (same aggregation)."""
    torch.manual_seed(0)
    logits = torch.randn(8, 3, 11, dtype=torch.float64, requires_grad=True)  # 8 sequences, 3 tokens, vocab 11
    tokens = torch.randint(0, 11, (8, 3))
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]] * 2, dtype=torch.bool)
    ref_logp = torch.log_softmax(torch.randn(8, 3, 11, dtype=torch.float64), -1).gather(-1, tokens[..., None])[..., 0]
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 1.0, 0.0]], dtype=torch.float64)
    adv = group_zscore_advantages(rewards).flatten()
    beta = 0.04

    def grad_of(fn):
        logits.grad = None
        logp = torch.log_softmax(logits, -1).gather(-1, tokens[..., None])[..., 0]
        fn(logp).backward()
        return logits.grad.clone()

    grpo = grad_of(lambda lp: aggregate_tokens(clipped_ratio_token_loss(lp, adv, None, 0.2) + beta * kl_k3(lp, ref_logp),
                                               mask, "seq_mean_token_mean"))
    gpg_plus_kl = grad_of(lambda lp: aggregate_tokens(reinforce_token_loss(lp, adv), mask, "seq_mean_token_mean")
                          + beta * aggregate_tokens(kl_k3(lp, ref_logp), mask, "seq_mean_token_mean"))
    torch.testing.assert_close(grpo, gpg_plus_kl, atol=1e-12, rtol=0)
    assert grpo.abs().sum() > 0


def test_bind_gives_each_function_only_the_hyper_parameters_it_declares():
    """Hyper-parameters are bound once by keyword; a function that has no use for one never receives it."""
    from mmgpg.algorithms import bind, group_mean_advantages, group_zscore_advantages, reinforce_token_loss

    rewards = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    gpg = bind(group_mean_advantages, std_eps=123.0)
    assert gpg.keywords == {} and gpg(rewards).tolist() == [[0.5, -0.5]]
    # GRPO: 0.5 / (std + eps) with the unbiased std sqrt(0.5) = 0.70711 and eps 0.5: 0.5 / 1.20711 = 0.41421
    grpo = bind(group_zscore_advantages, std_eps=0.5)
    assert grpo.keywords == {"std_eps": 0.5}
    assert grpo(rewards)[0].tolist() == pytest.approx([0.41421356, -0.41421356])
    assert bind(reinforce_token_loss, clip_eps=0.2).keywords == {}


@pytest.mark.parametrize("high", [None, 0.28])  # symmetric ε = 0.2, and DAPO's clip-higher ε_high = 0.28
def test_clipped_surrogate_at_and_beyond_its_bounds(high):
    """ℓ = -min(ρA, clip(ρ, 1 - 0.2, 1 + ε_high)A), by hand, for A = ±2 and ρ below, at and beyond both bounds; the
    gradient w.r.t. log π is -ρA where the unclipped term is the minimum and 0 where the clipped one is (the update
    stops pushing a ratio that already moved far enough in the advantage's direction, never in the other one)."""
    up = 1.2 if high is None else 1.28
    ratios = [0.5, 0.8, 0.9, 1.0, 1.1, up, 1.5]
    for A in (2.0, -2.0):
        logp = torch.log(torch.tensor([ratios], dtype=torch.float64)).requires_grad_(True)
        old = torch.zeros(1, len(ratios), dtype=torch.float64)
        loss = clipped_ratio_token_loss(logp, torch.tensor([A], dtype=torch.float64), old, 0.2, high)
        (grad,) = torch.autograd.grad(loss.sum(), logp)
        for k, rho in enumerate(ratios):
            clipped = min(max(rho, 0.8), up)
            assert loss[0, k].item() == pytest.approx(-min(rho * A, clipped * A), abs=1e-12), (A, rho)
            if A > 0 and rho > up or A < 0 and rho < 0.8:  # beyond the bound in the advantage's direction: no gradient
                assert grad[0, k].item() == 0.0, (A, rho)
            elif 0.8 < rho < up or A > 0 and rho < 0.8 or A < 0 and rho > up:  # inside, or beyond the other way
                assert grad[0, k].item() == pytest.approx(-rho * A, abs=1e-12), (A, rho)
    # A = +2 at ρ = 1.5: -2.4 (symmetric) / -2.56 (DAPO); A = -2 at ρ = 0.5: +1.6 for both (the low side is 1 - ε)
    logp = torch.log(torch.tensor([[1.5, 0.5]], dtype=torch.float64))
    zero = torch.zeros(1, 2, dtype=torch.float64)
    assert clipped_ratio_token_loss(logp, torch.tensor([2.0], dtype=torch.float64), zero, 0.2, high)[0, 0].item() == \
        pytest.approx(-2 * up, abs=1e-12)
    assert clipped_ratio_token_loss(logp, torch.tensor([-2.0], dtype=torch.float64), zero, 0.2, high)[0, 1].item() == \
        pytest.approx(1.6, abs=1e-12)
