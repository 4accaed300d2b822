"""The DeepSpeed backend (``train.backend=deepspeed``): ZeRO stage 0-3 with optional optimizer/parameter offload,
computing the same update as the plain backend.

* **Sums, not means.** mmgpg's losses use global denominators, so the step's gradient is the *sum* of the ranks'
  gradients; DeepSpeed *averages* them over the data-parallel ranks. Each micro-batch's loss is multiplied by the
  world size before DeepSpeed's backward, so its average is the sum (clipping then sees the same global norm as plain).
* **One boundary per step.** The number of micro-batches varies from step to step; the trainer announces it
  (:meth:`begin_accumulation`) and the backend marks the last backward as DeepSpeed's accumulation boundary.
* **Equal forwards.** ZeRO-2 reduces gradients inside every backward and ZeRO-3 gathers parameters inside every
  forward (collectives), so every rank must run the same number of micro-batches: :attr:`equal_micro_batches` asks the
  trainer to pad the short ranks with zero-weight micro-batches.
* **Parameters read outside their module** (:attr:`mmgpg.models.Family.zero3_external`, e.g. Qwen3.5's convolution
  weight) are registered as external parameters of the module that reads them, so ZeRO-3 gathers them there.
* **Generation** (:meth:`generation_context`): under ZeRO-3 the weights are gathered once for a whole rollout
  (DeepSpeed's ``unwrap_model_for_generation``), instead of once per layer per generated token.
* **Checkpoints**: rank 0 writes the gathered full weights as the ``policy/`` Hugging Face directory;
  DeepSpeed's ``save_checkpoint`` writes the (partitioned) optimizer state beside it (``engine/``).
"""

from __future__ import annotations

import contextlib
import math
import shutil
import sys
import warnings
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import torch

from mmgpg import distributed
from mmgpg.backends import OptimizerSettings, StepResult, build_scheduler
from mmgpg.backends.deepspeed_config import INSTALL_HINT, derive, merge, read_user_config
from mmgpg.backends.deepspeed_state import load_engine_file, to_universal
from mmgpg.backends.deepspeed_state import quiet as _quiet
from mmgpg.models.load import resolve_device


def _import_deepspeed():
    import os
    import sys

    from mmgpg.utils import quiet_deepspeed_import

    # DeepSpeed JIT-builds its CPU ops into torch's extension cache, keyed by Python and CUDA only: a build made by
    # one torch (2.14 in the core environment) would be loaded by another (2.13 in the vLLM environment). One folder
    # per torch version keeps them apart (an explicit TORCH_EXTENSIONS_DIR wins).
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(
        Path.home() / ".cache" / "torch_extensions" / f"py{sys.version_info[0]}{sys.version_info[1]}_torch{torch.__version__}"))
    try:
        with quiet_deepspeed_import():
            import deepspeed
    except ImportError as err:
        raise ImportError(f"train.backend=deepspeed needs the deepspeed package: {INSTALL_HINT}") from err
    return deepspeed


class DeepSpeedBackend:
    name = "deepspeed"
    equal_micro_batches = True
    resumes_on_any_world_size = True  # ZeRO's per-rank optimizer state, re-split through the universal checkpoint

    def __init__(self, config: Any):
        self.ds = _import_deepspeed()
        # DeepSpeed's ZeRO collectives call torch's deprecated names; torch warns again each time any code changes
        # the warning filters (which resets its once-per-place record): lines a user can do nothing about.
        deprecated = r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)` is deprecated"
        warnings.filterwarnings("ignore", category=FutureWarning, message=deprecated)
        t = config.train
        device = resolve_device(config.device)
        self.dist = distributed.setup(device.type)
        if not torch.distributed.is_initialized():  # one process: DeepSpeed still needs a process group (of one)
            _init_single_process_group("nccl" if device.type == "cuda" else "gloo")
        from deepspeed.accelerator import get_accelerator

        from mmgpg.utils import quiet_deepspeed_import

        with _quiet(), quiet_deepspeed_import():  # DeepSpeed's communication layer over that group, as `initialize`
            # and `zero.Init` would make it (they reuse it): made here, its start-up print and torch's CUDA notice
            # (it JIT-loads a CPU op) are kept back
            self.ds.comm.init_distributed(dist_backend=get_accelerator().communication_backend_name(),
                                          dist_init_required=False, verbose=False)
        if device.type == "cuda" and self.dist.enabled:
            device = torch.device("cuda", self.dist.local_rank)
            torch.cuda.set_device(device)
        self.device = device
        # The same decision as the plain backend; DeepSpeed then keeps bf16 weights and float32 master weights.
        self.bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported() and config.model.dtype == "auto"
        derived, sources = derive(t.zero_stage, t.offload_optimizer, t.offload_params, t.max_grad_norm, self.bf16)
        if t.deepspeed_config:
            derived = merge(derived, sources, read_user_config(t.deepspeed_config), t.deepspeed_config)
        self.ds_config = derived
        self.zero_stage = t.zero_stage
        self.offload_optimizer = t.offload_optimizer
        self.engine: Any = None
        self.params: list[torch.nn.Parameter] = []
        self.scheduler: Any = None
        self._saved_world: int | None = None  # the rank count of the checkpoint being resumed (load_state_dict)
        self.settings: OptimizerSettings | None = None
        self._remaining = 0
        self._nonfinite_loss = False
        self._last_norm = 0.0

    @property
    def comm_device(self) -> torch.device:
        return self.device if self.device.type == "cuda" else torch.device("cpu")

    def weights_dtype(self, requested: str) -> str:
        return "float32" if self.bf16 else requested  # DeepSpeed casts to bf16 itself and keeps fp32 master weights

    def autocast(self) -> AbstractContextManager:
        return contextlib.nullcontext()  # bf16 is DeepSpeed's (the module's weights are bf16)

    # ---- set-up ---------------------------------------------------------------------------------------------------

    def _optimizer(self, settings: OptimizerSettings):
        kwargs = dict(lr=settings.learning_rate, betas=tuple(settings.betas), eps=settings.eps,
                      weight_decay=settings.weight_decay)
        if self.offload_optimizer:  # DeepSpeed requires its CPU Adam for an offloaded optimizer (JIT-built op)
            from deepspeed.ops.adam import DeepSpeedCPUAdam

            return DeepSpeedCPUAdam(self.params, adamw_mode=True, **kwargs)
        return torch.optim.AdamW(self.params, **kwargs)

    def prepare(self, model: torch.nn.Module, settings: OptimizerSettings) -> None:
        self.settings = settings
        self.params = [p for p in model.parameters() if p.requires_grad]
        optimizer = self._optimizer(settings)
        # mmgpg steps the schedule, not DeepSpeed (a skipped step advances it without an optimizer step). It is built
        # on the torch optimizer (torch's schedulers accept nothing else) and then pointed at DeepSpeed's wrapper,
        # whose param groups are the ones the step reads.
        self.scheduler = build_scheduler(optimizer, settings)
        self._register_external(model)
        with _quiet():
            self.engine, _, _, _ = self.ds.initialize(model=model, model_parameters=self.params, optimizer=optimizer,
                                                      config=self.ds_config, dist_init_required=False)
        self.scheduler.optimizer = self.engine.optimizer
        for group in self.engine.optimizer.param_groups:
            group.setdefault("initial_lr", settings.learning_rate)

    def apply_settings(self, settings: OptimizerSettings) -> None:
        self.settings = settings
        for group in self.engine.optimizer.param_groups:
            group.update(initial_lr=settings.learning_rate, betas=tuple(settings.betas), eps=settings.eps,
                         weight_decay=settings.weight_decay)
        self.scheduler.base_lrs = [settings.learning_rate] * len(self.engine.optimizer.param_groups)
        for group, fn in zip(self.engine.optimizer.param_groups, self.scheduler.lr_lambdas):
            group["lr"] = settings.learning_rate * fn(self.scheduler.last_epoch)
        self.scheduler._last_lr = [g["lr"] for g in self.engine.optimizer.param_groups]
        self.engine._config.gradient_clipping = float(settings.max_grad_norm)  # ZeRO-0 reads the engine's config
        if hasattr(self.engine.optimizer, "clip_grad"):  # ZeRO-1/2/3 copied it at initialisation
            self.engine.optimizer.clip_grad = float(settings.max_grad_norm)

    @contextlib.contextmanager
    def loading(self):
        """Under ZeRO-3, ``from_pretrained`` inside this block builds the model under ``deepspeed.zero.Init`` (the
        path transformers takes while an ``HfDeepSpeedConfig`` of a stage-3 config is alive): each parameter is
        partitioned as soon as its module is created, and the checkpoint's tensors are copied in one module at a time
        (read by rank 0, gathered, re-partitioned). So the model is never whole on one rank, as it was when every rank
        loaded it and :meth:`prepare` partitioned it afterwards (on CPU the loader's peak host RSS is no lower:
        bench/results/zero3_load_rss.md; the gain is GPU memory, not measured here). Below stage 3 nothing changes
        (ZeRO-0/1/2 keep the full weights on every rank anyway). The config is cleared again at the end: transformers
        would otherwise also switch ``generate`` to ``synced_gpus`` and change other calls outside this block."""
        if self.zero_stage != 3:
            yield
            return
        from transformers.integrations import deepspeed as hf_deepspeed

        if hf_deepspeed.is_deepspeed_zero3_enabled():
            raise RuntimeError("DeepSpeedBackend.loading() cannot nest: a DeepSpeed config is already set in "
                               "transformers (another loading() block, or HfDeepSpeedConfig made by the caller)")
        config = hf_deepspeed.HfDeepSpeedConfig(self.ds_config)  # transformers keeps only a weak reference: hold it
        try:
            yield
        finally:
            hf_deepspeed.unset_hf_deepspeed_config()
            del config

    def partition_reference(self, model: torch.nn.Module) -> torch.nn.Module:
        """A frozen model (GRPO's reference) under ZeRO-3: partitioned like the policy, no optimizer state.
        Below stage 3 the model is returned as it is (a full copy per rank)."""
        if self.zero_stage != 3:
            return model
        config = {k: v for k, v in self.ds_config.items() if k not in ("gradient_clipping",)}
        config["zero_optimization"] = {k: v for k, v in config["zero_optimization"].items()
                                       if k != "offload_optimizer"}
        self._register_external(model)
        with _quiet():
            engine, *_ = self.ds.initialize(model=model, config=config, dist_init_required=False)
        engine.eval()
        return engine.module

    def _register_external(self, model: torch.nn.Module) -> None:
        """Under ZeRO-3, register the parameters the model's family reads outside their own module's forward
        (:attr:`mmgpg.models.Family.zero3_external`) as external parameters of the module that reads them: DeepSpeed
        then gathers them in that module's forward and backward (else the read finds an empty partition)."""
        if self.zero_stage != 3:
            return
        for module, param in external_parameters(model):
            self.ds.zero.register_external_parameter(module, param)

    # ---- one step -------------------------------------------------------------------------------------------------

    def begin_accumulation(self, micro_batches: int) -> None:
        self._remaining = micro_batches
        self._nonfinite_loss = False

    def backward(self, loss: torch.Tensor) -> None:
        if self._remaining < 1:
            raise RuntimeError("DeepSpeedBackend.backward without begin_accumulation(n): the trainer must announce "
                               "how many micro-batches make the step's gradient")
        self._remaining -= 1
        self._nonfinite_loss |= not bool(torch.isfinite(loss.detach()).all())
        self.engine.set_gradient_accumulation_boundary(self._remaining == 0)
        # What engine.forward does first (mmgpg calls the module's parts itself, not the engine): a new micro-step.
        # ZeRO-3 counts micro-steps here, and accumulates into the partitioned gradient only after the first one.
        if hasattr(self.engine.optimizer, "clear_backward_seen_flag"):
            self.engine.optimizer.clear_backward_seen_flag()
        # DeepSpeed averages over the data-parallel ranks; mmgpg's gradient is the sum (global denominators).
        self.engine.backward(loss * self.dist.world_size, scale_wrt_gas=False)

    def reduce_gradients(self) -> None:
        """Nothing to do: DeepSpeed reduced the gradients at the accumulation boundary (the last backward)."""

    def full_gradients(self) -> dict[str, torch.Tensor]:
        """{parameter name: the full, reduced gradient} after the boundary backward and before :meth:`step`
        (every rank; collective under ZeRO-3). For tests and diagnostics."""
        from deepspeed.utils import safe_get_full_grad

        out = {}
        for name, p in self.engine.module.named_parameters():
            if p.requires_grad:
                g = safe_get_full_grad(p)
                shape = getattr(p, "ds_shape", p.shape)
                out[name] = torch.zeros(shape) if g is None else g.detach().float().cpu().clone().reshape(shape)
        return out

    def step(self) -> StepResult:
        # ZeRO-1/2/3 skip a step whose gradient norm is NaN/Inf themselves; stage 0 (the torch optimizer) would apply
        # it, so there a non-finite loss on any rank (the usual source) skips it: gradients dropped, weights unchanged.
        if self.zero_stage == 0 and distributed.all_max(float(self._nonfinite_loss), self.comm_device) > 0:
            self.engine.optimizer.zero_grad(set_to_none=True)
            self.advance_schedule()
            return StepResult(float("nan"), False)
        with _quiet():
            self.engine.step()
        norm = self.engine.get_global_grad_norm()
        norm = 0.0 if norm is None else float(norm)
        self._last_norm = norm
        self.advance_schedule()
        return StepResult(norm, math.isfinite(norm))

    def advance_schedule(self) -> None:
        # torch's scheduler warns when it moves before the first optimizer step (a skipped step), and that the
        # optimizer's step "has been overridden" (DeepSpeed wraps it): the order here is right in both cases.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)`")
            warnings.filterwarnings("ignore", message=r"Seems like `optimizer.step\(\)` has been overridden")
            self.scheduler.step()

    def learning_rate(self) -> float:
        return float(self.scheduler.get_last_lr()[0])

    # ---- generation -----------------------------------------------------------------------------------------------

    def generation_context(self) -> AbstractContextManager:
        if self.zero_stage != 3 or self.engine is None:
            return contextlib.nullcontext()
        return _gathered_for_generation(self.engine)

    # ---- checkpoints ----------------------------------------------------------------------------------------------

    def full_weights(self, dtype: torch.dtype | None = None):
        """ZeRO-0/1/2: every rank holds the full weights (the module's own tensors, LoRA merged as on the plain
        backend). ZeRO-3: the parameters are empty placeholders outside a gather, so each module's own parameters are
        gathered in turn (``GatheredParameters`` over ``parameters(recurse=False)``: one module's worth of memory at
        a time), copied in ``dtype``, and released; a LoRA layer or a fully trained copy is gathered as one unit (its
        base weight with its adapters) and merged (:func:`mmgpg.models.lora.merged_unit`); persistent buffers are
        never partitioned. Collective under ZeRO-3: every rank iterates to the end."""
        from mmgpg.models.save import policy_weights

        if self.zero_stage != 3:
            return policy_weights(self.engine.module, dtype)
        # Not through unique_tensors: it tells tied tensors apart by storage address, and a consumer that frees each
        # gathered copy once used (a bucketed sync) lets the next copy reuse that address, which would be taken for
        # a tie and dropped. _gathered_tensors yields each parameter once by identity instead (ties included).
        return _gathered_tensors(self.engine.module, dtype)

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """ZeRO-3 only (None below: the module's own tensors are whole): the full weights for ``save_pretrained``,
        complete on rank 0 (the other ranks take part in the gathers and get an empty dict). Without LoRA DeepSpeed's
        consolidated 16-bit state dict; with LoRA the merged weights of :meth:`full_weights` under the base model's
        names (what ``policy/`` holds on the plain backend too)."""
        if self.zero_stage != 3:
            return None
        from mmgpg.models.lora import merge_units

        if not merge_units(self.engine.module):
            return self.engine._zero3_consolidated_16bit_state_dict()  # gathered one module at a time; full on rank 0
        keep = self.dist.rank == 0
        out = {}
        for name, tensor in _gathered_tensors(self.engine.module, None):
            if keep:
                out[name] = tensor
        return out

    def trainable_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor] | None:
        """``{name: full tensor}`` of ``model``'s trainable parameters (a LoRA adapter: the ``PeftModel``'s own
        names, as PEFT's ``save_pretrained(state_dict=...)`` takes them), gathered under ZeRO-3 (collective: every
        rank calls it; the adapter is small, so it is gathered at once); None below stage 3, where the module's own
        tensors are whole."""
        if self.zero_stage != 3:
            return None
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        with self.ds.zero.GatheredParameters([p for _, p in named], modifier_rank=None):
            return {n: p.detach().clone() for n, p in named}

    def save_engine_state(self, directory: Path) -> None:
        with _quiet():
            self.engine.save_checkpoint(str(directory), tag="state", save_latest=False)

    def load_engine_state(self, directory: Path) -> None:
        """DeepSpeed's ``load_checkpoint``, with its file loader (``torch.load(weights_only=False)``: a crafted file
        would run code) replaced for the call by :func:`~mmgpg.backends.deepspeed_state.load_engine_file`
        (``weights_only=True``, only the few DeepSpeed types its state holds). The checkpoint was verified the same
        way before it was chosen.

        Written by another number of ranks (ZeRO stage 1-3, whose optimizer state is split per rank): the state is
        first converted to DeepSpeed's universal checkpoint (:func:`~mmgpg.backends.deepspeed_state.to_universal`:
        one file per parameter and state, whole) and loaded from there, each rank taking its new partition; the
        conversion is removed afterwards."""
        world = self._saved_world
        if world is None or world == self.dist.world_size or self.zero_stage == 0:  # stage 0: nothing is split
            self._load_engine_dir(directory)
            return
        universal = directory.parent.parent / f".universal-{directory.parent.name}"
        failed = None
        if self.dist.is_main:
            print(f"resume: re-splitting DeepSpeed's ZeRO-{self.zero_stage} optimizer state from {world} to "
                  f"{self.dist.world_size} rank(s) (DeepSpeed's universal checkpoint, written to {universal} and "
                  "removed after loading)", file=sys.stderr, flush=True)
            try:
                to_universal(directory / "state", universal / "state")
            except Exception as err:  # noqa: BLE001 - reported on every rank below, not only on rank 0
                failed = str(err)[-2000:]
        failed = distributed.broadcast_object(failed)
        try:
            if failed is not None:
                from mmgpg.typed import CheckpointError

                raise CheckpointError(
                    f"DeepSpeed could not convert {directory} (written by {world} rank(s)) to a universal checkpoint "
                    f"for {self.dist.world_size} rank(s) ({failed}). Resume with {world} rank(s), or start a new run "
                    f"from its policy/ (model.name_or_path={directory.parent}/policy; the optimizer starts afresh)")
            config = self.engine._config  # DeepSpeed reads `checkpoint.load_universal` from here during the load
            config.load_universal_checkpoint = True
            try:
                self._load_engine_dir(universal)
            finally:
                config.load_universal_checkpoint = False
        finally:
            distributed.barrier()  # every rank has read it
            if self.dist.is_main:
                shutil.rmtree(universal, ignore_errors=True)

    def _load_engine_dir(self, directory: Path) -> None:
        from mmgpg.typed import CheckpointError

        files = self.engine.checkpoint_engine
        files.load = load_engine_file  # an instance attribute over the class's method, removed again below
        try:
            with _quiet():
                path, _ = self.engine.load_checkpoint(str(directory), tag="state", load_module_strict=True,
                                                      load_optimizer_states=True, load_lr_scheduler_states=False)
        except CheckpointError:
            raise
        except Exception as err:  # noqa: BLE001 - damage the verification could not see (e.g. a tensor's shape)
            raise CheckpointError(
                f"DeepSpeed could not load {directory} ({type(err).__name__}: {str(err)[:300]}). Its files passed "
                f"mmgpg's checks but do not fit this model and optimizer. Move the checkpoint {directory.parent} "
                "out of checkpoints/ and resume again: the newest intact earlier one is used.") from None
        finally:
            del files.load
        if path is None:
            raise FileNotFoundError(f"no DeepSpeed engine state in {directory}")

    def state_dict(self) -> dict[str, Any]:
        # The optimizer state itself is DeepSpeed's (partitioned over ranks): engine/ beside this file.
        return {"optimizer": {"in": "engine/"}, "scheduler": self.scheduler.state_dict(),
                "deepspeed": {"zero_stage": self.zero_stage, "world_size": self.dist.world_size}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from mmgpg.typed import CheckpointError

        saved = state.get("deepspeed")
        if saved is None:
            raise CheckpointError("this checkpoint was written by the plain backend (its optimizer state is a torch "
                                  "AdamW state, not DeepSpeed's): resume it with train.backend=plain, or start a new "
                                  "run from its policy/ (model.name_or_path=<checkpoint>/policy) with a fresh optimizer")
        world, stage = int(saved["world_size"]), int(saved["zero_stage"])
        if stage != self.zero_stage:
            raise CheckpointError(
                f"this checkpoint's DeepSpeed state was written with ZeRO stage {stage}; this run has "
                f"train.zero_stage={self.zero_stage}. Resume with train.zero_stage={stage} (any number of ranks), or "
                "start a new run from the checkpoint's policy/ (model.name_or_path=<checkpoint>/policy; the "
                "optimizer starts afresh)")
        self._saved_world = world  # another count: load_engine_state re-splits the optimizer state
        self.scheduler.load_state_dict(state["scheduler"])


def external_parameters(model: torch.nn.Module) -> list[tuple[torch.nn.Module, torch.nn.Parameter]]:
    """``(reader module, parameter)`` for each :attr:`~mmgpg.models.Family.zero3_external` pair of the model's family:
    every module whose name ends in the pattern (PEFT's wrapper prefixes included) and holds the parameter path."""
    import re

    from mmgpg.models import FAMILIES

    model_type = getattr(getattr(model, "config", None), "model_type", None)
    pairs = FAMILIES[model_type].zero3_external if model_type in FAMILIES else ()
    found = []
    for pattern, path in pairs:
        for name, module in model.named_modules():
            if re.fullmatch(rf"(?:.*\.)?{pattern}", name):
                try:
                    found.append((module, module.get_parameter(path)))
                except AttributeError:
                    continue
    return found


def _init_single_process_group(backend: str) -> None:
    """A process group of one on a free local port (``mmgpg train`` or ``mmgpg sft`` without torchrun)."""
    import os

    os.environ.setdefault("LOCAL_RANK", "0")  # DeepSpeed's launcher check
    port = distributed.free_port()
    torch.distributed.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)


def _gathered_tensors(model: torch.nn.Module, dtype: torch.dtype | None):
    """``(name, full tensor)`` for every parameter and persistent buffer of a ZeRO-3 ``model``, gathered one module
    at a time (every rank must consume the whole iterator: each gather is a collective). A LoRA layer or a fully
    trained copy (:func:`mmgpg.models.lora.merge_units`) is gathered whole, as one unit, and yields its merged tensors
    under the base model's names (:func:`mmgpg.models.lora.merged_unit`)."""
    import deepspeed

    from mmgpg.models.lora import merge_units, merged_unit

    def cast(t):
        return t.to(dtype, copy=True) if dtype is not None and t.is_floating_point() else t.clone()

    units = merge_units(model)
    seen: set[int] = set()
    inside = None  # the unit whose submodules are being skipped
    for prefix, module in model.named_modules():
        if inside is not None and prefix.startswith(inside):
            continue
        inside = None
        if prefix in units:
            params = [q for q in module.parameters() if id(q) not in seen]
            seen.update(id(q) for q in params)
            with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
                for name, tensor in merged_unit(module).items():
                    yield f"{prefix}.{name}", cast(tensor)
            inside = prefix + "."
            continue
        params = [(n, q) for n, q in module.named_parameters(recurse=False) if id(q) not in seen]
        seen.update(id(q) for _, q in params)
        if params:
            with deepspeed.zero.GatheredParameters([q for _, q in params], modifier_rank=None):
                for name, q in params:
                    yield (f"{prefix}.{name}" if prefix else name), cast(q.detach())
        for name, buf in module.named_buffers(recurse=False):
            if buf is not None and name not in module._non_persistent_buffers_set:
                yield (f"{prefix}.{name}" if prefix else name), buf.detach()


@contextlib.contextmanager
def _gathered_for_generation(engine):
    """ZeRO-3 parameters gathered once for a whole block of generation, with no collective inside it: DeepSpeed's
    ``unwrap_model_for_generation`` (one all-gather of every parameter, the per-module fetch/release hooks removed
    for the block), and also the root module's start-of-forward hook removed, which checks the recorded module order
    collectively (``reset_step``) — ranks generate different numbers of tokens, and evaluation runs on rank 0 only.
    Every rank must enter (the gather and the release are collectives). Memory: the full model on every rank for the
    block, as with TRL's ``unwrap_model_for_generation``."""
    from deepspeed.runtime.zero.stage3 import unwrap_model_for_generation

    offload = getattr(engine.optimizer, "parameter_offload", None) or engine.optimizer
    start_hook = offload.module._forward_pre_hooks.get(offload.fwd_pre_hook.id)
    offload.fwd_pre_hook.remove()
    try:
        with unwrap_model_for_generation(engine):
            yield
    finally:
        if start_hook is not None:
            offload.fwd_pre_hook = offload.module.register_forward_pre_hook(start_hook, prepend=True)
