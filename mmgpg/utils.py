"""Small run plumbing: seeding, graceful stops on SIGTERM/Ctrl-C, the console."""

from __future__ import annotations

import random
import signal
import sys
from collections.abc import Callable

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
