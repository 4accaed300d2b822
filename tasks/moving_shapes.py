"""``moving_shapes``: questions about a short clip that no single frame answers — an embedded, offline video task.

Each item is a short clip (a list of frames, given to the policy as one video part) on a background of the CLIP mean
colour (123, 117, 104, as ``shapes``: the tiny models' patch embeddings map it to about zero). Three kinds
(``task.kind``):

* ``total``: ``shapes``' counting spread over time. 1-5 non-overlapping shapes are placed as in ``shapes``, and each
  is shown in one frame only (at least two frames hold shapes when there are two or more), so no frame holds them
  all; the question is how many shapes the clip shows in all (chance 20 %). With ``frames=2`` (one temporal patch)
  the tiny models learn it as they learn image counting (the video demo, docs/demo.md); with 4 frames (two patches)
  their SFT warm start stays at chance and RL lifted one seed of two.
* ``count`` (default): a shape (circle, square or triangle, random colour and place) appears in some of the frames
  and the others are empty; the question is in how many frames a shape appears (1 .. ``frames``). Any one frame
  shows at most one shape, so one frame never tells the count.
* ``direction``: one shape crosses the frame in a straight line, left, right, up or down, beside a still distractor
  shape; only the order of the frames tells the answer (chance 25 %).

Neither of these two is learnt by the demo's tiny Qwen2-VL with the shapes demo's settings (measured once, seed 0, on
CPU): direction stayed at chance after 200 SFT and 80 GPG steps, count (64 and 112 pixel frames) after 200 and 800
SFT steps and 160 GPG steps, answering one count for every clip although its video features differ with the count.

A record (``split="train"``, index 0, seed 0, ``kind=count``) looks like::

    Example(id="moving_shapes-train-0", media=[{"type": "video", "video": [<PIL 112x112> x 4], "fps": 2.0}],
            question="In how many of the video's frames does a shape appear? ...", answer=3,
            meta={"kind": "count", "frames_with_shape": [0, 2, 3]})

Rewards: ``accuracy`` (the ``<answer>`` is the count, or the direction with case and spaces ignored) and ``format``
(``<think>…</think><answer>…</answer>``). Items are a pure function of ``(seed, split, index)``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import ClassVar

from mmgpg_tasks.shapes import BACKGROUND, COLOURS, KINDS, draw_scene
from PIL import Image, ImageDraw

from mmgpg.task import Example, GeneratedTask
from mmgpg.task.rewards import extract_answer, format_reward, integer_accuracy

DIRECTIONS = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}
TOTAL_QUESTION = ("How many shapes appear in the video in all? Output the thinking process in <think> </think> and "
                  "the final answer (number) in <answer> </answer> tags.")
COUNT_QUESTION = ("In how many of the video's frames does a shape appear? Output the thinking process in <think> "
                  "</think> and the final answer (number) in <answer> </answer> tags.")
QUESTION = ("In which direction does the moving shape go: left, right, up or down? Output the thinking process in "
            "<think> </think> and the final answer (one word) in <answer> </answer> tags.")


def draw_shape(draw: ImageDraw.ImageDraw, kind: str, box: tuple[int, int, int, int], fill) -> None:
    x0, y0, x1, y1 = box
    if kind == "circle":
        draw.ellipse(box, fill=fill)
    elif kind == "square":
        draw.rectangle(box, fill=fill)
    else:
        draw.polygon([((x0 + x1) / 2, y0), (x0, y1), (x1, y1)], fill=fill)


def direction_accuracy(completion: str, answer: str) -> float:
    """1.0 when the ``<answer>`` is the direction (case and surrounding spaces ignored).

    >>> direction_accuracy("<think>it goes</think><answer> Left </answer>", "left")
    1.0
    >>> direction_accuracy("<answer>up</answer>", "left"), direction_accuracy("left", "left")
    (0.0, 0.0)
    """
    got = extract_answer(completion)
    return float(got is not None and got.strip().lower() == answer)


@dataclass
class MovingShapesTask(GeneratedTask):
    """Questions about a short procedurally drawn clip that no single frame answers (embedded video task)."""

    name: ClassVar[str] = "moving_shapes"
    version: ClassVar[str] = "1"
    rewards: ClassVar[dict] = {}  # set per instance: {"accuracy": fn, "format": fn}

    kind: str = "count"
    """count (in how many frames a shape appears), total (how many shapes the clip shows, each in one frame) or
    direction (which way one shape moves)."""
    num_train: int = 4000
    """Items in the train split."""
    num_test: int = 200
    """Items in the test split."""
    frames: int = 4
    """Frames per clip (even: Qwen-VL encodes frames in pairs)."""
    size: int = 112
    """Frame width and height in pixels."""
    fps: float = 2.0
    """The rate the frames are said to be taken at (Qwen3-VL's timestamps, Qwen2.5-VL's temporal positions)."""
    seed: int = 0
    """Data seed; items are a pure function of (seed, split, index)."""
    format_reward: bool = True
    """Include the format reward (<think>...</think><answer>...</answer>) besides accuracy."""

    def __post_init__(self):
        if self.kind not in ("count", "total", "direction"):
            raise ValueError(f"kind must be count, total or direction; got {self.kind!r}")
        if self.frames < 2 or self.frames % 2:
            raise ValueError(f"frames must be even and at least 2 (Qwen-VL encodes frame pairs); got {self.frames}")
        if not 32 <= self.size <= 448:
            raise ValueError(f"size must be 32..448 pixels; got {self.size}")
        if self.fps <= 0:
            raise ValueError(f"fps must be positive; got {self.fps}")
        if self.kind in ("count", "total"):
            self.rewards = {"accuracy": lambda completion, ex: integer_accuracy(completion, ex.answer)}
        else:
            self.rewards = {"accuracy": lambda completion, ex: direction_accuracy(completion, ex.answer)}
        if self.format_reward:
            self.rewards["format"] = lambda completion, ex: format_reward(completion.strip())

    def example(self, split: str, index: int) -> Example:
        self.check_item(split, index)
        rng = random.Random(f"{self.seed}:{split}:{index}")
        if self.kind == "count":
            return self._count_example(rng, f"moving_shapes-{split}-{index}")
        if self.kind == "total":
            return self._total_example(rng, f"moving_shapes-{split}-{index}")
        direction = rng.choice(list(DIRECTIONS))
        dx, dy = DIRECTIONS[direction]
        side = max(8, self.size // 6)
        travel = self.size - side - 4  # the path spans most of the frame
        step = travel // (self.frames - 1)
        kind, colour = rng.choice(KINDS), rng.choice(list(COLOURS))
        other_kind, other_colour = rng.choice(KINDS), rng.choice([c for c in COLOURS if c != colour])
        cross = rng.randint(2, self.size - side - 2)  # the coordinate across the motion
        begin = 2 if (dx + dy) > 0 else 2 + step * (self.frames - 1)
        still = (rng.randint(2, self.size - side - 2), rng.randint(2, self.size - side - 2))
        frames = []
        for t in range(self.frames):
            along = begin + (dx + dy) * step * t
            x, y = (along, cross) if dx else (cross, along)
            frame = Image.new("RGB", (self.size, self.size), BACKGROUND)
            draw = ImageDraw.Draw(frame)
            draw_shape(draw, other_kind, (*still, still[0] + side, still[1] + side), COLOURS[other_colour])
            draw_shape(draw, kind, (x, y, x + side, y + side), COLOURS[colour])
            frames.append(frame)
        return Example(id=f"moving_shapes-{split}-{index}",
                       media=[{"type": "video", "video": frames, "fps": self.fps}], question=QUESTION,
                       answer=direction, meta={"kind": "direction", "shape": kind, "colour": colour, "step": step})

    def _count_example(self, rng: random.Random, ident: str) -> Example:
        count = rng.randint(1, self.frames)
        shown = sorted(rng.sample(range(self.frames), count))
        side = max(8, self.size // 5)
        frames = []
        for t in range(self.frames):
            frame = Image.new("RGB", (self.size, self.size), BACKGROUND)
            if t in shown:
                x, y = rng.randint(2, self.size - side - 2), rng.randint(2, self.size - side - 2)
                draw_shape(ImageDraw.Draw(frame), rng.choice(KINDS), (x, y, x + side, y + side),
                           COLOURS[rng.choice(list(COLOURS))])
            frames.append(frame)
        return Example(id=ident, media=[{"type": "video", "video": frames, "fps": self.fps}], question=COUNT_QUESTION,
                       answer=count, meta={"kind": "count", "frames_with_shape": shown})

    def _total_example(self, rng: random.Random, ident: str) -> Example:
        count = rng.randint(1, 5)
        _, shapes = draw_scene(rng, self.size, self.size, count, (max(8, self.size // 8), max(10, self.size // 5)))
        frame_of = [rng.randrange(self.frames) for _ in shapes]
        while count >= 2 and len(set(frame_of)) < 2:  # spread: no single frame shows every shape
            frame_of = [rng.randrange(self.frames) for _ in shapes]
        frames = [Image.new("RGB", (self.size, self.size), BACKGROUND) for _ in range(self.frames)]
        for (kind, colour, box), t in zip(shapes, frame_of):
            draw_shape(ImageDraw.Draw(frames[t]), kind, box, COLOURS[colour])
        return Example(id=ident, media=[{"type": "video", "video": frames, "fps": self.fps}], question=TOTAL_QUESTION,
                       answer=count, meta={"kind": "total", "frame_of_shape": frame_of})

    def example_from_record(self, record: dict) -> Example:
        """An example from a predictions row (``id``, ``ground_truth``), for ``mmgpg eval --predictions``."""
        answer = str(record.get("ground_truth", "")).strip().lower()
        if self.kind in ("count", "total"):
            if not answer.isdigit():
                raise ValueError(f"moving_shapes predictions: record {record.get('id')!r} needs an integer "
                                 f"ground_truth; got {record.get('ground_truth')!r}")
            return Example(id=str(record.get("id", "")), media=[],
                           question=COUNT_QUESTION if self.kind == "count" else TOTAL_QUESTION, answer=int(answer))
        if answer not in DIRECTIONS:
            raise ValueError(f"moving_shapes predictions: record {record.get('id')!r} needs a ground_truth in "
                             f"{', '.join(DIRECTIONS)}; got {record.get('ground_truth')!r}")
        return Example(id=str(record.get("id", "")), media=[], question=str(record.get("question", QUESTION)),
                       answer=answer)

    def success(self, completion: str, example: Example, rewards) -> bool:
        return rewards["accuracy"] >= 1.0

    def gold_completion(self, example: Example) -> str:
        if example.meta.get("kind") == "count":
            return f"<think>A shape appears in {example.answer} frames.</think><answer>{example.answer}</answer>"
        if example.meta.get("kind") == "total":
            return f"<think>I count {example.answer} shapes.</think><answer>{example.answer}</answer>"
        return f"<think>The {example.meta['colour']} {example.meta['shape']} moves {example.answer}.</think>" \
               f"<answer>{example.answer}</answer>"
