"""The math family end to end on the tiny text model (issue: text policies and the paper's unimodal rows): `mmgpg
train task=math` under the plain backend with LoRA and under DeepSpeed ZeRO-2 and ZeRO-3 on 2 gloo ranks (full
fine-tuning; LoRA under DeepSpeed is in tests/unit/backends/test_deepspeed.py and the HF-engine matrix), each followed by the sampled
evaluation of its checkpoint, `mmgpg eval --task math_500 --samples 4`. The vLLM engine's runs of the same are in
tests/integration/test_vllm.py (the separate vLLM environment)."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest
from support import REPO, run_mmgpg

DATA = REPO / "tests" / "support" / "math_data"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
TRAIN = ["model=tiny_qwen2", "task=math", f"task.train_data={DATA / 'math_train.jsonl'}", "model.max_prompt_length=512",
         "train.max_steps=2", "rollout.group_size=2", "rollout.max_new_tokens=8", "train.prompts_per_step=2",
         "train.micro_batch_prompts=1", "train.progress=false", "train.tensorboard=false", "train.save_every=1",
         "train.learning_rate=1e-3"]
needs_deepspeed = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="deepspeed is not "
                                     "installed (pip install 'mmgpg[deepspeed]')")


def run(*args: str, ranks: int = 1):
    return run_mmgpg(*args, ranks=ranks, env=ENV)


def train_then_sampled_eval(tmp_path, extra: list[str], ranks: int) -> dict:
    out = tmp_path / "run"
    run("train", *TRAIN, *extra, f"output_dir={out}", ranks=ranks)
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in steps if m.get("step", 0) > 0 and "reward/total" in m]
    assert [m["step"] for m in steps] == [1, 2]
    assert all(m["gpg/num_samples"] == 4 for m in steps)  # 2 prompts x G=2 per step, over all ranks
    ev = tmp_path / "eval"
    run("eval", "--task", "math_500", f"task.data={DATA / 'math_500.jsonl'}", "--ckpt", str(out), "--limit", "3",
        "--samples", "4", "--temperature", "1.0", "--max-new-tokens", "8", "--output", str(ev))
    metrics = json.loads((ev / "metrics.json").read_text())
    rows = [json.loads(line) for line in (ev / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 12 and sorted({r["sample"] for r in rows}) == [0, 1, 2, 3]
    assert {"pass@1", "pass@2", "pass@4"} <= metrics["metrics"].keys()
    return metrics


def test_plain_lora_train_then_sampled_eval(tmp_path):
    metrics = train_then_sampled_eval(tmp_path, ["model.lora.rank=4"], ranks=1)
    assert (tmp_path / "run" / "final").exists() or any((tmp_path / "run" / "checkpoints").iterdir())
    assert 0.0 <= metrics["metrics"]["pass@1"] <= 1.0


@needs_deepspeed
@pytest.mark.distributed
@pytest.mark.parametrize("stage", [2, pytest.param(3, marks=pytest.mark.slow)])
def test_deepspeed_train_on_two_ranks_then_sampled_eval(tmp_path, stage):
    metrics = train_then_sampled_eval(tmp_path, ["train.backend=deepspeed", f"train.zero_stage={stage}"], ranks=2)
    done = json.loads((tmp_path / "run" / "checkpoints" / "step-00000002" / "COMPLETE").read_text())
    assert done["world_size"] == 2
    assert 0.0 <= metrics["metrics"]["pass@1"] <= 1.0
