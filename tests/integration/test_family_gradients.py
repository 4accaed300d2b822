"""The trainer's step gradient for every model family beyond the paper's, against the independent one-sequence
reference (``tests/support/gradient_reference.py``: each completion alone, unpadded, through the model's own
``forward`` with full logits; the loss written by hand), GPG and GRPO, full fine-tuning and LoRA.

Micro-batches of 3 prompt groups (prompts of different lengths left-padded together; the vision-language tasks'
images of different sizes) and a chunk size that divides nothing. The families: Qwen3-VL dense and MoE (DeepStack
features shared per copy), Qwen3.5 dense and MoE (linear-attention layers under left padding), the text Qwen3 and
Qwen3.5. CI runs GPG for each family and GRPO and LoRA for one; the rest under --runslow.
"""

from __future__ import annotations

import re

import pytest
from support import FIXTURE_TASKS
from support.families import IMAGE_TEXT, NEW_QWEN_VL
from support.gradient_reference import (
    ALPHA,
    gpg_advantages,
    make_groups,
    make_trainer,
    reference_gradient,
    relative_error,
    trainer_gradient,
    zscore_advantages,
)

TOL = 1e-5
NEW_TEXT = ("qwen3", "qwen3_5_text")
FAMILIES = NEW_QWEN_VL + IMAGE_TEXT + NEW_TEXT
IN_CI = "qwen3_vl"  # the family whose GRPO and LoRA cells run in CI


@pytest.fixture(scope="module")
def family_dirs(tiny_dirs, image_text_dirs, tiny_text_dirs):
    return {**tiny_dirs, **image_text_dirs, **tiny_text_dirs}


def _trainer(family_dirs, family, tmp_path, algo, *extra):
    task = [f"task={FIXTURE_TASKS}:TextParity"] if family in NEW_TEXT else []
    return make_trainer(str(family_dirs[family]), str(tmp_path / "r"), algo, *task, "train.micro_batch_prompts=3",
                        "model.logprob_chunk_size=7", *extra)


def _cells(families, slow_except=()):
    return [pytest.param(f, marks=() if f in slow_except else pytest.mark.slow) for f in families]


@pytest.mark.parametrize("family", FAMILIES)
def test_gpg_gradient_equals_the_reference(family_dirs, tmp_path, family):
    trainer = _trainer(family_dirs, family, tmp_path, "gpg")
    assert trainer.policy.family == family
    groups = make_groups(trainer, [0, 1, 2, 3])
    want = reference_gradient(trainer, groups, [gpg_advantages(g.rewards) for g in groups], alpha=ALPHA,
                              aggregation="seq_mean_token_mean")
    assert relative_error(trainer_gradient(trainer, groups), want) < TOL


@pytest.mark.parametrize("family", _cells(FAMILIES, slow_except=(IN_CI,)))
def test_grpo_first_step_gradient_equals_the_reference(family_dirs, tmp_path, family):
    """z-scored advantages, α = 1, a KL to a reference copy whose gradient is zero at identical weights."""
    trainer = _trainer(family_dirs, family, tmp_path, "grpo")
    assert trainer.reference is not None
    groups = make_groups(trainer, [0, 1, 2, 3])
    want = reference_gradient(trainer, groups, [zscore_advantages(g.rewards) for g in groups], alpha=1.0,
                              aggregation="seq_mean_token_mean")
    assert relative_error(trainer_gradient(trainer, groups), want) < TOL


@pytest.mark.parametrize("family", _cells(FAMILIES, slow_except=(IN_CI,)))
def test_lora_gradient_equals_the_reference(family_dirs, tmp_path, family):
    """LoRA on the default language targets (a MoE's fused experts get none) and, for a vision-language family, on
    its vision blocks and merger too (the family's own layer names): the adapters' gradient is the reference's."""
    from mmgpg.models import FAMILIES as SPECS

    spec = SPECS[family]
    vision, merger = bool(spec.lora_vision), bool(spec.lora_merger)
    trainer = _trainer(family_dirs, family, tmp_path, "gpg", "model.lora.rank=4", f"model.lora.vision={vision}",
                       f"model.lora.merger={merger}")
    adapted = {n for n, p in trainer.policy.model.named_parameters() if p.requires_grad}
    assert adapted and all(".lora_" in n for n in adapted)
    language = [n for n in adapted if ".layers." in n and not n.startswith(spec.vision_module or "-")]
    assert language and not any(".experts." in n for n in adapted)
    modules = {n.split(".lora_")[0] for n in adapted}
    assert not vision or any(re.fullmatch(spec.lora_vision, m) for m in modules)
    assert not merger or any(re.fullmatch(spec.lora_merger, m) for m in modules)
    groups = make_groups(trainer, [0, 1, 2, 3])
    want = reference_gradient(trainer, groups, [gpg_advantages(g.rewards) for g in groups], alpha=ALPHA,
                              aggregation="seq_mean_token_mean")
    assert relative_error(trainer_gradient(trainer, groups), want) < TOL
