"""`mmgpg eval --predictions` on hostile files: every bad row is a counted skip with its reason, or the whole file is
refused with one clear message; the numbers come only from rows that were really judged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.faults_support import mmgpg

GOOD_A = {"id": "a", "model_output": "<answer>(A)</answer>", "ground_truth": "(A)", "choices": ["2", "3"],
          "category": "Count"}
GOOD_B = {"id": "b", "model_output": "<answer>(B)</answer>", "ground_truth": "(A)", "choices": ["2", "3"],
          "category": "Count"}

# (name, raw line, the reason printed for it)
HOSTILE = [
    ("nan gold", '{"id": "n1", "model_output": "<answer>nan</answer>", "ground_truth": NaN, "choices": ["1"], '
                 '"category": "Count"}', "NaN is not valid JSON"),
    ("infinity gold", '{"id": "n2", "model_output": "x", "ground_truth": Infinity, "choices": ["1"], '
                      '"category": "Count"}', "Infinity is not valid JSON"),
    ("nested gold", json.dumps({**GOOD_A, "id": "n3", "ground_truth": {"a": 1}}), "nested object"),
    ("list in choices", json.dumps({**GOOD_A, "id": "n4", "choices": "AB"}), "choices must be a list of strings"),
    ("unknown category", json.dumps({**GOOD_A, "id": "n5", "category": "Colour"}), "unknown category 'Colour'"),
    ("null output", json.dumps({**GOOD_A, "id": "n6", "model_output": None}), "model_output is missing or null"),
    ("number output", json.dumps({**GOOD_A, "id": "n7", "model_output": 3}), "model_output must be a string"),
    ("missing choices", json.dumps({k: v for k, v in GOOD_A.items() if k != "choices"} | {"id": "n8"}),
     "lacks choices"),
    ("not an object", "[1, 2, 3]", "must be a JSON object"),
    ("bad json", '{"id": "n9", "model_output": "x" "ground_truth": 1}', "not valid JSON"),
    ("bad utf-8", b'{"id": "n10", "model_output": "\xff\xfe"}'.decode("latin-1"), "not UTF-8"),
    # the skip records `mmgpg eval` itself writes (a bad data row; a row a re-judging skipped): re-judging the file
    # keeps them skipped with their first reason
    ("written data-row skip", '{"row": 7, "skipped": "image missing"}', "skipped when written: image missing"),
    ("written re-judge skip", '{"line": 4, "id": "n11", "skipped": "nested object"}',
     "skipped when written: nested object"),
]


def _write(path: Path, lines: list[str]) -> Path:
    path.write_bytes(b"".join(line.encode("latin-1" if "\xff" in line else "utf-8") + b"\n" for line in lines))
    return path


def test_each_hostile_row_is_a_counted_skip_with_its_reason(tmp_path):
    lines = [json.dumps(GOOD_A), json.dumps(GOOD_B)] + [raw for _, raw, _ in HOSTILE]
    preds = _write(tmp_path / "p.jsonl", lines)
    out = tmp_path / "out"
    mmgpg("eval", "--task", "cv_bench", "--predictions", str(preds), "--output", str(out))
    meta = json.loads((out / "metrics.json").read_text())
    assert meta["counts"] == {"rows": 2 + len(HOSTILE), "evaluated": 2, "skipped": len(HOSTILE), "parse_failures": 0}
    assert meta["metrics"]["total"] == pytest.approx(0.5)  # only a (right) and b (wrong) were judged
    written = [json.loads(x) for x in (out / "predictions.jsonl").read_text().splitlines()]  # strict JSON throughout
    assert [r.get("line") for r in written[2:]] == list(range(3, 3 + len(HOSTILE)))
    for (name, _, reason), record in zip(HOSTILE, written[2:]):
        assert reason in record["skipped"], (name, record)


def test_a_judge_that_raises_on_one_row_skips_only_that_row(tmp_path):
    # lisa_grounding's judge divides by the image size: a zero width is refused before it can reach the judge, and
    # a box of the wrong length makes the task's own parser raise; the other rows are still judged.
    good = {"id": "g", "model_output": "<answer>[0, 0, 10, 10]</answer>", "ground_truth": [0, 0, 10, 10],
            "width": 100, "height": 100}
    lines = [json.dumps(good), json.dumps({**good, "id": "w", "width": 0}),
             json.dumps({**good, "id": "s", "ground_truth": [1, 2, 3]})]
    out = tmp_path / "out"
    proc = mmgpg("eval", "--task", "lisa_grounding", "--predictions", str(_write(tmp_path / "p.jsonl", lines)),
                 "--output", str(out))
    meta = json.loads((out / "metrics.json").read_text())
    assert meta["counts"]["evaluated"] == 1 and meta["counts"]["skipped"] == 2
    assert "width must be a positive integer" in proc.stderr and "ground_truth must be [x1, y1, x2, y2]" in proc.stderr


@pytest.mark.parametrize("content, message", [
    ("", "holds no predictions"),
    ("\n\n", "holds no predictions"),
    ("\n".join([json.dumps(GOOD_A)] * 5 + [json.dumps({**GOOD_B, "id": "a"})]), "id(s) appear more than once ('a' at "
                                                                                "lines 1, 2, 3, 4, 5, 6)"),
    ("null\n[]\n", "none of its 2 rows could be judged"),
])
def test_files_that_cannot_give_a_number_are_refused_with_one_message(tmp_path, content, message):
    preds = tmp_path / "p.jsonl"
    preds.write_text(content)
    proc = mmgpg("eval", "--task", "cv_bench", "--predictions", str(preds), "--output", str(tmp_path / "o"),
                 check=False)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
