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
