"""A really full disk (a small tmpfs in a user+mount namespace): a checkpoint whose ``trainer_state.pt`` does not fit
ends in a CheckpointError that says the disk is full and how much to free, with the partial checkpoint removed and
the previous one intact; ``mmgpg sft``'s ``final/`` is written to a temporary folder and renamed, so a full disk
leaves no half-written ``final/``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest


def _unshare_available() -> bool:
    if not shutil.which("unshare"):
        return False
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "true"], capture_output=True)
    return probe.returncode == 0


pytestmark = pytest.mark.skipif(not _unshare_available(),
                                reason="needs user+mount namespaces (unshare) to mount a small tmpfs")


def _in_small_disk(mount: Path, size_kib: int, command: str) -> subprocess.CompletedProcess:
    mount.mkdir()
    script = f"mount -t tmpfs -o size={size_kib}k tmpfs {mount} && {command}"
    return subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script],
                          capture_output=True, text=True, timeout=600, env=dict(os.environ))


def _size_kib(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) // 1024


SAVE = textwrap.dedent("""
    import json, sys, torch
    from pathlib import Path
    from mmgpg.models.load import load_policy
    from mmgpg.train.checkpoint import save_checkpoint
    from mmgpg.typed import CheckpointError
    model, run = sys.argv[1], Path(sys.argv[2])
    policy = load_policy(model, device="cpu")
    state = {"optimizer": {}, "scheduler": {}, "stream": {}, "counters": {"step": 1}}
    save_checkpoint(run, 1, policy, state, keep_last=2)
    try:  # step 2's optimizer state is too large for what is left: the disk fills inside trainer_state.pt
        save_checkpoint(run, 2, policy, {**state, "optimizer": {"m": torch.zeros(int(sys.argv[3]) // 4)}}, keep_last=2)
    except CheckpointError as err:
        print(json.dumps({"error": str(err), "left": sorted(p.name for p in (run / "checkpoints").iterdir())}))
""")


def test_a_full_disk_inside_trainer_state_says_what_to_free(tmp_path, tiny_dirs):
    model = tiny_dirs["qwen2_vl"]
    outside = tmp_path / "outside"
    probe = subprocess.run([sys.executable, "-c", "import sys; from mmgpg.models.load import load_policy; "
                            "load_policy(sys.argv[1], device='cpu').model.save_pretrained(sys.argv[2])",
                            str(model), str(outside)], capture_output=True, text=True, timeout=300)
    assert probe.returncode == 0, probe.stderr
    policy_kib = _size_kib(outside) + _size_kib(model)  # weights + processor files, generously
    # room for two policies and a small state; step 2's 64 MiB optimizer state is what does not fit
    mount = tmp_path / "small"
    (tmp_path / "save.py").write_text(SAVE)
    proc = _in_small_disk(mount, 2 * policy_kib + 4096,
                          f"{sys.executable} {tmp_path / 'save.py'} {model} {mount}/run {64 << 20}; echo rc=$?")
    assert "rc=0" in proc.stdout, proc.stdout + proc.stderr
    out = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("{")))
    print(out["error"])
    error = out["error"]
    assert "no space left on device" in error and "Traceback" not in proc.stderr, proc.stderr
    assert "trainer_state.pt" in error  # what was being written when the disk filled
    assert "free at least" in error and "MiB" in error and "train.keep_last" in error  # what to free
    assert "step-00000001" in error and "intact" in error
    assert out["left"] == ["step-00000001"]  # the partial step 2 was removed; step 1 stays


SFT = ["sft", "task=shapes", "model=tiny", "sft.batch_size=2", "sft.learning_rate=1e-3", "sft.max_steps=1",
       "train.eval_limit=2", "rollout.max_new_tokens=4", "train.keep_last=1"]


def test_sft_final_is_never_left_half_written_on_a_full_disk(tmp_path):
    roomy = tmp_path / "roomy"
    done = subprocess.run([sys.executable, "-m", "mmgpg", *SFT, f"output_dir={roomy}"], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    # room for everything but half of final/: the checkpoint fits, final/ does not
    size = _size_kib(roomy) - _size_kib(roomy / "final") // 2
    mount = tmp_path / "small"
    args = " ".join(f"'{a}'" for a in [*SFT, f"output_dir={mount}/run"])
    proc = _in_small_disk(mount, size, f"{sys.executable} -m mmgpg {args}; echo rc=$?; ls -a {mount}/run")
    assert "rc=2" in proc.stdout, proc.stdout + proc.stderr
    assert "no space left on device" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert "step-00000001" in proc.stderr  # the last checkpoint, whose policy/ holds the same weights
    listing = proc.stdout.split("rc=2")[1].split()
    assert "final" not in listing and not [n for n in listing if n.startswith(".tmp")], listing
    assert "checkpoints" in listing
