"""Models: the policy seam (:class:`Policy`), its implementations — Qwen2-VL / Qwen2.5-VL (:mod:`.qwen_vl`) and
text-only causal LMs such as Qwen2 / Qwen2.5 (:mod:`.text`), both built on :mod:`.base` (the EOS, sampling and
scoring rules they share) — the batches that cross the seam (:mod:`.batch`), chunked log-probs (:mod:`.logprobs`),
loading and the device (:mod:`.load`), LoRA (:mod:`.lora`), saving (:mod:`.save`) and the offline tiny models
(:mod:`.tiny`).

Everything model-family-specific stays in the family's file; the rest of mmgpg sees the three operations of
:class:`Policy`. :data:`POLICIES` is the one table from a checkpoint's ``model_type`` to its policy class.
May import: the top-level modules only (not config, task, rollout or anything above).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol, get_args

from mmgpg.registry import Registry

if TYPE_CHECKING:
    import torch

    from mmgpg.models.batch import CompletionBatch, PromptBatch

# The model families mmgpg loads (a model's config.json `model_type`); the one list, read by loading, the tiny
# builder, `mmgpg model tiny --family`, the planner and the tasks.
QwenVLFamily = Literal["qwen2_vl", "qwen2_5_vl"]
QWEN_VL_FAMILIES: tuple[str, ...] = get_args(QwenVLFamily)
# Text-only causal LMs (AutoModelForCausalLM + the tokenizer's chat template): Qwen2 / Qwen2.5, which is also the
# architecture of Qwen2.5-Math and DeepSeek-R1-Distill-Qwen.
TextFamily = Literal["qwen2"]
TEXT_FAMILIES: tuple[str, ...] = get_args(TextFamily)
FAMILIES: tuple[str, ...] = QWEN_VL_FAMILIES + TEXT_FAMILIES
# model_type -> its policy class ("module:Class", imported on first use). Loading, `mmgpg model info`, the tiny
# builder's loader check and the planner read it. Another causal-LM text family whose checkpoints load with
# AutoModelForCausalLM is one more entry here mapping to TextPolicy (plus, for a tiny model, its config in tiny.py);
# a family that needs its own code is one file in models/ with a class implementing Policy. A plugin package can add
# one without changing mmgpg: [project.entry-points."mmgpg.policies"] llama = "pkg.mod:MyPolicy".
POLICIES = Registry("model family", "mmgpg.policies", {
    **dict.fromkeys(QWEN_VL_FAMILIES, "mmgpg.models.qwen_vl:QwenVLPolicy"),
    **dict.fromkeys(TEXT_FAMILIES, "mmgpg.models.text:TextPolicy"),
})
# model.name_or_path=tiny (or tiny:<family>) builds a random tiny model offline (mmgpg.models.tiny)
TINY_PREFIX = "tiny"
# The dtypes a policy is loaded in (model.dtype) and a rollout engine runs in; "auto": bfloat16 on a GPU that
# supports it, else float32.
Dtype = Literal["auto", "float32", "bfloat16", "float16"]
DTYPES: tuple[str, ...] = get_args(Dtype)


class Policy(Protocol):
    """A loaded model with its processor and the operations RL needs (:class:`mmgpg.models.qwen_vl.QwenVLPolicy`,
    :class:`mmgpg.models.text.TextPolicy`).

    * :meth:`encode_prompts` — chat conversations → one left-padded :class:`~mmgpg.models.batch.PromptBatch`;
    * :meth:`generate` — ``group_size`` sampled completions per prompt, prompt-major
      (:class:`~mmgpg.models.batch.CompletionBatch`; the mask ends at the first EOS of any id);
    * :meth:`completion_logprobs` — differentiable per-token log-probs of the completion tokens only.
    """

    model: torch.nn.Module
    processor: Any  # what saves with the model (processor.save_pretrained) and decodes (batch_decode)
    tokenizer: Any  # the text tokenizer (the processor's, or the processor itself for a text model)
    peft: Any  # the peft.PeftModel owning LoRA adapters, or None
    family: str
    eos_token_ids: list[int]
    pad_token_id: int
    suppressed_token_ids: list[int]  # never sampled and excluded from the scored softmax (Qwen-VL: vision tokens)
    max_prompt_length: int | None

    @property
    def device(self) -> torch.device: ...

    @property
    def vision_tower(self) -> torch.nn.Module | None:
        """The vision encoder (``train.freeze_vision`` freezes it), or None for a text-only model."""
        ...

    def encode_prompts(self, conversations: Sequence[list[dict]]) -> PromptBatch: ...

    def generate(self, prompts: PromptBatch, group_size: int, *, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, top_k: int = 0) -> CompletionBatch: ...

    supports_packing: bool  # completion_logprobs(packed=True) works (model.packed_sequences)

    def completion_logprobs(self, rollout: CompletionBatch, *, chunk_size: int = 1024, temperature: float = 1.0,
                            encode_images_once: bool = True, packed: bool = False) -> torch.Tensor: ...

    def gather_prompts(self, rows: Sequence[tuple[PromptBatch, int]]) -> PromptBatch:
        """One batch of prompt ``p`` of each ``(batch, p)`` (the update's micro-batches reuse the rollout's encoding)."""
        ...
