"""Hostile files must never run code: a crafted trainer_state.pt / rng_rank0.pt in a run directory, and a
math_verify.py / sympy.py in the directory where mmgpg runs. Each attack writes a marker file that must not appear."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from mmgpg.rundir import verify_checkpoint
from mmgpg.train.checkpoint import load_trainer_state
from mmgpg.typed import CheckpointError

EVIL_MODULE = """
open({marker!r}, "w").write("code ran")
def parse(*a, **k): return []
def verify(*a, **k): return False
"""


class _Evil:
    """Unpickling this runs ``exec`` (what a crafted .pt file does under weights_only=False)."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('code ran')",))


def test_crafted_state_files_are_refused_without_running_code(tmp_path, checkpoint_copy):
    ckpt = checkpoint_copy(tmp_path) / "checkpoints" / "step-00000002"
    marker = tmp_path / "MARKER"
    for name in ("rng_rank0.pt", "trainer_state.pt"):
        good = (ckpt / name).read_bytes()
        torch.save({"python": _Evil(marker), "numpy": 0, "torch": 0, "optimizer": _Evil(marker)}, ckpt / name)
        with pytest.raises(CheckpointError, match=f"{name}.*not unpickle"):
            verify_checkpoint(ckpt)
        with pytest.raises(CheckpointError, match=name):
            load_trainer_state(ckpt)
        assert not marker.exists(), f"loading a crafted {name} ran code"
        (ckpt / name).write_bytes(good)
    verify_checkpoint(ckpt)  # the real files load with weights_only=True


def _judge_from(cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    code = "from mmgpg.task import mathjudge; print(mathjudge.parse_verify('2', '2'), mathjudge.parse_verify('3', '2'))"
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env=env)


def test_math_worker_never_imports_modules_from_the_working_directory(tmp_path):
    marker = tmp_path / "MARKER"
    for name in ("math_verify.py", "sympy.py", "latex2sympy2_extended.py"):
        (tmp_path / name).write_text(EVIL_MODULE.format(marker=str(marker)))
    proc = _judge_from(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[0] == "(True, '2') (False, '3')", proc.stdout  # the real math-verify judged
    assert not marker.exists()
    # PYTHONPATH=. (a common way to run from a source tree) must not let them in either
    proc = _judge_from(tmp_path, env=dict(os.environ, PYTHONPATH="."))
    assert proc.returncode == 0 and "(True, '2')" in proc.stdout, proc.stderr
    assert not marker.exists()


def test_ctrl_c_in_the_terminal_does_not_kill_the_math_worker_with_a_traceback(tmp_path):
    # The terminal sends SIGINT to the whole foreground process group: parent and worker.
    script = ("import signal, sys, time\n"
              "signal.signal(signal.SIGINT, lambda *a: print('parent got SIGINT', flush=True))\n"
              "from mmgpg.task import mathjudge\n"
              "print(mathjudge.parse_verify('2', '2'), flush=True)\n"
              "pid = mathjudge.worker()._proc.pid\n"
              "sys.stdin.readline()\n"
              "time.sleep(1.0)\n"
              "print('alive' if mathjudge.worker()._proc.poll() is None else 'dead', mathjudge.worker()._proc.pid == pid,"
              " mathjudge.parse_verify('4', '4'), flush=True)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout.readline().strip() == "(True, '2')"
    os.killpg(proc.pid, signal.SIGINT)
    time.sleep(0.5)
    out, err = proc.communicate("go\n", timeout=300)
    assert "parent got SIGINT" in out
    assert "alive True (True, '4')" in out, out + err
    assert "KeyboardInterrupt" not in err and "Traceback" not in err, err
