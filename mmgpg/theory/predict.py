"""Success-amplification theory for binary success, as small pure functions of the configured objective.

Sources and derivations: ``docs/theory.md`` (Mroueh 2025, arXiv 2503.06639, "GRPO with verifiable rewards: effective
loss, dynamics and success amplification"; the finite-group and KL-estimator extensions are derived there).

The model is one prompt whose completions succeed with probability ``p = σ(z)``; ``z`` is the success log-odds and
``∂z log π(o) = r - p`` for a success indicator ``r``. A group of ``G`` samples has ``k ~ Bin(G, p)`` successes,
``p̂ = k/G``, and advantages ``A_i = (r_i - p̂)·s(k)`` where ``s`` is the configured normalisation. The per-group
gradient in ``z`` is ``(1/G) Σ_i A_i (r_i - p) = p̂(1 - p̂)·s(k)`` (because ``Σ_i (r_i - p̂)(r_i - p) = k(1 - k/G)``),
so every advantage acts through the finite-group weight

    Ω_G(p) = E_k[p̂(1 - p̂)·s(k)] / (p(1 - p)),

the analogue of the paper's population weight ``Ω_ε(p) = (p(1-p) + ε)^(-1/2)``.

With a KL penalty β the expected ascent direction in ``z`` is ``p(1-p)Ω_G(p) - β·∂z KL-term``:

* ``k3`` in the loss (forward-KL gradient): ``∂z = p - p_ref`` → stationary where ``β(p - p_ref) = p(1-p)Ω_G(p)``;
* ``k2`` in the loss (reverse-KL gradient, the paper's objective): ``∂z = p(1-p)(z - z_ref)`` → stationary where
  ``z = z_ref + Ω_G(p)/β``, i.e. the fixed points of ``h(p) = σ(logit p_ref + Ω_G(p)/β)``;
* ``k1`` (or no KL): nothing pulls back; ``p`` drifts up, GPG's expected gradient is ``(1 - 1/G) p(1-p)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy.optimize import brentq
from scipy.special import expit, gammaln

Z_FAR = 60.0  # |logit| beyond which σ is 0 or 1 to double precision and every Ω below is constant

# --------------------------------------------------------------------------------------------------------------------
# Weights
# --------------------------------------------------------------------------------------------------------------------


def binomial_pmf(G: int, p: float) -> np.ndarray:
    """``P(k) = C(G, k) p^k (1-p)^(G-k)`` for ``k = 0..G``. ``binomial_pmf(2, 0.5)`` → ``[0.25, 0.5, 0.25]``."""
    k = np.arange(G + 1)
    return np.array([math.comb(G, int(i)) for i in k], dtype=float) * p**k * (1.0 - p) ** (G - k)


def advantage_scale(advantage: str, G: int, std_eps: float) -> np.ndarray:
    """``s(k)`` for ``k = 0..G`` successes, as :mod:`mmgpg.algorithms` normalises a 0/1 group:

    * ``group_mean`` (GPG): ``s = 1``;
    * ``group_zscore`` (GRPO): ``s = 1/(std_unbiased + std_eps)``, ``std_unbiased = sqrt(G/(G-1) · p̂(1-p̂))``;
    * ``group_stabilized``: ``s = 1/sqrt(p̂(1-p̂) + std_eps)`` (population variance);
    * ``rloo``: ``s = G/(G-1)`` (``r_i`` minus the mean of the others), so ``Ω_G ≡ 1`` exactly.

    ``advantage_scale("group_zscore", 4, 0)[2]`` = ``1/sqrt(4/3 · 1/4)`` = ``1.7320``.
    """
    if G < 2:
        raise ValueError(f"group size must be >= 2; got {G}")
    ph = np.arange(G + 1) / G
    var = ph * (1.0 - ph)
    with np.errstate(divide="ignore"):  # k = 0, G with std_eps = 0: inf, always multiplied by p̂(1-p̂) = 0
        if advantage == "group_mean":
            return np.ones(G + 1)
        if advantage == "rloo":
            return np.full(G + 1, G / (G - 1))
        if advantage == "group_zscore":
            return 1.0 / (np.sqrt(var * G / (G - 1)) + std_eps)
        if advantage == "group_stabilized":
            return 1.0 / np.sqrt(var + std_eps)
    raise ValueError(f"advantage must be one of {', '.join(GROUP_ADVANTAGES)}; got {advantage!r}")


def omega_group(p: float, G: int, advantage: str, std_eps: float, q: float | None = None) -> float:
    """Finite-group weight ``Ω_G(p) = E_k[p̂(1-p̂) s(k)] / (p(1-p))``, ``k ~ Bin(G, p)``, by exact enumeration:

        Ω_G(p) = Σ_{k=1}^{G-1} C(G,k) p^(k-1) (1-p)^(G-k-1) · (k/G)(1-k/G) · s(k)

    (continuous on [0, 1]; ``q = 1 - p`` may be passed to keep precision near 1; each term is summed from its
    logarithm, so ``C(G, k)`` never overflows). GPG: ``Ω_G ≡ 1 - 1/G`` exactly.
    ``omega_group(0.5, 2, "group_zscore", 0)``: only k = 1: ``C(2,1) · ¼ · s(1)``, ``s(1) = 1/sqrt(2 · ¼) = √2`` →
    ``√2/2`` = ``0.70711``.
    """
    def omega(p, q, k, log_coeff):
        return np.exp(log_coeff + _xlog(k - 1, p) + _xlog(G - k - 1, q)).sum(axis=-1)

    return _chunked(omega, p, q, G, advantage, std_eps)


def omega_group_prime(p: float, G: int, advantage: str, std_eps: float, q: float | None = None) -> float:
    """``dΩ_G/dp`` from the sum above: ``Σ c_k [(k-1) p^(k-2) q^(G-k-1) - (G-k-1) p^(k-1) q^(G-k-2)]``, 0 < p < 1."""
    def prime(p, q, k, log_coeff):
        with np.errstate(divide="ignore"):
            a = np.exp(log_coeff + np.log(k - 1.0) + _xlog(k - 2, p) + _xlog(G - k - 1, q))  # 0 at k = 1
            b = np.exp(log_coeff + np.log(G - k - 1.0) + _xlog(k - 1, p) + _xlog(G - k - 2, q))  # 0 at k = G - 1
        return np.sum(a - b, axis=-1)

    return _chunked(prime, p, q, G, advantage, std_eps)


GROUP_SIZE_MAX = 4096
"""The largest group the finite-group weights enumerate: each evaluation sums over every success count k = 1..G-1,
and a fixed-point search evaluates a weight on a grid of 24,001 points (O(G) time each: `mmgpg theory predict` with
two p_ref values takes about 14 s at this size on a 2-core CPU; the paper's groups have 8 to 16 completions)."""
CHUNK_ELEMENTS = 1 << 22
"""The most (p, k) pairs one vectorised step holds (32 MiB per float64 temporary): a grid of p is done in slices."""


def check_group_size(G: int) -> None:
    """A clear error for a group the enumeration cannot handle (below 2, or above :data:`GROUP_SIZE_MAX`)."""
    if not 2 <= G <= GROUP_SIZE_MAX:
        raise ValueError(f"rollout.group_size={G}: the success-amplification theory enumerates every success count "
                         f"of a group, which needs 2 <= G <= {GROUP_SIZE_MAX:,} (O(G) work for each of thousands of "
                         f"weight evaluations); set rollout.group_size in that range (the weights change by O(1/G) "
                         "at that size: GPG's is 1 - 1/G)")


def _chunked(fn, p, q, G: int, advantage: str, std_eps: float):
    """``fn(p[..., None], q[..., None], k, log c_k)`` summed over k = 1..G-1 with ``log c_k = log[C(G,k) (k/G)(1-k/G)
    s(k)]``, for p (scalar or array) in slices of at most :data:`CHUNK_ELEMENTS` (p, k) pairs."""
    check_group_size(G)
    p = np.asarray(p, dtype=float)
    q = 1.0 - p if q is None else np.asarray(q, dtype=float)
    p, q = np.broadcast_arrays(p, q)
    k = np.arange(1, G)
    log_comb = gammaln(G + 1) - gammaln(k + 1) - gammaln(G - k + 1)
    log_coeff = log_comb + np.log(k / G) + np.log1p(-k / G) + np.log(advantage_scale(advantage, G, std_eps)[1:G])
    flat_p, flat_q = p.reshape(-1), q.reshape(-1)
    step = max(1, CHUNK_ELEMENTS // max(G - 1, 1))
    out = np.concatenate([fn(flat_p[i:i + step, None], flat_q[i:i + step, None], k, log_coeff)
                          for i in range(0, flat_p.size, step)]) if flat_p.size else np.zeros(0)
    return _out(out.reshape(p.shape))


def _out(x: np.ndarray):
    return float(x) if np.ndim(x) == 0 else x


GROUP_ADVANTAGES = ("group_mean", "group_zscore", "group_stabilized", "rloo")
BATCH_ADVANTAGES = ("reinforce_pp", "reinforce_pp_baseline")  # whitened with the batch's statistics
BATCH_EXACT_MAX = 256  # batch sizes n = P·G up to which the batch weight is enumerated exactly


def batch_log_coefficients(advantage: str, G: int, P: int, std_eps: float) -> np.ndarray:
    """``log c_S`` for ``S = 1..n-1`` successes in a batch of ``n = P·G`` samples, all of one prompt (the one-prompt
    model), such that the batch weight is ``Ω_B(p) = Σ_S c_S p^(S-1) (1-p)^(n-S-1)`` (:func:`omega_batch`):

    * ``reinforce_pp``: ``A = (r - p̂)/sqrt(σ² + ε)`` with the batch's ``p̂ = S/n`` and unbiased ``σ² = n/(n-1) p̂(1-p̂)``;
      the batch's gradient in z is ``(1/n) Σ A_i (r_i - p) = p̂(1-p̂)/sqrt(σ² + ε)``, so
      ``c_S = C(n, S) p̂(1-p̂)/sqrt(σ² + ε)``;
    * ``reinforce_pp_baseline``: ``c_i = r_i - p̂_g`` whitened over the batch (their mean is 0): with
      ``W = Σ_g k_g(G - k_g)`` the gradient is ``f(W) = (W/(nG))/sqrt(W/(G(n-1)) + ε)`` and
      ``c_S = Σ_W N(S, W) f(W)``, ``N`` the number of ways (with multiplicity ``Π_g C(G, k_g)``) that P groups make S
      successes and W (a convolution over groups).

    ``batch_log_coefficients("reinforce_pp", 1, 2, 0)``: n = 2, S = 1: ``C(2,1) · ¼ / sqrt(2 · ¼)`` = √2/2.
    """
    n = P * G
    if advantage == "reinforce_pp":
        S = np.arange(1, n)
        ph = S / n
        var = n / (n - 1) * ph * (1 - ph)
        log_comb = np.array([math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) for k in S])
        return log_comb + np.log(ph * (1 - ph)) - 0.5 * np.log(var + std_eps)
    if advantage != "reinforce_pp_baseline":
        raise ValueError(f"a batch-whitened advantage is one of {', '.join(BATCH_ADVANTAGES)}; got {advantage!r}")
    k = np.arange(G + 1)
    w_of_k = k * (G - k)
    log_c = np.array([math.log(math.comb(G, int(i))) for i in k])
    w_max = P * (G * G // 4)
    log_n = np.full((n + 1, w_max + 1), -np.inf)  # log N(S, W) over the groups so far
    log_n[0, 0] = 0.0
    for _ in range(P):
        nxt = np.full_like(log_n, -np.inf)
        for ki in k:
            shifted = np.full_like(log_n, -np.inf)
            shifted[ki:, w_of_k[ki]:] = log_n[: n + 1 - ki, : w_max + 1 - w_of_k[ki]] + log_c[ki]
            nxt = np.logaddexp(nxt, shifted)
        log_n = nxt
    W = np.arange(w_max + 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_f = np.log(W / (n * G)) - 0.5 * np.log(W / (G * (n - 1)) + std_eps)
    log_f[0] = -np.inf  # f(0) = 0: no group with both outcomes
    terms = log_n[1:n] + log_f[None, :]
    top = terms.max(axis=1, keepdims=True)
    return top[:, 0] + np.log(np.exp(terms - top).sum(axis=1))


def omega_batch(p, n: int, log_coeff: np.ndarray, q=None):
    """``Σ_S c_S p^(S-1) q^(n-S-1)`` from :func:`batch_log_coefficients`, in log space (n may be hundreds)."""
    p = np.asarray(p, dtype=float)[..., None]
    q = 1.0 - p if q is None else np.asarray(q, dtype=float)[..., None]
    S = np.arange(1, n)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_terms = log_coeff + _xlog(S - 1, p) + _xlog(n - S - 1, q)
    return _out(np.exp(log_terms).sum(axis=-1))


def omega_batch_prime(p, n: int, log_coeff: np.ndarray, q=None):
    """``dΩ_B/dp = Σ c_S [(S-1) p^(S-2) q^(n-S-1) - (n-S-1) p^(S-1) q^(n-S-2)]``."""
    p = np.asarray(p, dtype=float)[..., None]
    q = 1.0 - p if q is None else np.asarray(q, dtype=float)[..., None]
    S = np.arange(1, n)
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.where(S >= 2, np.exp(log_coeff + np.log(np.maximum(S - 1, 1)) + _xlog(S - 2, p) + _xlog(n - S - 1, q)),
                     0.0)
        b = np.where(n - S >= 2, np.exp(log_coeff + np.log(np.maximum(n - S - 1, 1)) + _xlog(S - 1, p)
                                        + _xlog(n - S - 2, q)), 0.0)
    return _out((a - b).sum(axis=-1))


def _xlog(exponent, x):
    """``exponent · log x`` with ``0 · log 0 = 0`` (and a negative exponent, never used, as 0)."""
    exponent = np.maximum(exponent, 0)
    return np.where(exponent == 0, 0.0, exponent * np.log(np.where(x > 0, x, 1.0)) + np.where(x > 0, 0.0, -np.inf))


def omega_population(p: float, eps: float, q: float | None = None) -> float:
    """The paper's population weight ``Ω_ε(p) = ω⁺ + ω⁻ = (p(1-p) + ε)^(-1/2)``. ``omega_population(0.5, 0)`` = 2."""
    q = 1.0 - p if q is None else q
    return (p * q + eps) ** -0.5


def omega_population_prime(p: float, eps: float, q: float | None = None) -> float:
    """``dΩ_ε/dp = -(1 - 2p) / (2 (p(1-p) + ε)^(3/2))`` (paper, Prop. 1)."""
    q = 1.0 - p if q is None else q
    return -(1.0 - 2.0 * p) / (2.0 * (p * q + eps) ** 1.5)


def zero_variance_probability(p: float, G: int) -> float:
    """``P(all G samples equal) = p^G + (1-p)^G``: the group carries no signal. ``(0.5, 2)`` → 0.5."""
    return p**G + (1.0 - p) ** G


# --------------------------------------------------------------------------------------------------------------------
# Stationary points
# --------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Weight:
    """``Ω(p, q)`` and ``Ω'(p, q)`` with ``q = 1 - p`` passed separately (precision near 1)."""

    omega: Callable[[float, float], float]
    prime: Callable[[float, float], float]
    label: str


def group_weight(G: int, advantage: str, std_eps: float) -> Weight:
    return Weight(lambda p, q: omega_group(p, G, advantage, std_eps, q),
                  lambda p, q: omega_group_prime(p, G, advantage, std_eps, q), f"Ω_G ({advantage}, G={G})")


def batch_weight(G: int, P: int, advantage: str, std_eps: float) -> Weight:
    """REINFORCE++(-baseline)'s weight when the whole batch (``P`` prompts over all ranks, ``G`` samples each) comes
    from prompts of this p: exact for ``P·G <= BATCH_EXACT_MAX``, else the large-batch limit where the batch's
    statistics equal their expectations, ``c / sqrt(n/(n-1) · c · p(1-p) + ε)`` with ``c = 1`` (reinforce_pp) or
    ``1 - 1/G`` (the baseline's within-group variance)."""
    n = P * G
    if n <= BATCH_EXACT_MAX:
        log_coeff = batch_log_coefficients(advantage, G, P, std_eps)
        return Weight(lambda p, q: omega_batch(p, n, log_coeff, q), lambda p, q: omega_batch_prime(p, n, log_coeff, q),
                      f"Ω_B ({advantage}, batch of P·G = {P}·{G}, exact)")
    c = 1.0 if advantage == "reinforce_pp" else 1.0 - 1.0 / G
    a = n / (n - 1) * c
    return Weight(lambda p, q: c * (a * p * q + std_eps) ** -0.5,
                  lambda p, q: -c * a * (q - p) / (2.0 * (a * p * q + std_eps) ** 1.5),
                  f"Ω_B ({advantage}, batch of P·G = {P}·{G}, large-batch limit)")


def configured_weight(cfg) -> Weight:
    """The finite-group weight of ``algo.advantage``: per group, or per batch for the batch-whitened ones."""
    a, G = cfg.algo, cfg.rollout.group_size
    check_group_size(G)
    if a.advantage in BATCH_ADVANTAGES:
        return batch_weight(G, cfg.train.prompts_per_step, a.advantage, a.std_eps)
    return group_weight(G, a.advantage, a.std_eps)


def population_weight(eps: float) -> Weight:
    return Weight(lambda p, q: omega_population(p, eps, q), lambda p, q: omega_population_prime(p, eps, q),
                  f"Ω_ε (ε={eps:g})")


def sigmoid_pq(z):
    """``(σ(z), σ(-z))`` without cancellation (scalars or arrays)."""
    return _out(expit(z)), _out(expit(-np.asarray(z, dtype=float)))


def logit(p: float) -> float:
    return math.log(p) - math.log1p(-p)


def _roots(f: Callable[[float], float], lo: float, hi: float) -> list[float]:
    """Every sign change of ``f`` (vectorised) on a fine grid of ``[lo, hi]`` (dense on ``|z| <= Z_FAR``), refined by
    brentq."""
    inner = np.linspace(max(lo, -Z_FAR), min(hi, Z_FAR), 24001) if lo < Z_FAR and hi > -Z_FAR else np.array([])
    grid = np.unique(np.concatenate([[lo, hi], inner]))
    values = f(grid).tolist()
    roots = []
    for a, b, fa, fb in zip(grid[:-1], grid[1:], values[:-1], values[1:]):
        if fa == 0.0:
            roots.append(float(a))
        elif fa * fb < 0:
            roots.append(float(brentq(f, float(a), float(b), xtol=1e-13)))
    return roots


def k3_stationary_points(p_ref: float, beta: float, weight: Weight) -> list[dict[str, float]]:
    """Roots in ``(p_ref, 1)`` of the expected ascent with k3 in the loss (forward-KL gradient):

        F(z) = p(1-p) Ω(p) - β (p - p_ref),    p = σ(z)

    ``flow_rate = -dF/dz = -p(1-p)[(1-2p)Ω + p(1-p)Ω' - β]``: > 0 means small gradient steps are attracted.
    The first root above p_ref is where gradient flow from p_ref stops. Needs ``0 < p_ref < 1`` and ``β > 0``.
    """
    _check(p_ref, beta)
    z_ref = logit(p_ref)

    def F(z):
        p, q = sigmoid_pq(z)
        return p * q * weight.omega(p, q) - beta * (p - p_ref)

    out = []
    for z in _roots(F, z_ref, max(z_ref, Z_FAR) + 1.0):
        p, q = sigmoid_pq(z)
        slope = p * q * ((q - p) * weight.omega(p, q) + p * q * weight.prime(p, q) - beta)
        out.append({"p": p, "logit": z, "flow_rate": -slope})
    return out


def reverse_kl_fixed_points(p_ref: float, beta: float, weight: Weight) -> list[dict[str, float]]:
    """Fixed points of the paper's recursion ``h(p) = σ(logit p_ref + Ω(p)/β)`` (reverse KL, i.e. k2 in the loss),
    found as roots of ``g(z) = z_ref + Ω(σ(z))/β - z``, with

        h'(p*) = p*(1-p*) Ω'(p*) / β,    stable for the exact iteration iff β > B(p*) = p*(1-p*) |Ω'(p*)|

    (for Ω_ε: ``B = p*(1-p*)|2p*-1| / (2[p*(1-p*)+ε]^(3/2))``, the paper's Lemma 1). Gradient flow is attracted iff
    ``h'(p*) < 1``. Every root exceeds p_ref (Theorem 3). ``log10_one_minus_p`` keeps roots like 1 - 10^-1369.
    """
    _check(p_ref, beta)
    z_ref = logit(p_ref)
    grid = np.linspace(0.0, 1.0, 2001)
    upper = float(np.max(weight.omega(grid, 1.0 - grid))) * 1.01 + 1.0

    def g(z):
        p, q = sigmoid_pq(z)
        return z_ref + weight.omega(p, q) / beta - z

    out = []
    for z in _roots(g, z_ref, z_ref + upper / beta + 1.0):
        p, q = sigmoid_pq(z)
        h_prime = p * q * weight.prime(p, q) / beta
        out.append({"p": p, "logit": z, "log10_one_minus_p": -math.log1p(math.exp(z)) / math.log(10) if z < 700
                    else -z / math.log(10), "h_prime": h_prime, "stability_bound": abs(h_prime) * beta,
                    "iteration_stable": abs(h_prime) < 1.0, "flow_stable": h_prime < 1.0})
    return out


def _check(p_ref: float, beta: float) -> None:
    if not 0.0 < p_ref < 1.0:
        raise ValueError(f"p_ref must be strictly between 0 and 1 for a fixed point; got {p_ref}")
    if beta <= 0:
        raise ValueError(f"the KL weight beta must be > 0 for a fixed point; got {beta}")


def gpg_mean_only_k3_point(p_ref: float, beta: float, c: float) -> float:
    """Closed form for ``Ω ≡ c`` (mean-only advantage, e.g. GPG + k3 KL, ``c = 1 - 1/G``): the root of
    ``β(p - p_ref) = c p(1-p)`` above p_ref, ``p* = [(c-β) + sqrt((c-β)² + 4cβ p_ref)] / (2c)``."""
    return ((c - beta) + math.sqrt((c - beta) ** 2 + 4 * c * beta * p_ref)) / (2 * c)


# --------------------------------------------------------------------------------------------------------------------
# GPG (no KL): drift and coverage
# --------------------------------------------------------------------------------------------------------------------


def gpg_drift(p: float, G: int) -> float:
    """Expected per-group gradient in z of GPG's ``A = r - mean`` at α = 1: ``E[p̂(1-p̂)] = (1 - 1/G) p(1-p)``."""
    return (1.0 - 1.0 / G) * p * (1.0 - p)


def gpg_drift_alpha(p: float, G: int, P: int) -> float:
    """The same with α = B/(B-M) over a batch of P groups of this p (a step with only zero-variance groups is
    skipped): ``(1 - 1/G) p(1-p) (1 - P0^P)/(1 - P0)``, ``P0 = p^G + (1-p)^G`` — the mean over mixed groups,
    ``(1 - 1/G) p(1-p)/(1 - P0)``, times P(at least one of the P groups is mixed). P = 1 gives α = 1's drift."""
    p0 = zero_variance_probability(p, G)
    if p0 >= 1.0:
        return 0.0
    return gpg_drift(p, G) * (1.0 - p0**P) / (1.0 - p0)


def coverage_probability(p_ref: float, G: int, visits: int) -> float:
    """``P(at least one success in V visits of G samples) = 1 - (1 - p_ref)^(G V)``: a prompt never seen succeeding
    never gets a gradient (0 is absorbing). ``(0.01, 8, 10)`` → ``1 - 0.99^80`` = 0.5525."""
    return 1.0 - (1.0 - p_ref) ** (G * visits)


# --------------------------------------------------------------------------------------------------------------------
# Predictions for a resolved config
# --------------------------------------------------------------------------------------------------------------------

FORMULAS = {
    "omega_G": "Ω_G(p_ref) = E_k[p̂(1-p̂) s(k)] / (p(1-p)), k ~ Bin(G, p), s = the configured advantage's scale"
               " (reinforce_pp*: Ω_B, the same with the batch's p̂ and σ over P·G samples of this p)",
    "zero_variance_probability": "P0 = p^G + (1-p)^G (group all-success or all-failure: no signal)",
    "k3": "k3 in the loss (forward-KL gradient): roots of β(p - p_ref) = p(1-p) Ω_G(p); first = gradient-flow limit;"
          " flow_rate = -d/dz[p(1-p)Ω_G - β(p - p_ref)] > 0 is attracting",
    "k2": "k2 / reverse KL (the paper's objective with finite-G weights): fixed points of h(p) = σ(logit p_ref +"
          " Ω_G(p)/β); h'(p*) = p*(1-p*)Ω_G'(p*)/β; exact iteration stable iff β > B(p*) = p*(1-p*)|Ω_G'(p*)|",
    "paper": "the paper's population recursion h(p) = σ(logit p_ref + Ω_ε(p)/β), Ω_ε = (p(1-p)+ε)^(-1/2);"
             " B(p*) = p*(1-p*)|2p*-1| / (2[p*(1-p*)+ε]^(3/2))",
    "gpg_drift": "expected per-visit gradient in z at α = 1 (no KL): (1 - 1/G) p(1-p)",
    "gpg_drift_alpha": "with α = B/(B-M) over P = prompts_per_step groups of this p: (1-1/G) p(1-p) (1-P0^P)/(1-P0)",
    "coverage": "P(a success within V visits) = 1 - (1 - p_ref)^(G V); without one a prompt never gets a gradient",
}


def not_covered(cfg) -> list[str]:
    """What of the configured objective the one-prompt, binary-outcome analysis leaves out, in plain words."""
    a, notes = cfg.algo, []
    if a.advantage in BATCH_ADVANTAGES:
        notes.append(f"{a.advantage} whitens with the statistics of the whole batch: Ω_B assumes every one of its "
                     f"P·G = {cfg.train.prompts_per_step}·{cfg.rollout.group_size} samples comes from a prompt of "
                     "this p. In a batch of mixed prompts the whitening uses the batch's own spread, about the same "
                     "1/σ_B for every prompt (a constant weight, like GPG's); training also counts every completion "
                     "token in the statistics, one token per sample here.")
    if a.updates_per_batch > 1 or a.token_loss in ("gspo", "gspo_token", "cispo"):
        notes.append(f"token_loss={a.token_loss} with updates_per_batch={a.updates_per_batch}: the weights are those "
                     "of a batch's first update, where the ratio is exactly 1 and the clipped ratio, GSPO, GSPO-token "
                     "and CISPO all have REINFORCE's gradient; the later, clipped updates are not modelled.")
    if a.overlong_buffer_fraction > 0 or a.overlong_filter:
        notes.append("DAPO's overlong penalty and filter act on completion lengths, which the binary-outcome model "
                     "does not have: not modelled.")
    if a.drop_zero_variance:
        notes.append("drop_zero_variance averages over informative groups only, as α = B/(B-M) does: read the 'drift "
                     "α' column; the fixed points take α = 1 as for alpha_correction.")
    return notes


def predict(cfg, p_refs: list[float], visits: int = 10, paper_eps: float | None = None) -> dict:
    """Per p_ref, everything the theory says about the configured objective (a resolved :class:`mmgpg.config.Config`).

    The configured KL variant is ``algo.kl_estimator`` (k3 → ``k3``; k2 → ``k2``; k1 or ``kl_coef = 0`` → no fixed
    point); the other variant is computed too, for comparison. ``paper_eps`` defaults to ``std_eps`` for
    ``group_stabilized`` (the same ε) and 1e-5 (the paper's plots) otherwise. α is taken as 1 in Ω (with
    ``alpha_correction`` the policy term is scaled by the batch's α ≥ 1, i.e. an effectively smaller β).
    """
    a, G = cfg.algo, cfg.rollout.group_size
    beta = a.kl_coef
    eps = paper_eps if paper_eps is not None else (a.std_eps if a.advantage == "group_stabilized" else 1e-5)
    configured = a.kl_estimator if beta > 0 and a.kl_estimator in ("k2", "k3") else None
    weight, paper = configured_weight(cfg), population_weight(eps)
    rows = []
    for p_ref in p_refs:
        if not 0.0 <= p_ref <= 1.0:
            raise ValueError(f"--p-ref values must lie in [0, 1]; got {p_ref}")
        interior = 0.0 < p_ref < 1.0
        row: dict = {
            "p_ref": p_ref,
            "omega_G": float(weight.omega(p_ref, 1.0 - p_ref)),
            "zero_variance_probability": zero_variance_probability(p_ref, G),
            "gpg_drift": gpg_drift(p_ref, G),
            "gpg_drift_alpha": gpg_drift_alpha(p_ref, G, cfg.train.prompts_per_step),
            "coverage": coverage_probability(p_ref, G, visits),
        }
        for key, fn, w in (("k3", k3_stationary_points, weight), ("k2", reverse_kl_fixed_points, weight),
                           ("paper", reverse_kl_fixed_points, paper)):
            row[key] = fn(p_ref, beta, w) if beta > 0 and interior else []
        row["predicted_p_star"] = (row[configured][0]["p"] if configured and interior
                                   else (p_ref if not interior else None))
        rows.append(row)
    return {"objective": {"advantage": a.advantage, "std_eps": a.std_eps, "group_size": G, "kl_coef": beta,
                          "kl_estimator": a.kl_estimator, "configured_fixed_point": configured,
                          "alpha_correction": a.alpha_correction, "prompts_per_step": cfg.train.prompts_per_step,
                          "visits": visits, "paper_eps": eps, "weight": weight.label},
            "formulas": FORMULAS, "not_covered": not_covered(cfg), "rows": rows}


def predicted_limit(cfg, p_ref: float) -> float | None:
    """The configured objective's gradient-flow limit from ``p_ref`` (first stationary point above it): p_ref itself
    at 0 or 1 (absorbing), None when nothing pulls back (no KL, k1) — then p only drifts up."""
    if p_ref <= 0.0 or p_ref >= 1.0:
        return p_ref
    a = cfg.algo
    if a.kl_coef <= 0 or a.kl_estimator == "k1":
        return None
    weight = configured_weight(cfg)
    fn = k3_stationary_points if a.kl_estimator == "k3" else reverse_kl_fixed_points
    return fn(p_ref, a.kl_coef, weight)[0]["p"]
