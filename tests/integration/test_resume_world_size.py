"""Resume on another number of ranks (plain backend, whose optimizer state is the same on every rank): a run
checkpointed on 2 ranks continues on 1, and on 2 again, and sees exactly the prompts of an uninterrupted run, step
by step (the prompt stream's position is global: each draw takes ``train.prompts_per_step`` positions whatever the
count of ranks). The per-rank random generators are re-derived from (seed, step, rank): two resumes of one checkpoint
on the same count give the same run. DeepSpeed's partitioned state is refused on another count (the slow ZeRO-3 test
in tests/unit/backends/test_deepspeed.py)."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from support import FIXTURE_TASKS, comparable_run, run_mmgpg

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
# 32 training items, 4 prompts per step: 3 steps stay inside the first epoch. min_valid_fraction=0: one attempt per
# step (no β_th resampling, whose number of attempts depends on the sampled completions).
TRAIN = ["train", f"task={FIXTURE_TASKS}:ParityShapes", "task.num_train=32", "model=tiny", "rollout.group_size=2",
         "rollout.max_new_tokens=4", "train.prompts_per_step=4", "train.micro_batch_prompts=2",
         "algo.min_valid_fraction=0", "train.progress=false", "train.tensorboard=false", "train.save_every=1",
         "train.learning_rate=1e-3"]


def prompts_by_step(run) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for line in (run / "prompt_success.jsonl").read_text().splitlines():
        r = json.loads(line)
        out.setdefault(r["step"], []).append(r["prompt_id"])
    return {step: sorted(ids) for step, ids in sorted(out.items())}


def train(run, steps: int, ranks: int, resume: bool = False):
    return run_mmgpg(*TRAIN, f"train.max_steps={steps}", f"output_dir={run}", *(["train.resume=true"] if resume else []),
                     ranks=ranks, env=ENV, timeout=900)


@pytest.mark.distributed
def test_resume_from_2_ranks_on_1_and_back_on_2_sees_the_uninterrupted_prompts(tmp_path):
    reference = tmp_path / "reference"
    train(reference, 3, ranks=1)
    chain = tmp_path / "chain"
    train(chain, 1, ranks=2)
    again = tmp_path / "again"
    shutil.copytree(chain, again)
    down = train(chain, 2, ranks=1, resume=True)  # 2 -> 1
    assert "was written by 2 rank(s); this run has 1" in down.stderr and "re-seeded" in down.stderr
    up = train(chain, 3, ranks=2, resume=True)  # 1 -> 2
    assert "was written by 1 rank(s); this run has 2" in up.stderr
    want = prompts_by_step(reference)
    assert list(want) == [1, 2, 3] and all(len(ids) == 4 for ids in want.values())
    assert len({i for ids in want.values() for i in ids}) == 12  # no prompt twice inside the epoch
    assert prompts_by_step(chain) == want
    metrics = comparable_run(chain)
    assert [m["step"] for m in metrics] == [1, 2, 3] and all(m["gpg/num_samples"] == 8 for m in metrics)
    done = json.loads((chain / "checkpoints" / "step-00000003" / "COMPLETE").read_text())
    assert done == {"step": 3, "world_size": 2}
    # The re-derived generators are deterministic: a second resume of the same 2-rank checkpoint on 1 rank is the
    # same run, completions, rewards and losses included.
    train(again, 2, ranks=1, resume=True)
    assert comparable_run(again) == metrics[:2]
