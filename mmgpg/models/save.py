"""A policy's weights, out of the training process: as a Hugging Face folder (:func:`save_policy`) or as
``(name, tensor)`` pairs for a rollout engine with its own copy (:func:`policy_weights`). LoRA adapters are merged
into their base weights in both (:func:`mmgpg.models.lora.merged_state_dict`), so every reader sees one plain model
under the base model's names."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch

from mmgpg.models.lora import is_lora, merged_state_dict
from mmgpg.utils import no_transformers_bars, quiet_deepspeed_import


def save_policy(policy, directory: str | Path, full_state_dict: dict[str, torch.Tensor] | None = None) -> None:
    """``directory`` as a Hugging Face model folder (plain transformers and vLLM load it): the model with adapters
    merged, and the processor. ``full_state_dict``: the gathered weights when the model's own are partitioned
    (DeepSpeed ZeRO-3; with LoRA already merged, under the base model's names)."""
    directory = Path(directory)
    # no "Writing model shards" bar at every checkpoint; accelerate imports DeepSpeed (when installed) in the save
    with no_transformers_bars(), quiet_deepspeed_import():
        if is_lora(policy) and full_state_dict is None:
            policy.model.save_pretrained(directory, state_dict=merged_state_dict(policy.model))
        else:
            policy.model.save_pretrained(directory, state_dict=full_state_dict)  # None: the model's own
        policy.processor.save_pretrained(directory)


def unique_tensors(named: Iterator[tuple[str, torch.Tensor]] | dict[str, torch.Tensor],
                   dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` pairs with each storage once (tied weights share one: the first name is kept), detached and
    cast to ``dtype`` (None: as they are).

    >>> w = torch.ones(2); list(n for n, _ in unique_tensors({"a": w, "b": w, "c": torch.zeros(1)}))
    ['a', 'c']
    """
    seen: set[int] = set()
    for name, tensor in (named.items() if isinstance(named, dict) else named):
        ptr = tensor.data_ptr()
        if ptr in seen and tensor.numel():
            continue
        seen.add(ptr)
        tensor = tensor.detach()
        yield name, (tensor if dtype is None or tensor.dtype == dtype or not tensor.is_floating_point()
                     else tensor.to(dtype))


def policy_weights(model: torch.nn.Module, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """The full weights of an unpartitioned ``model`` by Hugging Face name, LoRA merged, each storage once, in
    ``dtype``: what a rollout engine with its own copy loads (the plain backend's ``full_weights``, and ``mmgpg
    eval``/``probe`` outside training)."""
    return unique_tensors(merged_state_dict(model), dtype)
