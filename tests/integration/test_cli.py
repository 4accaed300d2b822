"""The real `mmgpg` command, run as a subprocess on the tiny model."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

COMMANDS = [[], ["sample"], ["model"], ["model", "tiny"], ["model", "info"], ["config"], ["config", "show"],
            ["config", "groups"], ["tasks"]]


def mmgpg(*args: str, cwd=None, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([sys.executable, "-m", "mmgpg", *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(f"mmgpg {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: " ".join(c) or "mmgpg")
def test_every_subcommand_has_help(cmd):
    out = mmgpg(*cmd, "--help").stdout
    assert out.startswith("usage: mmgpg")
    assert "not implemented" not in out.lower()


def test_sample_end_to_end_on_the_tiny_model(tmp_path):
    run = tmp_path / "run"
    proc = mmgpg("sample", "--prompts", "3", "task=shapes", "model=tiny", "rollout.group_size=4",
                 "rollout.max_new_tokens=16", f"output_dir={run}", "--show", "1")
    assert "mean rewards: reward/accuracy=" in proc.stdout
    records = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert len(records) == 12
    assert [r["prompt_id"] for r in records[::4]] == ["shapes-train-0", "shapes-train-1", "shapes-train-2"]
    for r in records:
        assert 1 <= r["tokens"] <= 16 and r["logprob_sum"] < 0
        assert set(r["rewards"]) == {"accuracy", "format", "total"}
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["rollout"]["group_size"] == 4 and saved["model"]["name_or_path"] == "tiny"


def test_bad_config_exits_2_with_every_problem(tmp_path):
    proc = mmgpg("sample", "rollout.group_size=-1", "model.dtype=float8", "task=nope", check=False)
    assert proc.returncode == 2
    assert "3 problem(s)" in proc.stderr
    assert "rollout.group_size" in proc.stderr and "model.dtype" in proc.stderr and "task" in proc.stderr
    assert not list(tmp_path.iterdir())


def test_config_show_prints_the_resolved_yaml():
    out = mmgpg("config", "show", "model=tiny", "rollout.top_k=50").stdout
    data = yaml.safe_load(out)
    assert data["model"]["name_or_path"] == "tiny" and data["rollout"]["top_k"] == 50
    doc = mmgpg("config", "show", "--doc").stdout
    assert "# Completions sampled per prompt" in doc
    assert "task: tiny qwen2_5_vl_3b" not in mmgpg("config", "groups").stdout
    assert "model: qwen2_5_vl_3b qwen2_5_vl_7b qwen2_vl_2b tiny tiny_qwen2 tiny_qwen2_5_vl" in mmgpg("config", "groups").stdout


def test_tasks_lists_the_builtins():
    out = mmgpg("tasks").stdout
    assert "shapes" in out and "mmgpg_tasks.shapes:ShapesTask" in out


def test_model_tiny_then_info(tmp_path):
    out = mmgpg("model", "tiny", "--out", str(tmp_path / "m"), "--family", "qwen2_5_vl").stdout
    assert "built tiny qwen2_5_vl" in out
    info = json.loads(mmgpg("model", "info", str(tmp_path / "m")).stdout)
    assert info["model_type"] == "qwen2_5_vl" and info["vocab_size"] == 1024
    assert info["eos_token_ids"] == [2, 0]
    assert info["parameters"]["vision"] > 0


def test_shape_true_dimensions_without_weights():
    """`model info` instantiates on the meta device: the 2B-shaped config is checked without 9 GB of weights."""
    import torch
    from transformers import AutoModelForImageTextToText

    from mmgpg.models.tiny import build_config, build_tokenizer, count_parameters, dims_for

    cfg = build_config("qwen2_vl", dims_for("qwen2_vl", "shape_true"), build_tokenizer())
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(cfg)
    counts = count_parameters(model)
    assert cfg.text_config.vocab_size == 151936
    # Qwen2-VL-2B-Instruct: 2,208,985,600 parameters (1.54 B language incl. tied embeddings, 0.67 B vision).
    assert counts["total"] == 2_208_985_600, counts
