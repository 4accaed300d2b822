"""Tasks for trainer tests: real shapes images and prompts, but rewards that a random-init model already varies on,
so that groups have reward variance and updates are not all skipped; and a text-only task for the text policies."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from mmgpg_tasks.moving_shapes import MovingShapesTask
from mmgpg_tasks.scenes import ScenesTask
from mmgpg_tasks.shapes import ShapesParityTask, ShapesTask, length_parity

from mmgpg.task import Example, LazyExamples, Task
from mmgpg.task.rewards import answer_tag

# Loaded by the tests as `fixture_tasks.py:ParityShapes`, which also exercises the path/to/file.py:Class loader.
ParityShapes = ShapesParityTask


@dataclass
class ParityMovingShapes(MovingShapesTask):
    """moving_shapes clips (video prompts) rewarding even-length completions: a random model's groups vary."""

    name: ClassVar[str] = "parity_moving_shapes"
    version: ClassVar[str] = "test"

    def __post_init__(self):
        super().__post_init__()
        self.rewards = {"accuracy": lambda c, ex: length_parity(c)}


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
class NearlySolvedShapes(ShapesTask):
    """Every completion scores 1, plus 0.001 for an odd length: groups differ by at most 0.001 (zero variance under
    algo.zero_variance_tol=0.01, informative under 0)."""

    name: ClassVar[str] = "nearly_solved_shapes"
    version: ClassVar[str] = "test"

    def __post_init__(self):
        super().__post_init__()
        self.rewards = {"accuracy": lambda c, ex: 1.0 + 0.001 * (len(c) % 2)}


@dataclass
class NaNRewardShapes(ShapesTask):
    """A buggy task whose reward is NaN for odd-length completions."""

    name: ClassVar[str] = "nan_reward_shapes"
    version: ClassVar[str] = "test"

    def __post_init__(self):
        super().__post_init__()
        self.rewards = {"accuracy": lambda c, ex: float("nan") if len(c) % 2 else 1.0}


@dataclass
class MisbehavingShapes(ShapesTask):
    """A buggy task for ``mmgpg check``: its accuracy reward is always NaN and its ``success`` returns a number (the
    format reward), not a bool."""

    name: ClassVar[str] = "misbehaving_shapes"
    version: ClassVar[str] = "test"

    def __post_init__(self):
        super().__post_init__()
        self.rewards = {**self.rewards, "accuracy": lambda c, ex: float("nan")}

    def success(self, completion: str, example: Example, rewards) -> bool:
        return rewards["format"]  # a float: the bug `mmgpg check` must report


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


@dataclass
class TextParity(Task):
    """Text-only prompts for the text policies (no images): "Is 4821 even or odd?", answered in ``<answer>`` tags.

    ``accuracy`` is the right word (a random-init model almost never earns it; SFT on the gold answers does), and
    ``length_parity`` is 1 for an even-length completion, which a random model earns about half the time, so its groups
    have reward variance and every training step really updates. Items are a pure function of (seed, split, index).
    """

    name: ClassVar[str] = "text_parity"
    version: ClassVar[str] = "test"

    num_train: int = 64
    num_test: int = 16
    seed: int = 0

    def __post_init__(self):
        self.rewards = {"accuracy": lambda c, ex: float((answer_tag(c) or "").strip().lower() == ex.answer),
                        "length_parity": lambda c, ex: float(len(c) % 2 == 0)}

    def example(self, split: str, index: int) -> Example:
        rng = random.Random(f"{self.seed}:{split}:{index}")
        number = rng.randint(0, 10 ** rng.randint(1, 5))  # 1 to 6 digits: prompts of different token lengths
        return Example(id=f"text-parity-{split}-{index}", media=[], answer="odd" if number % 2 else "even",
                       question=f"Is {number} even or odd? Put the word in <answer> </answer> tags.")

    def load(self, split: str) -> Sequence[Example]:
        sizes = {"train": self.num_train, "test": self.num_test}
        if split not in sizes:
            raise ValueError(f"text_parity has splits train, test; got {split!r}")
        return LazyExamples(sizes[split], lambda index: self.example(split, index))

    def prompt(self, example: Example) -> list[dict]:
        return [{"role": "user", "content": [{"type": "text", "text": example.question}]}]

    def success(self, completion: str, example: Example, rewards) -> bool:
        return rewards["accuracy"] >= 1.0

    def gold_completion(self, example: Example) -> str:
        return f"<answer>{example.answer}</answer>"

    def example_from_record(self, record: dict) -> Example:
        """``mmgpg eval --predictions``: a row's question and ground truth (the default ``record_fields``)."""
        return Example(id=str(record["id"]), media=[], answer=str(record["ground_truth"]),
                       question=str(record.get("question", "")))


@dataclass
class TextParityCoin(TextParity):
    """:class:`TextParity` prompts whose ``accuracy`` is the length-parity coin: a random-init model is right about
    half the time, so sampled evaluation has problems with some, all and no samples correct (pass@k is not 0)."""

    name: ClassVar[str] = "text_parity_coin"

    def __post_init__(self):
        super().__post_init__()
        self.rewards = {"accuracy": self.rewards["length_parity"]}
