"""The trainer's Objective applies the configured keys (issue 40: a key the wiring drops must fail a test): CISPO's
lower bound and the dual clip, whose defaults are "off" and so are not reached by the algorithm presets the gradient
tests run (hand-computed values on one row of ratios), and zero_variance_tol in REINFORCE++'s batch-wide signal."""

from __future__ import annotations

import math

import pytest
import torch

from mmgpg.config import resolve
from mmgpg.rollout.collect import Group
from mmgpg.task import Example
from mmgpg.train.objective import Objective


def objective(*overrides: str) -> Objective:
    return Objective(resolve(["algo.updates_per_batch=2", *overrides]).config.algo, max_new_tokens=8,
                     eos_token_ids=[0])


def test_cispo_eps_low_reaches_the_token_loss():
    # CISPO: -sg[clip(rho, 1 - 0.2, 1 + 4)] A log pi; pi = 0.5 (log pi = -0.6931), A = 1:
    # rho = 0.5 -> weight 0.8 (without the bound 0.5): 0.8 * 0.6931 = 0.5545; rho = 8 -> weight 5 -> 3.4657
    logp = torch.log(torch.tensor([[0.5, 0.5]], dtype=torch.float64))
    old = logp - torch.log(torch.tensor([[0.5, 8.0]], dtype=torch.float64))
    obj = objective("algo.token_loss=cispo", "algo.clip_eps_high=4", "algo.cispo_eps_low=0.2")
    got = obj.token_loss_fn(logp, torch.tensor([1.0], dtype=torch.float64), old_logp=old)
    assert got[0].tolist() == pytest.approx([0.8 * math.log(2), 5 * math.log(2)], abs=1e-12)


def test_dual_clip_reaches_the_token_loss():
    # clipped_ratio eps 0.2, A = -1: rho = 5 -> 5 without dual clip, capped at 3 with algo.dual_clip=3
    logp = torch.zeros(1, 2, dtype=torch.float64)
    old = -torch.log(torch.tensor([[5.0, 2.0]], dtype=torch.float64))
    adv = torch.tensor([-1.0], dtype=torch.float64)
    capped = objective("algo.token_loss=clipped_ratio", "algo.dual_clip=3").token_loss_fn(logp, adv, old_logp=old)
    assert capped[0].tolist() == pytest.approx([3.0, 2.0], abs=1e-12)
    plain = objective("algo.token_loss=clipped_ratio", "algo.clip_eps_high=0.2").token_loss_fn(logp, adv, old_logp=old)
    assert plain[0].tolist() == pytest.approx([5.0, 2.0], abs=1e-12)


def _group(rewards: list[float], zero_variance: bool) -> Group:
    return Group(example=Example(id="e", media=[], question="q", answer="a"), completion_ids=[[5, 0]] * len(rewards),
                 texts=[""] * len(rewards), rewards=rewards, components={}, zero_variance=zero_variance)


def test_zero_variance_tol_decides_whether_a_batch_whitened_step_has_signal():
    """REINFORCE++ trains every group, so "no signal" is decided on the whole batch: max - min of its rewards at most
    algo.zero_variance_tol (0.01 here) skips the step; rewards 1 and 1.001 then carry none, 1 and 1.1 do."""
    obj = objective("algo=reinforce_pp", "algo.zero_variance_tol=0.01", "algo.updates_per_batch=1")
    close = obj.advantages([_group([1.0, 1.001], True)], "cpu")
    assert close.skip and close.alpha is None
    apart = obj.advantages([_group([1.0, 1.1], False)], "cpu")
    assert not apart.skip and apart.alpha == 1.0
