"""Shared pieces of the fault tests: one real tiny training run with a checkpoint per step, copied per test."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from support import FIXTURE_TASKS, run_mmgpg

FIXTURES = FIXTURE_TASKS
TINY = ["model=tiny", f"task={FIXTURES}:ParityShapes", "rollout.group_size=4", "rollout.max_new_tokens=12",
        "train.prompts_per_step=4", "train.micro_batch_prompts=2", "train.learning_rate=1e-3",
        "train.progress=false", "train.tensorboard=false", "train.keep_last=10"]


def mmgpg(*args: str, cwd: Path | None = None, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess:
    return run_mmgpg(*args, cwd=cwd, check=check, timeout=timeout)


def kill_after_checkpoint(cmd: list[str], run: Path, step: int = 2, *, env: dict | None = None,
                          timeout: float = 300.0, group: bool = False) -> None:
    """Start ``cmd``, wait until ``run``'s checkpoint ``step`` is COMPLETE, then SIGKILL it (``group``: its whole
    process group at once, e.g. torchrun and its ranks)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=group)
    marker = run / "checkpoints" / f"step-{step:08d}" / "COMPLETE"
    deadline = time.time() + timeout
    while not marker.exists():
        assert proc.poll() is None and time.time() < deadline, f"the run ended before its checkpoint {step}"
        time.sleep(0.05)
    if group:
        os.killpg(proc.pid, signal.SIGKILL)
    else:
        proc.send_signal(signal.SIGKILL)
    proc.wait()


def steps(run: Path, name: str = "metrics.jsonl") -> list[int]:
    """The ``step`` of every record of a run's log. The log may belong to a run that is still writing it: a last
    line without its newline (an append in progress) is left out, as mmgpg's own readers do."""
    text = (run / name).read_text()
    lines = text.splitlines()
    if lines and not text.endswith("\n"):
        lines = lines[:-1]  # being appended right now
    return [json.loads(line)["step"] for line in lines if line.strip()]


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory) -> Path:
    """A 2-step tiny run with checkpoints step-1 and step-2 (never modified: tests work on copies)."""
    run = tmp_path_factory.mktemp("faults") / "run"
    mmgpg("train", *TINY, "train.max_steps=2", "train.save_every=1", f"output_dir={run}")
    return run


@pytest.fixture
def checkpoint_copy(trained_run):
    """``copy(dest_dir) -> run dir``: a private copy of :func:`trained_run`."""

    def copy(dest: Path) -> Path:
        target = Path(dest) / "run"
        shutil.copytree(trained_run, target)
        return target

    return copy
