"""A plugin outside mmgpg that adds an engine, a backend and an advantage through the registries' public API (as a
third-party package would, at import; an installed package can instead name them under the entry-point groups
``mmgpg.engines`` / ``mmgpg.backends`` / ``mmgpg.advantages``)."""

from __future__ import annotations

import torch

from mmgpg.backends import BACKENDS
from mmgpg.backends.plain import PlainBackend
from mmgpg.registry import ADVANTAGES
from mmgpg.rollout.engine import ENGINES
from mmgpg.rollout.hf import HFEngine


class CountingEngine(HFEngine):
    """The real HF engine, counting its calls."""

    calls: list[tuple[int, float]] = []

    def generate(self, conversations, group_size, sampling):
        CountingEngine.calls.append((group_size, sampling.temperature))
        return super().generate(conversations, group_size, sampling)


class CountingBackend(PlainBackend):
    """The real plain backend, counting optimizer steps."""

    steps = 0

    def step(self):
        CountingBackend.steps += 1
        return super().step()


def doubled_group_mean(rewards: torch.Tensor) -> torch.Tensor:
    """``2 (r - mean_group r)``: GPG's advantage, doubled (so a test can see that it was used)."""
    return 2.0 * (rewards - rewards.mean(dim=1, keepdim=True))


def register() -> None:
    ENGINES.register("counting", CountingEngine, replace=True)
    BACKENDS.register("counting", f"{__name__}:CountingBackend", replace=True)
    ADVANTAGES.register("doubled_group_mean", doubled_group_mean, replace=True)


register()
