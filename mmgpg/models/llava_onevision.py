"""LLaVA-OneVision (``llava_onevision``: SigLIP, a projector with learned row-newline tokens, a Qwen2 language model;
the ``llava-hf/llava-onevision-qwen2-*-ov-hf`` checkpoints) through the generic policy
(:class:`mmgpg.models.generic.ImageTextPolicy`): its :class:`~mmgpg.models.Family` and its parts for the offline tiny
builder.

Its quirks, as data: the forward needs ``batch_num_images`` (images per prompt) for every prompt, because a prompt with
one image is encoded with its AnyRes crops and each image of a multi-image prompt with its base crop only (so the
number of image tokens depends on how many images a prompt has); ``<image>`` and ``<video>`` are never sampled. No
grounding convention is documented. Imports no torch at module level.
"""

from __future__ import annotations

from mmgpg.models import Family
from mmgpg.models.tiny import TINY, Dims, build_family_tokenizer, family_generation_ids
from mmgpg.typed import check_choice

LLAVA_ONEVISION = Family(
    "llava_onevision", "LLaVA-OneVision", policy="mmgpg.models.generic:ImageTextPolicy",
    tiny="mmgpg.models.llava_onevision", example="llava-hf/llava-onevision-qwen2-0.5b-ov-hf",
    vision_module="model.vision_tower", suppressed_tokens=("<image>", "<video>"), prompt_counts=("batch_num_images",),
    raw_image_text="<image>\n", packing_note="not shown to be exact with its AnyRes crops",
    lora_vision=r"model\.vision_tower\.encoder\.layers\.\d+\.(?:self_attn\.(?:q|k|v|out)_proj|mlp\.fc[12])",
    lora_merger=r"model\.multi_modal_projector\.linear_[12]",
    vllm=False, vllm_note="vLLM 0.32's LLaVA-OneVision loader expects the original checkpoint's vision-tower names "
    "(vision_tower.vision_model.*) and mmgpg syncs transformers 5's module names (vision_tower.*)")

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<image>", "<video>")
NAMED = {"image_token": "<image>", "video_token": "<video>"}
EOS, PAD = ("<|im_end|>",), "<|endoftext|>"
# Written for mmgpg in the layout of the template transformers' conversion writes for llava-onevision-qwen2-*-ov-hf:
# per message `<|im_start|>role\n`, its images first (`<image>\n` each), then its text, `<|im_end|>\n`.
CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n'}}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>\n' }}{% endfor %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'video') %}{{ '<video>\n' }}{% endfor %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] }}{% endfor %}"
    "{% endif %}{{'<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
BASE = 56  # 56 x 56 crops of 4 x 4 patches of 14 = 16 tokens each
PINPOINTS = [[56, 56], [56, 112], [112, 56], [112, 112], [56, 168], [168, 56]]


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
    from transformers import LlavaOnevisionImageProcessor, LlavaOnevisionProcessor, LlavaOnevisionVideoProcessor

    half = dict(image_mean=[0.5] * 3, image_std=[0.5] * 3)
    size = {"height": BASE, "width": BASE}
    return LlavaOnevisionProcessor(
        image_processor=LlavaOnevisionImageProcessor(size=size, image_grid_pinpoints=PINPOINTS, **half),
        tokenizer=tok, video_processor=LlavaOnevisionVideoProcessor(size=size, **half),
        num_image_tokens=(BASE // 14) ** 2, vision_feature_select_strategy="full", chat_template=CHAT_TEMPLATE,
        vision_aspect_ratio="anyres_max_9")


def config(family: str, dims: Dims, tok):
    from transformers import LlavaOnevisionConfig

    ids = tok.convert_tokens_to_ids
    text = dict(model_type="qwen2", vocab_size=dims.vocab_size, hidden_size=dims.text_hidden,
                intermediate_size=dims.text_intermediate, num_hidden_layers=dims.text_layers,
                num_attention_heads=dims.text_heads, num_key_value_heads=dims.text_kv_heads,
                max_position_embeddings=4096, pad_token_id=ids(PAD), eos_token_id=ids(EOS[0]),
                tie_word_embeddings=False)
    vision = dict(model_type="siglip_vision_model", hidden_size=dims.vision_dim,
                  intermediate_size=dims.vision_intermediate, num_hidden_layers=dims.vision_depth,
                  num_attention_heads=dims.vision_heads, image_size=BASE, patch_size=14, vision_use_head=False)
    return LlavaOnevisionConfig(text_config=text, vision_config=vision, image_token_index=ids("<image>"),
                                video_token_index=ids("<video>"), image_grid_pinpoints=PINPOINTS,
                                vision_feature_select_strategy="full", vision_feature_layer=-1,
                                vision_aspect_ratio="anyres_max_9", tie_word_embeddings=False)


def model_class(family: str) -> type:
    from transformers import LlavaOnevisionForConditionalGeneration

    return LlavaOnevisionForConditionalGeneration


def finish(model) -> None:
    from mmgpg.models.qwen3 import finish as random_pad_row

    random_pad_row(model)
