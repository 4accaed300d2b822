"""Model, task and config loading failures end in one message that says what is wrong, where, and the fix."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from support.faults_support import mmgpg

from mmgpg.models.load import load_policy


@pytest.fixture
def model_dir(tmp_path, tiny_dirs) -> Path:
    target = tmp_path / "model"
    shutil.copytree(tiny_dirs["qwen2_vl"], target)
    return target


@pytest.mark.parametrize("damage, error, message", [
    (lambda d: (d / "config.json").write_text("{garbage"), ValueError, "config.json is not valid JSON"),
    (lambda d: (d / "config.json").unlink(), ValueError, "has no config.json"),
    (lambda d: (d / "model.safetensors").unlink(), ValueError, "holds no weights"),
])
def test_a_broken_model_directory_is_named_as_such(model_dir, damage, error, message):
    damage(model_dir)
    with pytest.raises(error, match=message) as caught:
        load_policy(str(model_dir), device="cpu")
    assert str(model_dir) in str(caught.value) and "hub" not in str(caught.value)


def test_a_relative_typo_is_reported_locally_not_sent_to_the_hub(tmp_path, model_dir, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    for typo in ("runs/modle", "model/extra/x", "./modle"):
        with pytest.raises(FileNotFoundError, match="does not exist") as caught:
            load_policy(typo, device="cpu")
        assert "hub" not in str(caught.value)
    with pytest.raises(FileNotFoundError, match="Did you mean 'model'"):
        load_policy("./modle", device="cpu")


def test_cli_loading_failures_are_one_message_without_traceback(tmp_path, model_dir):
    (model_dir / "config.json").write_text("{garbage")
    exits = tmp_path / "exits.py"
    exits.write_text("import sys\nsys.exit(0)\n")
    cases = [
        (["model", "info", str(model_dir)], "config.json is not valid JSON"),
        (["train", f"task={exits}:Task", "model=tiny", f"output_dir={tmp_path / 'r'}"], "called sys.exit(0)"),
        (["config", "show", "--config-dir", str(tmp_path / "nope")], "is not a directory"),
        (["eval", "--task", "shapes", "--ckpt", str(model_dir), "--limit", "1"], "config.json is not valid JSON"),
    ]
    for args, message in cases:
        proc = mmgpg(*args, check=False, cwd=tmp_path)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert message in proc.stderr and "Traceback" not in proc.stderr, (args, proc.stderr)
        assert proc.stderr.startswith(f"mmgpg {args[0]}: ") or f"\nmmgpg {args[0]}: " in proc.stderr  # one message
    assert not (tmp_path / "r" / "metrics.jsonl").exists()
    proc = mmgpg("--debug", "model", "info", str(model_dir), check=False)
    assert "Traceback" in proc.stderr  # --debug shows it
    assert os.environ.get("HF_HUB_OFFLINE", "") in ("", "1")
