"""Loading a policy: hub ids, local directories and the offline ``tiny`` models (built once, cached), dtypes and
the default device. The one place ``from_pretrained`` is called for the policy. A model folder's own code never runs:
every ``from_pretrained`` passes ``trust_remote_code=False`` (:func:`no_remote_code`), so a folder whose
``config.json`` maps the Auto classes to its own Python files (``auto_map``) is refused with a message instead of
transformers asking on stdin whether to run it."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

import torch

from mmgpg.models import DTYPES, FAMILIES, TINY_PREFIX, Policy, family


def cache_dir() -> Path:
    """Where mmgpg keeps models it builds itself (``$MMGPG_CACHE`` or ``~/.cache/mmgpg``)."""
    return Path(os.environ.get("MMGPG_CACHE", Path.home() / ".cache" / "mmgpg"))


def resolve_model_path(name_or_path: str) -> str:
    """Map ``tiny`` / ``tiny:<family>`` (``tiny:qwen2_5_vl``, ``tiny:qwen3_vl``, ``tiny:qwen2``: any registered family)
    to an offline-built model directory (built once, then cached).

    Any other value is returned unchanged: a local directory or a Hugging Face hub id.
    """
    if name_or_path != TINY_PREFIX and not name_or_path.startswith(TINY_PREFIX + ":"):
        return name_or_path
    family = name_or_path.partition(":")[2] or "qwen2_vl"
    if family not in FAMILIES:
        raise ValueError(f"unknown tiny model family {family!r}; use one of: tiny, " + ", ".join(f"tiny:{f}" for f in FAMILIES))
    target = cache_dir() / f"tiny-{family}-seed0-{_builder_fingerprint(family)}"
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        # Only rank 0 builds (transformers' save_pretrained writes weights on rank 0 only); the others wait for it.
        if dist.get_rank() == 0:
            _build_tiny(target, family)
        dist.barrier()
    else:
        _build_tiny(target, family)
    return str(target)


@contextlib.contextmanager
def _zero3_construction_off():
    """Suspend transformers' ZeRO-3 switch (an ``HfDeepSpeedConfig`` alive, e.g. inside ``DeepSpeedBackend.loading()``)
    for the block. Building a tiny model is rank 0's work alone; under the switch its construction would run
    ``deepspeed.zero.Init``, whose per-parameter broadcast the other ranks never join (a hang). transformers has no
    public getter for the live config object, so its module-level weak reference is saved and restored."""
    try:
        from transformers.integrations import deepspeed as hf_deepspeed
    except ImportError:  # transformers without its DeepSpeed integration: no switch to suspend
        yield
        return
    saved = getattr(hf_deepspeed, "_hf_deepspeed_config_weak_ref", None)
    hf_deepspeed._hf_deepspeed_config_weak_ref = None
    try:
        yield
    finally:
        hf_deepspeed._hf_deepspeed_config_weak_ref = saved


def _builder_fingerprint(family: str) -> str:
    """A digest of the code that builds ``family``'s tiny model (:mod:`mmgpg.models.tiny`, the family's file and the
    shared Qwen templates): a cached model built by other code (another template, other dimensions) is not reused."""
    import hashlib
    import importlib.util

    from mmgpg.models import family as family_spec

    digest = hashlib.sha256()
    for module in ("mmgpg.models.tiny", "mmgpg.models.qwen2", family_spec(family).tiny.partition(":")[0]):
        spec = importlib.util.find_spec(module)
        digest.update(Path(spec.origin).read_bytes() if spec and spec.origin else module.encode())
    return digest.hexdigest()[:12]


def _build_tiny(target: Path, family: str) -> None:
    from mmgpg.models.tiny import build_and_save

    if not (target / "model.safetensors").exists():
        import tempfile

        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
        with _zero3_construction_off():
            build_and_save(tmp, family=family)
        try:
            tmp.rename(target)
        except OSError:  # built concurrently by another process: keep theirs
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)


def policy_class(model_type: str | None, what: str = "this") -> type:
    """The policy class of a checkpoint's ``model_type`` (its :class:`~mmgpg.models.Family` in
    :data:`mmgpg.models.FAMILIES`); a clear error for any other. ``what`` names the model in the message."""
    from mmgpg.registry import load_target

    return load_target(family(model_type, what).policy)


def auto_model_class(model_type: str | None, what: str = "this"):
    """The transformers auto class that builds a ``model_type`` model (``from_config`` / ``from_pretrained``): its
    policy's ``auto_model`` (``AutoModelForImageTextToText`` for vision-language families, ``AutoModelForCausalLM``
    for text ones)."""
    import transformers

    return getattr(transformers, policy_class(model_type, what).auto_model)


class RemoteCodeRefused(ValueError):
    """A model folder (or hub repository) that can only be loaded by running its own Python code."""


def no_remote_code(load, source: str, *args, **kwargs):
    """``load(source, *args, trust_remote_code=False, **kwargs)`` (a ``from_pretrained`` or ``from_config``): a model
    that needs its own code is :class:`RemoteCodeRefused`, never a prompt and never run."""
    try:
        return load(source, *args, trust_remote_code=False, **kwargs)
    except ValueError as err:
        if "custom code" not in str(err) and "trust_remote_code" not in str(err):
            raise
        raise RemoteCodeRefused(
            f"model {str(source)!r} runs code of its own to load (its config.json maps transformers' Auto classes to "
            "Python files of the model folder: auto_map). mmgpg never runs a model folder's code. Use a model of a "
            f"family that transformers implements itself ({', '.join(FAMILIES)}).") from None


def read_model_config(path: str):
    """``AutoConfig.from_pretrained(path)`` without a model's own code (:func:`no_remote_code`)."""
    from transformers import AutoConfig

    return no_remote_code(AutoConfig.from_pretrained, path)


def resolve_dtype(name: str, device: torch.device | str) -> torch.dtype:
    """``auto`` is bfloat16 on a GPU that supports it and float32 otherwise."""
    if name == "auto":
        dev = torch.device(device)
        if dev.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    if name not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}; got {name!r}")
    return getattr(torch, name)


def default_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return torch.device("cpu")


def resolve_device(name: str) -> torch.device:
    """``auto`` → ``cuda:LOCAL_RANK`` when a GPU exists, else ``cpu``; anything else as torch reads it."""
    if name == "auto":
        return default_device()
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={name!r} but torch sees no CUDA GPU; use device=cpu or device=auto")
    return device


def load_policy(
    name_or_path: str,
    *,
    dtype: str = "auto",
    min_pixels: int = 3136,
    max_pixels: int = 401408,
    attn_implementation: str | None = "sdpa",
    device: torch.device | str | None = None,
    max_prompt_length: int | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
    video_fps: float | None = None,
    video_max_frames: int | None = None,
    video_total_pixels: int | None = None,
) -> Policy:
    """Load a policy from a hub id or a local directory (never ``trust_remote_code``): the class is the one the
    checkpoint's ``model_type`` names in :data:`mmgpg.models.FAMILIES` (the Qwen-VL policy, the text policy, ...).

    ``name_or_path`` may also be ``tiny`` or ``tiny:<family>`` (``tiny:qwen3_vl``, ``tiny:qwen2``) for a model built offline
    (:mod:`mmgpg.models.tiny`). ``device="meta"`` builds the model without reading its weights (for checks that need
    only shapes and the processor, such as ``mmgpg check``). ``min_pixels``/``max_pixels`` apply to models that take
    images only. ``chat_template_kwargs``: extra variables for the chat template in every prompt the policy renders
    (``model.chat_template_kwargs``). ``video_fps`` / ``video_max_frames`` / ``video_total_pixels``: the frame and
    pixel budget of video parts, for a policy that takes videos (the Qwen-VL families; ``model.video_*``).
    """
    import transformers

    path = resolve_model_path(name_or_path)
    local = check_model_source(path)
    try:
        config = read_model_config(path)
    except RemoteCodeRefused:
        raise
    except (OSError, ValueError) as err:
        if local:
            raise ValueError(f"model directory {path!r}: its config.json cannot be used ({str(err)[:300]})") from None
        raise OSError(
            f"could not load model {name_or_path!r}: it is not a local directory and the Hugging Face hub did not "
            f"provide it ({err}). Offline, download it elsewhere and pass the directory, or use model=tiny."
        ) from err
    cls = policy_class(config.model_type, repr(name_or_path))
    auto = getattr(transformers, cls.auto_model)
    device = torch.device(device) if device is not None else default_device()
    kwargs: dict[str, Any] = {"dtype": resolve_dtype(dtype, device)}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    if device.type == "meta":  # shapes only, no weights read (pre-flight checks: prompts and processor)
        with torch.device("meta"):
            model = no_remote_code(auto.from_config, config, **kwargs)
    else:
        from mmgpg.utils import no_transformers_bars, quiet_deepspeed_import

        # no "Loading weights" bar at every load (downloads keep the hub's bars); a family that ZeRO-3's partitioned
        # loading cannot load (Family.zero3_init) loads whole, and DeepSpeed partitions it when it takes the model
        whole = contextlib.nullcontext() if family(config.model_type).zero3_init else _zero3_construction_off()
        with no_transformers_bars(), quiet_deepspeed_import(), whole:
            model, loaded = no_remote_code(auto.from_pretrained, path, output_loading_info=True, **kwargs)
        check_loaded(name_or_path, loaded)
        if zero3_partitioned(model):  # ZeRO-3's partitions are already where DeepSpeed placed them
            keep_used_weight_conversions(model)
        else:
            model = model.to(device)
    processor = no_remote_code(getattr(transformers, cls.auto_processor).from_pretrained, path)
    options = dict(min_pixels=min_pixels, max_pixels=max_pixels) if cls.takes_images else {}
    policy = cls(model, processor, max_prompt_length=max_prompt_length, **options)
    policy.chat_template_kwargs = dict(chat_template_kwargs or {})
    if policy.spec.takes_videos:
        for name, value in (("video_fps", video_fps), ("video_max_frames", video_max_frames),
                            ("video_total_pixels", video_total_pixels)):
            if value is not None:
                setattr(policy, name, value)
    return policy


def zero3_partitioned(model: torch.nn.Module) -> bool:
    """True when the model was built under ``deepspeed.zero.Init`` (its parameters carry DeepSpeed's ``ds_id``)."""
    return any(hasattr(p, "ds_id") for p in model.parameters())


def keep_used_weight_conversions(model: torch.nn.Module) -> None:
    """Keep only the checkpoint-key conversions that loading applied, as ``from_pretrained`` does outside ZeRO-3.

    transformers (5.x) records the conversions that renamed the checkpoint's keys on the model, and ``save_pretrained``
    reverses them to write the original key names. Its ZeRO-3 loading path records the model type's whole list, used
    or not; reversing an unused prefix rule then writes ``model.model.layers...`` for a Qwen2-VL checkpoint's
    ``model.layers...``, a ``policy/`` that no longer loads. Filtering on ``was_used()`` gives the list the ordinary
    path keeps."""
    conversions = getattr(model, "_weight_conversions", None)
    if conversions:
        model._weight_conversions = [c for c in conversions if not hasattr(c, "was_used") or c.was_used()]


def check_loaded(name: str, loaded: dict) -> None:
    """Refuse weights that do not fill the model exactly (``from_pretrained(..., output_loading_info=True)``'s
    report): a parameter missing from the files would stay randomly initialised, and a tensor of the files that no
    parameter takes (a renamed one) would be dropped. Either means the folder was edited or damaged."""
    missing, unexpected = sorted(loaded.get("missing_keys") or ()), sorted(loaded.get("unexpected_keys") or ())
    mismatched = sorted(str(k[0] if isinstance(k, tuple) else k) for k in loaded.get("mismatched_keys") or ())
    errors = [str(e) for e in loaded.get("error_msgs") or ()]
    if not (missing or unexpected or mismatched or errors):
        return

    def some(keys: list[str]) -> str:
        return ", ".join(keys[:3]) + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")

    parts = ([f"{len(missing)} parameter(s) missing from its weights ({some(missing)})"] if missing else []) \
        + ([f"{len(unexpected)} tensor(s) unexpected, no parameter has their name ({some(unexpected)})"]
           if unexpected else []) \
        + ([f"{len(mismatched)} of another shape ({some(mismatched)})"] if mismatched else []) + errors[:2]
    raise ValueError(f"model {name!r}: its weights do not match its config.json: " + "; ".join(parts) + ". Loading "
                     "it would leave those parameters randomly initialised, so mmgpg refuses it: the folder was edited "
                     "or damaged. Restore it from where it came from; a damaged checkpoint can be moved out of "
                     "checkpoints/ to resume from the one before it.")


def load_policy_for(model_cfg, device: torch.device | str, *, source: str | None = None,
                    dtype: str | None = None) -> Policy:
    """:func:`load_policy` with the settings of a :class:`mmgpg.config.ModelConfig` (the one mapping of its fields).

    ``source`` replaces ``model_cfg.name_or_path`` (a checkpoint to evaluate or resume) and ``dtype`` its dtype.
    """
    return load_policy(source or model_cfg.name_or_path, dtype=dtype or model_cfg.dtype, min_pixels=model_cfg.min_pixels,
                       max_pixels=model_cfg.max_pixels, attn_implementation=model_cfg.attn_implementation,
                       device=device, max_prompt_length=model_cfg.max_prompt_length,
                       chat_template_kwargs=model_cfg.chat_template_kwargs, video_fps=model_cfg.video_fps,
                       video_max_frames=model_cfg.video_max_frames, video_total_pixels=model_cfg.video_total_pixels)


def load_for_training(model_cfg, device, dtype: str, checkpoint: Path | None = None, *,
                      policy: Policy | None = None) -> Policy:
    """The policy ``mmgpg train`` / ``mmgpg sft`` train: without LoRA, ``model.name_or_path`` or the checkpoint's
    ``policy/``; with LoRA (``model.lora.rank > 0``), always the base model (exact, never a merged copy) with a fresh
    adapter or the checkpoint's ``adapter/`` (:func:`mmgpg.models.lora.attach`). ``policy``: a base policy already loaded
    by the caller (tests), used instead of loading one."""
    from mmgpg.models.lora import ADAPTER_DIR, attach, is_lora

    if model_cfg.lora.rank <= 0 or (policy is not None and is_lora(policy)):
        return policy or load_policy_for(model_cfg, device, source=str(checkpoint / "policy") if checkpoint else None,
                                         dtype=dtype)
    adapter = None
    if checkpoint is not None:
        adapter = checkpoint / ADAPTER_DIR
        if not (adapter / "adapter_config.json").is_file():
            raise ValueError(f"checkpoint {checkpoint} has no LoRA adapter ({ADAPTER_DIR}/), but model.lora.rank="
                             f"{model_cfg.lora.rank}: it was trained without LoRA. Resume it with model.lora.rank=0.")
    policy = policy or load_policy_for(model_cfg, device, dtype=dtype)
    attach(policy, model_cfg.lora, adapter)
    return policy


def check_model_source(path: str, *, need_weights: bool = True) -> bool:
    """True for a usable local model directory; raise a clear error for a local path that is not one (missing,
    a file, no or unreadable config.json, no weights — unless ``need_weights`` is False: what builds the model on the
    meta device, ``mmgpg model info`` and ``mmgpg plan``, needs only config.json). A name that cannot be a hub id (``a/b/c``, ``./x``, ``/x``,
    ``~/x``, or ``dir/x`` where ``dir`` exists here) is local: a typo is reported at once, not sent to the hub."""
    p = Path(path).expanduser()
    if not p.exists():
        head = path.split("/", 1)[0]
        if path.startswith(("/", ".", "~")) or path.count("/") > 1 or (path.count("/") == 1 and Path(head).is_dir()):
            siblings = sorted(x.name for x in p.parent.iterdir()) if p.parent.is_dir() else []
            from mmgpg.typed import did_you_mean

            raise FileNotFoundError(f"model directory {path!r} does not exist." + did_you_mean(p.name, siblings))
        return False
    if not p.is_dir():
        raise ValueError(f"model {path!r} is a file; give the model's directory (with config.json and weights)")
    try:
        json.loads((p / "config.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"model directory {path!r} has no config.json: it is not a Hugging Face model folder") from None
    except (OSError, ValueError) as err:
        raise ValueError(f"model directory {path!r}: config.json is not valid JSON ({err})") from None
    if need_weights and not any(p.glob("*.safetensors")) and not any(p.glob("*.bin")):
        raise ValueError(f"model directory {path!r} holds no weights (*.safetensors or *.bin); was the download or "
                         "save interrupted?")
    return True
