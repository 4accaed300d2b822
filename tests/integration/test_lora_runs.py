"""LoRA runs through the CLI: a GRPO run (reference = adapter off) killed and resumed equals the uninterrupted run;
its checkpoints hold the PEFT adapter and a merged policy/ that `mmgpg eval --ckpt` reads (run dir or policy dir);
an SFT run with LoRA stopped and continued equals the straight one."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from support.faults_support import kill_after_checkpoint
from test_trainer import FIXTURES, TINY, _comparable, read_metrics, run_cli

LORA = ["model.lora.rank=4", "model.lora.trainable_modules=[lm_head]", "train.learning_rate=1e-2"]


def _adapter(run: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(run / "checkpoints" / f"step-{step:08d}" / "adapter" / "adapter_model.safetensors")


def test_lora_grpo_resume_after_sigkill_is_exact_and_checkpoints_evaluate(tmp_path):
    args = ["train", "algo=grpo", f"task={FIXTURES}:ParityShapes", *TINY, *LORA, "train.max_steps=4",
            "train.save_every=1", "train.keep_last=10", "algo.min_valid_fraction=0.5", "algo.max_resample_attempts=3"]
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    run_cli(*args, f"output_dir={straight}")
    kill_after_checkpoint([sys.executable, "-m", "mmgpg", *args, f"output_dir={killed}"], killed)
    assert "step-00000004" not in [p.name for p in (killed / "checkpoints").iterdir()]
    run_cli(*args, f"output_dir={killed}", "train.resume=true")

    a, b = _adapter(straight, 4), _adapter(killed, 4)
    assert a.keys() == b.keys() and any("lora_B" in k for k in a) and any(k.endswith("lm_head.weight") for k in a)
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-6, rtol=0)
    ma, mb = _comparable(read_metrics(straight)), _comparable(read_metrics(killed))
    assert [m["step"] for m in mb] == [1, 2, 3, 4]
    for x, y in zip(ma, mb):
        for k in x:
            assert x[k] == pytest.approx(y[k], rel=1e-5, abs=1e-6), (x["step"], k)
    # The reference is the base model (adapter off): KL is exactly 0 before the first update, then positive.
    assert ma[0]["loss/kl"] == 0.0 and ma[-1]["loss/kl"] > 0 and any(m["grad_norm"] > 0 for m in ma)

    policy = straight / "checkpoints" / "step-00000004" / "policy"
    merged = load_file(policy / "model.safetensors")
    assert not any("lora" in k or "base_layer" in k or "modules_to_save" in k for k in merged)
    outputs = []
    for ckpt in (straight, policy):  # a LoRA run directory (its latest checkpoint) and its merged policy
        out = tmp_path / f"eval-{len(outputs)}"
        run_cli("eval", "--task", f"{FIXTURES}:ParityShapes", "--ckpt", str(ckpt), "--limit", "4", "--batch-size", "2",
                "--max-new-tokens", "12", "--output", str(out), "model.max_pixels=12544")
        outputs.append([json.loads(x)["model_output"] for x in (out / "predictions.jsonl").read_text().splitlines()])
    assert outputs[0] == outputs[1] and len(outputs[0]) == 4


def test_lora_sft_stopped_and_continued_equals_the_straight_run(tmp_path):
    sft = ["sft", "task=shapes", "model=tiny", "sft.batch_size=4", "sft.learning_rate=1e-2", "model.lora.rank=4",
           "sft.save_every=2", "train.eval_limit=2", "rollout.max_new_tokens=8"]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    run_cli(*sft, "sft.max_steps=4", f"output_dir={straight}")
    run_cli(*sft, "sft.max_steps=2", f"output_dir={resumed}")
    run_cli(*sft, "sft.max_steps=4", f"output_dir={resumed}", "train.resume=true")
    a = load_file(straight / "final_adapter" / "adapter_model.safetensors")
    b = load_file(resumed / "final_adapter" / "adapter_model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert any(float(v.abs().sum()) > 0 for k, v in a.items() if "lora_B" in k), "SFT trained the adapter"
    losses = [[m["loss/sft"] for m in read_metrics(r)] for r in (straight, resumed)]
    assert losses[0] == losses[1] and len(losses[0]) == 4
    assert (straight / "final" / "model.safetensors").exists()
