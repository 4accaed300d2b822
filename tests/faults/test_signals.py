"""Ctrl-C: the first says the run will stop (and save) at the step boundary; a second aborts at once, with one line
and no traceback; the checkpoint saved before is untouched."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from support.faults_support import TINY, steps

from mmgpg.rundir import complete_checkpoints, verify_checkpoint


def test_second_ctrl_c_aborts_without_a_traceback(tmp_path):
    run = tmp_path / "run"
    # Steps long enough (32 completions of up to 64 tokens) that the second Ctrl-C, sent as soon as the first one's
    # message is read, lands inside the step the first one is waiting for (a fixed sleep raced the step on a fast
    # machine).
    proc = subprocess.Popen([sys.executable, "-m", "mmgpg", "train", *TINY, "rollout.max_new_tokens=64",
                             "train.prompts_per_step=8", "train.max_steps=500", "train.save_every=1",
                             f"output_dir={run}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while not complete_checkpoints(run):
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if "press Ctrl-C again" in line:
            break
    proc.send_signal(signal.SIGINT)
    out, rest = proc.communicate(timeout=300)
    err = "".join(seen) + rest
    assert "stopping after step" in err and "press Ctrl-C again to abort" in err
    assert proc.returncode == 130, err
    assert "mmgpg train: interrupted" in err and "Traceback" not in err and "KeyboardInterrupt" not in err
    assert steps(run)[-1] < 500
    verify_checkpoint(complete_checkpoints(run)[-1])
