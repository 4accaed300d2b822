"""The text-only policy on the tiny Qwen2 and Qwen3 end to end: build -> save -> load with the auto classes -> sample for
prompts of different lengths (left padding) -> completion log-probs equal an independent one-sequence full-logits
reference -> gradients reach every weight; the sampler's distribution is the scored one even under a checkpoint's
hostile generation config; masks end at the first EOS of any id; images are refused."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from support.families import PACKABLE_TEXT, TEXT
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from mmgpg.models.batch import CompletionBatch
from mmgpg.models.load import load_policy
from mmgpg.models.logprobs import completion_mask
from mmgpg.models.text import TextPolicy

G = 8


def conversations():
    """Two prompts of different token lengths: the shorter one is left-padded."""
    return [
        [{"role": "user", "content": "Is 4821 even or odd? Put the word in <answer> </answer> tags."}],
        [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": [{"type": "text", "text": "7?"}]}],
    ]


def reference_logprobs(model, batch, rollout, temperature: float = 1.0) -> torch.Tensor:
    """One sequence at a time, unpadded, through model.forward with full-vocabulary logits (nothing suppressed)."""
    out = torch.zeros(rollout.completion_ids.shape)
    for i in range(rollout.num_sequences):
        p = i // rollout.group_size
        prompt = batch.input_ids[p][batch.attention_mask[p].bool()]
        n = int(rollout.completion_mask[i].sum())
        ids = torch.cat([prompt, rollout.completion_ids[i, :n]])[None]
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0].float() / temperature
        logp = torch.log_softmax(logits, -1)[len(prompt) - 1 : -1]
        out[i, :n] = logp.gather(-1, rollout.completion_ids[i, :n, None]).squeeze(-1)
    return out


@pytest.fixture(scope="module")
def policy(tiny_text_dir):
    return load_policy(str(tiny_text_dir), dtype="float32", device="cpu")


@pytest.mark.parametrize("family", TEXT)
def test_roundtrip_generate_logprobs_backward(tiny_text_dirs, family):
    path = tiny_text_dirs[family]
    # The saved directory is a standard HF one: the auto classes load it.
    classes = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "qwen3_5_text": "Qwen3_5ForCausalLM"}
    assert type(AutoModelForCausalLM.from_pretrained(path)).__name__ == classes[family]
    assert AutoTokenizer.from_pretrained(path).chat_template
    torch.manual_seed(0)
    policy = load_policy(str(path), dtype="float32", device="cpu")
    assert isinstance(policy, TextPolicy) and policy.family == family and policy.vision_tower is None
    batch = policy.encode_prompts(conversations())
    assert batch.vision == [{}, {}] and batch.media == [[], []] and batch.media_per_prompt == [0, 0]
    assert not batch.mm_token_type_ids.any()
    assert batch.attention_mask[0].all() and batch.attention_mask[1, 0] == 0  # the shorter prompt is left-padded
    assert batch.texts[1].startswith("<|im_start|>system\nAnswer briefly.<|im_end|>\n<|im_start|>user\n7?")
    assert batch.texts[0].endswith("<|im_start|>assistant\n")

    rollout = policy.generate(batch, G, max_new_tokens=24)
    assert rollout.completion_ids.shape[0] == 2 * G and len(rollout.texts) == 2 * G
    assert rollout.num_completion_tokens > 2 * G

    policy.model.train()
    logp = policy.completion_logprobs(rollout, chunk_size=13)  # a chunk size that does not divide the token count
    assert (logp.detach()[~rollout.completion_mask] == 0).all()
    torch.testing.assert_close(logp.detach(), reference_logprobs(policy.model, batch, rollout), atol=1e-5, rtol=0)
    at_07 = policy.completion_logprobs(rollout, temperature=0.7).detach()
    torch.testing.assert_close(at_07, reference_logprobs(policy.model, batch, rollout, 0.7), atol=1e-5, rtol=0)

    loss = -(logp * rollout.completion_mask).sum() / rollout.completion_mask.sum()
    loss.backward()
    missing = [n for n, p in policy.model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not missing, f"no gradient reaches {missing}"


def test_micro_batch_of_prompts_matches_full_batch(policy):
    torch.manual_seed(2)
    rollout = policy.generate(policy.encode_prompts(conversations()), 3, max_new_tokens=10)

    def one_prompt(p):  # a micro-batch of one prompt group, as the update builds it (gather_prompts)
        rows = slice(p * 3, (p + 1) * 3)
        return CompletionBatch(prompts=policy.gather_prompts([(rollout.prompts, p)]), group_size=3,
                               completion_ids=rollout.completion_ids[rows], completion_mask=rollout.completion_mask[rows])

    with torch.no_grad():
        full = policy.completion_logprobs(rollout)
        parts = [policy.completion_logprobs(one_prompt(p)) for p in (0, 1)]
    assert parts[0].shape[1] == full.shape[1] and one_prompt(1).prompts.attention_mask.all()  # unpadded alone
    torch.testing.assert_close(torch.cat(parts), full, atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", TEXT)
def test_sampler_distribution_is_the_scored_distribution(tiny_text_dirs, tmp_path, family):
    """A checkpoint's generation config that would change what is sampled (top-k 1, nucleus, repetition and n-gram
    penalties, suppressed and banned tokens, sequence bias, a forced EOS, beam search, a minimum length) does not leak
    in: the sampler's processed scores equal the scored log-softmax at the same temperature."""
    path = tmp_path / "hostile"
    shutil.copytree(tiny_text_dirs[family], path)
    gen = GenerationConfig.from_pretrained(path)
    gen.update(do_sample=True, top_k=1, top_p=0.001, temperature=0.1, repetition_penalty=1.05, no_repeat_ngram_size=2,
               suppress_tokens=[40, 41], begin_suppress_tokens=[42], bad_words_ids=[[43]], sequence_bias={(44,): 5.0},
               forced_eos_token_id=2, num_beams=2, min_length=30)
    gen.save_pretrained(path)
    policy = load_policy(str(path), dtype="float32", device="cpu")
    batch = policy.encode_prompts(conversations())
    torch.manual_seed(3)
    kwargs = policy.sampling_kwargs(max_new_tokens=8, temperature=0.7)
    out = policy.model.generate(input_ids=batch.input_ids, attention_mask=batch.attention_mask, num_return_sequences=3,
                                output_scores=True, return_dict_in_generate=True, **kwargs)
    comp = out.sequences[:, batch.input_ids.shape[1]:]
    scores = torch.stack(out.scores, 1).log_softmax(-1)  # processed: temperature only
    mask = completion_mask(comp, policy.eos_token_ids)
    with torch.no_grad():
        logp = policy.completion_logprobs(CompletionBatch(batch, 3, comp, mask), temperature=0.7)
    sampled = scores.gather(-1, comp[..., None]).squeeze(-1)
    torch.testing.assert_close(logp[mask], sampled[mask], atol=1e-5, rtol=0)
    assert torch.isfinite(scores).all()  # nothing masked out: the whole vocabulary is the support


def test_generation_masks_at_the_first_eos_of_any_id(tiny_text_dir, tmp_path):
    """The EOS ids are the checkpoint's generation config's (all of them): make a token the model emits greedily the
    second EOS id, and generation stops there, the mask ends on it (included, as an EOS is), and the text is the
    masked tokens'."""
    policy = load_policy(str(tiny_text_dir), dtype="float32", device="cpu")
    batch = policy.encode_prompts(conversations())
    greedy = policy.generate(batch, 1, max_new_tokens=12, temperature=0)
    assert greedy.completion_mask[0, :4].all()  # no EOS yet in its first four tokens
    stop = int(greedy.completion_ids[0, 3])
    first = int((greedy.completion_ids[0] == stop).nonzero()[0])  # its first occurrence (3 or earlier)
    path = tmp_path / "two_eos"
    shutil.copytree(tiny_text_dir, path)
    config = json.loads((path / "generation_config.json").read_text())
    config["eos_token_id"] = [policy.eos_token_ids[0], stop]
    (path / "generation_config.json").write_text(json.dumps(config))
    other = load_policy(str(path), dtype="float32", device="cpu")
    assert other.eos_token_ids == [policy.eos_token_ids[0], stop]
    out = other.generate(other.encode_prompts(conversations()), 1, max_new_tokens=12, temperature=0)
    assert out.completion_mask[0].tolist() == [True] * (first + 1) + [False] * (out.completion_ids.shape[1] - first - 1)
    assert out.completion_ids[0, : first + 1].tolist() == greedy.completion_ids[0, : first + 1].tolist()
    assert (out.completion_ids[0, first + 1 :] == other.pad_token_id).all()  # generation stopped at it
    assert out.texts[0] == other.tokenizer.decode(greedy.completion_ids[0, : first + 1], skip_special_tokens=True)


def test_images_are_refused_and_raw_prompts_pass_as_written(policy):
    image = [{"role": "user", "content": [{"type": "image", "image": "x.png"}, {"type": "text", "text": "?"}]}]
    with pytest.raises(ValueError, match="conversation 0, message 0 has an image part.*text-only model"):
        policy.encode_prompts([image])
    with pytest.raises(ValueError, match="video part"):
        policy.encode_prompts([[{"role": "user", "content": [{"video": "v.mp4"}]}]])
    raw = policy.encode_prompts([[{"role": "raw", "content": [{"type": "text", "text": "Q: 2+2? A:"}]}]])
    assert raw.texts == ["Q: 2+2? A:"]
    assert policy.tokenizer.decode(raw.input_ids[0]) == "Q: 2+2? A:"  # no special token added


def test_prompt_longer_than_limit_is_an_error(tiny_text_dir):
    short = load_policy(str(tiny_text_dir), dtype="float32", device="cpu", max_prompt_length=40)
    with pytest.raises(ValueError, match=r"1 prompt\(s\) exceed max_prompt_length=40 \(prompt 0: \d+ tokens\)"):
        short.encode_prompts(conversations())


@pytest.mark.parametrize("family", PACKABLE_TEXT)
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_rows_score_as_the_unpadded_reference_with_the_same_gradients(tiny_text_dirs, attn, family):
    """model.packed_sequences: the rows packed into one sequence (positions restarting per row, no attention
    mask: transformers' packed-sequence masking) give the one-sequence-at-a-time reference's log-probs, and the same
    gradients as the padded forward."""
    torch.manual_seed(5)
    policy = load_policy(str(tiny_text_dirs[family]), dtype="float32", device="cpu", attn_implementation=attn)
    batch = policy.encode_prompts(conversations())
    lengths = torch.tensor([16, 3, 9, 1, 12, 16, 5, 2])  # completions of mixed lengths, right-padded
    mask = torch.arange(16) < lengths[:, None]
    ids = torch.randint(0, policy.model.config.vocab_size, (8, 16)).masked_fill(~mask, policy.pad_token_id)
    rollout = CompletionBatch(prompts=batch, group_size=4, completion_ids=ids, completion_mask=mask)
    assert batch.attention_mask[1, 0] == 0  # the shorter prompt is left-padded: both paddings are exercised

    policy.model.train()
    grads = []
    for packed in (True, False):
        policy.model.zero_grad()
        logp = policy.completion_logprobs(rollout, chunk_size=7, temperature=0.7, packed=packed)
        assert (logp.detach()[~rollout.completion_mask] == 0).all()
        torch.testing.assert_close(logp.detach(), reference_logprobs(policy.model, batch, rollout, 0.7),
                                   atol=1e-5, rtol=0)
        (-(logp * torch.linspace(-1, 1, logp.shape[0])[:, None]).sum()).backward()
        grads.append({n: p.grad.clone() for n, p in policy.model.named_parameters()})
    for name, g in grads[0].items():
        torch.testing.assert_close(g, grads[1][name], atol=1e-5, rtol=1e-4, msg=name)


def test_hybrid_linear_attention_really_cannot_pack(tiny_text_dirs):
    """Why Qwen3.5 refuses packing (Family.packing): its rows packed into one sequence (pack_rows, the packed path of
    the other text families) score differently from the one-sequence reference after the first row, because the
    linear-attention layers carry their state across rows. Left-padded rows score exactly (the roundtrip test)."""
    from mmgpg.models.text import pack_rows

    policy = load_policy(str(tiny_text_dirs["qwen3_5_text"]), dtype="float32", device="cpu")
    batch = policy.encode_prompts(conversations())
    torch.manual_seed(6)
    ids = torch.randint(0, policy.model.config.vocab_size, (2, 6))
    rollout = CompletionBatch(batch, 1, ids, torch.ones(2, 6, dtype=torch.bool))
    input_ids, positions, index = pack_rows(batch.input_ids, batch.attention_mask, ids, rollout.completion_mask, 1)
    with torch.no_grad():
        hidden = policy.model.model(input_ids=input_ids, position_ids=positions, use_cache=False).last_hidden_state
        packed = policy.score_positions(hidden[0, index], ids, rollout.completion_mask, chunk_size=8, temperature=1.0)
    wrong = (packed - reference_logprobs(policy.model, batch, rollout)).abs().amax(dim=1)
    assert wrong[0] < 1e-5 and wrong[1] > 1e-3, wrong  # the first row alone is fine; the second inherits its state


def test_packing_refuses_non_prefix_masks_and_vl_policies(policy, tiny_dirs, tiny_text_dirs):
    from mmgpg.models.text import pack_rows
    from mmgpg.rollout.collect import check_packing, packs

    with pytest.raises(ValueError, match="right-padded completions"):
        pack_rows(torch.tensor([[1, 2]]), torch.ones(1, 2), torch.tensor([[3, 4]]), torch.tensor([[False, True]]), 1)
    from mmgpg.config import resolve

    vl = load_policy(str(tiny_dirs["qwen2_vl"]), dtype="float32", device="cpu")
    always = resolve(["model.name_or_path=tiny:qwen2", "model.packed_sequences=always"]).config.model
    with pytest.raises(ValueError, match="Qwen2-VL cannot score packed rows .its 3-D rotary positions"):
        check_packing(vl, always)
    hybrid = load_policy(str(tiny_text_dirs["qwen3_5_text"]), dtype="float32", device="cpu")
    with pytest.raises(ValueError, match=r"Qwen3.5 \(text\) cannot score packed rows .its linear-attention layers"):
        check_packing(hybrid, always)
    assert not packs(hybrid, resolve(["model.attn_implementation=flash_attention_2"]).config.model)
    check_packing(policy, always)
    assert packs(policy, always) and not packs(vl, resolve([]).config.model)
    flash = resolve(["model.attn_implementation=flash_attention_2"]).config.model
    assert packs(policy, flash) and not packs(vl, flash)  # auto: text policies pack with the varlen kernel
    assert not packs(policy, resolve([]).config.model)  # auto with sdpa: padded, length-grouped micro-batches
