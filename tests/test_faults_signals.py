"""Ctrl-C: the first says the run will stop (and save) at the step boundary; a second aborts at once, with one line
and no traceback; the checkpoint saved before is untouched."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from faults_support import TINY, steps

from mmgpg.checkpoint import complete_checkpoints, verify_checkpoint


def test_second_ctrl_c_aborts_without_a_traceback(tmp_path):
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "mmgpg", "train", *TINY, "train.max_steps=500", "train.save_every=1",
                             f"output_dir={run}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while not complete_checkpoints(run):
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert "stopping after step" in err and "press Ctrl-C again to abort" in err
    assert proc.returncode == 130, err
    assert "mmgpg train: interrupted" in err and "Traceback" not in err and "KeyboardInterrupt" not in err
    assert steps(run)[-1] < 500
    verify_checkpoint(complete_checkpoints(run)[-1])
