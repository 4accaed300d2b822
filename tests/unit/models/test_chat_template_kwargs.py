"""``model.chat_template_kwargs``: extra variables reach the checkpoint's chat template in every prompt a policy
renders (so in both engines: vLLM gets the policy's rendered text), e.g. Qwen3's ``enable_thinking=false``; arguments
mmgpg sets itself are refused at config time."""

from __future__ import annotations

import pytest

from mmgpg.config import ConfigError, resolve
from mmgpg.models.load import load_policy_for

EMPTY_THINK = "<|im_start|>assistant\n<think>\n\n</think>\n\n"


def test_the_key_resolves_from_the_command_line():
    cfg = resolve(["model.chat_template_kwargs.enable_thinking=false"]).config
    assert cfg.model.chat_template_kwargs == {"enable_thinking": False}
    assert resolve([]).config.model.chat_template_kwargs == {}


@pytest.mark.parametrize("key", ["tokenize", "add_generation_prompt", "chat_template", "not-a-name"])
def test_arguments_mmgpg_sets_itself_are_refused(key):
    with pytest.raises(ConfigError) as err:
        resolve([f"model.chat_template_kwargs.{key}=true"])
    assert "model.chat_template_kwargs" in str(err.value) and key in str(err.value)


@pytest.mark.parametrize("family, conversation", [
    ("qwen3", [{"role": "user", "content": "how many?"}]),
    ("qwen3_5_text", [{"role": "user", "content": "how many?"}]),
    ("qwen3_vl", [{"role": "user", "content": [{"type": "text", "text": "how many?"}]}]),
    ("qwen3_5", [{"role": "user", "content": [{"type": "text", "text": "how many?"}]}]),
])
def test_enable_thinking_false_reaches_the_template_and_the_tokens(family, conversation):
    plain = resolve([f"model.name_or_path=tiny:{family}"]).config.model
    off = resolve([f"model.name_or_path=tiny:{family}", "model.chat_template_kwargs.enable_thinking=false"]).config.model
    p_plain, p_off = load_policy_for(plain, "cpu"), load_policy_for(off, "cpu")
    text_plain, text_off = p_plain.render_prompt(conversation), p_off.render_prompt(conversation)
    assert text_plain.endswith("<|im_start|>assistant\n") and not text_plain.endswith(EMPTY_THINK)
    assert text_off == text_plain + "<think>\n\n</think>\n\n"
    ids_plain = p_plain.encode_prompts([conversation]).input_ids[0].tolist()
    ids_off = p_off.encode_prompts([conversation]).input_ids[0].tolist()
    tail = p_off.tokenizer("<think>\n\n</think>\n\n", add_special_tokens=False).input_ids
    assert ids_off[-len(tail):] == tail and ids_off[: -len(tail)][-len(ids_plain):] == ids_plain
