"""configs/recipe/{gpg_rs1,gpg_rs3,gpg_7b,simplerl_math7b_gpg}.yaml, the GPG paper's unimodal (math) rows: each
resolves with the anchor's hyper-parameters (the independent table below, read off the authors' files
GPG:open-rs/recipes/gpg.yaml, GPG:open-rs/train.sh, GPG:open-r1/train.sh and
GPG:open-r1/recipes/Qwen2.5-Math-7B/grpo/config_simple_rl*.yaml), names its anchor, run command and plan in its header,
and gets the planner verdict the header states (80 GiB GPUs assumed: the anchors do not state the GPU)."""

from __future__ import annotations

import re

import pytest

from mmgpg.cli import main
from mmgpg.config import builtin_config_dir, resolve
from mmgpg.models.tiny import save_config_only

RECIPES = builtin_config_dir() / "recipe"

# name: (anchor, model, shape-true size, GPUs, dataset, reward funcs, weights, G, prompts per step, micro-batch
#        prompts, max prompt, max completion, temperature, lr, scheduler, warmup, max_steps, advantage, alpha, beta_th)
MATH = {
    "gpg_rs1": ("GPG:open-rs/recipes/gpg.yaml", "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", "shape_true", 16,
                "open_s1", ["format", "cosine"], [1.0, 2.0], 6, 64, 1, 512, 3584, 0.7, 1e-6, "cosine_with_min_lr",
                10, 100, "group_zscore", False, 0.0),
    "gpg_rs3": ("GPG:open-rs/recipes/gpg.yaml", "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", "shape_true", 16,
                "open_rs", ["format", "cosine"], [1.0, 2.0], 6, 64, 1, 512, 3584, 0.7, 1e-6, "cosine_with_min_lr",
                10, 100, "group_zscore", False, 0.0),
    "gpg_7b": ("GPG:open-r1/train.sh", "Qwen/Qwen2.5-Math-7B", "shape_true_7b", 8, "simplelr_level3to5",
               ["accuracy"], [1.0], 8, 32, 1, 768, 2048, 1.0, 1e-6, "constant", 38, 1250, "group_mean", True, 0.5),
    "simplerl_math7b_gpg": ("GPG:open-r1/recipes/Qwen2.5-Math-7B/grpo/config_simple_rl_gpg.yaml",
                            "Qwen/Qwen2.5-Math-7B", "shape_true_7b", 8, "math_lighteval", ["accuracy"], [1.0], 8, 64,
                            2, 512, 1024, 1.0, 2e-6, "constant", 12, 117, "group_mean", True, 0.6),
}


def header(name: str) -> str:
    return "\n".join(line for line in (RECIPES / f"{name}.yaml").read_text().splitlines() if line.startswith("#"))


@pytest.mark.parametrize("name", sorted(MATH))
def test_math_recipe_resolves_with_the_anchor_values(name):
    (_, model, _, _, dataset, funcs, weights, g, pps, mbp, prompt, completion, temperature, lr, sched, warmup, steps,
     advantage, alpha, beta) = MATH[name]
    cfg = resolve([f"recipe={name}"]).config
    assert (cfg.model.name_or_path, cfg.model.max_prompt_length) == (model, prompt)
    assert (cfg.train.backend, cfg.train.zero_stage, cfg.train.gradient_checkpointing) == ("deepspeed", 2, True)
    assert cfg.task.name == "math" and cfg.task.options["dataset"] == dataset
    assert (cfg.task.options["reward_funcs"], cfg.task.options["reward_weights"]) == (funcs, weights)
    assert (cfg.rollout.group_size, cfg.rollout.max_new_tokens, cfg.rollout.temperature) == (g, completion, temperature)
    assert (cfg.train.prompts_per_step, cfg.train.micro_batch_prompts, cfg.train.max_steps) == (pps, mbp, steps)
    assert (cfg.train.learning_rate, cfg.train.lr_scheduler, cfg.train.warmup_steps) == (lr, sched, warmup)
    if sched == "cosine_with_min_lr":
        assert cfg.train.min_lr_rate == 0.1
    a = cfg.algo
    assert (a.advantage, a.token_loss, a.kl_coef, a.aggregation) == (advantage, "reinforce", 0.0, "token_mean")
    assert (a.alpha_correction, a.min_valid_fraction) == (alpha, beta)
    assert cfg.seed == 42


@pytest.mark.parametrize("name", sorted(MATH))
def test_math_recipe_header_names_anchor_command_and_plan(name):
    anchor, _, _, gpus, *_ = MATH[name]
    text = header(name)
    assert anchor in text.split("# Anchor script: ", 1)[1].splitlines()[0]
    assert re.search(rf"-m mmgpg train recipe={name}\b", text)
    assert f"mmgpg plan recipe={name} --gpus {gpus} --gpu-memory-gb 80" in text
    assert "mmgpg eval --task" in text and "--temperature 0.6 --top-p 0.95" in text


@pytest.fixture(scope="module")
def shape_true(tmp_path_factory):
    root = tmp_path_factory.mktemp("math_recipe_models")
    return {size: save_config_only(root / size, "qwen2", size) for size in ("shape_true", "shape_true_7b")}


@pytest.mark.parametrize("name", sorted(MATH))
def test_math_planner_verdict_is_the_one_the_header_states(name, shape_true, capsys):
    _, _, size, gpus, *_ = MATH[name]
    code = main(["plan", f"recipe={name}", f"model.name_or_path={shape_true[size]}", "--gpus", str(gpus),
                 "--gpu-memory-gb", "80"])
    out = capsys.readouterr().out
    verdict = "fits (exit 0)" if code == 0 else "DOES NOT FIT (exit 1)"
    assert f"-> {verdict}" in header(name), out
    peak = re.search(r"^peak = .*?([0-9.]+)$", out, re.M).group(1)
    assert f"peak {peak} GiB" in header(name), (peak, header(name))
