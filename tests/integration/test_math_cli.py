"""The math family through the real CLI on the tiny text model and the offline fixtures (tests/support/math_data):
``mmgpg eval --task math_500`` of a checkpoint, re-judging written outputs with ``--predictions`` under both
protocols, and one ``mmgpg train`` step of ``task=math`` whose logged rewards are the weighted recipe rewards."""

from __future__ import annotations

import json
import os

from support import REPO, run_mmgpg

DATA = REPO / "tests" / "support" / "math_data"


def mmgpg(*args: str):
    return run_mmgpg(*args, env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})


def test_eval_math_500_then_rejudge_written_outputs(tmp_path):
    out = tmp_path / "eval"
    mmgpg("eval", "--task", "math_500", f"task.data={DATA / 'math_500.jsonl'}", "--ckpt", "tiny:qwen2", "--limit", "4",
          "--max-new-tokens", "8", "--output", str(out))
    records = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(records) == 4 and {"correct", "extracted", "parse_failure", "gold_answer", "kind"} <= records[0].keys()
    metrics = json.loads((out / "metrics.json").read_text())
    assert 0.0 <= metrics["metrics"]["accuracy"] <= 1.0
    # the same rows with written outputs: right, right but unboxed (paper only), wrong
    outputs = ["Therefore, the final answer is: $\\boxed{\\frac{5}{6}}$. I hope it is correct",
               "So $x = 4$.", "The answer is $\\boxed{(-3, 4)}$", "$\\boxed{\\sqrt{50}}$"]
    written = tmp_path / "written.jsonl"
    written.write_text("".join(json.dumps({**r, "model_output": o}) + "\n" for r, o in zip(records, outputs)))
    for protocol, want in [("paper", [1.0, 1.0, 0.0, 1.0]), ("strict", [1.0, 0.0, 0.0, 1.0])]:
        rejudged = tmp_path / protocol
        mmgpg("eval", "--task", "math_500", "--predictions", str(written), "--protocol", protocol,
              "--output", str(rejudged))
        got = [json.loads(line)["correct"] for line in (rejudged / "predictions.jsonl").read_text().splitlines()]
        assert got == want, protocol


def test_train_one_step_on_the_open_rs_recipe_rewards(tmp_path):
    run = tmp_path / "run"
    mmgpg("train", "model=tiny_qwen2", "task=math", f"task.train_data={DATA / 'math_train.jsonl'}",
          "task.reward_protocol=paper", "model.max_prompt_length=512", "train.max_steps=1", "rollout.group_size=2",
          "rollout.max_new_tokens=8", "train.prompts_per_step=2", "train.micro_batch_prompts=2",
          "train.progress=false", "train.tensorboard=false", f"output_dir={run}")
    (metrics,) = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert {"reward/format", "reward/cosine"} <= metrics.keys() and "reward/accuracy" not in metrics
    assert abs(metrics["reward/total"] - metrics["reward/format"] - metrics["reward/cosine"]) < 1e-9
    # random 8-token outputs are wrong: cosine (weight 2) lies in 2 x [-0.5, 0]
    assert -1.0 <= metrics["reward/cosine"] <= 0.0
