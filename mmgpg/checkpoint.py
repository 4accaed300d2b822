"""Checkpoints: the policy as a standard Hugging Face directory, the trainer state beside it, written atomically.

Layout of ``<output_dir>/checkpoints/step-00000010/``::

    policy/                    # model.save_pretrained + processor.save_pretrained: loads in plain transformers / vLLM
    trainer_state.pt           # optimizer, scheduler, step, data stream, counters (rank 0)
    rng_rank{R}.pt             # Python, NumPy and torch RNG states of rank R
    COMPLETE                   # written last; a directory without it is never used

Everything is first written to ``.tmp-step-...`` and renamed to its final name, so a crash at any point leaves the
previous checkpoint as the latest complete one.
"""

from __future__ import annotations

import json
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mmgpg import distributed

_STEP_DIR = re.compile(r"step-(\d{8})")


def checkpoint_root(output_dir: str | Path) -> Path:
    return Path(output_dir) / "checkpoints"


def complete_checkpoints(output_dir: str | Path) -> list[Path]:
    """Complete checkpoint directories, oldest first."""
    root = checkpoint_root(output_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and _STEP_DIR.fullmatch(p.name) and (p / "COMPLETE").is_file()]
    return sorted(found, key=lambda p: int(p.name[5:]))


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    done = complete_checkpoints(output_dir)
    return done[-1] if done else None


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(output_dir: str | Path, step: int, policy, trainer_state: dict[str, Any], keep_last: int) -> Path:
    """Write checkpoint ``step`` (collective: every rank calls it) and prune to the newest ``keep_last``."""
    info = distributed.current()
    root = checkpoint_root(output_dir)
    final = root / f"step-{step:08d}"
    tmp = root / f".tmp-step-{step:08d}"
    if info.is_main:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        policy.model.save_pretrained(tmp / "policy")
        policy.processor.save_pretrained(tmp / "policy")
        torch.save(trainer_state, tmp / "trainer_state.pt")
    distributed.barrier()
    torch.save(rng_state(), tmp / f"rng_rank{info.rank}.pt")
    distributed.barrier()
    if info.is_main:
        (tmp / "COMPLETE").write_text(json.dumps({"step": step, "world_size": info.world_size}) + "\n")
        if final.exists():  # a checkpoint of this step from an earlier, interrupted attempt
            shutil.rmtree(final)
        tmp.rename(final)
        for old in complete_checkpoints(output_dir)[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
        for stale in root.glob(".tmp-step-*"):
            shutil.rmtree(stale, ignore_errors=True)
    distributed.barrier()
    return final


def load_trainer_state(checkpoint: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(trainer_state, this rank's rng state)`` of a complete checkpoint."""
    info = distributed.current()
    meta = json.loads((checkpoint / "COMPLETE").read_text())
    if meta["world_size"] != info.world_size:
        raise ValueError(f"{checkpoint} was written by {meta['world_size']} ranks; this run has {info.world_size}. "
                         "Resume with the same number of processes.")
    state = torch.load(checkpoint / "trainer_state.pt", weights_only=False)
    rng = torch.load(checkpoint / f"rng_rank{info.rank}.pt", weights_only=False)
    return state, rng
