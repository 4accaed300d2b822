"""The plain status lines a run prints when stdout is not a terminal (:class:`mmgpg.train.runlog.StatusLines`),
on a clock the test moves by hand."""

from __future__ import annotations

from mmgpg.train.runlog import StatusLines, status_line

STEP = {"reward/total": 0.4125, "gpg/valid_fraction": 0.75, "gpg/alpha": 4 / 3, "time/step": 4.214,
        "memory/rollout_rss_mib": 1024.0, "memory/update_rss_mib": 3276.8}


def test_status_line_fields_and_eta():
    # 10 steps done in 600 s (60 s/step), 190 left: ETA 190 * 60 = 11400 s = 3h10m00s; rss is the larger peak
    line = status_line({"step": 10, **STEP}, total=200, elapsed_s=600.0, steps_done=10)
    assert line == ("train step 10/200  reward 0.412  valid 0.75  α 1.33  4.21 s/step  rss 3.2 GiB  "
                    "elapsed 10m00s  ETA 3h10m00s")
    # resumed at step 100: 5 steps done in 50 s (10 s/step), 95 left: 950 s; a skipped step has no α; GPU memory
    line = status_line({"step": 105, **STEP, "gpg/alpha": None, "memory/update_cuda_allocated_mib": 2048.0},
                       total=200, elapsed_s=50.0, steps_done=5)
    assert "α -" in line and "gpu 2.0 GiB" in line and line.endswith("elapsed 50s  ETA 15m50s")


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_one_line_every_n_seconds_first_and_last_always():
    clock, out = Clock(), []
    lines = StatusLines(total=6, start=0, every_s=60.0, clock=clock, write=out.append)
    for step, t in zip(range(1, 7), (10, 40, 75, 100, 139, 150)):
        clock.now = 1000.0 + t
        lines.update({"step": step, **STEP})
    lines.close()
    # step 1 (the first), step 3 (65 s after step 1), step 5 (64 s after step 3), step 6 at close (never printed)
    assert [line.split("  ")[0] for line in out] == ["train step 1/6", "train step 3/6", "train step 5/6",
                                                     "train step 6/6"]
    assert out[1].endswith("elapsed 1m15s  ETA 1m15s")  # 75 s for 3 steps: 25 s/step, 3 left
    lines.close()  # nothing new since: no second copy of the last line
    assert len(out) == 4


def test_close_after_a_printed_last_step_prints_nothing():
    clock, out = Clock(), []
    lines = StatusLines(total=1, start=0, every_s=60.0, clock=clock, write=out.append)
    lines.update({"step": 1, **STEP})
    lines.close()
    assert len(out) == 1


def test_status_every_s_must_not_be_negative():
    import pytest

    from mmgpg.config import ConfigError, resolve

    with pytest.raises(ConfigError, match="train.status_every_s: got -1") as info:
        resolve(["train.status_every_s=-1"])
    assert "set train.status_every_s=60" in str(info.value)
    assert resolve(["train.status_every_s=0"]).config.train.status_every_s == 0



def test_the_wandb_id_is_reused_only_on_a_resume_from_a_checkpoint(tmp_path):
    from mmgpg.train.runlog import WANDB_RUN_ID, save_wandb_id, saved_wandb_id, wandb_init_kwargs

    assert saved_wandb_id(tmp_path, resuming=True) is None  # never saved
    assert wandb_init_kwargs("mmgpg", tmp_path, {"seed": 0}, None) == {
        "project": "mmgpg", "dir": str(tmp_path), "config": {"seed": 0}}  # a new run: W&B picks the id
    save_wandb_id(tmp_path, "abc123")
    assert (tmp_path / WANDB_RUN_ID).read_text() == "abc123\n"
    assert saved_wandb_id(tmp_path, resuming=True) == "abc123"
    assert saved_wandb_id(tmp_path, resuming=False) is None  # starting over at step 0: a new W&B run
    assert wandb_init_kwargs("mmgpg", tmp_path, {}, "abc123") == {
        "project": "mmgpg", "dir": str(tmp_path), "config": {}, "id": "abc123", "resume": "allow"}
    (tmp_path / WANDB_RUN_ID).write_text("\n")
    assert saved_wandb_id(tmp_path, resuming=True) is None


def test_a_resumed_runlog_continues_the_same_wandb_run(tmp_path, monkeypatch):
    """Real wandb in offline mode (nothing leaves the machine): the second RunLog, resuming at step 2, opens the
    W&B run of the first."""
    import pytest

    pytest.importorskip("wandb")
    from mmgpg.config import resolve
    from mmgpg.train.runlog import WANDB_RUN_ID, RunLog

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = resolve(["train.wandb=true", "train.tensorboard=false", "train.progress=false"]).config
    ids = []
    for start in (0, 2, 0):
        log = RunLog(tmp_path, cfg, start_step=start, is_main=True)
        ids.append(log.wandb.id)
        log.log({"step": start + 1, "reward/total": 0.5})
        log.close()
        assert (tmp_path / WANDB_RUN_ID).read_text() == ids[-1] + "\n"
    assert ids[1] == ids[0] and ids[2] != ids[0]  # resumed: the same run; started over: a new one
