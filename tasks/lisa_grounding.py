"""``lisa_grounding``: reasoning grounding on LISA's ReasonSeg — answer with the box of the object an instruction
describes (the GPG paper's LISA row: mIoU on test and val, gIoU on test; Qwen2-VL-2B-Instruct).

Data (``docs/anchors.md`` §5): ReasonSeg as LISA distributes it (``ReasonSeg/{train,val,test}/``,
one ``.json`` + ``.jpg`` per image; 239 / 200 / 779 images). Set ``task.data_root=/path/to/ReasonSeg``. The JSON
is LabelMe-style (no ReasonSeg file was available offline: the field layout is LISA's, the values illustrative)::

    {"text": ["<an instruction that needs reasoning>", ...], "is_sentence": true,
     "shapes": [{"label": "target", "labels": ["target"], "shape_type": "polygon", "image_name": "<name>.jpg",
                 "points": [[x, y], ...], "group_id": null, "group_ids": [null], "flags": {}}, ...]}

A real model output (Visual-RFT's LISA demo notebook, a 7B checkpoint): ``<answer>(696,300),(999,999)</answer>``.

The gold box is the min/max of the points of the *first* shape only, whatever its label, in pixels
(``GPG:Visual-RFT/lisa_evaluation/gen_box_ann.py``). Training uses one item per (image, sentence)
(``gen_sft.py``); val and test use only the first sentence of each image (``Qwen2_VL_lisa_infere.py``).

Boxes are written in the model family's convention, ``task.box_format``: ``norm1000`` (alias ``qwen2_vl``) —
integers 0–1000 of the original image's width and height (truncated, as ``gen_sft.py`` does): Qwen2-VL, Qwen3-VL,
Qwen3.5, InternVL; ``resized_pixels`` (alias ``qwen2_5_vl``) — absolute pixels of the image as the model sees it after
resizing to ``[min_pixels, max_pixels]`` (set them as in ``model``): Qwen2.5-VL. A command that loads a model whose
family declares the other convention (``Family.box_format``) refuses the task's option, naming the one to set; a family
that documents none (Gemma 3, SmolVLM2, LLaVA-OneVision) runs with the option given.

Rewards (``GPG:Visual-RFT/src/virft/src/open_r1/grpo_lisa.py:74-168``): ``paper`` = the authors' reward — math-verify
first, then 2.0 on an exact string match, else their GIoU + 1 with signed areas (an inverted box can score above 2 or
below 0) and the multi-box quirk (:func:`mmgpg.task.rewards.paper_box_reward`); ``strict`` = GIoU + 1 ∈ [0, 2] of a
single valid box inside the answer tag. Judge (``Qwen2_VL_lisa_infere.py:116-136``, ``merge_eval.py``): box IoU
of the first box anywhere in the output, failures 0; ``miou`` = mean IoU (:func:`mmgpg.task.judges.box_judge`).
Mask gIoU (``box2mask.py``, ``mask_iou.py``): set ``task.sam_checkpoint`` to a SAM checkpoint directory
(``facebook/sam-vit-huge``, the HF port of the reference's ViT-H); without one only box metrics are reported.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from mmgpg.task import Example, LazyExamples, mathjudge
from mmgpg.task.data import DataNotFound, open_image
from mmgpg.task.judged import JudgedTask, require
from mmgpg.task.judges import Judgement, box_judge
from mmgpg.task.rewards import box_text, paper_box_reward, pixels_to_norm1000, rescale_box, strict_box_reward

TRAIN_TEMPLATE = ("{Question} Output the thinking process in <think> </think> and your grouding box. Following "
                  "\"<think> thinking process </think>\n<answer>(x1,y1),(x2,y2)</answer>)\" format.")
INSTRUCTION = "Output the bounding box in the image corresponding to the instruction: {sentence}"
R1_SYSTEM = ("A conversation between User and Assistant. The user asks a question, and the Assistant solves it. The "
             "assistant first thinks about the reasoning process in the mind and then provides the user with the "
             "answer. The reasoning process and answer are enclosed within <think> </think> and <answer> </answer> "
             "tags, respectively, i.e., <think> reasoning process here </think><answer> answer here </answer>")
# The box conventions: 0-1000 of the image's width and height, or pixels of the resized image; the GPG recipes name
# them by the paper's families (aliases).
BOX_FORMATS = ("norm1000", "resized_pixels")
BOX_ALIASES = {"qwen2_vl": "norm1000", "qwen2_5_vl": "resized_pixels"}
BOX_WORDS = {"norm1000": "integers 0-1000 of the image's width and height",
             "resized_pixels": "pixels of the image as its processor resized it"}
GET_DATA = ("Download ReasonSeg (LISA, github.com/dvlab-research/LISA: train/val/test folders of .json + .jpg), and "
            "set task.data_root=/path/to/ReasonSeg.")


def first_shape_box(record: dict) -> tuple[float, float, float, float]:
    """min/max of the points of ``shapes[0]`` (the anchors' rule) in pixels."""
    shapes = record.get("shapes") or []
    if not shapes or not shapes[0].get("points"):
        raise ValueError("the ReasonSeg record has no shapes[0].points")
    xs = [float(p[0]) for p in shapes[0]["points"]]
    ys = [float(p[1]) for p in shapes[0]["points"]]
    return min(xs), min(ys), max(xs), max(ys)


@dataclass
class LisaGroundingTask(JudgedTask):
    """LISA ReasonSeg reasoning grounding answered with a box."""

    name: ClassVar[str] = "lisa_grounding"
    version: ClassVar[str] = "1"
    splits: ClassVar[tuple[str, ...]] = ("train", "val", "test")

    data_root: str = ""
    """ReasonSeg directory with train/, val/, test/ (one .json + .jpg per image)."""
    box_format: str = "qwen2_vl"
    """norm1000 (alias qwen2_vl, the default): 0-1000 integers of the original image (Qwen2-VL, Qwen3-VL, Qwen3.5,
    InternVL); resized_pixels (alias qwen2_5_vl): pixels of the resized image (Qwen2.5-VL)."""
    min_pixels: int = 3136
    """Smallest image area the model sees (qwen2_5_vl box units depend on it)."""
    max_pixels: int = 401408
    """Largest image area the model sees (the anchors' 512*28*28)."""
    sam_checkpoint: str = ""
    """A SAM checkpoint directory for mask gIoU at evaluation (empty: box metrics only)."""
    success_iou: float = 0.5
    """A completion is a binary *success* (prompt_success.jsonl, success diagnostics) when its box IoU with the gold
    box is at least this. The reward (GIoU-based) is continuous and is not a success by itself; 0.5 is the usual
    detection threshold (an mmgpg choice: the anchors define no binary success)."""

    def __post_init__(self):
        if BOX_ALIASES.get(self.box_format, self.box_format) not in BOX_FORMATS:
            raise ValueError(f"box_format must be one of {', '.join(BOX_FORMATS + tuple(BOX_ALIASES))}; got "
                             f"{self.box_format!r}")
        if not 0 < self.success_iou <= 1:
            raise ValueError(f"success_iou must be in (0, 1]; got {self.success_iou!r}")
        super().__post_init__()
        self._cache: dict[str, list[tuple[Path, int]]] = {}

    def _items(self, split: str) -> list[tuple[Path, int]]:
        self.check_split(split)
        if split not in self._cache:
            folder = Path(self.data_root).expanduser() / split
            if not self.data_root or not folder.is_dir():
                raise DataNotFound(f"LISA {split} data: {str(folder)!r} is not a directory. {GET_DATA}")
            items = []
            for path in sorted(folder.glob("*.json")):
                if not path.with_suffix(".jpg").exists():
                    continue
                record = json.loads(path.read_text(encoding="utf-8"))
                sentences = record.get("text") or []
                if isinstance(sentences, str):
                    sentences = [sentences]
                if not sentences or not record.get("shapes"):
                    continue
                items += [(path, k) for k in (range(len(sentences)) if split == "train" else [0])]
            self._cache[split] = items
        return self._cache[split]

    def load(self, split: str):
        items = self._items(split)
        return LazyExamples(len(items), lambda i: self.example(split, *items[i]))

    @property
    def convention(self) -> str:
        """``task.box_format`` by its convention's name (``norm1000`` or ``resized_pixels``)."""
        return BOX_ALIASES.get(self.box_format, self.box_format)

    def model_problems(self, family) -> list:
        """The model family's own box convention (``Family.box_format``) must be the task's: a Qwen2.5-VL answers
        in pixels of the resized image, a Qwen3-VL on the 0-1000 grid; scoring one with the other's units gives a
        wrong IoU (and reward) for every answer."""
        from mmgpg.typed import Problem

        if family.box_format is None or family.box_format == self.convention:
            return []
        return [Problem("task.box_format", self.box_format,
                        f"{family.title} answers boxes as {family.box_format} ({BOX_WORDS[family.box_format]}), "
                        f"not {self.convention} ({BOX_WORDS[self.convention]}).",
                        f"set task.box_format={family.box_format}.")]

    def units(self, width: int, height: int) -> tuple[float, float]:
        """Full width and height of the model's box units for an image of this size."""
        if self.convention == "norm1000":
            return 1000.0, 1000.0
        from qwen_vl_utils import smart_resize

        h, w = smart_resize(height, width, factor=28, min_pixels=self.min_pixels, max_pixels=self.max_pixels)
        return float(w), float(h)

    def example(self, split: str, path: Path, sentence_index: int) -> Example:
        record = json.loads(path.read_text(encoding="utf-8"))
        sentences = record["text"] if isinstance(record["text"], list) else [record["text"]]
        image = open_image(path.with_suffix(".jpg"), what="ReasonSeg image", how_to_get=GET_DATA)
        width, height = image.size
        box = first_shape_box(record)
        sentence = sentences[sentence_index]
        if split == "train":
            question, system = TRAIN_TEMPLATE.format(Question=INSTRUCTION.format(sentence=sentence)), None
        else:
            question, system = INSTRUCTION.format(sentence=sentence) + "." + TRAIN_TEMPLATE.format(Question=""), R1_SYSTEM
        return Example(id=f"{path.stem}-{sentence_index}", media=[image], question=question, answer=list(box),
                       meta={"width": width, "height": height, "system": system, "record": record,
                             "answer_text": self.answer_text(box, width, height)})

    def answer_text(self, box, width: int, height: int) -> str:
        """The gold box in the model's units as ``(x1,y1),(x2,y2)`` (truncated to integers)."""
        if self.convention == "norm1000":
            return box_text(pixels_to_norm1000(box, width, height))
        return box_text(rescale_box(box, (width, height), self.units(width, height)))

    def _gold_units(self, example: Example) -> tuple[float, float, float, float]:
        w, h = example.meta["width"], example.meta["height"]
        return rescale_box(example.answer, (w, h), self.units(w, h))

    def accuracy_reward(self, completion: str, example: Example, protocol: str) -> float:
        """``paper``: the authors' ``accuracy_reward`` of ``grpo_lisa.py`` — 1.0 when math-verify finds the completion
        equal to the solution ``"<answer> (x1,y1),(x2,y2) </answer>"`` (``gen_sft.py`` and ``make_conversation_image``
        build it so), else :func:`mmgpg.task.rewards.paper_box_reward` (2.0 on an exact string match, else their
        signed GIoU + 1). ``strict``: GIoU + 1 ∈ [0, 2] of one valid box inside the answer tag."""
        if protocol == "paper":
            solution = f"<answer> {example.meta['answer_text']} </answer>"
            if mathjudge.parse_verify(completion, solution)[0]:
                return 1.0
            return paper_box_reward(completion, solution)
        return strict_box_reward(completion, self._gold_units(example))

    def success(self, completion: str, example: Example, rewards) -> bool:
        """Box IoU (the judge under the reward protocol) >= ``success_iou``."""
        return float(self.judge(completion, example, self.reward_protocol).correct) >= self.success_iou

    def judge(self, completion: str, example: Example, protocol: str) -> Judgement:
        w, h = example.meta["width"], example.meta["height"]
        out = box_judge(completion, example.answer, (w, h), protocol, scale=self.units(w, h))
        return out.with_fields(iou=out.correct)

    def aggregate(self, per_sample: list[dict[str, Any]]) -> dict[str, float]:
        """``miou`` = mean box IoU over every item (failures count 0), as ``merge_eval.py``."""
        n = len(per_sample)
        return {"miou": sum(r["correct"] for r in per_sample) / n if n else 0.0,
                "parse_failures": float(sum(r.get("parse_failure", 0.0) for r in per_sample))}

    def mask_metrics(self, records: list[dict], examples: list[Example], protocol: str) -> dict[str, float]:
        """gIoU / cIoU of SAM masks prompted with the predicted boxes (empty dict without ``sam_checkpoint``)."""
        if not self.sam_checkpoint:
            return {}
        from mmgpg.task.masks import SamMasker, evaluate_masks, gt_mask, ignore_mask

        images, boxes, gts, ignores = [], [], [], []
        for record, ex in zip(records, examples):
            w, h = ex.meta["width"], ex.meta["height"]
            box = record.get("box")
            boxes.append(None if box is None else rescale_box(box, self.units(w, h), (w, h)))
            images.append(ex.images[0])
            gts.append(gt_mask(ex.meta["record"], (h, w), protocol))
            ignores.append(ignore_mask(ex.meta["record"], (h, w), protocol))
        metrics, per_sample = evaluate_masks(SamMasker(self.sam_checkpoint), images, boxes, gts, ignores)
        for record, sample in zip(records, per_sample):
            record["mask_iou"] = sample["iou"]
        return {"giou": metrics["giou"], "ciou": metrics["ciou"]}

    def example_from_record(self, record: dict) -> Example:
        require(record, ("id", "ground_truth", "width", "height"), "LISA predictions")
        box = [float(v) for v in record["ground_truth"]]
        if len(box) != 4:
            raise ValueError(f"LISA predictions: record {record['id']!r}: ground_truth must be [x1, y1, x2, y2] pixels")
        w, h = int(record["width"]), int(record["height"])
        return Example(id=str(record["id"]), media=[], question=str(record.get("question", "")), answer=box,
                       meta={"width": w, "height": h, "answer_text": self.answer_text(box, w, h)})

    def record_fields(self, example: Example) -> dict:
        return {"question": example.question, "ground_truth": example.answer, "width": example.meta["width"],
                "height": example.meta["height"]}

    def gold_completion(self, example: Example) -> str:
        return f"<think>The object is here.</think>\n<answer>{example.meta['answer_text']}</answer>"
