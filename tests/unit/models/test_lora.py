"""LoRA (PEFT) through the policy operations: the chunked log-probs read the real head through PEFT's wrappers, the
adapter switched off is exactly the base model (GRPO's reference), the merged weights equal PEFT's own merge and load
in plain transformers with the same greedy answers, and a LoRA step changes only adapter (and opted-in) weights."""

from __future__ import annotations

import copy

import pytest
import torch
from support.conversations import two_image_conversations
from test_qwen_vl import reference_logprobs

from mmgpg.config import ConfigError, LoraConfig, resolve, to_yaml
from mmgpg.models import lora
from mmgpg.models.load import load_policy
from mmgpg.models.save import save_policy

PIXELS = dict(dtype="float32", min_pixels=3136, max_pixels=12544, device="cpu")


def _lora_policy(path, **options):
    policy = load_policy(str(path), **PIXELS)
    lora.attach(policy, LoraConfig(rank=4, **options))
    return policy


def _perturb(policy, seed: int = 0, scale: float = 0.2) -> None:
    """Non-zero adapters (B is 0 after init) and a changed trained head copy, so the adapted model differs."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_B" in name or "modules_to_save" in name:
                p.add_(torch.randn(p.shape, generator=gen) * scale)


def _rollout(policy, seed: int = 0, group: int = 3):
    torch.manual_seed(seed)
    batch = policy.encode_prompts(two_image_conversations())
    return batch, policy.generate(batch, group, max_new_tokens=12)


def test_config_validation_and_docs():
    cfg = resolve(["model.lora.rank=8", "model.lora.vision=true"]).config
    assert cfg.model.lora.rank == 8 and cfg.model.lora.target_modules[0] == "q_proj"
    for override, key in (("model.lora.rank=-1", "model.lora.rank"), ("model.lora.alpha=0", "model.lora.alpha"),
                          ("model.lora.dropout=1.0", "model.lora.dropout"),
                          ("model.lora.target_modules=[lm_head]", "model.lora.target_modules"),
                          ("train.freeze_vision=true", "model.lora.vision")):
        with pytest.raises(ConfigError) as err:
            resolve(["model.lora.rank=8", "model.lora.vision=true", override])
        assert key in str(err.value), override
    with pytest.raises(ConfigError, match="model.lora.ranks"):
        resolve(["model.lora.ranks=8"])
    documented = to_yaml(resolve([]).config, with_docs=True)
    for doc in ("LoRA rank r", "Adapter scale", "Dropout on the adapters", "Linear layers of the language model",
                "vision tower's blocks", "merger MLP", "Modules trained in full"):
        assert doc in documented, doc


def test_unknown_trainable_module_is_a_clear_error(tiny_dirs):
    policy = load_policy(str(tiny_dirs["qwen2_vl"]), **PIXELS)
    with pytest.raises(ValueError, match="no module of the model is named 'lm_haed'.*Did you mean 'lm_head'"):
        lora.attach(policy, LoraConfig(rank=4, trainable_modules=["lm_haed"]))


def test_chunked_logprobs_read_the_head_through_the_wrapper(tiny_dirs):
    """Zero-initialised adapter: the log-probs equal the base model's full-logits ones. Non-zero adapters on the
    language model, vision tower and merger plus a trained head copy: the chunked log-probs equal the adapted model's
    own full-logits forward (PEFT's wrappers), with the vision tower once per group or once per copy.
    Seeded (the adapters' A matrices are drawn from torch's global RNG, which other tests move). The tolerance is
    relative as well: with the perturbed adapters the log-probs reach -15, where float32's chunked-vs-full difference
    was measured up to 2.6e-5 absolute (2.9e-6 relative) over seeds; a wrong head or mask is off by > 1e-2."""
    torch.manual_seed(0)
    path = tiny_dirs["qwen2_vl"]
    base = load_policy(str(path), **PIXELS)
    policy = _lora_policy(path, vision=True, merger=True, trainable_modules=["lm_head"])
    batch, rollout = _rollout(base)
    with torch.no_grad():
        torch.testing.assert_close(policy.completion_logprobs(rollout, chunk_size=7),
                                   reference_logprobs(base, batch, rollout), atol=1e-5, rtol=0)
    _perturb(policy)
    adapted = reference_logprobs(policy, batch, rollout)
    assert (adapted - reference_logprobs(base, batch, rollout)).abs().max() > 0.05  # the adapter matters
    for once in (True, False):
        policy.model.zero_grad()
        logp = policy.completion_logprobs(rollout, chunk_size=7, encode_images_once=once)
        torch.testing.assert_close(logp.detach(), adapted, atol=1e-5, rtol=1e-5)
        logp.sum().backward()
        grads = {n: p.grad for n, p in policy.model.named_parameters() if p.requires_grad}
        for part in ("visual.blocks", "visual.merger", "language_model", "lm_head.modules_to_save"):
            assert any(part in n and g is not None and g.abs().sum() > 0 for n, g in grads.items()), part
        assert all(p.grad is None for p in policy.model.parameters() if not p.requires_grad)


def test_reference_with_the_adapter_off_is_exactly_the_base_model(tiny_dirs):
    path = tiny_dirs["qwen2_vl"]
    base = load_policy(str(path), **PIXELS)
    policy = _lora_policy(path, merger=True, trainable_modules=["lm_head"])
    _perturb(policy)
    _, rollout = _rollout(base, seed=3)
    trainable = [n for n, p in policy.model.named_parameters() if p.requires_grad]
    with torch.no_grad():
        expected = base.completion_logprobs(rollout)
        adapted = policy.completion_logprobs(rollout)
        with lora.adapter_disabled(policy):
            off = policy.completion_logprobs(rollout)
        again = policy.completion_logprobs(rollout)
    assert torch.equal(off, expected)
    assert (adapted - expected).abs().max() > 0.05 and torch.equal(again, adapted)
    assert [n for n, p in policy.model.named_parameters() if p.requires_grad] == trainable


def test_merged_weights_equal_peft_merge_and_reload_with_identical_greedy_answers(tiny_dirs, tmp_path):
    from transformers import AutoModelForImageTextToText

    from mmgpg.models.qwen_vl import QwenVLPolicy

    path = tiny_dirs["qwen2_vl"]
    policy = _lora_policy(path, vision=True, merger=True, trainable_modules=["lm_head"])
    _perturb(policy, seed=1, scale=0.5)
    merged = lora.merged_state_dict(policy.model)
    reference = copy.deepcopy(policy.peft).merge_and_unload().state_dict()  # PEFT's own merge, on a copy
    assert merged.keys() == reference.keys()
    for k in reference:
        torch.testing.assert_close(merged[k], reference[k], atol=1e-6, rtol=0)

    save_policy(policy, tmp_path / "policy")
    plain = AutoModelForImageTextToText.from_pretrained(tmp_path / "policy")  # plain transformers, no PEFT
    loaded = QwenVLPolicy(plain, policy.processor, min_pixels=3136, max_pixels=12544)
    base = load_policy(str(path), **PIXELS)
    batch = policy.encode_prompts(two_image_conversations())
    answers = [p.generate(batch, 1, max_new_tokens=16, temperature=0.0).completion_ids for p in (policy, loaded, base)]
    assert torch.equal(answers[0], answers[1])
    assert not torch.equal(answers[0], answers[2])  # the adapter changed the greedy answers


def test_lora_step_changes_only_adapter_and_opted_in_parameters(tiny_dirs, tmp_path):
    from support.gradient_reference import make_groups, make_trainer

    trainer = make_trainer(str(tiny_dirs["qwen2_vl"]), str(tmp_path / "run"), "grpo", "model.lora.rank=4",
                           "model.lora.trainable_modules=[lm_head]", "train.learning_rate=1e-2")
    model = trainer.policy.model
    assert trainer.reference is trainer.policy  # GRPO's reference: the adapter switched off, no second model
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert {id(p) for p in trainer.backend.params} == {id(p) for n, p in model.named_parameters() if n in trainable}
    assert trainable and all("lora_" in n or "lm_head.modules_to_save" in n for n in trainable)
    groups = make_groups(trainer, range(4))  # fixed completions and rewards (three informative groups)
    metrics = trainer.update(groups, trainer.advantages(groups))
    assert metrics["grad_norm"] > 0
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and changed <= trainable
    assert any("lora_" in n for n in changed) and any("modules_to_save" in n for n in changed)
    # The trainer's GRPO reference log-probs (adapter off, after the update moved it) are the base model's, exactly.
    base = load_policy(str(tiny_dirs["qwen2_vl"]), **PIXELS)
    micro = trainer._micro_batches(groups)
    _, ref = trainer._fixed_logprobs(micro)
    with torch.no_grad():
        for (batch, *_), r in zip(micro, ref):
            assert torch.equal(r, base.completion_logprobs(batch))
            assert not torch.equal(r, trainer.policy.completion_logprobs(batch))


def test_checkpoints_from_before_lora_resume_without_a_config_change():
    """A config.yaml written before model.lora existed ran with its defaults (rank 0): not a change on resume."""
    import yaml

    from mmgpg.train.resume import config_changes

    new = yaml.safe_load(to_yaml(resolve([]).config))
    old = copy.deepcopy(new)
    del old["model"]["lora"]
    assert config_changes(old, new) == {}
    changed = yaml.safe_load(to_yaml(resolve(["model.lora.rank=8"]).config))
    assert config_changes(old, changed) == {"model.lora.rank": (0, 8)}


def test_lora_gradients_survive_gradient_checkpointing(tiny_dirs, tmp_path):
    """Frozen embeddings + activation checkpointing is PEFT's classic silent zero-gradient trap (reentrant
    checkpointing needs inputs that require grad): the adapter gradients must equal those without checkpointing."""
    from support.gradient_reference import make_groups, make_trainer

    grads = []
    for gc in ("false", "true"):
        torch.manual_seed(0)
        trainer = make_trainer(str(tiny_dirs["qwen2_vl"]), str(tmp_path / gc), "gpg", "model.lora.rank=4",
                               f"train.gradient_checkpointing={gc}")
        model = trainer.policy.model
        on = model.is_activation_checkpointing if hasattr(model, "is_activation_checkpointing") \
            else model.is_gradient_checkpointing  # transformers 5.19 has only the older name
        assert on == (gc == "true")
        _perturb(trainer.policy)
        groups = make_groups(trainer, range(4))
        trainer.compute_gradients(groups, trainer.advantages(groups))
        grads.append({n: p.grad.clone() for n, p in trainer.policy.model.named_parameters() if p.requires_grad})
    assert grads[0].keys() == grads[1].keys()
    assert all(float(g.abs().sum()) > 0 for n, g in grads[0].items() if "lora_A" in n and "layers.0." in n)
    for n in grads[0]:
        torch.testing.assert_close(grads[1][n], grads[0][n], atol=1e-6, rtol=1e-5)
