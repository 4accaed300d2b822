"""KL estimators (algo.kl_estimator): values and gradients by hand, and the on-policy expected gradient of each
against the exact reverse / forward KL gradient of a tabular softmax policy (an independent reference: autograd of
the closed-form KL, no estimator involved)."""

from __future__ import annotations

import math

import pytest
import torch

from mmgpg.algorithms import KL_ESTIMATORS, kl_k1, kl_k2, kl_k3


def _value_and_grad(fn, logp: float, ref: float) -> tuple[float, float]:
    x = torch.tensor([[logp]], dtype=torch.float64, requires_grad=True)
    y = fn(x, torch.tensor([[ref]], dtype=torch.float64)).sum()
    y.backward()
    return float(y), float(x.grad)


def test_values_and_gradients_by_hand():
    lp, ref = math.log(0.5), math.log(0.25)  # log ratio log(pi/ref) = log 2
    # k1 = log 2, d/dlogp = 1
    assert _value_and_grad(kl_k1, lp, ref) == pytest.approx((math.log(2), 1.0), abs=1e-12)
    # k2 = (log 2)^2 / 2 = 0.240227, d/dlogp = log 2
    assert _value_and_grad(kl_k2, lp, ref) == pytest.approx((0.5 * math.log(2) ** 2, math.log(2)), abs=1e-12)
    # k3 = ref/pi - log(ref/pi) - 1 = 0.5 + log 2 - 1 = 0.193147, d/dlogp = 1 - ref/pi = 0.5
    assert _value_and_grad(kl_k3, lp, ref) == pytest.approx((0.5 + math.log(2) - 1, 0.5), abs=1e-12)
    assert set(KL_ESTIMATORS) == {"k1", "k2", "k3"}


@pytest.mark.parametrize("name", ["k1", "k2", "k3"])
def test_on_policy_expected_gradient(name):
    """E_{o~pi}[grad k(o)] with pi = softmax(theta) over 4 outcomes, enumerated exactly (weights pi(o) detached):
    k1 -> 0, k2 -> grad KL(pi || ref), k3 -> grad KL(ref || pi)."""
    theta = torch.tensor([0.3, -1.2, 0.8, 0.0], dtype=torch.float64, requires_grad=True)
    ref = torch.log_softmax(torch.tensor([-0.5, 0.4, 0.1, 1.0], dtype=torch.float64), 0)
    logp = torch.log_softmax(theta, 0)
    weights = logp.exp().detach()
    (estimated,) = torch.autograd.grad((weights * KL_ESTIMATORS[name](logp, ref)).sum(), theta)
    logp = torch.log_softmax(theta, 0)
    reverse = (logp.exp() * (logp - ref)).sum()  # KL(pi || ref)
    forward = (ref.exp() * (ref - logp)).sum()  # KL(ref || pi)
    (g_rev,) = torch.autograd.grad(reverse, theta, retain_graph=True)
    (g_fwd,) = torch.autograd.grad(forward, theta)
    expected = {"k1": torch.zeros(4, dtype=torch.float64), "k2": g_rev, "k3": g_fwd}[name]
    assert torch.allclose(estimated, expected, atol=1e-12), (estimated, expected)
    assert not torch.allclose(g_rev, g_fwd, atol=1e-3)  # the two KL directions really differ here


@pytest.mark.slow
def test_trainer_differentiates_the_configured_estimator(tiny_dirs, tmp_path):
    """At the reference weights (π = π_ref) the k2 and k3 gradients vanish, so GRPO's step gradient is the policy
    term alone for both; k1's gradient is β Σ ∇log π / |o| / B over every forwarded sample (zero-variance groups
    included), which the independent one-sequence reference computes as a policy loss with A = -1 and α = β."""
    from support.gradient_reference import (
        make_groups,
        make_trainer,
        reference_gradient,
        relative_error,
        trainer_gradient,
    )

    model, beta = str(tiny_dirs["qwen2_vl"]), 0.5
    grads = {}
    for name in ("k1", "k2", "k3"):
        trainer = make_trainer(model, str(tmp_path / name), "grpo", f"algo.kl_coef={beta}", f"algo.kl_estimator={name}")
        groups = make_groups(trainer, [0, 1, 2, 3])
        grads[name] = trainer_gradient(trainer, groups)
    assert relative_error(grads["k2"], grads["k3"]) < 1e-6
    k1_term = reference_gradient(trainer, groups, [[-1.0] * 4] * 4, alpha=beta, aggregation="seq_mean_token_mean")
    assert relative_error(grads["k1"], {k: grads["k3"][k] + k1_term[k] for k in k1_term}) < 1e-5
    assert relative_error(grads["k1"], grads["k3"]) > 0.1  # the k1 term is not negligible here
