"""Small run plumbing: seeding and run directories."""

from __future__ import annotations

import random
import time
from pathlib import Path

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's (CPU and every GPU) random generators."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def run_dir_path(output_dir: str, command: str) -> Path:
    """``output_dir``, or ``runs/<command>-<YYYYmmdd-HHMMSS>`` when it is empty (the one default spelling)."""
    return Path(output_dir) if output_dir else Path("runs") / f"{command}-{time.strftime('%Y%m%d-%H%M%S')}"


def make_run_dir(output_dir: str, command: str) -> Path:
    """:func:`run_dir_path`, created."""
    path = run_dir_path(output_dir, command)
    path.mkdir(parents=True, exist_ok=True)
    return path


def resolve_device(name: str) -> torch.device:
    """``auto`` → ``cuda:LOCAL_RANK`` when a GPU exists, else ``cpu``; anything else as torch reads it."""
    if name == "auto":
        from mmgpg.policy import default_device

        return default_device()
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={name!r} but torch sees no CUDA GPU; use device=cpu or device=auto")
    return device
