"""DeepSpeed ZeRO-3 with the model families beyond the paper's (real DeepSpeed, gloo, 2 processes on CPU): the step
gradient (full, reduced, before the optimizer step) equals the plain backend's single-process gradient on the union of
the groups, with the uneven split of test_deepspeed.py (rank 0 forwards two informative groups, rank 1 one plus a
zero-weight filler micro-batch).

The mixtures of experts are the case ZeRO-3 could break: their experts are fused parameters that every rank gathers
whenever the layer runs, whatever tokens it routed where, so no rank waits for a collective another never joins (a hang
fails the launch's deadline). Some families read a parameter outside its own module's forward, which ZeRO-3 must be
told about (Family.zero3_external, the generic policy's image features). CI runs a MoE (Qwen3-VL-MoE) and the hybrid linear-attention Qwen3.5; every family under
--runslow.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from support import FIXTURE_TASKS
from support.families import IMAGE_TEXT, NEW_QWEN_VL
from support.gradient_reference import make_groups, make_trainer, relative_error, trainer_gradient
from test_deepspeed import TOL, ds_init, needs_deepspeed, spawn

IN_CI = ("qwen3_vl_moe", "qwen3_5")
FAMILIES = NEW_QWEN_VL + IMAGE_TEXT + ("qwen3", "qwen3_5_text")


def _task(family: str) -> list[str]:
    return [f"task={FIXTURE_TASKS}:TextParity"] if family in ("qwen3", "qwen3_5_text") else []


def _worker(rank: int, world: int, init_file: str, model_dir: str, out: str, family: str) -> None:
    ds_init(rank, world, init_file)
    try:
        trainer = make_trainer(model_dir, f"{out}/ds", "gpg", *_task(family), "train.backend=deepspeed",
                               "train.zero_stage=3")
        groups = make_groups(trainer, [2 * rank, 2 * rank + 1])
        trainer.compute_gradients(groups, trainer.advantages(groups))
        torch.save(trainer.backend.full_gradients(), f"{out}/rank{rank}.pt")  # collective under ZeRO-3
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def family_dirs(tiny_dirs, image_text_dirs, tiny_text_dirs):
    return {**tiny_dirs, **image_text_dirs, **tiny_text_dirs}


@needs_deepspeed
@pytest.mark.distributed
@pytest.mark.parametrize("family", [pytest.param(f, marks=() if f in IN_CI else pytest.mark.slow) for f in FAMILIES])
def test_zero3_gradient_equals_the_plain_backend(family_dirs, tmp_path, family):
    model_dir = str(family_dirs[family])
    spawn(_worker, (2, str(tmp_path / "init"), model_dir, str(tmp_path), family))
    rank0, rank1 = torch.load(tmp_path / "rank0.pt"), torch.load(tmp_path / "rank1.pt")
    for k in rank0:
        assert torch.equal(rank0[k], rank1[k]), f"ranks hold different gradients at {k}"
    single = make_trainer(model_dir, str(tmp_path / "single"), "gpg", *_task(family))
    plain = trainer_gradient(single, make_groups(single, [0, 1, 2, 3]))
    assert relative_error(rank0, plain) < TOL
    # The parameters read outside their own module's forward (Qwen3.5's convolution, LLaVA-OneVision's image_newline)
    # carry their own gradient, not one lost in the norm of the rest.
    outer = [k for k in plain if "linear_attn.conv1d" in k or k.endswith("image_newline")]
    assert outer or family not in ("qwen3_5", "qwen3_5_moe", "qwen3_5_text", "llava_onevision")
    for k in outer:
        assert relative_error({k: rank0[k]}, {k: plain[k]}) < TOL, k
