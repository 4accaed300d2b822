"""Reference reimplementation of the GPG authors' evaluation judges, for the differential tests
(``tests/paper/test_judges_differential.py``). Not used by mmgpg itself.

Every decision line cites the authors' file and line it reproduces; the files were read at these commits:

* ``VT`` = turningpoint-ai/VisualThinker-R1-Zero @ cd71978, ``src/eval/evaluate_Qwen2_VL_CVBench-base.py`` (the GPG
  copy ``AMAP-ML/GPG@e096da8:VisualThinker-R1-Zero/src/eval/...`` is byte-identical);
* ``CLS`` = Liuziyu77/Visual-RFT @ 9486633, ``classification/Qwen2_VL_classification_infere.py`` (the GPG copy differs
  only in paths, the hard-coded dataset and ``use_cache``);
* ``LISA`` = Liuziyu77/Visual-RFT @ 9486633, ``lisa_evaluation/Qwen2_VL_lisa_infere.py`` and ``MERGE`` =
  ``lisa_evaluation/merge_eval.py`` (GPG copies differ only in paths and ``use_cache``).

The authors' scripts loop over a dataset and a model; here each rule is one function of (model output, item). Python
semantics are those of the running interpreter, as they were for the authors: ``re``'s ``\\s`` and ``\\d`` are Unicode
classes, ``str.strip()`` strips Unicode whitespace, and ``int()`` refuses digit strings longer than
``sys.get_int_max_str_digits()`` (4300 by default since Python 3.11 / 3.10.7).
"""

from __future__ import annotations

import math
import re

from math_verify import ExprExtractionConfig, LatexExtractionConfig, StringExtractionConfig, parse, verify

# ---- CV-Bench ---------------------------------------------------------------------------------------------------

CV_STRINGS = ("A", "B", "C", "D", "E", "F", "a", "b", "c", "d", "e", "f", "(a)", "(b)", "(c)", "(d)", "(e)", "(f)",
              "(A)", "(B)", "(C)", "(D)", "(E)", "(F)")  # VT L201 (the literal tuple, in its order)


def cv_extract_answer(output_str: str) -> str | None:
    match = re.search(r"<answer>\s*(.*?)\s*</answer>", output_str)  # VT L26-27 (no flags: no DOTALL)
    if match:  # VT L29
        return match.group(1)  # VT L30 (not stripped)
    return None  # VT L31


def cv_correct(model_resp_output: str, choices: list[str], answer: str) -> int:
    """1/0 as VT L178-209 decides for one CV-Bench item (``answer`` is the dataset's ``"(A)"``…``"(F)"``)."""
    ground_truth = answer  # VT L180
    model_answer = cv_extract_answer(model_resp_output)  # VT L181
    short_response = model_resp_output if not model_answer else model_answer  # VT L183-186 (None or "" -> whole)
    example_answer = choices[["(A)", "(B)", "(C)", "(D)", "(E)", "(F)"].index(answer)]  # VT L188-199 (if-chain)
    parsed_response = parse(short_response, extraction_config=[  # VT L201
        LatexExtractionConfig(), ExprExtractionConfig(), StringExtractionConfig(strings=CV_STRINGS + tuple(choices))])
    parsed_answer = [example_answer.lower(), example_answer, ground_truth[1], ground_truth[1].lower(),  # VT L202
                     ground_truth.lower(), ground_truth]
    return 1 if verify(target=parsed_response, gold=parsed_answer) else 0  # VT L204-209


def cv_metrics(decisions: list[int], tasks: list[str]) -> dict[str, float]:
    """VT L224-233: ``Total Accuracy`` = correct / all items; ``<task>_acc`` = correct / items of the task."""
    out = {"total": sum(decisions) / len(decisions)}  # VT L224 (correct_counter / len(cv_bench))
    for task in ("Count", "Relation", "Depth", "Distance"):  # VT L81-93 counters, L230-233 ratios
        rows = [d for d, t in zip(decisions, tasks) if t == task]
        if rows:
            out[task.lower()] = sum(rows) / len(rows)
    return out


# ---- fine-grained classification ---------------------------------------------------------------------------------


def cls_category(line: str) -> str:
    return line.strip()  # CLS L79-83 (class list read with readlines(), each line stripped)


def cls_correct(response: str, image_cate: str) -> int:
    """1/0 as CLS L165-179 decides (an exception — no answer tag — counts in ``error_count``, i.e. not right)."""
    try:  # CLS L165
        match = re.search(r"<answer>(.*?)</answer>", response)  # CLS L166 (no DOTALL)
        answer_content = match.group(1)  # CLS L167 (AttributeError when there is no match; not stripped)
        image_cate = image_cate.replace(" ", "").replace("_", "").lower()  # CLS L169
        answer_content = answer_content.replace(" ", "").replace("_", "").lower()  # CLS L170
        if image_cate in answer_content or answer_content in image_cate:  # CLS L172
            return 1  # CLS L174 (right_count += 1)
        return 0  # CLS L176-177
    except Exception:  # noqa: BLE001 - CLS L178-179: error_count += 1
        return 0


def cls_accuracy(decisions: list[int]) -> float:
    """``Total Right Number`` / N (CLS L197-202; N = the split size, as the Visual-RFT README divides)."""
    return sum(decisions) / len(decisions)


# ---- LISA grounding ---------------------------------------------------------------------------------------------

LISA_SYSTEM = ("A conversation between User and Assistant. The user asks a question, and the Assistant solves it. The "
               "assistant first thinks about the reasoning process in the mind and then provides the user with the "
               "answer. The reasoning process and answer are enclosed within <think> </think> and <answer> </answer> "
               "tags, respectively, i.e., <think> reasoning process here </think><answer> answer here </answer>")  # LISA L17-22
LISA_USER = ("Output the bounding box in the image corresponding to the instruction: {instruction}. Output the thinking "
             "process in <think> </think> and your grouding box. Following \"<think> thinking process </think>\n"
             "<answer>(x1,y1),(x2,y2)</answer>)\" format.")  # LISA L45


def lisa_decoded(instruction: str, output: str) -> str:
    """What LISA L116-118 decodes: the *whole* sequence (``generated_ids`` is not trimmed), special tokens skipped —
    with Qwen2-VL's chat template (system turn L40, user turn L41-46) that is the role names, the two turns' texts
    and the model's output."""
    return f"system\n{LISA_SYSTEM}\nuser\n{LISA_USER.format(instruction=instruction)}\nassistant\n{output}"


def lisa_compute_iou(boxA, boxB) -> float:
    xA = max(boxA[0], boxB[0])  # LISA L75
    yA = max(boxA[1], boxB[1])  # LISA L76
    xB = min(boxA[2], boxB[2])  # LISA L77
    yB = min(boxA[3], boxB[3])  # LISA L78
    interArea = max(0, xB - xA) * max(0, yB - yA)  # LISA L80
    boxAArea = (boxA[2] - boxA[0]) * (boxA[3] - boxA[1])  # LISA L81 (not clamped: an inverted box has area <= 0)
    boxBArea = (boxB[2] - boxB[0]) * (boxB[3] - boxB[1])  # LISA L82
    return interArea / float(boxAArea + boxBArea - interArea + 1e-6)  # LISA L84 (ZeroDivisionError possible)


def lisa_iou(response: str, gold_box, image_size: tuple[int, int]) -> float:
    """The IoU LISA L101-135 appends for one item; ``response`` is the full decoded text (:func:`lisa_decoded`),
    ``gold_box`` the item's ``boxes[0]`` in pixels, ``image_size`` PIL's ``(width, height)``."""
    try:  # LISA L101
        bbox = gold_box  # LISA L105
        bbox = [bbox[0] / image_size[0], bbox[1] / image_size[1], bbox[2] / image_size[0],  # LISA L106-111
                bbox[3] / image_size[1]]
        pattern = r"\(\s*(\d+)\s*,\s*(\d+)\s*\)\s*,\s*\(\s*(\d+)\s*,\s*(\d+)\s*\)"  # LISA L120
        matches = re.findall(pattern, response)  # LISA L121
        x1, y1, x2, y2 = map(int, matches[0])  # LISA L122 (IndexError: no box; ValueError: > 4300 digits)
        pred_bbox = [int(x1) / 1000, int(y1) / 1000, int(x2) / 1000, int(y2) / 1000]  # LISA L123 (OverflowError)
        return lisa_compute_iou(pred_bbox, bbox)  # LISA L125, L133
    except Exception:  # noqa: BLE001 - LISA L134-135: ious.append(0)
        return 0


def lisa_miou(ious: list[float], split_num: int = 8) -> float:
    """LISA L94-97 shards the items over ``SPLIT_NUM`` processes in order; MERGE L3-7 concatenates the shards'
    lists in split order and prints ``sum(merged) / len(merged)``."""
    per_gpu = math.ceil(len(ious) / split_num)  # LISA L94
    shards = [ious[i * per_gpu : min(i * per_gpu + per_gpu, len(ious))] for i in range(split_num)]  # LISA L95-97
    merged = []  # MERGE L3
    for data in shards:  # MERGE L4-5
        merged += data  # MERGE L6
    return sum(merged) / len(merged)  # MERGE L7


if __name__ == "__main__":
    # The CV-Bench corpus under whichever math-verify this interpreter has (docs/tasks.md, "math-verify versions"):
    #   python tests/support/anchor_judges.py N > decisions.jsonl   (one {"id", "correct", "parsed"} per item)
    import json
    import sys
    from importlib.metadata import version

    from support.judge_corpus import cv_bench_corpus

    print(json.dumps({"math_verify": version("math-verify"), "sympy": version("sympy"),
                      "latex2sympy2_extended": version("latex2sympy2_extended")}))
    for row in cv_bench_corpus(int(sys.argv[1]) if len(sys.argv) > 1 else 2000):
        short = cv_extract_answer(row["model_output"]) or row["model_output"]
        parsed = parse(short, extraction_config=[LatexExtractionConfig(), ExprExtractionConfig(),
                                                 StringExtractionConfig(strings=CV_STRINGS + tuple(row["choices"]))])
        print(json.dumps({"id": row["id"], "correct": cv_correct(row["model_output"], row["choices"],
                                                                   row["ground_truth"]), "parsed": [str(p) for p in parsed]}))
