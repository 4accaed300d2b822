"""mmgpg.theory.predict against hand-computed values (worked in the comments) and the paper's published fixed points, and
`mmgpg theory predict` end to end."""

from __future__ import annotations

import json
import math

import pytest

from mmgpg.cli import main
from mmgpg.theory.predict import (
    advantage_scale,
    batch_weight,
    coverage_probability,
    gpg_drift,
    gpg_drift_alpha,
    gpg_mean_only_k3_point,
    group_weight,
    k3_stationary_points,
    omega_group,
    omega_group_prime,
    omega_population,
    population_weight,
    reverse_kl_fixed_points,
    zero_variance_probability,
)


def test_weights_by_hand():
    # G = 2, p = 1/2, z-score with eps 0: only k = 1 counts: C(2,1) * (1/2)(1/2) * s(1), s(1) = 1/sqrt(2 * 1/4) = sqrt 2
    assert omega_group(0.5, 2, "group_zscore", 0.0) == pytest.approx(math.sqrt(2) / 2, abs=1e-15)
    # G = 4, p = 1/2, eps 0: k=1: 4 * q^2 (=1/4) * 3/16 * s(1)=2 -> 3/8; k=2: 6 * pq (=1/4) * 1/4 * s(2)=sqrt 3 ->
    # 3 sqrt(3)/8; k=3 like k=1 -> 3/8. Sum 3/4 + 3 sqrt(3)/8 = 1.399519
    assert omega_group(0.5, 4, "group_zscore", 0.0) == pytest.approx(0.75 + 3 * math.sqrt(3) / 8, abs=1e-14)
    assert advantage_scale("group_zscore", 4, 0.0)[2] == pytest.approx(math.sqrt(3), abs=1e-14)
    # GPG: Omega_G = 1 - 1/G at every p
    for p in (1e-6, 0.3, 0.999):
        assert omega_group(p, 4, "group_mean", 1e-4) == pytest.approx(0.75, abs=1e-12)
    # stabilized, G = 2, p = 1/2, eps = 0.01: 2 * 1/4 / sqrt(1/4 + 0.01) = 0.5 / 0.5099 = 0.980581
    assert omega_group(0.5, 2, "group_stabilized", 0.01) == pytest.approx(0.5 / math.sqrt(0.26), abs=1e-14)
    assert omega_population(0.5, 0.0) == 2.0
    # theory.md Table D (G = 16, TRL std + 1e-4): 3.613 at p = 0.01, 1.872 at p = 0.5
    assert omega_group(0.01, 16, "group_zscore", 1e-4) == pytest.approx(3.613, abs=5e-4)
    assert omega_group(0.5, 16, "group_zscore", 1e-4) == pytest.approx(1.872, abs=5e-4)
    # derivative against a central difference
    for adv in ("group_zscore", "group_stabilized"):
        h = 1e-6
        num = (omega_group(0.3 + h, 8, adv, 1e-4) - omega_group(0.3 - h, 8, adv, 1e-4)) / (2 * h)
        assert omega_group_prime(0.3, 8, adv, 1e-4) == pytest.approx(num, rel=1e-6)


def test_large_groups_are_summed_in_log_space_and_bounded(monkeypatch, capsys):
    """C(G, k) overflowed a float above G = 1029 (an OverflowError traceback); G = 10^6 ran without bound and 10^11
    tried to allocate 745 GiB. Now the terms are summed from their logarithms up to GROUP_SIZE_MAX, a grid of p is
    done in slices, and larger groups are a clear error."""
    from fractions import Fraction

    from mmgpg.theory import predict as P

    # GPG: Omega_G = 1 - 1/G exactly, RLOO: 1 (hand formulas), at sizes whose C(G, k) exceed a float
    for G in (1100, 4096):
        assert omega_group(0.3, G, "group_mean", 1e-4) == pytest.approx(1 - 1 / G, rel=1e-10)
        assert omega_group(0.9, G, "rloo", 0.0) == pytest.approx(1.0, rel=1e-10)
    # z-score at G = 64 against exact rational enumeration of the sum (s(k) in floating point)
    G, p = 64, Fraction(3, 10)
    s = advantage_scale("group_zscore", G, 1e-4)
    exact = sum(math.comb(G, k) * p ** (k - 1) * (1 - p) ** (G - k - 1) * Fraction(k, G) * (1 - Fraction(k, G))
                * Fraction(float(s[k])) for k in range(1, G))
    assert omega_group(0.3, G, "group_zscore", 1e-4) == pytest.approx(float(exact), rel=1e-12)
    # a grid done in slices of 3 (p, k) pairs equals the grid done at once and each point alone
    grid = [0.0, 0.2, 0.5, 0.7, 1.0]
    whole = omega_group_prime(grid, 8, "group_stabilized", 1e-4)
    monkeypatch.setattr(P, "CHUNK_ELEMENTS", 3)
    assert omega_group_prime(grid, 8, "group_stabilized", 1e-4).tolist() == whole.tolist()
    assert [omega_group_prime(x, 8, "group_stabilized", 1e-4) for x in grid] == pytest.approx(whole, rel=1e-14)
    for G in (4097, 10**6, 10**11):  # 4097 first: without the bound it runs (and this fails) in seconds
        assert main(["theory", "predict", f"rollout.group_size={G}", "--p-ref", "0.2", "algo.kl_coef=0.04"]) == 2
        err = capsys.readouterr().err
        assert f"rollout.group_size={G}: " in err and "2 <= G <= 4,096" in err and "Traceback" not in err


def test_probabilities_by_hand():
    assert zero_variance_probability(0.5, 2) == 0.5
    assert zero_variance_probability(0.1, 3) == pytest.approx(0.001 + 0.729, abs=1e-15)
    assert coverage_probability(0.01, 8, 10) == pytest.approx(1 - 0.99**80, abs=1e-15)  # 0.5525
    assert gpg_drift(0.2, 4) == pytest.approx(0.75 * 0.16, abs=1e-15)
    # P = 2, G = 2, p = 1/2: P0 = 1/2 -> (1 - 1/4)/(1 - 1/2) = 1.5 times the alpha=1 drift 1/8
    assert gpg_drift_alpha(0.5, 2, 2) == pytest.approx(0.125 * 1.5, abs=1e-15)
    assert gpg_drift_alpha(0.5, 2, 1) == pytest.approx(0.125, abs=1e-15)


def test_fixed_points_by_hand():
    w = group_weight(2, "group_mean", 0.0)  # Omega = 1/2
    # k3: 0.5 (p - 0.2) = 0.5 p (1 - p)  ->  p^2 = 0.2  ->  p = 0.447214
    (root,) = k3_stationary_points(0.2, 0.5, w)
    assert root["p"] == pytest.approx(math.sqrt(0.2), abs=1e-10)
    assert root["flow_rate"] > 0
    assert root["p"] == pytest.approx(gpg_mean_only_k3_point(0.2, 0.5, 0.5), abs=1e-10)
    # reverse KL: logit p = logit 0.2 + (1/2)/0.5 = log(1/4) + 1 -> p = e/4 / (1 + e/4) = 0.404609; h' = 0 (Omega flat)
    (root,) = reverse_kl_fixed_points(0.2, 0.5, w)
    assert root["p"] == pytest.approx((math.e / 4) / (1 + math.e / 4), abs=1e-10)
    assert root["h_prime"] == pytest.approx(0.0, abs=1e-12)


def test_paper_fixed_points():
    """theory.md Table A (eps = 1e-5; the paper's own panels: 0.6813 at beta=1, p_ref=0.2; 0.2807 at beta=5) and
    Table C (k3-in-loss stationary points with the same weights)."""
    w = population_weight(1e-5)
    roots = reverse_kl_fixed_points(0.2, 1.0, w)
    assert [round(r["p"], 4) for r in roots[:2]] == [0.6813, 0.9347]
    assert roots[2]["log10_one_minus_p"] == pytest.approx(-136.7, abs=0.05)
    assert roots[0]["h_prime"] == pytest.approx(0.39, abs=0.005)
    # Lemma 1's bound: B(p*) = p*(1-p*)|2p*-1| / (2 [p*(1-p*) + eps]^1.5)
    p = roots[0]["p"]
    assert roots[0]["stability_bound"] == pytest.approx(p * (1 - p) * abs(2 * p - 1) / (2 * (p * (1 - p) + 1e-5) ** 1.5))
    assert reverse_kl_fixed_points(0.2, 5.0, w)[0]["p"] == pytest.approx(0.2807, abs=5e-5)
    assert reverse_kl_fixed_points(0.0001, 1.0, w)[0]["p"] == pytest.approx(0.03101, abs=5e-6)
    assert k3_stationary_points(0.2, 1.0, w)[0]["p"] == pytest.approx(0.6701, abs=5e-5)
    assert k3_stationary_points(0.01, 5.0, w)[0]["p"] == pytest.approx(0.05597, abs=5e-6)
    # theory.md Table E: finite-G (16, TRL std) reverse-KL root 0.004001 at beta=1, p_ref=1e-4
    assert reverse_kl_fixed_points(1e-4, 1.0, group_weight(16, "group_zscore", 1e-4))[0]["p"] == pytest.approx(
        0.004001, abs=5e-7)


@pytest.mark.parametrize("beta", [0.1, 0.5, 2.0])
def test_theorem3_every_fixed_point_amplifies(beta):
    for weight in (population_weight(1e-5), group_weight(8, "group_zscore", 1e-4)):
        for p_ref in (1e-4, 0.05, 0.3, 0.7, 0.95):
            roots = reverse_kl_fixed_points(p_ref, beta, weight)
            assert roots and all(r["p"] > p_ref for r in roots)
            assert all(r["p"] > p_ref for r in k3_stationary_points(p_ref, beta, weight))


def test_predict_cli_json(capsys):
    rc = main(["theory", "predict", "algo=grpo", "algo.kl_coef=0.5", "algo.kl_estimator=k2", "rollout.group_size=2",
               "algo.advantage=group_mean", "--p-ref", "0,0.2", "--visits", "3", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["objective"]["configured_fixed_point"] == "k2"
    zero, row = out["rows"]
    assert zero["predicted_p_star"] == 0.0 and zero["k2"] == []
    assert row["omega_G"] == pytest.approx(0.5)  # 1 - 1/G
    assert row["zero_variance_probability"] == pytest.approx(0.68)  # 0.04 + 0.64
    assert row["coverage"] == pytest.approx(1 - 0.8**6)
    assert row["predicted_p_star"] == pytest.approx((math.e / 4) / (1 + math.e / 4), abs=1e-10)
    assert row["k3"][0]["p"] == pytest.approx(math.sqrt(0.2), abs=1e-10)
    assert set(out["formulas"]) >= {"omega_G", "k3", "k2", "paper", "gpg_drift", "coverage"}


def test_predict_cli_table_and_errors(capsys):
    assert main(["theory", "predict", "algo=gpg", "--p-ref", "0.01,0.2"]) == 0
    text = capsys.readouterr().out
    assert "no interior fixed point" in text and "coverage" in text and "0.8750" in text
    assert main(["theory", "predict", "--p-ref", "0.2,abc"]) == 2
    assert "--p-ref must be comma-separated numbers" in capsys.readouterr().err
    assert main(["theory", "predict", "--p-ref", "1.5"]) == 2
    assert "[0, 1]" in capsys.readouterr().err


def test_batch_weights_by_hand():
    # reinforce_pp, one group of 2 (n = 2): only S = 1, c_1 = C(2,1) (1/2)(1/2) / sqrt(2 · 1/4) = √2/2 at every p: the
    # same as GRPO's Ω_G for G = 2 at std_eps 0 (one group is the whole batch)
    for p in (0.1, 0.5, 0.7):
        assert batch_weight(2, 1, "reinforce_pp", 0.0).omega(p, 1 - p) == pytest.approx(math.sqrt(2) / 2, rel=1e-12)
        assert omega_group(p, 2, "group_zscore", 0.0) == pytest.approx(math.sqrt(2) / 2, rel=1e-12)
    # reinforce_pp_baseline, P = 2 groups of G = 2 (n = 4), p = 1/2, ε = 0: W = Σ k(2-k) is 1 with probability
    # 2 · (2pq)(p² + q²) = 1/2 and 2 with probability (2pq)² = 1/4; f(W) = (W/8)/sqrt(W/6): √6/8 and √3/4, so
    # Ω_B = (1/2 · √6/8 + 1/4 · √3/4) / (1/4) = (√6 + √3)/4 = 1.045386
    got = batch_weight(2, 2, "reinforce_pp_baseline", 0.0).omega(0.5, 0.5)
    assert got == pytest.approx((math.sqrt(6) + math.sqrt(3)) / 4, rel=1e-12)
    # the exact sum hands over to the large-batch limit c / sqrt(n/(n-1) c p(1-p) + ε) continuously
    for adv in ("reinforce_pp", "reinforce_pp_baseline"):
        exact, limit = batch_weight(8, 32, adv, 1e-8), batch_weight(8, 33, adv, 1e-8)
        assert "exact" in exact.label and "limit" in limit.label
        assert limit.omega(0.3, 0.7) == pytest.approx(exact.omega(0.3, 0.7), rel=1e-2)
        h = 1e-6
        num = (exact.omega(0.3 + h, 0.7 - h) - exact.omega(0.3 - h, 0.7 + h)) / (2 * h)
        assert exact.prime(0.3, 0.7) == pytest.approx(num, rel=1e-6)


def test_predict_covers_rloo_and_reinforce_pp_and_says_what_it_does_not(capsys):
    assert main(["theory", "predict", "algo=rloo", "--p-ref", "0.2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["rows"][0]["omega_G"] == pytest.approx(1.0, rel=1e-12) and out["not_covered"] == []
    assert main(["theory", "predict", "algo=reinforce_pp", "train.prompts_per_step=2", "rollout.group_size=2",
                 "algo.kl_coef=0.5", "--p-ref", "0.3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["objective"]["weight"].startswith("Ω_B") and out["rows"][0]["k3"]
    assert out["rows"][0]["omega_G"] == pytest.approx(batch_weight(2, 2, "reinforce_pp", 1e-8).omega(0.3, 0.7))
    assert any("whole batch" in n for n in out["not_covered"])
    assert main(["theory", "predict", "algo=dapo", "--p-ref", "0.3"]) == 0
    text = capsys.readouterr().out
    assert "not covered" in text and "overlong" in text and "updates_per_batch=2" in text


# ---- which stationary point is the prediction, when there are several -------------------------------------------------


def flow_limit(rate, z0: float, dt: float, steps: int = 200000) -> float:
    """Where gradient flow ``dz/dt = rate(z)`` started at ``z0`` stops (plain Euler, independent of the root finder)."""
    z = z0
    for _ in range(steps):
        step = dt * rate(z)
        z += step
        if abs(step) < 1e-12:
            break
    return z


def test_several_k3_stationary_points_come_in_order_and_the_first_is_where_the_flow_stops():
    """A weight made so that F(p) = pqΩ(p) − β(p − p_ref) = −(p − 0.3)(p − 0.5)(p − 0.8) (β = 1, p_ref = 0.1):
    three roots; by hand dF/dp = −0.1, +0.06, −0.15 there, so flow_rate = −pq dF/dp = 0.021, −0.015, 0.024
    (attracting, repelling, attracting). Gradient flow from p_ref stops at 0.3; from just above 0.5, at 0.8."""
    from mmgpg.theory.predict import Weight, logit

    cubic = lambda p: (p - 0.3) * (p - 0.5) * (p - 0.8)  # noqa: E731
    omega = lambda p, q: ((p - 0.1) - cubic(p)) / (p * q)  # noqa: E731
    prime = lambda p, q: (omega(p + 1e-6, q - 1e-6) - omega(p - 1e-6, q + 1e-6)) / 2e-6  # noqa: E731
    roots = k3_stationary_points(0.1, 1.0, Weight(omega, prime, "cubic"))
    assert [r["p"] for r in roots] == pytest.approx([0.3, 0.5, 0.8], abs=1e-9)
    assert [r["flow_rate"] for r in roots] == pytest.approx([0.021, -0.015, 0.024], abs=1e-6)

    def F(z):
        p = 1 / (1 + math.exp(-z))
        return -cubic(p)

    assert 1 / (1 + math.exp(-flow_limit(F, logit(0.1), 1.0))) == pytest.approx(roots[0]["p"], abs=1e-6)
    assert 1 / (1 + math.exp(-flow_limit(F, logit(0.5001), 1.0))) == pytest.approx(roots[2]["p"], abs=1e-6)


def test_several_reverse_kl_fixed_points_come_in_order_and_the_first_is_where_the_flow_stops():
    """The paper's Ω_ε (ε = 1e-5) at β = 1, p_ref = 0.2 has three fixed points (theory.md Table A): 0.6813 (stable),
    0.9347 (unstable) and 1 − 10^-136.7 (stable). Flow dz/dt ∝ g(z) = z_ref + Ω(σ(z))/β − z from z_ref stops at the
    first; started just above the second it runs to the third, just below it back to the first."""
    from mmgpg.theory.predict import logit, sigmoid_pq

    w = population_weight(1e-5)
    roots = reverse_kl_fixed_points(0.2, 1.0, w)
    assert len(roots) == 3 and roots[0]["p"] < roots[1]["p"] < roots[2]["p"]
    assert [r["flow_stable"] for r in roots] == [True, False, True]

    def g(z):
        p, q = sigmoid_pq(z)
        return logit(0.2) + float(w.omega(p, q)) - z

    assert 1 / (1 + math.exp(-flow_limit(g, logit(0.2), 0.5))) == pytest.approx(roots[0]["p"], abs=1e-9)
    assert flow_limit(g, roots[1]["logit"] + 1e-3, 0.5) == pytest.approx(roots[2]["logit"], rel=1e-9)
    assert flow_limit(g, roots[1]["logit"] - 1e-3, 0.5) == pytest.approx(roots[0]["logit"], rel=1e-9)


@pytest.mark.parametrize("estimator", ["k2", "k3"])
def test_the_prediction_is_the_first_stationary_point_above_p_ref(estimator):
    """G = 64, z-score with std_eps 1e-6, β = 1, p_ref = 0.2: the finite-G reverse-KL objective has three fixed
    points (0.6688, 0.9521, 0.9980); `predict` and `predicted_limit` name the first, which is where gradient flow from
    p_ref stops (checked by integrating the flow), never a later or a "more stable" one."""
    from mmgpg.config import resolve
    from mmgpg.theory.predict import configured_weight, logit, predict, predicted_limit, sigmoid_pq

    cfg = resolve(["algo=grpo", "algo.kl_coef=1.0", f"algo.kl_estimator={estimator}", "rollout.group_size=64",
                   "algo.std_eps=1e-6"]).config
    w = configured_weight(cfg)
    points = (reverse_kl_fixed_points if estimator == "k2" else k3_stationary_points)(0.2, 1.0, w)
    if estimator == "k2":
        assert [round(r["p"], 4) for r in points] == [0.6688, 0.9521, 0.998]

    def rate(z):
        p, q = sigmoid_pq(z)
        if estimator == "k2":
            return logit(0.2) + float(w.omega(p, q)) - z
        return p * q * float(w.omega(p, q)) - (p - 0.2)

    limit = 1 / (1 + math.exp(-flow_limit(rate, logit(0.2), 0.5 if estimator == "k2" else 2.0)))
    row = predict(cfg, [0.2])["rows"][0]
    assert row["predicted_p_star"] == points[0]["p"] == predicted_limit(cfg, 0.2)
    assert limit == pytest.approx(points[0]["p"], abs=1e-7)
