"""The HF engine's behaviour log-probs (:class:`mmgpg.models.base.SampledLogprobs`, for algo.rollout_correction):
the policy samples exactly what transformers' own warpers sample (token for token, same seed), and the recorded
log-prob of each sampled token equals transformers' ``output_scores`` (its processed scores, log-softmaxed) —
an independent record kept by transformers itself — with top-k and top-p on or off. With temperature only, they
also equal the trainer's log-probs of a full forward (the scored distribution is the sampled one)."""

from __future__ import annotations

import pytest
import torch
from support.conversations import two_image_conversations

from mmgpg.models.batch import join_vision
from mmgpg.models.load import load_policy
from mmgpg.models.logprobs import completion_mask


@pytest.fixture(scope="module")
def policy(tiny_dirs):
    return load_policy(str(tiny_dirs["qwen2_5_vl"]), dtype="float32", min_pixels=3136, max_pixels=12544, device="cpu")


@pytest.mark.parametrize("knobs", [dict(temperature=0.7), dict(temperature=1.0, top_k=20),
                                   dict(temperature=1.3, top_p=0.8, top_k=50)], ids=["temperature", "top_k", "all"])
def test_recorded_logprobs_equal_transformers_own_scores(policy, knobs):
    batch = policy.encode_prompts(two_image_conversations())
    torch.manual_seed(11)
    ours = policy.generate(batch, 3, max_new_tokens=10, **knobs)
    torch.manual_seed(11)  # transformers' own warpers, the same seed
    theirs = policy.model.generate(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                                   mm_token_type_ids=batch.mm_token_type_ids, **join_vision(batch.vision),
                                   num_return_sequences=3, output_scores=True, return_dict_in_generate=True,
                                   **policy.sampling_kwargs(max_new_tokens=10, **knobs))
    comp = theirs.sequences[:, batch.input_ids.shape[1]:]
    assert torch.equal(ours.completion_ids, comp)  # the same samples: the warpers run in transformers' order
    mask = completion_mask(comp, policy.eos_token_ids)
    want = torch.stack(theirs.scores, 1).float().log_softmax(-1).gather(-1, comp[..., None])[..., 0]
    torch.testing.assert_close(ours.sampled_logprobs[mask], want[mask], atol=1e-6, rtol=0)
    assert (ours.sampled_logprobs[~mask] == 0).all()
    if knobs.get("top_p", 1.0) < 1.0:  # the nucleus renormalises: the behaviour log-prob is above the model's
        with torch.no_grad():
            full = policy.completion_logprobs(ours, temperature=knobs["temperature"])
        assert (ours.sampled_logprobs[mask] >= full[mask] - 1e-6).all()
        assert (ours.sampled_logprobs[mask] > full[mask] + 1e-4).any()


def test_temperature_only_equals_the_trainers_logprobs(policy):
    batch = policy.encode_prompts(two_image_conversations())
    torch.manual_seed(5)
    out = policy.generate(batch, 4, max_new_tokens=12, temperature=0.9)
    with torch.no_grad():
        logp = policy.completion_logprobs(out, temperature=0.9)
    torch.testing.assert_close(out.sampled_logprobs[out.completion_mask], logp[out.completion_mask],
                               atol=1e-5, rtol=0)


def test_greedy_records_nothing(policy):
    out = policy.generate(policy.encode_prompts(two_image_conversations()), 1, max_new_tokens=4, temperature=0.0)
    assert out.sampled_logprobs is None
