"""configs/recipe/qwen3_vl_*.yaml: the paper's GEOQA, CV-Bench and LISA rows' settings on Qwen3-VL (not paper rows).
Each resolves to GPG with the model changed, says it is not a paper row, and states for Qwen3-VL-2B/4B/8B the verdict
and peak that ``mmgpg plan`` gives on 2 x 80 GiB (and, where it does not fit, the fixes and their peaks)."""

from __future__ import annotations

import re

import pytest

from mmgpg.cli import main
from mmgpg.config import builtin_config_dir, resolve
from mmgpg.models.tiny import save_config_only

RECIPES = builtin_config_dir() / "recipe"
# name: (the paper row it follows, the placeholder its data key needs to resolve)
FAMILY_RECIPES = {"qwen3_vl_geoqa_gpg": ("geoqa_gpg", []),
                  "qwen3_vl_cv_bench_gpg": ("cv_bench_gpg", ["task.train_data=/placeholder/SAT_train_15000.json"]),
                  "qwen3_vl_lisa_grounding_gpg": ("lisa_grounding_gpg", ["task.data_root=/placeholder/ReasonSeg"])}
SIZES = {"Qwen3-VL-2B": "shape_true", "Qwen3-VL-4B": "shape_true_4b", "Qwen3-VL-8B": "shape_true_8b"}


def header(name: str) -> str:
    return "\n".join(line for line in (RECIPES / f"{name}.yaml").read_text().splitlines() if line.startswith("#"))


@pytest.mark.parametrize("name", sorted(FAMILY_RECIPES))
def test_recipe_is_the_paper_rows_algorithm_on_qwen3_vl(name):
    paper, data = FAMILY_RECIPES[name]
    cfg = resolve([f"recipe={name}", *data]).config
    row = resolve([f"recipe={paper}", *data]).config
    assert cfg.model.name_or_path == "Qwen/Qwen3-VL-4B-Instruct"
    assert cfg.algo == row.algo == resolve(["algo=gpg"]).config.algo
    assert (cfg.rollout.group_size, cfg.train.prompts_per_step, cfg.train.learning_rate) == (8, row.train.prompts_per_step,
                                                                                            1e-6)
    assert (cfg.train.backend, cfg.train.zero_stage, cfg.train.gradient_checkpointing) == ("deepspeed", 3, True)
    assert (cfg.model.max_pixels, cfg.model.max_prompt_length) == (row.model.max_pixels, row.model.max_prompt_length)
    text = header(name)
    assert "NOT a row of the GPG paper" in text and f"(recipe={paper})" in text
    assert re.search(rf"torchrun --nproc_per_node 2 -m mmgpg train recipe={name}\b", text)


def test_task_options_follow_the_family():
    lisa = resolve(["recipe=qwen3_vl_lisa_grounding_gpg", "task.data_root=/x"]).config
    assert lisa.task.options["box_format"] == "norm1000"  # Qwen3-VL's 0-1000 grid
    cv = resolve(["recipe=qwen3_vl_cv_bench_gpg", "task.train_data=/x.json"]).config
    assert cv.task.options["prompt_style"] == "instruct"  # no base Qwen3-VL checkpoint


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen3_vl_shapes")
    return {label: save_config_only(root / size, "qwen3_vl", size) for label, size in SIZES.items()}




@pytest.mark.parametrize("name", sorted(FAMILY_RECIPES))
@pytest.mark.parametrize("label", sorted(SIZES))
def test_header_states_the_planner_verdict_for_each_size(name, label, shapes, capsys):
    args = ["plan", f"recipe={name}", f"model.name_or_path={shapes[label]}", *FAMILY_RECIPES[name][1],
            "--gpu-memory-gb", "80"]
    code = main([*args, "--gpus", "2"])
    out = capsys.readouterr().out
    peak = re.search(r"^peak = .*?([0-9.]+)$", out, re.M).group(1)
    verdict = "fits (exit 0)" if code == 0 else "DOES NOT FIT (exit 1)"
    assert f"#   {label} -> {verdict}: peak {peak} GiB" in header(name), out
    if code:  # the fixes the header names, each planned
        assert main([*args, "--gpus", "4"]) == 0
        four = re.search(r"^peak = .*?([0-9.]+)$", capsys.readouterr().out, re.M).group(1)
        assert main([*args, "--gpus", "2", "train.offload_optimizer=true"]) == 0
        offload = re.search(r"^peak = .*?([0-9.]+)$", capsys.readouterr().out, re.M).group(1)
        assert f"fits on 4 GPUs (peak {four}) or with train.offload_optimizer=true (peak {offload}," in header(name)
