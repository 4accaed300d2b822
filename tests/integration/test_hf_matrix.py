"""The combination matrix on the HF rollout engine (issue 25): training backend {plain, ZeRO-2, ZeRO-3} x adapter
{full, LoRA} x algorithm {gpg, grpo with a reference model}. Every cell is one real ``torchrun --nproc_per_node 2 -m
mmgpg train`` on the tiny Qwen2-VL (gloo, CPU) for 2 steps with a checkpoint after each; docs/distributed.md ("Which
combinations work") names each cell's test id, and tests/meta/test_combinations_table.py checks that table.

A cell is ~1-2 minutes on a loaded 2-core machine, so CI (plain ``pytest``) runs the cells that were new in issue 25
(:data:`IN_CI`); the others are marked ``slow`` and run with ``--runslow`` (or ``MMGPG_SLOW=1``). The LoRA cells
under DeepSpeed also resume: the last checkpoint removed, ``train.resume=true`` redoes step 2 from step 1 and must
write the same adapter and metrics."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from support import FIXTURE_TASKS, assert_same_metrics, comparable_run, run_mmgpg

BACKENDS = {"plain": ["train.backend=plain"], "zero2": ["train.backend=deepspeed", "train.zero_stage=2"],
            "zero3": ["train.backend=deepspeed", "train.zero_stage=3"]}
ADAPTERS = {"full": ["model.lora.rank=0"], "lora": ["model.lora.rank=4"]}
ALGOS = {"gpg": ["algo=gpg", "algo.min_valid_fraction=0.5", "algo.max_resample_attempts=3"],
         "grpo": ["algo=grpo"]}  # GRPO: kl_coef 0.04, so a reference model (LoRA: the policy with the adapter off)
CELLS = [f"{b}-{a}-{g}" for b in BACKENDS for a in ADAPTERS for g in ALGOS]
"""The cells' test ids, ``<backend>-<adapter>-<algo>`` (the docs table's rows name them)."""
IN_CI = {"zero3-lora-grpo", "zero3-full-grpo"}
"""The cells CI runs: LoRA under ZeRO-3 with the adapter-off reference, and ZeRO-3 with a partitioned GRPO reference
end to end (the ZeRO-2 cells, LoRA ones included, run with ``--runslow``; CI's time budget, .ci/run)."""

TRAIN = ["train", f"task={FIXTURE_TASKS}:ParityShapes", "model=tiny", "rollout.engine=hf", "rollout.group_size=4",
         "rollout.max_new_tokens=12", "train.prompts_per_step=4", "train.micro_batch_prompts=1",
         "train.learning_rate=1e-3", "train.progress=false", "train.tensorboard=false", "train.max_steps=2",
         "train.save_every=1", "train.keep_last=5"]
HAVE_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None


def _param(cell: str):
    backend, adapter, algo = cell.split("-")
    marks = [pytest.mark.distributed]
    if cell not in IN_CI:
        marks.append(pytest.mark.slow)
    if backend != "plain" and not HAVE_DEEPSPEED:
        marks.append(pytest.mark.skip(reason="deepspeed is not installed (pip install 'mmgpg[deepspeed]')"))
    return pytest.param(backend, adapter, algo, id=cell, marks=marks)


def _env() -> dict:
    """This process's environment at the test's time (conftest's per-session MMGPG_CACHE holds `model=tiny`)."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def _args(backend: str, adapter: str, algo: str, out: Path) -> list[str]:
    return [*TRAIN, *BACKENDS[backend], *ADAPTERS[adapter], *ALGOS[algo], f"output_dir={out}"]


def _checkpoint(run: Path, step: int) -> Path:
    return run / "checkpoints" / f"step-{step:08d}"


@pytest.mark.parametrize(("backend", "adapter", "algo"), [_param(c) for c in CELLS])
def test_cell(tmp_path, backend, adapter, algo):
    from transformers import AutoModelForImageTextToText

    from mmgpg.models.load import resolve_model_path
    from mmgpg.rundir import verify_checkpoint

    run = tmp_path / "run"
    run_mmgpg(*_args(backend, adapter, algo, run), ranks=2, env=_env())
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps = [m for m in metrics if "grad_norm" in m]
    assert [m["step"] for m in steps] == [1, 2]
    assert any(m["grad_norm"] > 0 for m in steps), "the run must actually update the policy"
    if algo == "grpo":
        assert all("loss/kl" in m for m in steps)
    last = _checkpoint(run, 2)
    assert verify_checkpoint(last)["world_size"] == 2
    assert (last / "engine").is_dir() == (backend != "plain")

    # policy/ is a plain Hugging Face model: merged (LoRA) and gathered (ZeRO-3), and the steps moved it.
    base_dir = Path(resolve_model_path("tiny"))  # the run's model (conftest's per-session cache)
    saved, initial = load_file(last / "policy" / "model.safetensors"), load_file(base_dir / "model.safetensors")
    assert not any("lora_" in k or "base_layer" in k or "modules_to_save" in k for k in saved)
    assert saved.keys() == initial.keys()
    assert all(saved[k].shape == initial[k].shape for k in saved), "a gathered tensor came back empty"
    assert any(not torch.equal(saved[k], initial[k]) for k in saved), "policy/ equals the initial model"
    if adapter == "lora":
        # The independent merge: PEFT's own merge_and_unload of adapter/ onto the base model gives policy/.
        from peft import PeftModel

        assert any("lora_B" in k and float(v.abs().max()) > 0 for k, v in
                   load_file(last / "adapter" / "adapter_model.safetensors").items())
        policy = AutoModelForImageTextToText.from_pretrained(last / "policy", dtype=torch.float32).state_dict()
        base = AutoModelForImageTextToText.from_pretrained(base_dir, dtype=torch.float32)
        merged = PeftModel.from_pretrained(base, str(last / "adapter")).merge_and_unload().state_dict()
        assert policy.keys() == merged.keys()
        for k, v in policy.items():
            torch.testing.assert_close(v, merged[k], atol=1e-6, rtol=0, msg=lambda m, k=k: f"{k}: {m}")
        if backend != "plain":
            _resume_redoes_the_last_step(run, tmp_path / "resumed", backend, adapter, algo)


def _resume_redoes_the_last_step(run: Path, resumed: Path, backend: str, adapter: str, algo: str) -> None:
    """A copy of the run without its step-2 checkpoint resumes from step 1 (the saved adapter and DeepSpeed's
    engine state) and redoes step 2: the same adapter and metrics as the uninterrupted run."""
    shutil.copytree(run, resumed)
    shutil.rmtree(_checkpoint(resumed, 2))
    run_mmgpg(*_args(backend, adapter, algo, resumed), "train.resume=true", ranks=2, env=_env())
    a = load_file(_checkpoint(run, 2) / "adapter" / "adapter_model.safetensors")
    b = load_file(_checkpoint(resumed, 2) / "adapter" / "adapter_model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(b[k], a[k], atol=1e-6, rtol=0, msg=lambda m, k=k: f"{k}: {m}")
    assert_same_metrics(comparable_run(run), comparable_run(resumed))
