"""A text-only policy (the tiny Qwen2, ``model.name_or_path=tiny:qwen2``) through the real commands: ``mmgpg train``
(GPG and GRPO, whose reference is a second text model), ``mmgpg eval`` of its checkpoint, ``mmgpg sft``, LoRA,
``mmgpg check``, ``mmgpg model tiny --family qwen2`` / ``model info``, and the clear errors for vision settings."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from support import FIXTURE_TASKS, REPO, run_mmgpg

from mmgpg.config import ConfigError, resolve
from mmgpg.train.trainer import Trainer

TASK = f"task={FIXTURE_TASKS}:TextParity"
TEXT = ["model.name_or_path=tiny:qwen2", "model.dtype=float32", "model.max_prompt_length=256", "rollout.group_size=4",
        "rollout.max_new_tokens=12", "train.prompts_per_step=4", "train.micro_batch_prompts=2",
        "train.learning_rate=1e-3", "train.progress=false", "train.tensorboard=false"]


mmgpg = run_mmgpg


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("algo", ["gpg", pytest.param("grpo", marks=pytest.mark.slow)])  # GRPO on text: --runslow
def test_train_two_steps_then_evaluate_the_checkpoint(tmp_path, algo):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run = tmp_path / algo
    mmgpg("train", f"algo={algo}", TASK, *TEXT, "train.max_steps=2", f"output_dir={run}")
    metrics = rows(run / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(m["grad_norm"] > 0 and {"reward/accuracy", "reward/length_parity"} <= m.keys() for m in metrics)
    if algo == "grpo":  # the reference is the text model itself before the first update
        assert metrics[0]["loss/kl"] == 0.0 and metrics[1]["loss/kl"] > 0
    policy = run / "checkpoints" / "step-00000002" / "policy"
    assert not (policy / "processor_config.json").exists()  # a text model's folder: model and tokenizer
    model = AutoModelForCausalLM.from_pretrained(policy)
    assert type(model).__name__ == "Qwen2ForCausalLM" and AutoTokenizer.from_pretrained(policy).chat_template
    records = rows(run / "prompt_success.jsonl")
    assert {r["step"] for r in records} == {1, 2}
    pairs = [(s, total) for r in records for s, total in zip(r["success"], r["rewards"])]
    assert all(s == 0 or total >= 1 for s, total in pairs)  # success = the right word (accuracy 1) ...
    assert any(s == 0 and total >= 1 for s, total in pairs)  # ... not the length-parity reward

    out = tmp_path / "eval"
    mmgpg("eval", "--task", f"{FIXTURE_TASKS}:TextParity", "--ckpt", str(run), "--limit", "4", "--batch-size", "2",
          "--max-new-tokens", "12", "--output", str(out))
    preds = rows(out / "predictions.jsonl")
    assert [p["id"] for p in preds] == [f"text-parity-test-{i}" for i in range(4)]
    assert all(set(p["rewards"]) == {"accuracy", "length_parity"} and p["correct"] == p["rewards"]["accuracy"]
               for p in preds)
    assert json.loads((out / "metrics.json").read_text())["metrics"]["num_samples"] == 4


def test_sft_learns_the_gold_answers_and_evaluates(tmp_path):
    run = tmp_path / "sft"
    mmgpg("sft", TASK, "model.name_or_path=tiny:qwen2", "model.dtype=float32", "sft.max_steps=12", "sft.batch_size=8",
          "sft.learning_rate=3e-3", "train.eval_limit=4", "rollout.max_new_tokens=8", f"output_dir={run}")
    metrics = rows(run / "metrics.jsonl")
    assert metrics[-1]["loss/sft"] < metrics[0]["loss/sft"] * 0.5  # "<answer>even</answer><|im_end|>" is learnt
    assert metrics[-1]["eval/num_samples"] == 4
    assert (run / "final" / "model.safetensors").exists()


def test_lora_trains_only_the_adapters_of_the_text_layers(tmp_path):
    trainer = Trainer(resolve(["algo=gpg", TASK, *TEXT, "model.lora.rank=4", "model.lora.trainable_modules=[lm_head]",
                               "train.learning_rate=1e-2", "train.max_steps=2", "algo.min_valid_fraction=0",
                               f"output_dir={tmp_path / 'lora'}"]))
    model = trainer.policy.model
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer.train()
    after = dict(model.named_parameters())
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    assert changed and all("lora_" in n or "modules_to_save" in n for n in changed)
    assert any(".lora_B." in n and n.startswith("model.layers.") for n in changed)
    adapter = tmp_path / "lora" / "checkpoints" / "step-00000002" / "adapter" / "adapter_config.json"
    targets = json.loads(adapter.read_text())["target_modules"]
    # The saved target is the regex PEFT matched with: the text layers' projections, nothing else.
    assert re.fullmatch(targets, "model.layers.0.self_attn.q_proj") and re.fullmatch(targets, "model.layers.1.mlp.down_proj")
    assert not re.fullmatch(targets, "lm_head") and not re.fullmatch(targets, "model.embed_tokens")


def test_vision_settings_on_a_text_model_are_clear_errors(tmp_path):
    with pytest.raises(ConfigError, match="train.freeze_vision.*qwen2 model is text-only"):
        Trainer(resolve([TASK, *TEXT, "train.freeze_vision=true", f"output_dir={tmp_path / 'a'}"]))
    with pytest.raises(ValueError, match="model.lora.vision=True.*qwen2 model is text-only"):
        Trainer(resolve([TASK, *TEXT, "model.lora.rank=4", "model.lora.vision=true", f"output_dir={tmp_path / 'b'}"]))
    image_task = mmgpg("sample", "--prompts", "1", "task=shapes", *TEXT, f"output_dir={tmp_path / 'c'}", check=False)
    assert image_task.returncode != 0 and "text-only model" in image_task.stderr


def test_check_counts_text_tokens_only():
    from mmgpg.evaluation.preflight import preflight

    findings = preflight(resolve([TASK, *TEXT]).config, examples=2)
    prompts = [f for f in findings if f.check.startswith("prompt ")]
    assert len(prompts) == 2 and all(f.status == "ok" and "image" not in f.detail for f in prompts)
    assert any(f.check.startswith("gold answer") and f.status == "ok" for f in findings)


def test_model_tiny_qwen2_then_info(tmp_path):
    out = mmgpg("model", "tiny", "--family", "qwen2", "--out", str(tmp_path / "m")).stdout
    assert "built tiny qwen2" in out and "text-only" in out
    info = json.loads(mmgpg("model", "info", str(tmp_path / "m")).stdout)
    assert info["model_type"] == "qwen2" and info["policy"] == "TextPolicy" and info["vocab_size"] == 1024
    assert info["eos_token_ids"] == [2, 0] and info["layers"] == 2
    assert not {"vision_depth", "image_token_id"} & set(info) and set(info["parameters"]) == {"total"}


@pytest.mark.parametrize("size, total, hidden", [
    # Published parameter counts of the checkpoints (hub model cards / safetensors metadata): DeepSeek-R1-Distill-
    # Qwen-1.5B 1,777,088,000 (untied head); Qwen2.5-Math-7B = Qwen2.5-7B 7,615,616,512.
    ("shape_true", 1_777_088_000, 1536),
    ("shape_true_7b", 7_615_616_512, 3584),
])
def test_text_shape_true_configs_have_the_paper_models_sizes(tmp_path, size, total, hidden):
    """`model tiny --family qwen2 --size ... --config-only` writes the real text models' shapes, and `model info`
    reads a config-only directory (meta device, no weights needed)."""
    mmgpg("model", "tiny", "--family", "qwen2", "--size", size, "--config-only", "--out", str(tmp_path / "m"))
    info = json.loads(mmgpg("model", "info", str(tmp_path / "m")).stdout)
    assert info["parameters"]["total"] == total and info["hidden_size"] == hidden and info["layers"] == 28


def test_the_model_group_selects_the_tiny_text_model():
    cfg = resolve(["model=tiny_qwen2"], config_dirs=[REPO / "configs"]).config
    assert cfg.model.name_or_path == "tiny:qwen2" and cfg.model.dtype == "float32"
