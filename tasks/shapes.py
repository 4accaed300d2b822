"""``shapes``: count the shapes in a procedurally drawn picture — an embedded, offline task.

Each image has between ``min_shapes`` and ``max_shapes`` non-overlapping circles, squares and triangles in random
colours on a background of the CLIP mean colour (123, 117, 104), which Qwen2-VL's normalisation maps to about zero. In
the experiment that chose it (a 1 M-parameter tiny Qwen2-VL fine-tuned on CPU at lr 1e-3), a white background kept
counting accuracy at chance for 10 minutes: the merged image embeddings were nearly identical across images and the
answer probabilities did not depend on the number of shapes. Qwen2-VL's patch embedding has no bias, so on the mean
colour the background patches embed to about zero; the same model then reached 83 % in 4 minutes. Image sizes vary
between items so batches mix image shapes.

A record (``split="train"``, index 0, seed 0) looks like::

    Example(id="shapes-train-0", media=[<PIL 112x112>], question="How many shapes are in the image? ...",
            answer=3, meta={"sizes": ..., "kinds": [...]})

Rewards: ``accuracy`` (the ``<answer>`` is exactly the right integer) and ``format``
(``<think>…</think><answer>…</answer>``, the GPG authors' rule applied to the stripped completion). Items are a pure function of
``(seed, split, index)``, so every run, rank and resume sees the same data without files.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import ClassVar

from PIL import Image, ImageDraw

from mmgpg.task import Example, GeneratedTask
from mmgpg.task.rewards import format_reward, integer_accuracy, parse_int

BACKGROUND = (123, 117, 104)
COLOURS = {
    "red": (220, 40, 40),
    "green": (40, 180, 60),
    "blue": (40, 80, 220),
    "yellow": (230, 210, 40),
    "white": (245, 245, 245),
}
KINDS = ("circle", "square", "triangle")
SIZES = ((112, 112), (84, 140), (140, 84), (112, 84))
QUESTION = (
    "How many shapes are in the image? Output the thinking process in <think> </think> and final answer (number) "
    "in <answer> </answer> tags."
)


def draw_scene(rng: random.Random, width: int, height: int, count: int, size_range: tuple[int, int] = (14, 22)):
    """Draw ``count`` non-overlapping shapes; return the image and the list of (kind, colour, box)."""
    image = Image.new("RGB", (width, height), BACKGROUND)
    draw = ImageDraw.Draw(image)
    placed: list[tuple[int, int, int, int]] = []
    shapes = []
    attempts = 0
    while len(placed) < count:
        attempts += 1
        if attempts > 10_000:
            raise RuntimeError(f"could not place {count} shapes in {width}x{height}; lower max_shapes")
        s = rng.randint(*size_range)
        x, y = rng.randint(1, width - s - 1), rng.randint(1, height - s - 1)
        box = (x, y, x + s, y + s)
        if any(not (box[2] + 2 < b[0] or b[2] + 2 < box[0] or box[3] + 2 < b[1] or b[3] + 2 < box[1]) for b in placed):
            continue
        kind, colour = rng.choice(KINDS), rng.choice(list(COLOURS))
        fill = COLOURS[colour]
        if kind == "circle":
            draw.ellipse(box, fill=fill)
        elif kind == "square":
            draw.rectangle(box, fill=fill)
        else:
            draw.polygon([(x + s / 2, y), (x, y + s), (x + s, y + s)], fill=fill)
        placed.append(box)
        shapes.append((kind, colour, box))
    return image, shapes


@dataclass
class ShapesTask(GeneratedTask):
    """Count shapes in procedurally drawn images (embedded; no downloads)."""

    name: ClassVar[str] = "shapes"
    version: ClassVar[str] = "1"
    rewards: ClassVar[dict] = {}  # set per instance in __post_init__: {"accuracy": fn, "format": fn}

    num_train: int = 4000
    """Items in the train split."""
    num_test: int = 200
    """Items in the test split."""
    min_shapes: int = 1
    """Fewest shapes in an image."""
    max_shapes: int = 5
    """Most shapes in an image."""
    seed: int = 0
    """Data seed; items are a pure function of (seed, split, index)."""
    format_reward: bool = True
    """Include the format reward (<think>...</think><answer>...</answer>) besides accuracy."""

    def __post_init__(self):
        if not 1 <= self.min_shapes <= self.max_shapes <= 8:
            raise ValueError(f"need 1 <= min_shapes <= max_shapes <= 8; got {self.min_shapes}, {self.max_shapes}")
        self.rewards = {"accuracy": lambda completion, ex: integer_accuracy(completion, ex.answer)}
        if self.format_reward:
            self.rewards["format"] = lambda completion, ex: format_reward(completion.strip())

    def example(self, split: str, index: int) -> Example:
        self.check_item(split, index)
        rng = random.Random(f"{self.seed}:{split}:{index}")
        width, height = rng.choice(SIZES)
        count = rng.randint(self.min_shapes, self.max_shapes)
        image, shapes = draw_scene(rng, width, height, count)
        return Example(
            id=f"shapes-{split}-{index}",
            media=[image],
            question=QUESTION,
            answer=count,
            meta={"kinds": [k for k, _, _ in shapes], "colours": [c for _, c, _ in shapes]},
        )

    def example_from_record(self, record: dict) -> Example:
        """An example from a predictions row (``id``, ``ground_truth``), for ``mmgpg eval --predictions``."""
        if record.get("ground_truth") is None or parse_int(str(record["ground_truth"])) is None:
            raise ValueError(f"shapes predictions: record {record.get('id')!r} needs an integer ground_truth")
        return Example(id=str(record.get("id", "")), media=[], question=str(record.get("question", QUESTION)),
                       answer=parse_int(str(record["ground_truth"])))

    def success(self, completion: str, example: Example, rewards) -> bool:
        """The accuracy reward is 1 (the right count; for shapes_parity, an even-length completion)."""
        return rewards["accuracy"] >= 1.0

    def gold_completion(self, example: Example) -> str:
        """The answer in the task's output format (used by SFT and pre-flight checks)."""
        return f"<think>I count {example.answer} shapes.</think><answer>{example.answer}</answer>"


def length_parity(completion: str) -> float:
    """1.0 when the completion has an even number of characters: about half of a random model's completions."""
    return float(len(completion) % 2 == 0)


@dataclass
class ShapesParityTask(ShapesTask):
    """Shapes prompts and images with a length-parity reward (benchmarks and tests of the training machinery).

    A randomly initialised model earns nothing on ``shapes`` (every group has zero variance, so GPG skips every
    update); with this reward about half of its completions score 1, so each step really runs forward, backward
    and the optimizer. It teaches nothing about images: use it to measure and test, not to train.
    """

    name: ClassVar[str] = "shapes_parity"
    version: ClassVar[str] = "1"

    def __post_init__(self):
        super().__post_init__()
        self.rewards = {"accuracy": lambda completion, ex: length_parity(completion)}
