"""The Qwen2 line: Qwen2-VL and Qwen2.5-VL (the GPG paper's vision-language models) and the text-only Qwen2 / Qwen2.5
(the paper's math rows: Qwen2.5-Math, DeepSeek-R1-Distill-Qwen). Their :class:`~mmgpg.models.Family` entries, and
their parts for the offline tiny builder (:mod:`mmgpg.models.tiny`): dimensions, config, processor and the chat
templates, written for mmgpg in the layout of the released ones.

Imports no torch at module level: reading a family's facts (``mmgpg config show``, ``--help``) stays cheap.
"""

from __future__ import annotations

from mmgpg.models import Family
from mmgpg.models.tiny import QWEN_SPECIAL_TOKENS, TINY, Dims
from mmgpg.typed import check_choice

# Linear layers of the vision tower's blocks: Qwen2-VL (fc1/fc2) and Qwen2.5-VL (gated MLP); the merger MLP's two
# Linear layers (index 1 is the GELU).
_VISION_LORA = r"model\.visual\.blocks\.\d+\.(?:attn\.(?:qkv|proj)|mlp\.(?:fc1|fc2|gate_proj|up_proj|down_proj))"
_MERGER_LORA = r"model\.visual\.merger\.mlp\.(?:0|2)"
# Why the Qwen-VL families cannot score packed rows.
MROPE_PACKING = ("its 3-D rotary positions are computed from each padded row and its images; micro-batches are "
                 "length-grouped and trimmed instead")

QWEN2_VL = Family(
    "qwen2_vl", "Qwen2-VL", vllm=True, policy="mmgpg.models.qwen_vl:QwenVLPolicy", tiny="mmgpg.models.qwen2",
    token_types_kwarg="mm_token_type_ids", pixel_bounds=True, takes_videos=True, takes_tools=True,
    example="Qwen/Qwen2-VL-2B-Instruct", sizes=("tiny", "shape_true"), box_format="norm1000",
    lora_vision=_VISION_LORA, lora_merger=_MERGER_LORA, packing_note=MROPE_PACKING, planned_layers=True,
    vision_block_bytes=((44, 12, 32), (22, 6, 24)))  # LayerNorm, fc1 -> QuickGELU -> fc2
QWEN2_5_VL = Family(
    "qwen2_5_vl", "Qwen2.5-VL", vllm=True, policy="mmgpg.models.qwen_vl:QwenVLPolicy", tiny="mmgpg.models.qwen2",
    token_types_kwarg="mm_token_type_ids", pixel_bounds=True, takes_videos=True, takes_tools=True,
    example="Qwen/Qwen2.5-VL-3B-Instruct", sizes=("tiny", "shape_true", "shape_true_7b"),
    box_format="resized_pixels", lora_vision=_VISION_LORA, lora_merger=_MERGER_LORA, packing_note=MROPE_PACKING,
    planned_layers=True, vision_block_bytes=((52, 16, 24), (30, 8, 24)))  # RMSNorm, SwiGLU
QWEN2 = Family(
    "qwen2", "Qwen2 / Qwen2.5 (text)", vllm=True, policy="mmgpg.models.text:TextPolicy", tiny="mmgpg.models.qwen2",
    example="Qwen/Qwen2.5-Math-7B", sizes=("tiny", "shape_true", "shape_true_7b"), takes_images=False,
    vision_module="", packing=True, planned_layers=True)

DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."


def chat_template(default_system: str | None, part: str, after_generation_prompt: str = "") -> str:
    """A Qwen chat template (ChatML): ``<|im_start|>role\n ... <|im_end|>\n`` per turn, a default system turn first
    when ``default_system`` is given and the conversation has none, and ``part`` (a Jinja ``if`` chain over
    ``part``) rendering each content part of a message whose content is a list; ``after_generation_prompt`` (Jinja)
    follows the assistant header of the generation prompt."""
    system = ("{%- if loop.first and message['role'] != 'system' -%}"
              "<|im_start|>system{{ nl }}" + default_system + "<|im_end|>{{ nl }}"
              "{%- endif -%}") if default_system is not None else ""
    return ("{%- set nl = '\\n' -%}"
            "{%- for message in messages -%}" + system +
            "<|im_start|>{{ message['role'] }}{{ nl }}"
            "{%- if message['content'] is string -%}{{ message['content'] }}"
            "{%- else -%}{%- for part in message['content'] -%}" + part +
            "{%- endif -%}"
            "{%- endfor -%}{%- endif -%}"
            "<|im_end|>{{ nl }}"
            "{%- endfor -%}"
            "{%- if add_generation_prompt -%}<|im_start|>assistant{{ nl }}" + after_generation_prompt + "{%- endif -%}")


# Content parts: one ``<|vision_start|><|image_pad|><|vision_end|>`` per image (``<|video_pad|>`` per video), text as
# is; a text-only model refuses any other part.
MEDIA_PARTS = ("{%- if part['type'] == 'image' or 'image' in part or 'image_url' in part -%}"
               "<|vision_start|><|image_pad|><|vision_end|>"
               "{%- elif part['type'] == 'video' or 'video' in part -%}"
               "<|vision_start|><|video_pad|><|vision_end|>"
               "{%- elif 'text' in part -%}{{ part['text'] }}")
TEXT_PARTS = ("{%- if 'text' in part -%}{{ part['text'] }}"
              "{%- else -%}{{ raise_exception('this is a text-only model: a message part that is not text was given') }}")

# Written for mmgpg to render the same text as Qwen2-VL-Instruct's template (a default system turn) and, for the text
# family, as Qwen2.5-Instruct's.
CHAT_TEMPLATE = chat_template(DEFAULT_SYSTEM_PROMPT, MEDIA_PARTS)
TEXT_CHAT_TEMPLATE = chat_template(DEFAULT_SYSTEM_PROMPT, TEXT_PARTS)


# Qwen2-VL-2B-Instruct and Qwen2.5-VL-3B-Instruct config.json values.
SHAPE_TRUE = {
    "qwen2_vl": Dims(151936, 1536, 8960, 28, 12, 2, (16, 24, 24), 1e6, True, 32, 1280, 16, 5120),
    "qwen2_5_vl": Dims(151936, 2048, 11008, 36, 16, 2, (16, 24, 24), 1e6, True, 32, 1280, 16, 3420),
}


# Qwen2.5-VL-7B-Instruct, from its config.json (huggingface.co/Qwen/Qwen2.5-VL-7B-Instruct/blob/main/config.json):
# vocab_size 152064, hidden_size 3584, intermediate_size 18944, num_hidden_layers 28, num_attention_heads 28,
# num_key_value_heads 4, mrope_section [16, 24, 24], rope_theta 1e6, tie_word_embeddings false; vision_config depth
# 32, hidden_size 1280, num_heads 16, intermediate_size 3420, out_hidden_size 3584 (the LLM width). The same LLM
# numbers are in Table 1 of the Qwen2.5-VL technical report (arXiv:2502.13923: 28 layers, 4 KV heads, head size 128,
# FFN 18944, no embedding tying). Qwen2.5-VL only: `dims_for` refuses it for qwen2_vl.
SHAPE_TRUE_7B = Dims(152064, 3584, 18944, 28, 28, 4, (16, 24, 24), 1e6, False, 32, 1280, 16, 3420)

# Text-only Qwen2 shapes (``--family qwen2``), from the checkpoints' config.json on the hub:
# * shape_true: deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B (a Qwen2.5-Math-1.5B fine-tune; the GPG-RS1/RS3 rows):
#   vocab_size 151936, hidden_size 1536, intermediate_size 8960, num_hidden_layers 28, num_attention_heads 12,
#   num_key_value_heads 2, rope_theta 10000, tie_word_embeddings false.
# * shape_true_7b: Qwen/Qwen2.5-Math-7B (the GPG-7B row and the Qwen2.5-Math-7B ablations): vocab_size 152064,
#   hidden_size 3584, intermediate_size 18944, num_hidden_layers 28, num_attention_heads 28, num_key_value_heads 4,
#   rope_theta 10000, tie_word_embeddings false (DeepSeek-R1-Distill-Qwen-7B has the same tensor shapes).
# The vision fields and mrope_section are unused for a text model.
SHAPE_TRUE_TEXT = {
    "shape_true": Dims(151936, 1536, 8960, 28, 12, 2, (0, 0, 0), 1e4, False, 0, 0, 0, 0),
    "shape_true_7b": Dims(152064, 3584, 18944, 28, 28, 4, (0, 0, 0), 1e4, False, 0, 0, 0, 0),
}


def dims(family: str, size: str) -> Dims:
    """The dimensions of ``size`` (``tiny``, or a released checkpoint's: ``shape_true`` / ``shape_true_7b``)."""
    check_choice("size", size, FAMILY_SIZES[family])
    if family == "qwen2":
        return TINY if size == "tiny" else SHAPE_TRUE_TEXT[size]
    if size == "shape_true_7b":
        return SHAPE_TRUE_7B
    return TINY if size == "tiny" else SHAPE_TRUE[family]


def processor(family: str, tokenizer, min_pixels: int = 56 * 56, max_pixels: int = 112 * 112):
    """The Qwen2-VL image and video processors (both are required by transformers 5.x) plus the tokenizer; for a text
    family, the tokenizer itself with the text chat template."""
    if family == "qwen2":
        tokenizer.chat_template = TEXT_CHAT_TEMPLATE
        return tokenizer
    from transformers import Qwen2_5_VLProcessor, Qwen2VLImageProcessor, Qwen2VLProcessor, Qwen2VLVideoProcessor

    tokenizer.chat_template = CHAT_TEMPLATE
    size = {"shortest_edge": min_pixels, "longest_edge": max_pixels}
    common = dict(size=size, patch_size=14, temporal_patch_size=2, merge_size=2)
    cls = Qwen2VLProcessor if family == "qwen2_vl" else Qwen2_5_VLProcessor
    return cls(
        image_processor=Qwen2VLImageProcessor(**common),
        tokenizer=tokenizer,
        video_processor=Qwen2VLVideoProcessor(**common),
        chat_template=CHAT_TEMPLATE,
    )


def config(family: str, dims: Dims, tokenizer):
    """A ``Qwen2VLConfig`` / ``Qwen2_5_VLConfig`` (or, for ``qwen2``, a ``Qwen2Config``) with the given dimensions and
    the tokenizer's special-token ids."""
    from transformers import Qwen2_5_VLConfig, Qwen2Config, Qwen2VLConfig

    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in QWEN_SPECIAL_TOKENS}
    if family == "qwen2":
        return Qwen2Config(
            vocab_size=dims.vocab_size, hidden_size=dims.text_hidden, intermediate_size=dims.text_intermediate,
            num_hidden_layers=dims.text_layers, num_attention_heads=dims.text_heads,
            num_key_value_heads=dims.text_kv_heads, max_position_embeddings=32768,
            rope_parameters={"rope_type": "default", "rope_theta": dims.rope_theta},
            bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"],
            tie_word_embeddings=dims.tie_word_embeddings,
        )
    head_dim = dims.text_hidden // dims.text_heads
    if sum(dims.mrope_section) * 2 != head_dim:
        raise ValueError(f"mrope_section {dims.mrope_section} must sum to head_dim/2 = {head_dim // 2}")
    text = dict(
        vocab_size=dims.vocab_size,
        hidden_size=dims.text_hidden,
        intermediate_size=dims.text_intermediate,
        num_hidden_layers=dims.text_layers,
        num_attention_heads=dims.text_heads,
        num_key_value_heads=dims.text_kv_heads,
        max_position_embeddings=32768,
        rope_parameters={"rope_type": "default", "rope_theta": dims.rope_theta, "mrope_section": list(dims.mrope_section)},
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
        tie_word_embeddings=dims.tie_word_embeddings,
    )
    vision_common = dict(
        depth=dims.vision_depth,
        num_heads=dims.vision_heads,
        patch_size=14,
        spatial_merge_size=2,
        temporal_patch_size=2,
    )
    token_ids = dict(
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=dims.tie_word_embeddings,
    )
    if family == "qwen2_vl":
        vision = dict(
            vision_common,
            embed_dim=dims.vision_dim,
            hidden_size=dims.text_hidden,
            mlp_ratio=dims.vision_intermediate // dims.vision_dim,
        )
        return Qwen2VLConfig(text_config=text, vision_config=vision, **token_ids)
    last = dims.vision_depth - 1
    vision = dict(
        vision_common,
        hidden_size=dims.vision_dim,
        intermediate_size=dims.vision_intermediate,
        out_hidden_size=dims.text_hidden,
        window_size=112,
        fullatt_block_indexes=sorted({last} | set(range(7, last, 8))),
    )
    return Qwen2_5_VLConfig(text_config=text, vision_config=vision, **token_ids)


def model_class(family: str) -> type:
    """The transformers class a tiny model of ``family`` is built with."""
    import transformers

    return getattr(transformers, {"qwen2_vl": "Qwen2VLForConditionalGeneration",
                                  "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",
                                  "qwen2": "Qwen2ForCausalLM"}[family])


FAMILY_SIZES = {f.model_type: f.sizes for f in (QWEN2_VL, QWEN2_5_VL, QWEN2)}
