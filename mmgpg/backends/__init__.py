"""The training-backend seam: device placement, mixed precision, optimizer and schedule, backward, the cross-rank
gradient sum, clipping, the step, and the backend's own checkpoint state.

The trainer and ``mmgpg sft`` only talk to a backend through :class:`TrainingBackend`. A backend is chosen by
``train.backend`` from :data:`BACKENDS`; adding one is one file plus one registration (a built-in entry below, or
``BACKENDS.register(name, "module:Class")`` / an ``mmgpg.backends`` entry point from a plugin). A backend class is
built as ``Backend(config)`` with the resolved :class:`mmgpg.config.Config`. The backend's memory model for
``mmgpg plan`` lives beside it (:mod:`mmgpg.backends.memory`).

The backend owns the weights' placement, so it is also where a rollout engine's copy comes from:
:meth:`TrainingBackend.full_weights` (gathered under ZeRO-3, LoRA merged) feeds
:meth:`mmgpg.rollout.engine.RolloutEngine.sync_weights`.

May import: the top-level modules and :mod:`mmgpg.models`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

    from mmgpg.distributed import DistInfo

from mmgpg.backends import deepspeed_config, deepspeed_state
from mmgpg.registry import Entry, Registry

# The backend names: config validation, `mmgpg plan --backend` and `build_backend` all read this registry. What the rest
# of mmgpg asks a backend, without importing it (torch), are its facts:
#   check(train) -> [Problem]        the train.* keys it owns (and those it refuses: DeepSpeed's keys off DeepSpeed)
#   zero_stage(train) -> int, offload(train) -> str   what the memory planner plans for this train section
#   label(stage, offload) -> str     how plans and logs name the setup ("deepspeed ZeRO-3 + optimizer offload")
#   verify_checkpoint(checkpoint, state, world_size)  its own files in a checkpoint, checked before loading
BACKENDS = Registry("training backend", "mmgpg.backends", {
    "plain": Entry("mmgpg.backends.plain:PlainBackend", {"check": deepspeed_config.check}),
    "deepspeed": Entry("mmgpg.backends.deepspeed:DeepSpeedBackend",
                       {"check": deepspeed_config.check, "zero_stage": lambda train: train.zero_stage,
                        "offload": deepspeed_config.planned_offload,
                        "label": deepspeed_config.label,
                        "verify_checkpoint": deepspeed_state.verify_checkpoint}),
})


@dataclass(frozen=True)
class OptimizerSettings:
    """AdamW, its schedule and gradient clipping (from ``train.*`` for RL, ``sft.*`` for SFT)."""

    learning_rate: float
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    max_grad_norm: float = 1.0  # 0: no clipping
    lr_scheduler: str = "constant"
    warmup_steps: int = 0
    total_steps: int = 1  # optimizer-step slots of the whole run (the schedule's length)
    min_lr_rate: float = 0.0  # cosine_with_min_lr: the floor, as a fraction of learning_rate


def build_scheduler(optimizer: torch.optim.Optimizer, settings: OptimizerSettings):
    """The learning-rate schedule of ``settings`` on ``optimizer`` (``transformers.get_scheduler``, the schedules of
    HF ``TrainingArguments.lr_scheduler_type``), as a factor of ``learning_rate`` at optimizer-step slot ``t`` with
    ``W = warmup_steps``, ``T = total_steps``: ``t / W`` while ``t < W``, then

    * ``constant``: 1 (HF's ``constant_with_warmup``: transformers' own ``constant`` would ignore the warmup);
    * ``linear``: ``(T − t) / (T − W)``;
    * ``cosine``: ``½ (1 + cos(π (t − W) / (T − W)))``;
    * ``cosine_with_min_lr``: ``m + (1 − m) · ½ (1 + cos(π (t − W) / (T − W)))`` with ``m = min_lr_rate`` (open-rs:
      0.1), i.e. down to ``m · learning_rate``."""
    from transformers import get_scheduler

    extra = {"min_lr_rate": settings.min_lr_rate} if settings.lr_scheduler == "cosine_with_min_lr" else None
    name = "constant_with_warmup" if settings.lr_scheduler == "constant" else settings.lr_scheduler
    return get_scheduler(name, optimizer, num_warmup_steps=settings.warmup_steps,
                         num_training_steps=settings.total_steps, scheduler_specific_kwargs=extra)


@dataclass(frozen=True)
class StepResult:
    grad_norm: float  # the global norm before clipping
    stepped: bool  # False when the norm was NaN/Inf: gradients dropped, weights unchanged


class TrainingBackend(Protocol):
    device: torch.device
    dist: DistInfo
    params: list[torch.nn.Parameter]  # the trainable parameters (after `prepare`)

    equal_micro_batches: bool  # True: forward/backward hold collectives, so every rank must run as many micro-batches
    resumes_on_any_world_size: bool  # True: a checkpoint written by another rank count loads (re-split if needed)

    @property
    def comm_device(self) -> torch.device:
        """Where tensors of collectives live (nccl reduces CUDA tensors only, gloo CPU ones)."""
        ...

    def weights_dtype(self, requested: str) -> str:
        """The dtype to load weights in, given ``model.dtype`` (e.g. float32 master weights under bf16 autocast)."""
        ...

    def autocast(self) -> AbstractContextManager: ...

    def loading(self) -> AbstractContextManager:
        """Around loading the models this backend will own (the policy, a LoRA adapter on it, GRPO's reference):
        ZeRO-3 creates each parameter already partitioned, so the model is never whole on one rank (the loader's own
        transient memory is not bounded by this: bench/results/zero3_load_rss.md); otherwise nothing."""
        ...

    def prepare(self, model: torch.nn.Module, settings: OptimizerSettings) -> None:
        """Take ownership of ``model``'s trainable parameters: build the optimizer and the schedule."""
        ...

    def apply_settings(self, settings: OptimizerSettings) -> None:
        """Replace the loaded state's hyper-parameters by ``settings`` (a resume with an accepted config change)."""
        ...

    def begin_accumulation(self, micro_batches: int) -> None:
        """The next ``micro_batches`` calls of :meth:`backward` make one gradient (the last one is the boundary)."""
        ...

    def backward(self, loss: torch.Tensor) -> None: ...

    def reduce_gradients(self) -> None:
        """Replace every gradient by its exact **sum** over ranks (every loss uses global denominators)."""
        ...

    def step(self) -> StepResult:
        """Clip, step when the norm is finite, advance the schedule, zero the gradients."""
        ...

    def advance_schedule(self) -> None:
        """One schedule slot without an optimizer step (a skipped step)."""
        ...

    def learning_rate(self) -> float: ...

    def generation_context(self) -> AbstractContextManager:
        """Around a rollout or an evaluation (every rank enters it, also where only rank 0 generates): the policy's
        full weights are usable for the whole block (ZeRO-3 gathers them once instead of once per token)."""
        ...

    def partition_reference(self, model: torch.nn.Module) -> torch.nn.Module:
        """A frozen model (GRPO's reference) placed as the backend places the policy, without optimizer state (ZeRO-3:
        partitioned; otherwise the model as it is)."""
        ...

    def full_weights(self, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """The policy's full current weights as ``(Hugging Face name, tensor)`` pairs in ``dtype``, each storage once,
        LoRA adapters merged: what a rollout engine with its own copy loads after each step. Collective under a
        partitioned backend (every rank iterates it to the end; ZeRO-3 gathers one module at a time, so no second full
        copy is ever held)."""
        ...

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """The full weights for ``save_pretrained`` (collective; None: the model's own state dict is complete)."""
        ...

    def trainable_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor] | None:
        """``{name: full tensor}`` of ``model``'s trainable parameters (a LoRA adapter for PEFT's save), gathered when
        partitioned (collective; None: the module's own tensors are whole)."""
        ...

    def save_engine_state(self, directory: Path) -> None:
        """Write state that is not in :meth:`state_dict` (every rank; e.g. partitioned optimizer state)."""
        ...

    def load_engine_state(self, directory: Path) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def backend_fact(name: str, key: str) -> Any:
    """A fact of the registered backend ``name`` (the list above), or its default for a backend that declares none
    (a plugin's): no checks, nothing partitioned (ZeRO stage 0, no offload), labelled by its name."""
    defaults = {"check": lambda train: [], "zero_stage": lambda train: 0, "offload": lambda train: "none",
                "label": lambda zero_stage, offload: name, "verify_checkpoint": None}
    return BACKENDS.facts(name).get(key, defaults[key])


def build_backend(name: str, config: Any) -> TrainingBackend:
    if name not in BACKENDS:
        raise ValueError(f"unknown training backend {name!r}; available: {', '.join(sorted(BACKENDS))}")
    return BACKENDS[name](config)
