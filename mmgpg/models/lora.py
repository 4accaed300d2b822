"""LoRA adapters (PEFT) on a policy: attach, switch off, merge, save and load.

``model.lora.rank > 0`` freezes the model and injects PEFT LoRA layers into it *in place*: ``policy.model`` stays the
Hugging Face model (so every policy operation — generate, the chunked log-probs, the vision-once-per-group path —
runs unchanged) and ``policy.peft`` holds the :class:`peft.PeftModel` that owns the adapter.

* :func:`attach` — a fresh adapter (B = 0, so the adapted model starts exactly at the base model) or one saved by
  :func:`save_adapter` (resume), checked against ``model.lora`` first (:func:`load_adapter`).
* :func:`adapter_disabled` — the base model without a second copy: GRPO's reference policy.
* :func:`output_head` — the ``(weight, bias)`` the forward really uses for the logits, read through PEFT's wrappers
  (a trained ``lm_head`` copy in ``trainable_modules`` is a ``ModulesToSaveWrapper``; reading the wrong one silently
  scores with the frozen head).
* :func:`merged_state_dict` — the model's state dict with every adapter merged, ``W + (alpha/r) B A``, under the base
  model's own key names: what ``policy/`` saves and what a rollout engine with its own weights (vLLM) must load after
  each update (vLLM's LoRA does not cover the vision tower).
"""

from __future__ import annotations

import contextlib
import json
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

# The language model's linear layers in a Qwen2 / Qwen2-VL / Qwen2.5-VL decoder layer (model.lora.target_modules
# default): under model.language_model.layers.N in the vision-language models, model.layers.N in a text one.
LORA_LANGUAGE_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ADAPTER_DIR = "adapter"  # a checkpoint's PEFT adapter folder, beside policy/ (the merged model)

def target_regex(lora_cfg, spec=None) -> str:
    """The PEFT ``target_modules`` regex (``re.fullmatch`` on full module names) of ``model.lora``: the named linear
    layers of the language model's decoder layers (``model.language_model.layers.N`` in the vision-language models,
    ``model.layers.N`` in a text-only one), plus, when opted in, the vision blocks and the merger as the family
    declares them (``spec``: its :class:`~mmgpg.models.Family`; ``lora_vision`` / ``lora_merger``). A mixture of
    experts' experts are fused 3-D parameters in transformers, not linear layers: no name matches them, so they
    get no adapter (attention and dense MLP layers do).

    >>> from mmgpg.config import LoraConfig
    >>> bool(re.fullmatch(target_regex(LoraConfig(rank=4)), "model.language_model.layers.3.self_attn.q_proj"))
    True
    >>> bool(re.fullmatch(target_regex(LoraConfig(rank=4)), "model.layers.3.mlp.down_proj"))
    True
    >>> bool(re.fullmatch(target_regex(LoraConfig(rank=4)), "model.visual.blocks.0.attn.qkv"))
    False
    """
    parts = []
    if lora_cfg.target_modules:
        names = "|".join(re.escape(n) for n in lora_cfg.target_modules)
        parts.append(rf"model\.(?:language_model\.|text_model\.)?layers\.\d+\.(?:[\w.]+\.)?(?:{names})")
    for wanted, pattern, what in ((lora_cfg.vision, getattr(spec, "lora_vision", ""), "vision"),
                                  (lora_cfg.merger, getattr(spec, "lora_merger", ""), "merger")):
        if wanted and not pattern:
            title = getattr(spec, "title", "this")
            raise ValueError(f"model.lora.{what}=true: the {title} family declares no {what} layers to adapt. Set "
                             f"model.lora.{what}=false.")
        if wanted:
            parts.append(pattern)
    return "|".join(f"(?:{p})" for p in parts)


def check_lora(cfg) -> list:
    """Problems with ``model.lora`` (config values only; module names are checked against the model in :func:`attach`)."""
    from mmgpg.typed import Problem

    lc, p = cfg.model.lora, []
    if lc.rank < 0:
        p.append(Problem("model.lora.rank", lc.rank, "A rank is >= 0 (0: no adapter, full fine-tuning).",
                         "set model.lora.rank=0, or 8, 16, 64 for LoRA."))
    if lc.rank <= 0:
        return p
    if lc.alpha <= 0:
        p.append(Problem("model.lora.alpha", lc.alpha, "The adapter scale alpha/rank must be > 0.",
                         "set model.lora.alpha=32 (or 2 x rank)."))
    if not 0 <= lc.dropout < 1:
        p.append(Problem("model.lora.dropout", lc.dropout, "Dropout is a probability in [0, 1).",
                         "set model.lora.dropout=0 (exactly on-policy) or 0.05."))
    bad = [n for n in lc.target_modules if n not in LORA_LANGUAGE_TARGETS]
    if bad:
        p.append(Problem("model.lora.target_modules", lc.target_modules,
                         f"{bad} are not linear layers of a Qwen2 / Qwen2-VL decoder layer (the output head is "
                         "trained in full through model.lora.trainable_modules, never adapted).",
                         "use names from: " + ", ".join(LORA_LANGUAGE_TARGETS) + "."))
    if not (lc.target_modules or lc.vision or lc.merger):
        p.append(Problem("model.lora.target_modules", lc.target_modules, "No layer would get an adapter.",
                         "list language-model layers (e.g. [q_proj,v_proj]) or set model.lora.vision=true."))
    if lc.vision and cfg.train.freeze_vision:
        p.append(Problem("model.lora.vision", True, "train.freeze_vision=true freezes the vision tower, its adapters "
                         "included.", "set model.lora.vision=false or train.freeze_vision=false."))
    return p


# --------------------------------------------------------------------------------------------------------------------
# Attaching and switching
# --------------------------------------------------------------------------------------------------------------------


def resolve_trainable(model: torch.nn.Module, names: list[str]) -> list[str]:
    """Each ``trainable_modules`` entry as PEFT's ``modules_to_save`` key; a name matching no module is an error."""
    modules = [n for n, _ in model.named_modules() if n]
    out = []
    for name in names:
        if not any(m == name or m.endswith("." + name) for m in modules):
            from mmgpg.typed import did_you_mean

            leaves = sorted({m.rsplit(".", 1)[-1] for m in modules if not m.rsplit(".", 1)[-1].isdigit()})
            raise ValueError(f"model.lora.trainable_modules: no module of the model is named {name!r}."
                             + did_you_mean(name.rsplit(".", 1)[-1], leaves)
                             + " Use a module name such as lm_head, embed_tokens or merger.")
        out.append(name)
    return out


def attach(policy, lora_cfg, adapter_dir: str | Path | None = None) -> None:
    """Freeze ``policy.model`` and inject LoRA layers in place: a fresh adapter (A random, B = 0: the adapted model
    equals the base model) or, with ``adapter_dir``, the adapter saved there (resume), which must match ``lora_cfg``
    (:func:`load_adapter`): the adapter is always built from ``model.lora``, and the saved one only fills it."""
    if getattr(policy, "peft", None) is not None:
        raise ValueError("this policy already has a LoRA adapter")
    if (lora_cfg.vision or lora_cfg.merger) and policy.vision_tower is None:
        raise ValueError(f"model.lora.vision={lora_cfg.vision}, model.lora.merger={lora_cfg.merger}: the "
                         f"{policy.family} model is text-only, with no vision tower or merger to adapt. Set "
                         "model.lora.vision=false and model.lora.merger=false.")
    model = policy.model
    names = [n for n, _ in model.named_modules()]
    for wanted, pattern, what in ((lora_cfg.vision, policy.spec.lora_vision, "vision"),
                                  (lora_cfg.merger, policy.spec.lora_merger, "merger")):
        if wanted and pattern and not any(re.fullmatch(pattern, n) for n in names):
            raise ValueError(f"model.lora.{what}=true: no layer of this {policy.spec.title} model matches its family's "
                             f"{what} layers ({pattern}); the family's Family.lora_{what} needs fixing")
    with warnings.catch_warnings():  # PEFT asks transformers 5.2x a deprecated `is_gradient_checkpointing`
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        peft_model = _inject(model, lora_cfg)
    if peft_model.base_model.model is not model:  # the policy operations rely on in-place injection
        raise RuntimeError("PEFT did not inject the adapter in place")
    if adapter_dir is not None:
        load_adapter(peft_model, lora_cfg, Path(adapter_dir))
    policy.peft = peft_model
    # scoring reads the head through PEFT's wrappers from now on (the trained copy, or the original while disabled)
    policy.output_layer = lambda: (output_module(model), lambda: output_head(model))


def _peft_config(model, lora_cfg):
    """The PEFT ``LoraConfig`` of ``model.lora`` (the one place it is built)."""
    from peft import LoraConfig

    trainable = resolve_trainable(model, list(lora_cfg.trainable_modules))
    if "lm_head" in [t.rsplit(".", 1)[-1] for t in trainable] and model.config.get_text_config().tie_word_embeddings:
        raise ValueError("model.lora.trainable_modules: lm_head is tied to embed_tokens in this model "
                         "(tie_word_embeddings); a separately trained head cannot be saved as this model. Train "
                         "embed_tokens instead (it is the head too), or leave both frozen.")
    return LoraConfig(r=lora_cfg.rank, lora_alpha=lora_cfg.alpha, lora_dropout=lora_cfg.dropout,
                      target_modules=target_regex(lora_cfg, _spec(model)), modules_to_save=trainable or None,
                      bias="none")


def _spec(model):
    """The :class:`~mmgpg.models.Family` of ``model`` (by its config's ``model_type``)."""
    from mmgpg.models import family

    return family(getattr(model.config, "model_type", None))


def _inject(model, lora_cfg):
    from peft import get_peft_model

    try:
        return get_peft_model(model, _peft_config(model, lora_cfg))
    except ValueError as err:
        if "not found in the base model" in str(err) or "Target modules" in str(err):
            raise ValueError(f"model.lora: no layer of {model.config.model_type} matches the targets "
                             f"{lora_cfg.target_modules} (vision={lora_cfg.vision}, merger={lora_cfg.merger}): "
                             f"{str(err)[:200]}") from None
        raise


# adapter_config.json fields that change what a saved adapter computes -> the model.lora keys that set them (the
# others are PEFT features mmgpg never turns on: they must keep PEFT's defaults). lora_dropout is not among them: it is
# not part of the trained weights, and model.lora.dropout applies.
_ADAPTER_FIELDS = {
    "peft_type": "", "r": "model.lora.rank", "lora_alpha": "model.lora.alpha",
    "target_modules": "model.lora.target_modules, model.lora.vision and model.lora.merger",
    "modules_to_save": "model.lora.trainable_modules", "bias": "", "use_rslora": "", "use_dora": "", "lora_bias": "",
    "rank_pattern": "", "alpha_pattern": "", "layers_to_transform": "", "layers_pattern": "", "fan_in_fan_out": "",
    "exclude_modules": "", "layer_replication": "", "target_parameters": "", "trainable_token_indices": "",
}


def load_adapter(peft_model, lora_cfg, adapter_dir: Path) -> None:
    """Fill the adapter that ``model.lora`` built with the one saved in ``adapter_dir``, after checking that they are
    the same adapter: ``adapter_config.json`` agrees with ``model.lora`` (rank, alpha, targets, trained modules; PEFT
    options mmgpg never sets at their defaults) and ``adapter_model.safetensors`` holds exactly the tensors, names and
    shapes, that the adapter has. A mismatch is an error naming each difference: loading it anyway would train a
    fresh adapter under the checkpoint's name (renamed tensors) or scale the trained one wrongly (a changed alpha)."""
    from peft import get_peft_model_state_dict, set_peft_model_state_dict
    from safetensors.torch import load_file

    where = f"{adapter_dir.parent.name}/{adapter_dir.name}" if adapter_dir.parent.name else adapter_dir.name
    try:
        saved = json.loads((adapter_dir / "adapter_config.json").read_text(encoding="utf-8"))
        if not isinstance(saved, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as err:
        raise ValueError(f"{where}/adapter_config.json is unreadable ({err})") from None
    wanted = peft_model.peft_config["default"].to_dict()
    differences = []
    for key, setting in _ADAPTER_FIELDS.items():
        have, want = _plain(saved.get(key, wanted.get(key))), _plain(wanted.get(key))
        if have != want:
            differences.append(f"{key} is {have!r} in the adapter, {want!r} from "
                               + (setting if setting else "mmgpg (which never changes it)"))
    weights = load_file(adapter_dir / "adapter_model.safetensors")
    expected = get_peft_model_state_dict(peft_model, save_embedding_layers=False)
    missing, unexpected = sorted(set(expected) - set(weights)), sorted(set(weights) - set(expected))
    if missing:
        differences.append(f"{len(missing)} adapter tensor(s) missing from adapter_model.safetensors ({_some(missing)})")
    if unexpected:
        differences.append(f"{len(unexpected)} tensor(s) in adapter_model.safetensors that the adapter does not have "
                           f"({_some(unexpected)})")
    shapes = [f"{k} {tuple(weights[k].shape)} vs {tuple(expected[k].shape)}" for k in sorted(set(weights) & set(expected))
              if weights[k].shape != expected[k].shape]
    if shapes:
        differences.append(f"{len(shapes)} tensor(s) of another shape ({_some(shapes)})")
    if differences:
        raise ValueError(f"{where} does not match model.lora, so it is not the adapter this configuration trains: "
                         + "; ".join(differences) + ". Resume with the model.lora settings the checkpoint was trained "
                         "with (its config.yaml); if the adapter itself was edited or damaged, restore it, or move "
                         "the checkpoint out of checkpoints/ to resume from the one before it.")
    result = set_peft_model_state_dict(peft_model, weights)
    if getattr(result, "unexpected_keys", None):
        raise RuntimeError(f"PEFT did not place adapter tensors {_some(sorted(result.unexpected_keys))}")


def _plain(value: Any) -> Any:
    """adapter_config.json values compared as JSON reads them (sets and tuples as sorted lists)."""
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if isinstance(value, tuple):
        return list(value)
    return value


def _some(items: list[str]) -> str:
    return ", ".join(items[:3]) + (f" and {len(items) - 3} more" if len(items) > 3 else "")


def is_lora(policy) -> bool:
    return getattr(policy, "peft", None) is not None


@contextlib.contextmanager
def adapter_disabled(policy) -> Iterator[None]:
    """Inside: the policy computes exactly as its base model (every adapter and trained copy bypassed); GRPO's
    reference without a second model in memory. The adapter's ``requires_grad`` flags are restored afterwards."""
    if not is_lora(policy):
        yield
        return
    with policy.peft.disable_adapter():
        yield


def output_head(model: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(weight, bias)`` of the layer that really computes ``model``'s logits, through PEFT's wrappers.

    A plain ``nn.Linear`` head is itself. A ``ModulesToSaveWrapper`` (``lm_head`` trained in full) is its active
    trained copy, or the original head while adapters are disabled. A LoRA layer on the head (not offered by
    ``model.lora``, but an adapter loaded from elsewhere may have one) is ``W + sum of active deltas``.
    """
    from peft.tuners.lora import LoraLayer

    head = output_module(model)
    if isinstance(head, LoraLayer):
        base = head.get_base_layer()
        weight = base.weight
        if not head.disable_adapters and not head.merged:
            for name in head.active_adapters:
                if name in head.lora_A:
                    weight = weight + head.get_delta_weight(name).to(weight.dtype)
        return weight, base.bias
    return head.weight, head.bias


def output_module(model: torch.nn.Module) -> torch.nn.Module:
    """The module that holds the weights :func:`output_head` reads: the output embedding itself, or through a
    ``ModulesToSaveWrapper`` its active trained copy (the original while adapters are disabled). Scoring runs as
    this module's forward (:func:`mmgpg.models.base.call_through`), so that DeepSpeed ZeRO-3 gathers exactly these
    weights for it (the wrapper holds no parameter of its own, and ZeRO-3 gathers a module's own parameters only)."""
    from peft.utils.other import ModulesToSaveWrapper

    head = model.get_output_embeddings()
    if isinstance(head, ModulesToSaveWrapper):
        active = head.active_adapters
        if head.disable_adapters or not active or active[0] not in head.modules_to_save:
            return head.original_module
        return head.modules_to_save[active[0]]
    return head


# --------------------------------------------------------------------------------------------------------------------
# Merging and saving
# --------------------------------------------------------------------------------------------------------------------


def merge_units(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """The modules of ``model`` whose tensors are renamed or combined by merging, by name: every LoRA layer and
    every fully trained copy (``ModulesToSaveWrapper``), outermost only (a unit inside another is the outer's)."""
    from peft.tuners.lora import LoraLayer
    from peft.utils.other import ModulesToSaveWrapper

    units: dict[str, torch.nn.Module] = {}
    for name, module in model.named_modules():
        if isinstance(module, (LoraLayer, ModulesToSaveWrapper)) and _owner(name, units) is None:
            units[name] = module
    return units


def merged_unit(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The tensors of one merge unit (:func:`merge_units`) under the base model's names relative to it, detached.

    A LoRA layer: ``weight = base_layer.weight + sum over active adapters of (alpha/r) B A`` (PEFT's
    ``get_delta_weight``; the base weight alone while adapters are disabled or already merged), ``bias =
    base_layer.bias``, and the base layer's other tensors as they are. A ``ModulesToSaveWrapper``: the active
    trained copy's state dict (the frozen original while adapters are disabled). The unit's parameters must be whole
    for the call (under DeepSpeed ZeRO-3: inside a gather of ``module.parameters()``)."""
    import torch
    from peft.tuners.lora import LoraLayer

    if isinstance(module, LoraLayer):
        out = dict(module.get_base_layer().state_dict())
        if not module.disable_adapters and not module.merged:
            weight = out["weight"]
            with torch.no_grad():
                for adapter in module.active_adapters:
                    if adapter in module.lora_A or adapter in getattr(module, "lora_embedding_A", {}):
                        weight = weight + module.get_delta_weight(adapter).to(weight.dtype)
            out["weight"] = weight
        return {k: v.detach() for k, v in out.items()}
    active = module.active_adapters
    if module.disable_adapters or not active or active[0] not in module.modules_to_save:
        source = module.original_module
    else:
        source = module.modules_to_save[active[0]]
    return {k: v.detach() for k, v in source.state_dict().items()}


def merged_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The state dict of ``model`` with its active adapters merged, under the base model's key names.

    For a LoRA layer ``m``: ``m.weight = m.base_layer.weight + (alpha/r) B A`` (PEFT's ``get_delta_weight``) and
    ``m.bias = m.base_layer.bias``; its ``lora_*`` tensors are dropped. For a fully trained module ``m``
    (``ModulesToSaveWrapper``): ``m.X = m.modules_to_save.<active>.X``; the frozen original is dropped. A model
    without adapters gives its own ``state_dict()``. The weight-sync hook for rollout engines with their own weights:
    call it after each optimizer step (no gradients; tensors detached). Each unit is :func:`merged_unit` (which the
    DeepSpeed backend also calls per gathered unit under ZeRO-3).
    """
    state = model.state_dict()
    units = merge_units(model)
    if not units:
        return state
    out: dict[str, torch.Tensor] = {}
    merged = set()
    for key, value in state.items():
        owner = _owner(key, units)
        if owner is None:
            out[key] = value
        elif owner not in merged:  # the unit's tensors where its first key was (the state dict's order kept)
            merged.add(owner)
            out.update((f"{owner}.{k}", v) for k, v in merged_unit(units[owner]).items())
    return out


def _owner(key: str, modules: dict[str, Any]) -> str | None:
    """The longest module name in ``modules`` that ``key`` lies under."""
    parts = key.split(".")
    for i in range(len(parts) - 1, 0, -1):
        prefix = ".".join(parts[:i])
        if prefix in modules:
            return prefix
    return None


def save_adapter(policy, directory: str | Path, trainable: dict[str, torch.Tensor] | None = None) -> None:
    """The adapter (and fully trained modules) in PEFT's format: ``adapter_config.json`` + ``adapter_model.safetensors``
    (``PeftModel.from_pretrained(base, directory)`` loads it). ``trainable``: the adapter's tensors by the
    ``PeftModel``'s parameter names, gathered, when the model's own are partitioned (DeepSpeed ZeRO-3)."""
    kwargs = {} if trainable is None else {"state_dict": trainable}
    policy.peft.save_pretrained(str(directory), save_embedding_layers=False, **kwargs)


def trainable_summary(model: torch.nn.Module) -> dict[str, int]:
    """``{"trainable": n, "total": n}`` parameter counts (LoRA: adapters and trained copies vs everything)."""
    total = trainable = 0
    for p in model.parameters():
        total += p.numel()
        trainable += p.numel() if p.requires_grad else 0
    return {"trainable": trainable, "total": total}


def count_parameters(model, lora_cfg) -> dict[str, int | bool]:
    """What ``model.lora`` would train on ``model`` (a meta-device model is enough; nothing is injected):
    ``adapter`` = sum of ``rank x (in + out)`` over the targeted ``nn.Linear`` layers, ``full`` = the parameters of
    ``trainable_modules`` (trained copies), ``vision`` = whether gradients reach the vision tower, ``head`` = whether
    the output head is trained.

    >>> import torch
    >>> from mmgpg.config import LoraConfig
    >>> m = torch.nn.Module(); m.model = torch.nn.Module(); m.model.language_model = torch.nn.Module()
    >>> m.model.language_model.layers = torch.nn.ModuleList([torch.nn.Module()])
    >>> m.model.language_model.layers[0].q_proj = torch.nn.Linear(8, 4)
    >>> count_parameters(m, LoraConfig(rank=2, target_modules=["q_proj"]))["adapter"]  # 2 x (8 + 4)
    24
    """
    import torch

    spec = _spec(model) if hasattr(model, "config") else None
    pattern = re.compile(target_regex(lora_cfg, spec))
    tower = f"{spec.vision_module}." if spec is not None and spec.vision_module else None
    adapter, vision, full, head = 0, False, 0, False
    names = {n: m for n, m in model.named_modules() if n}
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    for name, module in names.items():
        if isinstance(module, torch.nn.Linear) and pattern.fullmatch(name):
            adapter += lora_cfg.rank * (module.in_features + module.out_features)
            vision = vision or (tower is not None and f"{name}.".startswith(tower))
    for wanted in lora_cfg.trainable_modules:
        for name, module in names.items():
            if name == wanted or name.endswith("." + wanted):
                full += sum(p.numel() for p in module.parameters())
                vision = vision or (tower is not None and f"{name}.".startswith(tower))
                head = head or module is output
    return {"adapter": adapter, "full": full, "vision": vision, "head": head}
