"""The ``paper`` GEOQA judge against a real evaluation log (R1-V, Qwen2-VL-7B GRPO 2 epochs; provenance in
``tests/support/fixtures/README.md``).

Over all 754 records of that log the judge reproduces both the logged ``is_correct`` and the logged
``extracted_answer`` string (sympy's printing included: ``40.0000000000000``, ``4/3.0``, ``1.0**2``), so every
excerpt item is checked on both; a ``null`` extraction in the log is ``""`` here.
"""

from __future__ import annotations

import json

import pytest
from support import FIXTURES

from mmgpg.cli import main
from mmgpg.task.judges import Judgement, math_judge

EXCERPT = FIXTURES / "geoqa_grpo_log_excerpt.jsonl"


def _rows() -> list[dict]:
    return [json.loads(line) for line in EXCERPT.read_text(encoding="utf-8").splitlines() if line.strip()]


def test_excerpt_is_the_described_sample():
    rows = _rows()
    assert len(rows) == 64 and sum(r["logged_is_correct"] for r in rows) == 42
    assert len({r["id"] for r in rows}) == len(rows)


def test_paper_judge_reproduces_the_log():
    mismatches = []
    for row in _rows():
        decision = math_judge(row["model_output"], row["ground_truth"], "paper")
        if decision.correct != float(row["logged_is_correct"]) or decision.extracted != row["logged_extracted"]:
            mismatches.append((row["id"], row["ground_truth"], row["logged_is_correct"], row["logged_extracted"],
                               decision.correct, decision.extracted))
    assert not mismatches, mismatches


@pytest.mark.parametrize(("item", "extracted"), [("133", "2"), ("117", "4"), ("132", "10.0000000000000")])
def test_irrational_answers_are_read_by_their_leading_number(item, extracted):
    # `2√{13}` and `4πcm` are parsed as 2 and 4, so `2√10` and `4 * pi` count as correct (logged so, too)
    row = next(r for r in _rows() if r["id"] == item)
    decision = math_judge(row["model_output"], row["ground_truth"], "paper")
    assert row["logged_is_correct"] and decision == Judgement(1.0, extracted, parse_failure=False)


def test_eval_cli_rescores_the_excerpt_to_the_logged_accuracy(tmp_path):
    rows = _rows()
    assert main(["eval", "--task", "geoqa", "--predictions", str(EXCERPT), "--protocol", "paper",
                 "--output", str(tmp_path)]) == 0
    meta = json.loads((tmp_path / "metrics.json").read_text())
    assert meta["counts"]["evaluated"] == len(rows) and meta["counts"]["skipped"] == 0
    assert meta["metrics"]["accuracy"] == pytest.approx(sum(r["logged_is_correct"] for r in rows) / len(rows))
