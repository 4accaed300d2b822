"""The ``video_r1`` task (tasks/video_r1.py) on a small data folder in Video-R1's schema (tests/support's fixture:
real H.264 clips and a PNG): records become examples with the media where the JSON says, missing data and bad
records are clear errors naming the record and the file, and the scores and metrics equal hand-computed ones. (Its
rewards and judge against Video-R1's own code: tests/paper/test_video_r1_differential.py.)"""

from __future__ import annotations

import json

import pytest
from support.video_r1_fixture import write_video_r1

from mmgpg.task import Example, build_task, task_rewards
from mmgpg.task.data import DataError, DataNotFound
from mmgpg.typed import ConfigError

pytest.importorskip("av")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_video_r1(tmp_path_factory.mktemp("video_r1"))


def test_records_become_examples_with_their_media(data):
    task = build_task("video_r1", {"train_data": str(data["train"]), "eval_data": str(data["eval"].parent)})
    test = task.load("test")
    assert [e.id for e in test] == ["video_r1-mvbench-1", "video_r1-mvbench-2", "video_r1-mvbench-3"]
    assert [e.answer for e in test] == ["B", "1", "42"]
    assert test[0].media == [{"type": "video", "video": str(data["eval"].parent / "clips" / "right.mp4")}]
    assert test[0].question.startswith("Which way does the square move?Options:\nA. left\nB. right\n")
    assert "<think> and </think>" in test[0].question and "<think> </think>" not in test[0].question
    train = task.load("train")
    assert [e.meta["problem_type"] for e in train] == ["multiple choice", "numerical", "regression", "free-form", "OCR"]
    assert train[3].media[0].size == (64, 64)  # an image record: the PNG, opened
    assert "<think> </think> tags, and then" in train[0].question  # the training template
    assert task.record_fields(test[2])["problem_type"] == "regression"


def test_missing_and_bad_data_are_clear_errors(data, tmp_path):
    with pytest.raises(DataNotFound, match="No Video-R1 mvbench evaluation data configured.*Video-R1/Video-R1-eval"):
        build_task("video_r1").load("test")
    with pytest.raises(DataNotFound, match="eval_vsibench.json.*does not exist"):
        build_task("video_r1", {"eval_data": str(data["eval"].parent), "benchmark": "vsibench"}).load("test")
    with pytest.raises(ConfigError, match="benchmark"):
        build_task("video_r1", {"benchmark": "kinetics"})
    records = json.loads(data["eval"].read_text())
    cases = [({"path": "./clips/gone.mp4"}, DataNotFound, r"record '1': video '.*gone.mp4' does not exist"),
             ({"problem_type": "essay"}, DataError, "problem_type must be one of"),
             ({"data_type": "audio"}, DataError, "data_type must be image or video"),
             ({"options": None}, DataError, "multiple-choice record needs options"),
             ({"solution": None}, DataError, "lacks solution"),
             ({"solution": "B"}, DataError, "holds no <answer>")]
    for change, error, message in cases:
        bad = tmp_path / "eval_mvbench.json"
        bad.write_text(json.dumps([{**records[0], **change}]))
        (tmp_path / "clips").mkdir(exist_ok=True)
        (tmp_path / "clips" / "right.mp4").write_bytes((data["eval"].parent / "clips" / "right.mp4").read_bytes())
        task = build_task("video_r1", {"eval_data": str(bad)})
        with pytest.raises(error, match=message):
            task.load("test")[0]


def _ex(ptype: str, gold: str) -> Example:
    return Example(id="x", media=[], question="q", answer=gold, meta={"problem_type": ptype, "data_source": "s"})


def test_scores_by_hand():
    task = build_task("video_r1", {"reward_protocol": "paper"})
    fmt = "<think>t</think><answer>{}</answer>"
    # OCR: 1 - WER; "stop sign here" vs "stop here": one deletion of 3 words -> 2/3
    assert task_rewards(task, fmt.format("stop here"), _ex("OCR", "stop sign here"))["accuracy"] == pytest.approx(2 / 3)
    # regression: 1 - |8 - 10| / 10 = 0.8; the judge's MRA of 8 for 10: error 0.2 < 1 - theta for theta 0.50..0.75
    assert task_rewards(task, fmt.format("8"), _ex("regression", "10"))["accuracy"] == pytest.approx(0.8)
    assert task.judge(fmt.format("8"), _ex("regression", "10"), "paper").correct == pytest.approx(0.6)
    # numerical: "3.0" for "3" differs in its decimal mark
    assert task_rewards(task, fmt.format("3.0"), _ex("numerical", "3"))["accuracy"] == 0.0
    # the paper judge reads an untagged output whole; strict does not
    assert task.judge("B", _ex("multiple choice", "B"), "paper").correct == 1.0
    strict = task.judge("B", _ex("multiple choice", "B"), "strict")
    assert strict.correct == 0.0 and strict.parse_failure


def test_metrics_split_accuracy_and_mra():
    task = build_task("video_r1")
    rows = [{"correct": 1.0, "problem_type": "multiple choice", "data_source": "a"},
            {"correct": 0.0, "problem_type": "numerical", "data_source": "a"},
            {"correct": 0.5, "problem_type": "regression", "data_source": "b"},
            {"correct": 0.7, "problem_type": "regression", "data_source": "b"}]
    m = task.aggregate(rows)
    assert m["accuracy"] == 0.5 and m["mra"] == pytest.approx(0.6)
    assert m["accuracy/multiple_choice"] == 1.0 and m["accuracy/regression"] == pytest.approx(0.6)
    assert m["source/a"] == 0.5 and m["source/b"] == pytest.approx(0.6)
