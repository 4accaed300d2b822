"""Hostile files must never run code: a crafted trainer_state.pt / rng_rank0.pt in a run directory, and a
math_verify.py / sympy.py in the directory where mmgpg runs. Each attack writes a marker file that must not appear."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from support.faults_support import TINY, mmgpg, steps

from mmgpg.rundir import latest_checkpoint, verify_checkpoint
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


# ---- DeepSpeed's engine/ state: DeepSpeed itself unpickles it with weights_only=False -----------------------------

needs_deepspeed = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="deepspeed is not installed")
DS = [*TINY, "train.backend=deepspeed", "train.zero_stage=2"]
OPTIM = "engine/state/zero_pp_rank_0_mp_rank_00_optim_states.pt"


@pytest.fixture(scope="module")
def ds_run(tmp_path_factory) -> Path:
    """A 2-step single-process ZeRO-2 run with checkpoints step-1 and step-2 (tests work on copies)."""
    run = tmp_path_factory.mktemp("ds") / "run"
    mmgpg("train", *DS, "train.max_steps=2", "train.save_every=1", f"output_dir={run}")
    return run


def _plant(state_file: Path, marker: Path) -> None:
    """Add an object that runs code when unpickled to one of DeepSpeed's own state files (which it then still holds)."""
    import deepspeed  # noqa: F401 - its classes are in the file; this test trusts the file it just wrote

    state = torch.load(state_file, weights_only=False)
    state["evil"] = _Evil(marker)
    torch.save(state, state_file)


@needs_deepspeed
def test_a_crafted_deepspeed_engine_file_is_refused_and_resume_falls_back(tmp_path, ds_run):
    run = tmp_path / "run"
    shutil.copytree(ds_run, run)
    marker = tmp_path / "MARKER"
    newest = run / "checkpoints" / "step-00000002"
    _plant(newest / OPTIM, marker)
    with pytest.raises(CheckpointError, match="zero_pp_rank_0_mp_rank_00_optim_states.pt.*not unpickle"):
        verify_checkpoint(newest)
    verify_checkpoint(run / "checkpoints" / "step-00000001")  # DeepSpeed's real files load with weights_only=True
    proc = mmgpg("train", *DS, "train.max_steps=3", "train.save_every=1", "train.resume=true", f"output_dir={run}")
    assert not marker.exists(), "resuming from a crafted DeepSpeed state file ran code"
    assert "skipping checkpoint" in proc.stderr and "step-00000002" in proc.stderr and "optim_states.pt" in proc.stderr
    assert steps(run) == [1, 2, 3]  # resumed from the intact step 1, as the plain backend does
    verify_checkpoint(run / "checkpoints" / "step-00000002")  # rewritten by the resumed run


@needs_deepspeed
def test_deepspeed_itself_never_unpickles_an_engine_file_beyond_tensors(tmp_path, ds_run):
    """Defence in depth: the backend's own load (after verification) goes through weights_only=True too."""
    run = tmp_path / "run"
    shutil.copytree(ds_run, run)
    marker = tmp_path / "MARKER"
    _plant(run / "checkpoints" / "step-00000002" / OPTIM, marker)
    code = ("import sys; from pathlib import Path\n"
            "from mmgpg.config import resolve; from mmgpg.train.trainer import Trainer\n"
            "from mmgpg.typed import CheckpointError\n"
            f"trainer = Trainer(resolve({[*DS, 'output_dir=' + str(tmp_path / 'fresh')]!r}))\n"
            "try:\n"
            f"    trainer.backend.load_engine_state(Path({str(run / 'checkpoints' / 'step-00000002' / 'engine')!r}))\n"
            "except CheckpointError as err:\n"
            "    print('refused:', err)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert not marker.exists(), "DeepSpeed unpickled a crafted state file"
    assert "refused:" in proc.stdout and "optim_states.pt" in proc.stdout, proc.stdout + proc.stderr[-3000:]


# ---- damaged DeepSpeed engine/ files: skipped like any damaged checkpoint, before DeepSpeed reads them -------------

MODEL_STATES = "engine/state/mp_rank_00_model_states.pt"
ENGINE_DAMAGE = {
    "deleted optimizer partition": (lambda c: (c / OPTIM).unlink(), "zero_pp_rank_0_mp_rank_00_optim_states.pt is missing"),
    "emptied optimizer partition": (lambda c: torch.save({}, c / OPTIM), "holds no 'optimizer_state_dict'"),
    "emptied model states": (lambda c: torch.save({"ds_version": "0"}, c / MODEL_STATES), "holds no 'module'"),
    "truncated optimizer partition": (lambda c: (c / OPTIM).write_bytes((c / OPTIM).read_bytes()[:4096]),
                                      "optim_states.pt is unreadable"),
}


@needs_deepspeed
@pytest.mark.parametrize("case", sorted(ENGINE_DAMAGE))
def test_each_damaged_engine_file_is_detected_before_deepspeed_reads_it(tmp_path, ds_run, case):
    """Each of these passed verification (only engine/'s existence and the files' pickles were checked) and then
    made DeepSpeed's load_checkpoint raise mid-resume, with no fallback."""
    run = tmp_path / "run"
    shutil.copytree(ds_run, run)
    damage, words = ENGINE_DAMAGE[case]
    newest = run / "checkpoints" / "step-00000002"
    damage(newest)
    with pytest.raises(CheckpointError, match=words):
        verify_checkpoint(newest)
    warnings: list[str] = []
    assert latest_checkpoint(run, warn=warnings.append) == run / "checkpoints" / "step-00000001"
    assert len(warnings) == 1 and "step-00000002" in warnings[0]


@needs_deepspeed
def test_a_resume_past_a_damaged_engine_file_falls_back_to_the_intact_checkpoint(tmp_path, ds_run):
    run = tmp_path / "run"
    shutil.copytree(ds_run, run)
    (run / "checkpoints" / "step-00000002" / OPTIM).unlink()
    proc = mmgpg("train", *DS, "train.max_steps=3", "train.save_every=1", "train.resume=true", f"output_dir={run}")
    assert "Traceback" not in proc.stderr
    assert "skipping checkpoint" in proc.stderr and "step-00000002" in proc.stderr and "is missing" in proc.stderr
    assert steps(run) == [1, 2, 3]  # resumed from the intact step 1, as the plain backend does


# ---- a task file named by someone else's run directory ------------------------------------------------------------

THEIR_TASK = """
open({marker!r}, "a").write("code ran\\n")
from mmgpg_tasks.shapes import ShapesParityTask as Theirs
"""


def test_diagnose_and_probe_never_import_a_task_file_named_by_the_run_directory(tmp_path, checkpoint_copy):
    run = checkpoint_copy(tmp_path)
    marker = tmp_path / "MARKER"
    theirs = tmp_path / "their_task.py"
    theirs.write_text(THEIR_TASK.format(marker=str(marker)))
    config = run / "config.yaml"
    config.write_text(config.read_text().replace(TINY[1].partition("=")[2], f"{theirs}:Theirs"))
    assert f"name: {theirs}:Theirs" in config.read_text()

    proc = mmgpg("diagnose", str(run), "--out", str(tmp_path / "diagnose"), check=False)
    assert not marker.exists(), "mmgpg diagnose imported the task file named by the run's config.yaml"
    assert proc.returncode == 0, proc.stderr  # diagnose needs no task: success is in the records

    probe = ["probe", str(run), "--step", "0", "--samples", "2", "--limit", "1", "--batch-prompts", "1",
             "rollout.max_new_tokens=4"]
    proc = mmgpg(*probe, check=False)
    assert not marker.exists(), "mmgpg probe imported the task file named by the run's config.yaml"
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert f"task={theirs}:Theirs" in proc.stderr  # says how to run it once the user has read the file
    other = tmp_path / "other.py"
    other.write_text(THEIR_TASK.format(marker=str(marker)))
    proc = mmgpg(*probe, f"task={other}:Theirs", check=False)  # naming another file does not swap the run's task
    assert proc.returncode == 2 and not marker.exists() and "not this run's task" in proc.stderr, proc.stderr

    # The user names it on the command line: now it is code they chose to run.
    proc = mmgpg(*probe, f"task={theirs}:Theirs")
    assert marker.read_text() == "code ran\n" and "probed 1 prompts" in proc.stdout


# ---- a model folder that asks to run its own code (auto_map, unknown model_type) ----------------------------------

REMOTE_CODE = """
open({marker!r}, "a").write("code ran\\n")
from transformers import PretrainedConfig


class RemoteConfig(PretrainedConfig):
    model_type = "remote_vlm"
"""


@pytest.fixture
def remote_code_model(tmp_path) -> tuple[Path, Path]:
    """A model folder whose config.json maps the Auto classes to its own remote_vlm.py (which writes a marker)."""
    from safetensors.torch import save_file

    model, marker = tmp_path / "remote_model", tmp_path / "MARKER"
    model.mkdir()
    (model / "remote_vlm.py").write_text(REMOTE_CODE.format(marker=str(marker)))
    auto = {name: "remote_vlm.RemoteConfig" for name in ("AutoConfig", "AutoModelForImageTextToText", "AutoProcessor")}
    (model / "config.json").write_text(json.dumps({"model_type": "remote_vlm", "auto_map": auto}))
    save_file({"w": torch.zeros(2)}, str(model / "model.safetensors"))
    return model, marker


@pytest.mark.parametrize("command", ["eval", "model info", "plan"])
def test_a_model_folder_with_its_own_code_is_refused_without_a_prompt(tmp_path, remote_code_model, command):
    model, marker = remote_code_model
    args = {"eval": ["eval", "--task", "shapes", "--ckpt", str(model), "--limit", "1", "--output", str(tmp_path / "e")],
            "model info": ["model", "info", str(model)],
            "plan": ["plan", "--gpus", "1", "--gpu-memory-gb", "80", f"model.name_or_path={model}"]}[command]
    proc = subprocess.run([sys.executable, "-m", "mmgpg", *args], input="y\n", capture_output=True, text=True,
                          timeout=300)
    assert not marker.exists(), f"mmgpg {command} ran the model folder's code after a 'y' on stdin"
    assert "[y/N]" not in proc.stdout + proc.stderr  # never asks
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "runs code" in proc.stderr and str(model) in proc.stderr, proc.stderr
