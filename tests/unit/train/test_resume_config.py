"""What a resume may change: run control (how the run is driven) passes, provenance (what it computes) is refused.
The vLLM server's address, its reply timeout and the weight-sync folder are run control: a server restarted on
another port must not block ``train.resume=true``; switching between a colocated engine and a server is not."""

from __future__ import annotations

import json

import pytest

from mmgpg.config import resolve, to_yaml
from mmgpg.train.resume import check_config
from mmgpg.typed import ConfigError

SERVER = ["rollout.engine=vllm", "rollout.vllm_server=http://127.0.0.1:8000", "rollout.vllm_server_timeout=600",
          "rollout.vllm_sync_dir=/dev/shm/a"]


def _checkpoint(tmp_path, args):
    checkpoint = tmp_path / "run" / "checkpoints" / "step-00000002"
    checkpoint.mkdir(parents=True)
    (checkpoint / "config.yaml").write_text(to_yaml(resolve(args, validate_config=False).config))
    return checkpoint


@pytest.mark.parametrize("change", ["rollout.vllm_server=http://10.0.0.7:8123", "rollout.vllm_server_timeout=60",
                                    "rollout.vllm_sync_dir=/scratch/sync"])
def test_a_moved_vllm_server_is_run_control(tmp_path, change, capsys):
    checkpoint = _checkpoint(tmp_path, SERVER)
    cfg = resolve([*SERVER, change], validate_config=False).config
    assert check_config(cfg, checkpoint, tmp_path / "run", record=True) is False  # nothing to apply
    assert change.split("=")[0] in capsys.readouterr().err  # said and recorded as run control
    assert change.split("=")[0] in (tmp_path / "run" / "config_changes.jsonl").read_text()


def test_colocated_to_server_is_still_a_change_of_what_runs(tmp_path):
    checkpoint = _checkpoint(tmp_path, ["rollout.engine=vllm"])
    cfg = resolve(SERVER[:2], validate_config=False).config
    with pytest.raises(ConfigError, match="rollout.vllm_server: got 'http://127.0.0.1:8000'"):
        check_config(cfg, checkpoint, tmp_path / "run", record=False)


def test_provenance_is_still_refused(tmp_path):
    checkpoint = _checkpoint(tmp_path, SERVER)
    cfg = resolve([*SERVER, "rollout.temperature=0.5"], validate_config=False).config
    with pytest.raises(ConfigError, match="rollout.temperature"):
        check_config(cfg, checkpoint, tmp_path / "run", record=False)


@pytest.mark.parametrize("extra, says", [
    ([], "nothing this run computes reads the new path"),
    (["algo.kl_coef=0.04"], "only the KL reference"),
    (["model.lora.rank=8"], "base model under the saved LoRA adapter"),
])
def test_a_new_model_path_says_what_it_changes(tmp_path, extra, says, capsys):
    """A new model.name_or_path does not replace the trained weights: the refusal, the stderr line and the record in
    config_changes.jsonl say what it does change (the KL reference, a LoRA adapter's base, or nothing)."""
    checkpoint = _checkpoint(tmp_path, ["model=tiny", *extra])
    moved = ["model=tiny", *extra, "model.name_or_path=/models/other"]
    with pytest.raises(ConfigError, match=says):
        check_config(resolve(moved, validate_config=False).config, checkpoint, tmp_path / "run", record=False)
    cfg = resolve([*moved, "train.resume_config=new"], validate_config=False).config
    assert check_config(cfg, checkpoint, tmp_path / "run", record=True) is True
    assert says in capsys.readouterr().err
    record = json.loads((tmp_path / "run" / "config_changes.jsonl").read_text())
    assert says in record["changes"]["model.name_or_path"]["note"]


def test_other_changes_carry_no_note(tmp_path):
    checkpoint = _checkpoint(tmp_path, ["model=tiny"])
    cfg = resolve(["model=tiny", "rollout.temperature=0.5", "train.resume_config=new"], validate_config=False).config
    check_config(cfg, checkpoint, tmp_path / "run", record=True)
    record = json.loads((tmp_path / "run" / "config_changes.jsonl").read_text())
    assert record["changes"] == {"rollout.temperature": {"old": 1.0, "new": 0.5}}
