"""algo.rollout_correction: the weights by hand (token_tis, seq_tis, seq_mis), their statistics, the errors, and the
trainer's gradient with the weights against a hand-written one-sequence-at-a-time reference on a scripted batch
whose behaviour log-probs are the trainer's own shifted by known offsets (as a stale or mismatched engine would
return them)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from support.gradient_reference import (
    ALPHA,
    gpg_advantages,
    make_groups,
    make_trainer,
    relative_error,
    sequence_token_logprobs,
)

from mmgpg import correction as algorithms
from mmgpg.config import resolve
from mmgpg.typed import ConfigError

LN = math.log
D = torch.tensor([[LN(2), LN(0.5), 0.0], [LN(3), 0.0, 0.0]], dtype=torch.float64)
MASK = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)


def test_weights_by_hand():
    torch.testing.assert_close(algorithms.token_tis_weights(D, MASK, 2.5),
                               torch.tensor([[2.0, 0.5, 0.0], [2.5, 0.0, 0.0]], dtype=torch.float64))
    torch.testing.assert_close(algorithms.seq_tis_weights(D, MASK, 2.5),
                               torch.tensor([[1.0, 1.0, 0.0], [2.5, 0.0, 0.0]], dtype=torch.float64))
    torch.testing.assert_close(algorithms.seq_mis_weights(D, MASK, 2.5),
                               torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64))
    torch.testing.assert_close(algorithms.seq_mis_weights(D, MASK, 3.5),  # row 1's 3 is under the bound: kept
                               torch.tensor([[1.0, 1.0, 0.0], [3.0, 0.0, 0.0]], dtype=torch.float64))
    torch.testing.assert_close(algorithms.no_rollout_correction(D, MASK, 2.5), MASK.double())


def test_statistics_by_hand():
    w = algorithms.token_tis_weights(D, MASK, 2.5)
    total, squares, n, above, most = algorithms.rollout_correction_stats(D, w, MASK, level="token", bound=2.5)
    assert (total, squares, n, above) == pytest.approx((5.0, 10.5, 3, 1)) and most == pytest.approx(LN(3))
    w = algorithms.seq_tis_weights(D, MASK, 2.5)  # sequences: ratios 1 and 3 → weights 1 and 2.5
    total, squares, n, above, most = algorithms.rollout_correction_stats(D, w, MASK, level="sequence", bound=2.5)
    assert (total, squares, n, above) == pytest.approx((3.5, 7.25, 2, 1)) and most == pytest.approx(LN(3))


def test_log_ratio_and_its_errors():
    d = algorithms.rollout_log_ratio(torch.tensor([[-1.0, -2.0, 5.0]]), torch.tensor([[-1.5, -2.0, float("nan")]]),
                                     torch.tensor([[1, 1, 0]], dtype=torch.bool))
    torch.testing.assert_close(d, torch.tensor([[0.5, 0.0, 0.0]], dtype=torch.float64))  # NaN outside the mask: 0
    with pytest.raises(ValueError, match=r"rows \[1\] is NaN"):
        algorithms.rollout_log_ratio(torch.zeros(2, 2), torch.tensor([[0.0, 0.0], [float("nan"), 0.0]]),
                                     torch.ones(2, 2, dtype=torch.bool))


def test_config_refuses_a_bound_at_one_and_unknown_names():
    with pytest.raises(ConfigError, match="rollout_correction_bound"):
        resolve(["algo.rollout_correction=token_tis", "algo.rollout_correction_bound=1.0"])
    with pytest.raises(ConfigError, match="token_tis"):
        resolve(["algo.rollout_correction=token_tsi"])


OFFSETS = (0.4, -0.3, 0.9, -1.2)  # behaviour = trainer − offset, so the ratio of token t is exp(offset): 1.49, 0.74, 2.46, 0.30


def _behaviour(trainer, groups):
    """Per completion: the trainer's own log-probs minus a known offset per token (a stale engine's)."""
    out = []
    for g in groups:
        prompt = trainer.task.prompt(g.example)
        rows = []
        for c in g.completion_ids:
            with torch.no_grad():
                lp = sequence_token_logprobs(trainer.policy, prompt, c)
            rows.append([float(x) - OFFSETS[t % 4] for t, x in enumerate(lp)])
        out.append(rows)
    return out


def _reference(trainer, groups, behaviour, mode: str, bound: float):
    """−α/B Σ_i A_i Σ_t w_it log π(o_it) / |o_i| (seq_mean_token_mean), the weights from the same detached
    log-probs, written out per mode; one sequence at a time."""
    model = trainer.policy.model
    model.zero_grad(set_to_none=True)
    B = sum(len(g.completion_ids) for g in groups)
    for g, rows in zip(groups, behaviour):
        prompt = trainer.task.prompt(g.example)
        for c, A, beh in zip(g.completion_ids, gpg_advantages(g.rewards), rows):
            if A == 0:
                continue
            logp = sequence_token_logprobs(trainer.policy, prompt, c)
            ratio = torch.exp(logp.detach().double() - torch.tensor(beh, dtype=torch.float64))
            if mode == "token_tis":
                w = torch.clamp(ratio, max=bound)
            else:
                seq = float(ratio.prod())
                w = torch.full_like(ratio, min(seq, bound) if mode == "seq_tis" else (seq if seq <= bound else 0.0))
            (-ALPHA * A * (w.float() * logp).sum() / len(c) / B).backward()
    out = {n: p.grad.clone() if p.grad is not None else torch.zeros_like(p) for n, p in model.named_parameters()
           if p.requires_grad}
    model.zero_grad(set_to_none=True)
    return out


@pytest.mark.parametrize("mode,bound", [("token_tis", 2.0), ("seq_tis", 2.0), ("seq_mis", 3.0)])
def test_trainer_gradient_with_the_correction_equals_the_reference(tiny_dirs, tmp_path, mode, bound):
    trainer = make_trainer(str(tiny_dirs["qwen2_vl"]), str(tmp_path), "gpg", f"algo.rollout_correction={mode}",
                           f"algo.rollout_correction_bound={bound}")
    groups = make_groups(trainer, [0, 1, 2, 3])
    behaviour = _behaviour(trainer, groups)
    for g, rows in zip(groups, behaviour):
        g.sampled_logprobs = rows
    counts = trainer.advantages(groups)
    model = trainer.policy.model
    model.zero_grad(set_to_none=True)
    trainer.compute_gradients(groups, counts)
    got = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    want = _reference(trainer, groups, behaviour, mode, bound)
    assert relative_error(got, want) < 1e-5
    # the weights matter: without them the gradient is far from this reference
    for g in groups:
        g.sampled_logprobs = None
    plain = make_trainer(str(tiny_dirs["qwen2_vl"]), str(tmp_path / "plain"), "gpg")
    model = plain.policy.model
    model.zero_grad(set_to_none=True)
    plain.compute_gradients(groups, plain.advantages(groups))
    assert relative_error({n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}, want) > 0.05


def test_a_missing_behaviour_logprob_names_the_engine(tiny_dirs, tmp_path):
    trainer = make_trainer(str(tiny_dirs["qwen2_vl"]), str(tmp_path), "gpg", "algo.rollout_correction=token_tis")
    groups = make_groups(trainer, [0, 1])
    with pytest.raises(ValueError, match="the hf engine returned none"):
        trainer.compute_gradients(groups, trainer.advantages(groups))


@pytest.mark.parametrize("top_p", [1.0, 0.7])
def test_hf_engine_run_logs_the_weights(tmp_path, top_p):
    """`train` with the HF engine and token_tis: rollout_is/* in metrics.jsonl. The HF engine samples with the
    trained weights, so at top_p 1 every weight is 1 up to float rounding (the engine's KV-cache forward vs the
    trainer's full one); at top_p 0.7 the engine's nucleus renormalises, its log-probs are higher, so the weights
    fall below 1: the correction sees the mismatch that the nucleus makes."""
    from support import FIXTURE_TASKS

    from mmgpg.train.trainer import Trainer

    run = tmp_path / "run"
    Trainer(resolve([f"task={FIXTURE_TASKS}:ParityShapes", "model=tiny", "model.dtype=float32", "rollout.group_size=4",
                     "rollout.max_new_tokens=8", "train.prompts_per_step=4", "train.max_steps=1",
                     "train.progress=false", "train.tensorboard=false", "rollout.temperature=0.9",
                     f"rollout.top_p={top_p}", "algo.rollout_correction=token_tis", f"output_dir={run}"])).train()
    (m,) = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    if m["gpg/skipped_steps"]:
        pytest.skip("no informative group in this step")
    assert m["rollout_is/ess"] <= 1.0 and m["rollout_is/truncated_fraction"] == 0.0
    if top_p == 1.0:
        assert abs(m["rollout_is/mean"] - 1) < 1e-4 and abs(m["rollout_is/max"] - 1) < 1e-4
        assert m["rollout_is/ess"] > 1 - 1e-6
    else:
        assert m["rollout_is/mean"] < 0.99 and m["rollout_is/max"] <= 1 + 1e-4
