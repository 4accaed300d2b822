"""What the planner (:mod:`mmgpg.backends.memory`) needs to know of a model: :class:`ModelShape`, read from its
``config.json`` and counted on the meta device (no weights are read) by :func:`model_shape`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelShape:
    """What the planner needs from a model: counts from the meta model, sizes from its config."""

    family: str  # the model_type (a registered mmgpg.models.Family)
    params: int  # tied weights once
    vision_params: int  # a text-only model: 0, and every vision_* / patch field below is 0
    largest_layer_params: int  # DeepSpeed's definition: most parameters owned directly by one module
    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vision_depth: int
    vision_hidden: int
    vision_intermediate: int
    patch_size: int
    temporal_patch_size: int
    lora_rank: int = 0  # model.lora.rank the LoRA counts below were made for (0: full fine-tuning)
    lora_params: int = 0  # adapter parameters plus trained copies of model.lora.trainable_modules
    lora_vision: bool = False  # gradients reach the vision tower (adapters or trained modules there)
    lora_head: bool = False  # the output head is trained (trainable_modules)

    @property
    def has_vision(self) -> bool:
        """False for a text-only model: the plan then has no vision terms (activations, images, patches)."""
        return self.vision_depth > 0


# The ModelShape fields that describe the vision tower (left out of a text-only model's plan).
VISION_FIELDS = ("vision_params", "vision_depth", "vision_hidden", "vision_intermediate", "patch_size",
                 "temporal_patch_size", "lora_vision")


def model_shape(path: str, lora=None) -> ModelShape:
    """Read ``config.json`` of a model directory (or hub id, when the hub is reachable) and count parameters on the
    meta device; with ``lora`` (a :class:`mmgpg.config.LoraConfig` of rank > 0) also what it trains."""
    import torch

    from mmgpg.models.load import (
        auto_model_class,
        check_model_source,
        no_remote_code,
        read_model_config,
        resolve_model_path,
    )
    from mmgpg.models.tiny import count_parameters

    hint = ("The planner needs only its config.json: pass a local directory as model.name_or_path=DIR (a downloaded "
            "checkpoint, or the real dimensions without weights: mmgpg model tiny --size shape_true --config-only "
            "--out DIR).")
    path = resolve_model_path(path)
    try:  # a local path that is no model folder says so, not the hub's rule
        check_model_source(path, need_weights=False)
        config = read_model_config(path)
    except FileNotFoundError as err:
        raise ValueError(f"{str(err).rstrip('.')}. {hint}") from None
    except OSError as err:
        raise ValueError(f"could not read the config of model {path!r} ({str(err).splitlines()[0]}). {hint}") from None
    auto = auto_model_class(config.model_type, repr(path))  # an unsupported model_type is a clear error here
    with torch.device("meta"):
        model = no_remote_code(auto.from_config, config)
    counts = count_parameters(model)
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    text, vision = config.get_text_config(), getattr(config, "vision_config", None)
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    if vision is None:  # a text-only model: no vision terms
        if lora is not None and lora.rank > 0 and (lora.vision or lora.merger):
            raise ValueError(f"model.lora.vision/merger: {path!r} is a text-only {config.model_type} model, with no "
                             "vision tower or merger to adapt")
        v_depth = v_hidden = v_inter = patch = t_patch = 0
    else:
        v_depth, v_hidden, v_inter, patch, t_patch = vision_dims(vision)
    return ModelShape(config.model_type, counts["total"], counts["vision"], largest, text.vocab_size, text.hidden_size,
                      active_intermediate(text), text.num_hidden_layers, text.num_attention_heads,
                      text.num_key_value_heads, head_dim, v_depth, v_hidden, v_inter, patch, t_patch,
                      *_lora_counts(model, lora))


def vision_dims(vision) -> tuple[int, int, int, int, int]:
    """``(depth, width, MLP width, patch size, temporal patch size)`` of a vision tower's config, whatever the family
    calls them: Qwen's towers name their depth ``depth`` (Qwen2-VL its width ``embed_dim``: its ``hidden_size`` is the
    LLM's), SigLIP and InternViT ``num_hidden_layers``; a patch size may be ``[height, width]``; a tower without
    temporal patches has 1."""
    depth = getattr(vision, "depth", None) or vision.num_hidden_layers
    patch = vision.patch_size[0] if isinstance(vision.patch_size, (list, tuple)) else vision.patch_size
    if hasattr(vision, "embed_dim"):
        width, mlp = vision.embed_dim, int(vision.embed_dim * vision.mlp_ratio)
    else:
        width, mlp = vision.hidden_size, vision.intermediate_size
    return depth, width, mlp, patch, getattr(vision, "temporal_patch_size", 1)


def active_intermediate(text) -> int:
    """The MLP width one token goes through: the dense ``intermediate_size``, or in a mixture of experts the routed
    experts' (``num_experts_per_tok x moe_intermediate_size``) plus a shared expert's. Every expert's parameters are
    counted in the parameter terms (the meta model's own count); this width is what a token's activations see."""
    experts = getattr(text, "num_experts", None)
    if not experts:
        return text.intermediate_size
    shared = getattr(text, "shared_expert_intermediate_size", None) or 0
    return text.num_experts_per_tok * text.moe_intermediate_size + shared


def _lora_counts(model, lora) -> tuple[int, int, bool, bool]:
    if lora is None or lora.rank <= 0:
        return 0, 0, False, False
    from mmgpg.models.lora import count_parameters as count_lora

    c = count_lora(model, lora)
    return lora.rank, c["adapter"] + c["full"], c["vision"], c["head"]
