"""Models: the policy seam (:class:`Policy`), the one list of model families (:data:`FAMILIES`), the policies —
the Qwen-VL line (:mod:`.qwen_vl`), families that follow transformers' image-text-to-text conventions
(:mod:`.generic`) and text-only causal LMs (:mod:`.text`), all built on :mod:`.base` (the EOS, sampling and scoring
rules they share) — the batches that cross the seam (:mod:`.batch`), chunked log-probs (:mod:`.logprobs`), loading
and the device (:mod:`.load`), LoRA (:mod:`.lora`), saving (:mod:`.save`) and the offline tiny models (:mod:`.tiny`,
with each family's own parts in its family file: :mod:`.qwen2`, :mod:`.qwen3`, :mod:`.gemma3`, :mod:`.internvl`,
:mod:`.smolvlm`, :mod:`.llava_onevision`). docs/training.md, "Model families", is the table of what each supports.

Everything model-family-specific is declared once, in a :class:`Family` registered in :data:`FAMILIES` (its facts
as data) and its family file (its code); the rest of mmgpg sees the three operations of :class:`Policy` and asks the
family for the rest. May import: the top-level modules only (not config, task, rollout or anything above).
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, get_args

from mmgpg.registry import Registry

if TYPE_CHECKING:
    import torch

    from mmgpg.models.batch import CompletionBatch, PromptBatch


@dataclass(frozen=True)
class Family:
    """One model family (a checkpoint's ``config.json`` ``model_type``) and everything mmgpg knows about it, as data.

    Adding a family is one :class:`Family` in :data:`FAMILIES` (a built-in entry, or an entry point of the group
    ``mmgpg.families`` naming it: ``[project.entry-points."mmgpg.families"] my_vlm = "pkg.mod:MY_VLM"``) plus, for
    ``mmgpg model tiny`` and the tests, a ``tiny`` builder; a family whose forward needs code of its own adds a
    policy class (one file in models/)."""

    model_type: str
    title: str
    """How messages and docs name it (``Qwen2-VL``)."""
    policy: str
    """The policy class, ``"module:Class"`` (imported when a model of the family is loaded)."""
    tiny: str
    """``"module:function"``: ``function(family, size, seed) -> TinyParts`` builds a random model of the real
    classes offline (:mod:`mmgpg.models.tiny`)."""
    example: str = ""
    """A hub id of the family, for messages and docs."""
    sizes: tuple[str, ...] = ("tiny",)
    """``mmgpg model tiny --size`` choices (``shape_true*``: a released checkpoint's dimensions)."""
    takes_images: bool = True
    takes_videos: bool = False
    """Its policy takes video parts (:mod:`mmgpg.models.qwen_vl`: the Qwen-VL line); the vLLM engine then accepts
    ``rollout.vllm_max_videos`` per prompt, and every other family none."""
    takes_tools: bool = False
    """Its policy continues multi-turn episodes with observation images between turns (``encode_observation``: the
    Qwen-VL line), so tasks with tools run on it."""
    vision_module: str = "model.visual"
    """The vision tower's attribute path from the model (``train.freeze_vision``, parameter counts); "" text-only."""
    packing: bool = False
    """``completion_logprobs(packed=True)`` is exact (``model.packed_sequences``): rows concatenated with restarting
    positions keep apart (attention-only text models; not M-RoPE or linear-attention layers, which carry state)."""
    packing_note: str = ""
    """When ``packing`` is False: why (the refusal of ``model.packed_sequences=always`` says it)."""
    vllm: bool = False
    """The vLLM engine serves it: the CPU build registers the architecture and mmgpg's tests ran it (the post-sync
    log-prob check in tests/integration/test_vllm.py). Off until such a test ran."""
    vllm_note: str = "no test has run it with mmgpg's vLLM engine yet"
    """When ``vllm`` is False: why, and what to use instead."""
    vllm_args: tuple[tuple[str, Any], ...] = ()
    """Arguments of ``vllm.LLM`` this family needs (``(name, value)`` pairs), e.g. Qwen3.5's linear-attention state
    without prefix caching (vLLM's prefix cache for it needs chunked prefill, which mmgpg turns off on CPU)."""
    vllm_cpu_dtypes: tuple[str, ...] = ()
    """The dtypes vLLM's CPU backend runs this family in (empty: any): Qwen3.5's gated-delta-net kernels are
    bfloat16-only there."""
    zero3_init: bool = True
    """Under DeepSpeed ZeRO-3, transformers builds it already partitioned (``deepspeed.zero.Init``). False where that
    loading path cannot load it: it applies none of transformers' weight conversions, and Qwen3-VL-MoE's checkpoints
    store the experts transposed. Such a model loads whole on every rank, and DeepSpeed partitions it at start."""
    zero3_external: tuple[tuple[str, str], ...] = ()
    """Parameters its transformers code reads outside their own module's forward, as ``(module, parameter)`` pairs:
    a module-name pattern (``re.fullmatch`` on the name's tail) and the path of the parameter below it. Under ZeRO-3
    DeepSpeed gathers a parameter only while its module runs, so it registers each as an external parameter of the
    module that reads it (``deepspeed.zero.register_external_parameter``): Qwen3.5's linear attention reads its
    convolution's weight directly."""
    pixel_bounds: bool = False
    """Its processor resizes images within ``model.min_pixels`` / ``model.max_pixels`` (the Qwen-VL line); other
    families resize to their processor's own sizes."""
    suppressed_tokens: tuple[str, ...] = ()
    """Tokens never sampled and left out of the scored softmax (the generic policy; Qwen-VL's are its vision
    tokens): the image placeholders the forward counts and their delimiters."""
    token_types_kwarg: str = ""
    """The forward's keyword for the image-token types (``PromptBatch.mm_token_type_ids``), when it takes them:
    Gemma 3's ``token_type_ids`` (bidirectional attention inside each image); "" when it takes none."""
    prompt_counts: tuple[str, ...] = ()
    """Processor keys holding one count per prompt that the forward needs for every prompt of a batch (0 for a prompt
    without images): LLaVA-OneVision's ``batch_num_images``."""
    raw_image_text: str = ""
    """What a raw prompt (``{"role": "raw", ...}``) writes for an image: the placeholder the processor expands."""
    box_format: str | None = None
    """How its grounding answers write a box: ``norm1000`` (0-1000 of the image's width and height) or
    ``resized_pixels`` (pixels of the image as resized by its processor); None: no documented convention."""
    lora_vision: str = ""
    """``re.fullmatch`` pattern of the vision tower's linear layers (``model.lora.vision``); "" when it has none."""
    lora_merger: str = ""
    """Pattern of the vision-language merger's linear layers (``model.lora.merger``)."""
    planned_layers: bool = False
    """The planner's decoder-layer formula (:func:`mmgpg.backends.memory.layer_activation_bytes_per_token`, measured
    on Qwen2's and Qwen3's dense layers) holds for its language layers. False: ``mmgpg plan`` refuses it rather than
    guess (measured on tiny models: a Qwen3 MoE layer saves about 50 % more per token than the dense formula says; a
    Qwen3.5 linear-attention layer 2.6 times as much)."""
    qk_norm: bool = False
    """Its attention normalises each query and key head (Qwen3's q_norm / k_norm): the planner counts what those
    norms save."""
    vision_block_bytes: tuple[tuple[int, int, int], tuple[int, int, int]] | None = None
    """The planner's bytes a vision block saves for backward per patch, ``a·D + b·M + c`` with D its width and M its
    MLP width, as ``((a, b, c) fp32, (a, b, c) bf16)``, measured (tests/unit/backends/test_memory.py); None: the
    planner does not model this tower."""


    def vllm_refusal(self) -> str:
        """Why the vLLM engine refuses this family, naming the families it serves ("" when it serves this one)."""
        if self.vllm:
            return ""
        served = ", ".join(name for name in FAMILIES if FAMILIES[name].vllm)
        return (f"The vLLM engine does not serve {self.title} ({self.model_type}) models: {self.vllm_note}. It serves "
                f"{served}.")


# The families mmgpg loads, by `model_type`: the one list, read by loading, the tiny builder, `mmgpg model tiny
# --family`, the planner, the vLLM engine and the tasks. Each entry names a Family defined in its family file.
FAMILIES = Registry("model family", "mmgpg.families", {
    "qwen2_vl": "mmgpg.models.qwen2:QWEN2_VL",
    "qwen2_5_vl": "mmgpg.models.qwen2:QWEN2_5_VL",
    "qwen2": "mmgpg.models.qwen2:QWEN2",
    "qwen3_vl": "mmgpg.models.qwen3:QWEN3_VL",
    "qwen3_vl_moe": "mmgpg.models.qwen3:QWEN3_VL_MOE",
    "qwen3": "mmgpg.models.qwen3:QWEN3",
    "qwen3_5": "mmgpg.models.qwen3:QWEN3_5",
    "qwen3_5_moe": "mmgpg.models.qwen3:QWEN3_5_MOE",
    "qwen3_5_text": "mmgpg.models.qwen3:QWEN3_5_TEXT",
    "gemma3": "mmgpg.models.gemma3:GEMMA3",
    "internvl": "mmgpg.models.internvl:INTERNVL",
    "smolvlm": "mmgpg.models.smolvlm:SMOLVLM",
    "llava_onevision": "mmgpg.models.llava_onevision:LLAVA_ONEVISION",
})


def family(model_type: str | None, what: str = "this model") -> Family:
    """The registered :class:`Family` of a ``model_type``; an unsupported one is a clear error naming it, the
    supported ones and how to add one."""
    if model_type not in FAMILIES:
        raise ValueError(
            f"{what} is a {model_type!r} model; mmgpg supports the model types {', '.join(FAMILIES)}. Another family "
            "is one registration: a mmgpg.models.Family in the mmgpg.families registry (docs/training.md, 'Model "
            "families')." + ("" if model_type else " (its config.json names no model_type)"))
    return FAMILIES[model_type]


# model.name_or_path=tiny (or tiny:<family>) builds a random tiny model offline (mmgpg.models.tiny)
TINY_PREFIX = "tiny"


def declared_model_type(name_or_path: str) -> str | None:
    """The ``model_type`` a model reference declares without loading anything: the family of ``tiny`` /
    ``tiny:<family>``, or a local folder's ``config.json``; None for a hub id or an unreadable folder (loading says
    what is wrong then)."""
    if name_or_path == TINY_PREFIX or name_or_path.startswith(TINY_PREFIX + ":"):
        return name_or_path.partition(":")[2] or "qwen2_vl"
    try:
        config = json.loads((pathlib.Path(name_or_path).expanduser() / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return config.get("model_type") if isinstance(config, dict) else None

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
    spec: Family  # the family's declared facts
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

    supports_packing: bool  # completion_logprobs(packed=True) is exact (model.packed_sequences): the family's `packing`

    def completion_logprobs(self, rollout: CompletionBatch, *, chunk_size: int = 1024, temperature: float = 1.0,
                            encode_images_once: bool = True, packed: bool = False) -> torch.Tensor: ...

    def gather_prompts(self, rows: Sequence[tuple[PromptBatch, int]]) -> PromptBatch:
        """One batch of prompt ``p`` of each ``(batch, p)`` (the update's micro-batches reuse the rollout's encoding)."""
        ...
