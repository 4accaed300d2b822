"""Real torch.distributed (gloo, 2 processes on CPU): one optimizer step on two ranks equals one step of a single
process on the union of both ranks' groups — with α on and the zero-variance groups all on one rank."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# Rewards per group; rank 0 gets groups 0-1, rank 1 gets groups 2-3. Group 2 has zero variance:
# B = 16 samples, M = 4 -> alpha = 16 / 12.
REWARDS = [[1, 0, 0, 1], [0, 1, 1, 1], [1, 1, 1, 1], [1, 0, 1, 0]]


def _groups(trainer, indices):
    from mmgpg.algorithms import zero_variance_mask
    from mmgpg.trainer import Group

    eos = trainer.policy.eos_token_ids[0]
    groups = []
    for i in indices:
        g = torch.Generator().manual_seed(100 + i)
        completions = []
        for j in range(4):
            n = int(torch.randint(3, 10, (1,), generator=g))
            ids = torch.randint(20, 1000, (n,), generator=g).tolist()
            completions.append(ids + [eos] if j % 2 == 0 else ids)  # some end with EOS, some are truncated
        rewards = [float(x) for x in REWARDS[i]]
        zero = bool(zero_variance_mask(torch.tensor([rewards]))[0])
        groups.append(Group(trainer.dataset[i], completions, [""] * 4, rewards, {"accuracy": rewards}, 0, zero))
    return groups


def _args(model_dir: str, out: str, algo: str) -> list[str]:
    return [f"algo={algo}", f"model.name_or_path={model_dir}", "model.dtype=float32", "model.max_pixels=12544",
            "rollout.group_size=4", "rollout.max_new_tokens=12", "train.prompts_per_step=4",
            "train.micro_batch_prompts=1", "train.learning_rate=1e-4", "train.progress=false",
            "train.tensorboard=false", f"output_dir={out}"]


def _step(algo: str, model_dir: str, out: str, indices, extra: tuple[str, ...] = ()) -> dict[str, torch.Tensor]:
    from mmgpg.config import resolve
    from mmgpg.trainer import Trainer

    trainer = Trainer(resolve(_args(model_dir, out, algo) + list(extra)))
    groups = _groups(trainer, indices)
    counts = trainer.advantages(groups)
    assert counts["num_samples"] == 16 and counts["num_zero_variance"] == 4
    assert counts["alpha"] == (16 / 12 if algo == "gpg" else 1.0)
    trainer.update(groups, counts)
    return {k: v.detach().clone() for k, v in trainer.policy.model.state_dict().items()}


def _worker(rank: int, world: int, init_file: str, model_dir: str, out: str, algo: str) -> None:
    os.environ.update(WORLD_SIZE=str(world), RANK=str(rank), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        params = _step(algo, model_dir, f"{out}/dist", [2 * rank, 2 * rank + 1])
        torch.save(params, f"{out}/params_rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
@pytest.mark.parametrize("algo", ["gpg", "grpo"])
def test_two_ranks_equal_one_process_on_the_union(tiny_dirs, tmp_path, algo):
    model_dir = str(tiny_dirs["qwen2_vl"])
    mp.spawn(_worker, args=(2, str(tmp_path / "init"), model_dir, str(tmp_path), algo), nprocs=2, join=True)
    rank0 = torch.load(tmp_path / "params_rank0.pt")
    rank1 = torch.load(tmp_path / "params_rank1.pt")
    single = _step(algo, model_dir, str(tmp_path / "single"), [0, 1, 2, 3])
    from transformers import AutoModelForImageTextToText

    initial = AutoModelForImageTextToText.from_pretrained(model_dir).state_dict()
    moved = 0
    for k in single:
        assert torch.equal(rank0[k], rank1[k]), f"ranks diverged at {k}"
        torch.testing.assert_close(rank0[k], single[k], atol=1e-6, rtol=0)
        moved += int(not torch.equal(single[k], initial[k]))
    # Adam's first step moves every parameter with a non-zero gradient by about lr = 1e-4, far above the tolerance.
    assert moved > 10, "the step must actually change the parameters"


@pytest.mark.distributed
def test_mmgpg_train_under_torchrun(tmp_path):
    """The CLI itself under `torchrun --nproc_per_node 2` (gloo): both ranks generate, rank 0 writes the logs."""
    import json
    import subprocess
    import sys

    fixtures = Path(__file__).with_name("fixture_tasks.py")
    run = tmp_path / "ddp"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "mmgpg", "train", f"task={fixtures}:ParityShapes", "model=tiny", "rollout.group_size=4",
           "rollout.max_new_tokens=12", "train.prompts_per_step=4", "train.max_steps=2", "train.progress=false",
           "train.learning_rate=1e-3", f"output_dir={run}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2] and all(m["gpg/num_samples"] == 16 for m in metrics)
    ranks = {json.loads(x)["rank"] for x in (run / "prompt_success.jsonl").read_text().splitlines()}
    assert ranks == {0, 1}
    done = json.loads((run / "checkpoints" / "step-00000002" / "COMPLETE").read_text())
    assert done["world_size"] == 2
    assert (run / "checkpoints" / "step-00000002" / "rng_rank1.pt").exists()


def test_gradient_checkpointing_gives_the_same_step(tiny_dirs, tmp_path):
    """train.gradient_checkpointing recomputes activations in backward; the update must not change."""
    model_dir = str(tiny_dirs["qwen2_vl"])
    plain = _step("gpg", model_dir, str(tmp_path / "plain"), [0, 1, 2, 3])
    ckpt = _step("gpg", model_dir, str(tmp_path / "ckpt"), [0, 1, 2, 3], ("train.gradient_checkpointing=true",))
    for k in plain:
        torch.testing.assert_close(ckpt[k], plain[k], atol=1e-6, rtol=0)
