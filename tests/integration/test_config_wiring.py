"""Each resampling key of the config reaches the rollout loop, and each gradient clip the optimizer step (issue 40:
guards no core test held). One short step of the tiny model per case, on tasks whose groups have no signal (every
completion scores 1) or differ by 0.001 only, so each key decides a count that the step's metrics show:

* ``algo.max_resample_attempts``: with β_th never reached, every step makes exactly that many attempts;
* ``algo.drop_zero_variance``: the update holds no zero-variance group (none at all here), not prompts_per_step;
* ``algo.zero_variance_tol``: rewards 1 and 1.001 in a group are "no signal" under 0.01 and informative under 0;
* ``train.max_grad_norm`` / ``sft.max_grad_norm``: the clip reaches the optimizer step (the RL update's and SFT's).
"""

from __future__ import annotations

import json

import pytest
from support import FIXTURE_TASKS

from mmgpg.config import resolve
from mmgpg.train.trainer import Trainer

TINY = ["model=tiny", "rollout.group_size=4", "rollout.max_new_tokens=12", "train.prompts_per_step=4",
        "train.micro_batch_prompts=2", "train.progress=false", "train.tensorboard=false", "train.max_steps=1"]


def one_step(tmp_path, task: str, *overrides: str) -> tuple[dict, list[dict]]:
    cfg = resolve([f"task={FIXTURE_TASKS}:{task}", *TINY, *overrides, f"output_dir={tmp_path}"])
    trainer = Trainer(cfg)
    trainer.runlog = None
    metrics = trainer.train_step()
    records = [json.loads(x) for x in (tmp_path / "prompt_success.jsonl").read_text().splitlines()]
    return metrics, records


def test_max_resample_attempts_and_drop_zero_variance_reach_the_rollout(tmp_path):
    """DAPO's dynamic sampling on a task without signal: exactly 3 attempts (β_th = 1 is never reached), and the
    update holds none of their 12 zero-variance groups (without drop_zero_variance it would hold 4)."""
    metrics, records = one_step(tmp_path, "SolvedShapes", "algo.min_valid_fraction=1", "algo.max_resample_attempts=3",
                                "algo.drop_zero_variance=true")
    assert metrics["rollout/resample_attempts"] == 3
    assert sorted({r["attempt"] for r in records}) == [0, 1, 2] and len(records) == 12
    assert metrics["gpg/num_samples"] == 0 and not any(r["in_update"] for r in records)


def test_zero_variance_tol_decides_what_has_no_signal(tmp_path):
    loose, _ = one_step(tmp_path / "loose", "NearlySolvedShapes", "algo.min_valid_fraction=0",
                        "algo.zero_variance_tol=0.01")
    assert loose["gpg/num_zero_variance"] == loose["gpg/num_samples"] == 16
    exact, _ = one_step(tmp_path / "exact", "NearlySolvedShapes", "algo.min_valid_fraction=0")
    assert exact["gpg/num_zero_variance"] < 16  # the same step (same seed) under tol 0: some groups differ by 0.001


def _largest_move(make, step) -> float:
    """The largest change of any weight over one ``step()`` of the trainer ``make()`` builds."""
    trainer = make()
    before = {n: p.detach().clone() for n, p in trainer.policy.model.named_parameters()}
    step(trainer)
    return max(float((p.detach() - before[n]).abs().max()) for n, p in trainer.policy.model.named_parameters())


@pytest.mark.parametrize("command", ["train", "sft"])
def test_max_grad_norm_reaches_the_optimizer_step(tmp_path, command):
    """``train.max_grad_norm`` (RL) and ``sft.max_grad_norm`` (SFT) clip the step's gradient. AdamW's first step moves
    a weight by lr · g/(|g| + eps) (bias-corrected m/√v = g/|g|): about lr for any weight with a gradient, but with
    the gradient clipped to a total norm of 1e-12, far below eps = 1e-8, by at most lr · 1e-12/1e-8 = 1e-4 lr. The
    same step (same seed) without clipping moves some weight by about lr. (No weight decay: it would move every
    weight by lr · wd · θ whatever the gradient.)"""
    from mmgpg.train.sft import SFTTrainer

    def make(clip: str):
        if command == "train":
            cfg = [f"task={FIXTURE_TASKS}:ParityShapes", *TINY, "algo.min_valid_fraction=0", "train.learning_rate=1e-3",
                   f"train.max_grad_norm={clip}"]
            return lambda: Trainer(resolve([*cfg, f"output_dir={tmp_path / clip}"]))
        cfg = ["task=shapes", "model=tiny", "sft.batch_size=4", "sft.learning_rate=1e-3", "sft.weight_decay=0",
               f"sft.max_grad_norm={clip}"]
        return lambda: SFTTrainer(resolve([*cfg, f"output_dir={tmp_path / clip}"]))

    step = (lambda t: t.update(*_informative(t))) if command == "train" else (lambda t: t.train_step())
    free, clipped = _largest_move(make("0"), step), _largest_move(make("1e-12"), step)
    assert free > 1e-4 and clipped < 1e-3 * free, (free, clipped)


def _informative(trainer):
    """A rollout with signal and its advantages (the update's inputs), sampled until one has a mixed group."""
    for _ in range(20):
        groups = trainer.rollout().update
        counts = trainer.advantages(groups)
        if not counts.skip:
            return groups, counts
    raise AssertionError("no informative group in 20 rollouts")
