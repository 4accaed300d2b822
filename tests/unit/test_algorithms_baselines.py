"""The baselines' math in mmgpg.algorithms (DAPO, GSPO, GSPO-token, CISPO, RLOO, REINFORCE++, REINFORCE++-baseline):
hand-computed numbers (worked in the comments), exact identities, and the peers' own code run on the same tensors.

Peers, imported and driven with tensors, never copied:

* TRL (``trl.trainer.grpo_trainer.GRPOTrainer._compute_loss``, a dependency of the dev extra): the loss and its
  gradient with respect to the per-token log-probs for ``loss_type="dapo"`` (+ ``epsilon_high``), ``"cispo"`` and
  ``"grpo"`` with ``importance_sampling_level="sequence"`` (GSPO). The method runs on a trainer object made without
  ``__init__``: the per-token log-probs are handed in through ``_get_per_token_logps_and_entropies``, and a
  one-process accelerator (``num_processes = 1``, ``reduce`` / ``gather`` the identity) serves its metric logging.
  Everything from the log-probs to the returned loss is TRL's code.
* verl (``verl.trainer.ppo.core_algos``: ``compute_rloo_outcome_advantage``,
  ``compute_reinforce_plus_plus_outcome_advantage``, ``compute_reinforce_plus_plus_baseline_outcome_advantage``,
  ``compute_policy_loss_vanilla`` / ``_gspo`` / ``_cispo``). verl is not a dependency of mmgpg: these tests are
  skipped unless ``import verl.trainer.ppo.core_algos`` works (``pip install --no-deps verl`` plus the light packages
  that module imports: omegaconf, tensordict, ray, codetiming, orjson).

Tolerances: float64 losses and gradients 1e-12 absolute (measured: 0 against TRL and verl's vanilla/CISPO losses;
verl's seq-mean-token-mean adds 1e-8 to each sequence's token count, so GSPO-token also allows 1e-8 relative,
measured 7e-10); verl computes its advantages in float32: 1e-5 (measured 1.2e-7).
"""

from __future__ import annotations

import collections
import math
import types

import pytest
import torch

from mmgpg import algorithms as A
from mmgpg.algorithms import (
    aggregate_tokens,
    aggregation_denominator,
    all_reduce_moments,
    batch_moments,
    bind,
    cispo_token_loss,
    clipped_ratio_token_loss,
    group_mean_advantages,
    gspo_sequence_token_loss,
    gspo_token_level_token_loss,
    overlong_filter_mask,
    overlong_penalty,
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
    reinforce_token_loss,
    rloo_advantages,
    token_loss_sum,
    whiten_with_moments,
)

TRL_TOL = 1e-12
VERL_TOL = 1e-5


# --------------------------------------------------------------------------------------------------------------------
# Hand-computed numbers
# --------------------------------------------------------------------------------------------------------------------


def test_rloo_leaves_the_sample_out():
    # [1, 0, 0, 1]: sample 0's baseline is (0 + 0 + 1)/3 = 1/3 -> 2/3; sample 1's (1 + 0 + 1)/3 = 2/3 -> -2/3
    a = rloo_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]], dtype=torch.float64))
    assert a[0].tolist() == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3], abs=1e-15)
    # [3, 1, 2]: baselines (1+2)/2 = 1.5, (3+2)/2 = 2.5, (3+1)/2 = 2 -> [1.5, -1.5, 0] (= 3/2 * (r - 2))
    b = rloo_advantages(torch.tensor([[3.0, 1.0, 2.0]], dtype=torch.float64))
    assert b[0].tolist() == pytest.approx([1.5, -1.5, 0.0], abs=1e-15)
    assert rloo_advantages(torch.tensor([[5.0]])).tolist() == [[0.0]]  # G = 1: no other sample, no signal


def test_moments_and_global_whitening_by_hand():
    r = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    lengths = torch.tensor([[3.0, 1.0]], dtype=torch.float64)
    # token-weighted: S1 = 3*1 + 1*0 = 3, S2 = 3, n = 4
    assert batch_moments(r, lengths) == (3.0, 3.0, 4.0)
    assert batch_moments(r) == (1.0, 1.0, 2.0)
    # mu = 3/4; population variance 3/4 - 9/16 = 3/16; Bessel 4/3 -> 1/4; sigma = 1/2 -> [(1-.75)/.5, -.75/.5]
    assert whiten_with_moments(r, (3.0, 3.0, 4.0), std_eps=0.0)[0].tolist() == pytest.approx([0.5, -1.5], abs=1e-15)
    with pytest.raises(ValueError, match="no sample"):
        whiten_with_moments(r, (0.0, 0.0, 0.0))
    assert all_reduce_moments((3.0, 3.0, 4.0)) == (3.0, 3.0, 4.0)  # one process: the identity


def test_reinforce_pp_uses_the_global_statistics_not_the_rank_ones():
    # rank 0 holds [[1, 0]], rank 1 [[1, 1]] (one token each). Global: S1 = 3, S2 = 3, n = 4 -> mu = 3/4, var 1/4
    rank0 = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    rank1 = torch.tensor([[1.0, 1.0]], dtype=torch.float64)
    moments = tuple(a + b for a, b in zip(batch_moments(rank0), batch_moments(rank1)))
    assert moments == (3.0, 3.0, 4.0)
    assert reinforce_pp_advantages(rank0, moments, std_eps=0.0)[0].tolist() == pytest.approx([0.5, -1.5], abs=1e-15)
    assert reinforce_pp_advantages(rank1, moments, std_eps=0.0)[0].tolist() == pytest.approx([0.5, 0.5], abs=1e-15)
    # per rank instead: rank 0 has mu 1/2, var 1/2 -> +-0.70711; rank 1 has var 0 -> 0. Different numbers.
    local = reinforce_pp_advantages(rank0, batch_moments(rank0), std_eps=0.0)
    assert local[0].tolist() == pytest.approx([math.sqrt(0.5), -math.sqrt(0.5)], abs=1e-15)


def test_reinforce_pp_baseline_by_hand():
    # [1, 0, 0, 0]: centred [.75, -.25, -.25, -.25]; S1 = 0, S2 = .5625 + 3 * .0625 = .75, n = 4
    # mu = 0, var = .75 / 3 = .25 (unbiased), sigma = .5 -> [1.5, -.5, -.5, -.5]
    r = torch.tensor([[1.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    moments = batch_moments(group_mean_advantages(r))
    assert moments == (0.0, 0.75, 4.0)
    a = reinforce_pp_baseline_advantages(r, moments, std_eps=0.0)
    assert a[0].tolist() == pytest.approx([1.5, -0.5, -0.5, -0.5], abs=1e-15)
    # a zero-variance group next to it: centred to 0, and the batch std (now over 8 samples: .75/7) scales only group 0
    r2 = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]], dtype=torch.float64)
    b = reinforce_pp_baseline_advantages(r2, batch_moments(group_mean_advantages(r2)), std_eps=0.0)
    assert b[0, 0].item() == pytest.approx(0.75 / math.sqrt(0.75 / 7), abs=1e-12)
    assert b[1].tolist() == [0.0, 0.0, 0.0, 0.0]
    # two ranks, [[1, 0, 0, 0]] and [[1, 1, 0, 0]]: centred [.75, -.25, -.25, -.25] and [.5, .5, -.5, -.5];
    # S1 = 0, S2 = .75 + 1 = 1.75, n = 8 -> var = 1.75 / 7 = .25 -> rank 1 gets [1, 1, -1, -1]
    # (rank 1 on its own: var = 1/3 -> +-0.86603)
    rank0, rank1 = r, torch.tensor([[1.0, 1.0, 0.0, 0.0]], dtype=torch.float64)
    m0, m1 = batch_moments(group_mean_advantages(rank0)), batch_moments(group_mean_advantages(rank1))
    summed = tuple(x + y for x, y in zip(m0, m1))
    assert summed == (0.0, 1.75, 8.0)
    assert reinforce_pp_baseline_advantages(rank1, summed, std_eps=0.0)[0].tolist() == pytest.approx(
        [1.0, 1.0, -1.0, -1.0], abs=1e-15)
    assert reinforce_pp_baseline_advantages(rank0, summed, std_eps=0.0)[0].tolist() == pytest.approx(
        [1.5, -0.5, -0.5, -0.5], abs=1e-15)


@pytest.mark.parametrize("centred", [False, True])
def test_ranks_with_summed_moments_give_the_single_process_advantages(centred):
    """Each rank whitening its own groups with the moments summed over ranks equals one process whitening the union
    (token-weighted, unequal lengths): the statistics are global, the data stays where it is."""
    fn = reinforce_pp_baseline_advantages if centred else reinforce_pp_advantages
    ranks = [(torch.tensor(r, dtype=torch.float64), torch.tensor(n, dtype=torch.float64))
             for r, n in zip(RANK_REWARDS, RANK_LENGTHS)]
    stats = [batch_moments(group_mean_advantages(r) if centred else r, n) for r, n in ranks]
    summed = tuple(map(sum, zip(*stats)))
    union_r = torch.cat([r for r, _ in ranks])
    union_n = torch.cat([n for _, n in ranks])
    assert summed == pytest.approx(batch_moments(group_mean_advantages(union_r) if centred else union_r, union_n))
    got = torch.cat([fn(r, summed) for r, _ in ranks])
    torch.testing.assert_close(got, fn(union_r, summed), atol=1e-15, rtol=0)
    per_rank = torch.cat([fn(r, m) for (r, _), m in zip(ranks, stats)])
    assert (per_rank - got).abs().max() > 0.1


def test_dapo_clip_higher_by_hand():
    # ratio 1.25 (old = 0, logp = log 1.25): A = +1 -> symmetric eps 0.2 clips at 1.2; clip-higher 0.28 does not
    lp = torch.tensor([[math.log(1.25), math.log(0.75), math.log(1.3)]], dtype=torch.float64)
    old = torch.zeros_like(lp)
    up = clipped_ratio_token_loss(lp, torch.tensor([1.0], dtype=torch.float64), old, 0.2, 0.28)[0].tolist()
    assert up == pytest.approx([-1.25, -0.75, -1.28], abs=1e-12)  # ratio 0.75, A > 0: min(0.75, 0.8) = 0.75
    sym = clipped_ratio_token_loss(lp, torch.tensor([1.0], dtype=torch.float64), old, 0.2)[0].tolist()
    assert sym == pytest.approx([-1.2, -0.75, -1.2], abs=1e-12)
    # A = -1, ratio 0.75: -min(-0.75, -0.8) = 0.8 (the low side stays at 1 - 0.2 = 0.8, not 1 - 0.28 = 0.72)
    down = clipped_ratio_token_loss(lp, torch.tensor([-1.0], dtype=torch.float64), old, 0.2, 0.28)[0].tolist()
    assert down == pytest.approx([1.25, 0.8, 1.3], abs=1e-12)


def test_gspo_sequence_ratio_is_the_length_normalised_mean_by_hand():
    # log ratios [0.001, 0.003] (a third, padded token with log ratio 5 is ignored): s = exp(0.002) = 1.002002
    lp = torch.tensor([[0.001, 0.003, 5.0]], dtype=torch.float64)
    old = torch.zeros_like(lp)
    mask = torch.tensor([[True, True, False]])
    s = math.exp(0.002)
    pos = gspo_sequence_token_loss(lp, torch.tensor([1.0], dtype=torch.float64), old, mask=mask)
    assert pos[0, :2].tolist() == pytest.approx([-1.0004, -1.0004], abs=1e-15)  # clipped at 1 + 4e-4
    neg = gspo_sequence_token_loss(lp, torch.tensor([-1.0], dtype=torch.float64), old, mask=mask)
    assert neg[0, :2].tolist() == pytest.approx([s, s], abs=1e-15)  # -min(-s, -1.0004) = s (a sum would be e^0.004)
    tok = gspo_token_level_token_loss(lp, torch.tensor([1.0], dtype=torch.float64), old, mask=mask)
    assert tok[0, :2].tolist() == pytest.approx([-1.0004, -1.0004], abs=1e-15)
    # inside the clip range (log ratios [1e-4, 3e-4] -> s = e^2e-4, A = 1): d(token_mean of GSPO-token)/d logp_t =
    # -s / 2 for each token (its own token only), GSPO's: -s / |o| spread over the row's tokens = the same
    small = torch.tensor([[1e-4, 3e-4]], dtype=torch.float64, requires_grad=True)
    loss = gspo_token_level_token_loss(small, torch.tensor([1.0], dtype=torch.float64), torch.zeros(1, 2,
                                       dtype=torch.float64), mask=torch.ones(1, 2, dtype=torch.bool)).mean()
    (g,) = torch.autograd.grad(loss, small)
    assert g[0].tolist() == pytest.approx([-math.exp(2e-4) / 2] * 2, abs=1e-15)


def test_cispo_weight_is_clipped_and_stop_gradient_by_hand():
    # pi = 0.6, pi_old = 0.1: ratio 6 -> weight clipped to 1 + 4 = 5 -> loss -5 * log 0.6 = 2.55413
    # pi = 0.05, pi_old = 0.1: ratio 0.5, no lower bound -> weight 0.5 -> loss -0.5 * log 0.05 = 1.49787
    lp = torch.tensor([[math.log(0.6), math.log(0.05)]], dtype=torch.float64, requires_grad=True)
    old = torch.full((1, 2), math.log(0.1), dtype=torch.float64)
    loss = cispo_token_loss(lp, torch.tensor([1.0], dtype=torch.float64), old)
    assert loss[0].tolist() == pytest.approx([-5 * math.log(0.6), -0.5 * math.log(0.05)], abs=1e-12)
    # stop-gradient: d loss / d logp = -weight * A = [-5, -0.5] (through the ratio it would be -0.5 (log 0.05 + 1))
    (g,) = torch.autograd.grad(loss.sum(), lp)
    assert g[0].tolist() == pytest.approx([-5.0, -0.5], abs=1e-12)
    # with a lower bound 0.2 the second weight becomes 0.8
    low = cispo_token_loss(lp, torch.tensor([1.0], dtype=torch.float64), old, 4.0, 0.2)
    assert low[0, 1].item() == pytest.approx(-0.8 * math.log(0.05), abs=1e-12)
    with pytest.raises(ValueError, match="upper bound"):
        cispo_token_loss(lp, torch.tensor([1.0], dtype=torch.float64), old, None)


def test_overlong_penalty_and_filter_by_hand():
    # L_max = 20, L_cache = 4: no penalty up to 16, then (16 - L)/4 down to -1 at 20, -1 beyond
    lengths = torch.tensor([3, 16, 17, 18, 20, 21])
    assert overlong_penalty(lengths, 20, 4).tolist() == [0.0, 0.0, -0.25, -0.5, -1.0, -1.0]
    # DAPO's own numbers: L_max = 20480, L_cache = 4096 -> 18432 tokens is halfway into the buffer
    assert overlong_penalty(torch.tensor([16384, 18432, 20480]), 20480, 4096).tolist() == [0.0, -0.5, -1.0]
    for bad in [(20, 0), (20, 21)]:
        with pytest.raises(ValueError):
            overlong_penalty(lengths, *bad)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]], dtype=torch.bool)
    kept = overlong_filter_mask(mask, torch.tensor([False, True, False]))
    assert kept.tolist() == [[True, True, False], [False, False, False], [True, False, False]]
    # the filtered rows add nothing to the loss nor to token_mean's denominator: (1 + 2 + 4) / 3 tokens
    loss = torch.tensor([[1.0, 2.0, 9.0], [9.0, 9.0, 9.0], [4.0, 9.0, 9.0]])
    assert aggregate_tokens(loss, kept, "token_mean").item() == pytest.approx(7 / 3)


def test_aggregation_table_keeps_the_modes_and_dapo_is_token_mean():
    assert tuple(A.AGGREGATIONS) == ("token_mean", "seq_mean_token_mean", "constant_length")
    loss = torch.tensor([[1.0, 2.0, 9.0], [4.0, 9.0, 9.0]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    # DAPO's token-level loss: sum over all valid tokens / their number = (1 + 2 + 4) / 3
    assert token_loss_sum(loss, mask, "token_mean").item() == 7.0
    assert aggregation_denominator("token_mean", 2, 3, 3) == 3.0
    assert aggregation_denominator("seq_mean_token_mean", 2, 3, 3) == 2.0
    assert aggregation_denominator("constant_length", 2, 3, 5) == 10.0
    assert aggregation_denominator("seq_mean_token_mean", 0, 0, 5) == 1.0  # never 0
    with pytest.raises(ValueError, match="aggregation must be one of"):
        token_loss_sum(loss, mask, "seq_mean_token_sum")


def test_registries_and_bind():
    assert {"rloo", "reinforce_pp", "reinforce_pp_baseline"} <= set(A.ADVANTAGES)
    assert {"cispo", "gspo", "gspo_token"} <= set(A.TOKEN_LOSSES)
    hyper = {"clip_eps": 3e-4, "clip_eps_high": 4e-4, "std_eps": 1e-8}
    assert bind(A.TOKEN_LOSSES["gspo"], **hyper).keywords == {"clip_eps": 3e-4, "clip_eps_high": 4e-4}
    assert bind(A.TOKEN_LOSSES["cispo"], **hyper).keywords == {"clip_eps_high": 4e-4}  # no lower bound from clip_eps
    assert bind(A.TOKEN_LOSSES["reinforce"], **hyper).keywords == {}
    assert bind(A.ADVANTAGES["rloo"], **hyper).keywords == {}
    assert bind(A.ADVANTAGES["reinforce_pp"], **hyper).keywords == {"std_eps": 1e-8}


# --------------------------------------------------------------------------------------------------------------------
# Identities
# --------------------------------------------------------------------------------------------------------------------


def _batch(seed: int, n: int = 8, t: int = 6, spread: float = 0.5):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(n, t, generator=g, dtype=torch.float64) * 3
    old = logp + (torch.rand(n, t, generator=g, dtype=torch.float64) * 2 - 1) * spread
    adv = torch.randn(n, generator=g, dtype=torch.float64)
    lengths = torch.randint(1, t + 1, (n,), generator=g)
    mask = torch.arange(t)[None, :] < lengths[:, None]
    return logp, old, adv, mask


def _loss_and_grad(fn, aggregation, logp, adv, completion_mask, /, **kw):
    """The aggregated loss of ``fn`` (keywords ``kw``) and its gradient with respect to the log-probs."""
    leaf = logp.detach().clone().requires_grad_(True)
    loss = aggregate_tokens(fn(leaf, adv, **kw), completion_mask, aggregation)
    (g,) = torch.autograd.grad(loss, leaf)
    return loss.detach(), g


def test_one_update_gspo_and_cispo_gradients_are_gpgs():
    """old_logp = None (one update per batch): s_i = ρ = 1, so GSPO/GSPO-token with seq_mean_token_mean and CISPO
    with token_mean have exactly GPG's -A ∇log π gradient under the same aggregation."""
    logp, _, adv, mask = _batch(1)
    for fn, agg in [(gspo_sequence_token_loss, "seq_mean_token_mean"),
                    (gspo_token_level_token_loss, "seq_mean_token_mean"), (cispo_token_loss, "token_mean")]:
        kw = {"mask": mask} if fn is not cispo_token_loss else {}
        _, got = _loss_and_grad(fn, agg, logp, adv, mask, **kw)
        _, want = _loss_and_grad(reinforce_token_loss, agg, logp, adv, mask)
        torch.testing.assert_close(got, want, atol=1e-15, rtol=0)


def test_gspo_token_with_sequence_advantages_has_gspos_value_and_gradient():
    logp, old, adv, mask = _batch(2, n=16, spread=2e-3)
    v1, g1 = _loss_and_grad(gspo_sequence_token_loss, "seq_mean_token_mean", logp, adv, mask, old_logp=old, mask=mask)
    v2, g2 = _loss_and_grad(gspo_token_level_token_loss, "seq_mean_token_mean", logp, adv, mask, old_logp=old,
                            mask=mask)
    torch.testing.assert_close(v1, v2, atol=1e-15, rtol=0)
    torch.testing.assert_close(g1, g2, atol=1e-15, rtol=0)
    assert g1.abs().sum() > 0


# --------------------------------------------------------------------------------------------------------------------
# TRL: GRPOTrainer._compute_loss on the same tensors
# --------------------------------------------------------------------------------------------------------------------


class _OneProcess:
    """What _compute_loss asks of accelerate in one process (its metric logging): nothing to reduce or gather."""

    num_processes = 1
    sync_gradients = True

    def reduce(self, x, reduction="sum"):
        return x

    def gather(self, x):
        return x


def _trl(loss_type: str, level: str, epsilon: float, epsilon_high: float, logp, old, adv, mask):
    """TRL's loss and d loss / d logp: GRPOTrainer._compute_loss on a trainer made without __init__ whose
    _get_per_token_logps_and_entropies returns ``logp``."""
    from trl.trainer.grpo_trainer import GRPOTrainer

    trainer = object.__new__(GRPOTrainer)
    leaf = logp.detach().clone().requires_grad_(True)
    trainer._get_per_token_logps_and_entropies = lambda *a, **k: (leaf, torch.zeros_like(leaf), None)
    trainer.__dict__.update(
        top_entropy_quantile=1.0, off_policy_mask_threshold=None, importance_sampling_level=level, beta=0.0,
        loss_type=loss_type, epsilon_low=epsilon, epsilon_high=epsilon_high, use_vllm=False,
        args=types.SimpleNamespace(delta=None, use_bias_correction_kl=False, steps_per_generation=1),
        model=types.SimpleNamespace(training=True), current_gradient_accumulation_steps=1, accelerator=_OneProcess(),
        _entropy_bonus_enabled=False, aux_loss_enabled=False,
        _metrics={"train": collections.defaultdict(list), "eval": collections.defaultdict(list)})
    n, t = logp.shape
    m = mask.to(logp.dtype)
    inputs = {"prompt_ids": torch.zeros(n, 1, dtype=torch.long), "prompt_mask": torch.ones(n, 1, dtype=logp.dtype),
              "completion_ids": torch.zeros(n, t, dtype=torch.long), "completion_mask": m, "advantages": adv,
              "old_per_token_logps": old, "num_items_in_batch": m.sum()}
    loss = trainer._compute_loss(None, inputs)
    (g,) = torch.autograd.grad(loss, leaf)
    return loss.detach(), g


def _ratio_batch(seed: int, n: int, t: int, low: float, high: float):
    """Log-probs and old log-probs whose per-token ratios are spread log-uniformly over [low, high]."""
    logp, _, adv, mask = _batch(seed, n, t)
    g = torch.Generator().manual_seed(seed + 1000)
    log_ratio = math.log(low) + torch.rand(n, t, generator=g, dtype=torch.float64) * (math.log(high) - math.log(low))
    return logp, logp - log_ratio, adv, mask


def test_dapo_matches_trl():
    logp, old, adv, mask = _ratio_batch(3, 32, 8, 0.6, 1.5)
    ratio = (logp - old).exp()[mask]
    # every region is populated: below 0.72, in [0.72, 0.8) (where the low bound's epsilon matters), inside,
    # in (1.2, 1.28] (where clip-higher matters) and above 1.28
    for lo, hi in [(0, 0.72), (0.72, 0.8), (0.8, 1.2), (1.2, 1.28), (1.28, 9)]:
        assert ((ratio >= lo) & (ratio < hi)).sum() >= 3
    want = _trl("dapo", "token", 0.2, 0.28, logp, old, adv, mask)
    got = _loss_and_grad(clipped_ratio_token_loss, "token_mean", logp, adv, mask, old_logp=old, clip_eps=0.2,
                         clip_eps_high=0.28)
    torch.testing.assert_close(got[0], want[0], atol=TRL_TOL, rtol=0)
    torch.testing.assert_close(got[1], want[1], atol=TRL_TOL, rtol=0)


def test_cispo_matches_trl():
    logp, old, adv, mask = _ratio_batch(4, 32, 8, 0.3, 8.0)
    assert ((logp - old).exp()[mask] > 5).sum() >= 3  # some weights are clipped at 5
    want = _trl("cispo", "token", 0.2, 5.0, logp, old, adv, mask)  # TRL: clamp(ratio, max=epsilon_high = 5.0)
    got = _loss_and_grad(cispo_token_loss, "token_mean", logp, adv, mask, old_logp=old, clip_eps_high=4.0)
    torch.testing.assert_close(got[0], want[0], atol=TRL_TOL, rtol=0)
    torch.testing.assert_close(got[1], want[1], atol=TRL_TOL, rtol=0)


def test_gspo_matches_trl_sequence_level():
    logp, old, adv, mask = _batch(5, n=48, t=6, spread=2e-3)
    s = torch.exp(((logp - old) * mask).sum(1) / mask.sum(1))
    assert ((s < 1 - 3e-4) | (s > 1 + 4e-4)).sum() >= 5 and ((s > 1 - 3e-4) & (s < 1 + 4e-4)).sum() >= 5
    want = _trl("grpo", "sequence", 3e-4, 4e-4, logp, old, adv, mask)
    got = _loss_and_grad(gspo_sequence_token_loss, "seq_mean_token_mean", logp, adv, mask, old_logp=old, mask=mask,
                         clip_eps=3e-4, clip_eps_high=4e-4)
    torch.testing.assert_close(got[0], want[0], atol=TRL_TOL, rtol=0)
    torch.testing.assert_close(got[1], want[1], atol=TRL_TOL, rtol=0)


# --------------------------------------------------------------------------------------------------------------------
# verl: core_algos on the same tensors (skipped where verl is not importable)
# --------------------------------------------------------------------------------------------------------------------


def _verl():
    return pytest.importorskip("verl.trainer.ppo.core_algos")


# Two ranks with different data (rank 1 succeeds more and writes longer): rank r holds groups 2r, 2r+1 of G = 4.
RANK_REWARDS = [[[1, 0, 0, 1], [0, 0, 0, 1]], [[1, 1, 1, 0], [1, 1, 0.5, 1]]]
RANK_LENGTHS = [[[3, 5, 2, 4], [6, 1, 2, 2]], [[7, 8, 3, 9], [5, 9, 9, 4]]]
T = 9


def _verl_outcome_inputs():
    """The concatenated batch as verl takes it: token-level rewards (the outcome on the last valid token), the
    response mask and the prompt index of every row."""
    import numpy as np

    rewards = torch.tensor(RANK_REWARDS, dtype=torch.float32).reshape(-1)
    lengths = torch.tensor(RANK_LENGTHS).reshape(-1)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    token_rewards = torch.zeros(len(rewards), T)
    token_rewards[torch.arange(len(rewards)), lengths - 1] = rewards
    return token_rewards, mask, np.repeat(np.arange(4), 4)


def _per_rank(fn, centred: bool, global_stats: bool):
    """mmgpg's advantages rank by rank, with the moments summed over both ranks (global) or each rank's own."""
    ranks = [(torch.tensor(r, dtype=torch.float64), torch.tensor(n, dtype=torch.float64))
             for r, n in zip(RANK_REWARDS, RANK_LENGTHS)]
    local = [batch_moments(group_mean_advantages(r) if centred else r, n) for r, n in ranks]
    summed = tuple(map(sum, zip(*local)))
    return torch.cat([fn(r, summed if global_stats else m).reshape(-1) for (r, _), m in zip(ranks, local)])


def _tokens(per_sequence: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return per_sequence.float()[:, None] * mask


def test_rloo_matches_verl():
    C = _verl()
    token_rewards, mask, index = _verl_outcome_inputs()
    want, _ = C.compute_rloo_outcome_advantage(token_rewards.clone(), mask, index)
    got = rloo_advantages(torch.tensor(RANK_REWARDS, dtype=torch.float64).reshape(4, 4)).reshape(-1)
    torch.testing.assert_close(_tokens(got, mask), want, atol=VERL_TOL, rtol=0)


def test_reinforce_pp_matches_verl_with_global_statistics_only():
    C = _verl()
    from verl.trainer.config import AlgoConfig

    token_rewards, mask, _ = _verl_outcome_inputs()
    want, _ = C.compute_reinforce_plus_plus_outcome_advantage(token_rewards.clone(), mask, config=AlgoConfig(gamma=1.0))
    got = _per_rank(reinforce_pp_advantages, centred=False, global_stats=True)
    torch.testing.assert_close(_tokens(got, mask), want, atol=VERL_TOL, rtol=0)
    per_rank = _per_rank(reinforce_pp_advantages, centred=False, global_stats=False)
    assert (_tokens(per_rank, mask) - want).abs().max() > 0.1  # normalising per rank is detectably wrong


def test_reinforce_pp_baseline_matches_verl_with_global_statistics_only():
    C = _verl()
    token_rewards, mask, index = _verl_outcome_inputs()
    want, _ = C.compute_reinforce_plus_plus_baseline_outcome_advantage(token_rewards.clone(), mask, index)
    got = _per_rank(reinforce_pp_baseline_advantages, centred=True, global_stats=True)
    torch.testing.assert_close(_tokens(got, mask), want, atol=VERL_TOL, rtol=0)
    per_rank = _per_rank(reinforce_pp_baseline_advantages, centred=True, global_stats=False)
    assert (_tokens(per_rank, mask) - want).abs().max() > 0.1


def _verl_policy_loss(name: str, agg: str, logp, old, adv, mask, low: float, high: float, **extra):
    C = _verl()
    from verl.workers.config import ActorConfig

    cfg = ActorConfig(strategy="fsdp", clip_ratio=low, clip_ratio_low=low, clip_ratio_high=high,
                      ppo_micro_batch_size_per_gpu=1, rollout_n=1, **extra)
    leaf = logp.detach().clone().requires_grad_(True)
    loss, _ = getattr(C, f"compute_policy_loss_{name}")(old, leaf, adv[:, None].expand_as(logp), mask.to(logp.dtype),
                                                        agg, cfg)
    (g,) = torch.autograd.grad(loss, leaf)
    return loss.detach(), g


def test_dapo_gspo_token_and_cispo_match_verl():
    # DAPO: verl's vanilla loss with clip_ratio_low/high 0.2/0.28 (its dual clip at 3 is never reached: ratios <= 1.5)
    logp, old, adv, mask = _ratio_batch(6, 32, 8, 0.6, 1.5)
    want = _verl_policy_loss("vanilla", "token-mean", logp, old, adv, mask, 0.2, 0.28)
    got = _loss_and_grad(clipped_ratio_token_loss, "token_mean", logp, adv, mask, old_logp=old, clip_eps=0.2,
                         clip_eps_high=0.28)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=TRL_TOL, rtol=0)
    # GSPO-token: verl's gspo loss is the token form sg[s_i] * pi / sg[pi] (seq-mean-token-mean, whose per-sequence
    # token count carries + 1e-8: a relative difference of about 1e-8 / |o_i|, measured 4e-9)
    logp, old, adv, mask = _batch(7, n=48, t=6, spread=2e-3)
    want = _verl_policy_loss("gspo", "seq-mean-token-mean", logp, old, adv, mask, 3e-4, 4e-4)
    got = _loss_and_grad(gspo_token_level_token_loss, "seq_mean_token_mean", logp, adv, mask, old_logp=old, mask=mask)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=TRL_TOL, rtol=1e-8)
    # CISPO: verl clips on both sides (clip_ratio_low), here 0.2 and 4.0
    logp, old, adv, mask = _ratio_batch(8, 32, 8, 0.3, 8.0)
    want = _verl_policy_loss("cispo", "token-mean", logp, old, adv, mask, 0.2, 4.0)
    got = _loss_and_grad(cispo_token_loss, "token_mean", logp, adv, mask, old_logp=old, clip_eps_high=4.0,
                         cispo_eps_low=0.2)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=TRL_TOL, rtol=0)


def test_dual_clip_by_hand():
    # eps 0.2, C = 3: A = -1, rho = 5: the clip gives -min(-5, -1.2) = 5, capped at -C A = 3; rho = 2: 2 < 3 stays;
    # A = -2, rho = 4: -min(-8, -2.4) = 8 -> 6; A = +1, rho = 5: -min(5, 1.2) = -1.2, no cap for A > 0
    logp = torch.zeros(1, 4, dtype=torch.float64, requires_grad=True)
    old = -torch.log(torch.tensor([[5.0, 2.0, 4.0, 5.0]], dtype=torch.float64))
    adv = torch.tensor([[-1.0, -1.0, -2.0, 1.0]], dtype=torch.float64)
    loss = clipped_ratio_token_loss(logp, adv, old, clip_eps=0.2, dual_clip=3.0)
    assert loss[0].tolist() == pytest.approx([3.0, 2.0, 6.0, -1.2], abs=1e-12)
    assert clipped_ratio_token_loss(logp, adv, old, clip_eps=0.2)[0].tolist() == pytest.approx([5.0, 2.0, 8.0, -1.2])
    (g,) = torch.autograd.grad(loss.sum(), logp)
    # d/dlogp of -A rho = -A rho: token 2 (rho = 2, A = -1) -> 2; capped or clipped tokens -> 0
    assert g[0].tolist() == pytest.approx([0.0, 2.0, 0.0, 0.0], abs=1e-12)


def test_dual_clip_matches_verl_and_verls_default_differs_from_none():
    """verl's vanilla policy loss applies dual clip with clip_ratio_c = 3 by default: mmgpg's clipped_ratio with
    dual_clip=3 equals it (loss and gradient) on ratios up to 8; without dual clip mmgpg equals verl only when verl's
    C is out of reach, and differs from verl's default on this batch."""
    logp, old, adv, mask = _ratio_batch(9, 32, 8, 0.3, 8.0)
    ratio = (logp - old).exp()
    assert ((ratio > 3) & (adv[:, None] < 0) & mask).sum() >= 10  # the cap acts on some tokens
    want = _verl_policy_loss("vanilla", "token-mean", logp, old, adv, mask, 0.2, 0.28)  # verl's default C = 3
    got = _loss_and_grad(clipped_ratio_token_loss, "token_mean", logp, adv, mask, old_logp=old, clip_eps=0.2,
                         clip_eps_high=0.28, dual_clip=3.0)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=TRL_TOL, rtol=0)
    off = _loss_and_grad(clipped_ratio_token_loss, "token_mean", logp, adv, mask, old_logp=old, clip_eps=0.2,
                         clip_eps_high=0.28)
    assert abs(off[0] - want[0]) > 1e-3
    unreachable = _verl_policy_loss("vanilla", "token-mean", logp, old, adv, mask, 0.2, 0.28, clip_ratio_c=1e9)
    for a, b in zip(off, unreachable):
        torch.testing.assert_close(a, b, atol=TRL_TOL, rtol=0)


# --------------------------------------------------------------------------------------------------------------------
# all_reduce_moments under real torch.distributed (gloo, 2 processes)
# --------------------------------------------------------------------------------------------------------------------


def _moments_worker(rank: int, world: int, init_file: str, out: str) -> None:
    import os

    import torch.distributed as dist

    os.environ.update(WORLD_SIZE=str(world), RANK=str(rank), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        r = torch.tensor(RANK_REWARDS[rank], dtype=torch.float64)
        n = torch.tensor(RANK_LENGTHS[rank], dtype=torch.float64)
        moments = all_reduce_moments(batch_moments(r, n))
        torch.save({"moments": moments, "adv": reinforce_pp_advantages(r, moments)}, f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
def test_all_reduce_moments_gives_every_rank_the_global_statistics(tmp_path):
    import torch.multiprocessing as mp

    mp.spawn(_moments_worker, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    every = torch.tensor(RANK_REWARDS, dtype=torch.float64).reshape(4, 4)
    single = batch_moments(every, torch.tensor(RANK_LENGTHS, dtype=torch.float64).reshape(4, 4))
    assert ranks[0]["moments"] == pytest.approx(single, abs=1e-12) and ranks[1]["moments"] == ranks[0]["moments"]
    both = torch.cat([ranks[0]["adv"], ranks[1]["adv"]])
    torch.testing.assert_close(both, reinforce_pp_advantages(every, single), atol=1e-12, rtol=0)
