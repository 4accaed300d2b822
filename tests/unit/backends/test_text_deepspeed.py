"""The text-only policy on the DeepSpeed backend (gloo, 2 processes on CPU): under ZeRO-2 and ZeRO-3 (parameters
partitioned, the output head gathered for the chunked log-prob call) the step gradient equals the plain backend's
single-process gradient and the independent one-sequence reference (``tests/support/gradient_reference.py``), with
the uneven split of test_deepspeed.py (rank 0 two informative groups, rank 1 one plus a zero-weight padding
micro-batch), and the ZeRO-3 full weights a rollout engine would be synced with are the whole text model."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from support import FIXTURE_TASKS
from support.gradient_reference import (
    ALPHA,
    gpg_advantages,
    make_groups,
    make_trainer,
    reference_gradient,
    relative_error,
    trainer_gradient,
)
from test_deepspeed import TOL, ds_init, needs_deepspeed, spawn

TASK = f"task={FIXTURE_TASKS}:TextParity"


def _worker(rank: int, world: int, init_file: str, model_dir: str, out: str, stage: int) -> None:
    ds_init(rank, world, init_file)
    try:
        trainer = make_trainer(model_dir, f"{out}/ds", "gpg", TASK, "train.backend=deepspeed",
                               f"train.zero_stage={stage}")
        groups = make_groups(trainer, [2 * rank, 2 * rank + 1])
        counts = trainer.advantages(groups)
        micro = trainer._micro_batches(groups)
        trainer.compute_gradients(groups, counts)
        grads = trainer.backend.full_gradients()  # collective under ZeRO-3
        weights = dict(trainer.backend.full_weights(torch.float32)) if stage == 3 else {}
        torch.save({"grad": grads, "micro": [w for _, _, w in micro], "weights": weights}, f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@needs_deepspeed
@pytest.mark.distributed
@pytest.mark.parametrize("stage", [2, 3])
def test_text_zero_gradient_equals_plain_and_reference(tiny_text_dir, tmp_path, stage):
    from transformers import AutoModelForCausalLM

    model_dir = str(tiny_text_dir)
    spawn(_worker, (2, str(tmp_path / "init"), model_dir, str(tmp_path), stage))
    rank0, rank1 = torch.load(tmp_path / "rank0.pt"), torch.load(tmp_path / "rank1.pt")
    assert rank0["micro"] == [1.0, 1.0] and rank1["micro"] == [1.0, 0.0]  # group 2 has zero variance
    for k in rank0["grad"]:
        assert torch.equal(rank0["grad"][k], rank1["grad"][k]), f"ranks hold different gradients at {k}"

    single = make_trainer(model_dir, str(tmp_path / "single"), "gpg", TASK)  # the plain backend, one process
    groups = make_groups(single, [0, 1, 2, 3])
    assert relative_error(rank0["grad"], trainer_gradient(single, groups)) < TOL
    want = reference_gradient(single, groups, [gpg_advantages(g.rewards) for g in groups], alpha=ALPHA,
                              aggregation="seq_mean_token_mean")
    assert relative_error(rank0["grad"], want) < TOL
    if stage == 3:
        loaded = AutoModelForCausalLM.from_pretrained(model_dir).state_dict()
        got = rank0["weights"]
        assert got.keys() == loaded.keys() and "lm_head.weight" in got  # untied: the head too
        for k, v in got.items():
            assert torch.equal(v, loaded[k]), k
