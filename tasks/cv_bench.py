"""``cv_bench``: spatial reasoning — train on SAT, evaluate on CV-Bench (the GPG paper's CV-Bench row, Qwen2-VL-2B base).

Data (``docs/anchors.md`` §2):

* ``train`` — SAT as the anchors prepare it (``GPG:VisualThinker-R1-Zero/src/data/SAT/process_dataset.py``):
  ``SAT_train_15000.json``, a list of ``{"messages": [{"role": "user", "content": "<image> Answer in natural
  language. {question} Choose between the following options: {a, b or c}"}, {"role": "assistant", "content":
  "{answer}"}], "images": ["SAT_images_train/{i}_0.png"]}`` with images relative to the file. Point
  ``task.train_data`` at that file (the hub source ``array/SAT`` is a parquet that the anchors' script converts).
* ``test`` — the hub dataset ``nyu-visionx/CV-Bench`` at revision ``22409a9`` (2,638 rows: ``prompt``, ``image``,
  ``answer`` ``"(A)"``…, ``choices``, ``task`` ∈ Count/Relation/Depth/Distance, ``question``), or a local copy saved
  with ``save_to_disk`` / a JSONL with those fields. Its first row::

      {"idx": 0, "type": "2D", "task": "Count", "question": "How many organs are in the image?",
       "choices": ["3", "2", "1", "0"], "answer": "(C)", "prompt": "How many organs are in the image? Select from the
       following choices.\\n(A) 3\\n(B) 2\\n(C) 1\\n(D) 0", "image": <PIL 256x256>,
       "filename": "img/2D/count/ade20k_10.png", "source": "ADE20K", "source_dataset": "ADE20K Validation Set", ...}

  No SAT record could be seen offline; the schema above is the anchors' converter's output.

Prompt: ``prompt_style=base`` (the GPG run: the base model ``Qwen2-VL-2B`` with the R1-Zero text prompt ending in
``<think>``, no chat template, image first with a literal ``<image>`` kept in the text; the format reward then
prepends ``<think>``) or ``instruct`` (a chat turn with the instruction suffix). Judging rule:
``GPG:VisualThinker-R1-Zero/src/eval/evaluate_Qwen2_VL_CVBench-base.py:178-233`` — see
:func:`mmgpg.task.judges.choice_judge`. Metrics: ``total`` = correct / all items (micro; the paper truncates to two
decimals), and per-category accuracy ``count``, ``relation``, ``depth``, ``distance``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from mmgpg.task import Example, mathjudge, media_parts
from mmgpg.task.data import load_records, open_image
from mmgpg.task.judged import JudgedTask, require
from mmgpg.task.judges import Judgement, choice_judge
from mmgpg.task.rewards import (
    LETTERS,
    answer_or_whole,
    extract_answer,
    sat_string_reward,
    strict_choice,
    strict_label_match,
)

R1_ZERO = ("A conversation between User and Assistant. The user asks a question about the image, and the Assistant "
           "solves it. The assistant first thinks about the reasoning process in the mind and then provides the user "
           "with the answer.\nUser: {question} \nAssistant: Let me solve this step by step.\n<think>")
INSTRUCT_SUFFIX = "  Output the thinking process in <think> </think> and final answer (option) in <answer> </answer> tags."
CATEGORIES = ("Count", "Relation", "Depth", "Distance")
GET_TRAIN = ("Prepare SAT as the anchors do (VisualThinker-R1-Zero src/data/SAT/prepare_dataset.sh and "
             "process_dataset.py: SAT_train.parquet of the hub dataset array/SAT -> SAT_train_15000.json + "
             "SAT_images_train/) and set task.train_data=/path/to/SAT_train_15000.json.")
GET_TEST = ("On a connected machine: `python -c \"import datasets; datasets.load_dataset('nyu-visionx/CV-Bench', "
            "split='test', revision='22409a9').save_to_disk('cv_bench_test')\"`; copy the directory here and set "
            "task.test_data=/path/to/cv_bench_test.")


@dataclass
class CVBenchTask(JudgedTask):
    """CV-Bench (Count, Relation, Depth, Distance), trained on SAT."""

    name: ClassVar[str] = "cv_bench"
    categories: ClassVar[tuple[str, ...]] = CATEGORIES
    version: ClassVar[str] = "1"

    train_data: str = ""
    """SAT_train_15000.json as the anchors' process_dataset.py writes it (images relative to the file)."""
    test_data: str = "nyu-visionx/CV-Bench"
    """CV-Bench test data: the hub id (revision test_revision) or a local copy in the same schema."""
    test_revision: str = "22409a9"
    """Hub revision of CV-Bench that still has the original test.parquet layout."""
    prompt_style: str = "base"
    """`base`: the R1-Zero text prompt ending in <think> (the paper's run); `instruct`: a chat turn."""

    def __post_init__(self):
        if self.prompt_style not in ("base", "instruct"):
            raise ValueError(f"prompt_style must be base or instruct; got {self.prompt_style!r}")
        self.format_prefix = "<think>" if self.prompt_style == "base" else ""
        super().__post_init__()

    def source_rows(self, split: str):
        if split == "train":
            return load_records(self.train_data, split="train", what="SAT training data", how_to_get=GET_TRAIN)
        return load_records(self.test_data, split="test", what="CV-Bench test data", how_to_get=GET_TEST,
                            revision=self.test_revision or None)

    def example(self, split: str, index: int, row: dict) -> Example:
        if split == "train":
            return self._sat_example(index, row)
        require(row, ("image", "answer", "choices", "task", "prompt"), "CV-Bench test data")
        choices = [str(c) for c in row["choices"]]
        return Example(id=str(row.get("idx", f"cv_bench-test-{index}")),
                       media=[open_image(row["image"], what="CV-Bench image", how_to_get=GET_TEST)],
                       question=str(row["prompt"]), answer=str(row["answer"]),
                       meta={"choices": choices, "category": str(row["task"])})

    def _sat_example(self, index: int, row: dict) -> Example:
        require(row, ("messages", "images"), "SAT training data")
        user, assistant = row["messages"][0]["content"], row["messages"][1]["content"]
        root = Path(self.train_data).expanduser().parent if self.train_data else None
        image = open_image(row["images"][0], root, what="SAT image", how_to_get=GET_TRAIN)
        question = user.replace("<image>", "")
        options = _sat_options(question)
        return Example(id=f"sat-train-{index}", media=[image], question=question, answer=str(assistant),
                       meta={"choices": options, "solution": f"<answer>{assistant}</answer>"})

    def prompt(self, example: Example) -> list[dict]:
        if self.prompt_style == "base":
            text = "<image>" + R1_ZERO.format(question=example.question)
            return [{"role": "raw", "content": media_parts(example) + [{"type": "text", "text": text}]}]
        text = example.question + INSTRUCT_SUFFIX
        return [{"role": "user", "content": media_parts(example) + [{"type": "text", "text": text}]}]

    def accuracy_reward(self, completion: str, example: Example, protocol: str) -> float:
        """``paper`` (``GPG:VisualThinker-R1-Zero/src/open-r1-multimodal/src/open_r1/grpo.py:83-130``): math-verify
        against the solution ``<answer>{answer}</answer>``, else :func:`mmgpg.task.rewards.sat_string_reward` with the
        ground truth read back out of that solution as theirs is (stripped; the whole solution if the answer holds a
        newline). ``strict``: the answer tag names
        exactly the right option (by text or letter). Test items (lettered answers) use the judge."""
        if "solution" not in example.meta:
            return self.judge(completion, example, protocol).correct
        if protocol == "paper":
            if mathjudge.parse_verify(completion, example.meta["solution"])[0]:
                return 1.0
            # their ground truth is read back out of the solution "<answer>{answer}</answer>": stripped, or the whole
            # solution when the answer holds a newline
            return sat_string_reward(completion, answer_or_whole(example.meta["solution"], dotall=False))
        choices = example.meta["choices"]
        if example.answer not in choices:
            return strict_label_match(extract_answer(completion), example.answer)
        return float(strict_choice(extract_answer(completion), choices, LETTERS[choices.index(example.answer)])[0])

    def judge(self, completion: str, example: Example, protocol: str) -> Judgement:
        out = choice_judge(completion, example.meta["choices"], example.answer, protocol)
        return out.with_fields(category=example.meta.get("category", ""))

    def aggregate(self, per_sample: list[dict[str, Any]]) -> dict[str, float]:
        """``total`` = Σ correct / N over all items; ``<category>`` = Σ correct / n within it (the anchor's
        ``Total Accuracy`` and ``X_acc``)."""
        metrics = super().aggregate(per_sample)
        metrics["total"] = metrics.pop("accuracy")
        for category in CATEGORIES:
            rows = [r for r in per_sample if r.get("category") == category]
            if rows:
                metrics[category.lower()] = sum(r["correct"] for r in rows) / len(rows)
        return metrics

    def example_from_record(self, record: dict) -> Example:
        require(record, ("id", "ground_truth", "choices", "category"), "CV-Bench predictions")
        return Example(id=str(record["id"]), media=[], question=str(record.get("question", "")),
                       answer=str(record["ground_truth"]),
                       meta={"choices": [str(c) for c in record["choices"]], "category": str(record["category"])})

    def record_fields(self, example: Example) -> dict:
        return {"question": example.question, "ground_truth": example.answer, "choices": example.meta["choices"],
                "category": example.meta.get("category", "")}

    def gold_completion(self, example: Example) -> str:
        head = "" if self.prompt_style == "base" else "<think>"
        answer = example.answer
        return f"{head}The answer is {answer}.</think><answer>{answer}</answer>"


def _sat_options(question: str) -> list[str]:
    """The options of a SAT question (``"... Choose between the following options: a, b or c"``)."""
    marker = "Choose between the following options:"
    if marker not in question:
        return []
    tail = question.split(marker, 1)[1].strip()
    head, _, last = tail.rpartition(" or ")
    return [o.strip() for o in head.split(", ") if o.strip()] + [last.strip()] if head else [tail]


def sat_record(question: str, answers: list[str], correct: str, image: str, rng: random.Random) -> dict:
    """A SAT record in the anchors' schema (options shuffled; the anchors use an unseeded shuffle)."""
    options = list(answers)
    rng.shuffle(options)
    joined = ", ".join(options[:-1]) + " or " + options[-1] if len(options) > 1 else options[0]
    content = f"<image> Answer in natural language. {question} Choose between the following options: {joined}"
    return {"messages": [{"role": "user", "content": content}, {"role": "assistant", "content": correct}],
            "images": [image]}
