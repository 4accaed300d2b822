"""configs/recipe/video_r1_gpg.yaml: GPG on Video-R1's RL data (not a GPG paper row). It resolves to the GPG algorithm
with Video-R1's settings (an independent table below, from Video-R1's src/scripts/run_grpo_video.sh and README), says
it is not a paper row, and states the planner verdict that ``mmgpg plan`` gives on 4 x 80 GiB for the 7B's shape."""

from __future__ import annotations

import re

from mmgpg.cli import main
from mmgpg.config import builtin_config_dir, resolve
from mmgpg.models.tiny import save_config_only

RECIPE = builtin_config_dir() / "recipe" / "video_r1_gpg.yaml"
VIDEO_RECIPES = ("video_r1_gpg",)
# Video-R1's run: 4 GPUs x 1 prompt, G=8, lr 1e-6 cosine, weight decay 0.01, grad norm 5, 768 completion tokens,
# ZeRO-3, gradient checkpointing, 16 frames, 1.2k steps.
VIDEO_R1 = {"prompts": 4, "group": 8, "lr": 1e-6, "schedule": "cosine", "wd": 0.01, "grad_norm": 5.0,
            "completion": 768, "stage": 3, "frames": 16, "steps": 1200}


def header() -> str:
    return "\n".join(line for line in RECIPE.read_text().splitlines() if line.startswith("#"))


def test_recipe_is_gpg_with_video_r1s_settings():
    cfg = resolve(["recipe=video_r1_gpg"]).config
    assert cfg.algo == resolve(["algo=gpg"]).config.algo
    assert cfg.task.name == "video_r1" and cfg.model.name_or_path == "Qwen/Qwen2.5-VL-7B-Instruct"
    got = {"prompts": cfg.train.prompts_per_step, "group": cfg.rollout.group_size, "lr": cfg.train.learning_rate,
           "schedule": cfg.train.lr_scheduler, "wd": cfg.train.weight_decay, "grad_norm": cfg.train.max_grad_norm,
           "completion": cfg.rollout.max_new_tokens, "stage": cfg.train.zero_stage,
           "frames": cfg.model.video_max_frames, "steps": cfg.train.max_steps}
    assert got == VIDEO_R1
    assert cfg.train.backend == "deepspeed" and cfg.train.gradient_checkpointing
    text = header()
    assert "NOT a row" in text and re.search(r"torchrun --nproc_per_node 4 -m mmgpg train recipe=video_r1_gpg\b", text)


def test_header_states_the_planner_verdict(tmp_path, capsys):
    model = save_config_only(tmp_path / "st7b", "qwen2_5_vl", "shape_true_7b")
    code = main(["plan", "recipe=video_r1_gpg", f"model.name_or_path={model}", "--gpus", "4", "--gpu-memory-gb", "80",
                 "--videos-per-prompt", "1"])
    out = capsys.readouterr().out
    verdict = "fits (exit 0)" if code == 0 else "DOES NOT FIT (exit 1)"
    peak = re.search(r"^peak = .*?([0-9.]+)$", out, re.M).group(1)
    assert f"-> {verdict}: peak {peak} GiB" in header(), (code, peak)
