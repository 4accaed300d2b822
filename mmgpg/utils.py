"""Small run plumbing: seeding, graceful stops on SIGTERM/Ctrl-C, the console, transformers' progress bars off around
mmgpg's own saves and loads, DeepSpeed's import without its CPU notice, the safe ``torch.load``, measured peak memory per phase."""

from __future__ import annotations

import contextlib
import logging
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


@contextlib.contextmanager
def no_transformers_bars():
    """Inside: transformers' own progress bars ("Writing model shards" on every ``save_pretrained``, "Loading weights"
    on every ``from_pretrained``) are not drawn; they would repeat at every checkpoint of a run's log. Only these
    bars: through ``transformers.utils.logging.set_tqdm_hook``, whose previous hook (the user's, if any) is chained
    and put back on exit, so the user's setting (``disable_progress_bar()``, ``HF_HUB_DISABLE_PROGRESS_BARS``) and
    the hub's download bars are untouched. Transformers without the hook: its ``disable_progress_bar()``, undone on
    exit when the bars were on."""
    from transformers.utils import logging as hf_logging

    if not hasattr(hf_logging, "set_tqdm_hook"):
        was_on = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()
        try:
            yield
        finally:
            if was_on:
                hf_logging.enable_progress_bar()
        return

    def quiet(factory, args, kwargs):
        kwargs = {**kwargs, "disable": True}
        return previous(factory, args, kwargs) if previous is not None else factory(*args, **kwargs)

    previous = hf_logging.set_tqdm_hook(quiet)
    try:
        yield
    finally:
        hf_logging.set_tqdm_hook(previous)


DEEPSPEED_CPU_NOTICE = "Setting accelerator to CPU"
"""The start of the warning DeepSpeed (0.19) logs at import when torch sees no CUDA device."""


NO_CUDA_NOTICE = "No CUDA runtime is found"
"""The start of the warning torch's ``cpp_extension`` logs at import without CUDA (DeepSpeed imports it to JIT-build
its CPU communication op)."""


class _DropPrefix(logging.Filter):
    def __init__(self, prefix: str):
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefix)


@contextlib.contextmanager
def quiet_deepspeed_import():
    """Inside (around ``import deepspeed``, and around transformers' ``save_pretrained`` / ``from_pretrained``, in
    which accelerate imports DeepSpeed when it is installed): DeepSpeed's "Setting accelerator to CPU. If you have GPU or other
    accelerator, we were unable to detect it." is dropped, every other message of its ``DeepSpeed`` logger kept.
    DeepSpeed logs it exactly when ``torch.cuda.is_available()`` is false, so on a CPU run (and ``mmgpg plan`` on a
    login node) it is noise; a run that asks for ``device=cuda`` without one is refused by mmgpg itself. Likewise
    torch's "No CUDA runtime is found, using CUDA_HOME=..." when DeepSpeed builds its CPU op. Only these records, only
    inside: filters on the two loggers, removed on exit."""
    filters = [(logging.getLogger("DeepSpeed"), _DropPrefix(DEEPSPEED_CPU_NOTICE)),
               (logging.getLogger("torch.utils.cpp_extension"), _DropPrefix(NO_CUDA_NOTICE))]
    for logger, drop in filters:
        logger.addFilter(drop)
    try:
        yield
    finally:
        for logger, drop in filters:
            logger.removeFilter(drop)


class PeakMemory:
    """Peak memory of each phase of a step, measured, not estimated: the process's peak resident set (Linux
    ``VmHWM``, reset before each phase by writing ``5`` to ``/proc/self/clear_refs``; elsewhere the lifetime peak of
    ``getrusage``, which cannot be reset) and, on a CUDA device, torch's ``max_memory_allocated`` /
    ``max_memory_reserved`` (reset with ``reset_peak_memory_stats``). ``with meter.phase("rollout"): ...`` records
    ``memory/rollout_rss_mib`` (+ ``memory/rollout_cuda_allocated_mib`` / ``_reserved_mib``) into :attr:`last`."""

    _CLEAR_REFS = "/proc/self/clear_refs"
    _STATUS = "/proc/self/status"

    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda" and torch.cuda.is_available()
        self.last: dict[str, float] = {}
        self._open: list[str] = []
        self._seen: dict[str, tuple[int, int, int]] = {}
        self.resettable = self._reset_rss()

    def _reset_rss(self) -> bool:
        try:
            with open(self._CLEAR_REFS, "w") as f:
                f.write("5")
            return True
        except OSError:
            return False

    def rss_peak_bytes(self) -> int:
        """The peak resident set since the last reset (bytes)."""
        try:
            with open(self._STATUS) as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) * 1024  # kB
        except OSError:
            pass
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, kB elsewhere

    def _reading(self) -> tuple[int, int, int]:
        """(peak RSS, peak CUDA allocated, peak CUDA reserved) since the last reset, in bytes."""
        if not self.cuda:
            return self.rss_peak_bytes(), 0, 0
        return (self.rss_peak_bytes(), torch.cuda.max_memory_allocated(self.device),
                torch.cuda.max_memory_reserved(self.device))

    def _reset(self) -> None:
        if self.resettable:
            self._reset_rss()
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)

    @contextlib.contextmanager
    def phase(self, name: str):
        """Measure the block as phase ``name``. Phases nest (``sync`` inside ``update``): an enclosing phase's peak
        is the largest of what it saw before, during and after the inner one (the inner one resets the counters)."""
        def fold(into: str, reading: tuple[int, int, int]) -> None:
            self._seen[into] = tuple(max(a, b) for a, b in zip(self._seen.get(into, (0, 0, 0)), reading))

        before = self._reading()
        for outer in self._open:  # what the enclosing phases have seen so far, before the reset below
            fold(outer, before)
        self._reset()
        self._open.append(name)
        try:
            yield
        finally:
            self._open.pop()
            reading = self._reading()
            for outer in self._open:
                fold(outer, reading)
            fold(name, reading)
            rss, allocated, reserved = self._seen.pop(name)
            mib = 2**20
            self.last[f"memory/{name}_rss_mib"] = rss / mib
            if self.cuda:
                self.last[f"memory/{name}_cuda_allocated_mib"] = allocated / mib
                self.last[f"memory/{name}_cuda_reserved_mib"] = reserved / mib


def safe_load(path: Path, mmap: bool = False, allow: list | tuple = (), label: str | None = None,
               map_location: Any = "cpu") -> Any:
    """``torch.load(weights_only=True)``: tensors and plain data only; a file that needs more is refused.
    ``mmap``: map the tensors instead of reading them (a cheap check of a large optimizer state). ``allow``: classes
    besides plain data that may be rebuilt (:data:`mmgpg.backends.deepspeed_state.ENGINE_SAFE_GLOBALS` for DeepSpeed's
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
