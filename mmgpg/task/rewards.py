"""Reward and judge building blocks shared by training rewards and evaluation judges.

Every function here is total: any model text gives a value (a float, a string, ``None`` from an extractor), never an
exception; it runs in time linear in the text (the regular expressions of the anchors that can backtrack
quadratically are re-implemented as linear scans with the same result, and property tests compare both); and nothing
is ever ``eval``-ed. Math equivalence goes through math-verify in a worker process (:mod:`mmgpg.task.mathjudge`).

Two families of rules live here, named after the protocols of the task judges:

* ``paper`` — exactly what the GPG authors' code does, quirks included (each function says which quirk);
* ``strict`` — the same question answered without the quirks; the training rewards default to it, because the
  quirks are reward hacks (an empty ``<answer></answer>`` is "correct" for the anchors' classification reward).

Sources are ``docs/anchors.md`` section numbers (§), which cite the anchor files and lines.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from mmgpg.task.mathjudge import as_text

# ---- the output format (§1.2) ------------------------------------------------------------------------------------

FORMAT_PATTERN = re.compile(r"<think>.*?</think>\s*<answer>.*?</answer>", re.DOTALL)
"""The anchors' format rule; :func:`format_reward` computes ``FORMAT_PATTERN.fullmatch`` without backtracking."""

_THINK_TO_ANSWER = re.compile(r"</think>\s*<answer>")
_WS = " \t\n\r\f\v"


def format_reward(completion: str, *, prefix: str = "") -> float:
    """``paper``: 1.0 iff ``re.fullmatch(r"<think>.*?</think>\\s*<answer>.*?</answer>", prefix + completion, re.DOTALL)``.

    The whole text must start with ``<think>`` and end with ``</answer>`` (no whitespace outside); extra tags inside
    are allowed (``<think>a</think><answer>b</answer><answer>c</answer>`` matches). ``prefix="<think>"`` is the
    VisualThinker base-model rule, whose prompt already ends with ``<think>``. Linear time: the full match exists iff
    the text starts with ``<think>``, ends with ``</answer>``, and the first ``</think>\\s*<answer>`` after the
    opening tag ends before the closing tag begins.
    """
    text = prefix + as_text(completion)
    if not (text.startswith("<think>") and text.endswith("</answer>")):
        return 0.0
    match = _THINK_TO_ANSWER.search(text, 7)
    return 1.0 if match is not None and match.end() <= len(text) - 9 else 0.0


def strict_format_reward(completion: str, *, prefix: str = "") -> float:
    """``strict``: one ``<think>…</think>`` then one non-empty ``<answer>…</answer>``, nothing else around them but
    whitespace, and no tag repeated (``<answer>a</answer><answer>b</answer>`` and ``<answer> </answer>`` score 0)."""
    text = (prefix + as_text(completion)).strip(_WS)
    for tag in ("<think>", "</think>", "<answer>", "</answer>"):
        if text.count(tag) != 1:
            return 0.0
    if not (text.startswith("<think>") and text.endswith("</answer>")):
        return 0.0
    close_think, open_answer = text.index("</think>"), text.index("<answer>")
    if not close_think < open_answer or text[close_think + 8 : open_answer].strip(_WS):
        return 0.0
    return 1.0 if text[open_answer + 8 : -9].strip(_WS) else 0.0


# ---- answer-tag extraction ---------------------------------------------------------------------------------------


def answer_tag(text: str, *, dotall: bool = True, trim: bool = False) -> str | None:
    """The group of the first match of ``<answer>(.*?)</answer>`` (``trim``: ``<answer>\\s*(.*?)\\s*</answer>``),
    with or without ``re.DOTALL``, or ``None``; the result is not stripped (callers strip, as the anchors do).

    Without DOTALL a tag pair that spans a newline is not a match (the anchors' classification and CV-Bench rules);
    ``trim`` lets whitespace — newlines included — sit next to the tags. ``\\s`` is ``re``'s Unicode class (the
    characters of ``str.isspace``: U+00A0, U+3000, U+2028, ``\\x1c``… but not U+200B), as in the anchors' regex.
    Linear time (``re`` would rescan the rest of the text once per ``<answer>`` when no close tag follows).
    """
    text = as_text(text)
    start = text.find("<answer>")
    while start >= 0:
        inner = start + 8
        if trim:
            while inner < len(text) and text[inner].isspace():
                inner += 1
        close = text.find("</answer>", inner)
        if close < 0:
            return None
        body = text[inner:close]
        if trim:
            body = body.rstrip()  # str.rstrip() strips what re's \s matches
        if dotall or "\n" not in body:
            return body
        start = text.find("<answer>", start + 1)
    return None


def answer_or_whole(text: str, *, dotall: bool = True) -> str:
    """``paper`` fallback: the stripped ``<answer>`` group, else the whole text stripped."""
    found = answer_tag(text, dotall=dotall)
    return (found if found is not None else as_text(text)).strip()


def extract_answer(completion: str) -> str | None:
    """The stripped text inside the first ``<answer>…</answer>`` (DOTALL), or ``None`` when there is none."""
    found = answer_tag(completion, dotall=True)
    return found.strip() if found is not None else None


# ---- numbers ------------------------------------------------------------------------------------------------------

_INT = re.compile(r"[+-]?\d+")


def parse_int(text: str | None) -> int | None:
    """The answer as an integer if it is exactly one integer (``" 3 "`` → 3); ``"3 or 4"``, ``""`` → ``None``.
    At most 18 digits (a longer run of digits is not an answer to any task here)."""
    if text is None:
        return None
    found = _INT.findall(text)
    if len(found) != 1 or _INT.sub("", text).strip(" .") != "" or len(found[0].lstrip("+-")) > 18:
        return None
    return int(found[0])


def integer_accuracy(completion: str, gold: int) -> float:
    """1.0 iff the ``<answer>`` holds exactly the integer ``gold`` (an empty or multi-number answer scores 0.0)."""
    value = parse_int(extract_answer(completion))
    return 1.0 if value is not None and value == gold else 0.0


# ---- multiple choice (§2.3, §2.4) ---------------------------------------------------------------------------------

LETTERS = "ABCDEF"
_RAVEN_LETTER = re.compile(r"(^|\s|\[|\()([A-H])(\s|\]|\)|$)")


def sat_string_reward(completion: str, gold_answer: str) -> float:
    """``paper`` string branch of the SAT/CV-Bench training reward (§2.3 step 2): the stripped ``<answer>`` group
    (no DOTALL; else the whole completion) equals ``gold_answer`` exactly (case-sensitive), or the *last* match of
    ``(^|\\s|\\[|\\()([A-H])(\\s|\\]|\\)|$)`` in it equals ``gold_answer`` (the "RAVEN" rule; matches consume their
    trailing delimiter, so in ``"A B"`` only ``A`` is found)."""
    student = answer_or_whole(completion, dotall=False)
    if student == gold_answer:
        return 1.0
    found = _RAVEN_LETTER.findall(student)
    return 1.0 if found and found[-1][1] == gold_answer else 0.0


def option_letter(answer: str) -> str:
    """``"(B)"`` → ``"B"``; anything else unchanged (CV-Bench stores answers as ``"(A)"``…``"(F)"``)."""
    answer = as_text(answer).strip()
    return answer[1] if len(answer) == 3 and answer[0] == "(" and answer[2] == ")" else answer


_CHOICE_LEAD = re.compile(r"^\(?([A-Fa-f])\)?(?:[.:)]|\s|$)")


def _norm_text(text: str) -> str:
    return " ".join(re.sub(r"[^0-9a-z]+", " ", as_text(text).lower()).split())


def strict_choice(answer: str | None, choices: Sequence[str], letter: str) -> tuple[bool, str]:
    """``strict`` multiple choice: the answer names exactly one option — by its letter (``B``, ``(b)``, ``B.``,
    ``B) text``) or by its whole text (case, punctuation and spacing ignored) — and it is the right one. An empty
    answer, or one that names several options, is wrong. Returns ``(correct, the option letter read or "")``."""
    if answer is None:
        return False, ""
    answer = answer.strip()
    named: set[str] = set()
    lead = _CHOICE_LEAD.match(answer)
    if lead and lead.group(1).upper() in LETTERS[: len(choices)]:
        named.add(lead.group(1).upper())
        rest = _norm_text(answer[lead.end() :])
        if rest and rest != _norm_text(choices[LETTERS.index(lead.group(1).upper())]):
            return False, ""  # "B. left" when B is "right": contradictory
    norm = _norm_text(answer)
    for i, option in enumerate(choices):
        if norm and norm == _norm_text(option):
            named.add(LETTERS[i])
    if len(named) != 1:
        return False, ""
    (read,) = named
    return read == option_letter(letter), read


# ---- labels (§4.3, §4.4) ------------------------------------------------------------------------------------------


def paper_label_norm(text: str) -> str:
    """The anchors' label normalisation: remove spaces and underscores, lower-case."""
    return as_text(text).replace(" ", "").replace("_", "").lower()


def paper_label_match(answer: str, label: str) -> float:
    """``paper``: 1.0 iff ``label in answer or answer in label`` after :func:`paper_label_norm` — so an empty answer,
    and any answer that is a substring of the label ("rose" for "pink primrose"), is correct."""
    a, g = paper_label_norm(answer), paper_label_norm(label)
    return 1.0 if g in a or a in g else 0.0


def label_key(text: str) -> str:
    """``strict`` label key: lower case, every run of non-alphanumerics is one space (``"Pink_Primrose"`` →
    ``"pink primrose"``)."""
    return _norm_text(text)


def strict_label_match(answer: str | None, label: str) -> float:
    """``strict``: 1.0 iff the answer is the label itself (:func:`label_key` equal); empty answers and answers that
    list several classes score 0."""
    if answer is None:
        return 0.0
    key = label_key(answer)
    return 1.0 if key and key == label_key(label) else 0.0


# ---- boxes (§5.3, §5.4) -------------------------------------------------------------------------------------------

Box = tuple[float, float, float, float]
_PAPER_BOX = re.compile(r"\(\s*(\d+)\s*,\s*(\d+)\s*\)\s*,\s*\(\s*(\d+)\s*,\s*(\d+)\s*\)")
_NUM = r"\s*(-?\d{1,9}(?:\.\d{1,9})?)\s*"
_PAIR_BOX = re.compile(r"\(" + _NUM + "," + _NUM + r"\)\s*,\s*\(" + _NUM + "," + _NUM + r"\)")
_LIST_BOX = re.compile(r"\[" + _NUM + "," + _NUM + "," + _NUM + "," + _NUM + r"\]")


def paper_box_points(text: str) -> list[tuple[float, float]] | None:
    """The LISA training reward's point list (``GPG:Visual-RFT/src/virft/src/open_r1/grpo_lisa.py:139-142``): for
    every match ``(x1,y1),(x2,y2)`` of the anchors' regex (non-negative integers of any length; ``\\d`` is Unicode),
    in order, the top-left points ``(int(x1) / 1000, int(y1) / 1000)`` of all matches, then the bottom-right points
    of all matches. ``None`` where the anchors' conversion raises (a number of more than
    ``sys.get_int_max_str_digits()`` digits, or one whose ``int / 1000`` overflows a float, ≥ 1.8·10³¹¹): their
    reward is then 0. Zero-padded and huge-but-finite numbers are kept (``(0,0),(10**309,5)`` is a valid read)."""
    found = _PAPER_BOX.findall(as_text(text))
    try:
        return [(int(x1) / 1000, int(y1) / 1000) for x1, y1, _, _ in found] + \
               [(int(x2) / 1000, int(y2) / 1000) for _, _, x2, y2 in found]
    except (ValueError, OverflowError):
        return None


def paper_signed_giou(gold: Sequence[Sequence[float]], pred: Sequence[Sequence[float]]) -> float:
    """The anchors' ``compute_giou`` (``grpo_lisa.py:74-107``) *without* its final ``+ 1``, on two point lists
    whose first two points are the boxes' corners ``(x1, y1), (x2, y2)``:

    ``I = max(0, min(x2) − max(x1)) · max(0, min(y2) − max(y1))``, ``A = (x2 − x1)(y2 − y1)`` for each box — a
    **signed** area, not clamped —, ``U = A_gold + A_pred − I``, ``IoU = I / U`` if ``U > 0`` else 0,
    ``C = (max(x2) − min(x1))(max(y2) − min(y1))`` (from the four corner coordinates as written), and
    ``GIoU = IoU − (C − U) / C`` if ``C > 0`` else ``IoU``, evaluated in that order.

    On valid boxes this is the usual GIoU ∈ [−1, 1]. An inverted prediction breaks the bound (the reward hack
    ``paper`` keeps): it has no intersection but a negative area (one axis inverted: GIoU < −1) or a positive one
    (both axes), and its corners need not span the enclosing box, so ``(999,999),(0,0)`` against the gold
    ``(250,250),(750,750)`` gives GIoU ≈ 3.99. Both lists must have two points or more (the anchors raise an
    IndexError otherwise, and their reward is 0: :func:`paper_box_reward` checks this first)."""
    (gx1, gy1), (gx2, gy2) = gold[0], gold[1]
    (px1, py1), (px2, py2) = pred[0], pred[1]
    inter = max(0, min(gx2, px2) - max(gx1, px1)) * max(0, min(gy2, py2) - max(gy1, py1))
    union = (gx2 - gx1) * (gy2 - gy1) + (px2 - px1) * (py2 - py1) - inter
    iou = inter / union if union > 0 else 0
    enclose = (max(gx2, px2) - min(gx1, px1)) * (max(gy2, py2) - min(gy1, py1))
    return iou - (enclose - union) / enclose if enclose > 0 else iou


def paper_first_box(text: str) -> tuple[int, int, int, int] | None:
    """The anchors' LISA evaluation read (§5.4, ``Qwen2_VL_lisa_infere.py`` L120-122): the *first* match of
    ``\\(\\s*(\\d+)\\s*,\\s*(\\d+)\\s*\\)\\s*,\\s*\\(\\s*(\\d+)\\s*,\\s*(\\d+)\\s*\\)`` (``\\d`` and ``\\s`` are Unicode: ``（`` no,
    ``１２`` and U+00A0 yes), converted with ``int``. ``None`` when there is no match, or when ``int`` refuses one of
    its numbers (more digits than ``sys.get_int_max_str_digits()``, 4300 by default) — the anchors' exception, IoU 0.
    Zero-padded and long numbers are kept as they are (``0000000123`` is 123); a later box is never used instead."""
    match = _PAPER_BOX.search(as_text(text))
    if match is None:
        return None
    try:
        return tuple(int(g) for g in match.groups())  # type: ignore[return-value]
    except ValueError:
        return None


def strict_boxes(text: str) -> list[Box]:
    """Every box written as ``(x1,y1),(x2,y2)`` or ``[x1,y1,x2,y2]`` (integers or decimals), in order of position."""
    text = as_text(text)
    found = [(m.start(), m.groups()) for m in _PAIR_BOX.finditer(text)] + [(m.start(), m.groups()) for m in _LIST_BOX.finditer(text)]
    return [tuple(float(g) for g in groups) for _, groups in sorted(found)]


def valid_box(box: Sequence[float] | None) -> bool:
    """Four finite numbers with ``x1 < x2`` and ``y1 < y2``."""
    return box is not None and len(box) == 4 and all(math.isfinite(v) for v in box) and box[0] < box[2] and box[1] < box[3]


def box_area(box: Sequence[float]) -> float:
    return max(0.0, box[2] - box[0]) * max(0.0, box[3] - box[1])


def box_iou(a: Sequence[float], b: Sequence[float], eps: float = 0.0) -> float:
    """``I / (A + B − I + eps)`` with the intersection clamped at 0; 0.0 when the denominator is not positive.
    The LISA evaluation uses ``eps = 1e-6`` (§5.4)."""
    inter = box_area((max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3])))
    union = box_area(a) + box_area(b) - inter + eps
    return inter / union if union > 0 else 0.0


def paper_box_iou(pred: Sequence[float], gold: Sequence[float]) -> float:
    """The anchors' LISA evaluation IoU (``compute_iou``, §5.4): ``I / (A + B − I + 1e-6)`` with the intersection
    ``I`` clamped at 0 but the areas ``A = (x2 − x1)(y2 − y1)`` *not* clamped (an inverted box has a negative area,
    or a positive one when inverted on both axes), evaluated in that order; 0.0 where the anchors raise (a zero
    denominator). Equals :func:`box_iou` with ``eps=1e-6`` on valid boxes."""
    inter = max(0, min(pred[2], gold[2]) - max(pred[0], gold[0])) * max(0, min(pred[3], gold[3]) - max(pred[1], gold[1]))
    area_pred = (pred[2] - pred[0]) * (pred[3] - pred[1])
    area_gold = (gold[2] - gold[0]) * (gold[3] - gold[1])
    denominator = float(area_pred + area_gold - inter + 1e-6)
    return inter / denominator if denominator != 0 else 0.0


def box_giou(a: Sequence[float], b: Sequence[float]) -> float:
    """Generalised IoU ``IoU − (C − U) / C`` (C = area of the smallest enclosing box, U = union, areas clamped at
    0), in [−1, 1]; ``IoU`` when ``C <= 0``. The ``strict`` reward's GIoU; the anchors' own, with signed areas, is
    :func:`paper_signed_giou`."""
    inter = box_area((max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3])))
    union = box_area(a) + box_area(b) - inter
    iou = inter / union if union > 0 else 0.0
    enclose = box_area((min(a[0], b[0]), min(a[1], b[1]), max(a[2], b[2]), max(a[3], b[3])))
    return iou - (enclose - union) / enclose if enclose > 0 else iou


def paper_box_reward(completion: str, solution: str) -> float:
    """``paper`` LISA accuracy reward after its math-verify branch (``grpo_lisa.py:111-160``; the task runs that
    branch first, and it never fires on the authors' golds, which math-verify parses to nothing):

    * the ground truth is the stripped group of ``<answer>(.*?)</answer>`` in ``solution`` (no DOTALL; the authors'
      solutions are ``"<answer> (x1,y1),(x2,y2) </answer>"``), else the stripped solution; the student answer is
      the stripped group of the same regex *with* DOTALL in the completion, else the stripped completion;
    * 2.0 when the two strings are equal;
    * else :func:`paper_signed_giou` ``+ 1`` of the first two points of :func:`paper_box_points` of each — with one
      box, its corners; with k ≥ 2 boxes, the first box's top-left to the *second* box's top-left (the points are
      all top-lefts, then all bottom-rights) — which is outside [0, 2] for inverted boxes, as theirs;
    * 0.0 where the authors' code raises: no box on a side, or a number that ``int`` or ``int / 1000`` refuses;
    * 0.0 where theirs is not a finite number (coordinates of about 10¹⁵⁴ and more overflow the areas to ±inf or
      NaN, which would poison their advantages; mmgpg's rewards must be finite) — the one documented difference."""
    gold = answer_tag(solution, dotall=False)
    gold = (gold if gold is not None else as_text(solution)).strip()
    student = answer_or_whole(completion, dotall=True)
    if student == gold:
        return 2.0
    pred, ref = paper_box_points(student), paper_box_points(gold)
    if pred is None or ref is None or len(pred) < 2 or len(ref) < 2:
        return 0.0
    value = paper_signed_giou(ref, pred) + 1
    return value if math.isfinite(value) else 0.0


def strict_box_reward(completion: str, gold_box: Sequence[float]) -> float:
    """``strict``: ``GIoU + 1`` ∈ [0, 2] of the single box inside the ``<answer>`` tag (same units as ``gold_box``);
    0.0 when the answer has no box, several boxes, or an empty/inverted one."""
    answer = extract_answer(completion)
    boxes = strict_boxes(answer) if answer is not None else []
    if len(boxes) != 1 or not valid_box(boxes[0]):
        return 0.0
    return box_giou(boxes[0], gold_box) + 1.0


def pixels_to_norm1000(box: Sequence[float], width: int, height: int) -> tuple[int, int, int, int]:
    """Absolute pixels → Qwen2-VL 0–1000 units, truncated to int as the anchors' ``gen_sft.py`` does (§5.1)."""
    return (int(box[0] / width * 1000), int(box[1] / height * 1000), int(box[2] / width * 1000), int(box[3] / height * 1000))


def rescale_box(box: Sequence[float], src: Sequence[float], dst: Sequence[float]) -> Box:
    """A box in units whose full width and height are ``src=(w, h)`` → the same box in units of size ``dst``:
    pixels of the image → pixels of the resized image the model saw (Qwen2.5-VL answers in those), and back;
    ``dst=(1000, 1000)`` would give Qwen2-VL units, but :func:`pixels_to_norm1000` is the anchors' exact formula."""
    return (box[0] * dst[0] / src[0], box[1] * dst[1] / src[1], box[2] * dst[0] / src[0], box[3] * dst[1] / src[1])


def box_text(box: Sequence[float]) -> str:
    """A box as the anchors' answer string ``(x1,y1),(x2,y2)`` (integer coordinates)."""
    x1, y1, x2, y2 = (int(v) for v in box)
    return f"({x1},{y1}),({x2},{y2})"
