"""SmolVLM2 (``smolvlm``: a SigLIP-like tower, a pixel-shuffle connector, a Llama language model at
``model.text_model``) through the generic policy (:class:`mmgpg.models.generic.ImageTextPolicy`): its
:class:`~mmgpg.models.Family` and its parts for the offline tiny builder.

Its quirks, as data: an image is split into sub-images plus a global one, each written as ``<image>`` tokens between
``<fake_token_around_image>`` and a ``<row_r_col_c>`` / ``<global-img>`` marker (all never sampled); its processor
stacks a prompt's sub-images along dim 1 and pads a batch with zero images, which the model skips. Turns end with
``<end_of_utterance>``. The first SmolVLM releases are the ``idefics3`` family (not registered). Its processor needs
the ``num2words`` package. No grounding convention is documented. Imports no torch at module level.
"""

from __future__ import annotations

from mmgpg.models import Family
from mmgpg.models.tiny import TINY, Dims, build_family_tokenizer, family_generation_ids
from mmgpg.typed import check_choice

GRID = tuple(f"<row_{r}_col_{c}>" for r in range(1, 5) for c in range(1, 5))
SMOLVLM = Family(
    "smolvlm", "SmolVLM2", vllm=True, policy="mmgpg.models.generic:ImageTextPolicy", tiny="mmgpg.models.smolvlm",
    example="HuggingFaceTB/SmolVLM2-2.2B-Instruct", vision_module="model.vision_model",
    suppressed_tokens=("<fake_token_around_image>", "<image>", "<global-img>", "<video>") + GRID + tuple(
        f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7) if r > 4 or c > 4),
    raw_image_text="<image>", packing_note="not shown to be exact with its sub-images",
    lora_vision=r"model\.vision_model\.encoder\.layers\.\d+\.(?:self_attn\.(?:q|k|v|out)_proj|mlp\.fc[12])",
    lora_merger=r"model\.connector\.modality_projection\.proj")

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<fake_token_around_image>", "<image>", "<global-img>",
            "<end_of_utterance>", "<video>") + GRID
NAMED = {"fake_image_token": "<fake_token_around_image>", "image_token": "<image>", "global_image_token": "<global-img>",
         "end_of_utterance_token": "<end_of_utterance>", "video_token": "<video>"}
EOS, PAD, BOS = ("<end_of_utterance>",), "<|im_end|>", "<|endoftext|>"
# Written for mmgpg in the layout of SmolVLM2's template (transformers' SmolVLM processor default): `<|im_start|>` once,
# `User:` / `Assistant:` turns, an image as <image>, `<end_of_utterance>\n` after each turn, the generation prompt
# `Assistant:`.
CHAT_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}"
    "{% if message['content'] is string %}{{': ' + message['content']}}{% else %}"
    "{% if message['content'][0]['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{line['text']}}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% elif line['type'] == 'video' %}{{ '<video>' }}{% endif %}"
    "{% endfor %}{% endif %}<end_of_utterance>\n{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)
SUB_IMAGE, TOKENS_PER_SUB_IMAGE = 64, 4  # 64 x 64 sub-images of 4 x 4 patches of 16, shuffled by 2 to 4 tokens


def tokenizer(seed: int):
    tok = build_family_tokenizer(seed, SPECIALS, eos=EOS[0], pad=PAD, bos=BOS, named=NAMED)
    tok.chat_template = CHAT_TEMPLATE
    return tok


def generation_ids(tok):
    return family_generation_ids(tok, EOS, PAD, BOS)


def dims(family: str, size: str) -> Dims:
    check_choice("size", size, ("tiny",))
    return TINY


def processor(family: str, tok, min_pixels: int = 0, max_pixels: int = 0):
    from transformers import SmolVLMImageProcessor, SmolVLMProcessor, SmolVLMVideoProcessor

    half = dict(image_mean=[0.5] * 3, image_std=[0.5] * 3)
    sub = {"longest_edge": SUB_IMAGE}
    return SmolVLMProcessor(
        image_processor=SmolVLMImageProcessor(do_image_splitting=True, size={"longest_edge": 2 * SUB_IMAGE},
                                              max_image_size=sub, **half),
        tokenizer=tok, video_processor=SmolVLMVideoProcessor(size=sub, max_image_size=sub, **half),
        image_seq_len=TOKENS_PER_SUB_IMAGE, chat_template=CHAT_TEMPLATE)


def config(family: str, dims: Dims, tok):
    from transformers import SmolVLMConfig

    ids = tok.convert_tokens_to_ids
    text = dict(model_type="llama", vocab_size=dims.vocab_size, hidden_size=dims.text_hidden,
                intermediate_size=dims.text_intermediate, num_hidden_layers=dims.text_layers,
                num_attention_heads=dims.text_heads, num_key_value_heads=dims.text_kv_heads,
                head_dim=dims.text_hidden // dims.text_heads, max_position_embeddings=4096,
                rope_parameters={"rope_type": "default", "rope_theta": 1e5}, pad_token_id=ids(PAD),
                eos_token_id=ids(EOS[0]), bos_token_id=ids(BOS), tie_word_embeddings=False)
    vision = dict(hidden_size=dims.vision_dim, intermediate_size=dims.vision_intermediate,
                  num_hidden_layers=dims.vision_depth, num_attention_heads=dims.vision_heads, image_size=SUB_IMAGE,
                  patch_size=16)
    return SmolVLMConfig(text_config=text, vision_config=vision, scale_factor=2, image_token_id=ids("<image>"),
                         tie_word_embeddings=False)


def model_class(family: str) -> type:
    from transformers import SmolVLMForConditionalGeneration

    return SmolVLMForConditionalGeneration


def finish(model) -> None:
    from mmgpg.models.qwen3 import finish as random_pad_row

    random_pad_row(model)
