"""The model families the tests run, by policy (each family's tiny model: mmgpg.models.tiny)."""

from __future__ import annotations

QWEN_VL = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe")  # the Qwen-VL policy's
NEW_QWEN_VL = ("qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe")  # the current generation (not the paper's)
TEXT = ("qwen2", "qwen3", "qwen3_5_text")  # text-only causal LMs
PACKABLE_TEXT = ("qwen2", "qwen3")  # those whose packed scoring is exact (Family.packing)
IMAGE_TEXT = ("gemma3", "internvl", "smolvlm", "llava_onevision")  # the generic image-text-to-text policy's families
