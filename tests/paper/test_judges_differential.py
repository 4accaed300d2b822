"""Differential tests: the ``paper`` judges against the GPG authors' judging rules, on a generated corpus.

The authors' rules are reimplemented line by line in ``tests/support/anchor_judges.py`` (each line cites their file and line);
``tests/support/judge_corpus.py`` generates, from a fixed seed, at least 2,000 realistic and adversarial model outputs per
family. Each corpus goes through the path ``mmgpg eval --predictions FILE --protocol paper`` takes (the CLI itself:
predictions written as JSONL, read back, judged, aggregated, written), and every decision must equal the authors'
(LISA: IoU within 1e-9 and the same mIoU). The one case that cannot agree — a LISA instruction that itself contains a
box, which the authors' decoder keeps in front of the output — is generated separately and counted
(``test_lisa_boxes_in_the_prompt_are_the_documented_exception``).

Each test also checks that its corpus exercises the quirks it guards (the corpus contains items on which a rule
without the quirk decides differently), so removing a quirk from the judge makes the test fail.
"""

from __future__ import annotations

import json
import re

import pytest
from support.anchor_judges import (
    cls_accuracy,
    cls_category,
    cls_correct,
    cv_correct,
    cv_extract_answer,
    cv_metrics,
    lisa_decoded,
    lisa_iou,
    lisa_miou,
)
from support.judge_corpus import cv_bench_corpus, fine_grained_corpus, lisa_corpus

from mmgpg.cli import main
from mmgpg.task.data import shipped

N = 2000


def _paper_eval(tmp_path, task: str, rows: list[dict], *overrides: str) -> tuple[list[dict], dict]:
    """Run ``mmgpg eval --task TASK --predictions FILE --protocol paper`` and read back its records and metrics."""
    pred, out = tmp_path / f"{task}.jsonl", tmp_path / f"{task}-eval"
    pred.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    assert main(["eval", "--task", task, "--predictions", str(pred), "--protocol", "paper", "--output", str(out),
                 *overrides]) == 0
    records = [json.loads(line) for line in (out / "predictions.jsonl").read_text(encoding="utf-8").splitlines()]
    meta = json.loads((out / "metrics.json").read_text(encoding="utf-8"))
    assert meta["counts"]["skipped"] == 0 and len(records) == len(rows)
    return records, meta["metrics"]


def _ascii_trim_tag(text: str) -> str | None:
    """The CV-Bench answer regex with ASCII-only ``\\s`` (what the judge did before issue 16)."""
    m = re.search(r"<answer>\s*(.*?)\s*</answer>", text, re.ASCII)
    return m.group(1) if m else None


# ---- CV-Bench -----------------------------------------------------------------------------------------------------


def test_cv_bench_paper_judge_agrees_with_the_authors(tmp_path):
    rows = cv_bench_corpus(N)
    reference = [cv_correct(r["model_output"], r["choices"], r["ground_truth"]) for r in rows]
    records, metrics = _paper_eval(tmp_path, "cv_bench", rows)
    disagree = [(r["model_output"], want, got["correct"]) for r, want, got in zip(rows, reference, records)
                if float(want) != got["correct"]]
    assert not disagree, f"{len(disagree)} of {len(rows)} disagree, e.g. {disagree[:5]}"
    want = cv_metrics(reference, [r["category"] for r in rows])
    assert {k: metrics[k] for k in want} == want
    # the corpus decides both ways and exercises the quirks the judge copies
    assert 0.2 < sum(reference) / len(reference) < 0.8
    unicode_ws = [r for r in rows if _ascii_trim_tag(r["model_output"]) != cv_extract_answer(r["model_output"])]
    assert len(unicode_ws) >= 50  # Unicode whitespace next to the tags decides what is parsed
    whole = [r for r in rows if not cv_extract_answer(r["model_output"])]
    assert len(whole) >= 300  # no usable tag, or an empty one: the whole output is parsed


# ---- fine-grained classification ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dataset", ["oxford_flowers", "pets", "fgvc_aircraft", "stanford_cars"])
def test_fine_grained_paper_judge_agrees_with_the_authors(tmp_path, dataset):
    lines = shipped(f"fine_grained/{dataset}.classes.txt").read_text(encoding="utf-8").splitlines(keepends=True)
    classes = [cls_category(line) for line in lines]
    rows = fine_grained_corpus(classes, N, seed=16 + len(classes))
    reference = [cls_correct(r["model_output"], r["ground_truth"]) for r in rows]
    records, metrics = _paper_eval(tmp_path, "fine_grained", rows, f"task.dataset={dataset}")
    disagree = [(r["model_output"], r["ground_truth"], want, got["correct"]) for r, want, got in
                zip(rows, reference, records) if float(want) != got["correct"]]
    assert not disagree, f"{len(disagree)} of {len(rows)} disagree, e.g. {disagree[:5]}"
    assert metrics["accuracy"] == cls_accuracy(reference)
    assert 0.1 < sum(reference) / len(reference) < 0.9
    # quirks exercised: an answer that is only non-space whitespace (not removed, so not "empty"), whitespace kept
    # inside the answer, the empty answer that is correct
    unstripped = [r for r in rows if (m := re.search(r"<answer>(.*?)</answer>", r["model_output"]))
                  and cls_correct(f"<answer>{m.group(1).strip()}</answer>", r["ground_truth"])
                  != cls_correct(r["model_output"], r["ground_truth"])]
    assert len(unstripped) >= 10
    empty = [r for r in rows if (m := re.search(r"<answer>(.*?)</answer>", r["model_output"])) and m.group(1) == ""]
    assert len(empty) >= 10


# ---- LISA ---------------------------------------------------------------------------------------------------------


def test_lisa_paper_judge_agrees_with_the_authors(tmp_path):
    items = lisa_corpus(N)
    reference = [lisa_iou(lisa_decoded(it["instruction"], it["model_output"]), it["ground_truth"],
                          (it["width"], it["height"])) for it in items]
    rows = [{"id": it["id"], "model_output": it["model_output"], "ground_truth": it["ground_truth"],
             "width": it["width"], "height": it["height"], "question": it["instruction"]} for it in items]
    records, metrics = _paper_eval(tmp_path, "lisa_grounding", rows)
    disagree = [(it["model_output"], it["ground_truth"], it["width"], it["height"], want, got["correct"])
                for it, want, got in zip(items, reference, records) if abs(want - got["correct"]) > 1e-9]
    assert not disagree, f"{len(disagree)} of {len(items)} disagree, e.g. {disagree[:3]}"
    assert metrics["miou"] == lisa_miou(reference)  # same values summed in the same order: equal, not close
    # the corpus scores every way: failures, partial and near-perfect overlaps
    assert sum(v == 0 for v in reference) > 200 and sum(v > 0.9 for v in reference) > 100
    assert sum(0.1 < v < 0.9 for v in reference) > 100


def test_lisa_boxes_in_the_prompt_are_the_documented_exception(tmp_path):
    """The authors decode prompt + output and read the first box of the whole text: a box written in the instruction
    wins over the model's answer. The judge is given the output only, so these items are counted, not matched."""
    items = lisa_corpus(200, seed=17, prompt_boxes=True)
    rows = [{"id": it["id"], "model_output": it["model_output"], "ground_truth": it["ground_truth"],
             "width": it["width"], "height": it["height"], "question": it["instruction"]} for it in items]
    records, _ = _paper_eval(tmp_path, "lisa_grounding", rows)
    full = [lisa_iou(lisa_decoded(it["instruction"], it["model_output"]), it["ground_truth"],
                     (it["width"], it["height"])) for it in items]
    output_only = [lisa_iou(it["model_output"], it["ground_truth"], (it["width"], it["height"])) for it in items]
    differ = sum(abs(a - b) > 1e-9 for a, b in zip(full, output_only))
    assert differ > 50  # the prompt's box decides for the authors
    assert all(abs(b - r["correct"]) <= 1e-9 for b, r in zip(output_only, records))  # the judge reads the output


# ---- the quirk tables of docs/tasks.md, row by row: (authors' decision = paper, strict) -----------------------------

LR = ["left", "right"]
CV_ROWS = [  # (output, choices, answer, authors = paper, strict)
    ("<answer>A</answer>", LR, "(A)", 1, 1), ("<answer>(a)</answer>", LR, "(A)", 1, 1),
    ("<answer>A. left</answer>", LR, "(A)", 1, 1), ("<answer>left</answer>", LR, "(A)", 1, 1),
    ("<answer>left.</answer>", LR, "(A)", 1, 1), ("<answer>Left</answer>", LR, "(A)", 0, 1),
    ("<answer>LEFT</answer>", LR, "(A)", 0, 1), ("<answer>The answer is A</answer>", LR, "(A)", 1, 0),
    ("<answer>\\boxed{A}</answer>", LR, "(A)", 1, 0), ("<answer>A or B</answer>", LR, "(A)", 1, 0),
    ("<answer>B or A</answer>", LR, "(A)", 0, 0), ("<answer>(A) right</answer>", LR, "(A)", 1, 0),
    ("<answer>There are 3 chairs</answer>", ["3", "2", "1", "0"], "(A)", 1, 0),
    ("<answer>table lamp</answer>", ["lamp", "table"], "(A)", 0, 0), ("<answer>Ａ</answer>", LR, "(A)", 0, 0),
    ("<answer>lefts</answer>", LR, "(A)", 0, 0), ("<think>it is A</think><answer></answer>", LR, "(A)", 0, 0),
    ("<answer>\u00a0A\u00a0</answer>", LR, "(A)", 1, 1), ("<answer>\nleft\n</answer>", LR, "(A)", 1, 1),
    ("<think>so B</think><answer>left\nfinal</answer>", LR, "(A)", 0, 0),
    ("<think>it is A</think><answer>\u3000</answer>", LR, "(A)", 0, 0), ("<think>so B</think>A", LR, "(A)", 0, 0),
    ("<answer>\\boxed{A}\n\\boxed{B}</answer>", LR, "(B)", 0, 0),  # 1 under math-verify 0.5.2
]
FG_ROWS = [  # (output, label, authors = paper, strict)
    ("<answer>pink primrose</answer>", "pink primrose", 1, 1), ("<answer>Pink_Primrose</answer>", "pink primrose", 1, 1),
    ("<answer></answer>", "pink primrose", 1, 0), ("<answer> </answer>", "pink primrose", 1, 0),
    ("<answer>\t</answer>", "pink primrose", 0, 0), ("<answer>\u00a0</answer>", "pink primrose", 0, 0),
    ("<answer>\tprim</answer>", "pink primrose", 0, 0), ("<answer>pink\u00a0primrose</answer>", "pink primrose", 0, 1),
    ("<answer>rose</answer>", "pink primrose", 1, 0), ("<answer>pinkprimrose</answer>", "pink primrose", 1, 0),
    ("<answer>pink primroses</answer>", "pink primrose", 1, 0), ("<answer>a pink primrose!</answer>", "pink primrose", 1, 0),
    ("<answer>pink primrose, rose</answer>", "pink primrose", 1, 0),
    ("<answer>lenten rose or pink primrose</answer>", "pink primrose", 1, 0),
    ("<answer>2012</answer>", "2012 BMW M3 Coupe", 1, 0), ("<answer>pink-primrose</answer>", "pink primrose", 0, 1),
    ("<answer>737 800</answer>", "737-800", 0, 1), ("<answer>PINK PRİMROSE</answer>", "pink primrose", 0, 0),
    ("pink primrose", "pink primrose", 0, 0), ("<answer>pink\nprimrose</answer>", "pink primrose", 0, 1),
    ("<answer>x\n</answer><answer>pink primrose</answer>", "pink primrose", 1, 0),
]
LISA_ROWS = [  # (output, authors = paper, strict) for gold (50, 25, 150, 75) px of a 200x100 image
    ("<answer>(250,250),(750,750)</answer>", 1.0, 1.0), ("<answer>(250, 250), (750, 750)</answer>", 1.0, 1.0),
    ("<answer>( 250\u00a0,250 ) ,\n( 750,750 )</answer>", 1.0, 1.0), ("<answer>(0250,00250),(000750,750)</answer>", 1.0, 1.0),
    ("<answer>(２５０,２５０),(７５０,７５０)</answer>", 1.0, 1.0),
    ("<think>(0,0),(100,100)</think><answer>(250,250),(750,750)</answer>", 0.0, 1.0),
    ("<answer>(0,0),(100,100),(250,250),(750,750)</answer>", 0.0, 0.0), ("(250,250),(750,750)", 1.0, 0.0),
    ("<answer>[250,250,750,750]</answer>", 0.0, 1.0), ("<answer>(250,250,750,750)</answer>", 0.0, 0.0),
    ("<answer>(0.25,0.25),(0.75,0.75)</answer>", 0.0, 0.0), ("<answer>(-250,250),(750,750)</answer>", 0.0, 0.5),
    ("<answer>（250,250），（750,750）</answer>", 0.0, 0.0), ("<answer>(750,750),(250,250)</answer>", 0.0, 0.0),
    ("<answer>(" + "9" * 312 + ",250),(750,750) (250,250),(750,750)</answer>", 0.0, 1.0),
    ("<answer>(" + "0" * 4301 + "250,250),(750,750)</answer>", 0.0, 0.0),
]


@pytest.mark.parametrize(("output", "choices", "answer", "authors", "strict"), CV_ROWS)
def test_quirk_table_cv_bench(output, choices, answer, authors, strict):
    from mmgpg.task.judges import choice_judge

    assert cv_correct(output, choices, answer) == authors
    assert choice_judge(output, choices, answer, "paper").correct == authors
    assert choice_judge(output, choices, answer, "strict").correct == strict


@pytest.mark.parametrize(("output", "label", "authors", "strict"), FG_ROWS)
def test_quirk_table_fine_grained(output, label, authors, strict):
    from mmgpg.task.judges import label_judge

    assert cls_correct(output, label) == authors
    assert label_judge(output, label, "paper").correct == authors
    assert label_judge(output, label, "strict").correct == strict


@pytest.mark.parametrize(("output", "authors", "strict"), LISA_ROWS)
def test_quirk_table_lisa(output, authors, strict):
    from mmgpg.task.judges import box_judge

    gold, size = (50, 25, 150, 75), (200, 100)
    assert lisa_iou(output, gold, size) == pytest.approx(authors, abs=1e-5)
    assert box_judge(output, gold, size, "paper", scale=(1000, 1000)).correct == pytest.approx(authors, abs=1e-5)
    assert box_judge(output, gold, size, "strict", scale=(1000, 1000)).correct == pytest.approx(strict, abs=1e-5)
