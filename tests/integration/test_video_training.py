"""``mmgpg train task=moving_shapes`` (a video task) on tiny Qwen2.5-VL and Qwen3-VL: two GPG steps end to end with
the HF engine (videos encoded once per prompt in the update), then ``mmgpg eval`` and ``mmgpg check`` on the run."""

from __future__ import annotations

import json

import pytest

from mmgpg.cli import main
from mmgpg.rundir import read_metrics

pytest.importorskip("av")


@pytest.mark.parametrize("family, kind", [("qwen2_5_vl", "count"), ("qwen3_vl", "direction")])
def test_moving_shapes_trains_evaluates_and_checks(tmp_path, family, kind, capsys):
    run = tmp_path / "run"
    assert main(["train", "task=moving_shapes", f"task.kind={kind}", f"model.name_or_path=tiny:{family}", "model.dtype=float32",
                 "model.min_pixels=1024", "model.max_pixels=4096", "algo=grpo", "train.max_steps=2",
                 "train.prompts_per_step=2", "train.micro_batch_prompts=2", "rollout.group_size=2",
                 "rollout.max_new_tokens=8", "train.progress=false", "train.tensorboard=false",
                 "algo.max_resample_attempts=1", "train.save_every=0", f"output_dir={run}"]) == 0
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2] and all("reward/accuracy" in r for r in rows)
    out = tmp_path / "eval"
    assert main(["eval", "--task", "moving_shapes", f"task.kind={kind}", "--ckpt", str(run), "--limit", "2",
                 "--max-new-tokens", "8", "--output", str(out)]) == 0
    preds = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    answers = (1, 2, 3, 4) if kind == "count" else ("left", "right", "up", "down")
    assert len(preds) == 2 and all(p["ground_truth"] in answers for p in preds)
    capsys.readouterr()
    assert main(["check", "task=moving_shapes", f"model.name_or_path=tiny:{family}", "--examples", "2"]) == 0
    assert "video tokens" in capsys.readouterr().out  # each prompt's video token count
    rows = read_metrics(run)
    assert rows[0]["plan/peak_mib"] > 0  # planned with the task's video (a video of model.video_max_frames frames)


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_gpg_gradient_on_video_prompts_equals_the_one_sequence_reference(tmp_path, family):
    """The trainer's GPG step gradient on moving_shapes (each clip's video encoded once for its group, micro-batches
    of 3 groups) against tests/support/gradient_reference.py: each completion alone, unpadded, through the model's
    own forward with the processor's video tensors and full logits, the loss written by hand."""
    from support.gradient_reference import (
        ALPHA,
        gpg_advantages,
        make_groups,
        make_trainer,
        reference_gradient,
        relative_error,
        trainer_gradient,
    )

    trainer = make_trainer(f"tiny:{family}", str(tmp_path / "r"), "gpg", "task=moving_shapes", "model.min_pixels=1024",
                           "model.max_pixels=4096", "train.micro_batch_prompts=3", "model.logprob_chunk_size=7")
    groups = make_groups(trainer, [0, 1, 2, 3])
    assert all(p["type"] == "video" for g in groups for p in g.example.media)
    want = reference_gradient(trainer, groups, [gpg_advantages(g.rewards) for g in groups], alpha=ALPHA,
                              aggregation="seq_mean_token_mean")
    assert relative_error(trainer_gradient(trainer, groups), want) < 1e-5


def test_video_r1_trains_on_its_fixture_and_evaluates_a_benchmark(tmp_path, capsys):
    """task=video_r1 on a data folder in Video-R1's schema (real H.264 clips and an image, every problem type):
    training batches mix videos and images and score with Video-R1's rewards; ``mmgpg eval`` on the benchmark file
    writes accuracy (non-regression items) and MRA (regression items)."""
    from support.video_r1_fixture import write_video_r1

    data = write_video_r1(tmp_path / "data")
    run = tmp_path / "run"
    common = ["task=video_r1", f"task.train_data={data['train']}", f"task.eval_data={data['eval']}",
              "model.name_or_path=tiny:qwen2_5_vl", "model.min_pixels=1024", "model.max_pixels=4096"]
    assert main(["train", *common, "model.dtype=float32", "algo=gpg", "algo.min_valid_fraction=0",
                 "train.max_steps=2", "train.prompts_per_step=2", "train.micro_batch_prompts=2",
                 "rollout.group_size=2", "rollout.max_new_tokens=8", "train.progress=false",
                 "train.tensorboard=false", "train.save_every=0", f"output_dir={run}"]) == 0
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2] and all("reward/accuracy" in r and "reward/format" in r for r in rows)
    out = tmp_path / "eval"
    assert main(["eval", "--task", "video_r1", *common[1:3], "--ckpt", str(run), "--max-new-tokens", "8",
                 "--output", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    flat = json.dumps(metrics)
    assert '"mra"' in flat and '"accuracy"' in flat and "source/fixture-motion" in flat
    preds = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert [p["problem_type"] for p in preds] == ["multiple choice", "numerical", "regression"]


# ---- video through the training backends: ZeRO-3 with LoRA in CI (and a resume), the others with --runslow ----------

VIDEO_CELLS = {"zero3-lora": ["train.backend=deepspeed", "train.zero_stage=3", "model.lora.rank=4"],
               "zero2-full": ["train.backend=deepspeed", "train.zero_stage=2"],
               "plain-lora": ["train.backend=plain", "model.lora.rank=4"]}
VIDEO_IN_CI = {"zero3-lora"}


def _video_cell(cell: str):
    import importlib.util

    marks = [pytest.mark.distributed] + ([] if cell in VIDEO_IN_CI else [pytest.mark.slow])
    if "deepspeed" in " ".join(VIDEO_CELLS[cell]) and importlib.util.find_spec("deepspeed") is None:
        marks.append(pytest.mark.skip(reason="deepspeed is not installed (pip install 'mmgpg[deepspeed]')"))
    return pytest.param(cell, id=cell, marks=marks)


@pytest.mark.parametrize("cell", [_video_cell(c) for c in VIDEO_CELLS])
def test_moving_shapes_on_two_ranks_with_each_backend_and_a_resume(tmp_path, cell):
    """``torchrun --nproc_per_node 2 -m mmgpg train`` on moving_shapes clips (tiny Qwen2.5-VL, video prompts; the
    fixture's length-parity reward, so that a random model's groups vary and the steps update) for 2 steps
    with a checkpoint after each; then the step-2 checkpoint is removed and ``train.resume=true`` redoes step 2 from
    step 1: the same metrics and the same saved policy as the uninterrupted run."""
    import os
    import shutil

    import torch
    from safetensors.torch import load_file
    from support import FIXTURE_TASKS, assert_same_metrics, comparable_run, run_mmgpg

    args = ["train", f"task={FIXTURE_TASKS}:ParityMovingShapes", "task.kind=total", "model.name_or_path=tiny:qwen2_5_vl",
            "model.dtype=float32", "model.min_pixels=1024", "model.max_pixels=4096", "algo=gpg",
            "algo.min_valid_fraction=0", "train.max_steps=2", "train.prompts_per_step=2",
            "train.micro_batch_prompts=1", "rollout.group_size=2", "rollout.max_new_tokens=8",
            "train.learning_rate=1e-3", "train.progress=false", "train.tensorboard=false", "train.save_every=1",
            "train.keep_last=5", *VIDEO_CELLS[cell]]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    run, resumed = tmp_path / "run", tmp_path / "resumed"
    run_mmgpg(*args, f"output_dir={run}", ranks=2, env=env)
    rows = [r for r in comparable_run(run) if "grad_norm" in r]
    assert [r["step"] for r in rows] == [1, 2] and any(r["grad_norm"] > 0 for r in rows)
    shutil.copytree(run, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step-00000002")
    run_mmgpg(*args, f"output_dir={resumed}", "train.resume=true", ranks=2, env=env)
    assert_same_metrics(comparable_run(run), comparable_run(resumed))
    a = load_file(run / "checkpoints" / "step-00000002" / "policy" / "model.safetensors")
    b = load_file(resumed / "checkpoints" / "step-00000002" / "policy" / "model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(b[k], a[k], atol=1e-6, rtol=0, msg=lambda m, k=k: f"{k}: {m}")
