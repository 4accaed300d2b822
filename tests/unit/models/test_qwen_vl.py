"""The tiny model of every Qwen-VL family (Qwen2-VL, Qwen2.5-VL, Qwen3-VL dense and MoE) end to end: build -> save ->
load with the auto classes -> sample G=8 for prompts with several images of different sizes, one image and none
(left padding) -> completion log-probs equal an independent full-logits reference -> gradients reach both the
language model and the vision tower; the images encoded once per prompt equal the repeated pixels; the sampler's
distribution equals the scored one."""

from __future__ import annotations

import pytest
import torch
from support.conversations import mixed_image_conversations, two_image_conversations
from support.families import QWEN_VL
from transformers import AutoModelForImageTextToText, AutoProcessor

from mmgpg.models import Policy
from mmgpg.models.batch import CompletionBatch, join_vision
from mmgpg.models.load import load_policy

G = 8


def reference_logprobs(policy: Policy, batch, rollout) -> torch.Tensor:
    """One sequence at a time, unpadded, images through model.forward, full-vocabulary logits, log_softmax over the
    vocabulary the sampler may emit (vision special tokens are suppressed in generation)."""
    model = policy.model
    out = torch.zeros(rollout.completion_ids.shape)
    for i in range(rollout.num_sequences):
        p = i // rollout.group_size
        keep = batch.attention_mask[p].bool()
        n = int(rollout.completion_mask[i].sum())
        prompt = batch.input_ids[p][keep]
        ids = torch.cat([prompt, rollout.completion_ids[i, :n]])[None]
        mm = torch.cat([batch.mm_token_type_ids[p][keep], torch.zeros(n, dtype=torch.long)])[None]
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), mm_token_type_ids=mm,
                           **batch.vision[p]).logits[0]
        logits = logits.float()
        logits[:, policy.vision_token_ids] = float("-inf")
        logp = torch.log_softmax(logits, -1)[len(prompt) - 1 : -1]
        out[i, :n] = logp.gather(-1, rollout.completion_ids[i, :n, None]).squeeze(-1)
    return out


CLASSES = {"qwen2_vl": "Qwen2VL", "qwen2_5_vl": "Qwen2_5_VL", "qwen3_vl": "Qwen3VL", "qwen3_vl_moe": "Qwen3VLMoe",
           "qwen3_5": "Qwen3_5", "qwen3_5_moe": "Qwen3_5Moe"}
PROCESSORS = {"qwen2_vl": "Qwen2VLProcessor", "qwen2_5_vl": "Qwen2_5_VLProcessor", "qwen3_vl": "Qwen3VLProcessor",
              "qwen3_vl_moe": "Qwen3VLProcessor", "qwen3_5": "Qwen3VLProcessor", "qwen3_5_moe": "Qwen3VLProcessor"}


@pytest.mark.parametrize("family", QWEN_VL)
def test_roundtrip_generate_logprobs_backward(tiny_dirs, family):
    path = tiny_dirs[family]
    # The saved directory is a standard HF one: the auto classes load it.
    assert type(AutoProcessor.from_pretrained(path)).__name__ == PROCESSORS[family]
    assert type(AutoModelForImageTextToText.from_pretrained(path)).__name__ == \
        CLASSES[family] + "ForConditionalGeneration"

    torch.manual_seed(0)
    policy = load_policy(str(path), dtype="float32", min_pixels=56 * 56, max_pixels=112 * 112, device="cpu")
    batch = policy.encode_prompts(mixed_image_conversations())
    # Images of different sizes -> different grids; prompts of different lengths -> left padding.
    grids = [g for v in batch.vision for g in v.get("image_grid_thw", torch.zeros(0, 3)).tolist()]
    assert len(grids) == 3 and len({tuple(g) for g in grids}) == 3 and batch.media_per_prompt == [2, 1, 0]
    assert batch.attention_mask[0].all() and not batch.attention_mask[1:, 0].any()

    rollout = policy.generate(batch, G, max_new_tokens=24)
    assert rollout.completion_ids.shape[0] == 3 * G and len(rollout.texts) == 3 * G
    assert rollout.num_completion_tokens > 3 * G

    policy.model.train()
    logp = policy.completion_logprobs(rollout, chunk_size=13)  # a chunk size that does not divide the token count
    ref = reference_logprobs(policy, batch, rollout)
    assert (logp.detach()[~rollout.completion_mask] == 0).all()
    torch.testing.assert_close(logp.detach(), ref, atol=1e-5, rtol=0)

    loss = -(logp * rollout.completion_mask).sum() / rollout.completion_mask.sum()
    loss.backward()
    grads = {n: p.grad for n, p in policy.model.named_parameters()}
    vision = [g for n, g in grads.items() if ".visual." in f".{n}"]
    language = [g for n, g in grads.items() if "language_model" in n]
    assert vision and all(g is not None for g in vision), "every vision-tower parameter gets a gradient"
    assert sum(float(g.abs().sum()) for g in vision) > 0
    assert sum(float(g.abs().sum()) for g in language if g is not None) > 0
    assert policy.model.get_output_embeddings().weight.grad.abs().sum() > 0


@pytest.mark.parametrize("family", QWEN_VL)
def test_shared_image_features_equal_repeated_pixels(tiny_dirs, family):
    """Encoding each image once for its G copies gives the same log-probs and the same gradients (Qwen3-VL: with its
    DeepStack features shared the same way)."""
    policy = load_policy(str(tiny_dirs[family]), dtype="float32", min_pixels=3136, max_pixels=12544, device="cpu")
    assert_encoded_once_equals_per_copy(policy, mixed_image_conversations(), group_size=4, max_new_tokens=12)


def assert_encoded_once_equals_per_copy(policy, conversations, *, group_size: int, max_new_tokens: int) -> None:
    """Log-probs and vision-tower gradients with each image/video encoded once per prompt equal those with its
    pixels repeated per copy."""
    torch.manual_seed(1)
    rollout = policy.generate(policy.encode_prompts(conversations), group_size, max_new_tokens=max_new_tokens)
    results = []
    for once in (True, False):
        policy.model.zero_grad()
        logp = policy.completion_logprobs(rollout, encode_images_once=once)
        logp.sum().backward()
        vision_grad = torch.cat([p.grad.flatten() for n, p in policy.model.named_parameters() if "visual" in n])
        results.append((logp.detach(), vision_grad))
    torch.testing.assert_close(results[0][0], results[1][0], atol=1e-6, rtol=0)
    torch.testing.assert_close(results[0][1], results[1][1], atol=1e-5, rtol=1e-4)


def test_micro_batch_of_prompts_matches_full_batch(tiny_dirs):
    policy = load_policy(str(tiny_dirs["qwen2_vl"]), dtype="float32", min_pixels=3136, max_pixels=12544, device="cpu")
    torch.manual_seed(2)
    rollout = policy.generate(policy.encode_prompts(two_image_conversations()), 3, max_new_tokens=10)
    G = rollout.group_size

    def one_prompt(p):  # a micro-batch of one prompt group, as the update builds it (gather_prompts)
        rows = slice(p * G, (p + 1) * G)
        return CompletionBatch(prompts=policy.gather_prompts([(rollout.prompts, p)]), group_size=G,
                               completion_ids=rollout.completion_ids[rows], completion_mask=rollout.completion_mask[rows])

    with torch.no_grad():
        full = policy.completion_logprobs(rollout)
        first, second = (policy.completion_logprobs(one_prompt(p)) for p in (0, 1))
    width = full.shape[1]
    pad = [torch.nn.functional.pad(x, (0, width - x.shape[1])) for x in (first, second)]
    torch.testing.assert_close(torch.cat(pad), full, atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", QWEN_VL)
def test_sampler_distribution_is_the_scored_distribution(tiny_dirs, tmp_path, family):
    """Even when the checkpoint's generation_config asks for top_k=1 / repetition_penalty (as Qwen's do), the
    sampler's processed scores equal the scored log-softmax: sampling is exactly on-policy."""
    import shutil

    from transformers import GenerationConfig

    path = tmp_path / "qwen_like"
    shutil.copytree(tiny_dirs[family], path)
    gen = GenerationConfig.from_pretrained(path)
    gen.update(do_sample=True, top_k=1, top_p=0.001, temperature=0.1, repetition_penalty=1.05)
    gen.save_pretrained(path)
    policy = load_policy(str(path), dtype="float32", min_pixels=3136, max_pixels=12544, device="cpu")
    batch = policy.encode_prompts(two_image_conversations())
    torch.manual_seed(3)
    kwargs = policy.sampling_kwargs(max_new_tokens=8, temperature=0.7)
    out = policy.model.generate(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                                mm_token_type_ids=batch.mm_token_type_ids, **join_vision(batch.vision),
                                num_return_sequences=2,
                                output_scores=True, return_dict_in_generate=True, **kwargs)
    comp = out.sequences[:, batch.input_ids.shape[1]:]
    scores = torch.stack(out.scores, 1).log_softmax(-1)  # processed: temperature only
    from mmgpg.models.logprobs import completion_mask

    mask = completion_mask(comp, policy.eos_token_ids)
    rollout = CompletionBatch(batch, 2, comp, mask)
    with torch.no_grad():
        logp = policy.completion_logprobs(rollout, temperature=0.7)
    sampled = scores.gather(-1, comp[..., None]).squeeze(-1)
    # Vision tokens are suppressed in sampling and excluded in scoring: the two distributions are the same.
    torch.testing.assert_close(logp[mask], sampled[mask], atol=1e-5, rtol=0)


def test_vision_tokens_in_completions_are_refused(tiny_dirs):
    policy = load_policy(str(tiny_dirs["qwen2_vl"]), dtype="float32", min_pixels=3136, max_pixels=12544, device="cpu")
    ids = torch.tensor([[20, 21, policy.image_token_id, 22]])
    with pytest.raises(ValueError, match="vision special tokens"):
        policy.check_no_vision_tokens(ids, torch.ones_like(ids, dtype=torch.bool))
    # After the EOS it is padding and does not count.
    eos = policy.eos_token_ids[0]
    ids = torch.tensor([[20, eos, policy.image_token_id]])
    policy.check_no_vision_tokens(ids, torch.tensor([[True, True, False]]))


def test_prompt_longer_than_limit_is_an_error(tiny_dirs):
    policy = load_policy(str(tiny_dirs["qwen2_vl"]), dtype="float32", min_pixels=3136, max_pixels=12544,
                         device="cpu", max_prompt_length=30)
    with pytest.raises(ValueError, match="exceed max_prompt_length=30"):
        policy.encode_prompts(two_image_conversations())


def test_pixel_bounds_control_the_visual_tokens(tiny_dirs):
    small = load_policy(str(tiny_dirs["qwen2_vl"]), dtype="float32", min_pixels=3136, max_pixels=3136, device="cpu")
    batch = small.encode_prompts(two_image_conversations()[:1])
    assert batch.vision[0]["image_grid_thw"].tolist() == [[1, 4, 4]]  # 112x112 shrunk to 56x56 -> 4 merged tokens
    assert int(batch.mm_token_type_ids.sum()) == 4


def test_loading_errors_are_clear(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_policy(str(tmp_path / "nope"), device="cpu")
    with pytest.raises(ValueError, match="unknown tiny model family"):
        load_policy("tiny:llama", device="cpu")
