"""A real training run with stdout not a terminal (pytest captures it, as SLURM or nohup would redirect it): plain
status lines appear at ``train.status_every_s`` and none with 0; ``train.progress=false`` stays quiet."""

from __future__ import annotations

import re

import pytest
from support import FIXTURE_TASKS

from mmgpg.config import resolve
from mmgpg.train.trainer import Trainer

TINY = [f"task={FIXTURE_TASKS}:ParityShapes", "model=tiny", "rollout.group_size=4", "rollout.max_new_tokens=6",
        "train.prompts_per_step=2", "train.micro_batch_prompts=2", "train.learning_rate=1e-3", "train.max_steps=2",
        "train.tensorboard=false", "train.save_every=0", "train.keep_last=1"]
LINE = re.compile(r"^train step (\d)/2  reward \d\.\d{3}  valid \d\.\d\d  α (-|\d+\.\d\d)  \d+\.\d\d s/step  "
                  r"rss \d+\.\d GiB  elapsed \d+s  ETA \d+s$", re.M)


@pytest.mark.parametrize("every, progress, steps", [(1e-9, "true", ["1", "2"]), (0, "true", []),
                                                    (1e-9, "false", [])])
def test_status_lines_without_a_terminal(tmp_path, capsys, every, progress, steps):
    Trainer(resolve(TINY + [f"train.status_every_s={every}", f"train.progress={progress}",
                            f"output_dir={tmp_path}"])).train()
    out = capsys.readouterr().out
    assert [m.group(1) for m in LINE.finditer(out)] == steps, out
    assert "train step" in out if steps else "train step" not in out
