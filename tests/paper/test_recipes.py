"""configs/recipe/*.yaml, the GPG paper's multimodal rows: each resolves, names its anchor script and run command in
its header, carries the anchor's hyper-parameters (an independent table below, copied from
docs/anchors.md §2.5, §3.5, §4.5, §5.5), and gets the planner verdict its header states on the
authors' hardware (2 GPUs; 80 GiB assumed, the anchors do not state the GPU)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mmgpg.cli import main
from mmgpg.config import builtin_config_dir, resolve
from mmgpg.models.tiny import save_config_only

RECIPES = builtin_config_dir() / "recipe"

# name: (anchor script, model, family, ZeRO stage, prompts per step, completion tokens, gradient checkpointing,
#        max_steps, planner exit code on 2 x 80 GiB)
# max_steps: epochs x training items / prompts per step where the anchors state the item count (classification:
# 408/148/400/784 items x 8/24/8/8 epochs / 4); cv_bench, geoqa and lisa are bounds/estimates explained in the headers.
ANCHORS = {
    "cv_bench_gpg": ("GPG:VisualThinker-R1-Zero/src/open-r1-multimodal/run_grpo_SAT.sh", "Qwen/Qwen2-VL-2B",
                     "qwen2_vl", 2, 2, 700, True, 15000, 0),
    "geoqa_gpg": ("GPG:R1-V/src/scripts/run_grpo_GEOQA_qwen2.5_3b.sh", "Qwen/Qwen2.5-VL-3B-Instruct",
                  "qwen2_5_vl", 3, 4, 256, False, 2000, 1),
    "flower102_4shot_gpg": ("GPG:Visual-RFT/src/scripts/2B_flower_4_shot.sh", "Qwen/Qwen2-VL-2B-Instruct",
                            "qwen2_vl", 3, 4, 256, False, 816, 0),
    "pets37_4shot_gpg": ("GPG:Visual-RFT/src/scripts/2B_pets37_4_shot.sh", "Qwen/Qwen2-VL-2B-Instruct",
                         "qwen2_vl", 3, 4, 256, False, 888, 0),
    "fgvc_aircraft_4shot_gpg": ("GPG:Visual-RFT/src/scripts/2B_aircraft_4_shot.sh", "Qwen/Qwen2-VL-2B-Instruct",
                                "qwen2_vl", 3, 4, 256, False, 800, 0),
    "cars196_4shot_gpg": ("GPG:Visual-RFT/src/scripts/2B_car196_4_shot.sh", "Qwen/Qwen2-VL-2B-Instruct",
                          "qwen2_vl", 3, 4, 256, False, 1568, 0),
    "lisa_grounding_gpg": ("GPG:Visual-RFT/src/scripts/2B_lisa_grounding.sh", "Qwen/Qwen2-VL-2B-Instruct",
                           "qwen2_vl", 3, 4, 256, True, 359, 0),
}
# Placeholders for the keys a task needs before it can load data (resolution itself does not read data).
DATA = {"lisa_grounding_gpg": ["task.data_root=/placeholder/ReasonSeg"],
        "cv_bench_gpg": ["task.train_data=/placeholder/SAT_train_15000.json"]}


def header(name: str) -> str:
    lines = (RECIPES / f"{name}.yaml").read_text().splitlines()
    return "\n".join(line for line in lines if line.startswith("#"))


def test_every_recipe_file_is_in_the_table():
    math_rows = ["gpg_7b", "gpg_rs1", "gpg_rs3", "simplerl_math7b_gpg"]  # the unimodal rows: test_math_recipes.py
    from tests.unit.config.test_family_recipes import FAMILY_RECIPES  # not paper rows: Qwen3-VL
    from tests.unit.config.test_video_recipe import VIDEO_RECIPES  # not a paper row: Video-R1's data

    assert sorted(p.stem for p in RECIPES.glob("*.yaml")) == sorted([*ANCHORS, *math_rows, *FAMILY_RECIPES,
                                                                     *VIDEO_RECIPES])


@pytest.mark.parametrize("name", sorted(ANCHORS))
def test_recipe_resolves_with_the_anchor_values(name):
    script, model, _, stage, pps, completion, gc, steps, _ = ANCHORS[name]
    cfg = resolve([f"recipe={name}", *DATA.get(name, [])]).config
    assert (cfg.model.name_or_path, cfg.train.backend, cfg.train.zero_stage) == (model, "deepspeed", stage)
    assert not (cfg.train.offload_optimizer or cfg.train.offload_params)
    assert (cfg.train.prompts_per_step, cfg.train.micro_batch_prompts, cfg.rollout.group_size) == (pps, 1, 8)
    assert (cfg.rollout.max_new_tokens, cfg.model.max_prompt_length) == (completion, 1024)
    assert (cfg.train.gradient_checkpointing, cfg.train.max_steps) == (gc, steps)
    assert (cfg.train.learning_rate, cfg.train.lr_scheduler, cfg.train.warmup_steps) == (1e-6, "linear", 0)
    assert (cfg.model.max_pixels, cfg.model.min_pixels) == (401408, 3136)
    # GPG as the multimodal anchors run it (pg_name=gpg, adjust_gd=true, min_inverse_alpha=0.4): configs/algo/gpg.yaml.
    gpg = resolve(["algo=gpg"]).config.algo
    assert cfg.algo == gpg
    # Groups apply in command-line order: a later algo= replaces the recipe's algorithm, the rest stays.
    grpo = resolve([f"recipe={name}", "algo=grpo", *DATA.get(name, [])]).config
    assert grpo.algo == resolve(["algo=grpo"]).config.algo and grpo.train == cfg.train


@pytest.mark.parametrize("name", sorted(ANCHORS))
def test_recipe_header_names_anchor_command_and_plan(name):
    script, *_ = ANCHORS[name]
    text = header(name)
    assert f"# Anchor script: {script}" in text
    assert re.search(rf"torchrun --nproc_per_node 2 -m mmgpg train recipe={name}\b", text)
    assert f"mmgpg plan recipe={name} --gpus 2 --gpu-memory-gb 80" in text


@pytest.fixture(scope="module")
def shape_true(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("recipe_models")
    return {fam: save_config_only(root / fam, fam, "shape_true") for fam in ("qwen2_vl", "qwen2_5_vl")}


@pytest.mark.parametrize("name", sorted(ANCHORS))
def test_planner_verdict_on_the_authors_gpus_is_the_one_the_header_states(name, shape_true, capsys):
    *_, family, _, _, _, _, _, expected = ANCHORS[name]
    code = main(["plan", f"recipe={name}", f"model.name_or_path={shape_true[family]}", *DATA.get(name, []),
                 "--gpus", "2", "--gpu-memory-gb", "80"])
    out = capsys.readouterr().out
    assert code == expected, out
    verdict = "fits (exit 0)" if code == 0 else "DOES NOT FIT (exit 1)"
    assert f"-> {verdict}" in header(name)
    peak = re.search(r"^peak = .*?([0-9.]+)$", out, re.M).group(1)
    assert f"peak {peak} GiB" in header(name), (peak, header(name))
