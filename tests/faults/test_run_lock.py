"""One run per run directory: a second `mmgpg train` (or `sft`) on the same output_dir would interleave metrics.jsonl
(steps 1, 1, 2, 2, ...) and fight over checkpoints. It is refused with a message naming the holder; a lock left by a
killed run never blocks the next one (kill -9, also when a process the run forked still holds the file); under
torchrun rank 0 locks and every rank learns the outcome; the lock is released when the run ends."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.faults_support import TINY, mmgpg, steps

from mmgpg.runlock import LOCK, RunDirLocked, lock_run_dir

TRAIN = [sys.executable, "-m", "mmgpg", "train", *TINY, "train.save_every=1"]


def test_a_second_run_on_the_same_output_dir_is_refused_and_a_killed_one_does_not_block(tmp_path):
    run = tmp_path / "run"
    first = subprocess.Popen([*TRAIN, "train.max_steps=200", f"output_dir={run}"], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 300
        while not (run / "metrics.jsonl").exists():
            assert first.poll() is None and time.time() < deadline, "the first run ended before its first step"
            time.sleep(0.1)
        for extra in ([], ["train.resume=true"]):  # a fresh start and a resume: both would write into its logs
            proc = mmgpg("train", *TINY, "train.max_steps=3", *extra, f"output_dir={run}", check=False)
            assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
            assert f"pid {first.pid} on {socket.gethostname()}" in proc.stderr, proc.stderr
            assert "another output_dir" in proc.stderr and "train.resume=true" in proc.stderr
        time.sleep(1.0)
        assert first.poll() is None  # the first run is untouched ...
        seen = steps(run)
        assert seen == list(range(1, len(seen) + 1))  # ... and its log holds each step once, in order
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    # kill -9 left the lock file behind; the process is gone, so the next run takes the directory over
    assert (run / LOCK).exists()
    # the newest complete checkpoint (train.keep_last prunes older ones, so count nothing: read its step)
    done = max(int(p.name.removeprefix("step-")) for p in (run / "checkpoints").glob("step-*")
               if (p / "COMPLETE").exists())
    mmgpg("train", *TINY, "train.save_every=1", "train.resume=true", f"train.max_steps={done + 1}", f"output_dir={run}")
    assert steps(run) == list(range(1, done + 2))
    lock_run_dir(run, "test").release()  # released at the end of the run


def test_a_lock_held_by_a_forked_child_of_a_killed_run_is_taken_over(tmp_path):
    """kill -9 of a run whose forked process (a data loader worker, an engine subprocess without exec) lives on: the
    file lock is still held, by the orphan, but the run it names is dead on this host."""
    run = tmp_path / "run"
    code = ("import os, sys, time; from pathlib import Path; from mmgpg.runlock import lock_run_dir\n"
            f"lock = lock_run_dir(Path({str(run)!r}), 'train')\n"
            "child = os.fork()\n"
            "if child == 0:  # lets go of the output pipes (the test reads them to the end), keeps the lock file\n"
            "    null = os.open(os.devnull, os.O_RDWR); os.dup2(null, 1); os.dup2(null, 2)\n"
            "    time.sleep(120); os._exit(0)\n"
            "print(child, flush=True)\n"
            "os.kill(os.getpid(), 9)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    orphan = int(proc.stdout.split()[0])
    try:
        warnings: list[str] = []
        lock = lock_run_dir(run, "train", warn=warnings.append)
        assert len(warnings) == 1 and "no longer running" in warnings[0], warnings
        with pytest.raises(RunDirLocked, match=f"pid {os.getpid()} on"):  # and it is held now
            _lock_from_another_process(run)
        lock.release()
    finally:
        os.kill(orphan, signal.SIGKILL)


def _lock_from_another_process(run: Path) -> None:
    code = (f"from pathlib import Path; from mmgpg.runlock import lock_run_dir; lock_run_dir(Path({str(run)!r}), 'x')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    if proc.returncode:
        raise RunDirLocked(proc.stderr.strip().splitlines()[-1])


def test_the_lock_names_a_holder_on_another_host_and_is_not_taken_from_it(tmp_path):
    run = tmp_path / "run"
    code = ("import json, os, sys, time; from pathlib import Path; from mmgpg.runlock import lock_run_dir\n"
            f"lock = lock_run_dir(Path({str(run)!r}), 'sft')\n"
            "os.pwrite(lock.fd, json.dumps({'pid': 4242, 'host': 'node-17', 'command': 'sft', 'started': 'then'})"
            ".encode().ljust(400), 0)\n"
            "print('locked', flush=True); sys.stdin.readline()\n")
    holder = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunDirLocked, match="mmgpg sft .*pid 4242 on node-17"):
            lock_run_dir(run, "train", warn=pytest.fail)
    finally:
        holder.communicate("done\n", timeout=60)
    lock_run_dir(run, "train").release()  # the holder ended: free again


def _rank(rank: int, world: int, init_file: str, run: str, out: str) -> None:
    import torch.distributed as dist

    from mmgpg.train.resume import lock_run

    os.environ.update(WORLD_SIZE=str(world), RANK=str(rank))
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        try:
            lock = lock_run(Path(run), "train", is_main=rank == 0)
            result = "locked" if lock is not None else "none"
        except RunDirLocked as err:
            result = f"refused: {err}"
        Path(out, f"rank{rank}").write_text(result)
        dist.barrier()  # every rank reaches it: a refusal on rank 0 did not leave rank 1 waiting
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
def test_under_torchrun_rank_0_locks_and_every_rank_learns_the_outcome(tmp_path):
    import torch.multiprocessing as mp

    run = tmp_path / "run"
    mp.spawn(_rank, args=(2, str(tmp_path / "init"), str(run), str(tmp_path)), nprocs=2)
    assert (tmp_path / "rank0").read_text() == "locked" and (tmp_path / "rank1").read_text() == "none"
    held = lock_run_dir(run, "train")  # this process holds it now: both ranks are refused
    mp.spawn(_rank, args=(2, str(tmp_path / "init2"), str(run), str(tmp_path)), nprocs=2)
    for rank in (0, 1):
        text = (tmp_path / f"rank{rank}").read_text()
        assert text.startswith("refused:") and f"pid {os.getpid()}" in text, text
    held.release()


def test_an_sft_run_is_locked_too(tmp_path):
    run = tmp_path / "run"
    held = lock_run_dir(run, "train")
    proc = mmgpg("sft", "task=shapes", "model=tiny", "sft.max_steps=1", f"output_dir={run}", check=False)
    assert proc.returncode == 2 and f"pid {os.getpid()}" in proc.stderr and "Traceback" not in proc.stderr
    held.release()

