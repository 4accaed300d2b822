"""The plain backend: one full model copy per process, torch AdamW, gradients summed over ranks with bucketed
all-reduces (no DDP wrapper, so ranks may run different numbers of micro-batches)."""

from __future__ import annotations

import contextlib
import math
import warnings
from contextlib import AbstractContextManager
from typing import Any

import torch

from mmgpg import distributed
from mmgpg.backends import OptimizerSettings, StepResult, build_scheduler
from mmgpg.models.load import resolve_device
from mmgpg.models.save import policy_weights


class PlainBackend:
    name = "plain"

    def __init__(self, config: Any):
        device = resolve_device(config.device)
        self.dist = distributed.setup(device.type)
        if device.type == "cuda" and self.dist.enabled:
            device = torch.device("cuda", self.dist.local_rank)
            torch.cuda.set_device(device)
        self.device = device
        self.bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported() and config.model.dtype == "auto"
        self.model: torch.nn.Module | None = None
        self.params: list[torch.nn.Parameter] = []
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: Any = None
        self.settings: OptimizerSettings | None = None

    @property
    def comm_device(self) -> torch.device:
        """Where collective tensors live: nccl reduces CUDA tensors only, gloo CPU ones."""
        return self.device if self.device.type == "cuda" else torch.device("cpu")

    def weights_dtype(self, requested: str) -> str:
        # Under bf16 autocast the weights stay float32 (the master copy); otherwise as model.dtype says.
        return "float32" if self.bf16 else requested

    def autocast(self) -> AbstractContextManager:
        if self.bf16:
            return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def prepare(self, model: torch.nn.Module, settings: OptimizerSettings) -> None:
        self.settings = settings
        self.model = model
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=settings.learning_rate, betas=tuple(settings.betas),
                                           eps=settings.eps, weight_decay=settings.weight_decay)
        self.scheduler = build_scheduler(self.optimizer, settings)

    def apply_settings(self, settings: OptimizerSettings) -> None:
        """After :meth:`load_state_dict`: AdamW's hyper-parameters and the schedule's base learning rate from
        ``settings`` instead of the checkpoint's (``train.resume_config=new``); the schedule position is kept."""
        self.settings = settings
        for group in self.optimizer.param_groups:
            group.update(initial_lr=settings.learning_rate, betas=tuple(settings.betas), eps=settings.eps,
                         weight_decay=settings.weight_decay)
        self.scheduler.base_lrs = [settings.learning_rate] * len(self.optimizer.param_groups)
        for group, fn in zip(self.optimizer.param_groups, self.scheduler.lr_lambdas):
            group["lr"] = settings.learning_rate * fn(self.scheduler.last_epoch)
        self.scheduler._last_lr = [g["lr"] for g in self.optimizer.param_groups]

    equal_micro_batches = False  # no collectives inside forward or backward
    resumes_on_any_world_size = True  # the full AdamW state on every rank (rank 0 saves it): loads on any count

    def begin_accumulation(self, micro_batches: int) -> None:
        pass

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def reduce_gradients(self) -> None:
        distributed.sum_gradients(self.params)

    def grad_norm(self) -> float:
        grads = [p.grad for p in self.params if p.grad is not None]
        if not grads:
            return 0.0
        return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))

    def step(self) -> StepResult:
        max_norm = self.settings.max_grad_norm
        if max_norm > 0:
            norm = float(torch.nn.utils.clip_grad_norm_(self.params, max_norm))
        else:
            norm = self.grad_norm()
        stepped = math.isfinite(norm)
        if stepped:
            self.optimizer.step()
        self.advance_schedule()
        self.optimizer.zero_grad(set_to_none=True)
        return StepResult(norm, stepped)

    def advance_schedule(self) -> None:
        with warnings.catch_warnings():  # torch warns when the schedule moves before the first optimizer step
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)`")
            self.scheduler.step()

    def learning_rate(self) -> float:
        return float(self.scheduler.get_last_lr()[0])

    def generation_context(self) -> AbstractContextManager:
        return contextlib.nullcontext()

    def loading(self) -> AbstractContextManager:
        return contextlib.nullcontext()  # every process holds the whole model anyway

    def partition_reference(self, model: torch.nn.Module) -> torch.nn.Module:
        return model  # a full copy per process, as the policy

    def full_weights(self, dtype: torch.dtype | None = None):
        return policy_weights(self.model, dtype)  # a full copy per process: the model's own tensors (LoRA merged)

    def full_state_dict(self) -> None:
        return None

    def trainable_state_dict(self, model) -> None:
        return None  # the model's own tensors are whole

    def save_engine_state(self, directory) -> None:
        pass

    def load_engine_state(self, directory) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "deepspeed" in state:
            from mmgpg.typed import CheckpointError

            raise CheckpointError("this checkpoint was written by the DeepSpeed backend (its optimizer state is in "
                                  "engine/): resume it with train.backend=deepspeed, or start a new run from its "
                                  "policy/ (model.name_or_path=<checkpoint>/policy) with a fresh optimizer")
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
