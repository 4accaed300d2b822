"""Damaged and interrupted checkpoints and logs: real truncation, garbage, kill -9, a full disk. A resume never
loses history, never appends duplicate steps, falls back to the newest intact checkpoint and says which was bad."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.faults_support import TINY, mmgpg, steps

from mmgpg.rundir import complete_checkpoints, latest_checkpoint, verify_checkpoint
from mmgpg.train import checkpoint as ckpt_mod
from mmgpg.typed import CheckpointError


def _truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


CORRUPTIONS = {
    "truncated trainer_state.pt": (lambda c: _truncate(c / "trainer_state.pt"), "trainer_state.pt"),
    "garbage model.safetensors": (lambda c: (c / "policy" / "model.safetensors").write_bytes(b"\x00garbage" * 99),
                                  "model.safetensors"),
    "truncated model.safetensors": (lambda c: _truncate(c / "policy" / "model.safetensors", 0.9), "model.safetensors"),
    "empty rng file": (lambda c: (c / "rng_rank0.pt").write_bytes(b""), "rng_rank0.pt"),
    "deleted policy/": (lambda c: shutil.rmtree(c / "policy"), "policy/"),
    "garbage COMPLETE marker": (lambda c: (c / "COMPLETE").write_text("{not json"), "COMPLETE"),
    "garbage config.json": (lambda c: (c / "policy" / "config.json").write_text("{"), "config.json"),
}


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_each_damage_is_detected_and_the_previous_checkpoint_is_used(tmp_path, checkpoint_copy, case):
    run = checkpoint_copy(tmp_path)
    damage, names = CORRUPTIONS[case]
    newest = run / "checkpoints" / "step-00000002"
    damage(newest)
    with pytest.raises(CheckpointError, match=names.replace(".", r"\.")):
        verify_checkpoint(newest)
    warnings: list[str] = []
    assert latest_checkpoint(run, warn=warnings.append) == run / "checkpoints" / "step-00000001"
    assert len(warnings) == 1 and "step-00000002" in warnings[0] and names in warnings[0]


def test_resume_falls_back_past_a_damaged_checkpoint_and_cleans_up(tmp_path, checkpoint_copy):
    run = checkpoint_copy(tmp_path)
    _truncate(run / "checkpoints" / "step-00000002" / "policy" / "model.safetensors", 0.9)
    (run / "checkpoints" / ".tmp-step-00000007").mkdir()  # a save killed before its rename
    (run / "checkpoints" / "step-00000009").mkdir()  # a deletion killed after removing COMPLETE
    (run / "checkpoints" / "step-00000009" / "trainer_state.pt").write_bytes(b"half")
    proc = mmgpg("train", *TINY, "train.max_steps=3", "train.save_every=1", "train.resume=true", f"output_dir={run}")
    assert "skipping checkpoint" in proc.stderr and "step-00000002" in proc.stderr and "model.safetensors" in proc.stderr
    assert steps(run) == [1, 2, 3]  # resumed from step 1: step 2's record was rewritten, not duplicated
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-00000001", "step-00000002",
                                                                        "step-00000003"]
    verify_checkpoint(run / "checkpoints" / "step-00000002")  # the damaged one was replaced by a good one


def test_eval_of_a_run_directory_skips_a_damaged_checkpoint(tmp_path, checkpoint_copy):
    run = checkpoint_copy(tmp_path)
    (run / "checkpoints" / "step-00000002" / "rng_rank0.pt").write_bytes(b"")
    proc = mmgpg("eval", "--task", TINY[1].partition("=")[2], "--ckpt", str(run), "--limit", "2",
                 "--max-new-tokens", "4", "--output", str(tmp_path / "ev"), "model=tiny")
    assert f"evaluating {run / 'checkpoints' / 'step-00000001' / 'policy'}" in proc.stdout
    assert "step-00000002" in proc.stderr and "rng_rank0.pt" in proc.stderr


def test_a_run_whose_checkpoints_are_all_damaged_is_refused_not_restarted(tmp_path, checkpoint_copy):
    run = checkpoint_copy(tmp_path)
    for c in complete_checkpoints(run):
        (c / "trainer_state.pt").write_bytes(b"")
    proc = mmgpg("train", *TINY, "train.max_steps=3", "train.resume=true", f"output_dir={run}", check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "step-00000001" in proc.stderr and "step-00000002" in proc.stderr and "trainer_state.pt" in proc.stderr
    assert steps(run) == [1, 2]


def test_an_interrupted_prune_never_leaves_a_complete_checkpoint_without_state(tmp_path, checkpoint_copy, monkeypatch):
    run = checkpoint_copy(tmp_path)
    old = run / "checkpoints" / "step-00000001"

    def killed_midway(path, ignore_errors=False):  # deletes one file, then the process "dies"
        (Path(path) / "trainer_state.pt").unlink()
        raise KeyboardInterrupt

    monkeypatch.setattr(ckpt_mod.shutil, "rmtree", killed_midway)
    with pytest.raises(KeyboardInterrupt):
        ckpt_mod.remove_checkpoint(old)
    assert old.exists() and old not in complete_checkpoints(run)


def test_resume_of_a_run_killed_before_its_first_checkpoint_starts_over_without_duplicate_steps(tmp_path):
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "mmgpg", "train", *TINY, "train.max_steps=200", f"output_dir={run}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while not (run / "metrics.jsonl").exists() or len(steps(run)) < 2:
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = steps(run)
    assert not list((run / "checkpoints").glob("step-*")) if (run / "checkpoints").exists() else True
    out = mmgpg("train", *TINY, "train.max_steps=3", "train.resume=true", f"output_dir={run}")
    assert "no usable checkpoint" in out.stderr and "abandoned-" in out.stderr
    assert steps(run) == [1, 2, 3]
    (kept,) = run.glob("abandoned-*")
    assert steps(kept) == before  # the earlier records are kept, beside the new run
    assert (run / "config.yaml").exists()


def test_a_torn_last_line_is_dropped_with_a_warning_naming_file_and_line(tmp_path, checkpoint_copy):
    run = checkpoint_copy(tmp_path)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("\n".join(lines) + '\n{"step": 3, "reward/total": 0.')  # a cut-off append
    proc = mmgpg("plot", str(run))
    assert f"{run / 'metrics.jsonl'}:3: dropped an incomplete last line" in proc.stderr
    # A bad line that is not the last one is an error naming file and line, not a bare JSON message.
    (run / "metrics.jsonl").write_text(lines[0] + '\n{"step": 2, "x": 1 "y": 2}\n' + lines[1] + "\n")
    proc = mmgpg("plot", str(run), check=False)
    assert proc.returncode == 2 and f"{run / 'metrics.jsonl'}:2: not valid JSON" in proc.stderr
    assert "Traceback" not in proc.stderr
    # resume drops the torn line too and continues
    (run / "metrics.jsonl").write_text("\n".join(lines) + '\n{"step": 3, "reward/to')
    proc = mmgpg("train", *TINY, "train.max_steps=3", "train.save_every=1", "train.resume=true", f"output_dir={run}")
    assert "metrics.jsonl:3: dropped an incomplete last line" in proc.stderr
    assert steps(run) == [1, 2, 3]


def test_a_kill_during_the_log_rewrite_leaves_the_old_log(tmp_path):
    """SIGXFSZ (file size limit) kills the process in the middle of writing: the same as kill -9 mid-write."""
    path = tmp_path / "metrics.jsonl"
    rows = [{"step": s, "reward/total": 0.5, "pad": "x" * 200} for s in range(1, 201)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    original = path.read_bytes()
    code = ("import resource, signal; from pathlib import Path; from mmgpg.train.resume import truncate_logs\n"
            "signal.signal(signal.SIGXFSZ, signal.SIG_DFL)  # Python ignores it by default\n"
            "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))\n"
            f"truncate_logs(Path({str(tmp_path)!r}), 150)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=300)
    assert proc.returncode == -signal.SIGXFSZ, proc.stderr  # really killed mid-write
    assert path.read_bytes() == original
    # the next (unlimited) resume rewrites it and removes the half-written temporary file
    from mmgpg.train.resume import truncate_logs

    truncate_logs(tmp_path, 150)
    assert steps(tmp_path) == list(range(1, 151))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]


def _unshare_available() -> bool:
    if not shutil.which("unshare"):
        return False
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "true"], capture_output=True)
    return probe.returncode == 0


@pytest.mark.skipif(not _unshare_available(), reason="needs user+mount namespaces (unshare) to mount a small tmpfs")
def test_disk_full_during_a_save_says_so_and_keeps_the_previous_checkpoint(tmp_path, checkpoint_copy):
    src = checkpoint_copy(tmp_path)
    shutil.rmtree(src / "checkpoints" / "step-00000001")
    size_mib = sum(f.stat().st_size for f in src.rglob("*") if f.is_file()) / 2**20
    mount = tmp_path / "small"
    mount.mkdir()
    args = " ".join(f"'{a}'" for a in [*TINY, "train.max_steps=3", "train.resume=true", f"output_dir={mount}/run"])
    script = (f"mount -t tmpfs -o size={int(size_mib + 4)}m tmpfs {mount} && cp -r {src} {mount}/run && "
              f"{sys.executable} -m mmgpg train {args}; echo rc=$?; ls -a {mount}/run/checkpoints")
    proc = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script], capture_output=True,
                          text=True, timeout=600, env=dict(os.environ))
    assert "rc=2" in proc.stdout, proc.stdout + proc.stderr
    assert "no space left on device" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert "step-00000002" in proc.stderr  # names the intact checkpoint to resume from
    assert proc.stdout.split("rc=2")[1].split() == [".", "..", "step-00000002"]  # the partial save was removed


def test_resume_with_a_changed_config_is_refused_or_applied_and_recorded_never_rewritten(tmp_path, checkpoint_copy):
    run = checkpoint_copy(tmp_path)
    provenance = (run / "config.yaml").read_text()
    proc = mmgpg("train", *TINY, "train.max_steps=3", "train.resume=true", "train.learning_rate=0.05",
                 "task.num_train=64", f"output_dir={run}", check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "train.learning_rate: got 0.05" in proc.stderr and "trained with 0.001" in proc.stderr
    assert "task.num_train" in proc.stderr and "train.resume_config=new" in proc.stderr
    assert steps(run) == [1, 2] and (run / "config.yaml").read_text() == provenance
    # applied on request: the optimizer really uses the new rate, the change is recorded, config.yaml stays
    mmgpg("train", *TINY, "train.max_steps=3", "train.resume=true", "train.learning_rate=0.05",
          "train.resume_config=new", f"output_dir={run}")
    last = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["step"] == 3 and last["lr"] == pytest.approx(0.05)
    (record,) = [json.loads(x) for x in (run / "config_changes.jsonl").read_text().splitlines()]
    assert record["changes"]["train.learning_rate"] == {"old": 0.001, "new": 0.05}
    assert record["how"] == "train.resume_config=new"
    assert (run / "config.yaml").read_text() == provenance
    assert "learning_rate: 0.05" in (run / "checkpoints" / "step-00000003" / "config.yaml").read_text()


@pytest.mark.parametrize("keep_last, kept", [(2, ["step-00000001", "step-00000002", "step-00000003"]),
                                             (1, ["step-00000003"])])
def test_pruning_keeps_the_newest_intact_checkpoints_never_a_damaged_one_instead(tmp_path, checkpoint_copy,
                                                                                 keep_last, kept):
    """train.keep_last counts intact checkpoints: with step-2 damaged, saving step 3 under keep_last=2 keeps step-3
    and step-1 (the two newest intact ones; the damaged step-2, newer than step-1, is left for a look but not
    counted). Under keep_last=1 only step-3 stays (the damaged one is older than every kept one)."""
    from mmgpg.models.load import load_policy
    from mmgpg.utils import safe_load

    run = checkpoint_copy(tmp_path)
    step1, step2 = run / "checkpoints" / "step-00000001", run / "checkpoints" / "step-00000002"
    policy = load_policy(str(step1 / "policy"), device="cpu")  # (step-2's weights are mapped: not truncated below)
    state = safe_load(step1 / "trainer_state.pt")
    _truncate(step2 / "policy" / "model.safetensors", 0.9)
    warnings: list[str] = []
    ckpt_mod.save_checkpoint(run, 3, policy, state, keep_last=keep_last, warn=warnings.append)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == kept
    intact = [p.name for p in complete_checkpoints(run) if p.name != "step-00000002"]
    for name in intact:
        verify_checkpoint(run / "checkpoints" / name)
    assert len(intact) == keep_last
    if keep_last == 2:
        assert any("step-00000002" in w and "model.safetensors" in w for w in warnings), warnings
