"""Judges: one decision per model output, under a named protocol, shared by the task plugins.

``paper`` reproduces the anchor's evaluation script exactly, quirks included; ``strict`` answers the same question
without the quirks. Each judge returns a :class:`Judgement`: ``correct`` (1.0/0.0, or the task's score such as a
box IoU), ``extracted`` (the answer it read, ``""`` when none) and ``parse_failure`` (no answer could be read).
Section numbers (§) refer to ``docs/anchors.md``.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mmgpg.task import mathjudge
from mmgpg.task.rewards import (
    answer_tag,
    box_iou,
    extract_answer,
    option_letter,
    paper_box_iou,
    paper_first_box,
    paper_label_match,
    strict_boxes,
    strict_choice,
    strict_label_match,
    valid_box,
)

PROTOCOLS = ("paper", "strict")


def check_protocol(protocol: str) -> str:
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r}; choose one of {', '.join(PROTOCOLS)}")
    return protocol


@dataclass(frozen=True)
class Judgement:
    """One judge decision on one model output.

    ``correct`` is 1.0/0.0 for exact-match judges and the score itself for graded ones (a box judge's IoU);
    ``extracted`` the answer the judge read (``""`` when none); ``parse_failure`` whether no answer could be read;
    ``box`` the box read, in the model's units (box judges; the mask metrics prompt SAM with it); ``fields`` task
    extras written to ``predictions.jsonl`` beside the decision (e.g. CV-Bench's ``category``).
    """

    correct: float
    extracted: str = ""
    parse_failure: bool = False
    box: tuple[float, ...] | None = None
    fields: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "correct", float(self.correct))
        if not math.isfinite(self.correct):
            raise ValueError(f"a judgement's score must be a finite number; got {self.correct}")

    def with_fields(self, **fields: Any) -> Judgement:
        """This judgement with task extras added to :attr:`fields`."""
        return dataclasses.replace(self, fields={**self.fields, **fields})

    def record(self) -> dict[str, Any]:
        """The decision as a ``predictions.jsonl`` record's fields (``parse_failure`` as 0.0/1.0, so that a
        metric can sum it)."""
        out: dict[str, Any] = {"correct": self.correct, "extracted": self.extracted,
                               "parse_failure": float(self.parse_failure)}
        if self.box is not None:
            out["box"] = list(self.box)
        return {**out, **self.fields}

    @classmethod
    def check(cls, decision: Any, who: str) -> Judgement:
        """``decision`` itself when it is a :class:`Judgement`; anything else is an error naming ``who``."""
        if isinstance(decision, Judgement):
            return decision
        raise TypeError(f"{who} must return a mmgpg.task.judges.Judgement (e.g. Judgement(correct=1.0, "
                        f"extracted='B', parse_failure=False)); got {type(decision).__name__}")


def _result(correct: bool | float, extracted: str, failed: bool, box: Sequence[float] | None = None) -> Judgement:
    return Judgement(float(correct), extracted, bool(failed), None if box is None else tuple(box))


# ---- math answers (GEOQA, §3.4) ------------------------------------------------------------------------------------

_DEGREES = re.compile(r"°|\^\s*\{?\s*\\circ\s*\}?|度")
_TRAILING_UNIT = re.compile(
    r"\s*(?:\\text\{[^}]*\}|\\mathrm\{[^}]*\}|平方|立方)?\s*(?:平方米|平方厘米|厘米|千米|毫米|米|cm|dm|km|mm|m|单位|个)?"
    r"\s*(?:\^\s*\{?\s*[23]\s*\}?|²|³)?\s*\.?\s*$")
_SQRT_BRACED = re.compile(r"√\s*\{")
_SQRT_PLAIN = re.compile(r"√\s*([0-9]+(?:\.[0-9]+)?|[a-zA-Z])")
_SPELLED_PI = re.compile(r"(?<![a-zA-Z\\])pi(?![a-zA-Z])")


def geo_latex(answer: str) -> str:
    """``strict`` GEOQA normal form: degree signs and a trailing unit (``cm``, ``cm^{2}``, ``米``, …) dropped,
    ``√{x}``/``√x`` → ``\\sqrt{x}``, ``π``/``pi`` → ``\\pi``, so that ``2√{15}米`` and ``9π`` keep their irrational part
    (math-verify's plain-text parse collapses them to 2 and 9, §3.4)."""
    text = _DEGREES.sub("", answer or "").replace("$", "").strip()
    head, tail = text[:-48], text[-48:]  # a unit is short: matching only the tail keeps the regex's time bounded
    text = head + _TRAILING_UNIT.sub("", tail, count=1)
    text = _SQRT_BRACED.sub(r"\\sqrt{", text)
    text = _SQRT_PLAIN.sub(r"\\sqrt{\1}", text)
    text = _SPELLED_PI.sub(r"\\pi ", text.replace("π", "\\pi "))
    return text.strip()


def math_judge(output: str, ground_truth: str, protocol: str) -> Judgement:
    """``paper``: ``verify(parse(output), parse(ground_truth))`` on the *whole* output — the value math-verify picks
    may come from the reasoning, ``<answer>40</answer>`` extracts nothing (no space before the number), ``9π`` is 9,
    and 17 of the 754 test answers can never be judged correct. ``strict``: the ``<answer>`` content only, both sides
    put in :func:`geo_latex` form and compared as LaTeX."""
    if check_protocol(protocol) == "paper":
        correct, extracted = mathjudge.parse_verify(output, ground_truth)
        return _result(correct, extracted, not extracted)
    answer = extract_answer(output)
    if not answer:
        return _result(False, "", True)
    correct, extracted = mathjudge.latex_equal(geo_latex(answer), geo_latex(ground_truth))
    return _result(correct, extracted or answer, not extracted)


# ---- multiple choice (CV-Bench, §2.4) -----------------------------------------------------------------------------


def choice_judge(output: str, choices: Sequence[str], answer: str, protocol: str) -> Judgement:
    """``paper``: the ``<answer>\\s*(.*?)\\s*</answer>`` group (no DOTALL; the whole output when missing or empty) is
    parsed by math-verify with the letters A–F (four spellings) and the option texts as extraction strings, then
    verified against the right letter and option text — so ``"Left"`` for option ``left`` extracts nothing and
    ``"table lamp"`` for options lamp/table reads ``table``. ``strict``: :func:`mmgpg.task.rewards.strict_choice` on the
    (DOTALL) answer tag. ``answer`` is the letter, with or without parentheses."""
    letter = option_letter(answer)
    if check_protocol(protocol) == "paper":
        short = answer_tag(output, dotall=False, trim=True)
        if not short:
            short = output or ""
        correct, extracted = mathjudge.choice(short, list(choices), letter)
        return _result(correct, extracted, not extracted)
    correct, read = strict_choice(extract_answer(output), list(choices), letter)
    return _result(correct, read, not read)


# ---- class labels (fine-grained classification, §4.4) ------------------------------------------------------------


def label_judge(output: str, label: str, protocol: str) -> Judgement:
    """``paper``: the ``<answer>(.*?)</answer>`` group (no DOTALL) must exist (else wrong, counted as a parse
    failure), then the bidirectional substring test after removing ASCII spaces and ``_`` and lower-casing — an
    empty answer is correct. The group is *not* stripped (the anchor does not strip it): a tab or U+00A0 stays, so
    ``<answer>\\t</answer>`` is wrong while ``<answer> </answer>`` is right. ``strict``: the (DOTALL) answer must be
    the label itself."""
    if check_protocol(protocol) == "paper":
        answer = answer_tag(output, dotall=False)
        if answer is None:
            return _result(False, "", True)
        return _result(paper_label_match(answer, label), answer, False)
    answer = extract_answer(output)
    return _result(strict_label_match(answer, label), answer or "", not answer)


# ---- boxes (LISA, §5.4) -------------------------------------------------------------------------------------------


def box_judge(output: str, gold_box: Sequence[float], image_size: tuple[int, int], protocol: str, *,
              scale: tuple[float, float]) -> Judgement:
    """Box IoU ``I / (A + B − I + 1e-6)`` of the predicted box, divided by ``scale`` (the full width and height of the
    model's box units: ``(1000, 1000)`` for Qwen2-VL, the resized image size for Qwen2.5-VL pixels), against
    ``gold_box`` (pixels of the original image) divided by ``image_size = (width, height)``. ``paper``: the anchors'
    ``compute_iou`` of the first ``(x1,y1),(x2,y2)`` of integers anywhere in the output (a box in the reasoning wins;
    a later box is never used instead), no validity check, 0 when none or when the anchors' conversion would raise
    (see :func:`_paper_box_decision`). ``strict``: the single valid box
    (pairs or ``[x1,y1,x2,y2]``) inside the answer tag; several boxes, none, or an inverted one score 0.
    ``correct`` is the IoU; ``box`` the box read, in model units."""
    sx, sy = scale
    w, h = image_size
    gold = (gold_box[0] / w, gold_box[1] / h, gold_box[2] / w, gold_box[3] / h)
    if check_protocol(protocol) == "paper":
        return _paper_box_decision(output, gold, sx, sy)
    answer = extract_answer(output)
    boxes = strict_boxes(answer) if answer is not None else []
    if len(boxes) != 1 or not valid_box(boxes[0]):
        return _result(0.0, "", True)
    box = boxes[0]
    pred = (box[0] / sx, box[1] / sy, box[2] / sx, box[3] / sy)
    return _result(box_iou(pred, gold, eps=1e-6), ",".join(f"{v:g}" for v in box), False, box)


def _paper_box_decision(output: str, gold: tuple[float, ...], sx: float, sy: float) -> Judgement:
    """The anchors' rule (§5.4): the first box anywhere (:func:`mmgpg.task.rewards.paper_first_box`), ``int(x) / 1000``
    (integer true division, so numbers up to ~1e311 still divide and larger ones raise as theirs do), their
    ``compute_iou`` (:func:`mmgpg.task.rewards.paper_box_iou`); every failure is IoU 0. ``box`` is recorded (for the
    mask metrics) only when its coordinates are ordinary numbers (below 1e15)."""
    box = paper_first_box(output)
    if box is None:
        return _result(0.0, "", True)
    sx, sy = (int(v) if float(v).is_integer() else v for v in (sx, sy))
    try:
        pred = (box[0] / sx, box[1] / sy, box[2] / sx, box[3] / sy)
    except OverflowError:  # the anchors' int / 1000 raises too: IoU 0
        return _result(0.0, "", True)
    recorded = box if all(v < 1e15 for v in box) else None
    return _result(paper_box_iou(pred, gold) + 0.0, ",".join(str(v) for v in box), False, recorded)  # + 0.0: no -0.0
