"""Gemma 3 (``gemma3``: a SigLIP vision tower, a projector, Gemma 3's language model) through the generic policy
(:class:`mmgpg.models.generic.ImageTextPolicy`): its :class:`~mmgpg.models.Family` and its parts for the offline tiny
builder.

Its quirks, as data: the forward takes ``token_type_ids`` (1 at the image's soft tokens: bidirectional attention inside
each image, so generation and scoring both pass them); ``<image_soft_token>`` and the image delimiters are never
sampled; its tokenizer writes ``<bos>`` and so does its chat template (prompts are tokenized without special tokens);
turns end with ``<end_of_turn>``. No grounding convention is documented for Gemma 3. No flash attention (its image
mask needs sdpa or eager). Imports no torch at module level.
"""

from __future__ import annotations

from mmgpg.models import Family
from mmgpg.models.tiny import TINY, Dims, build_family_tokenizer, family_generation_ids
from mmgpg.typed import check_choice

GEMMA3 = Family(
    "gemma3", "Gemma 3", policy="mmgpg.models.generic:ImageTextPolicy", tiny="mmgpg.models.gemma3",
    example="google/gemma-3-4b-it", vision_module="model.vision_tower",
    suppressed_tokens=("<image_soft_token>", "<start_of_image>", "<end_of_image>"), token_types_kwarg="token_type_ids",
    raw_image_text="<start_of_image>", packing_note="its image tokens attend to each other through token_type_ids",
    lora_vision=r"model\.vision_tower\.encoder\.layers\.\d+\.(?:self_attn\.(?:q|k|v|out)_proj|mlp\.fc[12])",
    vllm=False, vllm_note="not tested with mmgpg's vLLM engine: vLLM's Gemma 3 processor looks up literal newline "
    "tokens that mmgpg's offline tiny tokenizer (byte-level BPE) does not have, so no CPU test can run it")

# The tiny tokenizer's special tokens (ids 0..8), the ones the processor reads by name, and the chat template: written
# for mmgpg in the layout of google/gemma-3-*-it's (as transformers' Gemma 3 processor test renders it): {{bos_token}},
# a system message folded into the first user turn, the assistant's role called `model`, an image as
# <start_of_image>, `<end_of_turn>\n` after each turn, the generation prompt `<start_of_turn>model\n`.
SPECIALS = ("<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>",
            "<image_soft_token>")
NAMED = {"image_token": "<image_soft_token>", "boi_token": "<start_of_image>", "eoi_token": "<end_of_image>"}
EOS, PAD, BOS = ("<eos>", "<end_of_turn>"), "<pad>", "<bos>"
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- if messages[0]['content'] is string -%}{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}"
    "{%- else -%}{%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}{%- endif -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if message['role'] == 'assistant' -%}{%- set role = 'model' -%}{%- else -%}{%- set role = message['role'] -%}"
    "{%- endif -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{%- if message['content'] is string -%}{{ message['content'] | trim }}"
    "{%- else -%}{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' -%}{{ '<start_of_image>' }}"
    "{%- elif item['type'] == 'text' -%}{{ item['text'] | trim }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{ '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)
IMAGE_SIZE, TOKENS_PER_IMAGE = 112, 16  # a 112 x 112 SigLIP input, 8 x 8 patches of 14 pooled to 4 x 4 tokens


def tokenizer(seed: int):
    tok = build_family_tokenizer(seed, SPECIALS, eos=EOS[0], pad=PAD, bos=BOS, named=NAMED, prepend_bos=True)
    tok.chat_template = CHAT_TEMPLATE
    return tok


def generation_ids(tok):
    return family_generation_ids(tok, EOS, PAD, BOS)


def dims(family: str, size: str) -> Dims:
    check_choice("size", size, ("tiny",))
    return TINY


def processor(family: str, tok, min_pixels: int = 0, max_pixels: int = 0):
    from transformers import Gemma3ImageProcessor, Gemma3Processor

    image = Gemma3ImageProcessor(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}, do_pan_and_scan=False,
                                 image_mean=[0.5] * 3, image_std=[0.5] * 3)
    return Gemma3Processor(image_processor=image, tokenizer=tok, chat_template=CHAT_TEMPLATE,
                           image_seq_length=TOKENS_PER_IMAGE)


def config(family: str, dims: Dims, tok):
    from transformers import Gemma3Config

    ids = tok.convert_tokens_to_ids
    text = dict(vocab_size=dims.vocab_size, hidden_size=dims.text_hidden, intermediate_size=dims.text_intermediate,
                num_hidden_layers=dims.text_layers, num_attention_heads=dims.text_heads,
                num_key_value_heads=dims.text_kv_heads, head_dim=dims.text_hidden // dims.text_heads,
                max_position_embeddings=4096, query_pre_attn_scalar=32, sliding_window=16,
                layer_types=["sliding_attention", "full_attention"], pad_token_id=ids(PAD), eos_token_id=ids(EOS[0]),
                bos_token_id=ids(BOS))
    vision = dict(model_type="siglip_vision_model", hidden_size=dims.vision_dim, intermediate_size=dims.vision_intermediate,
                  num_hidden_layers=dims.vision_depth, num_attention_heads=dims.vision_heads, image_size=IMAGE_SIZE,
                  patch_size=14, vision_use_head=False)
    return Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=TOKENS_PER_IMAGE,
                        boi_token_index=ids("<start_of_image>"), eoi_token_index=ids("<end_of_image>"),
                        image_token_index=ids("<image_soft_token>"), tie_word_embeddings=True)


def model_class(family: str) -> type:
    from transformers import Gemma3ForConditionalGeneration

    return Gemma3ForConditionalGeneration


def finish(model) -> None:
    """Gemma 3 initialises its projector matrix to zero (a random model would ignore its images and no gradient would
    reach the vision tower), and the pad row of the embedding to zero (hiding padding leaks): give both random
    values."""
    import torch

    from mmgpg.models.qwen3 import finish as random_pad_row

    with torch.no_grad():
        model.model.multi_modal_projector.mm_input_projection_weight.normal_(0.0, 0.05)
    random_pad_row(model)
