"""Small run plumbing: seeding, graceful stops on SIGTERM/Ctrl-C, the console, the safe ``torch.load``."""

from __future__ import annotations

import random
import re
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's (CPU and every GPU) random generators."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class GracefulStop:
    """While active (``with``): SIGTERM or a first Ctrl-C asks the loop to stop at the next step boundary with a
    checkpoint (``requested``); a second Ctrl-C aborts at once (``KeyboardInterrupt``). The previous handlers come
    back on exit. ``next_step()`` names the step the message promises; ``announce`` prints it (rank 0)."""

    def __init__(self, next_step: Callable[[], int], announce: bool = True):
        self.next_step, self.announce, self.requested = next_step, announce, False
        self._previous: dict = {}

    def _handle(self, signum, frame) -> None:
        if self.requested and signum == signal.SIGINT:  # a second Ctrl-C aborts at once, without saving
            raise KeyboardInterrupt
        self.requested = True
        if self.announce:
            print(f"\n{signal.Signals(signum).name}: stopping after step {self.next_step()} with a checkpoint; "
                  "press Ctrl-C again to abort now without saving", file=sys.stderr, flush=True)

    def __enter__(self) -> GracefulStop:
        self._previous = {s: signal.signal(s, self._handle) for s in (signal.SIGTERM, signal.SIGINT)}
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)


def console():
    """A rich console; when output is piped (logs, tests) lines are not wrapped at 80 columns."""
    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=200)


def safe_load(path: Path, mmap: bool = False, allow: list | tuple = (), label: str | None = None,
               map_location: Any = "cpu") -> Any:
    """``torch.load(weights_only=True)``: tensors and plain data only; a file that needs more is refused.
    ``mmap``: map the tensors instead of reading them (a cheap check of a large optimizer state). ``allow``: classes
    besides plain data that may be rebuilt (:data:`mmgpg.backends.deepspeed.ENGINE_SAFE_GLOBALS` for DeepSpeed's
    files); ``label``: the file's name in messages (default its file name); ``map_location`` as torch.load's."""
    from mmgpg.typed import CheckpointError

    label = label or path.name
    if not path.is_file():
        raise CheckpointError(f"{label} is missing")
    try:
        with torch.serialization.safe_globals(list(allow)):
            try:
                return torch.load(path, weights_only=True, map_location=map_location, mmap=mmap)
            except RuntimeError as err:
                if mmap and "mmap can only be used with files saved with" in str(err):  # the legacy format
                    return torch.load(path, weights_only=True, map_location=map_location)
                raise
    except Exception as err:  # noqa: BLE001 - torch raises many types for bad files; each becomes one message
        text = str(err)
        if "Weights only load failed" in text or "Unsupported global" in text:
            found = re.search(r"Unsupported global: GLOBAL (\S+)", text)
            raise CheckpointError(f"{label} holds Python objects other than tensors and plain data"
                                  + (f" ({found.group(1)})" if found else "") + "; mmgpg does not unpickle those "
                                  "(they can run code). It was written by an older mmgpg or tampered with") from None
        first = text.splitlines()[0][:200] if text.strip() else "empty or truncated file"
        raise CheckpointError(f"{label} is unreadable ({type(err).__name__}: {first})") from None
