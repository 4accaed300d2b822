"""ZeRO-3 loading (gloo, 2 processes on CPU): inside ``DeepSpeedBackend.loading()`` the policy is built already
partitioned (transformers' ``HfDeepSpeedConfig`` + ``deepspeed.zero.Init`` path), with exactly the checkpoint's
weights; a tensor renamed in the checkpoint is refused; ``model=tiny`` built by rank 0 inside the block does not hang;
the block cannot nest and leaves transformers' ZeRO-3 switch off; and the trainer loads the policy and GRPO's
reference inside it, so ``prepare`` and ``partition_reference`` receive models that were never whole on a rank.
Each guard was broken on purpose and this test failed: ``loading()`` doing nothing, the trainer's reference loaded
outside it, and the tiny build without the switch suspended (a hang, ended by spawn's deadline)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.distributed as dist
from support import FIXTURE_TASKS
from support.gradient_reference import make_trainer
from test_deepspeed import ds_init, needs_deepspeed, spawn

TASK = f"task={FIXTURE_TASKS}:ParityShapes"


def _partitioning(model: torch.nn.Module) -> dict[str, tuple[bool, int, int, int]]:
    """``{name: (has ds_id, local numel, this rank's partition numel, full numel)}`` of every parameter."""
    return {n: (hasattr(p, "ds_id"), p.numel(), p.ds_tensor.numel() if hasattr(p, "ds_tensor") else -1,
                getattr(p, "ds_numel", -1)) for n, p in model.named_parameters()}


def _worker(rank: int, world: int, init_file: str, model_dir: str, out: str) -> None:
    ds_init(rank, world, init_file)
    try:
        import deepspeed
        from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled

        from mmgpg.backends.deepspeed import DeepSpeedBackend
        from mmgpg.config import resolve
        from mmgpg.models.load import load_for_training

        cfg = resolve([f"model.name_or_path={model_dir}", TASK, "train.backend=deepspeed", "train.zero_stage=3",
                       f"output_dir={out}/direct"]).config
        backend = DeepSpeedBackend(cfg)
        nested = ""
        with backend.loading():
            inside = is_deepspeed_zero3_enabled()
            try:
                with backend.loading():
                    pass
            except RuntimeError as e:
                nested = str(e)
            policy = load_for_training(cfg.model, backend.device, "float32")
        after = is_deepspeed_zero3_enabled()
        parts = _partitioning(policy.model)
        params = [p for _, p in policy.model.named_parameters()]
        with deepspeed.zero.GatheredParameters(params):
            full = {n: p.detach().clone() for n, p in policy.model.named_parameters()}

        # A renamed tensor is refused under ZeRO-3 too (its parameter is missing; transformers' ZeRO-3 path does not
        # report the unexpected name, the ordinary path reports both)
        damaged = f"{out}/damaged"
        if rank == 0:
            import shutil

            from safetensors.torch import load_file, save_file

            shutil.copytree(model_dir, damaged)
            sd = load_file(f"{damaged}/model.safetensors")
            key = next(k for k in sd if "layers.0.mlp.down_proj" in k)
            sd[key + "_renamed"] = sd.pop(key)
            save_file(sd, f"{damaged}/model.safetensors", metadata={"format": "pt"})
        dist.barrier()
        refused = ""
        try:
            with backend.loading():
                load_for_training(dataclasses.replace(cfg.model, name_or_path=damaged), backend.device, "float32")
        except ValueError as e:
            refused = str(e)

        # model=tiny inside the block: rank 0 builds it into an empty cache while rank 1 waits at a barrier; the build
        # must not run under zero.Init (its broadcasts would wait for rank 1: a hang, caught by spawn's deadline)
        import os

        os.environ["MMGPG_CACHE"] = f"{out}/cache"
        with backend.loading():
            built = load_for_training(dataclasses.replace(cfg.model, name_or_path="tiny"), backend.device, "float32")
        built_partitioned = all(hasattr(p, "ds_id") for p in built.model.parameters())

        # The trainer: what prepare / partition_reference receive (wrappers around the real methods)
        seen = {}
        prepare, partition = DeepSpeedBackend.prepare, DeepSpeedBackend.partition_reference

        def spy_prepare(self, model, settings):
            seen["policy"] = all(hasattr(p, "ds_id") for p in model.parameters())
            return prepare(self, model, settings)

        def spy_partition(self, model):
            seen["reference"] = all(hasattr(p, "ds_id") for p in model.parameters())
            return partition(self, model)

        DeepSpeedBackend.prepare, DeepSpeedBackend.partition_reference = spy_prepare, spy_partition
        try:
            make_trainer(model_dir, f"{out}/trainer", "grpo", TASK, "train.backend=deepspeed", "train.zero_stage=3")
        finally:
            DeepSpeedBackend.prepare, DeepSpeedBackend.partition_reference = prepare, partition
        seen["after_trainer"] = is_deepspeed_zero3_enabled()
        torch.save({"inside": inside, "after": after, "nested": nested, "refused": refused, "built": built_partitioned,
                    "parts": parts, "full": full, "seen": seen}, f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@needs_deepspeed
@pytest.mark.distributed
def test_zero3_loading_builds_the_policy_partitioned_with_the_checkpoints_weights(tiny_dirs, tmp_path):
    from transformers import AutoModelForImageTextToText

    model_dir = str(tiny_dirs["qwen2_vl"])
    spawn(_worker, (2, str(tmp_path / "init"), model_dir, str(tmp_path)), timeout=240)  # measured ~25 s
    loaded = AutoModelForImageTextToText.from_pretrained(model_dir).state_dict()
    for rank in (0, 1):
        r = torch.load(tmp_path / f"rank{rank}.pt")
        assert r["inside"] and not r["after"] and "cannot nest" in r["nested"]
        assert r["built"]
        assert "missing from its weights" in r["refused"] and "down_proj" in r["refused"], r["refused"]
        assert r["parts"] and r["full"].keys() == r["parts"].keys()
        for name, (has_id, local, partition, numel) in r["parts"].items():
            # no rank holds the parameter: a placeholder, and a partition of ceil(numel / 2) (DeepSpeed pads the last)
            assert has_id and local == 0 and partition == math.ceil(numel / 2), (name, local, partition, numel)
        for name, tensor in r["full"].items():
            assert torch.equal(tensor, loaded[name]), name  # the checkpoint's values, not a fresh initialisation
        assert r["seen"] == {"policy": True, "reference": True, "after_trainer": False}, r["seen"]
