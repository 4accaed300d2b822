"""The trainer's step gradient (before clipping and the optimizer) against an independent reference that scores one
sequence at a time through ``model.forward`` and writes the loss by hand (``tests/support/gradient_reference.py``).

The batch has unequal completion lengths (EOS-terminated and truncated), a zero-variance group (B = 16, M = 4, so
α = 4/3, where B/M = 4 would be wrong) and micro-batches. The measured relative error is ~4e-7 (float32), so the
tolerance 1e-5 leaves a margin of 25x while every formula error seen so far moves the gradient by 30 % or more
(α dropped: 0.33; per-rank denominators: 0.5 on two ranks; tokens summed instead of averaged per sequence: > 1).

The baselines of issue 21 (RLOO, REINFORCE++(-baseline), DAPO with dynamic sampling, overlong penalty and filter,
GSPO, GSPO-token, CISPO) are checked the same way, the off-policy losses on both optimizer steps of one batch: the
second step's ratio is to the rollout weights, and the clip ranges are chosen so that tokens (sequences) clip on each
side and others do not. Measured 2.7e-7 to 5.1e-7. Each of these breakages fails a test here (checked by breaking the
code on purpose): the high clip bound used for the low side (or clip_eps_high not bound: symmetric), RLOO's baseline
including the sample itself (0.25), REINFORCE++'s zero-variance groups left untrained (0.39) or its moments counted
per sample instead of per token (0.093), the overlong penalty not added, the overlong filter applied to the mask but
not to N or the other way round, dynamic sampling keeping the filler, GSPO's ratio not length-normalised, CISPO's
weight not stop-gradient or its lower bound dropped.
"""

from __future__ import annotations

import pytest
from support import FIXTURE_TASKS
from support.gradient_reference import (
    ALPHA,
    gpg_advantages,
    group_centred,
    load_weights,
    make_groups,
    make_trainer,
    overlong_shaped,
    reference_gradient,
    reference_gradient_with_kl,
    reference_loss_gradient,
    reference_old_logprobs,
    relative_error,
    rloo_advantages,
    trainer_gradient,
    update_gradients,
    whitened,
    zscore_advantages,
)

from mmgpg.rollout.collect import collect_groups

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


def test_alpha_scales_the_policy_term_and_not_the_kl_term(tiny_dirs, tmp_path):
    """GPG with α = 4/3 and a k3 KL term (kl_coef 0.5), the policy moved off the reference so that the KL gradient
    is not zero: the gradient is α ∇(policy term) + β ∇(KL term), written by hand (reference_gradient_with_kl), as
    docs/training.md states; α multiplying the KL term too (the forks' loss / inverse α) is measurably different."""
    import torch

    trainer = make_trainer(str(tiny_dirs["qwen2_vl"]), str(tmp_path / "r"), "gpg", "algo.kl_coef=0.5",
                           "algo.kl_estimator=k3")
    assert trainer.reference is not None and trainer.reference is not trainer.policy
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in trainer.policy.model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator, dtype=p.dtype))
    groups = make_groups(trainer, [0, 1, 2, 3])
    advs = [gpg_advantages(g.rewards) for g in groups]
    got = trainer_gradient(trainer, groups)
    want = reference_gradient_with_kl(trainer, groups, advs, alpha=ALPHA, beta=0.5)
    assert relative_error(got, want) < TOL
    alpha_on_kl = reference_gradient_with_kl(trainer, groups, advs, alpha=ALPHA, beta=0.5, alpha_on_kl=True)
    no_kl = reference_gradient(trainer, groups, advs, alpha=ALPHA, aggregation="seq_mean_token_mean")
    assert relative_error(got, alpha_on_kl) > 100 * TOL and relative_error(got, no_kl) > 100 * TOL


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


# ---- the baselines of issue 21 (the reference's formulas: tests/support/gradient_reference.py) -----------------------


def test_rloo_gradient_equals_the_reference(tiny_dirs, tmp_path):
    """RLOO: r_i minus the mean of the other three, REINFORCE over sequences x max_new_tokens, α = 1."""
    trainer = make_trainer(str(tiny_dirs["qwen2_vl"]), str(tmp_path / "r"), "rloo")
    groups = make_groups(trainer, [0, 1, 2, 3])
    want = reference_loss_gradient(trainer, groups, [rloo_advantages(g.rewards) for g in groups], loss="reinforce",
                                   aggregation="constant_length")
    assert relative_error(trainer_gradient(trainer, groups), want) < TOL


@pytest.mark.parametrize("algo", ["reinforce_pp", "reinforce_pp_baseline"])
def test_reinforce_pp_gradient_equals_the_reference(tiny_dirs, tmp_path, algo):
    """REINFORCE++(-baseline): rewards (or r - group mean) whitened with the mean and unbiased variance over every
    completion token of the batch; the zero-variance group gets a non-zero advantage and is trained too."""
    trainer = make_trainer(str(tiny_dirs["qwen2_vl"]), str(tmp_path / "r"), algo)
    groups = make_groups(trainer, [0, 1, 2, 3])
    values = [g.rewards if algo == "reinforce_pp" else group_centred(g.rewards) for g in groups]
    advs = whitened(values, [[len(c) for c in g.completion_ids] for g in groups])
    assert all(a != 0 for a in advs[2])  # the zero-variance group: (r - μ)/σ with the batch's μ
    want = reference_loss_gradient(trainer, groups, advs, loss="clipped_ratio", aggregation="token_mean")
    assert relative_error(trainer_gradient(trainer, groups), want) < TOL


def _update_against_reference(trainer, groups, advs, **loss):
    """The trainer's two optimizer steps on one batch: the first (ratio 1) and the second (ratio to the rollout
    weights, the clip acting) against the reference at the weights each was computed at."""
    seen = update_gradients(trainer, groups)
    assert len(seen) == 2
    (w0, g0), (w1, g1) = seen
    load_weights(trainer, w0)
    old = reference_old_logprobs(trainer, groups)
    first = relative_error(g0, reference_loss_gradient(trainer, groups, advs, **loss))
    load_weights(trainer, w1)
    second = relative_error(g1, reference_loss_gradient(trainer, groups, advs, old=old, **loss))
    new = reference_old_logprobs(trainer, groups)
    return first, second, old, new


def _clip_cases(advs, old, new, lo, hi):
    """Tokens of each kind in the second step: (A > 0 clipped above, A < 0 clipped below, A < 0 with ratio in
    (1 - hi, 1 - lo): clipped only if the low side uses lo, unclipped)."""
    above = below = between = free = 0
    for ga, go, gn in zip(advs, old, new):
        for A, o, n in zip(ga, go, gn):
            for r in (n - o).exp().tolist():
                above += A > 0 and r > 1 + hi
                below += A < 0 and r < 1 - lo
                between += A < 0 and 1 - hi < r < 1 - lo
                free += A != 0 and 1 - lo <= r <= 1 + hi
    return above, below, between, free


@pytest.mark.parametrize("overlong_filter", [False, True])
def test_dapo_updates_equal_the_reference(tiny_dirs, tmp_path, overlong_filter):
    """DAPO: dynamic sampling without filler (the zero-variance group leaves the update: B = 12 and N counts the three
    groups' tokens), z-scored advantages of the rewards plus the soft overlong penalty (L_max 12, L_cache 6), the
    clip-higher surrogate (0.2 below, 0.28 above) over all tokens; with the overlong filter the truncated completions
    leave the loss and N. Both optimizer steps of a batch: the second one clips on both sides."""
    trainer = make_trainer(str(tiny_dirs["qwen2_vl"]), str(tmp_path / "r"), "dapo", "train.learning_rate=1e-3",
                           "algo.overlong_buffer_fraction=0.5", f"algo.overlong_filter={str(overlong_filter).lower()}")
    groups = make_groups(trainer, [0, 1, 2, 3])
    update = collect_groups(lambda attempt: groups, 4, min_valid_fraction=1.0, max_attempts=1,
                            drop_zero_variance=True).update
    assert [g.example for g in update] == [groups[i].example for i in (0, 1, 3)]
    advs = [zscore_advantages(overlong_shaped(g.rewards, [len(c) for c in g.completion_ids], 12, 6), eps=1e-6)
            for g in update]
    first, second, old, new = _update_against_reference(trainer, update, advs, loss="clipped_ratio",
                                                        aggregation="token_mean", lo=0.2, hi=0.28,
                                                        filtered=overlong_filter)
    assert first < TOL and second < TOL
    assert all(n > 0 for n in _clip_cases(advs, old, new, 0.2, 0.28))


@pytest.mark.parametrize("algo", ["gspo", "gspo_token"])
def test_gspo_updates_equal_the_reference(tiny_dirs, tmp_path, algo):
    """GSPO and GSPO-token: the length-normalised sequence ratio clipped per sequence (here 0.05 below, 0.1 above,
    so that some sequences clip and some do not), z-scored advantages, the mean over sequences."""
    trainer = make_trainer(str(tiny_dirs["qwen2_vl"]), str(tmp_path / "r"), algo, "algo.clip_eps=0.05",
                           "algo.clip_eps_high=0.1")
    groups = make_groups(trainer, [0, 1, 2, 3])
    advs = [zscore_advantages(g.rewards) for g in groups]
    first, second, old, new = _update_against_reference(trainer, groups, advs, loss=algo,
                                                        aggregation="seq_mean_token_mean", lo=0.05, hi=0.1)
    assert first < TOL and second < TOL
    ratios = [float((n - o).mean().exp()) for go, gn in zip(old, new) for o, n in zip(go, gn)]
    assert any(r > 1.1 for r in ratios) and any(r < 0.95 for r in ratios) and any(0.95 < r < 1.1 for r in ratios)


def test_cispo_updates_equal_the_reference(tiny_dirs, tmp_path):
    """CISPO: -sg[clip(ρ, 1 - 0.1, 1 + 0.1)] A log π over all tokens (bounds chosen so that both act), z-scores."""
    trainer = make_trainer(str(tiny_dirs["qwen2_vl"]), str(tmp_path / "r"), "cispo", "algo.clip_eps_high=0.1",
                           "algo.cispo_eps_low=0.1")
    groups = make_groups(trainer, [0, 1, 2, 3])
    advs = [zscore_advantages(g.rewards) for g in groups]
    first, second, old, new = _update_against_reference(trainer, groups, advs, loss="cispo",
                                                        aggregation="token_mean", hi=0.1, cispo_low=0.1)
    assert first < TOL and second < TOL
    ratios = [r for go, gn in zip(old, new) for o, n in zip(go, gn) for r in (n - o).exp().tolist()]
    assert any(r > 1.1 for r in ratios) and any(r < 0.9 for r in ratios)


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


def test_packed_text_update_has_the_reference_gradient_and_no_padding(tiny_text_dir, tmp_path):
    """model.packed_sequences=always: the update scores each micro-batch's rows packed into one sequence; the step
    gradient is still the one-sequence reference's, and no computed position is padding. The padded update of the
    same groups (length-ordered micro-batches) reports the padding it computes."""
    groups_for = {}
    for mode in ("always", "never"):
        trainer = make_trainer(str(tiny_text_dir), str(tmp_path / mode), "gpg", f"task={FIXTURE_TASKS}:TextParity",
                               "train.micro_batch_prompts=2", f"model.packed_sequences={mode}")
        if not groups_for:  # group 0 short: in rollout order it would share a micro-batch with the long group 1
            groups_for["groups"] = make_groups(trainer, [0, 1, 2, 3])
            groups_for["groups"][0].completion_ids = [c[:2] for c in groups_for["groups"][0].completion_ids]
        groups = groups_for["groups"]
        want = reference_gradient(trainer, groups, [gpg_advantages(g.rewards) for g in groups], alpha=ALPHA,
                                  aggregation="seq_mean_token_mean")
        assert relative_error(trainer_gradient(trainer, groups), want) < TOL
        computed, padding = trainer.padding_positions(trainer._micro_batches(groups))
        trained = [g for g in groups if not g.zero_variance]  # group 2 (all rewards 1) is not forwarded
        real = sum(len(c) for g in trained for c in g.completion_ids)
        real += sum(4 * len(trainer.policy.encode_prompts([trainer.task.prompt(g.example)]).input_ids[0])
                    for g in trained)
        assert computed - padding == real
        if mode == "always":
            assert padding == 0
            continue

        prompt = {id(g): len(trainer.policy.encode_prompts([trainer.task.prompt(g.example)]).input_ids[0])
                  for g in trained}

        def positions(chunks, prompt=prompt):  # rows x (longest prompt + longest completion), over micro-batches
            return sum(4 * len(c) * (max(prompt[id(g)] for g in c) + max(len(x) for g in c for x in g.completion_ids))
                       for c in chunks)

        # length-ordered micro-batches: groups 1 and 3 (long) together, group 0 (short) alone
        assert computed == positions([[trained[1], trained[2]], [trained[0]]])
        assert computed < positions([trained[:2], trained[2:]])  # what the rollout order would have computed
