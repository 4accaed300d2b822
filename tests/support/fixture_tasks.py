"""Tasks for trainer tests: real shapes images and prompts, but rewards that a random-init model already varies on,
so that groups have reward variance and updates are not all skipped."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from mmgpg_tasks.scenes import ScenesTask
from mmgpg_tasks.shapes import ShapesParityTask, ShapesTask

# Loaded by the tests as `fixture_tasks.py:ParityShapes`, which also exercises the path/to/file.py:Class loader.
ParityShapes = ShapesParityTask


@dataclass
class HalfSolvedShapes(ShapesTask):
    """Items with an even index are 'solved' (every completion scores 1: a zero-variance group); odd ones reward
    even-length completions. Resampling has something to do."""

    name: ClassVar[str] = "half_solved_shapes"
    version: ClassVar[str] = "test"

    def __post_init__(self):
        super().__post_init__()
        self.rewards = {"accuracy": lambda c, ex: 1.0 if int(ex.id.rsplit("-", 1)[1]) % 2 == 0 else float(len(c) % 2 == 0)}


@dataclass
class SolvedShapes(ShapesTask):
    """Every completion scores 1: every group has zero variance, so GPG skips every step."""

    name: ClassVar[str] = "solved_shapes"
    version: ClassVar[str] = "test"

    def __post_init__(self):
        super().__post_init__()
        self.rewards = {"accuracy": lambda c, ex: 1.0}


@dataclass
class NaNRewardShapes(ShapesTask):
    """A buggy task whose reward is NaN for odd-length completions."""

    name: ClassVar[str] = "nan_reward_shapes"
    version: ClassVar[str] = "test"

    def __post_init__(self):
        super().__post_init__()
        self.rewards = {"accuracy": lambda c, ex: float("nan") if len(c) % 2 else 1.0}


@dataclass
class JudgeCountingScenes(ScenesTask):
    """The scenes task (count_mc) recording each judge call as ``(example id, protocol)`` in :attr:`judged`."""

    name: ClassVar[str] = "judge_counting_scenes"
    version: ClassVar[str] = "test"

    def __post_init__(self):
        super().__post_init__()
        self.judged: list[tuple[str, str]] = []

    def judge(self, completion, example, protocol):
        self.judged.append((example.id, protocol))
        return super().judge(completion, example, protocol)
