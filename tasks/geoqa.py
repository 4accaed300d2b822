"""``geoqa``: geometry questions with numeric answers (the GPG paper's GEOQA row, Qwen2.5-VL-3B-Instruct).

Data (``docs/anchors.md`` §3):

* ``train`` — the hub dataset ``leonardPKU/GEOQA_R1V_Train_8K`` (about 8k rows: ``image``, ``problem``,
  ``solution``), or a local file/directory in that schema (``task.train_data=...``).
* ``test`` — the 754 items of R1-V's ``src/eval/prompts/geoqa_test_prompts.jsonl`` (shipped with mmgpg). One record::

      {"image_path": "./Geo170K/images/test/0.png", "question": "As shown in the figure, in triangle ABC, it is
       known that angle A = 80.0, angle B = 60.0, DE parallel  BC, then the size of angle CED is ()",
       "ground_truth": "140°"}

  The images come from ``images.zip`` of the hub dataset ``Luckyjhg/Geo170K``: extract it so that
  ``<image_root>/Geo170K/images/test/0.png`` exists and set ``task.image_root=<image_root>``.

Prompts: training uses R1-V's ``"{Question}  Output the thinking process in <think> </think> and final answer
(number) in <answer> </answer> tags."`` (two spaces; ``GPG:R1-V/src/r1-v/src/open_r1/grpo.py:168-181``); the test
split uses the evaluation script's single space (``GPG:R1-V/src/eval/test_qwen2vl_geoqa.py:32-52``).

Judging rule (``GPG:R1-V/src/eval/test_qwen2vl_geoqa.py:96-106``), ``paper``: ``verify(parse(output),
parse(ground_truth))`` over the whole output — see :func:`mmgpg.task.judges.math_judge` for its quirks. Training reward,
``paper`` (``GPG:R1-V/src/r1-v/src/open_r1/grpo.py:69-109``): the same math-verify test against the ``solution``
string, else exact string equality of the ``<answer>`` groups. ``strict`` uses the answer tag only, in LaTeX form.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from mmgpg.task import Example, mathjudge
from mmgpg.task.data import load_records, open_image, shipped
from mmgpg.task.judged import JudgedTask, require
from mmgpg.task.judges import Judgement, math_judge
from mmgpg.task.rewards import answer_or_whole

SUFFIX = "Output the thinking process in <think> </think> and final answer (number) in <answer> </answer> tags."
GET_TRAIN = ("Download it on a connected machine with `python -c \"import datasets; datasets.load_dataset("
             "'leonardPKU/GEOQA_R1V_Train_8K', split='train').save_to_disk('geoqa_train')\"`, copy the directory here "
             "and set task.train_data=/path/to/geoqa_train.")
GET_IMAGES = ("Download images.zip of the hub dataset Luckyjhg/Geo170K, extract it into a directory DIR so that "
              "DIR/Geo170K/images/test/0.png exists, and set task.image_root=DIR.")


@dataclass
class GeoQATask(JudgedTask):
    """GEOQA: geometry problems with numeric answers (train: GEOQA_R1V_Train_8K; test: 754 items)."""

    name: ClassVar[str] = "geoqa"
    version: ClassVar[str] = "1"
    accuracy_is_judge: ClassVar[tuple[str, ...]] = ("strict",)  # accuracy_reward(strict) is math_judge(strict)

    train_data: str = "leonardPKU/GEOQA_R1V_Train_8K"
    """Training data: a hub dataset id or a local file/directory with image, problem, solution."""
    test_data: str = ""
    """Test prompts (JSONL: image_path, question, ground_truth); empty = the 754 items shipped with mmgpg."""
    image_root: str = ""
    """Directory the test image_path values are relative to (where Geo170K/ was extracted)."""

    def source_rows(self, split: str):
        if split == "train":
            return load_records(self.train_data, split="train", what="GEOQA training data", how_to_get=GET_TRAIN)
        return load_records(self.test_data or str(shipped("geoqa/geoqa_test_prompts.jsonl")), split="test",
                            what="GEOQA test prompts", how_to_get="The 754 prompts ship with mmgpg; leave test_data empty.")

    def example(self, split: str, index: int, row: dict) -> Example:
        if split == "train":
            require(row, ("image", "problem", "solution"), "GEOQA training data")
            return Example(id=f"geoqa-train-{index}", media=[open_image(row["image"], what="GEOQA train image")],
                           question=f"{row['problem']}  {SUFFIX}", answer=row["solution"],
                           meta={"ground_truth": answer_or_whole(row["solution"], dotall=False)})
        require(row, ("image_path", "question", "ground_truth"), "GEOQA test prompts")
        image = open_image(row["image_path"], self.image_root, what="GEOQA test image", how_to_get=GET_IMAGES)
        return Example(id=str(row.get("id", f"geoqa-test-{index}")), media=[image],
                       question=f"{row['question']} {SUFFIX}", answer=row["ground_truth"],
                       meta={"ground_truth": row["ground_truth"]})

    def accuracy_reward(self, completion: str, example: Example, protocol: str) -> float:
        gold = example.meta["ground_truth"]
        if protocol == "paper":
            solution = example.answer if isinstance(example.answer, str) else str(example.answer)
            if mathjudge.parse_verify(completion, solution)[0]:
                return 1.0
            return 1.0 if answer_or_whole(completion, dotall=False) == answer_or_whole(solution, dotall=False) else 0.0
        return math_judge(completion, gold, "strict").correct

    def judge(self, completion: str, example: Example, protocol: str) -> Judgement:
        return math_judge(completion, example.meta["ground_truth"], protocol)

    def example_from_record(self, record: dict) -> Example:
        require(record, ("id", "ground_truth"), "GEOQA predictions")
        gt = str(record["ground_truth"])
        return Example(id=str(record["id"]), media=[], question=str(record.get("question", "")), answer=gt,
                       meta={"ground_truth": gt})

    def gold_completion(self, example: Example) -> str:
        return f"<think>The answer is {example.meta['ground_truth']}.</think><answer> {example.meta['ground_truth']} </answer>"

    def record_fields(self, example: Example) -> dict:
        """Fields written next to each prediction so that ``--predictions`` can re-score it."""
        return {"question": example.question, "ground_truth": example.meta["ground_truth"]}
