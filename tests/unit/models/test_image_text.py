"""The generic image-text-to-text policy on each of its families' tiny models (Gemma 3, InternVL, SmolVLM2,
LLaVA-OneVision), built offline with the real classes: saved folders load through the auto classes; prompts with two
images of different sizes, one image and none (left padding) sample and score exactly as an independent reference
(each sequence alone, unpadded, through the model's own forward with the processor's own tensors for that prompt,
full logits, the suppressed tokens excluded) with gradients into the vision tower; features encoded once per prompt
equal the repeated pixels; the sampler's distribution is the scored one under a hostile generation config; the
family's quirks hold (one BOS for Gemma, its token types passed, LLaVA-OneVision's per-prompt image counts)."""

from __future__ import annotations

import shutil

import pytest
import torch
from support.conversations import mixed_image_conversations
from support.families import IMAGE_TEXT
from transformers import AutoModelForImageTextToText, AutoProcessor, GenerationConfig

from mmgpg.models.batch import CompletionBatch
from mmgpg.models.generic import ImageTextPolicy
from mmgpg.models.load import load_policy
from mmgpg.models.logprobs import completion_mask

G = 4


@pytest.fixture(scope="module")
def dirs(image_text_dirs) -> dict:
    return image_text_dirs


def reference_logprobs(policy, batch, rollout) -> torch.Tensor:
    """One sequence at a time through ``model.forward`` with its prompt's own processor tensors."""
    out = torch.zeros(rollout.completion_ids.shape)
    kwarg = policy.spec.token_types_kwarg
    for i in range(rollout.num_sequences):
        p = i // rollout.group_size
        keep = batch.attention_mask[p].bool()
        n = int(rollout.completion_mask[i].sum())
        prompt = batch.input_ids[p][keep]
        ids = torch.cat([prompt, rollout.completion_ids[i, :n]])[None]
        extra = {kwarg: torch.cat([batch.mm_token_type_ids[p][keep], torch.zeros(n, dtype=torch.long)])[None]} \
            if kwarg else {}
        with torch.no_grad():
            logits = policy.model(input_ids=ids, attention_mask=torch.ones_like(ids), **extra,
                                  **batch.vision[p]).logits[0].float()
        logits[:, policy.suppressed_token_ids] = float("-inf")
        logp = torch.log_softmax(logits, -1)[len(prompt) - 1 : -1]
        out[i, :n] = logp.gather(-1, rollout.completion_ids[i, :n, None]).squeeze(-1)
    return out


@pytest.mark.parametrize("family", IMAGE_TEXT)
def test_roundtrip_generate_logprobs_backward(dirs, family):
    path = dirs[family]
    assert type(AutoModelForImageTextToText.from_pretrained(path)).__name__.lower().startswith(family.replace("_", ""))
    AutoProcessor.from_pretrained(path)  # the saved processor loads as it is
    torch.manual_seed(0)
    policy = load_policy(str(path), dtype="float32", device="cpu")
    assert isinstance(policy, ImageTextPolicy) and policy.family == family and policy.suppressed_token_ids
    batch = policy.encode_prompts(mixed_image_conversations())
    assert batch.media_per_prompt == [2, 1, 0] and len(set(batch.attention_mask.sum(-1).tolist())) == 3
    assert not batch.attention_mask[1:, 0].all()  # shorter prompts are left-padded
    image_tokens = batch.mm_token_type_ids.sum(-1).tolist()  # LLaVA-OV: one image gets more tokens than two (AnyRes)
    assert image_tokens[0] > 0 and image_tokens[1] > 0 and image_tokens[2] == 0

    rollout = policy.generate(batch, G, max_new_tokens=16)
    assert rollout.completion_ids.shape[0] == 3 * G and rollout.num_completion_tokens > 3 * G

    policy.model.train()
    logp = policy.completion_logprobs(rollout, chunk_size=13)
    assert (logp.detach()[~rollout.completion_mask] == 0).all()
    torch.testing.assert_close(logp.detach(), reference_logprobs(policy, batch, rollout), atol=1e-5, rtol=0)
    (-(logp * rollout.completion_mask).sum()).backward()
    tower = policy.vision_tower
    assert tower is not None and sum(float(p.grad.abs().sum()) for p in tower.parameters() if p.grad is not None) > 0
    assert policy.model.get_output_embeddings().weight.grad.abs().sum() > 0


@pytest.mark.parametrize("family", IMAGE_TEXT)
def test_features_encoded_once_equal_repeated_pixels(dirs, family):
    policy = load_policy(str(dirs[family]), dtype="float32", device="cpu")
    torch.manual_seed(1)
    rollout = policy.generate(policy.encode_prompts(mixed_image_conversations()), 3, max_new_tokens=10)
    results = []
    for once in (True, False):
        policy.model.zero_grad()
        logp = policy.completion_logprobs(rollout, encode_images_once=once)
        logp.sum().backward()
        grads = torch.cat([p.grad.flatten() for p in policy.vision_tower.parameters() if p.grad is not None])
        results.append((logp.detach(), grads))
    torch.testing.assert_close(results[0][0], results[1][0], atol=1e-6, rtol=0)
    torch.testing.assert_close(results[0][1], results[1][1], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("family", IMAGE_TEXT)
def test_sampler_distribution_is_the_scored_distribution(dirs, tmp_path, family):
    """A checkpoint's generation config asking for top-k 1, nucleus, repetition penalty and a minimum length does
    not leak into sampling: the sampler's processed scores equal the scored log-softmax."""
    path = tmp_path / "hostile"
    shutil.copytree(dirs[family], path)
    gen = GenerationConfig.from_pretrained(path)
    gen.update(do_sample=True, top_k=1, top_p=0.001, temperature=0.1, repetition_penalty=1.05, min_length=30)
    gen.save_pretrained(path)
    policy = load_policy(str(path), dtype="float32", device="cpu")
    batch = policy.encode_prompts(mixed_image_conversations()[:2])
    from mmgpg.models.batch import join_vision

    torch.manual_seed(3)
    out = policy.model.generate(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                                **policy._types(batch.mm_token_type_ids), **join_vision(batch.vision),
                                num_return_sequences=2, output_scores=True, return_dict_in_generate=True,
                                **policy.sampling_kwargs(max_new_tokens=8, temperature=0.7))
    comp = out.sequences[:, batch.input_ids.shape[1]:]
    scores = torch.stack(out.scores, 1).log_softmax(-1)
    mask = completion_mask(comp, policy.eos_token_ids)
    with torch.no_grad():
        logp = policy.completion_logprobs(CompletionBatch(batch, 2, comp, mask), temperature=0.7)
    torch.testing.assert_close(logp[mask], scores.gather(-1, comp[..., None]).squeeze(-1)[mask], atol=1e-5, rtol=0)


def test_family_quirks_hold(dirs):
    gemma = load_policy(str(dirs["gemma3"]), dtype="float32", device="cpu")
    batch = gemma.encode_prompts(mixed_image_conversations())
    bos = gemma.tokenizer.bos_token_id
    for row, mask in zip(batch.input_ids, batch.attention_mask):  # the template writes <bos>; nothing adds a second
        real = row[mask.bool()]
        assert real[0] == bos and int((real == bos).sum()) == 1
    assert gemma.spec.token_types_kwarg == "token_type_ids" and "token_type_ids" in gemma._types(batch.mm_token_type_ids)
    llava = load_policy(str(dirs["llava_onevision"]), dtype="float32", device="cpu")
    batch = llava.encode_prompts(mixed_image_conversations())
    assert [int(v["batch_num_images"]) for v in batch.vision] == [2, 1, 0]  # every prompt, 0 without images
    with pytest.raises(ValueError, match="video inputs are not supported"):
        llava.encode_prompts([[{"role": "user", "content": [{"type": "video", "video": "x.mp4"}]}]])
    with pytest.raises(ValueError, match="contain image tokens"):
        llava.check_completions(torch.tensor([[5, llava.suppressed_token_ids[0]]]), torch.ones(1, 2, dtype=torch.bool))
