"""SFT, evaluation, plots and the demo through the real CLI on the tiny model (short budgets)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support import FIXTURE_TASKS

from mmgpg.evaluation.run import evaluate
from mmgpg.models.load import load_policy
from mmgpg.rollout.hf import HFEngine
from mmgpg.task import build_task
from mmgpg.train.sft import gold_rollout


def mmgpg(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "mmgpg", *args], capture_output=True, text=True, timeout=900)
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def test_gold_rollout_scores_the_gold_answer_tokens(tiny_dirs):
    policy = load_policy(str(tiny_dirs["qwen2_vl"]), dtype="float32", min_pixels=3136, max_pixels=12544, device="cpu")
    task = build_task("shapes")
    examples = list(task.load("train")[:3])
    rollout = gold_rollout(policy, task, examples)
    tok = policy.processor.tokenizer
    for i, ex in enumerate(examples):
        n = int(rollout.completion_mask[i].sum())
        text = tok.decode(rollout.completion_ids[i, :n])
        assert text == task.gold_completion(ex) + "<|im_end|>"


def test_sft_lowers_the_loss_and_the_result_evaluates(tmp_path):
    run = tmp_path / "sft"
    out = mmgpg("sft", "task=shapes", "model=tiny", "sft.max_steps=8", "sft.batch_size=8", "sft.learning_rate=3e-3",
                "train.eval_limit=6", "rollout.max_new_tokens=24", f"output_dir={run}").stdout
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["loss/sft"] < rows[0]["loss/sft"] * 0.8
    assert "eval/accuracy" in rows[-1] and rows[-1]["eval/num_samples"] == 6
    assert "fine-tuned model:" in out
    ev = tmp_path / "ev"
    mmgpg("eval", "--task", "shapes", "--ckpt", str(run / "final"), "--limit", "5", "--batch-size", "2",
          "--max-new-tokens", "24", "--output", str(ev))
    preds = [json.loads(x) for x in (ev / "predictions.jsonl").read_text().splitlines()]
    assert [p["id"] for p in preds] == [f"shapes-test-{i}" for i in range(5)]
    assert all({"model_output", "ground_truth", "rewards", "correct", "extracted"} <= p.keys() for p in preds)
    meta = json.loads((ev / "metrics.json").read_text())
    assert meta["task"] == "shapes" and meta["metrics"]["num_samples"] == 5
    assert meta["metrics"]["accuracy"] == pytest.approx(sum(p["rewards"]["accuracy"] for p in preds) / 5)
    assert meta["protocol"] == "paper" and meta["counts"]["evaluated"] == 5


def test_evaluation_is_greedy_and_deterministic(tiny_dirs):
    policy = load_policy(str(tiny_dirs["qwen2_vl"]), dtype="float32", min_pixels=3136, max_pixels=12544, device="cpu")
    task = build_task("shapes")
    items = list(task.load("test")[:4])
    engine = HFEngine(policy)
    a = evaluate(engine, task, items, batch_size=3, max_new_tokens=10)[1]
    b = evaluate(engine, task, items, batch_size=4, max_new_tokens=10)[1]
    assert [r["model_output"] for r in a] == [r["model_output"] for r in b]
    with pytest.raises(ValueError):
        evaluate(engine, task, items, batch_size=0)
    assert task.aggregate([]) == {}


def test_demo_quick_end_to_end_and_plot(tmp_path):
    out = tmp_path / "demo"
    text = mmgpg("demo", "--quick", "--output", str(out)).stdout
    assert "| after SFT (before gpg) |" in text and "| after gpg (2 steps) |" in text
    assert "sampled accuracy (mean of 2, T=1)" in text
    summary = json.loads((out / "summary.json").read_text())
    assert 0 <= summary["accuracy_before"] <= 1 and 0 <= summary["accuracy_after"] <= 1
    assert [s for s, _ in summary["eval_curve"]] == [0, 1, 2]
    pngs = {p.name for p in (out / "plots").iterdir()}
    # α is undefined (null) on a step whose groups all have zero variance; its panel exists when some step had one.
    rows = [json.loads(x) for x in (out / "gpg" / "metrics.jsonl").read_text().splitlines()]
    with_alpha = any(r.get("gpg/alpha") is not None for r in rows)
    expected = {"reward.png", "valid.png", "evaluation.png", "training.png"} | ({"alpha.png"} if with_alpha else set())
    assert expected <= pngs and ("alpha.png" in pngs) == with_alpha
    listed = mmgpg("plot", str(out / "gpg"), "--out", str(tmp_path / "again")).stdout.split()
    assert len(listed) == len(expected) and all(p.endswith(".png") for p in listed)
    proc = mmgpg("plot", str(tmp_path / "nothing"), check=False)
    assert proc.returncode == 2 and "metrics.jsonl" in proc.stderr


def test_sampled_scores_average_over_samples(tiny_dirs):
    import torch

    from mmgpg.evaluation.run import sampled_scores

    policy = load_policy(str(tiny_dirs["qwen2_vl"]), dtype="float32", min_pixels=3136, max_pixels=12544, device="cpu")
    task = build_task(f"{FIXTURE_TASKS}:ParityShapes")
    items = list(task.load("test")[:3])
    torch.manual_seed(0)
    scores = sampled_scores(HFEngine(policy), task, items, samples=4, batch_size=8, max_new_tokens=6)
    # 12 completions scored 0 or 1: the mean is a multiple of 1/12
    assert abs(scores["accuracy"] * 12 - round(scores["accuracy"] * 12)) < 1e-9
    with pytest.raises(ValueError):
        sampled_scores(HFEngine(policy), task, items, samples=0)


def test_demo_quick_on_another_family_and_bad_families(tmp_path):
    """``--model qwen3_vl`` runs the same stages on a tiny Qwen3-VL (its SFT checkpoint is a Qwen3-VL); a family of
    the wrong kind is refused before anything is built."""
    out = tmp_path / "demo"
    text = mmgpg("demo", "--quick", "--model", "qwen3_vl", "--output", str(out)).stdout
    assert "| after gpg (2 steps) |" in text
    config = json.loads(next((out / "sft").rglob("config.json")).read_text())
    assert config["model_type"] == "qwen3_vl"
    for args, want in ((["--model", "qwen3"], "needs a vision-language model family"),
                       (["--text", "--model", "qwen3_vl"], "needs a text-only model family")):
        proc = mmgpg("demo", "--quick", *args, "--output", str(tmp_path / "no"), check=False)
        assert proc.returncode != 0 and want in proc.stderr and not (tmp_path / "no").exists()


def test_demo_tools_quick_runs_episodes_and_reports_zooms(tmp_path):
    """``--tools``: SFT on shapes_zoom's gold episodes, GPG on episodes with the zoom tool, the table's second column
    the useful-zoom rate; --text and --tools together are refused."""
    out = tmp_path / "demo"
    text = mmgpg("demo", "--tools", "--quick", "--output", str(out)).stdout
    assert "greedy useful zoom" in text and "| after gpg (2 steps) |" in text
    summary = json.loads((out / "summary.json").read_text())
    assert summary["useful_zoom_after"] is not None and summary["settings"]["tools"] is True
    rows = [json.loads(line) for line in (out / "gpg" / "metrics.jsonl").read_text().splitlines()]
    assert all("tools/calls_per_episode" in r for r in rows if "reward/total" in r)
    proc = mmgpg("demo", "--quick", "--text", "--tools", "--output", str(tmp_path / "no"), check=False)
    assert proc.returncode != 0 and "choose one" in proc.stderr


def test_demo_video_quick_trains_on_clips(tmp_path):
    """``--video``: the same stages on moving_shapes clips (kind=total, 4 frames: the prompts hold a video); --video
    and --tools together are refused."""
    out = tmp_path / "demo"
    text = mmgpg("demo", "--video", "--quick", "--output", str(out)).stdout
    assert "test clips" in text and "| after gpg (2 steps) |" in text
    summary = json.loads((out / "summary.json").read_text())
    assert summary["settings"]["video"] is True and summary["settings"]["model"] == "qwen2_5_vl"  # its default
    config = (out / "gpg" / "config.yaml").read_text()
    assert "moving_shapes" in config and "kind: total" in config
    proc = mmgpg("demo", "--quick", "--video", "--tools", "--output", str(tmp_path / "no"), check=False)
    assert proc.returncode != 0 and "choose one" in proc.stderr
