"""`mmgpg sft` checkpoints, resumes exactly after SIGKILL, stops cleanly at a step boundary on Ctrl-C, and refuses
to overwrite a run — the same guarantees as `mmgpg train` (shared code: mmgpg/train/resume.py, mmgpg/train/checkpoint.py)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from support import comparable_run

SFT = ["sft", "task=shapes", "model=tiny", "sft.batch_size=4", "sft.learning_rate=1e-3", "sft.max_steps=6",
       "train.eval_limit=4", "rollout.max_new_tokens=8"]


def _run(*args, check=True):
    proc = subprocess.run([sys.executable, "-m", "mmgpg", *args], capture_output=True, text=True, timeout=900)
    if check and proc.returncode:
        raise AssertionError(proc.stdout + proc.stderr)
    return proc


_metrics = comparable_run


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 600) -> None:
    deadline = time.time() + timeout
    while not path.exists():
        assert proc.poll() is None and time.time() < deadline, "the run ended before the checkpoint appeared"
        time.sleep(0.05)


def test_sft_resume_after_sigkill_is_exact(tmp_path):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    _run(*SFT, "sft.save_every=2", f"output_dir={straight}")
    proc = subprocess.Popen([sys.executable, "-m", "mmgpg", *SFT, "sft.save_every=2", f"output_dir={killed}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_for(killed / "checkpoints" / "step-00000002" / "COMPLETE", proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (killed / "final").exists()
    refused = _run(*SFT, "sft.save_every=2", f"output_dir={killed}", check=False)  # no silent overwrite
    assert refused.returncode == 2 and "train.resume=true" in refused.stderr
    _run(*SFT, "sft.save_every=2", f"output_dir={killed}", "train.resume=true")
    a, b = load_file(straight / "final" / "model.safetensors"), load_file(killed / "final" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ma, mb = _metrics(straight), _metrics(killed)
    assert [m["step"] for m in mb] == [1, 2, 3, 4, 5, 6]
    assert ma == mb
    assert any(m["grad_norm"] > 0 for m in ma)


def test_sft_ctrl_c_stops_at_a_step_boundary_with_a_checkpoint(tmp_path):
    run = tmp_path / "c"
    proc = subprocess.Popen([sys.executable, "-m", "mmgpg", *SFT, "sft.max_steps=400", "sft.save_every=0",
                             f"output_dir={run}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 600
    while not (run / "metrics.jsonl").exists() or not (run / "metrics.jsonl").read_text().strip():
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    assert "stopping after step" in err and "stopped by signal" in err
    last = _metrics(run)[-1]["step"]
    assert last < 400 and (run / "checkpoints" / f"step-{last:08d}" / "COMPLETE").exists()


@pytest.mark.parametrize("key", ["sft.learning_rate=0.5"])
def test_sft_resume_with_a_changed_config_is_refused(tmp_path, key):
    run = tmp_path / "r"
    _run(*SFT, "sft.max_steps=2", f"output_dir={run}")
    proc = _run(*SFT, "sft.max_steps=2", f"output_dir={run}", "train.resume=true", key, check=False)
    assert proc.returncode == 2 and "sft.learning_rate" in proc.stderr
