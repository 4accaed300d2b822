"""Every model family through the real commands, on its tiny model (built offline by ``mmgpg model tiny``):
``mmgpg train`` runs 2 GPG steps end to end (CI: one such cell per family), and under --runslow also ``mmgpg model
info``, ``mmgpg eval`` on the trained run and ``mmgpg check`` (the task's prompts fit, every reward and judge runs on
probe answers). Vision-language families train on ``shapes``, text families on ``arith``."""

from __future__ import annotations

import json

import pytest
from support.families import IMAGE_TEXT, QWEN_VL, TEXT

from mmgpg.cli import main
from mmgpg.rundir import read_metrics

FAMILIES = QWEN_VL + IMAGE_TEXT + TEXT


def _task(family: str) -> str:
    return "arith" if family in TEXT else "shapes"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """``{family: folder}``, built lazily by ``mmgpg model tiny --family F`` (the command itself)."""
    root, out = tmp_path_factory.mktemp("families"), {}

    def get(family: str):
        if family not in out:
            assert main(["model", "tiny", "--family", family, "--out", str(root / family)]) == 0
            out[family] = root / family
        return out[family]

    return get


def _train(model, run, family) -> None:
    assert main(["train", f"task={_task(family)}", f"model.name_or_path={model}", "model.dtype=float32",
                 "train.max_steps=2", "train.prompts_per_step=2", "train.micro_batch_prompts=2",
                 "rollout.group_size=2", "rollout.max_new_tokens=8", "train.progress=false",
                 "train.tensorboard=false", "algo.max_resample_attempts=1", "train.save_every=0",
                 f"output_dir={run}"]) == 0


@pytest.mark.parametrize("family", FAMILIES)
def test_train_two_gpg_steps(built, tmp_path, family):
    _train(built(family), tmp_path / "run", family)
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2] and all("reward/total" in r and "gpg/valid_fraction" in r for r in rows)
    assert (tmp_path / "run" / "checkpoints").is_dir()


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_info_eval_and_check(built, tmp_path, family, capsys):
    model = built(family)
    assert main(["model", "info", str(model)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["model_type"] == family and info["parameters"]["total"] > 0
    _train(model, tmp_path / "run", family)
    out = tmp_path / "eval"
    assert main(["eval", "--task", _task(family), "--ckpt", str(tmp_path / "run"), "--limit", "3",
                 "--max-new-tokens", "8", "--output", str(out)]) == 0
    rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all("model_output" in r for r in rows)
    assert main(["check", f"task={_task(family)}", f"model.name_or_path={model}", "--examples", "2"]) == 0
