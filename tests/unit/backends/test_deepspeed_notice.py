"""Importing DeepSpeed through mmgpg on a machine without a CUDA device drops its "Setting accelerator to CPU"
notice and keeps every other message of its logger (a fresh interpreter each: DeepSpeed logs it once, at import)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

NOTICE = "Setting accelerator to CPU"
needs_deepspeed = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="deepspeed not installed")


def run(code: str) -> str:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # torch sees no GPU, as on a CPU node
    env.pop("DS_ACCELERATOR", None)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout + proc.stderr


@needs_deepspeed
def test_plain_import_shows_the_notice_mmgpg_import_does_not():
    assert NOTICE in run("import deepspeed")  # the reference: DeepSpeed itself logs it
    out = run("import logging\n"
              "from mmgpg.backends.deepspeed import _import_deepspeed\n"
              "_import_deepspeed()\n"
              "logging.getLogger('DeepSpeed').warning('a real warning after the import')")
    assert NOTICE not in out, out
    assert "a real warning after the import" in out, out


@needs_deepspeed
def test_the_planners_deepspeed_estimate_drops_it_too():
    out = run("from mmgpg.backends.memory import deepspeed_estimate\n"
              "print(deepspeed_estimate(10**6, 10**5, 1, 1, 2, 'none'))")
    assert NOTICE not in out, out
    assert "'available': True" in out, out


def test_inside_the_import_only_the_notice_is_dropped_and_the_filter_goes_after():
    import logging

    from mmgpg.utils import quiet_deepspeed_import

    seen = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    logger, keep = logging.getLogger("DeepSpeed"), Keep()
    logger.addHandler(keep)
    try:
        with quiet_deepspeed_import():
            logger.warning(NOTICE + ". If you have GPU or other accelerator, we were unable to detect it.")
            logger.warning("ZeRO offload needs more CPU memory")
        logger.warning(NOTICE + " (after the import)")
    finally:
        logger.removeHandler(keep)
    assert seen == ["ZeRO offload needs more CPU memory", NOTICE + " (after the import)"]


@needs_deepspeed
def test_a_model_load_and_save_drop_it(tmp_path):
    """accelerate imports DeepSpeed inside transformers' ``from_pretrained`` / ``save_pretrained`` when it is
    installed: a plain CPU run's first load or checkpoint logged the notice."""
    from mmgpg.models.load import resolve_model_path

    path = f"path = {resolve_model_path('tiny:qwen2')!r}\n"  # built here, once: the build imports DeepSpeed too
    assert NOTICE in run(path + "from transformers import AutoModelForCausalLM\n"  # the reference: transformers itself
                         "model = AutoModelForCausalLM.from_pretrained(path)\n"
                         f"model.save_pretrained({str(tmp_path / 'plain')!r})")
    out = run(path + "from mmgpg.models.load import load_policy\nfrom mmgpg.models.save import save_policy\n"
              "policy = load_policy(path, dtype='float32', device='cpu')\n"
              f"save_policy(policy, {str(tmp_path / 'ours')!r})")
    assert NOTICE not in out, out
    assert (tmp_path / "ours" / "model.safetensors").is_file()


NOISE = ("built successfully",  # DeepSpeed's print when it loads its CPU communication op
         "No CUDA runtime is found",  # torch's cpp_extension, imported for that op
         "is deprecated. Please use `torch.distributed",  # ZeRO's collectives through torch's deprecated names
         "has been overridden",  # torch's scheduler about DeepSpeed's wrapped optimizer.step
         "Detected call of `lr_scheduler.step()`")


@needs_deepspeed
def test_a_zero3_training_run_prints_none_of_the_libraries_noise(tmp_path):
    """`mmgpg train` on ZeRO-3 (one rank, CPU, 2 steps and a checkpoint): none of the lines above, which a user can
    do nothing about, while the run's own lines stay."""
    from support import FIXTURE_TASKS, run_mmgpg

    proc = run_mmgpg("train", f"task={FIXTURE_TASKS}:ParityShapes", "task.num_train=8", "model=tiny",
                     "rollout.group_size=2", "rollout.max_new_tokens=4", "train.prompts_per_step=2",
                     "train.max_steps=2", "train.save_every=2", "train.progress=false", "train.tensorboard=false",
                     "train.backend=deepspeed", "train.zero_stage=3", f"output_dir={tmp_path / 'run'}",
                     env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"})
    out = proc.stdout + proc.stderr
    assert [n for n in NOISE if n in out] == [], out[-3000:]
    assert "run directory:" in out
