"""The trainer's step gradient (before clipping and the optimizer) against an independent reference that scores one
sequence at a time through ``model.forward`` and writes the loss by hand (``tests/support/gradient_reference.py``).

The batch has unequal completion lengths (EOS-terminated and truncated), a zero-variance group (B = 16, M = 4, so
α = 4/3, where B/M = 4 would be wrong) and micro-batches. The measured relative error is ~4e-7 (float32), so the
tolerance 1e-5 leaves a margin of 25x while every formula error seen so far moves the gradient by 30 % or more
(α dropped: 0.33; per-rank denominators: 0.5 on two ranks; tokens summed instead of averaged per sequence: > 1).
"""

from __future__ import annotations

import pytest
from support import FIXTURE_TASKS
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


@pytest.mark.parametrize("aggregation", ["seq_mean_token_mean", "token_mean", "constant_length"])
def test_gpg_gradient_equals_the_reference(tiny_dirs, tmp_path, aggregation):
    trainer = make_trainer(str(tiny_dirs["qwen2_vl"]), str(tmp_path / "r"), "gpg", f"algo.aggregation={aggregation}")
    groups = make_groups(trainer, [0, 1, 2, 3])
    got = trainer_gradient(trainer, groups)
    want = reference_gradient(trainer, groups, [gpg_advantages(g.rewards) for g in groups], alpha=ALPHA,
                              aggregation=aggregation)
    assert relative_error(got, want) < TOL


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl"])
def test_gpg_gradient_with_other_micro_batches_and_image_paths(tiny_dirs, tmp_path, family):
    """Micro-batches of 3 prompt groups, images encoded per sequence instead of once per group: same gradient."""
    trainer = make_trainer(str(tiny_dirs[family]), str(tmp_path / "r"), "gpg", "train.micro_batch_prompts=3",
                           "model.encode_images_once=false", "model.logprob_chunk_size=7")
    groups = make_groups(trainer, [0, 1, 2, 3])
    want = reference_gradient(trainer, groups, [gpg_advantages(g.rewards) for g in groups], alpha=ALPHA,
                              aggregation="seq_mean_token_mean")
    assert relative_error(trainer_gradient(trainer, groups), want) < TOL


def test_alpha_correction_scales_the_gradient_by_exactly_alpha(tiny_dirs, tmp_path):
    model = str(tiny_dirs["qwen2_vl"])
    on = make_trainer(model, str(tmp_path / "on"), "gpg")
    off = make_trainer(model, str(tmp_path / "off"), "gpg", "algo.alpha_correction=false")
    g_on = trainer_gradient(on, make_groups(on, [0, 1, 2, 3]))
    g_off = trainer_gradient(off, make_groups(off, [0, 1, 2, 3]))
    assert relative_error(g_on, {k: ALPHA * v for k, v in g_off.items()}) < 1e-6
    assert relative_error(g_on, g_off) > 0.3  # and α really is 4/3 here, not 1


def test_temperature_scales_the_scored_distribution(tiny_dirs, tmp_path):
    """At rollout.temperature=0.7 the trainer differentiates log softmax(z / 0.7), the distribution it sampled."""
    trainer = make_trainer(str(tiny_dirs["qwen2_vl"]), str(tmp_path / "r"), "gpg", "rollout.temperature=0.7")
    groups = make_groups(trainer, [0, 1, 2, 3])
    advs = [gpg_advantages(g.rewards) for g in groups]
    got = trainer_gradient(trainer, groups)
    assert relative_error(got, reference_gradient(trainer, groups, advs, alpha=ALPHA, aggregation="seq_mean_token_mean",
                                                  temperature=0.7)) < TOL
    assert relative_error(got, reference_gradient(trainer, groups, advs, alpha=ALPHA,
                                                  aggregation="seq_mean_token_mean")) > 1e-2


@pytest.mark.parametrize("algo", ["grpo", "dr_grpo"])
def test_grpo_family_first_step_gradient_equals_the_reference(tiny_dirs, tmp_path, algo):
    """GRPO: z-scored advantages, α = 1, a reference model whose k3 KL has zero gradient at identical weights, and a
    clipped ratio of exactly 1. Dr. GRPO: group-mean advantages over sequences × max_new_tokens."""
    trainer = make_trainer(str(tiny_dirs["qwen2_vl"]), str(tmp_path / "r"), algo)
    groups = make_groups(trainer, [0, 1, 2, 3])
    if algo == "grpo":
        assert trainer.reference is not None
        advs, aggregation = [zscore_advantages(g.rewards) for g in groups], "seq_mean_token_mean"
    else:
        advs, aggregation = [gpg_advantages(g.rewards) for g in groups], "constant_length"
    want = reference_gradient(trainer, groups, advs, alpha=1.0, aggregation=aggregation)
    assert relative_error(trainer_gradient(trainer, groups), want) < TOL


@pytest.mark.parametrize("algo", ["gpg", "grpo"])
def test_text_policy_gradient_equals_the_reference(tiny_text_dir, tmp_path, algo):
    """The text-only Qwen2 through the same trainer: micro-batches of 3 prompt groups (so prompts of different lengths
    are left-padded together), a chunk size that divides nothing, and the one-sequence reference through its own
    forward (nothing suppressed)."""
    trainer = make_trainer(str(tiny_text_dir), str(tmp_path / "r"), algo, f"task={FIXTURE_TASKS}:TextParity",
                           "train.micro_batch_prompts=3", "model.logprob_chunk_size=7")
    assert trainer.policy.family == "qwen2" and trainer.policy.suppressed_token_ids == []
    groups = make_groups(trainer, [0, 1, 2, 3])
    assert len({len(trainer.policy.encode_prompts([trainer.task.prompt(g.example)]).input_ids[0]) for g in groups}) > 1
    advs = [gpg_advantages(g.rewards) for g in groups] if algo == "gpg" else [zscore_advantages(g.rewards) for g in groups]
    want = reference_gradient(trainer, groups, advs, alpha=ALPHA if algo == "gpg" else 1.0,
                              aggregation="seq_mean_token_mean")
    assert relative_error(trainer_gradient(trainer, groups), want) < TOL


def test_text_policy_lora_gradient_equals_the_reference(tiny_text_dir, tmp_path):
    """LoRA on the text model: adapters on model.layers.N.{q,k,v,o,gate,up,down}_proj (the default targets) and only
    there; their gradient is the reference's (B starts at 0, so it is the B matrices' gradient that is compared)."""
    trainer = make_trainer(str(tiny_text_dir), str(tmp_path / "r"), "gpg", f"task={FIXTURE_TASKS}:TextParity",
                           "model.lora.rank=4")
    adapted = sorted({n.rsplit(".lora_", 1)[0] for n, p in trainer.policy.model.named_parameters() if p.requires_grad})
    layers = trainer.policy.model.config.num_hidden_layers
    assert adapted == sorted(f"model.layers.{i}.{m}" for i in range(layers) for m in (
        "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj",
        "mlp.down_proj"))
    groups = make_groups(trainer, [0, 1, 2, 3])
    want = reference_gradient(trainer, groups, [gpg_advantages(g.rewards) for g in groups], alpha=ALPHA,
                              aggregation="seq_mean_token_mean")
    assert relative_error(trainer_gradient(trainer, groups), want) < TOL
