"""The trainer end to end on the tiny model: the CLI for each algorithm, resampling and α bookkeeping, frozen
vision tower, and exact resume after SIGKILL / SIGTERM."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from support import FIXTURE_TASKS, comparable
from support.faults_support import kill_after_checkpoint

from mmgpg.config import resolve
from mmgpg.train.trainer import Trainer

FIXTURES = FIXTURE_TASKS
TINY = ["model=tiny", "rollout.group_size=4", "rollout.max_new_tokens=12", "train.prompts_per_step=4",
        "train.micro_batch_prompts=2", "train.learning_rate=1e-3", "train.progress=false", "train.tensorboard=false"]


def run_cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "mmgpg", *args], capture_output=True, text=True, timeout=900)
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def read_metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("algo", ["gpg", "grpo", "dr_grpo"])
def test_train_cli_runs_each_algorithm(tmp_path, algo):
    run = tmp_path / algo
    run_cli("train", f"algo={algo}", f"task={FIXTURES}:ParityShapes", *TINY, "train.max_steps=2",
            "train.tensorboard=true", f"output_dir={run}")
    metrics = read_metrics(run)
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        for key in ("reward/total", "reward/accuracy", "gpg/alpha", "gpg/valid_fraction", "rollout/resample_attempts",
                    "time/rollout", "time/advantages", "time/update", "loss/policy", "loss/kl"):
            assert key in m, key
        # measured peak memory per phase (process RSS; the tiny model's process holds well over 100 MiB)
        assert 100 < m["memory/rollout_rss_mib"] < 20_000 and 100 < m["memory/update_rss_mib"] < 20_000
        assert m["gpg/alpha"] == pytest.approx(
            m["gpg/num_samples"] / (m["gpg/num_samples"] - m["gpg/num_zero_variance"])
            if algo == "gpg" and m["gpg/num_zero_variance"] < m["gpg/num_samples"] else 1.0)
    padding = [m["update/padding_fraction"] for m in metrics if "update/padding_fraction" in m]  # not on skipped steps
    assert padding and all(0 <= p < 1 for p in padding)
    # mmgpg plan's prediction once per run, beside the first step's measured memory
    assert metrics[0]["plan/peak_mib"] >= metrics[0]["plan/persistent_mib"] > 0 and "plan/peak_mib" not in metrics[1]
    if algo == "grpo":
        # The policy equals the reference before the first update: k3 is exactly 0. After an update it is not.
        assert metrics[0]["loss/kl"] == 0.0 and metrics[0]["grad_norm"] > 0
        assert metrics[1]["loss/kl"] > 0
    assert (run / "checkpoints" / "step-00000002" / "policy" / "model.safetensors").exists()
    assert list((run / "tensorboard").iterdir())
    records = [json.loads(x) for x in (run / "prompt_success.jsonl").read_text().splitlines()]
    assert {r["step"] for r in records} == {1, 2}
    for r in records:  # ParityShapes: success = an even-length completion = accuracy reward 1 (its only reward)
        assert r["success"] == [int(x >= 1) for x in r["rewards"]] and r["successes"] == sum(r["success"])
        assert r["zero_variance"] == (len(set(r["rewards"])) == 1) and r["group_size"] == 4
    for step in (1, 2):
        assert sum(r["in_update"] for r in records if r["step"] == step) == 4  # prompts_per_step
    # the saved policy is a plain HF directory
    from transformers import AutoModelForImageTextToText

    AutoModelForImageTextToText.from_pretrained(run / "checkpoints" / "step-00000002" / "policy")


# The baselines of issue 21 and the GPG paper's Table 9 ablations, each from its configs/algo file as it stands.
BASELINES = ["dapo", "gspo", "gspo_token", "cispo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "gpg_kl",
             "gpg_clip", "gpg_token_mean"]
BASELINES_IN_CI = {"dapo", "gspo", "reinforce_pp", "gpg_kl"}
"""CI runs one of each kind (dynamic sampling, several updates per batch with sequence ratios, global whitening, GPG
with a KL term); the others run with ``--runslow`` (each is ~20 s on 2 CPU cores; their losses are unit-tested
against TRL and verl in tests/unit/test_algorithms_baselines.py)."""


@pytest.mark.parametrize("algo", [a if a in BASELINES_IN_CI else pytest.param(a, marks=pytest.mark.slow)
                                  for a in BASELINES])
def test_train_cli_runs_each_baseline(tmp_path, algo):
    """`mmgpg train algo=NAME` for 2 steps on CPU: finite losses, a real update, updates_per_batch optimizer steps
    per rollout batch, and DAPO's dynamic sampling keeps zero-variance groups out of the update."""
    run = tmp_path / algo
    run_cli("train", f"algo={algo}", f"task={FIXTURES}:ParityShapes", *TINY, "train.max_steps=2", "train.save_every=1",
            f"output_dir={run}")
    cfg = resolve([f"algo={algo}"]).config.algo
    metrics = read_metrics(run)
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(m["loss/policy"] == m["loss/policy"] and abs(m["loss/policy"]) < 1e3 for m in metrics)
    state = torch.load(run / "checkpoints" / "step-00000002" / "trainer_state.pt", weights_only=False)["counters"]
    assert state["optimizer_steps"] == (2 - state["skipped_steps"]) * cfg.updates_per_batch
    if metrics[1]["gpg/skipped_steps"] == metrics[0]["gpg/skipped_steps"]:  # step 2 updated: the weights moved
        # (grad_norm is the last update's: GSPO's 3e-4 clip can zero the second one, the first is never clipped)
        one, two = _final_params(run, 1), _final_params(run, 2)
        assert any(not torch.equal(one[k], two[k]) for k in one)
    records = [json.loads(x) for x in (run / "prompt_success.jsonl").read_text().splitlines()]
    for m in metrics:
        update = [r for r in records if r["step"] == m["step"] and r["in_update"]]
        assert m["gpg/num_samples"] == 4 * len(update)
        if algo == "dapo":  # dynamic sampling: informative groups only, no filler
            assert not any(r["zero_variance"] for r in update) and m["gpg/num_zero_variance"] == 0
        else:
            assert len(update) == 4
    if cfg.kl_coef > 0:
        assert metrics[1]["loss/kl"] > 0


def test_resampling_until_the_valid_fraction_reaches_beta(tmp_path):
    cfg = resolve([f"task={FIXTURES}:HalfSolvedShapes", *TINY, "train.max_steps=3", "algo.min_valid_fraction=0.75",
                   "algo.max_resample_attempts=6", f"output_dir={tmp_path / 'r'}"])
    trainer = Trainer(cfg)
    trainer.train()
    metrics = read_metrics(tmp_path / "r")
    assert any(m["rollout/resample_attempts"] > 1 for m in metrics)
    for m in metrics:
        assert m["gpg/num_samples"] == 16  # the update always holds prompts_per_step groups
        assert m["gpg/valid_fraction"] == pytest.approx(1 - m["gpg/num_zero_variance"] / 16)
        if m["rollout/resample_attempts"] < 6:
            assert m["gpg/valid_fraction"] >= 0.75
        if m["gpg/valid_fraction"] > 0:
            assert m["gpg/alpha"] == pytest.approx(1 / m["gpg/valid_fraction"])
    records = [json.loads(x) for x in (tmp_path / "r" / "prompt_success.jsonl").read_text().splitlines()]
    assert max(r["attempt"] for r in records) >= 1  # resampled groups are recorded too


def test_frozen_vision_tower_really_stays_frozen(tmp_path):
    cfg = resolve([f"task={FIXTURES}:ParityShapes", *TINY, "train.max_steps=2", "train.freeze_vision=true",
                   "algo.min_valid_fraction=0", f"output_dir={tmp_path / 'f'}"])
    trainer = Trainer(cfg)
    before = {n: p.detach().clone() for n, p in trainer.policy.model.named_parameters()}
    trainer.train()
    after = dict(trainer.policy.model.named_parameters())
    vision = [n for n in before if ".visual." in f".{n}"]
    assert vision and all(torch.equal(before[n], after[n]) for n in vision)
    assert all(after[n].grad is None for n in vision)
    assert any(not torch.equal(before[n], after[n]) for n in before if n not in vision)
    assert all(not any(p is q for q in trainer.backend.params) for n, p in after.items() if n in vision)


def _final_params(run: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(run / "checkpoints" / f"step-{step:08d}" / "policy" / "model.safetensors")


_comparable = comparable


def test_resume_after_sigkill_is_exact(tmp_path):
    args = ["train", f"task={FIXTURES}:ParityShapes", *TINY, "train.max_steps=5", "train.save_every=1",
            "train.keep_last=10", "algo.min_valid_fraction=0.5", "algo.max_resample_attempts=3"]
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    run_cli(*args, f"output_dir={straight}")

    kill_after_checkpoint([sys.executable, "-m", "mmgpg", *args, f"output_dir={killed}"], killed)
    done = sorted(p.name for p in (killed / "checkpoints").glob("step-*"))
    assert "step-00000005" not in done
    # A crash while writing the next checkpoint leaves a temp dir and/or a dir without COMPLETE: both are ignored.
    (killed / "checkpoints" / ".tmp-step-00000009").mkdir(exist_ok=True)
    (killed / "checkpoints" / "step-00000009").mkdir(exist_ok=True)
    (killed / "checkpoints" / "step-00000009" / "trainer_state.pt").write_bytes(b"half a file")

    run_cli(*args, f"output_dir={killed}", "train.resume=true")
    a, b = _final_params(straight, 5), _final_params(killed, 5)
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-6, rtol=0)
    ma, mb = _comparable(read_metrics(straight)), _comparable(read_metrics(killed))
    assert [m["step"] for m in mb] == [1, 2, 3, 4, 5]
    for x, y in zip(ma, mb):
        assert x.keys() == y.keys()
        for k in x:
            assert x[k] == pytest.approx(y[k], rel=1e-5, abs=1e-6), (x["step"], k)
    assert any(m["grad_norm"] > 0 for m in ma), "the run must actually update the policy"


def test_sigterm_saves_at_the_step_boundary_and_exits_cleanly(tmp_path):
    run = tmp_path / "t"
    proc = subprocess.Popen([sys.executable, "-m", "mmgpg", "train", f"task={FIXTURES}:ParityShapes", *TINY,
                             "train.max_steps=200", f"output_dir={run}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while not (run / "metrics.jsonl").exists() or not (run / "metrics.jsonl").read_text().strip():
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    steps = [m["step"] for m in read_metrics(run)]
    assert steps[-1] < 200
    assert (run / "checkpoints" / f"step-{steps[-1]:08d}" / "COMPLETE").exists()
    assert "stopped by signal" in out + err


def test_existing_run_dir_is_not_overwritten(tmp_path):
    run = tmp_path / "x"
    (run / "checkpoints").mkdir(parents=True)
    proc = run_cli("train", f"task={FIXTURES}:ParityShapes", *TINY, f"output_dir={run}", check=False)
    assert proc.returncode == 2 and "train.resume=true" in proc.stderr


def test_layout_errors_are_config_errors(tmp_path):
    proc = run_cli("train", *TINY, "rollout.group_size=1", "algo.token_loss=reinforce", "algo.updates_per_batch=2",
                   f"output_dir={tmp_path / 'y'}", check=False)
    assert proc.returncode == 2
    assert "algo.updates_per_batch" in proc.stderr


def test_trainer_layout_problems_are_collected(tmp_path):
    import importlib.util

    from mmgpg.config import ConfigError

    with pytest.raises(ConfigError) as info:
        Trainer(resolve([*TINY, "rollout.group_size=1", "train.wandb=true", f"output_dir={tmp_path / 'z'}"]))
    keys = [p.key for p in info.value.problems]
    assert "rollout.group_size" in keys
    assert ("train.wandb" in keys) == (importlib.util.find_spec("wandb") is None)


def test_all_zero_variance_steps_are_skipped_but_advance_the_schedule(tmp_path):
    """Every group has zero variance: no optimizer step, α logged as null (undefined), and the linear schedule
    still reaches 0 at train.max_steps (a skipped step counts toward max_steps and advances the schedule)."""
    cfg = resolve([f"task={FIXTURES}:SolvedShapes", *TINY, "train.max_steps=3", "train.lr_scheduler=linear",
                   "algo.min_valid_fraction=0", f"output_dir={tmp_path / 's'}"])
    trainer = Trainer(cfg)
    before = {n: p.detach().clone() for n, p in trainer.policy.model.named_parameters()}
    trainer.train()
    metrics = read_metrics(tmp_path / "s")
    assert [m["gpg/alpha"] for m in metrics] == [None, None, None]
    assert [m["gpg/skipped_steps"] for m in metrics] == [1, 2, 3]
    assert [m["lr"] for m in metrics] == pytest.approx([1e-3 * 2 / 3, 1e-3 / 3, 0.0])
    assert trainer.state.optimizer_steps == 0
    assert all(torch.equal(before[n], p) for n, p in trainer.policy.model.named_parameters())


def test_updates_per_batch_2_ratio_is_1_then_clips(tiny_dirs, tmp_path):
    """GRPO's μ = 2: the first iteration's ratio is exactly 1 (old log-probs = current ones), the second sees moved
    weights, and at a small clip_eps the clip engages (the clipped surrogate differs from ratio · A)."""
    from support.gradient_reference import make_groups, make_trainer

    from mmgpg import algorithms

    seen = []
    real = algorithms.TOKEN_LOSSES["clipped_ratio"]

    def spy(logp, adv, old_logp=None, clip_eps=0.2):
        seen.append((logp.detach().clone(), old_logp.clone(), adv.clone()))
        return real(logp, adv, old_logp, clip_eps)

    algorithms.TOKEN_LOSSES.register("clipped_ratio", spy, replace=True)  # the trainer binds it once, at start
    try:
        trainer = make_trainer(str(tiny_dirs["qwen2_vl"]), str(tmp_path / "r"), "grpo", "algo.updates_per_batch=2",
                               "algo.clip_eps=0.001", "algo.kl_coef=0", "train.learning_rate=1e-2")
    finally:
        algorithms.TOKEN_LOSSES.register("clipped_ratio", real, replace=True)
    groups = make_groups(trainer, [0, 1, 2, 3])
    stats = trainer.update(groups, trainer.advantages(groups))
    assert trainer.state.optimizer_steps == 2 and stats["grad_norm"] > 0
    micro = len(seen) // 2
    assert micro == 3  # three informative groups, one per micro-batch, twice
    for logp, old, _ in seen[:micro]:
        assert torch.equal(logp, old)  # ratio exactly 1
    clipped = 0
    for logp, old, adv in seen[micro:]:
        ratio = torch.exp(logp - old)
        surrogate = ratio * adv[:, None]
        clipped += int((real(logp, adv, old, 0.001) != -surrogate).sum())
    assert clipped > 0


def test_nonfinite_gradients_skip_the_step_then_stop(tiny_dirs, tmp_path):
    """A NaN in the weights (as a bf16 overflow would leave) makes the gradient norm NaN: the step is skipped and
    counted, parameters stay, the schedule advances; more than train.max_nonfinite_steps in a row is an error."""
    from support.gradient_reference import make_groups, make_trainer

    from mmgpg.train.trainer import NonFiniteError

    trainer = make_trainer(str(tiny_dirs["qwen2_vl"]), str(tmp_path / "r"), "gpg", "train.max_nonfinite_steps=1",
                           "train.lr_scheduler=linear", "train.max_steps=4")
    model = trainer.policy.model
    name, param = next((n, p) for n, p in model.named_parameters() if n.endswith("norm.weight") and "visual" not in n)
    param.data[0] = float("nan")
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    groups = make_groups(trainer, [0, 1, 2, 3])
    stats = trainer.update(groups, trainer.advantages(groups))
    assert stats["grad_norm"] != stats["grad_norm"]  # NaN
    assert trainer.state.nonfinite_steps == 1 and trainer.state.optimizer_steps == 0
    assert all(torch.equal(before[n], p) or n == name for n, p in model.named_parameters())
    assert all(p.grad is None for p in model.parameters())
    assert trainer.backend.learning_rate() == pytest.approx(1e-4 * 3 / 4)
    with pytest.raises(NonFiniteError, match="train.max_nonfinite_steps=1"):
        trainer.update(groups, trainer.advantages(groups))


def test_a_nan_reward_is_a_clear_error(tmp_path):
    proc = run_cli("train", f"task={FIXTURES}:NaNRewardShapes", *TINY, "train.max_steps=1",
                   f"output_dir={tmp_path / 'n'}", check=False)
    assert proc.returncode != 0
    assert "'accuracy' returned nan" in proc.stderr and "rewards must be finite" in proc.stderr


def test_probe_every_records_success_without_touching_training(tmp_path):
    """train.probe_every probes the live policy at step 0 and every N steps into probe_success.jsonl (for
    `mmgpg diagnose`), under a forked RNG: the run's metrics equal those of the same run without probes."""
    args = [f"task={FIXTURES}:ParityShapes", *TINY, "train.max_steps=2", "algo.min_valid_fraction=0"]
    Trainer(resolve([*args, f"output_dir={tmp_path / 'plain'}"])).train()
    Trainer(resolve([*args, "train.probe_every=1", "train.probe_samples=3", "train.probe_limit=2",
                     f"output_dir={tmp_path / 'probed'}"])).train()
    assert _comparable(read_metrics(tmp_path / "plain")) == _comparable(read_metrics(tmp_path / "probed"))
    probes = [json.loads(x) for x in (tmp_path / "probed" / "probe_success.jsonl").read_text().splitlines()]
    assert [(p["step"], p["samples"]) for p in probes] == [(0, 3), (0, 3), (1, 3), (1, 3), (2, 3), (2, 3)]
    assert all(0 <= p["successes"] <= 3 and p["split"] == "train" for p in probes)
    assert len({p["prompt_id"] for p in probes}) == 2
