"""``scenes`` and ``digits``: embedded offline tasks (no downloads, deterministic by seed) that exercise every judge.

``scenes`` draws procedural pictures (the ``shapes`` renderer) and asks, by ``task.kind``:

* ``count_mc`` — how many shapes, as CV-Bench-style multiple choice (``(A) 3 (B) 1 …``; the CV-Bench judge);
* ``count`` — how many shapes, answered with a number (the GEOQA math judge);
* ``relation`` — is shape X left or right of shape Y (multiple choice, the CV-Bench judge);
* ``colour`` — the colour of the single circle/square/triangle (a label; the classification judge);
* ``grounding`` — the box of the single shape of a given colour, in Qwen2-VL 0–1000 units (the LISA judge).

``digits`` classifies scikit-learn's handwritten digits (1,797 real 8×8 scans shipped inside scikit-learn, upscaled
to 56×56) with the fine-grained classification prompt and judge; the label is the digit's English name.

A ``scenes`` record (``kind=count_mc``, seed 0, train index 0)::

    Example(id="scenes-count_mc-train-0", media=[<PIL 112x112>], question="How many shapes are in the image?
            Select from the following choices.\\n(A) 4\\n(B) 3\\n(C) 2\\n(D) 5", answer="(B)",
            meta={"choices": ["4", "3", "2", "5"], "category": "Count"})
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, ClassVar

from mmgpg_tasks.fine_grained import classification_question
from mmgpg_tasks.shapes import COLOURS, SIZES, draw_scene
from PIL import Image

from mmgpg.task import Example, LazyExamples
from mmgpg.task.judged import JudgedTask
from mmgpg.task.judges import Judgement, box_judge, choice_judge, label_judge, math_judge
from mmgpg.task.rewards import (
    LETTERS,
    box_text,
    extract_answer,
    paper_box_reward,
    paper_label_match,
    pixels_to_norm1000,
    strict_box_reward,
)
from mmgpg.typed import check_choice

KINDS = ("count_mc", "count", "relation", "colour", "grounding")
TAGS = "Output the thinking process in <think> </think> and final answer in <answer> </answer> tags."
DIGITS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


@dataclass
class ScenesTask(JudgedTask):
    """Procedural scenes asking counting (multiple choice or number), relation, colour or grounding questions."""

    name: ClassVar[str] = "scenes"
    version: ClassVar[str] = "1"

    kind: str = "count_mc"
    """Question kind: count_mc, count, relation, colour or grounding."""
    num_train: int = 4000
    """Items in the train split."""
    num_test: int = 200
    """Items in the test split."""
    seed: int = 0
    """Data seed; items are a pure function of (seed, kind, split, index)."""

    def __post_init__(self):
        check_choice("kind", self.kind, KINDS)
        if self.num_train < 1 or self.num_test < 1:
            raise ValueError("num_train and num_test must be >= 1")
        super().__post_init__()

    def load(self, split: str):
        self.check_split(split)
        n = self.num_train if split == "train" else self.num_test
        return LazyExamples(n, lambda i: self.example(split, i))

    def example(self, split: str, index: int) -> Example:
        rng = random.Random(f"{self.seed}:{self.kind}:{split}:{index}")
        width, height = rng.choice(SIZES)
        ident = f"scenes-{self.kind}-{split}-{index}"
        if self.kind in ("count_mc", "count"):
            count = rng.randint(1, 5)
            image, _ = draw_scene(rng, width, height, count)
            if self.kind == "count":
                question = f"How many shapes are in the image? {TAGS.replace('final answer', 'final answer (number)')}"
                return Example(ident, [image], question, str(count), {"ground_truth": str(count)})
            options = [str(count)] + [str(v) for v in rng.sample([v for v in range(1, 7) if v != count], 3)]
            rng.shuffle(options)
            return self._choice(ident, image, "How many shapes are in the image?", options, str(count), "Count")
        if self.kind == "relation":
            image, shapes = _distinct_scene(rng, width, height, 2)
            (k1, c1, b1), (k2, c2, b2) = shapes
            left = b1[0] < b2[0]
            question = f"Is the {c1} {k1} to the left or to the right of the {c2} {k2}?"
            options = ["left", "right"] if rng.random() < 0.5 else ["right", "left"]
            return self._choice(ident, image, question, options, "left" if left else "right", "Relation")
        image, shapes = _distinct_scene(rng, width, height, rng.randint(1, 3))
        kind, colour, box = shapes[0]
        if self.kind == "colour":
            question = f"What colour is the {kind} in the image? {TAGS}"
            return Example(ident, [image], question, colour, {"classes": list(COLOURS)})
        question = (f"Output the bounding box of the {colour} {kind} in the image as (x1,y1),(x2,y2) in 0-1000 "
                    f"coordinates. {TAGS}")
        return Example(ident, [image], question, list(box), {"width": width, "height": height,
                                                              "answer_text": box_text(pixels_to_norm1000(box, width, height))})

    def _choice(self, ident: str, image: Image.Image, question: str, options: list[str], right: str, category: str):
        lettered = "\n".join(f"({LETTERS[i]}) {o}" for i, o in enumerate(options))
        text = f"{question} Select from the following choices.\n{lettered}\n{TAGS}"
        return Example(ident, [image], text, f"({LETTERS[options.index(right)]})",
                       {"choices": options, "category": category})

    def judge(self, completion: str, example: Example, protocol: str) -> Judgement:
        if self.kind in ("count_mc", "relation"):
            out = choice_judge(completion, example.meta["choices"], example.answer, protocol)
            return out.with_fields(category=example.meta["category"])
        if self.kind == "count":
            return math_judge(completion, example.answer, protocol)
        if self.kind == "colour":
            return label_judge(completion, example.answer, protocol)
        size = (example.meta["width"], example.meta["height"])
        return box_judge(completion, example.answer, size, protocol, scale=(1000.0, 1000.0))

    def success(self, completion: str, example: Example, rewards) -> bool:
        """The judge's decision; for ``grounding`` (whose judge returns the IoU), IoU >= 0.5."""
        correct = float(self.judge(completion, example, self.reward_protocol).correct)
        return correct >= (0.5 if self.kind == "grounding" else 1.0)

    def accuracy_reward(self, completion: str, example: Example, protocol: str) -> float:
        if self.kind == "grounding":
            if protocol == "paper":
                return paper_box_reward(completion, example.meta["answer_text"])
            w, h = example.meta["width"], example.meta["height"]
            return strict_box_reward(completion, pixels_to_norm1000(example.answer, w, h))
        if self.kind == "colour" and protocol == "paper":
            return paper_label_match(extract_answer(completion) or completion, example.answer)
        return self.judge(completion, example, protocol).correct

    def aggregate(self, per_sample: list[dict[str, Any]]) -> dict[str, float]:
        metrics = super().aggregate(per_sample)
        if self.kind == "grounding":
            metrics["miou"] = metrics.pop("accuracy")
        return metrics

    def example_from_record(self, record: dict) -> Example:
        meta = {k: record[k] for k in ("choices", "category", "width", "height", "ground_truth") if k in record}
        answer = record.get("ground_truth")
        if self.kind == "grounding":
            meta["answer_text"] = box_text(pixels_to_norm1000(answer, meta["width"], meta["height"]))
        return Example(str(record["id"]), [], str(record.get("question", "")), answer, meta)

    def record_fields(self, example: Example) -> dict:
        fields = {"question": example.question, "ground_truth": example.answer}
        fields.update({k: example.meta[k] for k in ("choices", "category", "width", "height") if k in example.meta})
        return fields

    def gold_completion(self, example: Example) -> str:
        if self.kind == "grounding":
            return f"<think>I see the shape.</think><answer>{example.meta['answer_text']}</answer>"
        if self.kind in ("count_mc", "relation"):
            letter = example.answer.strip("()")
            return f"<think>Option {letter}.</think><answer>{letter}</answer>"
        return f"<think>It is {example.answer}.</think><answer> {example.answer} </answer>"


def _distinct_scene(rng: random.Random, width: int, height: int, count: int):
    """A scene whose shapes have distinct colours (so "the red shape" is unambiguous)."""
    for _ in range(1000):
        image, shapes = draw_scene(rng, width, height, count)
        if len({c for _, c, _ in shapes}) == count and (count < 2 or shapes[0][2][0] != shapes[1][2][0]):
            return image, shapes
    raise RuntimeError("could not draw a scene with distinct colours")


@dataclass
class DigitsTask(JudgedTask):
    """Handwritten digits (scikit-learn's real 8x8 scans, upscaled), judged like fine-grained classification."""

    name: ClassVar[str] = "digits"
    version: ClassVar[str] = "1"

    num_test: int = 297
    """Items held out for the test split (the rest, 1,500 by default, are train)."""
    size: int = 56
    """Side of the upscaled image in pixels (2 x 28, one merged Qwen2-VL vision token per 28 x 28)."""
    seed: int = 0
    """Seed of the train/test split."""

    def __post_init__(self):
        if not 1 <= self.num_test < 1797:
            raise ValueError(f"num_test must be in [1, 1796]; got {self.num_test}")
        super().__post_init__()
        self._data = None

    def _split_indices(self, split: str) -> list[int]:
        self.check_split(split)
        order = list(range(1797))
        random.Random(self.seed).shuffle(order)
        return order[: self.num_test] if split == "test" else order[self.num_test :]

    def load(self, split: str):
        indices = self._split_indices(split)
        return LazyExamples(len(indices), lambda i: self.example(split, indices[i]))

    def example(self, split: str, index: int) -> Example:
        if self._data is None:
            from sklearn.datasets import load_digits

            digits = load_digits()
            self._data = (digits.images, digits.target)
        images, targets = self._data
        pixels = (255 - images[index] * (255 / 16)).clip(0, 255).astype("uint8")
        image = Image.fromarray(pixels, mode="L").resize((self.size, self.size), Image.BILINEAR).convert("RGB")
        question = classification_question("a handwritten digit", "digit").replace("species name", "digit name")
        return Example(f"digits-{split}-{index}", [image], question, DIGITS[int(targets[index])],
                       {"classes": list(DIGITS)})

    def accuracy_reward(self, completion: str, example: Example, protocol: str) -> float:
        return self.judge(completion, example, protocol).correct

    def judge(self, completion: str, example: Example, protocol: str) -> Judgement:
        return label_judge(completion, example.answer, protocol)

    def example_from_record(self, record: dict) -> Example:
        return Example(str(record["id"]), [], str(record.get("question", "")), str(record["ground_truth"]))

    def record_fields(self, example: Example) -> dict:
        return {"question": example.question, "ground_truth": example.answer}

    def gold_completion(self, example: Example) -> str:
        return f"<think>The digit is {example.answer}.</think> <answer>{example.answer}</answer>"
