"""``fine_grained``: 4-shot fine-grained classification — Flower102, Pets37, FGVC-Aircraft, Cars196 (Qwen2-VL-2B).

Choose the dataset with ``task.dataset=`` (``oxford_flowers``, ``pets``, ``fgvc_aircraft``, ``stanford_cars``).
Data (``docs/anchors.md`` §4):

* ``train`` — the 4-shot hub datasets of Visual-RFT: ``laolao77/ViRFT_CLS_flower_4_shot`` (408 rows),
  ``laolao77/ViRFT_CLS_pets37_4shot`` (148), ``laolao77/ViRFT_CLS_fgvc_aircraft_4_shot`` (400),
  ``laolao77/ViRFT_CLS_car196_4shot`` (784), schema ``image``, ``problem``, ``solution``; or a local copy.
* ``test`` — the CoOp test splits the paper's numbers are computed on (2,463 / 3,669 / 3,333 / 8,041 items), shipped
  with mmgpg as JSONL converted from Visual-RFT's ``classification/val_data/*.pth``, with the class lists. One record::

      {"image": "images/Abyssinian_201.jpg", "label": 0, "class": "abyssinian"}

  ``image`` is relative to the dataset's own image root (``jpg/…`` Oxford Flowers, ``images/…`` Oxford Pets and
  FGVC-Aircraft, ``cars_test/…`` Stanford Cars): download the dataset and set ``task.image_root``.

Judging rule (``GPG:Visual-RFT/classification/Qwen2_VL_classification_infere.py:202-216``), ``paper``: the answer
tag must exist; then a bidirectional substring test after removing spaces and underscores — an empty answer is
correct, and "rose" is correct for "pink primrose". The training reward (``grpo_classification.py:72-116``) is the
same test, falling back to the whole completion when the tag is missing. ``strict``: the answer is the class name.
The test prompt keeps the evaluation script's literal ``<image>\\n`` before the question.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from mmgpg.task import Example, mathjudge
from mmgpg.task.data import load_records, open_image, shipped
from mmgpg.task.judged import JudgedTask, require
from mmgpg.task.judges import Judgement, label_judge
from mmgpg.task.rewards import answer_or_whole, extract_answer, paper_label_match, strict_label_match
from mmgpg.typed import check_choice

DATASETS = {
    # name: (hub id of the 4-shot training set, subject, what to identify)
    "oxford_flowers": ("laolao77/ViRFT_CLS_flower_4_shot", "a plant", "species of the plant"),
    "pets": ("laolao77/ViRFT_CLS_pets37_4shot", "a pet", "species of the pet"),
    "fgvc_aircraft": ("laolao77/ViRFT_CLS_fgvc_aircraft_4_shot", "an aircraft", "model of the aircraft"),
    "stanford_cars": ("laolao77/ViRFT_CLS_car196_4shot", "a car", "model of the car"),
}
QUESTION = ("This is an image containing {subject}. Please identify the {target} based on the image.\nOutput the "
            "thinking process in <think> </think> and final answer in <answer> </answer> tags.The output answer "
            "format should be as follows:\n<think> ... </think> <answer>species name</answer>\nPlease strictly follow "
            "the format.")


def class_names(dataset: str) -> list[str]:
    """The class list of a shipped test split (line index = label)."""
    return [line.strip() for line in shipped(f"fine_grained/{dataset}.classes.txt").read_text().splitlines() if line.strip()]


def classification_question(subject: str, target: str) -> str:
    """The Visual-RFT classification prompt (the missing space in "tags.The" is theirs)."""
    return QUESTION.format(subject=subject, target=target)


@dataclass
class FineGrainedTask(JudgedTask):
    """4-shot fine-grained classification (Visual-RFT's four datasets)."""

    name: ClassVar[str] = "fine_grained"
    version: ClassVar[str] = "1"

    dataset: str = "oxford_flowers"
    """Which dataset: oxford_flowers, pets, fgvc_aircraft or stanford_cars."""
    train_data: str = ""
    """4-shot training data; empty = the dataset's Visual-RFT hub id; or a local copy (image, problem, solution)."""
    test_data: str = ""
    """Test split JSONL (image, label, class); empty = the split shipped with mmgpg."""
    image_root: str = ""
    """Directory the test images are relative to (the dataset's own root)."""

    def __post_init__(self):
        check_choice("dataset", self.dataset, DATASETS)
        super().__post_init__()

    @property
    def hub_id(self) -> str:
        return DATASETS[self.dataset][0]

    def _how_to_get(self, split: str) -> str:
        if split == "train":
            return (f"On a connected machine: `python -c \"import datasets; datasets.load_dataset('{self.hub_id}', "
                    f"split='train').save_to_disk('{self.dataset}_4shot')\"`; copy it here and set "
                    f"task.train_data=/path/to/{self.dataset}_4shot.")
        return (f"Download the {self.dataset} images (the CoOp layout: the test JSONL's image paths are relative to "
                "the dataset root) and set task.image_root=/path/to/that/root.")

    def source_rows(self, split: str):
        if split == "train":
            return load_records(self.train_data or self.hub_id, split="train", what=f"{self.dataset} 4-shot training data",
                                how_to_get=self._how_to_get("train"))
        return load_records(self.test_data or str(shipped(f"fine_grained/{self.dataset}.test.jsonl")), split="test",
                            what=f"{self.dataset} test split", how_to_get=self._how_to_get("test"))

    def example(self, split: str, index: int, row: dict) -> Example:
        if split == "train":
            require(row, ("image", "problem", "solution"), f"{self.dataset} training data")
            label = answer_or_whole(row["solution"], dotall=False)
            return Example(id=f"{self.dataset}-train-{index}", media=[open_image(row["image"])],
                           question=str(row["problem"]), answer=label, meta={"solution": row["solution"]})
        require(row, ("image", "class"), f"{self.dataset} test split")
        _, subject, target = DATASETS[self.dataset]
        image = open_image(row["image"], self.image_root, what=f"{self.dataset} test image",
                           how_to_get=self._how_to_get("test"))
        return Example(id=str(row.get("id", f"{self.dataset}-test-{index}")), media=[image],
                       question="<image>\n" + classification_question(subject, target), answer=str(row["class"]))

    def accuracy_reward(self, completion: str, example: Example, protocol: str) -> float:
        if protocol == "paper":
            solution = example.meta.get("solution", f"<answer>{example.answer}</answer>")
            if mathjudge.parse_verify(completion, solution)[0]:
                return 1.0
            return paper_label_match(answer_or_whole(completion, dotall=False), example.answer)
        return strict_label_match(extract_answer(completion), example.answer)

    def judge(self, completion: str, example: Example, protocol: str) -> Judgement:
        return label_judge(completion, example.answer, protocol)

    def example_from_record(self, record: dict) -> Example:
        require(record, ("id", "ground_truth"), f"{self.dataset} predictions")
        return Example(id=str(record["id"]), media=[], question=str(record.get("question", "")),
                       answer=str(record["ground_truth"]))

    def record_fields(self, example: Example) -> dict:
        return {"question": example.question, "ground_truth": example.answer}

    def gold_completion(self, example: Example) -> str:
        return f"<think>This looks like a {example.answer}.</think> <answer>{example.answer}</answer>"
